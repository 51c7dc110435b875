"""Data files without a JVM: Parquet footers read with pyarrow, the Delta ``add`` action and statistics of a file
written for a table, what a table's Delta log says of its files, and a snapshot's rows read with delta-rs.

Statistics are Delta's (``numRecords``, ``nullCount``, ``minValues``, ``maxValues``) as delta-spark writes them for
the same file: a string column's min/max only when both are ASCII and at most :data:`STATS_STRING_CHARS` long,
whose order no encoding or truncation changes; none for a column a row group has no statistics of.
"""
from __future__ import annotations

import json
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable

from ..clock import now_ms
from .layout import Kind, WarehouseError

STATS_STRING_CHARS = 32  # string min/max kept in the statistics of published files (as delta-spark's prefix)


def parquet_files(fs: pafs.FileSystem, directory: str) -> list[pafs.FileInfo]:
    """The data files Spark wrote in ``directory`` (not ``_SUCCESS``, ``.crc`` or other hidden files)."""
    return [i for i in fs.get_file_info(pafs.FileSelector(directory))
            if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
            and not i.base_name.startswith(("_", "."))]


def footer(fs: pafs.FileSystem, path: str) -> pq.FileMetaData:
    with fs.open_input_file(path) as f:
        return pq.read_metadata(f)


def footer_rows(fs: pafs.FileSystem, files: list[pafs.FileInfo]) -> int:
    """The rows of Parquet ``files``, from their footers (no Spark job)."""
    return sum(footer(fs, i.path).num_rows for i in files)


def parquet_stats(meta: pq.FileMetaData, string_chars: int = STATS_STRING_CHARS) -> dict:
    """Delta file statistics from Parquet footers: row count, null counts, min/max of int and string columns
    (of strings only ASCII ones up to ``string_chars`` long, whose order no encoding or truncation changes)."""
    stats: dict = {"numRecords": meta.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    arrow = meta.schema.to_arrow_schema()
    for j in range(meta.num_columns):
        name = meta.schema.column(j).path
        if name not in arrow.names:
            continue  # leaf of a nested column
        chunks = [meta.row_group(r).column(j).statistics for r in range(meta.num_row_groups)]
        if not chunks or any(s is None or not s.has_null_count for s in chunks):
            continue
        stats["nullCount"][name] = sum(s.null_count for s in chunks)
        kind = arrow.field(name).type
        if (pa.types.is_integer(kind) or pa.types.is_string(kind)) and all(s.has_min_max for s in chunks):
            low, high = min(s.min for s in chunks), max(s.max for s in chunks)
            if pa.types.is_string(kind) and not all(
                    len(v) <= string_chars and v.isascii() for v in (low, high)):
                continue
            stats["minValues"][name], stats["maxValues"][name] = low, high
    return stats


def add_action(info: pafs.FileInfo, stats: dict, kind: Kind):
    """The Delta ``add`` action of a Parquet file written for table ``kind`` (``info``: its path relative to the
    source, inside the table's directory): its path relative to the table, size, and ``stats`` (from its footer)."""
    from deltalake.transaction import AddAction

    if not info.path.startswith(f"{kind}/"):
        raise WarehouseError(f"staged file {info.path} lies outside the {kind} table's directory")
    return AddAction(quote(info.path[len(kind) + 1:], safe="/="), info.size, {},
                     info.mtime_ns // 1_000_000 if info.mtime_ns else now_ms(), True,
                     json.dumps(stats))


def drop_leftovers(fs: pafs.FileSystem, attempt: str, committed: list[str]) -> None:
    """Remove what a Spark write's directory ``attempt`` holds besides the ``committed`` files (names; now a
    table's) and their checksums: ``_SUCCESS``, a staged batch's ``_batch.json`` and dead letters (published), files
    without rows."""
    keep = set(committed) | {f".{name}.crc" for name in committed}
    for info in fs.get_file_info(pafs.FileSelector(attempt)):
        if info.base_name in keep:
            continue
        fs.delete_dir(info.path) if info.type == pafs.FileType.Directory else fs.delete_file(info.path)


def read_rows(dt: DeltaTable, schema: pa.Schema, filter: pc.Expression | None = None) -> pa.Table:
    """The rows of snapshot ``dt`` (those matching ``filter``) with ``schema``."""
    return dt.to_pyarrow_dataset().to_table(filter=filter).select(schema.names).cast(schema)


def files_with_rows(dt: DeltaTable) -> pa.Table:
    """The snapshot's add actions (flattened: ``size_bytes``, ``min.into_time``, ...) of files holding rows."""
    files = pa.table(dt.get_add_actions(flatten=True))
    return files.filter(pc.not_equal(pc.fill_null(files["num_records"], -1), 0))  # idle ticks commit empty files


def max_into_time(dt: DeltaTable | None) -> int | None:
    """``max(into_time)`` of a snapshot (None: no rows), from the file statistics where every file has them."""
    if dt is None:
        return None
    files = files_with_rows(dt)
    if files.num_rows == 0:
        return None
    if "max.into_time" in files.column_names and files["max.into_time"].null_count == 0:
        return pc.max(files["max.into_time"]).as_py()
    return pc.max(dt.to_pyarrow_dataset().to_table(columns=["into_time"])["into_time"]).as_py()


def diff_range(dt: DeltaTable) -> tuple[int, int] | None:
    """``(min(diff), max(diff))`` of a snapshot's rows from its file statistics; None when it has no rows or a file
    lacks them (then only a scan tells)."""
    files = files_with_rows(dt)
    if files.num_rows == 0 or any(c not in files.column_names or files[c].null_count for c in ("min.diff", "max.diff")):
        return None
    return pc.min(files["min.diff"]).as_py(), pc.max(files["max.diff"]).as_py()
