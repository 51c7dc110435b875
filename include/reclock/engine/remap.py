"""The ``remap`` collection: which source frontier was complete at each IntoTime (seed 000).

A :class:`Remap` is a list of bindings ``(into_time, frontier)`` with strictly
increasing ``into_time`` (milliseconds since the Unix epoch) and monotone
frontiers.  ``remap[t]`` is the frontier of the latest binding at or before
``t``.  It is stored as per-partition increments (seed 001): the row
``(partition, into_time, increment)`` says that at ``into_time`` the partition's
upper grew by ``increment``, so history consolidates by summing.

``since`` is the compaction frontier: times before it have been folded into
the binding at ``since`` and are no longer distinguishable.  ``upper`` is the
first IntoTime not yet bound: a tick at ``t`` moves it to ``t + 1`` even when
the source did not move, in which case no binding (and no row) is added, so the
in-memory and stored forms are the same.

A tick reading the wall clock ``w`` binds at ``max(w, upper)`` (as Materialize does):
IntoTime never goes backwards, whatever the clock does.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, NamedTuple

from .frontier import Frontier, FrontierError, Partition


class RemapError(ValueError):
    """A binding or query that would break the remap laws; nothing is changed."""


class Binding(NamedTuple):
    into_time: int
    frontier: Frontier


class Increment(NamedTuple):
    """One stored remap row (seed 001): ``partition``'s upper grew by ``increment`` at ``into_time``."""

    partition: Partition
    into_time: int
    increment: int


class ProgressRow(NamedTuple):
    """One row of the ``<source>_progress`` relation: the upper of ``partition`` as of ``into_time``."""

    into_time: int
    partition: Partition
    offset: int


class Range(NamedTuple):
    """Offsets ``[start, end)`` of ``partition`` that reclock to ``into_time``."""

    into_time: int
    partition: Partition
    start: int
    end: int


@dataclass(frozen=True)
class Remap:
    bindings: tuple[Binding, ...] = ()
    since: int = 0
    upper: int = -1  # -1: derive as last binding + 1 (or since)

    def __post_init__(self) -> None:
        previous: Binding | None = None
        for binding in self.bindings:
            _check_next(previous, binding, self.since)
            if binding.frontier == (previous.frontier if previous else Frontier()):
                raise RemapError(f"binding at {binding.into_time} does not move the frontier")
            previous = binding
        least = previous.into_time + 1 if previous else self.since
        if self.upper == -1:
            object.__setattr__(self, "upper", least)
        elif self.upper < least:
            raise RemapError(f"upper {self.upper} is not beyond the last binding or since ({least})")

    # --- construction -------------------------------------------------------------------

    def mint(self, into_time: int, frontier: Frontier) -> "Remap":
        """Return the remap with one more binding; :class:`RemapError` if it breaks a law."""
        binding = Binding(into_time, frontier)
        _check_next(self.bindings[-1] if self.bindings else None, binding, self.since)
        if into_time < self.upper:
            raise RemapError(f"IntoTime must strictly increase: {into_time} < remap upper {self.upper}")
        if frontier == self.frontier:
            return Remap(self.bindings, self.since, into_time + 1)
        return Remap(self.bindings + (binding,), self.since, into_time + 1)

    def until(self, upper: int) -> "Remap":
        """The remap as it stood when its upper was ``upper``: its bindings before ``upper``, the same ``since``.

        Bindings below the upper never change (ticks only add later ones), so a batch staged and checked against
        ``remap.until(u)`` stays exact however far ticks move ``remap`` on; :class:`RemapError` for an ``upper``
        before ``since`` or beyond this remap's."""
        if not self.since <= upper <= self.upper:
            raise RemapError(f"no remap had upper {upper}: since = {self.since}, remap upper = {self.upper}")
        return Remap(tuple(b for b in self.bindings if b.into_time < upper), self.since, upper)

    def binding_time(self, wall_clock: int) -> int:
        """The IntoTime a tick binds at: ``max(wall_clock, upper)``, so a clock that stepped back (an NTP
        correction, two workers with skewed clocks) binds at the upper instead of wedging the source."""
        return max(wall_clock, self.upper)

    @classmethod
    def from_increments(cls, rows: Iterable[Increment | tuple], since: int = 0, upper: int = -1) -> "Remap":
        """Rebuild from stored increment rows (any order; rows at one time may repeat a partition)."""
        by_time: dict[int, dict[Partition, int]] = {}
        for partition, into_time, increment in rows:
            per = by_time.setdefault(int(into_time), {})
            per[partition] = per.get(partition, 0) + int(increment)
        frontier, bindings = Frontier(), []
        for into_time in sorted(by_time):
            try:
                frontier = frontier.advanced_by(by_time[into_time])
            except FrontierError as e:
                raise RemapError(f"stored remap is not monotone at {into_time}: {e}") from e
            bindings.append(Binding(into_time, frontier))
        return cls(tuple(bindings), since, upper)

    def increments(self) -> list[Increment]:
        """The stored representation: one row per partition whose upper moved at a binding."""
        rows, previous = [], Frontier()
        for into_time, frontier in self.bindings:
            rows += [Increment(p, into_time, inc) for p, inc in frontier.increments_from(previous).items()]
            previous = frontier
        return rows

    def progress(self) -> list[ProgressRow]:
        """The ``<source>_progress`` relation: every partition's upper at every binding."""
        return [ProgressRow(t, p, u) for t, frontier in self.bindings for p, u in frontier]

    # --- reading ------------------------------------------------------------------------

    @property
    def frontier(self) -> Frontier:
        """The latest bound source frontier."""
        return self.bindings[-1].frontier if self.bindings else Frontier()

    @cached_property
    def _times(self) -> list[int]:
        return [b.into_time for b in self.bindings]

    @cached_property
    def _per_partition(self) -> dict[Partition, tuple[list[int], list[int]]]:
        """For each partition, the uppers at each binding (non-decreasing) and the binding times."""
        table: dict[Partition, tuple[list[int], list[int]]] = {}
        for into_time, frontier in self.bindings:
            for partition, upper in frontier:
                uppers, times = table.setdefault(partition, ([], []))
                if not uppers or upper > uppers[-1]:
                    uppers.append(upper)
                    times.append(into_time)
        return table

    def at(self, into_time: int) -> Frontier:
        """``remap[into_time]``: the source frontier complete as of ``into_time`` (the inverse map)."""
        self.check_readable(into_time)
        i = bisect_right(self._times, into_time)
        return self.bindings[i - 1].frontier if i else Frontier()

    def check_readable(self, into_time: int) -> None:
        if into_time < self.since:
            raise RemapError(f"IntoTime {into_time} is compacted away (since = {self.since})")
        if into_time >= self.upper:
            raise RemapError(f"IntoTime {into_time} is not complete yet (remap upper = {self.upper})")

    def into_time_of(self, partition: Partition, offset: int) -> int | None:
        """IntoTime of the record at ``(partition, offset)``: the least binding whose frontier covers it.

        ``None`` when no binding covers it yet (the record is beyond the latest frontier).
        """
        uppers, times = self._per_partition.get(partition, ((), ()))
        i = bisect_right(uppers, offset)
        return times[i] if i < len(uppers) else None

    def reclock_frontier(self, source_upper: Frontier) -> int:
        """IntoTime upper of the reclocked collection when the source is complete up to ``source_upper``.

        Every binding whose frontier ``source_upper`` has reached is complete; the first one
        it has not reached (or ``upper`` when it reached all) is the reclocked upper.
        """
        for into_time, frontier in self.bindings:
            if not frontier.less_equal(source_upper):
                return into_time
        return self.upper

    def ranges(self, from_into_time: int = 0) -> list[Range]:
        """Offset ranges to read for every binding at or after ``from_into_time``, each with its IntoTime."""
        i = bisect_left(self._times, from_into_time)
        previous = self.bindings[i - 1].frontier if i else Frontier()
        out = []
        for into_time, frontier in self.bindings[i:]:
            out += [Range(into_time, p, previous[p], previous[p] + inc)
                    for p, inc in frontier.increments_from(previous).items()]
            previous = frontier
        return out

    # --- compaction ---------------------------------------------------------------------

    def compact(self, since: int) -> "Remap":
        """Fold every binding at or before ``since`` into one binding at ``since``.

        Reading at any time ``>= since`` is unchanged, and reclocking commutes:
        ``reclock(remap.compact(s)) == compact_updates(reclock(remap), s)``.
        """
        if since <= self.since:
            return self
        if since >= self.upper:
            raise RemapError(f"cannot compact to {since}: remap is only complete below {self.upper}")
        i = bisect_right(self._times, since)
        folded = (Binding(since, self.bindings[i - 1].frontier),) if i else ()
        return Remap(folded + self.bindings[i:], since, self.upper)


def _check_next(previous: Binding | None, binding: Binding, since: int) -> None:
    into_time, frontier = binding
    if isinstance(into_time, bool) or not isinstance(into_time, int):
        raise RemapError(f"IntoTime must be int milliseconds, got {into_time!r}")
    if not isinstance(frontier, Frontier):
        raise RemapError(f"binding frontier must be a Frontier, got {type(frontier).__name__}")
    if into_time < since:
        raise RemapError(f"IntoTime {into_time} is before since {since}")
    if previous is None:
        return
    if into_time <= previous.into_time:
        raise RemapError(
            f"IntoTime must strictly increase: {into_time} <= previous binding {previous.into_time}")
    if not previous.frontier.less_equal(frontier):
        try:
            frontier.increments_from(previous.frontier)
        except FrontierError as e:
            raise RemapError(f"binding at {into_time} is not monotone: {e}") from None
