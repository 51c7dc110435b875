"""``AS OF`` queries over reclocked sources: one consistent IntoTime across every source in a query.

``register_as_of(spark, t, names)`` makes each source a Spark temp view holding its
contents at IntoTime ``t`` (and ``<name>_progress`` with its remap; for a Postgres source also one typed
view per table, ``<name>_<table>``, read from its typed table: :mod:`reclock.typed_tables`), after checking
that ``t`` is readable for every source: not compacted away (``t >= since``) and
complete (``t`` below both the remap and the reclocked uppers).

``duckdb_as_of(t, names)`` makes the same views in a DuckDB connection, read through
delta-rs with no JVM: the published table at one Delta version, scanned as Arrow with ``into_time <= t`` pushed
down (a table whose every diff is 1, by its file statistics, read as it is: nothing to consolidate).  Law: for
every source and every readable ``t``, its views hold the same rows (as multisets) as the Spark ones, and a ``t`` one
refuses the other refuses with the same error.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import offsets
from .engine import RemapError, timestamp_resumption_frontier
from .runtime import Runtime, Where
from .sources.base import TableColumns, offers
from .storage.files import diff_range
from .typed_tables import as_of_duckdb, as_of_spark, typed_problem


class QueryError(ValueError):
    """The requested time cannot be answered consistently (not complete yet, or compacted)."""


@dataclass(frozen=True)
class Readable:
    """The IntoTimes a source can answer: ``since <= t < upper``."""

    name: str
    since: int
    upper: int

    def check(self, t: int) -> None:
        if t < self.since:
            raise QueryError(f"{self.name}: AS OF {t} is compacted away; the earliest readable time is {self.since}")
        if t >= self.upper:
            raise QueryError(f"{self.name}: AS OF {t} is not complete yet; {self.name} is complete below {self.upper}")


def _window(name: str, tables, remap) -> Readable:
    """What ``tables`` can answer now: from ``since`` up to the meet of the remap and reclocked uppers."""
    return Readable(name, tables.since(), timestamp_resumption_frontier(remap.upper, tables.reclocked_upper()))


def readable(name: str, runtime: Where = None) -> Readable:
    with Runtime.of(runtime).source(name, connect=False) as ctx:
        return _window(name, ctx.tables, ctx.tables.read_remap())


def common_readable(names: list[str], runtime: Where = None) -> tuple[int, int]:
    """The window ``[since, upper)`` in which every named source is readable."""
    runtime = Runtime.of(runtime)
    windows = [readable(n, runtime) for n in names]
    return max(w.since for w in windows), min(w.upper for w in windows)


def register_as_of(spark, t: int, names: list[str] | None = None, runtime: Where = None) -> dict[str, int]:
    """Register ``<name>`` and ``<name>_progress`` temp views as of IntoTime ``t``; returns row counts."""
    from pyspark.sql import functions as F

    runtime = Runtime.of(runtime)
    counts = {}
    for name in names or list(runtime.config.sources):
        with runtime.source(name, connect=False) as ctx:
            remap = ctx.tables.read_remap()
            window = _window(name, ctx.tables, remap)
            window.check(t)
            df = ctx.tables.read_reclocked_spark(spark)
            if ctx.tables.since() > t:  # compaction raced with this read
                window = Readable(name, ctx.tables.since(), window.upper)
                window.check(t)
            # Where offsets are times (several records per offset, a retraction at a later offset
            # than its insertion) contents are per record, not per offset: the view has no offset.
            drop = ("into_time", "diff") if ctx.config.offsets_unique else ("into_time", "diff", "offset")
            # A source that names its contents (Postgres: table and row) leaves out the change's metadata (op,
            # xid, seq, commit_time) and where it came from (the changes' or a snapshot's partition).
            content = getattr(ctx.source, "content_columns", None)
            keys = list(content) if content else [c for c in df.columns if c not in drop]
            contents = (df.where(F.col("into_time") <= t).groupBy(*keys).agg(F.sum("diff").alias("_n"))
                        .where(F.col("_n") != 0))
            if contents.where(F.col("_n") < 0).limit(1).count():
                raise QueryError(f"{name}: negative multiplicity as of {t}: the reclocked history is inconsistent")
            contents = contents.withColumn("_i", F.explode(F.sequence(F.lit(1), F.col("_n")))).drop("_n", "_i")
            contents.createOrReplaceTempView(name)
            if offers(ctx.source, TableColumns):
                if problem := typed_problem(name, ctx.tables, t):
                    raise QueryError(problem)
                as_of_spark(spark, name, ctx.tables, df, t, ctx.source.table_columns)
            offset_type = ctx.tables.offset_type
            progress = _progress_rows(remap, t, offset_type)
            schema = f"into_time long, partition string, offset {offsets.sql_type(offset_type)}"
            spark.createDataFrame(progress, schema).createOrReplaceTempView(f"{name}_progress")
            counts[name] = contents.count()
    return counts


def _progress_rows(remap, t: int, offset_type) -> list[tuple]:
    """The ``<name>_progress`` rows ``(into_time, partition, offset)`` bound at or before ``t``, offsets as the
    reclocked table stores them (big ones encoded, order-preserving: comparable)."""
    try:
        return [(r.into_time, str(r.partition), offsets.to_storage(r.offset, offset_type))
                for r in remap.progress() if r.into_time <= t]
    except RemapError as e:
        raise QueryError(str(e)) from e


def query_as_of(spark, sql: str, t: int, names: list[str] | None = None, runtime: Where = None):
    """Run Spark SQL over the named sources as of IntoTime ``t``."""
    register_as_of(spark, t, names, runtime)
    return spark.sql(sql)


AS_OF_COLUMN = "as_of"


def publish_as_of(target: str, sql: str, names: list[str], runtime: Where = None, spark=None) -> dict:
    """Run ``sql`` over ``names`` AS OF the latest IntoTime all of them can answer, ``t = upper - 1`` of
    :func:`common_readable`, and write its rows, with a column ``as_of = t``, to the Delta table
    ``<warehouse>/<target>``: the rows of an earlier run at the same ``t`` are replaced (a rerun is
    idempotent), those of other times are kept.  ``{"as_of": None}`` when no IntoTime is readable in all."""
    from pyspark.sql import functions as F

    runtime = Runtime.of(runtime, spark)
    if target in runtime.config.sources:
        raise QueryError(f"{target} is a source: the AS OF result needs another name")
    since, upper = common_readable(names, runtime)
    if upper <= max(since, 0):
        return {"target": target, "as_of": None, "rows": 0, "why": f"no IntoTime is readable in all of {names}"}
    t = upper - 1
    spark = runtime.spark(f"reclock-as-of-{target}")
    rows = query_as_of(spark, sql, t, names, runtime).withColumn(AS_OF_COLUMN, F.lit(t).cast("long"))
    runtime.warehouse.replace_rows(target, rows, AS_OF_COLUMN, t)
    count = spark.read.format("delta").load(runtime.warehouse.spark_uri(target)).where(F.col(AS_OF_COLUMN) == t).count()
    return {"target": target, "as_of": t, "rows": count, "sources": names}


# --- without a JVM: DuckDB over the published tables ------------------------------------------------------------


def duckdb_as_of(t: int, names: list[str] | None = None, runtime: Where = None, con=None):
    """A DuckDB connection (``con``, or a new in-memory one) with the views ``<name>`` and ``<name>_progress`` of
    every named source as of IntoTime ``t`` (and a Postgres source's typed views: those of :func:`register_as_of`),
    after the same checks; ``(con, counts)``."""
    import duckdb

    runtime = Runtime.of(runtime)
    names = names or list(runtime.config.sources)
    con = con if con is not None else duckdb.connect()
    counts = {}
    for name in names:
        with runtime.source(name, connect=False) as ctx:
            counts[name] = _duckdb_source(con, name, t, ctx)
    return con, counts


def _duckdb_source(con, name: str, t: int, ctx) -> int:
    """Register ``name`` and ``name_progress`` on ``con``: lazy views over one version of the published table (its
    Arrow dataset: DuckDB pushes ``into_time <= t`` and the columns down into the scan); the contents' row count."""
    import pyarrow as pa

    remap = ctx.tables.read_remap()
    window = _window(name, ctx.tables, remap)
    window.check(t)
    dt = ctx.tables.table("reclocked")
    dataset = dt.to_pyarrow_dataset()  # one Delta version from here on
    since = ctx.tables.since()
    if since > t:  # compaction folded t away after the window was read: refused as Spark's read refuses it
        Readable(name, since, window.upper).check(t)
    drop = ("into_time", "diff") if ctx.config.offsets_unique else ("into_time", "diff", "offset")
    content = getattr(ctx.source, "content_columns", None)
    keys = list(content) if content else [c for c in dataset.schema.names if c not in drop]
    scratch = _quote(f"_reclock_{name}_published")
    con.register(scratch.strip('"'), dataset)
    quoted = ", ".join(_quote(k) for k in keys)
    if diff_range(dt) == (1, 1):
        # Every diff 1 (the snapshot's file statistics): a record's sum(diff) is the number of its rows, each
        # copy of it one row, so the contents are the rows at or before t as they are, read without grouping
        # (Spark's views group: the tests compare both).
        plain = f"SELECT {quoted} FROM {scratch} WHERE into_time <= {int(t)}"
        rows, = con.sql(f"SELECT count(*) FROM {scratch} WHERE into_time <= {int(t)}").fetchall()[0]
        con.execute(f"CREATE OR REPLACE TEMP VIEW {_quote(name)} AS {plain}")
    else:
        counted = (f"SELECT {quoted}, CAST(sum(diff) AS BIGINT) AS _n FROM {scratch} WHERE into_time <= {int(t)} "
                   "GROUP BY ALL HAVING sum(diff) <> 0")
        negative, rows = con.sql(f"SELECT count(*) FILTER (WHERE _n < 0), coalesce(sum(_n), 0) FROM ({counted})"
                                 ).fetchall()[0]
        if negative:
            raise QueryError(f"{name}: negative multiplicity as of {t}: the reclocked history is inconsistent")
        con.execute(f"CREATE OR REPLACE TEMP VIEW {_quote(name)} AS SELECT {quoted} FROM ({counted}) AS c, "
                    "range(c._n)")
    if offers(ctx.source, TableColumns):
        if problem := typed_problem(name, ctx.tables, t):
            raise QueryError(problem)
        as_of_duckdb(con, name, ctx.tables, scratch, t, ctx.source.table_columns)
    offset_type = ctx.tables.offset_type
    progress = _progress_rows(remap, t, offset_type)
    offset_arrow = pa.string() if offsets.is_big(offset_type) else pa.int64()
    con.register(f"{name}_progress", pa.table(
        {"into_time": pa.array([p[0] for p in progress], pa.int64()),
         "partition": pa.array([p[1] for p in progress], pa.string()),
         "offset": pa.array([p[2] for p in progress], offset_arrow)}))
    return int(rows)


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def query_as_of_duckdb(sql: str, t: int, names: list[str] | None = None, runtime: Where = None) -> Any:
    """Run DuckDB SQL over the named sources as of IntoTime ``t`` with no JVM (:func:`duckdb_as_of`); an Arrow
    table."""
    con, _ = duckdb_as_of(t, names, runtime)
    return con.sql(sql).to_arrow_table()
