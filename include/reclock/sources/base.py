"""What every upstream source offers reclock: its upper frontier, exact reads by offset range, upstream commit."""
from __future__ import annotations

from typing import Any, Iterator, Protocol

import pyarrow as pa

from ..engine import Frontier, Partition


class SourceError(RuntimeError):
    """The upstream is unreachable, went backwards, or returned something reclock cannot accept."""


class Source(Protocol):
    #: Arrow type of the partition key (int32 for Kafka, string for files/shards/Postgres).
    partition_type: pa.DataType
    #: The data columns a record carries (without partition, offset, into_time, diff).
    data_schema: pa.Schema
    # Optional ``content_columns``: the data columns that make up a record's contents in AS OF
    # views (default: all); the others describe the change (e.g. Postgres op, xid, commit_time).

    def upper(self) -> Frontier:
        """The source's current upper frontier: every record below it is complete and readable."""

    def read(self, partition: Partition, start: int, end: int) -> Iterator[tuple[dict[str, Any], int, int]]:
        """Yield ``(data, offset, diff)`` for every record of ``partition`` with ``start <= offset < end``.

        Must be exact and repeatable: the same range always yields the same records.
        """

    def commit(self, frontier: Frontier) -> None:
        """Tell upstream everything below ``frontier`` is durable here (offset resumption frontier)."""

    def committed(self) -> Frontier:
        """The frontier last committed upstream (what it may already have released)."""

    def close(self) -> None:
        """Release connections."""
