"""The ``reclocked`` collection (seed 000): source updates re-stamped with IntoTime through ``remap``.

An update is ``(data, partition, offset, diff)``; reclocked it becomes
``(data, partition, offset, into_time, diff)`` where ``into_time`` is the least
binding whose frontier covers ``(partition, offset)``.  Updates no binding
covers yet are beyond the frontier and are held back.  All updates at one
gauge value get the same IntoTime, and ``a <= b`` implies
``reclock(a) <= reclock(b)``.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Hashable, Iterable, NamedTuple

from .frontier import Partition
from .remap import Remap


class Update(NamedTuple):
    data: Hashable
    partition: Partition
    offset: int
    diff: int = 1


class Reclocked(NamedTuple):
    data: Hashable
    partition: Partition
    offset: int
    into_time: int
    diff: int


def reclock(updates: Iterable[Update | tuple], remap: Remap) -> list[Reclocked]:
    """Stamp each covered update with its IntoTime; drop those still beyond the frontier."""
    out = []
    for data, partition, offset, diff in updates:
        into_time = remap.into_time_of(partition, offset)
        if into_time is not None:
            out.append(Reclocked(data, partition, offset, into_time, diff))
    return out


def compact_updates(updates: Iterable[Reclocked | tuple], since: int) -> Counter:
    """Advance every IntoTime to at least ``since`` and consolidate: ``{(data, p, o, t): diff}``."""
    total: Counter = Counter()
    for data, partition, offset, into_time, diff in updates:
        total[(data, partition, offset, max(into_time, since))] += diff
    return Counter({k: v for k, v in total.items() if v})


def as_of(updates: Iterable[Reclocked | tuple], into_time: int) -> Counter:
    """The collection's contents at ``into_time``: ``{data: multiplicity}`` of updates at or before it."""
    total: Counter[Any] = Counter()
    for data, _p, _o, t, diff in updates:
        if t <= into_time:
            total[data] += diff
    return Counter({k: v for k, v in total.items() if v})
