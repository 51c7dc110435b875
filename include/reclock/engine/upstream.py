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
frontier moves past them, ``S' = S join R`` (:func:`past_gaps`), and the gap is recorded.
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
    return [f"{key} was {recorded[key]!r} when remap began, now {current.get(key)!r}"
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


def _name(partition) -> str:
    return repr(partition) if isinstance(partition, str) else str(partition)
