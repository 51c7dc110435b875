"""A Postgres table's initial snapshot as partitions and offsets (:mod:`reclock.sources.postgres`).

The snapshot of table ``schema.name`` exported with a slot at its consistent point ``C`` is the partition
``schema.name@<C as an LSN>``; a row's offset in it is its ctid, ``block << TID_SHIFT | line``, so offsets grow
with the heap's physical order, a range of offsets is a range of blocks, and no row has offset 0 (where a resync
marker goes, :mod:`reclock.truncate`).
"""
from __future__ import annotations

import re
from typing import NamedTuple

from .pgoutput import int_to_lsn, lsn_to_int

_SNAPSHOT_PARTITION = re.compile(r"^(?P<table>[^@]+)@(?P<lsn>[0-9A-F]+/[0-9A-F]+)$")
#: A ctid (block, line) as an offset: ``block << TID_SHIFT | line`` (a heap page holds < 2**16 lines).
TID_SHIFT = 16


def snapshot_partition(table: str, consistent_lsn: int) -> str:
    """The partition of ``table``'s initial snapshot taken at the slot's consistent point."""
    return f"{table}@{int_to_lsn(consistent_lsn)}"


def parse_snapshot_partition(partition: str) -> tuple[str, int] | None:
    """``(table, consistent LSN)`` of a snapshot partition, None for the changes' partition ``""``."""
    match = _SNAPSHOT_PARTITION.match(partition)
    return (match["table"], lsn_to_int(match["lsn"])) if match else None


def tid(offset: int) -> str:
    """A ctid offset as Postgres prints the ctid: ``(block,line)``."""
    return f"({offset >> TID_SHIFT},{offset & ((1 << TID_SHIFT) - 1)})"


class ExportedSnapshot(NamedTuple):
    """A snapshot exported with a new slot: alive while :meth:`PostgresSource.export_snapshot` is open."""

    name: str            # for SET TRANSACTION SNAPSHOT
    consistent_lsn: int  # the slot's consistent point C
    uppers: dict         # snapshot partition -> blocks << TID_SHIFT (tables with no block are left out)
    tables: tuple = ()   # every table of the publication ("schema.name"), empty ones too

    @property
    def spec(self) -> dict:
        """What a worker's source needs to read the snapshot's partitions (``exported=`` kwarg)."""
        return {"name": self.name, "consistent_lsn": self.consistent_lsn}

    def every_table(self) -> dict:
        """A snapshot partition for every table, empty ones too, with room for a resync marker at offset 0
        (:mod:`reclock.truncate`; a ctid offset is never 0): partition -> upper, at least 1."""
        return {p: max(self.uppers.get(p, 0), 1) for p in (snapshot_partition(t, self.consistent_lsn)
                                                            for t in self.tables)}
