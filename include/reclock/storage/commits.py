"""Every Delta commit reclock makes: the mechanisms of the commit protocol that :mod:`reclock.storage` states (which
commit, its app transaction, why racing writers cannot both win).

Every one is a delta-rs commit (no JVM; Spark, where it takes part, only writes Parquet files before it), so every
version of every table is claimed the one way delta-rs claims it: put-if-absent, a rename that does not replace on
a local disk, a conditional write (``If-None-Match``) on S3, atomic across processes and machines; checkpoints
are written by delta-rs alone.  :func:`create_table`, :func:`commit_added` (files already written, by Spark or
pyarrow, or written inside the commit's crash points), :func:`append_rows` (rows in Arrow), :func:`set_properties`,
:func:`overwrite_rows_where` (rows in Arrow), :func:`replace_files` (a rewrite Spark computed and wrote),
:func:`overwrite_added` (a whole table's files and columns replaced), :func:`add_columns`,
:func:`optimize`, :func:`vacuum`.  Each is observed as :mod:`reclock.points`'s commit ``tick``, ``publish``,
``compact``, ``compact-remap``, ``compact-reclocked``, ``backfill-repair`` or its app transaction's name; a Delta
conflict (another writer committed first, nothing committed here) is raised as
:class:`~reclock.storage.layout.ConcurrentWriteError` naming the table and what was not written.
"""
from __future__ import annotations

import json
import math
from contextlib import contextmanager

from deltalake import DeltaTable

from .. import points
from ..clock import now_ms
from .layout import ConcurrentWriteError

REMAP_APP, SINCE_APP, RECLOCKED_APP = "reclock.remap", "reclock.since", "reclock.reclocked"
LANDING_APP = "reclock.landing"  # version = number of landings
DEAD_LETTER_APP = "reclock.dead_letter"  # version = the last published IntoTime whose dead letters are in
#: The app transactions of a transactions step's two tables (:mod:`reclock.transactions`).
TXN_OUTPUT_APP, TXN_TEMP_APP = "reclock.txn_output", "reclock.txn_temp"

_POINTS = {REMAP_APP: "tick", RECLOCKED_APP: "publish", SINCE_APP: "compact"}  # their names in reclock.points
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
    properties), and one that removed files of the version ``dt`` read (a compaction's rewrite of rows before
    ``since``, an OPTIMIZE: delta-rs checks an append against every file of the version it read).  A step takes it
    as any lost race: a tick reads the table again, a compaction leaves the rest to the next one, a publish fails
    and the next run publishes.
    """
    from deltalake import CommitProperties, Transaction

    uri = dt.table_uri
    with points.commit(_POINTS.get(app_id, app_id), uri):
        if callable(added):
            added = added()
        with _app_conflicts(uri, app_id, version):
            dt.create_write_transaction(added, "append", dt.schema(), commit_properties=CommitProperties(
                app_transactions=[Transaction(app_id, version, now_ms())],
                custom_metadata=None if metadata is None else {"userMetadata": json.dumps(metadata, sort_keys=True)}))


def overwrite_added(dt: DeltaTable, added, schema, app_id: str, version: int) -> None:
    """Replace every row of the table ``dt`` was read at by ``added`` files (add actions of files written already)
    and its columns by ``schema``, with the app transaction ``app_id`` = ``version``, in one delta-rs commit; refused
    as :func:`commit_added` (:class:`ConcurrentWriteError`, nothing replaced)."""
    from deltalake import CommitProperties, Transaction

    uri = dt.table_uri
    with points.commit(_POINTS.get(app_id, app_id), uri), _app_conflicts(uri, app_id, version):
        dt.create_write_transaction(added, "overwrite", schema, commit_properties=CommitProperties(
            app_transactions=[Transaction(app_id, version, now_ms())]))


def add_columns(dt: DeltaTable, fields) -> None:
    """Add the nullable columns ``fields`` (Arrow fields, their metadata kept) to the table ``dt`` was read at, in
    one delta-rs commit (rows written before read them as NULL)."""
    from deltalake import Field

    with _delta_rs_conflicts(f"{dt.table_uri}: another writer committed while columns were added; none added"):
        dt.alter.add_columns([Field.from_arrow(f.with_nullable(True)) for f in fields])


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


def append_rows(dt: DeltaTable, rows, app_id: str, version: int) -> bool:
    """Append Arrow ``rows`` (possibly none: the app transaction alone) to the table ``dt`` was read at, in one
    delta-rs commit carrying the app transaction ``app_id`` = ``version``; False and nothing written when the
    stored version is already ``>= version``.  As :func:`commit_added`, a commit carrying ``app_id`` that landed
    since ``dt``'s version refuses it (:class:`ConcurrentWriteError`, nothing written)."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    if app_version(dt, app_id, -1) >= version:
        return False
    uri = dt.table_uri
    with points.commit(_POINTS.get(app_id, app_id), uri), _app_conflicts(uri, app_id, version):
        write_deltalake(dt, rows, mode="append", commit_properties=CommitProperties(
            app_transactions=[Transaction(app_id, version, now_ms())]))
    return True


def overwrite_rows_where(dt: DeltaTable, rows, predicate: str, point: str, raced: str) -> None:
    """Replace the rows matching ``predicate`` of the table ``dt`` was read at (and the caller read them at) by
    Arrow ``rows`` (every one must match it) in one delta-rs commit without an app transaction, never retried: any
    commit since ``dt``'s version refuses it (:class:`ConcurrentWriteError` saying ``raced``, nothing rewritten);
    observed as commit ``point``."""
    from deltalake import CommitProperties, write_deltalake

    with _delta_rs_conflicts(raced), points.commit(point, dt.table_uri):
        write_deltalake(dt, rows, mode="overwrite", predicate=predicate,
                        commit_properties=CommitProperties(max_commit_retries=0))


#: How many times :func:`replace_files` commits again after racing commits that left what it replaces alone.
REPLACE_ATTEMPTS = 10


def replace_files(dt: DeltaTable, removed: list[tuple[str, int]], added, covered, point: str, raced: str,
                  metadata: dict | None = None) -> None:
    """Replace files ``removed`` (``(path, size)`` of the table ``dt`` was read at: the files holding the rows a
    rewrite covers) by ``added`` (add actions of files written already, by Spark) in one delta-rs commit of
    ``remove`` and ``add`` actions without an app transaction; observed as commit ``point``.

    The version is claimed with put-if-absent and never taken over another writer's: when a commit landed since
    the snapshot, the latest snapshot is read and the commit tried again on it only if ``covered(latest)`` (the
    paths of the files holding rows the rewrite covers, by their statistics) is still exactly ``removed``'s and
    the table's schema, protocol and properties are the same: a racing publish or tick (rows outside what is
    rewritten) lets the rewrite through; a racing rewrite, OPTIMIZE or commit adding covered rows refuses it
    (:class:`ConcurrentWriteError` saying ``raced``, nothing rewritten), as do :data:`REPLACE_ATTEMPTS` lost
    claims in a row."""
    from deltalake import CommitProperties
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import RemoveAction

    uri, paths = dt.table_uri, {path for path, _ in removed}
    shape = _shape(dt)
    properties = CommitProperties(max_commit_retries=0, custom_metadata=None if metadata is None else {
        "userMetadata": json.dumps(metadata, sort_keys=True)})
    with points.commit(point, uri):
        stamp = now_ms()
        actions = [RemoveAction(path, True, stamp, size, {}) for path, size in removed] + list(added)
        for _ in range(REPLACE_ATTEMPTS):
            try:
                dt.create_write_transaction(actions, "append", dt.schema(), commit_properties=properties)
                return
            except CommitFailedError:
                read = dt.version()
                dt.update_incremental()  # was the version taken? may this rewrite go on over what landed?
                if dt.version() == read:
                    raise
            if _shape(dt) != shape or set(covered(dt)) != paths:
                break
        raise ConcurrentWriteError(raced)


def _shape(dt: DeltaTable) -> tuple:
    """What a rewrite's files depend on besides the rows: the table's schema, protocol and properties."""
    return dt.schema().to_json(), tuple(dt.protocol()), tuple(sorted(dt.metadata().configuration.items()))


@contextmanager
def _delta_rs_conflicts(message: str):
    """Raise :class:`ConcurrentWriteError` with ``message`` for a delta-rs commit another writer's refused."""
    from deltalake.exceptions import CommitFailedError

    try:
        yield
    except CommitFailedError as e:
        raise ConcurrentWriteError(f"{message} ({str(e).splitlines()[0]})") from None


@contextmanager
def _app_conflicts(uri: str, app_id: str, version: int):
    """Raise :class:`ConcurrentWriteError` for a commit carrying ``app_id`` that Delta's conflict check refused."""
    from deltalake.exceptions import CommitFailedError

    try:
        yield
    except CommitFailedError as e:
        if any(conflict in str(e) for conflict in _DELTA_RS_CONFLICTS):
            raise ConcurrentWriteError(f"{uri}: another writer committed {app_id} since this step read the table "
                                       f"(committing {app_id} = {version}); nothing written") from None
        if "concurrent transaction" in str(e):  # "a concurrent transaction deleted data this operation read": a
            # rewrite removed files of the version this commit read (seen in `make soak --part runs`, 2026-11-30)
            raise ConcurrentWriteError(f"{uri}: another writer committed since this step read the table "
                                       f"(committing {app_id} = {version}); nothing written") from None
        raise
