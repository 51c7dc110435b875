"""The steps for an upstream that changed under a source (docs/upstream-changes.md): going on without records it
released before they were read, and a new epoch on a replaced upstream.

The law (seed 001's remap, :mod:`reclock.engine.upstream`, "Epochs"): remap stays monotone and what was published
stays as it is, so every query AS OF an earlier IntoTime answers as before.  A gap accepted as lost moves the start
frontier past it and is recorded with remap, with the IntoTimes its offsets were bound at.  A new epoch shifts the
new upstream's offsets by an offset base, remap's frontier when it begins, so the ticks from then on bind its
records at later IntoTimes; a source that takes snapshots (Postgres) begins one from a fresh snapshot instead, its
differences with the published history published as corrections.  Each records itself in one commit of remap's
properties, refused when a tick committed meanwhile.
"""
from __future__ import annotations

import logging

from .clock import now_ms
from .engine import Frontier, Remap
from .engine.upstream import (identity_problems, lost_ranges, new_epoch_problems, past_gaps, released_by,
                              replacement_problems, to_gauge)
from .pipeline import UPSTREAM_HELP, published_frontier, upstream_record_of
from .runtime import Runtime, SourceContext, Where
from .sources.base import SourceError, Snapshotting, identity_of, offers, released_frontier, starting_frontier
from .storage import ConcurrentWriteError, UpstreamRecord

log = logging.getLogger("reclock")


def accept_lost(name: str, runtime: Where = None, spark=None) -> dict:
    """Go on without the records the upstream released before reclock read them: the start frontier moves
    past them (:func:`reclock.engine.upstream.past_gaps`) and the gap is recorded with remap, with the
    IntoTimes the lost offsets were bound at (None: never bound).  A replaced upstream (another identity, a
    partition ending below what was bound) serves none of the bound records it replaced
    (:func:`reclock.engine.upstream.released_by`): the unpublished ones are lost, before a new epoch."""
    with Runtime.of(runtime, spark).source(name, create=True) as ctx:
        remap = ctx.tables.read_remap()
        record = upstream_record_of(name, ctx, remap)
        same = not identity_problems(record.identity, identity_of(ctx.source))
        released = released_by(remap.frontier, ctx.source.upper().join(ctx.tables.landed()),
                               released_frontier(ctx.source), same)
        lost = lost_ranges(published_frontier(remap, ctx.tables), record.start, released)
        gaps = [{"partition": r.partition, "start": r.start, "end": r.end, "recorded_at": now_ms(),
                 "bound_at": [remap.into_time_of(r.partition, r.start), remap.into_time_of(r.partition, r.end - 1)]}
                for r in lost]
        if gaps:
            ctx.tables.record_upstream(record._replace(start=past_gaps(record.start, lost), gaps=record.gaps + gaps))
            log.warning("%s: going on without records lost upstream: %s", name, gaps)
        return {"lost": gaps}


def new_epoch(name: str, runtime: Where = None, spark=None, drop_slot: bool = False) -> dict:
    """Start the source over on its current upstream as a new epoch, keeping what was published.

    A source that takes snapshots (Postgres) starts over from a fresh one instead: :func:`_new_snapshot_epoch`
    (``drop_slot``: replace a slot that still exists).

    For an upstream that replaced the one remap bound (a Kafka topic deleted and recreated: another
    topic ID, offsets from 0 again, perhaps fewer partitions).  Its offsets are shifted by an offset base,
    remap's frontier now (:mod:`reclock.engine.upstream`, "Epochs"): remap stays monotone, the published
    rows and every query AS OF an earlier IntoTime stay as they are, and the ticks from now on bind the new
    upstream's records from its start (Kafka: ``starting_offsets``) at later IntoTimes.  One commit of
    remap's properties: the new start and identity, and the epoch appended to ``reclock.epochs``.

    Refused, writing nothing (:class:`SourceError`): before the first binding; when the upstream is still
    the stream remap bound (its identity did not change; without one, no partition ends below what was
    bound); for offsets stored as strings; and while bound records are not published: only the replaced
    upstream could serve them, so publish them first if it still does, or record them as lost with
    ``reclock accept-lost`` (an upstream with another identity serves none of them).
    """
    from . import offsets

    with Runtime.of(runtime, spark).source(name, create=True) as ctx:
        remap = ctx.tables.read_remap()
        record = ctx.tables.upstream_record()
        where = f"{name} ({ctx.upstream!r}): no new epoch begun, nothing written"
        if record is None or not remap.bindings:
            raise SourceError(f"{where}: nothing is bound yet (its first tick starts it on the current upstream)")
        if offers(ctx.upstream, Snapshotting):
            return _new_snapshot_epoch(name, ctx, remap, record, drop_slot)
        if drop_slot:
            raise SourceError(f"{where}: --drop-slot is for sources with a replication slot, not {ctx.upstream!r}")
        if ctx.tables.offset_type != offsets.INT64:
            raise SourceError(f"{where}: its offsets are stored as {ctx.tables.offset_type}; epochs shift int64 "
                              "offsets only (configure the new upstream as a new source)")
        identity = identity_of(ctx.upstream)
        replaced = replacement_problems(record.identity, identity, remap.frontier,
                                        ctx.source.upper().join(ctx.tables.landed()))
        if not replaced:
            raise SourceError(f"{where}: the upstream is still the stream remap has bound (same identity "
                              f"{identity}); ticks go on binding it ({UPSTREAM_HELP})")
        published = ctx.tables.reclocked_upper()
        if unread := new_epoch_problems(remap.ranges(published), record.start):
            raise SourceError(
                f"{where}: {'; '.join(unread)}, and only the replaced upstream could serve them. Publish them first "
                f"if it still does (reclock stage, check, publish), or `reclock accept-lost {name}` records them "
                "as lost and goes on without them")
        base = remap.frontier
        start = to_gauge(starting_frontier(ctx.upstream), base)
        epoch = {"began_at": remap.upper, "base": [list(pair) for pair in base], "identity": identity,
                 "start": [list(pair) for pair in start], "recorded_at": now_ms(),
                 "replaced": {"identity": record.identity, "start": [list(pair) for pair in record.start],
                              "why": replaced}}
        if ctx.tables.remap_upper() != remap.upper:  # a tick committed since remap was read: look again
            raise ConcurrentWriteError(f"{where}: a tick committed to remap meanwhile; run it again")
        ctx.tables.record_upstream(record._replace(start=start, identity=identity, epochs=record.epochs + [epoch]))
        log.warning("%s: epoch %d begins at IntoTime %d on %s: offset base %s, history from %s (was %s)", name,
                    len(record.epochs) + 1, remap.upper, identity, base, start, record.identity)
        return {"epoch": len(record.epochs) + 1, "began_at": remap.upper, "base": base.as_json(),
                "start": start.as_json(), "identity": identity, "replaced": record.identity}


def _new_snapshot_epoch(name: str, ctx: SourceContext, remap: Remap, record: UpstreamRecord,
                        drop_slot: bool) -> dict:
    """A source that takes snapshots started over from a fresh one (Postgres: a lost slot, a schema change it
    cannot follow).

    The source makes way for it (:meth:`reclock.sources.postgres.PostgresSource.begin_new_epoch`: the old slot
    dropped, or a snapshot that landed unrecorded recorded). Then a new slot is created with an exported snapshot at
    its consistent point ``C`` (after every LSN remap bound: the gauge goes on, no offset base). Every table's
    snapshot is landed as partition ``<table>@<C>`` with a resync marker at offset 0 (:mod:`reclock.truncate`):
    staging replaces it by the difference between what the table held AS OF the published history and the snapshot,
    so the next IntoTime publishes those corrections (retractions and insertions) and every query AS OF an earlier
    IntoTime is unchanged. The changes' partition starts at ``C``: the changes before it that were never published
    are not read one by one (the old slot is gone, or replaced); the gap ``[published, C)`` is recorded, with the
    snapshot that corrected it. Then the epoch is recorded with remap (one commit of its properties).

    Killed after the landing, a new epoch run again records it.
    """
    from .spark.source import read_ranges_python

    source, where = ctx.upstream, f"{name} ({ctx.upstream!r})"
    bound = remap.frontier[""]
    if (landed := source.begin_new_epoch(name, bound, record.start[""], ctx.tables.landed().partitions,
                                         drop_slot)) is not None:
        return _record_snapshot_epoch(name, ctx, remap, record, landed)
    with source.export_snapshot() as snapshot:
        consistent = snapshot.consistent_lsn
        if consistent < bound:
            raise SourceError(f"{where}: the new slot's consistent point {consistent} is below remap's bound LSN "
                              f"{bound}: the server's WAL went back (restored from a backup?); nothing landed. "
                              "Configure it as a new source")
        uppers = snapshot.every_table()
        rows = read_ranges_python(ctx.spark, {**ctx.spec, "exported": snapshot.spec},
                                  [(0, p, 0, u) for p, u in snapshot.uppers.items()])
        markers = [{**data, "partition": p, "offset": offset, "into_time": 0, "diff": diff}
                   for p, data, offset, diff in source.resync_markers(snapshot)]
        rows = rows.unionByName(ctx.spark.createDataFrame(markers, rows.schema))
        log.info("%s: landing the snapshot of a new epoch at %s: %s", where, consistent,
                 ", ".join(f"{p} (upper {u})" for p, u in uppers.items()))
        ctx.tables.land(rows, Frontier.of(uppers))
    return _record_snapshot_epoch(name, ctx, remap, record, consistent)


def _record_snapshot_epoch(name: str, ctx: SourceContext, remap: Remap, record: UpstreamRecord,
                           consistent: int) -> dict:
    """Record a new epoch begun from the snapshot at ``consistent`` (:func:`_new_snapshot_epoch`)."""
    published = published_frontier(remap, ctx.tables)
    skipped = max(published[""], record.start[""])
    start = record.start.join(Frontier.of({"": consistent}))
    gaps = [{"partition": "", "start": skipped, "end": consistent, "recorded_at": now_ms(),
             "bound_at": [remap.into_time_of("", skipped), remap.into_time_of("", consistent - 1)],
             "corrected_by_snapshot_at": consistent}] if consistent > skipped else []
    epoch = {"began_at": remap.upper, "base": [], "identity": record.identity, "snapshot_at": consistent,
             "start": [list(pair) for pair in start], "recorded_at": now_ms(),
             "replaced": {"identity": record.identity, "start": [list(pair) for pair in record.start],
                          "why": ["a fresh snapshot replaces the replication slot's changes"]}}
    if ctx.tables.remap_upper() != remap.upper:  # a tick committed since remap was read: look again
        raise ConcurrentWriteError(f"{name}: a tick committed to remap meanwhile; run new-epoch again (the "
                                   "landed snapshot is kept)")
    ctx.tables.record_upstream(record._replace(start=start, gaps=record.gaps + gaps, epochs=record.epochs + [epoch]))
    log.warning("%s: epoch %d begins at IntoTime %d from the snapshot at %s; changes [%d, %d) not read one by one",
                name, len(record.epochs) + 1, remap.upper, consistent, skipped, consistent)
    return {"epoch": len(record.epochs) + 1, "began_at": remap.upper, "snapshot_at": consistent,
            "start": start.as_json(), "gaps": gaps}
