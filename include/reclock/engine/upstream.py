"""Is the upstream still the stream remap has bound?  (Topic lifecycle, retention, where a source starts.)

A source's history begins at its *start frontier* ``S``, read once at its first tick and recorded
with remap (Kafka: ``starting_offsets``; a Postgres slot: its consistent point): records below ``S``
are not part of the collection, so every range read is clipped to it::

    read(p, r) = [max(r.start, S[p]), r.end)            (empty when r.end <= S[p])

With ``B`` remap's frontier, ``U`` the upstream's upper, ``R`` what upstream released (no longer
holds: Kafka's log start offsets), ``I0`` the identity recorded with remap and ``I`` the upstream's
identity now, a tick may bind ``U`` only when

    identity     I0 = I                   (a Kafka topic deleted and recreated has another topic ID)
    regression   U[p] >= B[p]  for all p  (fewer partitions, a truncated log, a reset position)
    nothing lost R[p] <= max(B[p], S[p])  (records upstream released before any tick bound them)

and a window of bindings from IntoTime ``t`` may be read only when ``R[p] <= max(remap[t-1][p], S[p])``
(retention overtook records bound but not yet published).  Each broken law is reported with the
partition and offsets; nothing is written.  Going on without lost records is explicit: the start
frontier moves past them, ``S' = S join R`` (:func:`past_gaps`), and the gap is recorded.  An upstream
that was replaced serves none of what remap bound from its predecessor (:func:`released_by`)::

    R' = B                                    the identity changed
    R' = R join {p: B[p] | U[p] < B[p]}       a partition now ends below what was bound (truncated, gone)

**Epochs.**  A replaced upstream (a topic deleted and recreated: another topic ID, offsets from 0
again, perhaps fewer partitions) can be started over as a new *epoch* of the same source
(``reclock new-epoch``).  The gauge stays one monotone gauge: each epoch has an *offset base*
``b``, remap's frontier ``B`` when the epoch began, and the upstream's own offsets ``u`` are shifted by it::

    gauge offset       g = b[p] + u                         (read, staging, backfill: u = g - b[p])
    gauge frontier     G[p] = b[p] + U[p]   for p in b or U  (upper, released, committed, start)
    upstream frontier  U[p] = G[p] - b[p]   where positive  (the consumer-group commit of ``resume``)

An offset ``g < b[p]`` belongs to an earlier epoch: it is never read from the current upstream
(:func:`earlier_epoch_problems`).  A partition the new upstream lacks stays at ``b[p]``, so fewer
partitions need no rule of their own.  The epoch begins at IntoTime ``E`` = remap's upper then: every
binding before ``E`` is the old stream's and stays as published (queries AS OF them are unchanged), every
later one binds a frontier ``>= b = B`` (remap stays monotone, the start is ``S' = b + S_new``).  A new
epoch may begin only when the upstream was replaced (:func:`replacement_problems`: another identity, or
with none to compare a partition ending below ``B``; a same-identity upstream that only lost records is
the same stream, whose records a new epoch would read twice) and no bound offsets are left to read from
the old upstream: every unpublished range lies below ``S`` (:func:`new_epoch_problems`; accept-lost moves
``S`` past them).  A window replays from the upstream only
when it holds no earlier epoch's records: ``E = 0`` (no epoch yet), or ``t0 >= E`` and ``t0 > since``
(the binding at ``since`` folds all history).

Why a base and not another design: a new source name splits one collection in two (every query and
join must union them); restarting remap's offsets at 0 breaks monotonicity and makes published
``(partition, offset)`` pairs ambiguous; an epoch column in the partition key changes the schema of
both tables.  The base keeps every law, check and query as it is, at the cost of translating offsets
where reclock talks to the upstream (:class:`reclock.sources.epoch.EpochSource`, ``read_ranges``).

**Retirement.**  Some partitions end: a file rotated away and deleted holds nothing more, ever.  Left in
remap, each would stay in every later frontier, so a log rotated daily would add a partition a day to every
tick, stage and check.  A partition ``p`` is *retirable* at compaction to ``since`` (:func:`retirable`) when

    bound once     B[p] = remap[since][p] > 0    (no binding after since moved it: it ended before since)
    read whole     C[p] >= B[p]                  (committed upstream: every bound record is published)
    gone           p is held by nothing upstream (no file holds its identity)

Compaction records ``T`` (``p -> B[p]``, joined with the earlier retired) with the upstream record, then drops
``p``'s rows from remap: remap's frontier holds the live partitions only, and every binding in
``[since, upper)`` lacks ``p`` (the ones before are compacted away), so remap stays monotone.  From then on
the source is seen through ``T`` (:func:`live`): ``p`` is hidden from the upstream's upper, released,
committed and start frontiers, so neither a stale commit nor a late copy binds it again, and a retired
partition back with records beyond what was read, ``U[p] > T[p]``, is refused (:func:`back_problems`):
remap no longer has ``p``, so those records would be read from offset 0, the published ones twice.  The
published rows of ``p`` stay (the binding at ``since`` holds them); only a replay of that folded binding,
which would need every file again, is refused.
"""
from __future__ import annotations

from typing import Iterable, Mapping

from .frontier import Frontier
from .remap import Range


def clip_ranges(ranges: Iterable[Range], start: Frontier) -> list[Range]:
    """The ranges without the offsets below the start frontier (dropping ranges left empty)."""
    return [r._replace(start=max(r.start, start[r.partition])) for r in ranges if r.end > start[r.partition]]


def identity_problems(recorded: Mapping[str, str] | None, current: Mapping[str, str] | None) -> list[str]:
    """How the upstream's identity differs from the recorded one (nothing to compare: no problem)."""
    if not recorded or not current:
        return []
    return [f"{key} was {recorded[key]!r} when remap's epoch began, now {current.get(key)!r}"
            for key in sorted(recorded) if current.get(key) != recorded[key]]


def regression_problems(bound: Frontier, upper: Frontier) -> list[str]:
    """Partitions whose upstream upper is below what remap has bound (0: the partition is gone)."""
    return [f"partition {_name(p)}: upstream upper {upper[p]} is below the bound offset {offset}"
            + (" (the partition no longer exists)" if upper[p] == 0 else "")
            for p, offset in bound if upper[p] < offset]


def lost_ranges(needed: Frontier, start: Frontier, released: Frontier) -> list[Range]:
    """Offsets upstream released that are still needed: ``[max(needed, start), released)`` per partition
    (as ranges at IntoTime -1: the caller knows at which IntoTimes they were bound, if they were)."""
    return [Range(-1, p, max(needed[p], start[p]), gone) for p, gone in released if gone > max(needed[p], start[p])]


def lost_problems(needed: Frontier, start: Frontier, released: Frontier) -> list[str]:
    return [f"partition {_name(r.partition)}: offsets [{r.start}, {r.end}) were released upstream before they were read"
            for r in lost_ranges(needed, start, released)]


def past_gaps(start: Frontier, lost: Iterable[Range]) -> Frontier:
    """The start frontier moved past ``lost`` offsets, for a source to go on without them (the gap is recorded)."""
    return start.join(Frontier.of({r.partition: r.end for r in lost}))


def tick_problems(bound: Frontier, start: Frontier, upper: Frontier, released: Frontier,
                  recorded_identity: Mapping[str, str] | None, identity: Mapping[str, str] | None) -> list[str]:
    """Every law above that binding ``upper`` now would break (empty: the tick may bind it)."""
    return (identity_problems(recorded_identity, identity) + regression_problems(bound, upper)
            + lost_problems(bound, start, released))


def released_by(bound: Frontier, upper: Frontier, released: Frontier, same_identity: bool) -> Frontier:
    """What the upstream no longer serves of what remap bound (``R'`` above): all of it when it was replaced."""
    if not same_identity:
        return bound
    return released.join(Frontier.of({p: offset for p, offset in bound if upper[p] < offset}))


# --- epochs ---------------------------------------------------------------------------------------


def to_gauge(upstream: Frontier, base: Frontier) -> Frontier:
    """``G[p] = b[p] + U[p]`` over the partitions of either: an upstream frontier in the source's gauge."""
    return Frontier.of({p: base[p] + upstream[p] for p in {*base.partitions, *upstream.partitions}})


def to_upstream(gauge: Frontier, base: Frontier) -> Frontier:
    """``U[p] = G[p] - b[p]`` where positive: a gauge frontier in the current upstream's offsets."""
    return Frontier.of({p: offset - base[p] for p, offset in gauge if offset > base[p]})


def earlier_epoch_problems(ranges: Iterable[Range], base: Frontier) -> list[str]:
    """Non-empty gauge ranges reaching below the base: offsets of an earlier epoch's upstream."""
    return [f"partition {_name(r.partition)}: offsets [{r.start}, {r.end}) (IntoTime {r.into_time}) are below the "
            f"epoch's offset base {base[r.partition]}: an earlier upstream's records, not the current one's"
            for r in ranges if r.start < base[r.partition] and r.start < r.end]


def upstream_ranges(ranges: Iterable[Range], base: Frontier) -> list[Range]:
    """Non-empty gauge ranges as the current upstream's offsets ``[g - b[p], ...)`` (check
    :func:`earlier_epoch_problems` first)."""
    return [r._replace(start=r.start - base[r.partition], end=r.end - base[r.partition])
            for r in ranges if r.start < r.end]


def replacement_problems(recorded_identity: Mapping[str, str] | None, identity: Mapping[str, str] | None,
                         bound: Frontier, upper: Frontier) -> list[str]:
    """How the upstream shows it replaced the stream remap bound (empty: it did not, no new epoch): another
    identity, or, with no identities to compare, a partition ending below what was bound.  A same-identity
    upstream that only lost records (retention, a truncated log) is not another stream: a new epoch would
    read what it still holds a second time."""
    if recorded_identity and identity:
        return identity_problems(recorded_identity, identity)
    return regression_problems(bound, upper)


def new_epoch_problems(unpublished: Iterable[Range], start: Frontier) -> list[str]:
    """Bound, unpublished offsets that only the replaced upstream could serve (those above the start ``S``)."""
    return [f"partition {_name(r.partition)}: offsets [{r.start}, {r.end}) bound at IntoTime {r.into_time} are "
            "not published" for r in clip_ranges(unpublished, start)]


def replay_problem(start: int, since: int, began_at: int) -> str | None:
    """Why a window from IntoTime ``start`` holds an earlier epoch's records (None: it does not)."""
    if began_at == 0 or start >= began_at and start > since:
        return None
    if start < began_at:
        return f"IntoTimes before {began_at} belong to an earlier epoch of the source, whose upstream was replaced"
    return (f"the binding at since = {since} folds the records of every epoch, and those of earlier epochs' "
            f"upstreams cannot be read again; start the window after {since}")


# --- retirement -----------------------------------------------------------------------------------


def retirable(at_since: Frontier, bound: Frontier, committed: Frontier, held: Iterable) -> Frontier:
    """The partitions retired by a compaction to ``since``, at their bound offsets (``T`` above): bound at since
    (``at_since = remap[since]``) and not moved after (``bound``, remap's frontier), committed that far, and held
    by nothing upstream."""
    held = set(held)
    return Frontier.of({p: offset for p, offset in at_since
                        if bound[p] == offset and committed[p] >= offset and p not in held})


def live(frontier: Frontier, retired: Frontier) -> Frontier:
    """``frontier`` without the retired partitions (the upstream as remap sees it)."""
    return Frontier.of({p: offset for p, offset in frontier if not retired[p]}) if retired.partitions else frontier


def back_problems(upper: Frontier, retired: Frontier, names: Mapping | None = None) -> list[str]:
    """Retired partitions the upstream holds again with records beyond what was read (``U[p] > T[p]``), each with
    its name when ``names`` has one (a file's key)."""
    names = names or {}
    return [f"partition {_name(p)}{f' ({names[p]})' if p in names else ''} was retired at offset {retired[p]} (read "
            f"whole, gone upstream, compacted) and is back with records up to {offset}"
            for p, offset in upper if retired[p] and offset > retired[p]]


def _name(partition) -> str:
    return repr(partition) if isinstance(partition, str) else str(partition)
