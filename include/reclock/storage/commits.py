"""Every Delta commit reclock makes, by either writer: the mechanisms of the commit protocol that
:mod:`reclock.storage` states (which commit, its writer, its app transaction, why racing writers cannot both win).

delta-rs (no JVM): :func:`create_table`, :func:`commit_added` (files already written, by Spark or pyarrow, or
written inside the commit's crash points), :func:`set_properties`, :func:`overwrite_rows_where` (rows in Arrow),
:func:`optimize`, :func:`vacuum`.  delta-spark (the DataFrame API of a Spark session, not its Python
``DeltaTable``, which needs Delta's plugin on a Spark Connect server): :func:`overwrite_where` (a rewrite computed in
Spark: compaction of the reclocked table, a backfill repair); :func:`append` and :func:`compare_and_append` (no product
commit uses it any more: the next change removes it with its tests) remain, :func:`append` for the transactions
step's tables.  Each is observed as
:mod:`reclock.points`'s commit ``tick``, ``publish``, ``compact``, ``compact-remap``, ``compact-reclocked`` or its
app transaction's name; a Delta conflict (another writer committed first, nothing committed here) is raised as
:class:`~reclock.storage.layout.ConcurrentWriteError` naming the table and what was not written.
"""
from __future__ import annotations

import json
import math
from contextlib import contextmanager

from deltalake import DeltaTable

from .. import points
from ..clock import now_ms
from .layout import ConcurrentWriteError, spark_uri

REMAP_APP, SINCE_APP, RECLOCKED_APP = "reclock.remap", "reclock.since", "reclock.reclocked"
LANDING_APP = "reclock.landing"  # version = number of landings
DEAD_LETTER_APP = "reclock.dead_letter"  # version = the last published IntoTime whose dead letters are in
#: The app transactions of a transactions step's two tables (:mod:`reclock.transactions`).
TXN_OUTPUT_APP, TXN_TEMP_APP = "reclock.txn_output", "reclock.txn_temp"

_POINTS = {REMAP_APP: "tick", RECLOCKED_APP: "publish", SINCE_APP: "compact"}  # their names in reclock.points
_MOVED = "reclock: the table moved since it was read"
_CONCURRENT = ("ConcurrentTransaction", "ConcurrentAppend", "ConcurrentDeleteRead", "ConcurrentDeleteDelete",
               "ConcurrentWrite", "MetadataChanged", "ProtocolChanged")  # Delta's conflicts: <kind>Exception
_DELTA_RS_CONFLICTS = ("Concurrent", "changed since last commit")  # delta-rs's conflicts (CommitFailedError)


def app_version(dt: DeltaTable, app_id: str, default: int) -> int:
    """The version of app transaction ``app_id`` in snapshot ``dt`` (``default`` when it has none)."""
    version = dt.transaction_version(app_id)
    return default if version is None else version


# --- delta-rs ---------------------------------------------------------------------------------------------------


def create_table(uri: str, schema, name: str, storage_options: dict | None = None) -> None:
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


def commit_added(dt: DeltaTable, added, app_id: str, version: int, metadata: dict | None = None) -> None:
    """Commit ``added`` files (add actions, possibly none) to the table ``dt`` was read at, with the app transaction
    ``app_id`` = ``version`` (and ``metadata`` as the commit's ``userMetadata``), in one Delta commit (delta-rs: the
    files are there already, staged by Spark; or ``added`` is a function that writes them, called inside the
    commit's crash points).

    A commit carrying ``app_id`` that landed since ``dt``'s version makes Delta's conflict check refuse this one:
    :class:`ConcurrentWriteError`, nothing committed; so does one that changed the table's metadata (a new epoch's
    properties).  Other commits in between (a compaction's rewrite of rows before ``since``) do not conflict
    with an append.
    """
    from deltalake import CommitProperties, Transaction
    from deltalake.exceptions import CommitFailedError

    uri = dt.table_uri
    with points.commit(_POINTS.get(app_id, app_id), uri):
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


def set_properties(dt: DeltaTable, values: dict[str, str], what: str) -> None:
    """Set table properties ``values`` of the table ``dt`` was read at, in one delta-rs commit never retried: any
    commit landing since refuses it (:class:`ConcurrentWriteError` naming ``what``, nothing recorded), so properties
    are never written over ones this writer did not read."""
    from deltalake import CommitProperties
    from deltalake.exceptions import CommitFailedError

    try:
        dt.alter.set_table_properties(values, raise_if_not_exists=False,
                                      commit_properties=CommitProperties(max_commit_retries=0))
    except CommitFailedError as e:
        raise ConcurrentWriteError(f"{dt.table_uri}: another writer committed while {what} was written "
                                   f"({str(e).splitlines()[0]}); nothing recorded") from None


# --- delta-spark ------------------------------------------------------------------------------------------------


def append(df, uri: str, columns: list[str], app_id: str, version: int, metadata: dict | None = None) -> None:
    """Append Spark DataFrame ``df`` (possibly empty) to the Delta table at ``uri`` in one commit carrying
    the app transaction ``app_id`` = ``version`` (and ``metadata`` as the commit's ``userMetadata``);
    Delta skips it when the stored version is already ``>= version``."""
    writer = (df.select(*columns).write.format("delta").mode("append")
              .option("txnAppId", app_id).option("txnVersion", str(version)))
    if metadata is not None:
        writer = writer.option("userMetadata", json.dumps(metadata, sort_keys=True))
    with conflicts_as(f"{uri}: another writer committed since this step read the table (committing "
                      f"{app_id} = {version}); nothing written"), points.commit(_POINTS.get(app_id, app_id), uri):
        writer.save(spark_uri(uri))


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
    with sql_conf(df.sparkSession, "spark.databricks.delta.optimizeMetadataQuery.enabled", "false"):
        append(_guarded(df, uri, read_max_into_time), uri, columns, app_id, version, metadata)


def overwrite_where(df, uri: str, columns: list[str], predicate: str, point: str, raced: str,
                    files: int | None = None) -> None:
    """Replace the rows of the Delta table at ``uri`` matching ``predicate`` by ``df``'s (every one must match it)
    in one commit without an app transaction (Delta ``replaceWhere``), written as ``files`` files when given;
    observed as commit ``point``.  A racing commit Delta's conflict check refuses it for: :class:`ConcurrentWriteError`
    saying ``raced``, nothing rewritten."""
    df = df.select(*columns)
    if files is not None:
        df = df.coalesce(files)
    with conflicts_as(raced), points.commit(point, uri):
        (df.write.format("delta").mode("overwrite").option("replaceWhere", predicate)
         .save(spark_uri(uri)))


def optimize(dt: DeltaTable, min_file_bytes: int) -> None:
    """Merge the files below ``min_file_bytes`` of the table ``dt`` was read at into files of up to that size
    (delta-rs OPTIMIZE: a rewrite whose rows stay the same, one commit of removes and adds, none when no two files
    are small enough to merge).  An append committed meanwhile is not in conflict with it (delta-rs rebases the
    commit over it); a commit that removed one of its files is: :class:`ConcurrentWriteError`, nothing merged."""
    with _delta_rs_conflicts(f"{dt.table_uri}: another writer removed files OPTIMIZE was merging; nothing merged"):
        dt.optimize.compact(target_size=min_file_bytes)


def vacuum(dt: DeltaTable, retention_hours: float) -> None:
    """Delete the files of the table ``dt`` was read at that no version within ``retention_hours`` (rounded up to
    whole hours) reads: files removed longer ago, and files never committed (staged attempts, a write killed
    before its commit) older than that; ``_``-named files and directories stay (``_delta_log``, ``_SUCCESS``).

    delta-rs VACUUM in full mode, which lists the table's directory as Delta's own VACUUM does, with the source's
    retention, not the table property ``delta.deletedFileRetentionDuration``."""
    with _delta_rs_conflicts(f"{dt.table_uri}: another writer committed while VACUUM recorded its deletions"):
        dt.vacuum(retention_hours=math.ceil(retention_hours), dry_run=False, enforce_retention_duration=False,
                  full=True)


def overwrite_rows_where(uri: str, rows, predicate: str, point: str, raced: str,
                         storage_options: dict | None = None) -> None:
    """Replace the rows of the Delta table at ``uri`` matching ``predicate`` by Arrow ``rows`` (every one must
    match it) in one delta-rs commit without an app transaction, never retried: any commit since it read the
    table refuses it (:class:`ConcurrentWriteError` saying ``raced``, nothing rewritten); observed as commit
    ``point``."""
    from deltalake import CommitProperties, write_deltalake

    with _delta_rs_conflicts(raced), points.commit(point, uri):
        write_deltalake(uri, rows, mode="overwrite", predicate=predicate, storage_options=storage_options,
                        commit_properties=CommitProperties(max_commit_retries=0))


@contextmanager
def _delta_rs_conflicts(message: str):
    """Raise :class:`ConcurrentWriteError` with ``message`` for a delta-rs commit another writer's refused."""
    from deltalake.exceptions import CommitFailedError

    try:
        yield
    except CommitFailedError as e:
        raise ConcurrentWriteError(f"{message} ({str(e).splitlines()[0]})") from None


@contextmanager
def conflicts_as(message: str):
    """Raise :class:`ConcurrentWriteError` with ``message`` for a Delta conflict inside the block."""
    try:
        yield
    except Exception as e:
        if concurrent(e):
            raise ConcurrentWriteError(message) from None
        raise


def concurrent(error: Exception) -> bool:
    """Whether a Spark/Delta error says another writer committed first (nothing was committed here).

    PySpark raises Delta's conflicts as ``delta.exceptions`` classes whose message lacks the class name,
    or as a Py4J error whose message has the Java class name: both are looked at."""
    text = f"{type(error).__name__}: {error}"
    return _MOVED in text or any(f"{kind}Exception" in text for kind in _CONCURRENT)


@contextmanager
def sql_conf(spark, key: str, value: str):
    """Set a Spark SQL conf for the duration of a block."""
    before = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        spark.conf.unset(key) if before is None else spark.conf.set(key, before)


def _guarded(df, uri: str, read_max_into_time: int | None):
    """``df``, failing when its job runs if the table's ``max(into_time)`` is no longer ``read_max_into_time``."""
    from pyspark.sql import functions as F

    now = df.sparkSession.read.format("delta").load(spark_uri(uri)).agg(F.max("into_time").alias("m"))
    same = F.col("m").eqNullSafe(F.lit(read_max_into_time).cast("long"))
    ok = now.select(F.when(same, F.lit(True)).otherwise(F.raise_error(F.lit(_MOVED))).alias("_unchanged"))
    return df.crossJoin(ok).where("_unchanged").drop("_unchanged")
