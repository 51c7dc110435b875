"""What the compaction step does after compacting a source's tables (:func:`reclock.pipeline.compact` calls them):
prune a landing below ``remap[since]`` (:func:`prune_landing`) and retire the partitions that ended
(:func:`retire`).  Each is idempotent, and one that loses a race to another writer leaves its work to the next
compaction.
"""
from __future__ import annotations

import logging

from .engine import Frontier
from .engine.upstream import retirable
from .runtime import Runtime, SourceContext
from .sources import source_class
from .sources.base import Retiring, SourceError, offers
from .storage import ConcurrentWriteError

log = logging.getLogger("reclock")


def prune_landing(name: str, ctx: SourceContext) -> int:
    """Prune the landing below ``remap[since]`` (:meth:`reclock.storage.LandingTables.prune_landed`: a landing
    source's stays bounded); the files removed.  A racing prune is logged, and the next compaction prunes."""
    remap = ctx.tables.read_remap()
    try:
        removed = ctx.tables.prune_landed(remap.at(remap.since))
    except ConcurrentWriteError as e:
        log.warning("%s: pruning the landing lost a race (%s); the next compaction prunes", name, e)
        return 0
    if removed:
        log.info("%s: pruned %d landing files below remap[%d] = %s", name, removed, remap.since, remap.at(remap.since))
    return removed


def retire(name: str, runtime: Runtime) -> int:
    """Retire the partitions read whole and held by nothing upstream (a source offering
    :class:`~reclock.sources.base.Retiring`: rotated-away files; :mod:`reclock.engine.upstream`, "Retirement");
    how many.  A racing tick or compaction, or an upstream that cannot be looked at now, leaves it to the next
    compaction."""
    if not offers(source_class(runtime.config.source(name).kind), Retiring):
        return 0
    with runtime.source(name) as ctx:
        record, remap = ctx.tables.upstream_record(), ctx.tables.read_remap()
        try:
            held = ctx.source.held_partitions()
            retired = (Frontier() if held is None or record is None or remap.since >= remap.upper else
                       retirable(remap.at(remap.since), remap.frontier, ctx.source.committed(), held))
            if retired.partitions:
                ctx.tables.retire(record, retired)
        except (SourceError, ConcurrentWriteError) as e:
            log.warning("%s: retiring ended partitions failed (%s); the next compaction retires them", name, e)
            return 0
    if retired.partitions:
        names = ", ".join(map(str, retired.partitions[:10])) + (" ..." if len(retired.partitions) > 10 else "")
        log.info("%s: retired %d partitions read whole and gone upstream: %s", name, len(retired.partitions), names)
    return len(retired.partitions)
