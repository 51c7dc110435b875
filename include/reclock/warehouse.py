"""Delta Lake storage of each source: ``<root>/<name>/remap`` and ``<root>/<name>/reclocked``.

Spark writes the Delta tables' data, with delta-spark (the session of :mod:`reclock.spark_session`), through the
DataFrame API and Delta's SQL (OPTIMIZE, VACUUM): not delta-spark's Python ``DeltaTable``, which needs Delta's own
plugin on a Spark Connect server.  These commits are delta-rs's, no JVM: a table's creation (:func:`create_table`:
version 0 claimed with put-if-absent, never retried, so racing creators make one table), the upstream record in
remap's properties (:meth:`SourceTables.record_upstream`), a publish adding the files Spark staged to the reclocked
table (below, :func:`_commit_added`), and a tick adding its remap rows (a few, written with pyarrow:
:meth:`SourceTables._commit_rows`; an idle tick, no new offsets, commits its upper alone).  A table another Delta
writer changed beyond what reclock reads and writes is refused when it is opened (:mod:`reclock.table_protocol`).
Progress lives in Delta *app transactions* (``txnAppId``/``txnVersion``, Delta's idempotent
writes), so it commits atomically with the rows it describes and survives overwrites:

* remap table, app ``reclock.remap``: version = remap upper - 1 (the last tick);
* remap table, app ``reclock.since``: version = compaction frontier ``since``;
* reclocked table, app ``reclock.reclocked``: version = last published IntoTime.

A write whose ``txnVersion`` is not above the stored one is skipped by Delta (a delta-rs commit,
:func:`_commit_added`, is made only after reading the stored version, and refused if a racing commit set it
since), so a step rerun after a crash commits nothing twice.  A delta-rs commit is refused when another one
carrying its app transaction landed since it read the table (:func:`_commit_added`), and Spark's appends that
must not follow a racing writer's rows are compare-and-appends (:func:`compare_and_append`): racing writers never
count rows twice.  The remap
table's properties record the upstream (:class:`UpstreamRecord`): ``reclock.start``, ``reclock.identity``,
``reclock.gaps``, ``reclock.epochs``.
A backfill repair (:meth:`SourceTables.replace_reclocked`) rewrites a window of published IntoTimes
in one ``replaceWhere`` overwrite without an app transaction, so the versions stay as they were.

Reads that need no JVM use ``deltalake`` (delta-rs) as a light reader: the app-transaction
versions (``since``, the uppers) and the remap table (small: one row per partition and tick,
one per partition after compaction), for the steps and pages that must not start Spark
(status, the progress page, the checks of remap). Everything else reads through Spark, AS OF
reads at a pinned table version with Delta time travel (``versionAsOf``).

Spark stages a batch of reclocked rows as Parquet under ``<source>/reclocked/staged/upto=<t>/<attempt>/``
(a fresh attempt directory per :meth:`SourceTables.stage`, ``_SUCCESS`` marks a complete one): inside the
reclocked table's directory, but not in its Delta log, so no reader sees them.  Once checked,
:meth:`SourceTables.publish_staged` adds the latest complete attempt's files to the table as they are, in one
idempotent commit (delta-rs: Delta ``add`` actions with statistics from the files' footers, and the app
transaction), and removes the rest of the attempt: the batch is written once, by Spark.  Attempts never
published are removed by the publish; after a crash in between, VACUUM removes their data files (not in the
log).  What the checks need to know of a batch from the upstream (a Postgres source's primary keys) is
written first, as the attempt's ``_batch.json`` (:meth:`SourceTables.staged_metadata`), so ``_SUCCESS``
covers it too.

``<root>/<name>/landing`` holds records a source could not serve again later, landed once in the
warehouse (a Postgres source's initial snapshot, read under a snapshot that dies with its
connection): :meth:`SourceTables.land` appends them in one commit whose ``userMetadata`` records
the landed partitions' uppers, and from then on staging and backfills read those partitions' offset
ranges from here (:meth:`SourceTables.read_landed`), not upstream.

``<root>/<name>/dead_letter`` (Delta table ``<name>_dead_letter``, :func:`dead_letter_schema`) holds the
records of a source with ``on_bad_record: dead_letter`` that could not be decoded: their coordinates, raw
bytes and error.  They are bound like every record but staged apart, under ``<attempt>/_dead_letter/``
(written before the attempt's records, so ``_SUCCESS`` covers both; Spark's readers skip ``_`` names), and
published by the same :meth:`SourceTables.publish_staged`, just before the records, with app
``reclock.dead_letter`` = the batch's last IntoTime; only rows with a later IntoTime than the app's
version are appended, so a rerun (or a batch staged again over a longer window) adds none twice.
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
import uuid
from contextlib import contextmanager
from typing import Literal, NamedTuple
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from deltalake.fs import DeltaStorageHandler

from . import offsets
from .engine import Frontier, Increment, Remap
from .clock import now_ms
from . import points
from .side_files import read_json, write_json
from .table_protocol import Protocol, protocol_problems
from .spark_session import spark_schema

log = logging.getLogger("reclock")

Kind = Literal["remap", "reclocked", "landing", "dead_letter"]
KINDS: tuple[Kind, ...] = ("remap", "reclocked")  # created with the source; "landing" when first landed
REMAP_APP, SINCE_APP, RECLOCKED_APP = "reclock.remap", "reclock.since", "reclock.reclocked"
LANDING_APP = "reclock.landing"  # version = number of landings
DEAD_LETTER_APP = "reclock.dead_letter"  # version = the last published IntoTime whose dead letters are in
STAGED_DEAD_LETTERS = "_dead_letter"  # under a staged attempt: the batch's dead letters
UPSTREAM_SAMPLE = "upstream_sample.json"  # the last upstream upper the tick measured (SourceTables.upstream_sample)
STAGED_METADATA = "_batch.json"  # under a staged attempt: what the checks need of the batch (SourceTables.stage)
VACUUMED = "vacuumed.json"  # when compaction last vacuumed each table (SourceTables.vacuumed; vacuum_due)
START_PROPERTY, IDENTITY_PROPERTY, GAPS_PROPERTY = "reclock.start", "reclock.identity", "reclock.gaps"
EPOCHS_PROPERTY = "reclock.epochs"
STAGED = "staged"
SUCCESS = "_SUCCESS"
STATS_STRING_CHARS = 32  # string min/max kept in the statistics of published files (as delta-spark's prefix)


class UpstreamRecord(NamedTuple):
    """Recorded with remap (table properties) at a source's first tick: where its history begins, the
    upstream's identity (:mod:`reclock.engine.upstream`), the gaps a user accepted (records lost upstream),
    and the epochs begun on replaced upstreams (``reclock new-epoch``), each a dict with ``began_at`` (its
    first IntoTime), ``base`` (its offset base, ``[[partition, offset]]``), its ``identity`` and ``start``,
    what it ``replaced`` (the previous identity and start) and when it was ``recorded_at``.
    ``start`` and ``identity`` are the current epoch's."""

    start: Frontier
    identity: dict | None
    gaps: list = []
    epochs: list = []

    @property
    def base(self) -> Frontier:
        """The current epoch's offset base (empty before any new epoch): gauge offset = base + upstream offset."""
        return Frontier.of([tuple(pair) for pair in self.epochs[-1]["base"]]) if self.epochs else Frontier()

    @property
    def began_at(self) -> int:
        """The current epoch's first IntoTime (0 before any new epoch)."""
        return self.epochs[-1]["began_at"] if self.epochs else 0


class WarehouseError(RuntimeError):
    """Stored state or staged files that reclock cannot accept; nothing was committed."""


#: How long VACUUM keeps the files a compaction replaced unless told otherwise (Delta's own default, 7 days).
VACUUM_RETENTION_HOURS = 168.0
#: Compaction rewrites the rows at or before ``since`` into files of about this size, and its OPTIMIZE merges
#: only files below ``OPTIMIZE_MIN_FILE_BYTES`` (Delta's default, 1 GiB, would rewrite those files once more).
COMPACTED_FILE_BYTES = 128 << 20
OPTIMIZE_MIN_FILE_BYTES = 64 << 20
#: A table's files below ``OPTIMIZE_MIN_FILE_BYTES`` (a tick or a publish adds one) are merged by Delta OPTIMIZE
#: once there are more than this many (Delta's own auto compaction waits for 50): reads stay cheap, and a
#: compaction or tick with a few small files pays no OPTIMIZE (seconds of Spark jobs even with nothing to merge).
SMALL_FILES_MAX = 32


def vacuum_due(last: int | None, now: int, retention_hours: float) -> bool:
    """Whether compaction vacuums a table now: ``last is None or not 0 <= now - last < ceil(R) h / 4``.

    VACUUM RETAIN ``ceil(R)`` hours (Delta rounds to whole hours) deletes a file ``ceil(R)`` h after it was
    replaced; one run lists the table and reads its state (seconds even when nothing is old enough), and
    logs two commits.  Vacuuming at most every quarter of that retention (the rule by which compaction itself
    runs) deletes each replaced file at most ``ceil(R) / 4`` h (plus the time to the next compaction) later,
    never earlier.  ``R = 0`` (a forced vacuum) is always due; so is a table never vacuumed, or a clock that
    stepped back.
    """
    if last is None:
        return True
    return not 0 <= now - last < math.ceil(retention_hours) * 3_600_000 // 4


def remap_schema(partition_type: pa.DataType, offset_type: pa.DataType = offsets.INT64) -> pa.Schema:
    """``increment`` is stored like the source's offsets (:mod:`reclock.offsets`): int64 or big."""
    return pa.schema([("partition", partition_type), ("into_time", pa.int64()), ("increment", offset_type)])


def reclocked_schema(partition_type: pa.DataType, data_schema: pa.Schema,
                     offset_type: pa.DataType = offsets.INT64) -> pa.Schema:
    return pa.schema(list(data_schema) + [
        pa.field("partition", partition_type), pa.field("offset", offset_type),
        pa.field("into_time", pa.int64()), pa.field("diff", pa.int64())])


def dead_letter_schema(partition_type: pa.DataType, offset_type: pa.DataType = offsets.INT64) -> pa.Schema:
    """A record that could not be decoded: its source (name), coordinates, raw key and value bytes, and why."""
    return pa.schema([pa.field("source", pa.string()), pa.field("partition", partition_type),
                      pa.field("offset", offset_type), pa.field("into_time", pa.int64()),
                      pa.field("key", pa.binary()), pa.field("value", pa.binary()), pa.field("error", pa.string())])


def create_table(uri: str, schema: pa.Schema, name: str, storage_options: dict | None = None) -> None:
    """Create the Delta table ``uri`` (named ``name``) with ``schema`` unless it exists: one delta-rs commit of
    version 0, with the basic protocol (reader 1, writer 2), no JVM.

    The version is claimed as every delta-rs commit claims one (put-if-absent: a rename that does not replace on
    a local disk, a conditional write on S3) and never retried at another version, so of creators racing (first
    steps of a source in several processes or machines) exactly one commits; the others find its table (callers
    check the schema it was created with).  A creation killed before its commit leaves at most a temporary file
    in ``_delta_log``, which the next creation ignores.
    """
    from deltalake import CommitProperties
    from deltalake.exceptions import CommitFailedError

    try:
        DeltaTable.create(uri, schema, mode="ignore", name=name, description=name, storage_options=storage_options,
                          commit_properties=CommitProperties(max_commit_retries=0))
    except CommitFailedError:
        if not DeltaTable.is_deltatable(uri, storage_options):
            raise


def is_delta_table(spark, uri: str) -> bool:
    """Whether Spark reads a Delta table at ``uri``."""
    try:
        spark.read.format("delta").load(_spark_uri(uri)).schema
        return True
    except Exception:
        return False


def _delta_path(uri: str) -> str:
    """The SQL name of the Delta table at ``uri``: ``delta.`<uri as Spark spells it>```."""
    return f"delta.{_identifier(_spark_uri(uri))}"


def _identifier(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def spark_frame(spark, rows: pa.Table, schema: pa.Schema):
    """A Spark DataFrame of Arrow ``rows`` with ``schema`` (small tables: remap, TEMP)."""
    if rows.num_rows == 0:
        return spark.createDataFrame([], spark_schema(schema))
    # From Arrow directly: a pandas round trip would turn a nullable int64 column into floats.
    return spark.createDataFrame(rows.select(schema.names).cast(schema), spark_schema(schema))


class ConcurrentWriteError(WarehouseError):
    """Another writer committed to the table since this step read it; this step committed nothing."""


_MOVED = "reclock: the table moved since it was read"
_CONCURRENT = ("ConcurrentTransaction", "ConcurrentAppend", "ConcurrentDeleteRead", "ConcurrentDeleteDelete",
               "ConcurrentWrite", "MetadataChanged", "ProtocolChanged")  # Delta's conflicts: <kind>Exception


def append(df, uri: str, columns: list[str], app_id: str, version: int, metadata: dict | None = None) -> None:
    """Append Spark DataFrame ``df`` (possibly empty) to the Delta table at ``uri`` in one commit carrying
    the app transaction ``app_id`` = ``version`` (and ``metadata`` as the commit's ``userMetadata``);
    Delta skips it when the stored version is already ``>= version``."""
    writer = (df.select(*columns).write.format("delta").mode("append")
              .option("txnAppId", app_id).option("txnVersion", str(version)))
    if metadata is not None:
        writer = writer.option("userMetadata", json.dumps(metadata, sort_keys=True))
    _save(writer, uri, app_id, version)


def compare_and_append(df, uri: str, columns: list[str], app_id: str, version: int,
                       read_max_into_time: int | None, metadata: dict | None = None) -> None:
    """:func:`append`, only if no writer added rows since the caller read the table.

    ``read_max_into_time`` is the table's ``max(into_time)`` in the snapshot the caller read (None: no rows).
    Two parts make it hold at the storage level, whoever else writes:

    * the check runs inside the write's Delta transaction (the appended frame computes it from the table's
      latest snapshot when the job runs, after the transaction began), and fails the job when a commit
      with rows landed before;
    * the transaction reads ``app_id``'s version, so Delta refuses the commit when another commit carrying
      ``app_id`` lands while the job runs (``ConcurrentTransactionException``).

    Either way :class:`ConcurrentWriteError` is raised and nothing is committed.  A commit without rows
    (an idle tick) may land in between: it added nothing, so appending after it counts nothing twice.

    The check's ``max(into_time)`` scans the table's (small) files: Delta's metadata-only answer from the files'
    statistics reconstructs the table's state twice more, six Spark jobs against three (ten per such commit
    against seven, counted with Spark's status tracker), for the same value.
    """
    with _conf(df.sparkSession, "spark.databricks.delta.optimizeMetadataQuery.enabled", "false"):
        append(_guarded(df, uri, read_max_into_time), uri, columns, app_id, version, metadata)


def _save(writer, uri: str, app_id: str, version: int) -> None:
    with _conflicts_as(f"{uri}: another writer committed since this step read the table (committing "
                       f"{app_id} = {version}); nothing written"), points.commit(_COMMITS.get(app_id, app_id), uri):
        writer.save(_spark_uri(uri))


_COMMITS = {REMAP_APP: "tick", RECLOCKED_APP: "publish", SINCE_APP: "compact"}  # their names in reclock.points
#: A compaction rewrite that a racing commit (a tick's rows, another compaction) made Delta refuse.
_REWRITE_RACED = ("{uri}: another writer committed while compaction rewrote the rows up to since; nothing rewritten "
                  "(the next compaction does it)")


@contextmanager
def _conflicts_as(message: str):
    """Raise :class:`ConcurrentWriteError` with ``message`` for a Delta conflict inside the block."""
    try:
        yield
    except Exception as e:
        if _concurrent(e):
            raise ConcurrentWriteError(message) from None
        raise


def _concurrent(error: Exception) -> bool:
    """Whether a Spark/Delta error says another writer committed first (nothing was committed here).

    PySpark raises Delta's conflicts as ``delta.exceptions`` classes whose message lacks the class name,
    or as a Py4J error whose message has the Java class name: both are looked at."""
    text = f"{type(error).__name__}: {error}"
    return _MOVED in text or any(f"{kind}Exception" in text for kind in _CONCURRENT)


def _guarded(df, uri: str, read_max_into_time: int | None):
    """``df``, failing when its job runs if the table's ``max(into_time)`` is no longer ``read_max_into_time``."""
    from pyspark.sql import functions as F

    now = df.sparkSession.read.format("delta").load(_spark_uri(uri)).agg(F.max("into_time").alias("m"))
    same = F.col("m").eqNullSafe(F.lit(read_max_into_time).cast("long"))
    ok = now.select(F.when(same, F.lit(True)).otherwise(F.raise_error(F.lit(_MOVED))).alias("_unchanged"))
    return df.crossJoin(ok).where("_unchanged").drop("_unchanged")


class Warehouse:
    """A root URI (local path, or e.g. ``s3://bucket/prefix`` with deltalake ``storage_options``)."""

    def __init__(self, root: str, storage_options: dict | None = None):
        self.root = root.rstrip("/") if "://" in root else os.path.abspath(root)
        self.storage_options = storage_options

    def source_uri(self, name: str) -> str:
        """Where source ``name``'s tables (and its last check record) live."""
        return f"{self.root}/{name}"

    def spark_uri(self, name: str) -> str:
        """``name``'s place in the warehouse as Spark spells it (``s3a://`` for S3)."""
        return _spark_uri(self.source_uri(name))

    def source(self, name: str, partition_type: pa.DataType, data_schema: pa.Schema,
               offset_type: pa.DataType = offsets.INT64, spark=None, create: bool | None = None) -> "SourceTables":
        """The tables of source ``name`` (``spark``: see :class:`SourceTables`); ``create`` (default: whether a
        ``spark`` is given): created when missing, with Spark; the schemas of those that exist are checked."""
        tables = SourceTables(self.source_uri(name), partition_type, data_schema, self.storage_options,
                              offset_type=offset_type, spark=spark)
        if create if create is not None else spark is not None:
            tables.create_if_absent()
        else:
            tables.check_schemas()
        return tables


class SourceTables:
    """The remap and reclocked Delta tables of one source.

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

    # --- tables -------------------------------------------------------------------------

    def table_uri(self, kind: Kind) -> str:
        return f"{self.uri}/{kind}"

    def spark_uri(self, kind: Kind) -> str:
        """The table's location as Spark spells it (``s3a://`` for S3)."""
        return _spark_uri(self.table_uri(kind))

    def table(self, kind: Kind, version: int | None = None) -> DeltaTable:
        """A fresh deltalake :class:`DeltaTable` at its latest (or the given) version (light reads).

        At its latest version, a table another Delta writer changed beyond what reclock reads and writes (a table
        feature, a check constraint: :func:`reclock.table_protocol.protocol_problems`) is refused here, before
        the step opening it writes anything: :class:`WarehouseError` naming the table and what it needs."""
        dt = DeltaTable(self.table_uri(kind), version=version, storage_options=self.storage_options)
        if version is None and (problems := protocol_problems(Protocol(*dt.protocol()),
                                                              dt.metadata().configuration)):
            raise WarehouseError(
                f"{self.table_uri(kind)} (table {self.uri.rsplit('/', 1)[-1]}_{kind}): another Delta writer gave it "
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
        """Create both tables if missing (delta-rs: :func:`create_table`); :class:`WarehouseError` if one exists
        with another schema."""
        for kind in KINDS:
            self._create_table_if_absent(kind)
        self.check_schemas()

    def _create_table_if_absent(self, kind: Kind) -> None:
        """Create table ``kind`` (named ``<source>_<kind>``) unless it exists."""
        if self._table_or_none(kind) is None:
            create_table(self.table_uri(kind), self.schemas[kind], f"{self.uri.rsplit('/', 1)[-1]}_{kind}",
                         self.storage_options)

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

    def _fs(self) -> pafs.FileSystem:
        """The source's storage as a pyarrow filesystem, paths relative to the source root."""
        return pafs.PyFileSystem(DeltaStorageHandler(self.uri, self.storage_options))

    def _frame(self, kind: Kind, rows: pa.Table):
        """A Spark DataFrame of Arrow ``rows`` with the table's schema."""
        return spark_frame(self.spark, rows, self.schemas[kind])

    def _append(self, kind: Kind, df, app_id: str, version: int) -> None:
        """Append the rows of Spark DataFrame ``df`` (possibly none) in one commit carrying the app transaction.

        Delta skips the write when the stored version of ``app_id`` is already ``>= version``.
        """
        append(df, self.table_uri(kind), self.schemas[kind].names, app_id, version)

    def _read(self, kind: Kind, version: int | None = None, filter: pc.Expression | None = None) -> pa.Table:
        dt = self._table_or_none(kind) if version is None else self.table(kind, version)
        if dt is None:
            return self.schemas[kind].empty_table()
        return read_rows(dt, self.schemas[kind], filter)

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

    # --- remap --------------------------------------------------------------------------

    def since(self) -> int:
        """The compaction frontier (0 initially): IntoTimes before it are no longer readable."""
        return self._app_version("remap", SINCE_APP, 0)

    def remap_upper(self) -> int:
        """The stored remap upper: first IntoTime not yet bound."""
        return self._app_version("remap", REMAP_APP, -1) + 1

    def read_remap(self) -> Remap:
        """The stored remap, with ``since`` and ``upper`` from the app transactions of one snapshot."""
        dt = self._table_or_none("remap")
        if dt is None:
            return Remap.from_increments([], 0, 0)
        since, upper = app_version(dt, SINCE_APP, 0), app_version(dt, REMAP_APP, -1) + 1
        rows = read_rows(dt, self.schemas["remap"])  # the same snapshot as since and upper
        increments = offsets.from_arrow(rows["increment"])  # Python ints, however they are stored
        remap = Remap.from_increments(zip(rows["partition"].to_pylist(), rows["into_time"].to_pylist(), increments),
                                      0, upper)
        return remap.compact(since)  # rows may predate a crashed compaction (since recorded first)

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
        (:func:`create_table`, delta-rs too).
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
            except Exception as e:  # the binding is stored; a racing tick's commit makes OPTIMIZE retry later
                if not _concurrent(e):
                    raise
        return True

    def _commit_rows(self, dt: DeltaTable, kind: Kind, rows: pa.Table, app_id: str, version: int,
                     metadata: dict | None = None) -> None:
        """Append ``rows`` (few; none: the app transaction alone) to table ``kind``, read as ``dt``, in one delta-rs
        commit (:func:`_commit_added`): written first as one Parquet file in the table's directory, which no reader
        sees until the commit adds it (a crash in between leaves it to VACUUM)."""
        def write() -> list:
            if not rows.num_rows:
                return []
            fs, path = self._fs(), f"{kind}/part-00000-{uuid.uuid4()}-c000.snappy.parquet"
            with fs.open_output_stream(path) as out:
                pq.write_table(rows.cast(self.schemas[kind]), out, compression="snappy")
            return [_add_action(fs.get_file_info(path), _parquet_stats(_footer(fs, path)), kind)]

        _commit_added(dt, write, app_id, version, metadata)

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

    def upstream_record(self) -> UpstreamRecord | None:
        """What the remap table's properties record of the upstream since the first tick (None: not yet)."""
        dt = self._table_or_none("remap")
        conf = {} if dt is None else dt.metadata().configuration
        if START_PROPERTY not in conf:
            return None
        return UpstreamRecord(Frontier.of([tuple(pair) for pair in json.loads(conf[START_PROPERTY])]),
                              json.loads(conf.get(IDENTITY_PROPERTY, "null")), json.loads(conf.get(GAPS_PROPERTY, "[]")),
                              json.loads(conf.get(EPOCHS_PROPERTY, "[]")))

    def record_upstream(self, record: UpstreamRecord) -> None:
        """Record the start frontier, the upstream's identity, the gaps and the epochs in the remap table's
        properties, in one delta-rs commit (no JVM).  Any commit landing while it is prepared (a racing tick, a
        racing ``accept-lost`` or new epoch) refuses it, never retried over it, so a record is never written over
        one it did not read: :class:`ConcurrentWriteError`, nothing recorded."""
        from deltalake import CommitProperties
        from deltalake.exceptions import CommitFailedError

        values = {START_PROPERTY: json.dumps([list(pair) for pair in record.start]),
                  IDENTITY_PROPERTY: json.dumps(record.identity, sort_keys=True),
                  GAPS_PROPERTY: json.dumps(record.gaps, sort_keys=True),
                  EPOCHS_PROPERTY: json.dumps(record.epochs, sort_keys=True)}
        try:
            self.table("remap").alter.set_table_properties(
                values, raise_if_not_exists=False, commit_properties=CommitProperties(max_commit_retries=0))
        except CommitFailedError as e:
            raise ConcurrentWriteError(f"{self.uri}: another writer committed to remap while its properties were "
                                       f"recorded ({str(e).splitlines()[0]}); nothing recorded") from None

    # --- landing ------------------------------------------------------------------------

    def land(self, df, uppers: Frontier) -> None:
        """Append ``df``'s records of the partitions of ``uppers`` (offsets below them) in one commit that
        records ``uppers``; those partitions are then read from here (:meth:`read_landed`)."""
        again = sorted(set(uppers.partitions) & set(self.landed().partitions), key=str)
        if again:
            raise WarehouseError(f"{self.uri}: partitions {again} are landed already")
        from pyspark.sql import functions as F

        self._land(df.withColumn("into_time", F.lit(0).cast("long")), uppers, {})

    def _land(self, df, uppers: Frontier, fields: dict) -> None:
        """One landing commit (app ``reclock.landing`` = the number of landings) recording ``uppers`` (the
        landed partitions' uppers after it) and ``fields`` in its ``userMetadata``; Delta skips it when another
        landing took the version: :class:`ConcurrentWriteError` then."""
        self._create_table_if_absent("landing")
        version = self._app_version("landing", LANDING_APP, 0) + 1
        append(df, self.table_uri("landing"), self.schemas["landing"].names, LANDING_APP, version,
               {**fields, "landed": [list(u) for u in uppers]})
        if self._app_version("landing", LANDING_APP, 0) < version or not uppers.less_equal(self.landed()):
            raise ConcurrentWriteError(f"{self.uri}: another writer landed records at the same time; nothing landed")

    def land_more(self, rows: list[dict], before: Frontier, after: Frontier, state: dict) -> None:
        """Append ``rows`` (the data columns, ``partition`` and ``offset`` as an int) taken after ``before``, the
        landed uppers they were read from, in one commit recording ``after`` and the source's ``state``
        (:meth:`landing_state`): a source whose landing grows at every tick.  Compare-and-append: when the
        landed uppers are no longer ``before`` (another tick landed meanwhile) :class:`ConcurrentWriteError` and
        nothing landed, so no record is landed twice.  Every row lies in ``[before, after)`` of its partition."""
        if (now := self.landed()) != before:
            raise ConcurrentWriteError(f"{self.uri}: landed uppers are {now}, not {before} as read: another tick "
                                       "landed meanwhile; nothing landed")
        outside = [(r["partition"], r["offset"]) for r in rows
                   if not before[r["partition"]] <= r["offset"] < after[r["partition"]]]
        if outside or not before.less_equal(after):
            raise WarehouseError(f"{self.uri}: landing {before} -> {after} with records outside it: {outside[:3]}")
        try:
            table = pa.Table.from_pylist(
                [{**r, "offset": offsets.to_storage(r["offset"], self.offset_type), "into_time": 0, "diff": 1}
                 for r in rows], schema=self.schemas["landing"])
        except offsets.OffsetError as e:
            raise WarehouseError(f"{self.uri}: cannot land records: {e}") from e
        self._land(self._frame("landing", table), after, {"state": state})

    def _landings(self, field: str, read):
        """``read(value)`` of ``field`` in each landing commit's ``userMetadata``, newest first; commits without
        a readable one (the table's creation) are passed over."""
        dt = self._table_or_none("landing")
        for commit in [] if dt is None else sorted(dt.history(), key=lambda c: c.get("version", -1), reverse=True):
            try:
                yield read(json.loads(commit.get("userMetadata") or "{}")[field])
            except (ValueError, KeyError, TypeError):
                continue

    def landing_state(self) -> dict:
        """The source state recorded with the latest landing that has one (``{}`` before any)."""
        return next(self._landings("state", dict), {})

    def landed(self) -> Frontier:
        """The uppers of every landed partition (empty when nothing was landed)."""
        out = Frontier()
        for uppers in self._landings("landed", lambda u: Frontier.of([tuple(p) for p in u])):
            out = out.join(uppers)
        return out

    def read_landed(self, ranges, spark=None):
        """Spark DataFrame of the landed records in ``ranges`` (``(into_time, partition, start, end)`` of landed
        partitions), each stamped with its range's IntoTime; the columns of the reclocked table."""
        from pyspark.sql import functions as F

        df = self.read_spark("landing", spark=spark).drop("into_time")
        into_time, wanted = F.lit(None).cast("long"), F.lit(False)
        for t, partition, start, end in ranges:
            if start >= end:
                continue
            low, high = (F.lit(offsets.to_storage(o, self.offset_type)) for o in (start, end))
            inside = (F.col("partition") == F.lit(partition)) & (F.col("offset") >= low) & (F.col("offset") < high)
            into_time, wanted = F.when(inside, F.lit(t)).otherwise(into_time), wanted | inside
        return df.where(wanted).withColumn("into_time", into_time).select(*self.schemas["reclocked"].names)

    # --- reclocked ----------------------------------------------------------------------

    def reclocked_upper(self) -> int:
        """IntoTime upper of the published reclocked table: last published IntoTime + 1, 0 if none."""
        return self._app_version("reclocked", RECLOCKED_APP, -1) + 1

    def _spark_path(self, relative: str) -> str:
        return f"{_spark_uri(self.uri)}/{relative}"

    def staging_dir(self, upto: int) -> str:
        """A fresh attempt directory (Spark URI) for the staged rows of the bindings up to IntoTime ``upto``.

        Write it with Spark's default committer (``_SUCCESS`` marks a complete attempt).
        """
        return self._spark_path(_attempt_dir(_upto_dir(upto)))

    def stage(self, df, upto: int, dead_letters=None, metadata: dict | None = None) -> int:
        """Write a Spark DataFrame of reclocked rows up to ``upto`` as a fresh staged attempt; rows staged.

        ``dead_letters``: a Spark DataFrame of the batch's records that could not be decoded (columns of
        :func:`dead_letter_schema`), written first, under the attempt's ``_dead_letter/``, so that the
        attempt's ``_SUCCESS`` marks both complete.  ``metadata``: what the checks need to know of the batch
        from the upstream (JSON-able; :meth:`staged_metadata`), written first too, as the attempt's
        ``_batch.json``.  0 and nothing written when ``upto`` is already published.
        """
        if self.reclocked_upper() > upto:
            return 0
        attempt = _attempt_dir(_upto_dir(upto))
        writer = df.select(*self.schemas["reclocked"].names).write
        if metadata is not None:
            write_json(f"{self.uri}/{attempt}", STAGED_METADATA, metadata, self.storage_options)
            writer = writer.mode("append")  # into the attempt directory created for it
        if dead_letters is not None:
            self._typed(dead_letters, "dead_letter").write.parquet(self._spark_path(f"{attempt}/{STAGED_DEAD_LETTERS}"))
            writer = writer.mode("append")  # into the attempt directory the dead letters created
        writer.parquet(self._spark_path(attempt))
        return self.staged_rows(upto)

    def _typed(self, df, kind: Kind):
        """``df``'s columns of table ``kind``, cast to its types."""
        return df.select(*[df[f.name].cast(f.dataType).alias(f.name) for f in self.spark_schema(kind)])

    def staged_dead_letters(self, upto: int):
        """The dead letters of the latest complete staged attempt for ``upto`` as a pandas DataFrame; None when it
        has none staged (a source with ``on_bad_record: fail``), or nothing is staged (published meanwhile)."""
        fs = self._fs()
        try:
            _, attempt = self._attempts(fs, upto)
        except WarehouseError:
            return None
        files = self._staged_dead_letter_files(fs, attempt)
        if files is None:
            return None
        return pads.dataset([i.path for i in files], schema=self.schemas["dead_letter"], filesystem=fs,
                            format="parquet").to_table().to_pandas()

    def read_staged_dead_letters_spark(self, upto: int, spark=None):
        """The dead letters of the latest complete staged attempt for ``upto`` as a Spark DataFrame (read with
        ``spark``, default the tables' session); None when it has none staged (``on_bad_record: fail``)."""
        fs = self._fs()
        _, attempt = self._attempts(fs, upto)
        if self._staged_dead_letter_files(fs, attempt) is None:
            return None
        return ((spark or self.spark).read.schema(self.spark_schema("dead_letter"))
                .parquet(self._spark_path(f"{attempt}/{STAGED_DEAD_LETTERS}")))

    def staged_metadata(self, upto: int) -> dict | None:
        """The ``metadata`` staged with the latest complete attempt for ``upto`` (:meth:`stage`); None when it has
        none."""
        fs = self._fs()
        _, attempt = self._attempts(fs, upto)
        try:
            with fs.open_input_stream(f"{attempt}/{STAGED_METADATA}") as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return None

    def _staged_dead_letter_files(self, fs: pafs.FileSystem, attempt: str) -> list[pafs.FileInfo] | None:
        directory = f"{attempt}/{STAGED_DEAD_LETTERS}"
        return _parquet_files(fs, directory) if fs.get_file_info(directory).type == pafs.FileType.Directory else None

    def record_upstream_sample(self, upper: Frontier, bound: Frontier, step: str, at: int) -> None:
        """Keep the upstream's upper as ``step`` measured it at ``at`` (ms), with what remap had bound then, as
        ``<source>/upstream_sample.json`` (replaced each time): the last known upstream lag, which the progress page
        shows without asking the upstream (:meth:`upstream_sample`)."""
        write_json(self.uri, UPSTREAM_SAMPLE, {"measured_at": at, "step": step, "upper": [list(u) for u in upper],
                                               "bound": [list(b) for b in bound]}, self.storage_options)

    def upstream_sample(self) -> dict | None:
        """The last :meth:`record_upstream_sample`: ``{"measured_at", "step", "upper", "bound"}`` (frontiers), or
        None before any."""
        doc = self._read_json(UPSTREAM_SAMPLE)
        if doc is None:
            return None
        return {**doc, "upper": Frontier.of([tuple(u) for u in doc["upper"]]),
                "bound": Frontier.of([tuple(b) for b in doc["bound"]])}

    def dead_letter_count(self) -> int | None:
        """Records in the dead-letter table (from the Delta log's file statistics); None when it does not exist."""
        dt = self._table_or_none("dead_letter")
        if dt is None:
            return None
        return int(pc.sum(pa.table(dt.get_add_actions(flatten=True))["num_records"]).as_py() or 0)

    def read_dead_letters_spark(self, spark=None):
        """The dead-letter table as a Spark DataFrame (read with ``spark``, default the tables' session)."""
        return self.read_spark("dead_letter", spark=spark)

    def read_staged(self, upto: int):
        """The latest complete staged attempt for ``upto`` as a pandas DataFrame (for checks before publishing)."""
        fs = self._fs()
        _, attempt = self._attempts(fs, upto)
        paths = [i.path for i in _parquet_files(fs, attempt)]
        schema = self.schemas["reclocked"]
        return pads.dataset(paths, schema=schema, filesystem=fs, format="parquet").to_table().to_pandas()

    def staged_rows(self, upto: int) -> int:
        """The rows of the latest complete staged attempt for ``upto``, from its files' footers (no Spark job)."""
        fs = self._fs()
        _, attempt = self._attempts(fs, upto)
        return _footer_rows(fs, _parquet_files(fs, attempt))

    def read_staged_spark(self, upto: int, spark=None):
        """The latest complete staged attempt for ``upto`` as a Spark DataFrame (read with ``spark``, default the
        tables' session)."""
        _, attempt = self._attempts(self._fs(), upto)
        return (spark or self.spark).read.schema(self.spark_schema("reclocked")).parquet(self._spark_path(attempt))

    def staged_uptos(self) -> list[int]:
        """The ``upto`` of every window with a complete staged attempt, ascending (published ones too, until
        their staging is cleared)."""
        fs = self._fs()
        parent = f"reclocked/{STAGED}"
        uptos = []
        for info in fs.get_file_info(pafs.FileSelector(parent, allow_not_found=True)):
            name = info.base_name
            if info.type == pafs.FileType.Directory and name.startswith("upto=") and name[5:].lstrip("-").isdigit():
                try:
                    self._attempts(fs, int(name[5:]))
                except WarehouseError:  # no complete attempt
                    continue
                uptos.append(int(name[5:]))
        return sorted(uptos)

    def _attempts(self, fs: pafs.FileSystem, upto: int) -> tuple[list[str], str]:
        """Every staged attempt directory for ``upto``, and the latest complete one."""
        attempts = sorted(i.path for i in fs.get_file_info(pafs.FileSelector(_upto_dir(upto), allow_not_found=True))
                          if i.type == pafs.FileType.Directory)
        complete = [a for a in attempts if fs.get_file_info(f"{a}/{SUCCESS}").type == pafs.FileType.File]
        if not complete:
            raise WarehouseError(f"no complete staged attempt (with {SUCCESS}) under {self.uri}/{_upto_dir(upto)}")
        return attempts, complete[-1]

    def publish_staged(self, upto: int) -> bool:
        """Add the latest complete staged attempt for ``upto`` to the reclocked table in one idempotent commit, its
        files as they are (not copied); False if already published.

        The files are checked first, from their footers: the table's columns, IntoTimes in
        ``(published, upto]``.  The commit carries the app transaction ``reclock.reclocked`` = ``upto``: when a
        racing publish committed one since this one read the table, Delta refuses it (:class:`ConcurrentWriteError`,
        nothing written), so no window is added twice.  A batch without rows commits the app transaction alone.
        Other attempts for ``upto`` (never published) are deleted, and the published one keeps only its data files
        (a failure there, after the commit, is logged: VACUUM removes what is left).
        """
        dt = self._table_or_none("reclocked")
        published = -1 if dt is None else app_version(dt, RECLOCKED_APP, -1)
        if published >= upto:
            return False
        remap_upper = self.remap_upper()
        if upto >= remap_upper:
            raise WarehouseError(f"cannot publish up to {upto}: remap upper is {remap_upper}")
        if dt is None:
            raise WarehouseError(f"{self.table_uri('reclocked')}: no reclocked table to publish into")
        fs = self._fs()
        attempts, attempt = self._attempts(fs, upto)
        staged = [(info, self._check_staged(fs, info, published + 1, upto)) for info in _parquet_files(fs, attempt)]
        staged = [(info, stats) for info, stats in staged if stats["numRecords"]]  # not a file without rows
        self._publish_dead_letters(fs, attempt, upto)
        _commit_added(dt, [_add_action(info, stats, "reclocked") for info, stats in staged], RECLOCKED_APP, upto)
        try:  # published: what is left to remove never fails the publish (VACUUM removes it otherwise)
            for other in attempts:  # never published
                if other != attempt:
                    fs.delete_dir(other)
            if staged:
                _drop_staging_leftovers(fs, attempt, [info.base_name for info, _ in staged])
            else:
                fs.delete_dir(_upto_dir(upto))
        except OSError as e:  # e.g. a racing stage writing an attempt of this window meanwhile
            log.warning("%s: published IntoTimes up to %d; removing the other staged attempts failed (%s): VACUUM "
                        "removes them", self.uri, upto, e)
        return True

    def _read_staged_files(self, kind: Kind, files: list[pafs.FileInfo]):
        """A Spark DataFrame of staged Parquet ``files`` (at least one) with table ``kind``'s schema."""
        return self.spark.read.schema(self.spark_schema(kind)).parquet(*[self._spark_path(i.path) for i in files])

    def _publish_dead_letters(self, fs: pafs.FileSystem, attempt: str, upto: int) -> None:
        """Append the dead letters staged in ``attempt`` (if it has them) to the dead-letter table, creating it,
        with app ``reclock.dead_letter`` = ``upto``: only rows with an IntoTime after the app's version (those
        before are in already), as a compare-and-append, so none is added twice.  Staged files without rows (the
        footers say so; most batches have no bad record) commit nothing: a later batch's dead letters all lie
        after the app's version anyway."""
        files = self._staged_dead_letter_files(fs, attempt)
        if files is None:
            return
        self._create_table_if_absent("dead_letter")
        if not _footer_rows(fs, files):
            return
        dt = self.table("dead_letter")
        done = app_version(dt, DEAD_LETTER_APP, -1)
        if done >= upto:
            return
        from pyspark.sql import functions as F

        staged = self._read_staged_files("dead_letter", files).where(F.col("into_time") > done)
        compare_and_append(staged, self.table_uri("dead_letter"), self.schemas["dead_letter"].names, DEAD_LETTER_APP,
                           upto, _max_into_time(dt))

    def _check_staged(self, fs: pafs.FileSystem, info: pafs.FileInfo, lower: int, upto: int) -> dict:
        """A staged file's schema matches and its IntoTimes lie in [lower, upto] (from its footer); its Delta
        statistics (:func:`_parquet_stats`)."""
        meta = _footer(fs, info.path)
        found, expected = meta.schema.to_arrow_schema(), self.schemas["reclocked"]
        if not same_columns(found, expected):
            raise WarehouseError(f"staged file {info.path} does not match the reclocked table: "
                                 f"{schema_diff(found, expected)}")
        stats = _parquet_stats(meta)
        lo, hi = stats["minValues"].get("into_time", lower), stats["maxValues"].get("into_time", upto)
        if lo < lower or hi > upto:
            raise WarehouseError(f"staged file {info.path} has IntoTimes [{lo}, {hi}] outside [{lower}, {upto}]")
        return stats

    def snapshot_files(self, kind: Kind, version: int | None = None) -> list[str]:
        """URIs of the Parquet files of a snapshot (latest or ``version``), spelled for ``spark.read.parquet``."""
        return [_spark_uri(f) for f in self.table(kind, version).file_uris()]

    def read_reclocked_spark(self, spark=None, version: int | None = None):
        """The reclocked table (latest, or at Delta ``version``) as a Spark DataFrame (``spark``: the session
        to read with, for tables opened without one, e.g. by a query that must not create tables)."""
        return self.read_spark("reclocked", version, spark)

    def replace_reclocked(self, df, predicate: str) -> int:
        """Replace the reclocked rows matching ``predicate`` (SQL on ``into_time``) by a Spark DataFrame's rows.

        One commit (Delta ``replaceWhere``; every new row must match it). The commit carries no app
        transaction, so ``reclocked_upper`` stays what it was. Returns the number of rows written.
        """
        version = self.version("reclocked")
        (df.select(*self.schemas["reclocked"].names).write.format("delta").mode("overwrite")
         .option("replaceWhere", predicate).save(self.spark_uri("reclocked")))
        return _rows_added(self.table("reclocked"), version)

    def read_reclocked_arrow(self, version: int | None = None) -> pa.Table:
        """The reclocked snapshot through deltalake (small tables, tests)."""
        return self._read("reclocked", version)

    def remap_frame(self):
        """The stored remap rows as a pandas DataFrame (for checks)."""
        return self._read("remap").to_pandas()

    # --- compaction ---------------------------------------------------------------------

    def compact(self, since: int, retention_hours: float = VACUUM_RETENTION_HOURS, *,
                offsets_unique: bool = False) -> None:
        """Compact both tables to ``since``; every step is idempotent, so rerun after a crash, or after a rewrite
        that a racing commit made Delta refuse (:class:`ConcurrentWriteError`: nothing of it rewritten).

        1. record ``since`` (queries before it are refused from then on);
        2. fold remap increments at or before ``since`` into one row per partition at ``since``;
        3. advance reclocked IntoTimes to ``since`` there and consolidate diffs (in Spark; without a shuffle
           when ``offsets_unique``: see :meth:`_consolidate_reclocked`);
        4. optimize (merge the files below ``OPTIMIZE_MIN_FILE_BYTES`` of a table with more than
           ``SMALL_FILES_MAX`` of them, as a tick does remap's) and vacuum files
           removed more than ``retention_hours`` ago, in the dead-letter table too (its rows are all kept);
           a table vacuumed less than a quarter of that retention ago is not vacuumed yet (:func:`vacuum_due`).

        A read of a version from before the compaction (an AS OF query or a backfill that is still
        running) finds its files for ``retention_hours`` more: :func:`reclock.pipeline.compact` passes
        the source's ``vacuum_retention_hours``, which the sources file keeps at least as long as its
        AS OF window unless ``force_vacuum`` says otherwise.
        """
        stored = self.since()
        since, upper = max(since, stored), min(self.remap_upper(), self.reclocked_upper())
        if since >= upper:
            raise WarehouseError(f"cannot compact to {since}: published only below {upper}")
        if stored < since:
            self._append("remap", self._frame("remap", self.schemas["remap"].empty_table()), SINCE_APP, since)
        self._consolidate_remap(since)
        self._consolidate_reclocked(since, offsets_unique)
        dead_letters = ("dead_letter",) if self._table_or_none("dead_letter") is not None else ()
        vacuumed = self.vacuumed()
        for kind in KINDS + dead_letters:  # the dead letters are kept whole: merged only (a file per publish)
            if self._has_many_small_files(kind):
                self._optimize(kind)
            started = now_ms()
            if vacuum_due(vacuumed.get(kind), started, retention_hours):
                self._vacuum(kind, retention_hours)
                vacuumed[kind] = started
                self._record_vacuumed(vacuumed)

    def _has_many_small_files(self, kind: Kind) -> bool:
        """More than ``SMALL_FILES_MAX`` files below ``OPTIMIZE_MIN_FILE_BYTES`` in the table (from its Delta
        log): time to merge them (Delta OPTIMIZE)."""
        sizes = pa.table(self.table(kind).get_add_actions(flatten=True))["size_bytes"]
        return (pc.sum(pc.less(sizes, OPTIMIZE_MIN_FILE_BYTES)).as_py() or 0) > SMALL_FILES_MAX

    def _optimize(self, kind: Kind) -> None:
        """Merge files below ``OPTIMIZE_MIN_FILE_BYTES`` (Delta OPTIMIZE; it commits only when there are files
        to merge)."""
        with _conf(self.spark, "spark.databricks.delta.optimize.minFileSize", str(OPTIMIZE_MIN_FILE_BYTES)):
            self.spark.sql(f"OPTIMIZE {_delta_path(self.table_uri(kind))}")

    def vacuumed(self) -> dict[str, int]:
        """When compaction last vacuumed each table (ms by kind, from ``<source>/vacuumed.json``): {} before any,
        or when the record cannot be read (then every table is due: a VACUUM too many is only time)."""
        try:
            record = self._read_json(VACUUMED)
        except ValueError as e:
            log.warning("%s: unreadable %s (%s): vacuuming every table", self.uri, VACUUMED, e)
            return {}
        return {k: v for k, v in record.items() if isinstance(v, int)} if isinstance(record, dict) else {}

    def _read_json(self, name: str):
        """The side file ``<source>/<name>``, or None when there is none (ValueError when it is not JSON)."""
        return read_json(self.uri, name, self.storage_options)

    def _record_vacuumed(self, vacuumed: dict[str, int]) -> None:
        write_json(self.uri, VACUUMED, vacuumed, self.storage_options)

    def _vacuum(self, kind: Kind, retention_hours: float) -> None:
        """Delete files removed more than ``retention_hours`` ago, rounded up to whole hours (Delta VACUUM
        rounds its retention to whole hours: 0.4 h would keep nothing).

        Delta 4 ignores a ``RETAIN`` other than 0 hours by default, for the table property
        ``delta.deletedFileRetentionDuration`` (7 days): then a source keeping files 30 days would lose
        them after 7, and one keeping them an hour would keep them 7 days.  Its ``retentionWindowIgnore``
        conf is turned off for the statement, so the retention is the source's, and no table property
        (a metadata commit, conflicting with every write in flight) changes."""
        with (_conf(self.spark, "spark.databricks.delta.retentionDurationCheck.enabled", "false"),
              _conf(self.spark, "spark.databricks.delta.vacuum.retentionWindowIgnore.enabled", "false")):
            self.spark.sql(f"VACUUM {_delta_path(self.table_uri(kind))} RETAIN {math.ceil(retention_hours)} HOURS")

    def _consolidate_remap(self, since: int) -> bool:
        """Rewrite remap rows at or before ``since`` as one row per partition at ``since``; False if already so.

        Remap is small (one row per partition and tick), and big offsets must sum exactly: the
        rows are folded in Python (:meth:`Remap.compact`) and written back in one overwrite.
        """
        old = self._read("remap", filter=pc.field("into_time") <= since)
        folded: dict = {}
        for partition, amount in zip(old["partition"].to_pylist(), offsets.from_arrow(old["increment"])):
            folded[partition] = folded.get(partition, 0) + amount
        new = [(p, since, amount) for p, amount in folded.items() if amount]
        if len(new) == old.num_rows and (old.num_rows == 0 or pc.min(old["into_time"]).as_py() == since):
            return False
        rows = self._remap_rows(Increment(p, t, a) for p, t, a in new)
        with _conflicts_as(_REWRITE_RACED.format(uri=self.table_uri("remap"))), \
                points.commit("compact-remap", self.table_uri("remap")):
            (self._frame("remap", rows).write.format("delta").mode("overwrite")
             .option("replaceWhere", f"into_time <= {since}").save(self.spark_uri("remap")))
        return True

    def _consolidate_reclocked(self, since: int, offsets_unique: bool = False) -> bool:
        """Rewrite reclocked rows at or before ``since`` as ``sum(diff)`` per record at ``since`` (Spark).

        A record is its data, ``partition`` and ``offset``.  With ``offsets_unique`` (a source with one record
        per offset: its published batches passed the ``reclocked_keys`` check, and bindings cover disjoint
        offset ranges) no two rows share ``(partition, offset)``, so each record is one row and its sum is its
        ``diff``: the rows are rewritten as they are (a scan, no shuffle), those with a zero ``diff`` dropped.
        """
        from pyspark.sql import functions as F

        where = F.col("into_time") <= since
        df = self.read_spark("reclocked").where(where)
        stats = df.agg(F.count(F.lit(1)).alias("n"), F.min("into_time").alias("lo")).first()
        if stats["n"] == 0:
            return False
        keys = self.data_columns + ["partition", "offset"]
        summed = df if offsets_unique else df.groupBy(*keys).agg(F.sum("diff").alias("diff"))
        consolidated = summed.where(F.col("diff") != 0).withColumn("into_time", F.lit(since).cast("long"))
        if stats["lo"] == since and consolidated.count() == stats["n"]:
            return False
        files = max(1, -(-self._bytes_at_or_before("reclocked", since) // COMPACTED_FILE_BYTES))
        with _conflicts_as(_REWRITE_RACED.format(uri=self.table_uri("reclocked"))), \
                points.commit("compact-reclocked", self.table_uri("reclocked")):
            (consolidated.select(*self.schemas["reclocked"].names).coalesce(files).write.format("delta")
             .mode("overwrite").option("replaceWhere", f"into_time <= {since}").save(self.spark_uri("reclocked")))
        return True

    def _bytes_at_or_before(self, kind: Kind, since: int) -> int:
        """The bytes of the table's files holding rows at or before ``since`` (all its files with rows where one
        has no statistics), from the Delta log."""
        files = _files_with_rows(self.table(kind))
        if "min.into_time" in files.column_names and files["min.into_time"].null_count == 0:
            files = files.filter(pc.less_equal(files["min.into_time"], since))
        return pc.sum(files["size_bytes"]).as_py() or 0


# --- helpers ------------------------------------------------------------------------------


@contextmanager
def _conf(spark, key: str, value: str):
    """Set a Spark SQL conf for the duration of a block."""
    before = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        spark.conf.unset(key) if before is None else spark.conf.set(key, before)


def _rows_added(dt: DeltaTable, after: int) -> int:
    """Rows added by the commits after version ``after`` (from the Delta log's operation metrics).

    A ``replaceWhere`` overwrite rewrites the files holding replaced rows: its ``numOutputRows``
    also counts the other rows of those files, copied over (``numCopiedRows``); they are not added.
    """
    added = 0
    for commit in dt.history():
        if commit.get("version", -1) > after:
            metrics = commit.get("operationMetrics") or {}
            added += int(metrics.get("numOutputRows", 0)) - int(metrics.get("numCopiedRows", 0))
    return added


#: The app transactions of a transactions step's two tables (:mod:`reclock.transactions`).
TXN_OUTPUT_APP, TXN_TEMP_APP = "reclock.txn_output", "reclock.txn_temp"


def txn_table_uri(warehouse: Warehouse, name: str, kind: str) -> str:
    """Where the ``output`` or ``temp`` table of transactions step ``name`` lives."""
    return f"{warehouse.root}/{name}_txn_{kind}"


def txn_processed_upto(warehouse: Warehouse, name: str) -> int:
    """Last IntoTime transactions step ``name`` has processed (-1: none): its sources may compact up to it."""
    try:
        dt = DeltaTable(txn_table_uri(warehouse, name, "temp"), storage_options=warehouse.storage_options)
    except TableNotFoundError:
        return -1
    return app_version(dt, TXN_TEMP_APP, -1)


def app_version(dt: DeltaTable, app_id: str, default: int) -> int:
    version = dt.transaction_version(app_id)
    return default if version is None else version


def _files_with_rows(dt: DeltaTable) -> pa.Table:
    """The snapshot's add actions (flattened: ``size_bytes``, ``min.into_time``, ...) of files holding rows."""
    files = pa.table(dt.get_add_actions(flatten=True))
    return files.filter(pc.not_equal(pc.fill_null(files["num_records"], -1), 0))  # idle ticks commit empty files


def _max_into_time(dt: DeltaTable | None) -> int | None:
    """``max(into_time)`` of a snapshot (None: no rows), from the file statistics where every file has them."""
    if dt is None:
        return None
    files = _files_with_rows(dt)
    if files.num_rows == 0:
        return None
    if "max.into_time" in files.column_names and files["max.into_time"].null_count == 0:
        return pc.max(files["max.into_time"]).as_py()
    return pc.max(dt.to_pyarrow_dataset().to_table(columns=["into_time"])["into_time"]).as_py()


def _add_action(info: pafs.FileInfo, stats: dict, kind: Kind):
    """The Delta ``add`` action of a Parquet file written for table ``kind`` (``info``: its path relative to the
    source, inside the table's directory): its path relative to the table, size, and ``stats`` (from its footer)."""
    from deltalake.transaction import AddAction

    if not info.path.startswith(f"{kind}/"):
        raise WarehouseError(f"staged file {info.path} lies outside the {kind} table's directory")
    return AddAction(quote(info.path[len(kind) + 1:], safe="/="), info.size, {},
                     info.mtime_ns // 1_000_000 if info.mtime_ns else now_ms(), True,
                     json.dumps(stats))


_DELTA_RS_CONFLICTS = ("Concurrent", "changed since last commit")  # delta-rs's conflicts (CommitFailedError)


def _commit_added(dt: DeltaTable, added, app_id: str, version: int, metadata: dict | None = None) -> None:
    """Commit ``added`` files (add actions, possibly none) to the table ``dt`` was read at, with the app transaction
    ``app_id`` = ``version`` (and ``metadata`` as the commit's ``userMetadata``), in one Delta commit (delta-rs: the
    files are there already, staged by Spark; or ``added`` is a function that writes them, called inside the
    commit's crash points: :meth:`SourceTables._commit_rows`).

    A commit carrying ``app_id`` that landed since ``dt``'s version makes Delta's conflict check refuse this one:
    :class:`ConcurrentWriteError`, nothing committed; so does one that changed the table's metadata (a new epoch's
    properties).  Other commits in between (a compaction's rewrite of rows before ``since``) do not conflict
    with an append.
    """
    from deltalake import CommitProperties, Transaction
    from deltalake.exceptions import CommitFailedError

    uri = dt.table_uri
    with points.commit(_COMMITS.get(app_id, app_id), uri):
        if callable(added):
            added = added()
        try:
            dt.create_write_transaction(added, "append", dt.schema(), commit_properties=CommitProperties(
                app_transactions=[Transaction(app_id, version, now_ms())],
                custom_metadata=None if metadata is None else {"userMetadata": json.dumps(metadata, sort_keys=True)}))
        except CommitFailedError as e:
            if not any(conflict in str(e) for conflict in _DELTA_RS_CONFLICTS):
                raise
            raise ConcurrentWriteError(f"{uri}: another writer committed {app_id} since this step read the table "
                                       f"(committing {app_id} = {version}); nothing written") from None


def _drop_staging_leftovers(fs: pafs.FileSystem, attempt: str, committed: list[str]) -> None:
    """Remove what a published attempt holds besides the ``committed`` files (names; now the table's) and their
    checksums: ``_SUCCESS``, ``_batch.json``, the dead letters (published), files without rows."""
    keep = set(committed) | {f".{name}.crc" for name in committed}
    for info in fs.get_file_info(pafs.FileSelector(attempt)):
        if info.base_name in keep:
            continue
        fs.delete_dir(info.path) if info.type == pafs.FileType.Directory else fs.delete_file(info.path)


def read_rows(dt: DeltaTable, schema: pa.Schema, filter: pc.Expression | None = None) -> pa.Table:
    return dt.to_pyarrow_dataset().to_table(filter=filter).select(schema.names).cast(schema)


def _parquet_files(fs: pafs.FileSystem, directory: str) -> list[pafs.FileInfo]:
    """The data files Spark wrote in ``directory`` (not ``_SUCCESS``, ``.crc`` or other hidden files)."""
    return [i for i in fs.get_file_info(pafs.FileSelector(directory))
            if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
            and not i.base_name.startswith(("_", "."))]


def _footer(fs: pafs.FileSystem, path: str) -> pq.FileMetaData:
    with fs.open_input_file(path) as f:
        return pq.read_metadata(f)


def _footer_rows(fs: pafs.FileSystem, files: list[pafs.FileInfo]) -> int:
    """The rows of Parquet ``files``, from their footers (no Spark job)."""
    return sum(_footer(fs, i.path).num_rows for i in files)


def _attempt_dir(parent: str) -> str:
    """A new, unique directory under ``parent`` for one Spark write (ordered by creation time)."""
    return f"{parent}/{time.time_ns() // 1_000_000:013d}-{uuid.uuid4().hex[:8]}"


def _upto_dir(upto: int) -> str:
    return f"reclocked/{STAGED}/upto={upto}"


def _spark_uri(uri: str) -> str:
    """Spark's (Hadoop S3A) spelling of an object-store URI."""
    return "s3a://" + uri[len("s3://"):] if uri.startswith("s3://") else uri


def arrow_schema(dt: DeltaTable) -> pa.Schema:
    return pa.schema(dt.schema().to_arrow())


def same_columns(found: pa.Schema, expected: pa.Schema) -> bool:
    """Same column names and types (any order, nullability ignored: Spark writes all columns nullable)."""
    return {f.name: f.type for f in found} == {f.name: f.type for f in expected}


def schema_diff(found: pa.Schema, expected: pa.Schema) -> str:
    have, want = {f.name: f.type for f in found}, {f.name: f.type for f in expected}
    parts = [f"missing {sorted(set(want) - set(have))}" if set(want) - set(have) else "",
             f"unexpected {sorted(set(have) - set(want))}" if set(have) - set(want) else "",
             ", ".join(f"{n}: {have[n]} (expected {want[n]})" for n in want if n in have and have[n] != want[n])]
    return "; ".join(p for p in parts if p)


def _parquet_stats(meta: pq.FileMetaData, string_chars: int = STATS_STRING_CHARS) -> dict:
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
