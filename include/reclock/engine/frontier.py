"""Frontiers: what a stream has finished, over partitioned gauges and general partial orders.

Every gauge of progress reclock supports is *partitioned*: a time is a pair
``(partition, offset)`` and two times are comparable only within one partition
(Kafka ``(partition, offset)``, files ``(key, byte offset)``, Kinesis
``(shard, sequence)``; Postgres is one partition ``""`` whose offsets are LSNs).

A :class:`Frontier` is the antichain of the least times still to come: one
``upper`` per partition, the next offset that may yet appear.  Partitions it
does not list are at offset 0, so a partition that appears later is already
covered by every earlier frontier and never breaks monotonicity (seed 000's
open question).  Seed 001 calls the remap entry "offsets 0-42 inclusive";
here the same fact is written ``upper = 43``, the first offset *not* complete,
which is also what Kafka commits as a consumer group offset.

:class:`Antichain` is the general form over any partial order (ints, or tuples
compared component-wise), used by CDC v2 where times are explicit.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Hashable, Iterable, Iterator, Mapping

Partition = Hashable


class FrontierError(ValueError):
    """A frontier or gauge value that cannot be valid (negative offset, wrong shape)."""


@dataclass(frozen=True)
class Frontier:
    """Per-partition upper frontier; absent partitions are at offset 0."""

    uppers: tuple[tuple[Partition, int], ...] = ()

    @classmethod
    def of(cls, uppers: Mapping[Partition, int] | Iterable[tuple[Partition, int]] = ()) -> "Frontier":
        """Build from ``{partition: upper}``; zero uppers are dropped (they are the default)."""
        items = uppers.items() if isinstance(uppers, Mapping) else uppers
        merged: dict[Partition, int] = {}
        for partition, upper in items:
            if isinstance(upper, bool) or not isinstance(upper, int):
                raise FrontierError(f"upper of partition {partition!r} must be an int, got {upper!r}")
            if upper < 0:
                raise FrontierError(f"upper of partition {partition!r} is negative: {upper}")
            if partition in merged:
                raise FrontierError(f"partition {partition!r} given twice")
            merged[partition] = upper
        return cls(tuple(sorted(((p, u) for p, u in merged.items() if u), key=lambda i: partition_sort_key(i[0]))))

    def __getitem__(self, partition: Partition) -> int:
        return self._by_partition.get(partition, 0)

    def __iter__(self) -> Iterator[tuple[Partition, int]]:
        return iter(self.uppers)

    @cached_property
    def _by_partition(self) -> dict[Partition, int]:
        return dict(self.uppers)

    def as_dict(self) -> dict[Partition, int]:
        return dict(self._by_partition)

    @property
    def partitions(self) -> tuple[Partition, ...]:
        return tuple(p for p, _ in self.uppers)

    def covers(self, partition: Partition, offset: int) -> bool:
        """True when ``(partition, offset)`` is not beyond this frontier: the record is complete."""
        return offset < self[partition]

    def less_equal(self, other: "Frontier") -> bool:
        """The partial order on frontiers: ``other`` has finished at least what ``self`` has."""
        return all(upper <= other[p] for p, upper in self.uppers)

    def meet(self, other: "Frontier") -> "Frontier":
        """Greatest frontier below both (per-partition minimum)."""
        return Frontier.of({p: min(u, other[p]) for p, u in self.uppers})

    def join(self, other: "Frontier") -> "Frontier":
        """Least frontier above both (per-partition maximum)."""
        merged = self.as_dict()
        for p, u in other.uppers:
            merged[p] = max(merged.get(p, 0), u)
        return Frontier.of(merged)

    def increments_from(self, earlier: "Frontier") -> dict[Partition, int]:
        """Per-partition offset increments from ``earlier`` to ``self`` (seed 001's remap diffs).

        Raises :class:`FrontierError` when ``self`` is not beyond ``earlier``.
        """
        if not earlier.less_equal(self):
            back = {p: (earlier[p], self[p]) for p in earlier.partitions if self[p] < earlier[p]}
            raise FrontierError(f"frontier went backwards (partition: (before, after)) {back}")
        return {p: u - earlier[p] for p, u in self.uppers if u != earlier[p]}

    def ahead_of(self, other: "Frontier") -> dict[Partition, int]:
        """Per partition, how far ``self`` is beyond ``other`` (e.g. upstream's lag over what is bound)."""
        return {p: u - other[p] for p, u in self.uppers if u > other[p]}

    def as_json(self) -> dict[str, int]:
        """``{str(partition): upper}``, for JSON and XCom."""
        return {str(p): u for p, u in self.uppers}

    def advanced_by(self, increments: Mapping[Partition, int]) -> "Frontier":
        merged = self.as_dict()
        for p, inc in increments.items():
            merged[p] = merged.get(p, 0) + inc
        return Frontier.of(merged)

    def __str__(self) -> str:
        return "{" + ", ".join(f"{p}: {u}" for p, u in self.uppers) + "}"


def partition_sort_key(partition: Partition) -> tuple:
    """How partitions are ordered wherever they are listed: ints numerically, then the others by name."""
    if isinstance(partition, int) and not isinstance(partition, bool):
        return (0, partition, "")
    return (1, 0, str(partition))


# --- General antichains over partial orders (used where times are explicit, e.g. CDC v2) ---


def time_le(a: Any, b: Any) -> bool:
    """Partial order on times: ints totally, tuples component-wise (product order)."""
    if isinstance(a, tuple):
        return len(a) == len(b) and all(time_le(x, y) for x, y in zip(a, b))
    return a <= b


def time_join(a: Any, b: Any) -> Any:
    """Least upper bound of two times."""
    if isinstance(a, tuple):
        return tuple(time_join(x, y) for x, y in zip(a, b))
    return max(a, b)


@dataclass(frozen=True)
class Antichain:
    """A set of mutually incomparable times; it bounds the times that are *beyond* it.

    The empty antichain bounds nothing: a stream with an empty upper is finished.
    """

    elements: frozenset = field(default_factory=frozenset)

    @classmethod
    def of(cls, times: Iterable[Any]) -> "Antichain":
        minimal: list[Any] = []
        for t in times:
            if any(time_le(m, t) for m in minimal):
                continue
            minimal = [m for m in minimal if not time_le(t, m)] + [t]
        return cls(frozenset(minimal))

    def beyond(self, time: Any) -> bool:
        """True when ``time`` is greater or equal to some element (still to come, not complete)."""
        return any(time_le(e, time) for e in self.elements)

    def less_equal(self, other: "Antichain") -> bool:
        """``self <= other``: every element of ``other`` is beyond ``self``."""
        return all(self.beyond(t) for t in other.elements)

    def join(self, other: "Antichain") -> "Antichain":
        """Least antichain beyond both: pairwise joins of elements."""
        return Antichain.of(time_join(a, b) for a in self.elements for b in other.elements)

    def meet(self, other: "Antichain") -> "Antichain":
        """Greatest antichain below both: the minimal elements of the union."""
        return Antichain.of(list(self.elements) + list(other.elements))

    def __iter__(self) -> Iterator[Any]:
        return iter(sorted(self.elements))
