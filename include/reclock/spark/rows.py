"""What a read of offset ranges yields, whoever reads (the "reclock" Python data source of
:mod:`reclock.spark.source`, or Spark's own Kafka source, :mod:`reclock.spark.kafka`): the columns, the checks of
the ranges and of ``on_bad_record``, and how a source's error travels through a Spark job.

Law: a read of ranges ``[into_time, partition, start, end]`` yields, for every record the source holds at
``start <= offset < end``, one row ``<source data columns>..., partition, offset, into_time, diff = 1`` (and
:data:`BAD_RECORD_COLUMNS` when reading with ``on_bad_record="dead_letter"``), whichever reader reads it.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Sequence

import pyarrow as pa

from .. import offsets
from ..sources import ON_BAD_RECORD
from ..sources.base import SourceError, reads_bad_records

META_COLUMNS = ("partition", "offset", "into_time", "diff")
MAX_TASK_OFFSETS = 500_000
#: The columns a ``dead_letter`` read adds: null for a record that decoded; for one that did not, why (one
#: line, naming its partition and offset) and its raw key and value bytes.
BAD_RECORD_COLUMNS = ("_bad_record_error", "_bad_record_key", "_bad_record_value")
_SOURCE_ERROR_TAG = "reclock.sources.base.SourceError: "
_WORKER_SOURCE_ERROR = re.compile(r"reclock\.sources\.base\.SourceError: (.*?)(?:\s+SQLSTATE: \w+)?\s*$", re.M)


def output_arrow_schema(source, on_bad_record: str = "fail") -> pa.Schema:
    """The rows the data source yields: the source's data columns, then partition, offset, into_time, diff
    (and :data:`BAD_RECORD_COLUMNS` with ``on_bad_record="dead_letter"``)."""
    clash = [f.name for f in source.data_schema if f.name in META_COLUMNS + BAD_RECORD_COLUMNS]
    if clash:
        raise SourceError(f"source data columns {clash} clash with reclock's columns "
                          f"{list(META_COLUMNS + BAD_RECORD_COLUMNS)}")
    error, raw_key, raw_value = BAD_RECORD_COLUMNS
    bad = [pa.field(error, pa.string()), pa.field(raw_key, pa.binary()), pa.field(raw_value, pa.binary())]
    return pa.schema(list(source.data_schema) + [
        pa.field("partition", source.partition_type, nullable=False),
        pa.field("offset", offsets.offset_type_of(source), nullable=False),
        pa.field("into_time", pa.int64(), nullable=False),
        pa.field("diff", pa.int64(), nullable=False),
    ] + (bad if on_bad_record == "dead_letter" else []))


def check_on_bad_record(on_bad_record: str, source=None) -> str:
    """``on_bad_record`` when it is one of :data:`ON_BAD_RECORD` and, for ``dead_letter``, the Python read of
    ``source`` can go on past a record it cannot decode; else a :class:`SourceError`."""
    if on_bad_record not in ON_BAD_RECORD:
        raise SourceError(f"on_bad_record must be one of {ON_BAD_RECORD}, got {on_bad_record!r}")
    if on_bad_record == "dead_letter" and source is not None and not reads_bad_records(source):
        raise SourceError(f"{source!r} cannot dead-letter records (on_bad_record: {on_bad_record}): it is read "
                          "record by record, which stops at a record it cannot decode")
    return on_bad_record


def normalize_ranges(ranges: Iterable[Sequence[Any]]) -> list[tuple[int, Any, int, int]]:
    """Check and convert ranges (lists, tuples or :class:`~reclock.engine.Range`) to tuples."""
    out = []
    for r in ranges:
        if isinstance(r, Mapping):
            r = (r["into_time"], r["partition"], r["start"], r["end"])
        if len(r) != 4:
            raise SourceError(f"a range is [into_time, partition, start, end], got {r!r}")
        into_time, partition, start, end = r
        for name, v in (("into_time", into_time), ("start", start), ("end", end)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise SourceError(f"range {r!r}: {name} must be an int")
        if not 0 <= start <= end:
            raise SourceError(f"range {r!r}: need 0 <= start <= end")
        out.append((into_time, partition, start, end))
    return out


def source_error(message):
    """A Spark column that fails the job with ``message`` (a string column) as a :class:`SourceError`
    message: :func:`worker_source_error` finds it in the job failure, as it finds a Python worker's."""
    from pyspark.sql import functions as F

    return F.raise_error(F.concat(F.lit(_SOURCE_ERROR_TAG), message))


def worker_source_error(error: BaseException) -> str | None:
    """The message of the :class:`SourceError` a Python worker (or :func:`source_error`) raised,
    inside a Spark job failure, or None."""
    found = _WORKER_SOURCE_ERROR.search(str(error))
    return found.group(1).strip() if found else None
