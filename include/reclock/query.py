"""``AS OF`` queries over reclocked sources: one consistent IntoTime across every source in a query.

``register_as_of(spark, t, names)`` makes each source a Spark temp view holding its
contents at IntoTime ``t`` (and ``<name>_progress`` with its remap; for a Postgres source also one typed
view per table, ``<name>_<table>``: :mod:`reclock.pg_types`), after checking
that ``t`` is readable for every source: not compacted away (``t >= since``) and
complete (``t`` below both the remap and the reclocked uppers).
"""
from __future__ import annotations

from dataclasses import dataclass

from . import offsets
from .config import Config, load_config
from .engine import RemapError, timestamp_resumption_frontier
from .pipeline import open_source


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


def readable(name: str, config_path: str | None = None) -> Readable:
    with open_source(name, config_path, connect=False) as ctx:
        return _window(name, ctx.tables, ctx.tables.read_remap())


def common_readable(names: list[str], config_path: str | None = None) -> tuple[int, int]:
    """The window ``[since, upper)`` in which every named source is readable."""
    windows = [readable(n, config_path) for n in names]
    return max(w.since for w in windows), min(w.upper for w in windows)


def register_as_of(spark, t: int, names: list[str] | None = None, config_path: str | None = None) -> dict[str, int]:
    """Register ``<name>`` and ``<name>_progress`` temp views as of IntoTime ``t``; returns row counts."""
    from pyspark.sql import functions as F

    config: Config = load_config(config_path)
    counts = {}
    for name in names or list(config.sources):
        with open_source(name, config_path, connect=False) as ctx:
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
            if column := getattr(ctx.source, "table_columns", None):
                _register_typed(df, contents, name, column)
            # Offsets as the reclocked table stores them (big ones encoded, order-preserving): comparable.
            offset_type = ctx.tables.offset_type
            try:
                progress = [(r.into_time, str(r.partition), offsets.to_storage(r.offset, offset_type))
                            for r in remap.progress() if r.into_time <= t]
            except RemapError as e:
                raise QueryError(str(e)) from e
            schema = f"into_time long, partition string, offset {offsets.sql_type(offset_type)}"
            spark.createDataFrame(progress, schema).createOrReplaceTempView(f"{name}_progress")
            counts[name] = contents.count()
    return counts


def _register_typed(df, contents, name: str, column: str) -> None:
    """A typed view per upstream table (:func:`reclock.pg_types.view_name`): its rows of ``contents`` with the
    columns of the table's latest record in ``df``, the published history (:mod:`reclock.pg_types`)."""
    from pyspark.sql import functions as F

    from .pg_types import parse_columns, typed_columns, view_name

    position = F.struct("into_time", (F.col("partition") == "").alias("change"), "offset", "seq")
    latest = df.where(F.col(column).isNotNull()).groupBy("table").agg(F.max_by(column, position).alias(column))
    for r in latest.collect():
        rows = contents.where(F.col("table") == r["table"])
        rows.select(*typed_columns(F.col("row"), parse_columns(r[column]))).createOrReplaceTempView(
            view_name(name, r["table"]))


def query_as_of(spark, sql: str, t: int, names: list[str] | None = None, config_path: str | None = None):
    """Run Spark SQL over the named sources as of IntoTime ``t``."""
    register_as_of(spark, t, names, config_path)
    return spark.sql(sql)


AS_OF_COLUMN = "as_of"


def publish_as_of(target: str, sql: str, names: list[str], config_path: str | None = None, spark=None) -> dict:
    """Run ``sql`` over ``names`` AS OF the latest IntoTime all of them can answer, ``t = upper - 1`` of
    :func:`common_readable`, and write its rows, with a column ``as_of = t``, to the Delta table
    ``<warehouse>/<target>``: the rows of an earlier run at the same ``t`` are replaced (a rerun is
    idempotent), those of other times are kept.  ``{"as_of": None}`` when no IntoTime is readable in all."""
    from pyspark.sql import functions as F

    from .spark_session import get_spark
    from .warehouse import Warehouse, is_delta_table

    config = load_config(config_path)
    if target in config.sources:
        raise QueryError(f"{target} is a source: the AS OF result needs another name")
    since, upper = common_readable(names, config_path)
    if upper <= max(since, 0):
        return {"target": target, "as_of": None, "rows": 0, "why": f"no IntoTime is readable in all of {names}"}
    t = upper - 1
    spark = spark or get_spark(config.spark_master, f"reclock-as-of-{target}", s3=config.warehouse.startswith("s3"),
                               conf=config.spark_conf, remote=config.spark_remote)
    rows = query_as_of(spark, sql, t, names, config_path).withColumn(AS_OF_COLUMN, F.lit(t).cast("long"))
    uri = Warehouse(config.warehouse, config.storage_options).spark_uri(target)
    writer = rows.write.format("delta")
    if is_delta_table(spark, uri):
        writer = writer.mode("overwrite").option("replaceWhere", f"{AS_OF_COLUMN} = {t}")
    writer.save(uri)
    count = spark.read.format("delta").load(uri).where(F.col(AS_OF_COLUMN) == t).count()
    return {"target": target, "as_of": t, "rows": count, "sources": names}
