"""A source's tables: opening them (refusing one another Delta writer changed beyond reclock's protocol), creating
them, light reads without a JVM (versions, app transactions, remap), Spark reads, and the tick's and a backfill's
commits to remap and reclocked.  :class:`reclock.storage.SourceTables` adds staging, landing, the upstream record
and compaction to these.
"""
from __future__ import annotations

import json
import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from deltalake.fs import DeltaStorageHandler

from .. import offsets
from ..engine import Frontier, Remap
from ..spark.session import spark_schema
from . import commits, rewrites
from .commits import REMAP_APP, RECLOCKED_APP, SINCE_APP, app_version
from .files import add_action, footer, parquet_files, parquet_stats, read_rows
from .frames import spark_frame
from .layout import (KINDS, ConcurrentWriteError, Kind, WarehouseError, arrow_schema, dead_letter_schema,
                     reclocked_schema, remap_schema, same_columns, schema_diff, spark_uri)
from .side_files import read_json
from .table_protocol import Protocol, protocol_problems

#: OPTIMIZE merges only files below this size (Delta's default, 1 GiB, would rewrite the files a compaction's
#: rewrite wrote, of about :data:`reclock.storage.rewrites.REWRITTEN_FILE_BYTES`, once more).
OPTIMIZE_MIN_FILE_BYTES = 64 << 20
#: A table's files below ``OPTIMIZE_MIN_FILE_BYTES`` (a tick or a publish adds one) are merged by Delta OPTIMIZE
#: once there are more than this many (Delta's own auto compaction waits for 50): reads stay cheap, and a
#: compaction or tick with a few small files pays no OPTIMIZE (seconds of Spark jobs even with nothing to merge).
SMALL_FILES_MAX = 32
#: remap's table property of the retired partitions (:mod:`reclock.engine.upstream`, "Retirement"), ``[[p, offset]]``:
#: part of the upstream record (:class:`reclock.storage.UpstreamRecord`), read with every remap.
RETIRED_PROPERTY = "reclock.retired"


def retired_of(dt: DeltaTable | None) -> Frontier:
    """The retired partitions recorded in remap's snapshot ``dt`` (none before any retirement)."""
    conf = {} if dt is None else dt.metadata().configuration
    return Frontier.of([tuple(pair) for pair in json.loads(conf.get(RETIRED_PROPERTY, "[]"))])


class Tables:
    """The Delta tables of one source at ``uri`` (``<uri>/<kind>``).

    Writes with Spark need the session given as ``spark``: a session, or a function returning one, called
    the first time a write needs it (so that a step whose writes are all delta-rs commits starts no Spark);
    the light reads (versions, remap) need none.
    """

    def __init__(self, uri: str, partition_type: pa.DataType, data_schema: pa.Schema,
                 storage_options: dict | None = None, *, offset_type: pa.DataType = offsets.INT64, spark=None):
        """``offset_type``: how offsets and increments are stored (:func:`reclock.offsets.offset_type_of`)."""
        self.uri = uri
        self.storage_options = storage_options
        self.data_columns = list(data_schema.names)
        self.offset_type = offsets.check_type(offset_type)
        self.schemas: dict[Kind, pa.Schema] = {
            "remap": remap_schema(partition_type, self.offset_type),
            "reclocked": reclocked_schema(partition_type, data_schema, self.offset_type)}
        self.schemas["landing"] = self.schemas["reclocked"]  # into_time is 0 there, stamped when read
        self.schemas["dead_letter"] = dead_letter_schema(partition_type, self.offset_type)
        self._spark = spark

    @property
    def spark(self):
        if self._spark is None:
            raise WarehouseError(f"{self.uri}: writing Delta tables needs a Spark session (none was opened)")
        if callable(self._spark):
            self._spark = self._spark()
        return self._spark

    # --- opening and creating -------------------------------------------------------------------------------

    def table_uri(self, kind: Kind) -> str:
        return f"{self.uri}/{kind}"

    def spark_uri(self, kind: Kind) -> str:
        """The table's location as Spark spells it (``s3a://`` for S3)."""
        return spark_uri(self.table_uri(kind))

    def _name(self, kind: Kind) -> str:
        return f"{self.uri.rsplit('/', 1)[-1]}_{kind}"

    def table(self, kind: Kind, version: int | None = None) -> DeltaTable:
        """A fresh deltalake :class:`DeltaTable` at its latest (or the given) version (light reads).

        At its latest version, a table another Delta writer changed beyond what reclock reads and writes (a table
        feature, a check constraint: :func:`reclock.storage.table_protocol.protocol_problems`) is refused here,
        before the step opening it writes anything: :class:`WarehouseError` naming the table and what it needs."""
        dt = DeltaTable(self.table_uri(kind), version=version, storage_options=self.storage_options)
        if version is None and (problems := protocol_problems(Protocol(*dt.protocol()),
                                                              dt.metadata().configuration)):
            raise WarehouseError(
                f"{self.table_uri(kind)} (table {self._name(kind)}): another Delta writer gave it "
                f"{', '.join(problems)}, which reclock cannot read or write; nothing written. Undo it (DROP CONSTRAINT, "
                "UNSET TBLPROPERTIES, DROP FEATURE) to go on (docs: storage.md, Other Delta users)")
        return dt

    def _table_or_none(self, kind: Kind) -> DeltaTable | None:
        try:
            return self.table(kind)
        except TableNotFoundError:
            return None

    def spark_schema(self, kind: Kind):
        return spark_schema(self.schemas[kind])

    def create_if_absent(self) -> None:
        """Create both tables if missing (delta-rs: :func:`~reclock.storage.commits.create_table`);
        :class:`WarehouseError` if one exists with another schema."""
        for kind in KINDS:
            self._create_table_if_absent(kind)
        self.check_schemas()

    def _create_table_if_absent(self, kind: Kind) -> None:
        """Create table ``kind`` (named ``<source>_<kind>``) unless it exists."""
        if self._table_or_none(kind) is None:
            commits.create_table(self.table_uri(kind), self.schemas[kind], self._name(kind), self.storage_options)

    def check_schemas(self) -> None:
        """:class:`WarehouseError` if a table exists with another schema than this source's."""
        for kind in KINDS:
            dt = self._table_or_none(kind)
            if dt is None:
                continue
            found = arrow_schema(dt)
            if not same_columns(found, self.schemas[kind]):
                raise WarehouseError(f"{self.table_uri(kind)} exists with another schema: "
                                     f"{schema_diff(found, self.schemas[kind])}")

    # --- reading --------------------------------------------------------------------------------------------

    def _fs(self) -> pafs.FileSystem:
        """The source's storage as a pyarrow filesystem, paths relative to the source root."""
        return pafs.PyFileSystem(DeltaStorageHandler(self.uri, self.storage_options))

    def _spark_path(self, relative: str) -> str:
        return f"{spark_uri(self.uri)}/{relative}"

    def _frame(self, kind: Kind, rows: pa.Table):
        """A Spark DataFrame of Arrow ``rows`` with the table's schema."""
        return spark_frame(self.spark, rows, self.schemas[kind])

    def _read(self, kind: Kind, version: int | None = None, filter: pc.Expression | None = None) -> pa.Table:
        dt = self._table_or_none(kind) if version is None else self.table(kind, version)
        if dt is None:
            return self.schemas[kind].empty_table()
        return read_rows(dt, self.schemas[kind], filter)

    def _read_json(self, name: str):
        """The side file ``<source>/<name>``, or None when there is none (ValueError when it is not JSON)."""
        return read_json(self.uri, name, self.storage_options)

    def _app_version(self, kind: Kind, app_id: str, default: int) -> int:
        dt = self._table_or_none(kind)
        return default if dt is None else app_version(dt, app_id, default)

    def read_spark(self, kind: Kind, version: int | None = None, spark=None):
        """The table (at its latest, or the given version: Delta time travel) as a Spark DataFrame, read with
        ``spark`` (default: the tables' session)."""
        reader = (spark or self.spark).read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(self.spark_uri(kind)).select(*self.schemas[kind].names)

    def version(self, kind: Kind) -> int:
        """The table's latest Delta version (-1 when it does not exist yet)."""
        dt = self._table_or_none(kind)
        return -1 if dt is None else dt.version()

    def snapshot_files(self, kind: Kind, version: int | None = None) -> list[str]:
        """URIs of the Parquet files of a snapshot (latest or ``version``), spelled for ``spark.read.parquet``."""
        return [spark_uri(f) for f in self.table(kind, version).file_uris()]

    # --- remap ----------------------------------------------------------------------------------------------

    def since(self) -> int:
        """The compaction frontier (0 initially): IntoTimes before it are no longer readable."""
        return self._app_version("remap", SINCE_APP, 0)

    def remap_upper(self) -> int:
        """The stored remap upper: first IntoTime not yet bound."""
        return self._app_version("remap", REMAP_APP, -1) + 1

    def read_remap(self) -> Remap:
        """The stored remap, with ``since`` and ``upper`` from the app transactions of one snapshot, without the
        rows of retired partitions (a compaction killed between recording them and dropping their rows left
        them)."""
        dt = self._table_or_none("remap")
        if dt is None:
            return Remap.from_increments([], 0, 0)
        since, upper = app_version(dt, SINCE_APP, 0), app_version(dt, REMAP_APP, -1) + 1
        rows = read_rows(dt, self.schemas["remap"])  # the same snapshot as since and upper
        increments = offsets.from_arrow(rows["increment"])  # Python ints, however they are stored
        retired = retired_of(dt)
        remap = Remap.from_increments(((p, t, i) for p, t, i in zip(rows["partition"].to_pylist(),
                                                                    rows["into_time"].to_pylist(), increments)
                                       if not retired[p]), 0, upper)
        return remap.compact(since)  # rows may predate a crashed compaction (since recorded first)

    def remap_frame(self):
        """The stored remap rows as a pandas DataFrame (for checks)."""
        return self._read("remap").to_pandas()

    def _remap_rows(self, rows) -> pa.Table:
        try:
            return pa.Table.from_pylist([r._replace(increment=offsets.to_storage(r.increment, self.offset_type))
                                         ._asdict() for r in rows], schema=self.schemas["remap"])
        except offsets.OffsetError as e:
            raise WarehouseError(f"cannot store the remap of {self.uri}: {e}") from e

    def append_binding(self, remap_before: Remap, remap_after: Remap, upstream: Frontier | None = None) -> bool:
        """Store the ticks minting ``remap_after`` from ``remap_before`` in one commit; False if already stored.

        ``upstream``, the upstream's upper the tick saw, is recorded with the commit (its ``userMetadata``)
        for the remap check (:meth:`recorded_upstreams`).

        The tick's rows (one per partition that moved) are written as one Parquet file into the table's
        directory and added in one delta-rs commit with the app transaction (:meth:`_commit_rows`, no Spark job);
        a tick binding no new offsets (an idle source) commits the app transaction and metadata alone.  Another
        tick stored after ``remap_before`` was read: :class:`ConcurrentWriteError` and nothing written, whether it
        committed before this one read the table (its stored version says so) or while this one prepared its
        commit (it carries ``reclock.remap`` too: Delta's conflict check refuses this one), so racing ticks (a
        schedule and a manual run, two workers) never count an increment twice.  A missing table is created first
        (:func:`~reclock.storage.commits.create_table`, delta-rs too).
        """
        version = remap_after.upper - 1
        if (dt := self._table_or_none("remap")) is None:
            self._create_table_if_absent("remap")
            dt = self.table("remap")
        stored = app_version(dt, REMAP_APP, -1)
        if stored >= version:
            return False
        if remap_after.upper <= remap_before.upper:
            raise WarehouseError(f"remap_after (upper {remap_after.upper}) is not beyond remap_before "
                                 f"(upper {remap_before.upper})")
        if stored + 1 != remap_before.upper:
            raise ConcurrentWriteError(f"remap_before has upper {remap_before.upper} but the stored remap of "
                                       f"{self.uri} has upper {stored + 1}: another tick committed; nothing written")
        rows = self._remap_rows(r for r in remap_after.increments() if r.into_time >= remap_before.upper)
        metadata = None if upstream is None else {"into_time": version, "upstream": [list(u) for u in upstream]}
        self._commit_rows(dt, "remap", rows, REMAP_APP, version, metadata)
        if self._has_many_small_files("remap"):  # a file per tick: keep reads cheap
            try:
                self._optimize("remap")
            except ConcurrentWriteError:  # the binding is stored; a racing compaction's rewrite: OPTIMIZE later
                pass
        return True

    def _commit_rows(self, dt: DeltaTable, kind: Kind, rows: pa.Table, app_id: str, version: int,
                     metadata: dict | None = None) -> None:
        """Append ``rows`` (few; none: the app transaction alone) to table ``kind``, read as ``dt``, in one delta-rs
        commit (:func:`~reclock.storage.commits.commit_added`): written first as one Parquet file in the table's
        directory, which no reader sees until the commit adds it (a crash in between leaves it to VACUUM)."""
        def write() -> list:
            if not rows.num_rows:
                return []
            fs, path = self._fs(), f"{kind}/part-00000-{uuid.uuid4()}-c000.snappy.parquet"
            with fs.open_output_stream(path) as out:
                pq.write_table(rows.cast(self.schemas[kind]), out, compression="snappy")
            return [add_action(fs.get_file_info(path), parquet_stats(footer(fs, path)), kind)]

        commits.commit_added(dt, write, app_id, version, metadata)

    def _has_many_small_files(self, kind: Kind) -> bool:
        """More than ``SMALL_FILES_MAX`` files below ``OPTIMIZE_MIN_FILE_BYTES`` in the table (from its Delta
        log): time to merge them (Delta OPTIMIZE)."""
        sizes = pa.table(self.table(kind).get_add_actions(flatten=True))["size_bytes"]
        return (pc.sum(pc.less(sizes, OPTIMIZE_MIN_FILE_BYTES)).as_py() or 0) > SMALL_FILES_MAX

    def _optimize(self, kind: Kind) -> None:
        """Merge files below ``OPTIMIZE_MIN_FILE_BYTES`` (delta-rs OPTIMIZE, no JVM)."""
        commits.optimize(self.table(kind), OPTIMIZE_MIN_FILE_BYTES)

    def _commit_files(self, dt: DeltaTable, kind: Kind, directory: str, app_id: str, version: int,
                      metadata: dict | None = None) -> None:
        """Add the Parquet files Spark wrote in ``directory`` (relative to the source, inside table ``kind``'s
        directory, not in its log) to table ``kind``, read as ``dt``, as they are, in one delta-rs commit with the
        app transaction (:func:`~reclock.storage.commits.commit_added`: refused when a commit carrying it landed
        since ``dt``); files without rows are left to VACUUM."""
        fs = self._fs()
        added = [add_action(info, stats, kind) for info in parquet_files(fs, directory)
                 if (stats := parquet_stats(footer(fs, info.path)))["numRecords"]]
        commits.commit_added(dt, added, app_id, version, metadata)

    # --- reclocked and dead letters -------------------------------------------------------------------------

    def reclocked_upper(self) -> int:
        """IntoTime upper of the published reclocked table: last published IntoTime + 1, 0 if none."""
        return self._app_version("reclocked", RECLOCKED_APP, -1) + 1

    def read_reclocked_spark(self, spark=None, version: int | None = None):
        """The reclocked table (latest, or at Delta ``version``) as a Spark DataFrame (``spark``: the session
        to read with, for tables opened without one, e.g. by a query that must not create tables)."""
        return self.read_spark("reclocked", version, spark)

    def read_reclocked_arrow(self, version: int | None = None) -> pa.Table:
        """The reclocked snapshot through deltalake (small tables, tests)."""
        return self._read("reclocked", version)

    def replace_reclocked(self, df, low: int | None, high: int) -> int:
        """Replace the reclocked rows with ``low <= into_time <= high`` (no lower bound when ``low`` is None) by a
        Spark DataFrame's rows (each must lie there too: the job fails otherwise), in one delta-rs commit
        (:meth:`_rewrite`) without an app transaction, so ``reclocked_upper`` stays what it was; the number of rows
        written.  A racing commit it cannot go on over: :class:`ConcurrentWriteError`, nothing replaced."""
        uri, where = self.table_uri("reclocked"), rewrites.bounds("into_time", low, high)
        rows = rewrites.checked(df.select(*self.schemas["reclocked"].names), "into_time", low, high, uri)
        self._rewrite("reclocked", low, high, lambda _: rows, "backfill-repair",
                      f"{uri}: another writer committed while a backfill replaced {where}; nothing replaced",
                      {"operation": "reclock backfill repair", "into_time": [low, high]})
        return rows.count()

    def _rewrite(self, kind: Kind, low: int | None, high: int, replace, point: str, raced: str,
                 metadata: dict) -> bool:
        """Replace the rows of table ``kind`` with ``low <= into_time <= high`` by ``replace(rows)`` in one
        delta-rs commit (:func:`reclock.storage.rewrites.rewrite`, which states the law); False when ``replace``
        returned None (nothing to rewrite).  A racing commit it cannot go on over: :class:`ConcurrentWriteError`
        saying ``raced``, nothing rewritten."""
        return rewrites.rewrite(self.spark, self.table(kind), self._fs(), kind, spark_uri(self.uri),
                                self.spark_schema(kind), "into_time", low, high, replace, point, raced, metadata)

    def dead_letter_count(self) -> int | None:
        """Records in the dead-letter table (from the Delta log's file statistics); None when it does not exist."""
        dt = self._table_or_none("dead_letter")
        if dt is None:
            return None
        return int(pc.sum(pa.table(dt.get_add_actions(flatten=True))["num_records"]).as_py() or 0)

    def read_dead_letters_spark(self, spark=None):
        """The dead-letter table as a Spark DataFrame (read with ``spark``, default the tables' session)."""
        return self.read_spark("dead_letter", spark=spark)

    def recorded_upstreams(self) -> dict[int, Frontier]:
        """``{into_time: the upstream's upper}`` recorded by the ticks still in the remap table's Delta log."""
        dt = self._table_or_none("remap")
        out = {}
        for commit in [] if dt is None else dt.history():
            try:
                metadata = json.loads(commit.get("userMetadata") or "{}")
                out[int(metadata["into_time"])] = Frontier.of([tuple(u) for u in metadata["upstream"]])
            except (ValueError, KeyError, TypeError):
                continue  # not a tick's commit (compaction, OPTIMIZE, a tick from before upstreams were recorded)
        return out
