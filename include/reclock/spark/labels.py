"""How a check report spells a record's offset, as its upstream does, in a Spark column (by source kind).

A kind listed in :data:`OFFSET_LABELS` has a spelling: Postgres names a change by its commit LSN (``commit LSN
16/B374D848``) and a snapshot row by its ctid (``ctid (12,3)``).  Any other kind's offsets are reported as the
numbers they are (:func:`offset_label` is None).
"""
from __future__ import annotations

from typing import Callable

from pyspark.sql import Column
from pyspark.sql import functions as F

from ..sources.pg_snapshot import TID_SHIFT


def postgres_offset_label() -> Column:
    """A Postgres record's offset: the commit LSN of a change (partition ``""``), the ctid of a snapshot row."""
    offset = F.col("offset")
    lsn = F.concat(F.hex(F.shiftright(offset, 32)), F.lit("/"), F.hex(offset.bitwiseAND(0xFFFFFFFF)))
    ctid = F.format_string("ctid (%d,%d)", F.shiftright(offset, TID_SHIFT), offset.bitwiseAND((1 << TID_SHIFT) - 1))
    return F.when(F.col("partition") == "", F.concat(F.lit("commit LSN "), lsn)).otherwise(ctid)


OFFSET_LABELS: dict[str, Callable[[], Column]] = {"postgres": postgres_offset_label}


def offset_label(kind: str) -> Column | None:
    """The spelling of a ``kind`` source's offsets, None where the offset is spelled as its number."""
    label = OFFSET_LABELS.get(kind)
    return label() if label else None
