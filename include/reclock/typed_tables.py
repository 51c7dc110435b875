"""Typed tables: one Delta table per upstream table of a source whose records carry their table's columns
(Postgres), derived from its published reclocked rows; where they lie and how they commit:
:mod:`reclock.storage.typed`.

**What a typed table holds.**  The typed table of upstream table ``X`` has a column per column ``X`` had anywhere
in the source's published history (name, and the Spark type of its Postgres type: :func:`reclock.pg_types.spark_type`;
a column whose Postgres types differ in their Spark type across the history, one retyped in a new epoch, is
``string``, its stored text, at every time), then ``_into_time`` and ``_diff``.  Every published record of ``X``
with a row (TRUNCATE and resync markers were expanded into rows by staging) is one row: its row's columns parsed
by those types (:func:`reclock.pg_types.typed_columns`, a missing key NULL), its IntoTime and its diff.  A row's
typed values depend only on its stored text and the columns' types, so a retraction cancels exactly the row it
retracts, as in the reclocked table.

**AS OF t** (:func:`as_of_spark`, :func:`as_of_duckdb`): the rows with ``_into_time <= t``, each as many times as
its ``_diff`` sums to (none when 0), with the columns of ``X``'s latest published record at or before ``t`` (in
stream order: IntoTime, snapshot partitions before changes, commit LSN, ``seq``): a read before an ``ADD COLUMN``
lacks the column, and one before a new epoch's snapshot dropped a column keeps it.

**When.**  Every publish types what it published (:func:`type_published`): with ``F`` the typed frontier and
``P`` the published IntoTime, the rows of ``X`` with ``max(F, typed version of X) < into_time <= P`` are added to
``X``'s table, then the frontier becomes ``P``.  So the tables hold every published row exactly once, after a
typing killed between two tables too, and a warehouse from before typed tables (no tables, frontier -1) gets them
at its next publish (the migration).  Compaction folds typed rows at or before ``since`` as it folds reclocked
ones (:func:`compact_typed`: summed per row at ``since``, zeros dropped) and never moves ``since`` beyond the typed
frontier (:func:`since_bound`): a reclocked row folded forward past the frontier would be typed twice.  A backfill
repair of a window rewrites the window's rows of every typed table from the repaired ones
(:func:`retype_window`).  AS OF a time beyond the typed frontier is refused (the next publish types it).
"""
from __future__ import annotations

import logging

import pyarrow as pa

from .pg_types import Column, parse_columns, spark_type, view_name
from .storage.files import files_with_rows
from .storage.layout import WarehouseError, spark_uri
from .storage.rewrites import covering
from .storage.typed import OID_KEY, TYPMOD_KEY

log = logging.getLogger("reclock")

TIME, DIFF = "_into_time", "_diff"  # a typed table's IntoTime and diff columns
TEXT = 25  # the type a retyped column is kept as (its stored text)


def columns_of(schema: pa.Schema) -> list[Column]:
    """The Postgres columns of a typed table's schema (its field metadata)."""
    return [Column(f.name, int(f.metadata[OID_KEY.encode()]), int(f.metadata[TYPMOD_KEY.encode()]))
            for f in schema if f.name not in (TIME, DIFF)]


def resolve(table: str, existing: list[Column], found: list[list[Column]]) -> tuple[list[Column], bool]:
    """``(the typed columns, whether the table must be rewritten)`` of the typed table of ``table`` with columns
    ``existing`` to which rows with each of the column lists ``found`` are added: the existing ones in their order,
    then those first found, each with the type it had; a name with types differing in their Spark type becomes
    text, and the table must be rewritten when an existing column is so changed (module doc)."""
    out: dict[str, Column] = {c.name: c for c in existing}
    for columns in found:
        for c in columns:
            if c.name in (TIME, DIFF):
                raise WarehouseError(f"{table}: column {c.name!r} has the name of a typed table's own column; "
                                     "rename it upstream (its typed table cannot hold it)")
            had = out.get(c.name)
            if had is None:
                out[c.name] = c
            elif spark_type(had.oid, had.typmod) != spark_type(c.oid, c.typmod):
                out[c.name] = Column(c.name, TEXT, -1)
    return list(out.values()), any(spark_type(c.oid, c.typmod) != spark_type(out[c.name].oid, out[c.name].typmod)
                                   for c in existing)


def arrow_schema_of(rows, columns: list[Column]) -> pa.Schema:
    """The Arrow schema of a typed table whose rows are ``rows`` (Spark, :func:`_in_schema`), as Spark writes them,
    each column's Postgres type in its metadata."""
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow = to_arrow_schema(rows.schema)
    types = {c.name: c for c in columns}
    return pa.schema([f.with_metadata({OID_KEY: str(types[f.name].oid), TYPMOD_KEY: str(types[f.name].typmod)})
                      if f.name in types else f for f in arrow])


def typed_rows(records, columns: list[Column]):
    """The typed rows (module doc) of ``records`` (Spark, reclocked rows of one table) in ``columns``."""
    from pyspark.sql import functions as F

    from .pg_types import typed_columns

    return (records.where(F.col("row").isNotNull() & (F.col("diff") != 0))
            .select(*typed_columns(F.col("row"), columns), F.col("into_time").alias(TIME), F.col("diff").alias(DIFF)))


def type_published(name: str, ctx) -> dict:
    """For a source offering :class:`~reclock.sources.base.TableColumns` (else {}), type the published rows beyond
    the typed frontier into the typed tables (module doc, "When"); what was typed: ``{"typed_upto": P, "rows":
    {table: rows added}}``, or {} when nothing was to type.  Starts Spark only when a published file holds rows
    beyond the frontier."""
    from .sources.base import TableColumns, offers

    if not offers(ctx.upstream, TableColumns):
        return {}
    tables = ctx.tables
    published, frontier = tables.reclocked_upper() - 1, tables.typed_frontier()
    if frontier >= published:
        return {}
    dt = tables.table("reclocked")
    added: dict[str, int] = {}
    if covering(files_with_rows(dt), "into_time", frontier + 1, published).num_rows:
        from pyspark.sql import functions as F

        column = ctx.upstream.table_columns
        window = tables.read_reclocked_spark(version=dt.version()).where(
            (F.col("into_time") > frontier) & (F.col("into_time") <= published))
        found: dict[str, list[list[Column]]] = {}
        for r in window.where(F.col(column).isNotNull()).select("table", column).distinct().collect():
            found.setdefault(r["table"], []).append(parse_columns(r[column]))
        for table in sorted(found):
            read = tables.typed_version(table)
            if read >= published:
                continue  # typed by a typing killed before it moved the frontier
            schema = tables.typed_schema(table)
            columns, rebuild = resolve(table, columns_of(schema) if schema is not None else [], found[table])
            records = window.where((F.col("table") == table) & (F.col("into_time") > max(frontier, read)))
            if rebuild:  # every published row of the table again, typed with the new types
                records = tables.read_reclocked_spark(version=dt.version()).where(
                    (F.col("table") == table) & (F.col("into_time") <= published))
                columns, _ = resolve(table, [], _all_columns(records, column))
                log.warning("%s: the typed table of %s is rewritten: a column's type changed (%s)", name, table,
                            ", ".join(f"{c.name} {spark_type(c.oid, c.typmod)}" for c in columns))
            rows = _in_schema(typed_rows(records, columns), columns)
            added[table] = tables.commit_typed(table, read, rows, arrow_schema_of(rows, columns), published, rebuild)
    tables.mark_typed(published)
    if added:
        log.info("%s: typed tables up to IntoTime %d: %s", name, published,
                 ", ".join(f"{t} +{n}" for t, n in sorted(added.items())))
    return {"typed_upto": published, "rows": added}


def _all_columns(records, column: str) -> list[list[Column]]:
    from pyspark.sql import functions as F

    return [parse_columns(r[column]) for r in
            records.where(F.col(column).isNotNull()).select(column).distinct().collect()]


def _in_schema(typed, columns: list[Column]):
    """``typed`` with every column of ``columns`` (NULL where it has none), in their order, then time and diff."""
    from pyspark.sql import functions as F

    have = set(typed.columns)
    return typed.select(*[F.col(c.name) if c.name in have else
                          F.lit(None).cast(spark_type(c.oid, c.typmod)).alias(c.name) for c in columns], TIME, DIFF)


def since_bound(ctx) -> int | None:
    """How far compaction may move ``since`` (module doc): the typed frontier, or the current ``since`` while
    nothing is typed beyond it; None for a source without typed tables."""
    from .sources.base import TableColumns, offers

    if not offers(ctx.upstream, TableColumns):
        return None
    return max(ctx.tables.typed_frontier(), ctx.tables.since())


def compact_typed(name: str, ctx, since: int) -> list[str]:
    """Fold every typed table's rows at or before ``since`` into rows at ``since`` (summed per row, zeros
    dropped), then VACUUM it (the files earlier folds removed, beyond the source's ``vacuum_retention_hours``); the
    tables rewritten.  A racing rewrite of one is logged, and the next compaction folds it."""
    from pyspark.sql import functions as F

    from .sources.base import TableColumns, offers
    from .storage import ConcurrentWriteError

    folded: list[str] = []
    for table in ctx.tables.typed_tables() if offers(ctx.upstream, TableColumns) else []:
        def consolidated(df):
            stats = df.agg(F.count(F.lit(1)).alias("n"), F.min(TIME).alias("lo")).first()
            if stats["n"] == 0:
                return None
            rows = (df.groupBy(*[c for c in df.columns if c not in (TIME, DIFF)]).agg(F.sum(DIFF).alias(DIFF))
                    .where(F.col(DIFF) != 0).withColumn(TIME, F.lit(since).cast("long")))
            return None if stats["lo"] == since and rows.count() == stats["n"] else rows

        try:
            if ctx.tables.rewrite_typed(table, None, since, consolidated, "compact-typed",
                                        f"{ctx.tables.typed_uri(table)}: another writer rewrote it meanwhile; not "
                                        "folded", {"operation": "reclock compaction", "since": since}, TIME):
                folded.append(table)
                ctx.tables.vacuum_typed(table, ctx.config.vacuum_retention_hours)  # what earlier folds removed
        except ConcurrentWriteError as e:
            log.warning("%s: folding the typed table of %s lost a race (%s); the next compaction folds it", name,
                        table, e)
    return folded


def retype_window(ctx, low: int | None, high: int) -> None:
    """Rewrite the rows with ``low <= _into_time <= high`` (no lower bound when ``low`` is None) of every typed
    table from the reclocked rows there (a backfill repair replaced them), a column the repaired rows have first
    added to the table; repaired rows giving a column another type are refused (:class:`WarehouseError`, that table
    not rewritten)."""
    from pyspark.sql import functions as F

    from .storage.rewrites import between

    tables = ctx.tables
    typed = tables.typed_tables()
    if not typed:
        return
    window = tables.read_reclocked_spark().where(between(F.col("into_time"), low, high))
    column = ctx.upstream.table_columns
    for table in typed:
        records = window.where(F.col("table") == table)
        columns, rebuild = resolve(table, columns_of(tables.typed_schema(table)), _all_columns(records, column))
        if rebuild:
            raise WarehouseError(f"{tables.typed_uri(table)}: the repaired rows of IntoTimes up to {high} give a "
                                 "column another type than its typed table's; not rewritten")
        rows = _in_schema(typed_rows(records, columns), columns)
        tables.add_typed_columns(table, arrow_schema_of(rows, columns))
        tables.rewrite_typed(table, low, high, lambda _, rows=rows: rows, "backfill-repair",
                             f"{tables.typed_uri(table)}: another writer committed while a backfill replaced "
                             f"{low}..{high}; nothing replaced", {"operation": "reclock backfill repair",
                                                                 "into_time": [low, high]}, TIME)


# --- AS OF reads --------------------------------------------------------------------------------------------------


def typed_problem(name: str, tables, t: int) -> str | None:
    """Why AS OF ``t`` cannot be read from the typed tables (beyond the typed frontier), or None."""
    frontier = tables.typed_frontier()
    if t <= frontier:
        return None
    return (f"{name}: AS OF {t} is not typed yet: its typed tables hold IntoTimes up to {frontier} (published up to "
            f"{tables.reclocked_upper() - 1}); the next `reclock publish {name}` types them")


def latest_columns_spark(published, t: int, column: str) -> dict[str, list[Column]]:
    """``{table: the columns of its latest published record at or before t}`` (module doc) from ``published``
    (Spark, the reclocked rows)."""
    from pyspark.sql import functions as F

    position = F.struct("into_time", (F.col("partition") == "").alias("change"), "offset", "seq")
    latest = (published.where(F.col(column).isNotNull() & (F.col("into_time") <= t)).groupBy("table")
              .agg(F.max_by(column, position).alias(column)))
    return {r["table"]: parse_columns(r[column]) for r in latest.collect()}


def as_of_spark(spark, name: str, tables, published, t: int, column: str) -> list[str]:
    """Register the view ``<name>_<table>`` (:func:`reclock.pg_types.view_name`) of every upstream table as of
    ``t`` (module doc, ``t`` within the typed frontier: :func:`typed_problem`) on ``spark``; their names."""
    from pyspark.sql import functions as F

    views = []
    for table, columns in sorted(latest_columns_spark(published, t, column).items()):
        uri = tables.typed_uri(table)
        rows = spark.read.format("delta").load(spark_uri(uri)).where(F.col(TIME) <= t)
        data = [c for c in rows.columns if c not in (TIME, DIFF)]
        counted = rows.groupBy(*data).agg(F.sum(DIFF).alias("_n")).where(F.col("_n") > 0)
        view = counted.withColumn("_i", F.explode(F.sequence(F.lit(1), F.col("_n"))))
        view.select(*[F.col(c.name) for c in columns]).createOrReplaceTempView(view_name(name, table))
        views.append(view_name(name, table))
    return views


def as_of_duckdb(con, name: str, tables, published: str, t: int, column: str) -> list[str]:
    """:func:`as_of_spark` on the DuckDB connection ``con``, ``published`` naming the reclocked rows registered
    there; each typed table read through delta-rs at its latest version (``_into_time <= t`` pushed down)."""
    def quote(identifier: str) -> str:
        return '"' + identifier.replace('"', '""') + '"'

    c = quote(column)
    latest = con.sql(f"SELECT \"table\", arg_max({c}, {{'t': into_time, 'change': \"partition\" = '', "
                     f"'offset': \"offset\", 'seq': seq}}) FROM {published} WHERE {c} IS NOT NULL AND into_time <= "
                     f"{int(t)} GROUP BY \"table\"").fetchall()
    views = []
    for table, text in sorted(latest):
        scratch = quote(f"_reclock_{name}_typed_{table}")
        con.register(scratch.strip('"'), tables.typed_table(table).to_pyarrow_dataset())
        counted = (f"SELECT * EXCLUDE ({TIME}, {DIFF}), CAST(sum({DIFF}) AS BIGINT) AS _n FROM {scratch} "
                   f"WHERE {TIME} <= {int(t)} GROUP BY ALL HAVING sum({DIFF}) > 0")
        selected = ", ".join(quote(col.name) for col in parse_columns(text))
        con.execute(f"CREATE OR REPLACE TEMP VIEW {quote(view_name(name, table))} AS SELECT {selected} FROM "
                    f"({counted}) AS c, range(c._n)")
        views.append(view_name(name, table))
    return views
