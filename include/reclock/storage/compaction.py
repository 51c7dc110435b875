"""Compaction of a source's tables to ``since`` (:meth:`CompactingTables.compact`): ``since`` recorded first (app
``reclock.since`` on remap, so queries before it are refused from then on), then remap's and reclocked's rows at or
before ``since`` rewritten as one row per partition (remap) and per record (reclocked) at ``since``, each in one
delta-rs commit, then small files merged and replaced files vacuumed.  Every step is idempotent: a
compaction killed part-way, or one whose rewrite a racing commit made Delta refuse, is finished by the next; a
query sees the same rows throughout.
"""
from __future__ import annotations

import logging
import math

import pyarrow.compute as pc

from .. import offsets
from ..clock import now_ms
from ..engine import Frontier, Increment
from . import commits
from .commits import SINCE_APP
from .files import read_rows
from .layout import KINDS, VACUUMED, ConcurrentWriteError, Kind, WarehouseError
from .side_files import write_json
from .tables import Tables, retired_of

log = logging.getLogger("reclock")

#: How long VACUUM keeps the files a compaction replaced unless told otherwise (Delta's own default, 7 days).
VACUUM_RETENTION_HOURS = 168.0
#: A compaction rewrite that a racing commit (a tick's rows, another compaction) made Delta refuse.
_REWRITE_RACED = ("{uri}: another writer committed while compaction rewrote the rows up to since; nothing rewritten "
                  "(the next compaction does it)")


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


class CompactingTables(Tables):
    """Compaction of a source's tables."""

    def compact(self, since: int, retention_hours: float = VACUUM_RETENTION_HOURS, *,
                offsets_unique: bool = False) -> None:
        """Compact both tables to ``since``; every step is idempotent, so rerun after a crash, or after a rewrite
        that a racing commit made Delta refuse (:class:`~reclock.storage.layout.ConcurrentWriteError`: nothing of
        it rewritten).

        1. record ``since`` (queries before it are refused from then on);
        2. fold remap increments at or before ``since`` into one row per partition at ``since``;
        3. advance reclocked IntoTimes to ``since`` there and consolidate diffs (in Spark; without a shuffle
           when ``offsets_unique``: see :meth:`_consolidate_reclocked`);
        4. optimize (merge the files below ``OPTIMIZE_MIN_FILE_BYTES`` of a table with more than
           ``SMALL_FILES_MAX`` of them, as a tick does remap's) and vacuum files
           removed more than ``retention_hours`` ago, in the dead-letter table too (its rows are all kept) and the
           landing (pruned by :func:`reclock.pipeline.compact`, never merged: a prune removes whole files);
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
        if stored < since:  # one delta-rs commit of the app transaction alone
            commits.commit_added(self.table("remap"), [], SINCE_APP, since)
        self._consolidate_remap(since)
        self._consolidate_reclocked(since, offsets_unique)
        others = tuple(k for k in ("dead_letter", "landing") if self._table_or_none(k) is not None)
        vacuumed = self.vacuumed()
        for kind in KINDS + others:  # the dead letters are kept whole: merged only (a file per publish)
            if kind != "landing" and self._has_many_small_files(kind):  # landing: pruned a landing's file at once
                self._optimize(kind)
            started = now_ms()
            if vacuum_due(vacuumed.get(kind), started, retention_hours):
                self._vacuum(kind, retention_hours)
                vacuumed[kind] = started
                write_json(self.uri, VACUUMED, vacuumed, self.storage_options)

    def retire(self, record, retired: Frontier) -> None:
        """Retire the partitions ``retired`` (at their bound offsets: :func:`reclock.engine.upstream.retirable`):
        recorded first, joined with those retired before, in the upstream record ``record`` (one commit of
        remap's properties, refused by any commit since ``record`` was read: a racing tick or compaction), then
        their rows dropped from remap by the compaction rewrite of the rows up to ``since`` (refused likewise).
        Killed in between, remap is read without them already (:meth:`read_remap`) and the next compaction drops
        the rows; a :class:`~reclock.storage.layout.ConcurrentWriteError` from either leaves it to the next."""
        if self.upstream_record() != record:  # type: ignore[attr-defined]  (UpstreamTables, in SourceTables)
            raise ConcurrentWriteError(f"{self.uri}: the upstream record changed since compaction read it; nothing "
                                       "retired")
        self.record_upstream(record._replace(retired=record.retired.join(retired)))  # type: ignore[attr-defined]
        self._consolidate_remap(self.since())

    def _vacuum(self, kind: Kind, retention_hours: float) -> None:
        """Delete the table's files removed more than ``retention_hours`` ago (:func:`~reclock.storage.commits.vacuum`)."""
        commits.vacuum(self.table(kind), retention_hours)

    def vacuumed(self) -> dict[str, int]:
        """When compaction last vacuumed each table (ms by kind, from ``<source>/vacuumed.json``): {} before any,
        or when the record cannot be read (then every table is due: a VACUUM too many is only time)."""
        try:
            record = self._read_json(VACUUMED)
        except ValueError as e:
            log.warning("%s: unreadable %s (%s): vacuuming every table", self.uri, VACUUMED, e)
            return {}
        return {k: v for k, v in record.items() if isinstance(v, int)} if isinstance(record, dict) else {}

    def _consolidate_remap(self, since: int) -> bool:
        """Rewrite remap rows at or before ``since`` as one row per partition at ``since``, none for a retired
        partition (:meth:`retire`); False if already so.

        Remap is small (one row per partition and tick), and big offsets must sum exactly: the
        rows are folded in Python (:meth:`Remap.compact`) and written back in one delta-rs overwrite, no JVM.
        """
        dt = self.table("remap")
        old, retired = read_rows(dt, self.schemas["remap"], pc.field("into_time") <= since), retired_of(dt)
        folded: dict = {}
        for partition, amount in zip(old["partition"].to_pylist(), offsets.from_arrow(old["increment"])):
            folded[partition] = folded.get(partition, 0) + amount
        new = [(p, since, amount) for p, amount in folded.items() if amount and not retired[p]]
        if len(new) == old.num_rows and (old.num_rows == 0 or pc.min(old["into_time"]).as_py() == since):
            return False
        rows = self._remap_rows(Increment(p, t, a) for p, t, a in new)
        commits.overwrite_rows_where(dt, rows, f"into_time <= {since}", "compact-remap",
                                     _REWRITE_RACED.format(uri=dt.table_uri))
        return True

    def _consolidate_reclocked(self, since: int, offsets_unique: bool = False) -> bool:
        """Rewrite reclocked rows at or before ``since`` as ``sum(diff)`` per record at ``since`` (Spark computes
        and writes the files, delta-rs commits them: :meth:`~reclock.storage.tables.Tables._rewrite`); False if
        already so.

        A record is its data, ``partition`` and ``offset``.  With ``offsets_unique`` (a source with one record
        per offset: its published batches passed the ``reclocked_keys`` check, and bindings cover disjoint
        offset ranges) no two rows share ``(partition, offset)``, so each record is one row and its sum is its
        ``diff``: the rows are rewritten as they are (a scan, no shuffle), those with a zero ``diff`` dropped.
        """
        from pyspark.sql import functions as F

        def consolidated(df):
            stats = df.agg(F.count(F.lit(1)).alias("n"), F.min("into_time").alias("lo")).first()
            if stats["n"] == 0:
                return None
            keys = self.data_columns + ["partition", "offset"]
            summed = df if offsets_unique else df.groupBy(*keys).agg(F.sum("diff").alias("diff"))
            rows = summed.where(F.col("diff") != 0).withColumn("into_time", F.lit(since).cast("long"))
            return None if stats["lo"] == since and rows.count() == stats["n"] else rows

        uri = self.table_uri("reclocked")
        return self._rewrite("reclocked", None, since, consolidated, "compact-reclocked",
                             _REWRITE_RACED.format(uri=uri), {"operation": "reclock compaction", "since": since})
