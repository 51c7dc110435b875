"""Rewrites: the rows of a Delta table whose integer ``column`` lies in ``[low, high]`` (no lower bound when
``low`` is None) replaced by others, Spark computing and writing the files, delta-rs committing them
(:func:`rewrite`): a compaction's rewrite of reclocked, a backfill repair, an AS OF result's rows at one time.

The law: the commit removes exactly the files that may hold rows in the range (by their statistics, every file
without them too) in the snapshot read, and adds files holding their rows outside the range as they were and
``replace(their rows inside)``; so after it the table holds the rows outside the range it held, those that racing
commits added, and the replacement.  A racing commit is let through only when the files that may hold rows in the
range are still exactly those removed (:func:`~reclock.storage.commits.replace_files`): a rewrite never removes a
row it did not read nor keeps one it replaced.
"""
from __future__ import annotations

from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import DeltaTable

from . import commits
from .files import add_action, drop_leftovers, files_with_rows, footer, parquet_files, parquet_stats
from .layout import ConcurrentWriteError, attempt_dir

#: A rewrite writes files of about this size.
REWRITTEN_FILE_BYTES = 128 << 20
#: Where a rewrite's files are written, inside the table's directory (outside its log until the commit).
REWRITTEN = "rewritten"


def rewrite(spark, dt: DeltaTable, fs: pafs.FileSystem, table: str, spark_root: str, schema, column: str,
            low: int | None, high: int, replace, point: str, raced: str, metadata: dict) -> bool:
    """Replace the rows of the table ``dt`` was read at with ``low <= column <= high`` by ``replace(rows)`` (a Spark
    DataFrame of them; None: nothing to rewrite, and False) in one delta-rs commit observed as ``point``.

    ``fs`` and ``spark_root`` name the directory holding the table's (``table``: its directory there) for pyarrow
    and for Spark; ``schema`` is the table's Spark schema.  Spark reads the files holding such rows straight from
    their Parquet (which no table feature reclock accepts changes the meaning of) and writes their other rows as
    they are and the replacement, as files of about :data:`REWRITTEN_FILE_BYTES`, under
    ``<table>/rewritten/<attempt>/``; a crash before the commit leaves them to VACUUM, a refused commit deletes
    them.  A racing commit it cannot go on over: :class:`ConcurrentWriteError` saying ``raced``, nothing rewritten.
    """
    from pyspark.sql import functions as F

    covered = covering(files_with_rows(dt), column, low, high)
    paths, sizes = covered["path"].to_pylist(), covered["size_bytes"].to_pylist()
    reader = spark.read.schema(schema).option("recursiveFileLookup", "true")  # no partition discovery
    old = (reader.parquet(*[f"{spark_root}/{table}/{unquote(p)}" for p in paths]) if paths
           else spark.createDataFrame([], schema))
    inside = between(F.col(column), low, high)
    new = replace(old.where(inside))
    if new is None:
        return False
    directory = attempt_dir(f"{table}/{REWRITTEN}")
    files = max(1, -(-sum(sizes) // REWRITTEN_FILE_BYTES))
    (old.where(~inside).unionByName(new.select(*schema.names)).coalesce(files)
     .write.parquet(f"{spark_root}/{directory}"))
    added = [(info, stats) for info in parquet_files(fs, directory)
             if (stats := parquet_stats(footer(fs, info.path)))["numRecords"]]
    try:
        commits.replace_files(dt, list(zip(paths, sizes)), [add_action(i, s, table) for i, s in added],
                              lambda latest: covering(files_with_rows(latest), column, low, high)["path"].to_pylist(),
                              point, raced, metadata)
    except ConcurrentWriteError:
        fs.delete_dir(directory)
        raise
    drop_leftovers(fs, directory, [info.base_name for info, _ in added])
    return True


def covering(files: pa.Table, column: str, low: int | None, high: int) -> pa.Table:
    """The add actions (flattened) of ``files`` that may hold rows with ``low <= column <= high``: by their
    statistics, and every file without them."""
    if f"min.{column}" not in files.column_names:
        return files
    lo, hi = files[f"min.{column}"], files[f"max.{column}"]
    may = pc.less_equal(pc.fill_null(lo, high), high)
    if low is not None:
        may = pc.and_(may, pc.greater_equal(pc.fill_null(hi, low), low))
    return files.filter(may)


def between(column, low: int | None, high: int):
    """The Spark condition ``low <= column <= high`` (no lower bound when ``low`` is None)."""
    return column <= high if low is None else column.between(low, high)


def bounds(column: str, low: int | None, high: int) -> str:
    """``low <= column <= high`` in words."""
    return f"{column} <= {high}" if low is None else f"{low} <= {column} <= {high}"


def checked(df, column: str, low: int | None, high: int, what: str):
    """``df``, failing when its job runs on a row whose ``column`` lies outside ``[low, high]`` (an error naming
    ``what`` and the value)."""
    from pyspark.sql import functions as F

    outside = F.raise_error(F.concat(F.lit(f"{what}: a row to replace lies outside {bounds(column, low, high)}: "
                                           f"{column} "), F.col(column).cast("string")))
    return df.where(F.when(between(F.col(column), low, high), F.lit(True)).otherwise(outside))
