"""A source seen in its gauge across epochs: the upstream's offsets shifted by the current epoch's offset base, and
without its retired partitions.

After ``reclock new-epoch`` the source's gauge offset is ``base + upstream offset``
(:mod:`reclock.engine.upstream`, "Epochs").  :class:`EpochSource` is where that translation happens
for everything the steps ask the upstream (upper, released, committed, start, commit, reads), so the
steps, status and the checks see one monotone gauge.  Spark reads translate in
:func:`reclock.spark.source.read_ranges` (given the base), since Spark rebuilds the source from its spec.
It also hides the partitions compaction retired (:mod:`reclock.engine.upstream`, "Retirement") from the
upstream's frontiers, and refuses one back with records beyond its retired offset.
"""
from __future__ import annotations

from typing import Any, Iterator

from ..engine import Frontier, Partition, Range
from ..engine.upstream import back_problems, earlier_epoch_problems, live, to_gauge, to_upstream
from .base import Source, SourceError, released_frontier, starting_frontier

#: What passes through unchanged: the source's types, its identity, its partitions' names and which it holds (no
#: offsets in them).
_PASSED = frozenset({"partition_type", "data_schema", "offset_type", "content_columns", "max_task_offsets",
                     "identity", "partition_names", "held_partitions"})


class EpochSource:
    """``upstream`` in the gauge of an epoch with offset ``base`` (an empty base: the upstream's own offsets),
    without the ``retired`` partitions (gauge offsets)."""

    def __init__(self, upstream: Source, base: Frontier, retired: Frontier = Frontier()) -> None:
        self.upstream = upstream
        self.base = base
        self.retired = retired

    def __getattr__(self, name: str) -> Any:
        if name in _PASSED:
            return getattr(self.upstream, name)
        raise AttributeError(name)  # anything else may carry offsets: not passed through untranslated

    def __repr__(self) -> str:
        return f"{self.upstream!r} at epoch offset base {self.base}"

    def upper(self) -> Frontier:
        upper = to_gauge(self.upstream.upper(), self.base)
        names = getattr(self.upstream, "partition_names", dict)()
        if problems := back_problems(upper, self.retired, names):
            raise SourceError(f"{self.upstream!r}: " + "; ".join(problems) + ": its records beyond would be read from "
                              "the start again, the published ones twice; nothing bound. Move it away, and write its "
                              "new records to a new partition (files: a new file)")
        return live(upper, self.retired)

    def released(self) -> Frontier:
        return live(to_gauge(released_frontier(self.upstream), self.base), self.retired)

    def committed(self) -> Frontier:
        return live(to_gauge(self.upstream.committed(), self.base), self.retired)

    def starting_frontier(self) -> Frontier:
        return live(to_gauge(starting_frontier(self.upstream), self.base), self.retired)

    def commit(self, frontier: Frontier) -> None:
        """Commit the upstream offsets of a gauge frontier (nothing for partitions still at or below the base)."""
        self.upstream.commit(to_upstream(frontier, self.base))

    def read(self, partition: Partition, start: int, end: int) -> Iterator[tuple[dict[str, Any], int, int]]:
        if problems := earlier_epoch_problems([Range(-1, partition, start, end)], self.base):
            raise SourceError(f"{self.upstream!r}: " + "; ".join(problems))
        shift = self.base[partition]
        return ((data, offset + shift, diff) for data, offset, diff in self.upstream.read(partition, start - shift,
                                                                                           end - shift))

    def close(self) -> None:
        self.upstream.close()


def in_epoch(upstream: Source, base: Frontier, retired: Frontier = Frontier()) -> Source:
    """``upstream`` translated by ``base``, without the ``retired`` partitions; the upstream itself when there is
    neither (no epoch began, nothing retired)."""
    return EpochSource(upstream, base, retired) if base.partitions or retired.partitions else upstream
