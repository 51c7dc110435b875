"""Delta Lake storage of each source: ``<root>/<name>/remap`` and ``<root>/<name>/reclocked``.

Every Delta commit is made by ``deltalake`` (delta-rs); Spark only writes plain Parquet
files and reads the Parquet files of a snapshot (no delta-spark).  Progress lives in
Delta *app transactions*, so it commits atomically with the rows it describes and
survives overwrites:

* remap table, app ``reclock.remap``: version = remap upper - 1 (the last tick);
* remap table, app ``reclock.since``: version = compaction frontier ``since``;
* reclocked table, app ``reclock.reclocked``: version = last published IntoTime.

A backfill repair (:meth:`SourceTables.replace_reclocked`) rewrites a window of published
IntoTimes in one overwrite commit without an app transaction, so the versions stay as they were.

Spark stages reclocked rows under ``reclocked/staged/upto=<t>/<attempt>/`` (a fresh
attempt directory per :meth:`SourceTables.staging_dir` call, so a rerun never
overwrites files a previous attempt may already have published);
:meth:`SourceTables.publish_staged` commits the latest complete attempt (one with
Spark's ``_SUCCESS`` marker) as Add actions in one commit.  The staging directory
must not start with ``_``: delta-rs vacuum never deletes files under hidden paths.
Tables never use deletion vectors, so a snapshot is exactly its file list.
"""
from __future__ import annotations

import json
import os
import time
import uuid
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.fs import DeltaStorageHandler
from deltalake.transaction import AddAction

from . import offsets
from .engine import Remap

Kind = Literal["remap", "reclocked"]
KINDS: tuple[Kind, ...] = ("remap", "reclocked")
REMAP_APP, SINCE_APP, RECLOCKED_APP = "reclock.remap", "reclock.since", "reclock.reclocked"
STAGED = "staged"
SUCCESS = "_SUCCESS"


class WarehouseError(RuntimeError):
    """Stored state or staged files that reclock cannot accept; nothing was committed."""


REMAP_MAX_FILES = 32  # merge the remap table's per-tick files beyond this many


def remap_schema(partition_type: pa.DataType, offset_type: pa.DataType = offsets.INT64) -> pa.Schema:
    """``increment`` is stored like the source's offsets (:mod:`reclock.offsets`): int64 or big."""
    return pa.schema([("partition", partition_type), ("into_time", pa.int64()), ("increment", offset_type)])


def reclocked_schema(partition_type: pa.DataType, data_schema: pa.Schema,
                     offset_type: pa.DataType = offsets.INT64) -> pa.Schema:
    return pa.schema(list(data_schema) + [
        pa.field("partition", partition_type), pa.field("offset", offset_type),
        pa.field("into_time", pa.int64()), pa.field("diff", pa.int64())])


class Warehouse:
    """A root URI (local path, or e.g. ``s3://bucket/prefix`` with deltalake ``storage_options``)."""

    def __init__(self, root: str, storage_options: dict | None = None):
        self.root = root.rstrip("/") if "://" in root else os.path.abspath(root)
        self.storage_options = storage_options

    def source_uri(self, name: str) -> str:
        """Where source ``name``'s tables (and its last check record) live."""
        return f"{self.root}/{name}"

    def source(self, name: str, partition_type: pa.DataType, data_schema: pa.Schema,
               offset_type: pa.DataType = offsets.INT64) -> "SourceTables":
        """The tables of source ``name``, created on first use (schema checked otherwise)."""
        tables = SourceTables(self.source_uri(name), partition_type, data_schema, self.storage_options,
                              offset_type=offset_type)
        tables.create_if_absent()
        return tables


class SourceTables:
    """The remap and reclocked Delta tables of one source."""

    def __init__(self, uri: str, partition_type: pa.DataType, data_schema: pa.Schema,
                 storage_options: dict | None = None, *, offset_type: pa.DataType = offsets.INT64):
        """``offset_type``: how offsets and increments are stored (:func:`reclock.offsets.offset_type_of`)."""
        self.uri = uri
        self.storage_options = storage_options
        self.data_columns = list(data_schema.names)
        self.offset_type = offsets.check_type(offset_type)
        self.schemas: dict[Kind, pa.Schema] = {
            "remap": remap_schema(partition_type, self.offset_type),
            "reclocked": reclocked_schema(partition_type, data_schema, self.offset_type)}

    # --- tables -------------------------------------------------------------------------

    def table_uri(self, kind: Kind) -> str:
        return f"{self.uri}/{kind}"

    def table(self, kind: Kind, version: int | None = None) -> DeltaTable:
        """A fresh :class:`DeltaTable` at its latest (or the given) version."""
        return DeltaTable(self.table_uri(kind), version=version, storage_options=self.storage_options)

    def create_if_absent(self) -> None:
        """Create both tables if missing; :class:`WarehouseError` if one exists with another schema."""
        for kind in KINDS:
            dt = DeltaTable.create(self.table_uri(kind), self.schemas[kind], mode="ignore",
                                   name=f"{self.uri.rsplit('/', 1)[-1]}_{kind}",
                                   storage_options=self.storage_options)
            found = _arrow_schema(dt)
            if not _same_columns(found, self.schemas[kind]):
                raise WarehouseError(f"{self.table_uri(kind)} exists with another schema: "
                                     f"{_schema_diff(found, self.schemas[kind])}")

    def _fs(self, kind: Kind) -> pafs.FileSystem:
        """The table's storage as a pyarrow filesystem, paths relative to the table root."""
        return pafs.PyFileSystem(DeltaStorageHandler(self.table_uri(kind), self.storage_options))

    def _append(self, kind: Kind, rows: pa.Table, app_id: str, version: int) -> None:
        """Append ``rows`` (possibly none) in one commit carrying the app transaction."""
        write_deltalake(self.table_uri(kind), rows, mode="append", storage_options=self.storage_options,
                        commit_properties=_txn(app_id, version))

    def _read(self, kind: Kind, version: int | None = None, filter: pc.Expression | None = None) -> pa.Table:
        return _rows(self.table(kind, version), self.schemas[kind], filter)

    # --- remap --------------------------------------------------------------------------

    def since(self) -> int:
        """The compaction frontier (0 initially): IntoTimes before it are no longer readable."""
        return _app_version(self.table("remap"), SINCE_APP, 0)

    def remap_upper(self) -> int:
        """The stored remap upper: first IntoTime not yet bound."""
        return _app_version(self.table("remap"), REMAP_APP, -1) + 1

    def read_remap(self) -> Remap:
        """The stored remap, with ``since`` and ``upper`` from the app transactions."""
        dt = self.table("remap")
        since, upper = _app_version(dt, SINCE_APP, 0), _app_version(dt, REMAP_APP, -1) + 1
        rows = _rows(dt, self.schemas["remap"])  # the same snapshot as since and upper
        increments = offsets.from_arrow(rows["increment"])  # Python ints, however they are stored
        remap = Remap.from_increments(zip(rows["partition"].to_pylist(), rows["into_time"].to_pylist(), increments),
                                      0, upper)
        return remap.compact(since)  # rows may predate a crashed compaction (since recorded first)

    def append_binding(self, remap_before: Remap, remap_after: Remap) -> bool:
        """Store the ticks minting ``remap_after`` from ``remap_before`` in one commit; False if already stored."""
        version = remap_after.upper - 1
        stored = _app_version(self.table("remap"), REMAP_APP, -1)
        if stored >= version:
            return False
        if remap_after.upper <= remap_before.upper:
            raise WarehouseError(f"remap_after (upper {remap_after.upper}) is not beyond remap_before "
                                 f"(upper {remap_before.upper})")
        if stored + 1 != remap_before.upper:
            raise WarehouseError(f"remap_before has upper {remap_before.upper} but the stored remap "
                                 f"has upper {stored + 1}")
        rows = [r for r in remap_after.increments() if r.into_time >= remap_before.upper]
        try:
            table = pa.Table.from_pylist([r._replace(increment=offsets.to_storage(r.increment, self.offset_type))
                                          ._asdict() for r in rows], schema=self.schemas["remap"])
        except offsets.OffsetError as e:
            raise WarehouseError(f"cannot store the remap of {self.uri}: {e}") from e
        self._append("remap", table, REMAP_APP, version)
        remap_table = self.table("remap")
        if len(remap_table.file_uris()) > REMAP_MAX_FILES:  # one file per tick: keep reads cheap
            remap_table.optimize.compact()
        return True

    # --- reclocked ----------------------------------------------------------------------

    def reclocked_upper(self) -> int:
        """IntoTime upper of the published reclocked table: last published IntoTime + 1, 0 if none."""
        return _app_version(self.table("reclocked"), RECLOCKED_APP, -1) + 1

    def staging_dir(self, upto: int) -> str:
        """A fresh directory (Spark URI) for the Parquet files of the bindings up to IntoTime ``upto``.

        Write it with Spark's default committer (``_SUCCESS`` marks a complete attempt).
        Skip staging when ``reclocked_upper() > upto``: it is already published.
        """
        return self._spark_path(self._new_attempt(upto))

    def _new_attempt(self, upto: int) -> str:
        return _attempt_dir(_upto_dir(upto))

    def _spark_path(self, relative: str) -> str:
        return f"{_spark_uri(self.table_uri('reclocked'))}/{relative}"

    def stage(self, df, upto: int) -> int:
        """Write a Spark DataFrame of reclocked rows up to ``upto`` as a fresh attempt; rows staged.

        0 and nothing written when ``upto`` is already published.
        """
        if self.reclocked_upper() > upto:
            return 0
        attempt = self._new_attempt(upto)
        df.select(*self.schemas["reclocked"].names).write.parquet(self._spark_path(attempt))
        fs = self._fs("reclocked")
        return sum(_footer(fs, i.path).num_rows for i in _parquet_files(fs, attempt))

    def read_staged(self, upto: int):
        """The latest complete staged attempt for ``upto`` as a pandas DataFrame (for checks before publishing)."""
        fs = self._fs("reclocked")
        _, attempt = self._attempts(fs, upto)
        paths = [i.path for i in _parquet_files(fs, attempt)]
        schema = self.schemas["reclocked"]
        return pads.dataset(paths, schema=schema, filesystem=fs, format="parquet").to_table().to_pandas()

    def _attempts(self, fs: pafs.FileSystem, upto: int) -> tuple[list[str], str]:
        """Every staged attempt directory for ``upto``, and the latest complete one."""
        attempts = sorted(i.path for i in fs.get_file_info(pafs.FileSelector(_upto_dir(upto), allow_not_found=True))
                          if i.type == pafs.FileType.Directory)
        complete = [a for a in attempts if fs.get_file_info(f"{a}/{SUCCESS}").type == pafs.FileType.File]
        if not complete:
            raise WarehouseError(f"no complete staged attempt (with {SUCCESS}) under "
                                 f"{self.table_uri('reclocked')}/{_upto_dir(upto)}")
        return attempts, complete[-1]

    def publish_staged(self, upto: int) -> bool:
        """Commit the latest complete staged attempt for ``upto`` in one commit; False if already published."""
        published = _app_version(self.table("reclocked"), RECLOCKED_APP, -1)
        if published >= upto:
            return False
        remap_upper = self.remap_upper()
        if upto >= remap_upper:
            raise WarehouseError(f"cannot publish up to {upto}: remap upper is {remap_upper}")
        fs = self._fs("reclocked")
        attempts, attempt = self._attempts(fs, upto)
        adds = [self._add_action(fs, info, published + 1, upto) for info in _parquet_files(fs, attempt)]
        self.table("reclocked").create_write_transaction(
            adds, mode="append", schema=self.schemas["reclocked"],
            commit_properties=_txn(RECLOCKED_APP, upto))
        for stale in set(attempts) - {attempt}:
            fs.delete_dir(stale)  # never published (only this commit could have published them)
        return True

    def _add_action(self, fs: pafs.FileSystem, info: pafs.FileInfo, lower: int, upto: int) -> AddAction:
        """Add action of one staged file, after checking its schema and its IntoTimes lie in [lower, upto]."""
        meta = _footer(fs, info.path)
        found, expected = meta.schema.to_arrow_schema(), self.schemas["reclocked"]
        if not _same_columns(found, expected):
            raise WarehouseError(f"staged file {info.path} does not match the reclocked table: "
                                 f"{_schema_diff(found, expected)}")
        stats = _parquet_stats(meta)
        lo, hi = stats["minValues"].get("into_time", lower), stats["maxValues"].get("into_time", upto)
        if lo < lower or hi > upto:
            raise WarehouseError(f"staged file {info.path} has IntoTimes [{lo}, {hi}] outside [{lower}, {upto}]")
        return AddAction(info.path, info.size, {}, info.mtime_ns // 1_000_000, True, json.dumps(stats))

    def snapshot_files(self, kind: Kind, version: int | None = None) -> list[str]:
        """URIs of the Parquet files of a snapshot (latest or ``version``), spelled for ``spark.read.parquet``."""
        return [_spark_uri(f) for f in self.table(kind, version).file_uris()]

    def read_reclocked_spark(self, spark, version: int | None = None):
        """The reclocked snapshot as a Spark DataFrame with the table schema (empty when no files)."""
        from pyspark.sql.pandas.types import from_arrow_schema

        schema = from_arrow_schema(self.schemas["reclocked"])
        files = self.snapshot_files("reclocked", version)
        return spark.read.schema(schema).parquet(*files) if files else spark.createDataFrame([], schema)

    def replace_reclocked(self, df, predicate: str) -> int:
        """Replace the reclocked rows matching ``predicate`` (SQL on ``into_time``) by a Spark DataFrame's rows.

        One commit (delta-rs overwrite with ``predicate``; every new row must match it). Spark writes
        Parquet under ``replay/<attempt>/`` in the table, which is streamed from there into the commit and
        then deleted, so the rows never all sit in driver memory. The commit carries no app transaction, so
        ``reclocked_upper`` stays what it was. Returns the number of rows written.
        """
        attempt = _attempt_dir("replay")
        schema = self.schemas["reclocked"]
        df.select(*schema.names).write.parquet(self._spark_path(attempt))
        fs = self._fs("reclocked")
        try:
            paths = [i.path for i in _parquet_files(fs, attempt)]
            dataset = pads.dataset(paths, schema=schema, filesystem=fs, format="parquet")
            rows = dataset.count_rows()
            reader = pa.RecordBatchReader.from_batches(schema, dataset.to_batches())
            write_deltalake(self.table_uri("reclocked"), reader, mode="overwrite", predicate=predicate,
                            storage_options=self.storage_options)
        finally:
            fs.delete_dir(attempt)
        return rows

    def read_reclocked_arrow(self, version: int | None = None) -> pa.Table:
        """The reclocked snapshot through deltalake (small tables, tests)."""
        return self._read("reclocked", version)

    def remap_frame(self):
        """The stored remap rows as a pandas DataFrame (for checks)."""
        return self._read("remap").to_pandas()

    # --- compaction ---------------------------------------------------------------------

    def compact(self, since: int, retention_hours: int = 0) -> None:
        """Compact both tables to ``since``; every step is idempotent, so rerun after a crash.

        1. record ``since`` (queries before it are refused from then on);
        2. fold remap increments at or before ``since`` into one row per partition at ``since``;
        3. advance reclocked IntoTimes to ``since`` there and consolidate diffs;
        4. optimize (merge small files) and vacuum files removed more than ``retention_hours`` ago.
        """
        stored = self.since()
        since, upper = max(since, stored), min(self.remap_upper(), self.reclocked_upper())
        if since >= upper:
            raise WarehouseError(f"cannot compact to {since}: published only below {upper}")
        if stored < since:
            self._append("remap", self.schemas["remap"].empty_table(), SINCE_APP, since)
        self._consolidate("remap", since, ["partition"], "increment")
        self._consolidate("reclocked", since, self.data_columns + ["partition", "offset"], "diff")
        for kind in KINDS:
            self.table(kind).optimize.compact()  # commits only when there are files to merge
            self._vacuum(kind, retention_hours)

    def _vacuum(self, kind: Kind, retention_hours: int) -> None:
        """Delete files removed more than ``retention_hours`` ago, committing only if any still exist.

        delta-rs lists a tombstone (and writes VACUUM START/END commits) on every vacuum
        until the tombstone expires from the log, even once its file is gone.
        """
        dt, options = self.table(kind), dict(retention_hours=retention_hours, enforce_retention_duration=False)
        candidates = dt.vacuum(dry_run=True, **options)  # paths relative to the table root
        if candidates and any(i.type == pafs.FileType.File for i in self._fs(kind).get_file_info(candidates)):
            dt.vacuum(dry_run=False, **options)

    def _consolidate(self, kind: Kind, since: int, keys: list[str], value: str) -> bool:
        """Rewrite rows at or before ``since`` as ``sum(value)`` per key at ``since``; False if already so."""
        at_or_before = pc.field("into_time") <= since
        old = self._read(kind, filter=at_or_before)
        advanced = old.set_column(old.schema.get_field_index("into_time"), "into_time",
                                  pa.repeat(pa.scalar(since, pa.int64()), old.num_rows))
        new = _sum_by(advanced, keys + ["into_time"], value, self.schemas[kind])
        if new.num_rows == old.num_rows and (old.num_rows == 0 or pc.min(old["into_time"]).as_py() == since):
            return False
        write_deltalake(self.table_uri(kind), new, mode="overwrite", predicate=f"into_time <= {since}",
                        storage_options=self.storage_options)
        return True


# --- helpers ------------------------------------------------------------------------------


def _sum_by(table: pa.Table, keys: list[str], value: str, schema: pa.Schema) -> pa.Table:
    """Rows of ``schema``: ``sum(value)`` per ``keys``, zero sums dropped.

    An int64 ``value`` sums in Arrow; a big one (encoded strings, :mod:`reclock.offsets`)
    sums exactly in Python ints, then is encoded again.
    """
    if not offsets.is_big(table.schema.field(value).type):
        summed = table.group_by(keys, use_threads=False).aggregate([(value, "sum")])
        new = summed.rename_columns([value if c == f"{value}_sum" else c for c in summed.column_names])
        return new.filter(pc.field(value) != 0).select(schema.names).cast(schema)
    sums: dict[tuple, int] = {}
    for key, amount in zip(zip(*(table[k].to_pylist() for k in keys)), offsets.from_arrow(table[value])):
        sums[key] = sums.get(key, 0) + amount
    kept = [(key, total) for key, total in sums.items() if total]
    columns = {k: [key[i] for key, _ in kept] for i, k in enumerate(keys)}
    columns[value] = [offsets.to_storage(total, schema.field(value).type) for _, total in kept]
    return pa.Table.from_pydict({n: columns[n] for n in schema.names}, schema=schema)


def _txn(app_id: str, version: int) -> CommitProperties:
    return CommitProperties(app_transactions=[Transaction(app_id, version)])


def _app_version(dt: DeltaTable, app_id: str, default: int) -> int:
    version = dt.transaction_version(app_id)
    return default if version is None else version


def _rows(dt: DeltaTable, schema: pa.Schema, filter: pc.Expression | None = None) -> pa.Table:
    return dt.to_pyarrow_dataset().to_table(filter=filter).select(schema.names).cast(schema)


def _parquet_files(fs: pafs.FileSystem, directory: str) -> list[pafs.FileInfo]:
    """The data files Spark wrote in ``directory`` (not ``_SUCCESS``, ``.crc`` or other hidden files)."""
    return [i for i in fs.get_file_info(pafs.FileSelector(directory))
            if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
            and not i.base_name.startswith(("_", "."))]


def _footer(fs: pafs.FileSystem, path: str) -> pq.FileMetaData:
    with fs.open_input_file(path) as f:
        return pq.read_metadata(f)


def _attempt_dir(parent: str) -> str:
    """A new, unique directory under ``parent`` for one Spark write (ordered by creation time)."""
    return f"{parent}/{time.time_ns() // 1_000_000:013d}-{uuid.uuid4().hex[:8]}"


def _upto_dir(upto: int) -> str:
    return f"{STAGED}/upto={upto}"


def _spark_uri(uri: str) -> str:
    """Spark's (Hadoop S3A) spelling of an object-store URI."""
    return "s3a://" + uri[len("s3://"):] if uri.startswith("s3://") else uri


def _arrow_schema(dt: DeltaTable) -> pa.Schema:
    return pa.schema(dt.schema().to_arrow())


def _same_columns(found: pa.Schema, expected: pa.Schema) -> bool:
    """Same column names and types (any order, nullability ignored: Spark writes all columns nullable)."""
    return {f.name: f.type for f in found} == {f.name: f.type for f in expected}


def _schema_diff(found: pa.Schema, expected: pa.Schema) -> str:
    have, want = {f.name: f.type for f in found}, {f.name: f.type for f in expected}
    parts = [f"missing {sorted(set(want) - set(have))}" if set(want) - set(have) else "",
             f"unexpected {sorted(set(have) - set(want))}" if set(have) - set(want) else "",
             ", ".join(f"{n}: {have[n]} (expected {want[n]})" for n in want if n in have and have[n] != want[n])]
    return "; ".join(p for p in parts if p)


def _parquet_stats(meta: pq.FileMetaData) -> dict:
    """Delta file statistics from Parquet footers: row count, null counts, min/max of int and string columns."""
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
            stats["minValues"][name] = min(s.min for s in chunks)
            stats["maxValues"][name] = max(s.max for s in chunks)
    return stats
