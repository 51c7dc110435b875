"""Reading offset ranges of any Source into Spark, each record stamped with its range's IntoTime.

:func:`read_ranges` is the entry point.  A source kind that Spark reads natively has a read in
:data:`NATIVE_READS` (Kafka, through Spark's own Kafka source: :mod:`reclock.spark.kafka`); it must return the
same rows as the data source below (the law of :mod:`reclock.spark.rows`), or None to decline.  Every other
source, or one that declines, is read by the PySpark Python Data Source ("reclock") of this module, record by
record with ``source.read``.

Options of the "reclock" data source (strings, as every Spark option):

* ``spec``: JSON of the source spec, ``{"kind": "kafka", ...kwargs}`` (see :func:`reclock.sources.build_source`);
* ``ranges``: JSON list of ``[into_time, partition, start, end]`` (a :class:`reclock.engine.Range` dumps to that);
* ``max_task_offsets``: optional, the widest offset span of one read task (``0``: no limit);
* ``on_bad_record``: optional, ``fail`` (the default) or ``dead_letter`` (below).

Contiguous ranges of one partition are coalesced into read tasks of at most
``MAX_TASK_OFFSETS`` offsets (:func:`segments`; a source may declare its own ``max_task_offsets``, None for files (a task starts on a line)
and for sparse gauges such as Kinesis sequence numbers), so replaying many bindings costs one read
per partition chunk, not one Spark task per binding.  Each task builds its own source from
the spec, reads ``start <= offset < end`` once, stamps each record with the IntoTime of the
range it falls in, and yields Arrow batches with the columns
``<source data columns>..., partition, offset, into_time, diff``; ``offset`` is stored as the
source's ``offset_type`` (:mod:`reclock.offsets`: int64, or an order-preserving string).

A source whose records may not decode (``on_bad_record`` of the sources file) is read with
``on_bad_record="dead_letter"`` by a native read that takes it: every record comes back, those that
could not be decoded with :data:`BAD_RECORD_COLUMNS` set, and :func:`split_bad_records` parts them into
the records and the rows of the source's dead-letter table.  The data source below does the same for a
source whose ``read`` yields a :class:`~reclock.sources.base.BadRecord` for such a record (its class sets
``reads_bad_records``: files): the row has its data columns null, the error, a null raw key and the raw
bytes as raw value.  For any other source it stops at a record the source cannot decode.

Native reads need what they read with on the session (Kafka: the spark-sql-kafka jars, which
:func:`reclock.spark.session.get_spark` loads), and no Python workers.  For the Python data source,
Spark's Python workers must be able to import ``reclock`` (and the source's client library):
start the session with ``PYSPARK_PYTHON`` pointing at the project's interpreter
(``.venv/bin/python``, where reclock is installed editable), or set ``spark.pyspark.python``.
The default is ``python3`` from ``PATH``, which usually is not the venv.
"""
from __future__ import annotations

import functools
import json
from bisect import bisect_right
from dataclasses import dataclass
import os
import sys
from typing import Any, Iterable, Iterator, Mapping, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from .. import offsets
from ..engine import Frontier, Range
from ..engine.upstream import earlier_epoch_problems, upstream_ranges
from ..sources import build_source
from ..sources.base import BadRecord, SourceError
from .rows import (  # noqa: F401 (the read's contract, used from here by the steps)
    BAD_RECORD_COLUMNS, MAX_TASK_OFFSETS, META_COLUMNS, check_on_bad_record, normalize_ranges,
    output_arrow_schema, source_error, worker_source_error,
)
from .session import spark_schema

NAME = "reclock"
BATCH_ROWS = 8192


def _parse_spec(options: Mapping[str, str]) -> dict:
    raw = options.get("spec")
    if raw is None:
        raise SourceError("the reclock data source needs option 'spec' (JSON source spec)")
    spec = json.loads(raw)
    if not isinstance(spec, dict) or "kind" not in spec:
        raise SourceError(f"option 'spec' must be a JSON object with a 'kind', got {raw!r}")
    return spec


def _parse_ranges(options: Mapping[str, str]) -> list[tuple[int, Any, int, int]]:
    raw = options.get("ranges")
    if raw is None:
        raise SourceError("the reclock data source needs option 'ranges' (JSON list of [into_time, partition, start, end])")
    ranges = json.loads(raw)
    if not isinstance(ranges, list):
        raise SourceError(f"option 'ranges' must be a JSON list, got {raw[:200]!r}")
    return normalize_ranges(ranges)


@dataclass(frozen=True)
class Segment:
    """Offsets ``[start, end)`` of ``partition`` read by one task; ``bounds`` are ascending
    ``(range end, into_time)`` pairs: an offset gets the IntoTime of the first range end above it."""

    partition: Any
    start: int
    end: int
    bounds: tuple[tuple[int, int], ...]

    @functools.cached_property
    def _ends(self) -> list[int]:
        return [e for e, _ in self.bounds]

    def into_time(self, offset: int) -> int:
        return self.bounds[bisect_right(self._ends, offset)][1]


def segments(ranges: Iterable[Sequence[Any]], max_offsets: int | None = MAX_TASK_OFFSETS) -> list[Segment]:
    """Coalesce contiguous ranges per partition, then cut them into tasks of at most ``max_offsets`` (None: uncut)."""
    runs: list[list[tuple[int, Any, int, int]]] = []
    for r in sorted((r for r in normalize_ranges(ranges) if r[2] < r[3]), key=lambda r: (str(r[1]), r[2])):
        if runs and runs[-1][-1][1] == r[1] and runs[-1][-1][3] == r[2]:
            runs[-1].append(r)
        else:
            runs.append([r])
    out = []
    for run in runs:
        partition, start, end = run[0][1], run[0][2], run[-1][3]
        for lo in range(start, end, max_offsets or end - start):
            hi = min(lo + max_offsets, end) if max_offsets else end
            bounds = tuple((min(e, hi), t) for t, _, s, e in run if s < hi and e > lo)
            out.append(Segment(partition, lo, hi, bounds))
    return out


class SegmentPartition(InputPartition):
    def __init__(self, index: int, segment: Segment) -> None:
        super().__init__(index)
        self.segment = segment

    def __repr__(self) -> str:
        return f"SegmentPartition({self.segment})"


class ReclockDataSource(DataSource):
    """``spark.read.format("reclock").option("spec", ...).option("ranges", ...).load()``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self):
        source = build_source(_parse_spec(self.options))
        try:
            return spark_schema(output_arrow_schema(source, self._on_bad_record()))
        finally:
            source.close()

    def reader(self, schema) -> "ReclockReader":
        limit = int(self.options.get("max_task_offsets", MAX_TASK_OFFSETS))
        return ReclockReader(_parse_spec(self.options), _parse_ranges(self.options), limit or None,
                             self._on_bad_record())

    def _on_bad_record(self) -> str:
        return check_on_bad_record(self.options.get("on_bad_record", "fail"))


class ReclockReader(DataSourceReader):
    def __init__(self, spec: dict, ranges: list[tuple[int, Any, int, int]],
                 max_offsets: int | None = MAX_TASK_OFFSETS, on_bad_record: str = "fail") -> None:
        self.spec = spec
        self.ranges = ranges
        self.max_offsets = max_offsets
        self.on_bad_record = on_bad_record

    def partitions(self) -> list[SegmentPartition]:
        parts = [SegmentPartition(i, seg) for i, seg in enumerate(segments(self.ranges, self.max_offsets))]
        return parts or [SegmentPartition(0, Segment(None, 0, 0, ()))]  # Spark wants at least one partition

    def read(self, partition: SegmentPartition) -> Iterator[pa.RecordBatch]:
        if partition.segment.start >= partition.segment.end:
            return
        source = build_source(self.spec)
        try:
            yield from read_segment_batches(source, partition.segment, on_bad_record=self.on_bad_record)
        finally:
            source.close()


def read_segment_batches(source, segment: Segment, batch_rows: int = BATCH_ROWS,
                         on_bad_record: str = "fail") -> Iterator[pa.RecordBatch]:
    """Arrow batches of one segment, columns as :func:`output_arrow_schema` (usable without Spark).

    ``on_bad_record="dead_letter"`` (a source that :func:`~reclock.sources.base.reads_bad_records`): a
    :class:`~reclock.sources.base.BadRecord` the source yields is a row with its data columns null and
    :data:`BAD_RECORD_COLUMNS` set to its error, null and its raw bytes; they are null on the other rows."""
    dead_letter = check_on_bad_record(on_bad_record, source) == "dead_letter"
    schema = output_arrow_schema(source, on_bad_record)
    offset_type = schema.field("offset").type
    names = [f.name for f in source.data_schema]
    columns: dict[str, list] = {n: [] for n in schema.names}

    def flush() -> pa.RecordBatch:
        stored = {**columns, "offset": [offsets.to_storage(o, offset_type) for o in columns["offset"]]}
        batch = pa.RecordBatch.from_pydict(stored, schema=schema)
        for values in columns.values():
            values.clear()
        return batch

    error, raw_key, raw_value = BAD_RECORD_COLUMNS
    records = (source.read(segment.partition, segment.start, segment.end, on_bad_record=on_bad_record) if dead_letter
               else source.read(segment.partition, segment.start, segment.end))
    for data, offset, diff in records:
        bad = data if isinstance(data, BadRecord) else None
        for n in names:
            columns[n].append(None if bad else data.get(n))
        if dead_letter:
            columns[error].append(bad.error if bad else None)
            columns[raw_key].append(None)
            columns[raw_value].append(bad.raw if bad else None)
        columns["partition"].append(segment.partition)
        columns["offset"].append(offset)
        columns["into_time"].append(segment.into_time(offset))
        columns["diff"].append(diff)
        if len(columns["offset"]) >= batch_rows:
            yield flush()
    if columns["offset"]:
        yield flush()


def register(spark) -> None:
    """Register the "reclock" data source with ``spark`` (idempotent)."""
    spark.dataSource.register(ReclockDataSource)


def _kafka_read(source, spark, ranges, on_bad_record="fail"):
    from .kafka import spark_read

    return spark_read(source, spark, ranges, on_bad_record)


#: Source kind -> its native Spark read ``(source, spark, ranges, on_bad_record) -> DataFrame | None`` (None:
#: declined, read by the Python data source), which must yield the rows of the law of :mod:`reclock.spark.rows`.
NATIVE_READS = {"kafka": _kafka_read}


def read_ranges(spark, spec: Mapping[str, Any], ranges: Iterable[Sequence[Any]], base: Frontier | None = None,
                on_bad_record: str = "fail"):
    """DataFrame of every record of ``ranges`` (``[into_time, partition, start, end]``) of the source ``spec``.

    Columns: the source's data columns, ``partition``, ``offset``, ``into_time``, ``diff``.
    Empty ranges yield no rows; an unreadable range fails with the source's error (on the driver, or
    as the Spark job's failure).  Read by the kind's native read (:data:`NATIVE_READS`) when it has one and
    it does not decline, else by the "reclock" Python data source (:func:`read_ranges_python`).

    ``base``: the offset base of the source's current epoch (:mod:`reclock.engine.upstream`): the ranges
    are gauge offsets, read upstream at ``offset - base`` and returned with their gauge offsets; a range
    below the base (an earlier epoch's records) is a :class:`SourceError` before anything is read.

    ``on_bad_record="dead_letter"``: the frame has :data:`BAD_RECORD_COLUMNS` too (:func:`split_bad_records`),
    from a native read that takes it, else from the Python data source when the source's ``read`` can
    (:func:`~reclock.sources.base.reads_bad_records`); any other source is a :class:`SourceError`.
    """
    check_on_bad_record(on_bad_record)
    spec = dict(spec)
    ranges = normalize_ranges(ranges)
    shifted = base is not None and bool(base.partitions)
    if shifted:
        gauge = [Range(*r) for r in ranges]
        if problems := earlier_epoch_problems(gauge, base):
            raise SourceError(f"cannot read from the current upstream: {'; '.join(problems)}")
        ranges = [tuple(r) for r in upstream_ranges(gauge, base)]
    source = build_source(spec)  # validates the spec on the driver
    try:
        native = NATIVE_READS.get(spec["kind"])
        df = None if native is None else native(source, spark, ranges, on_bad_record=on_bad_record)
    finally:
        source.close()
    df = df if df is not None else read_ranges_python(spark, spec, ranges, on_bad_record)
    return _shifted(df, base) if shifted else df


def split_bad_records(df, source: str, on_bad_record: str = "dead_letter"):
    """``(records, dead letters)`` of a frame read with ``on_bad_record="dead_letter"``: the records that decoded,
    without :data:`BAD_RECORD_COLUMNS`, and the others as rows of source ``source``'s dead-letter table
    (``source, partition, offset, into_time, key, value, error``: :func:`reclock.storage.dead_letter_schema`).
    A frame read with ``fail`` has no bad records: ``(df, None)``, without asking Spark for its columns (with
    Spark Connect, a round trip to the server); nor has a frame without the columns (only landed partitions)."""
    from pyspark.sql import functions as F

    error, raw_key, raw_value = BAD_RECORD_COLUMNS
    if on_bad_record != "dead_letter" or error not in df.columns:
        return df, None
    records = df.where(F.col(error).isNull()).drop(*BAD_RECORD_COLUMNS)
    dead_letters = df.where(F.col(error).isNotNull()).select(
        F.lit(source).alias("source"), "partition", "offset", "into_time", F.col(raw_key).alias("key"),
        F.col(raw_value).alias("value"), F.col(error).alias("error"))
    return records, dead_letters


def _shifted(df, base: Frontier):
    """``df`` with ``base[partition]`` added to each row's offset (upstream offsets to gauge offsets)."""
    from pyspark.sql import functions as F

    shift = F.lit(0).cast("long")
    for partition, offset in base:
        shift = F.when(F.col("partition") == F.lit(partition), F.lit(offset).cast("long")).otherwise(shift)
    return df.withColumn("offset", (F.col("offset").cast("long") + shift).cast(df.schema["offset"].dataType))


def read_ranges_python(spark, spec: Mapping[str, Any], ranges: Iterable[Sequence[Any]], on_bad_record: str = "fail"):
    """:func:`read_ranges` through the "reclock" Python data source, whatever the source offers natively
    (``on_bad_record="dead_letter"``: for a source that :func:`~reclock.sources.base.reads_bad_records`)."""
    spec = dict(spec)
    ranges = normalize_ranges(ranges)
    source = build_source(spec)  # validates the spec on the driver; only its schema is used
    try:
        check_on_bad_record(on_bad_record, source)
        schema = spark_schema(output_arrow_schema(source, on_bad_record))
        max_offsets = getattr(source, "max_task_offsets", MAX_TASK_OFFSETS)
    finally:
        source.close()
    check_python_workers(spark)
    register(spark)
    return (spark.read.format(NAME).schema(schema)
            .option("spec", json.dumps(spec))
            .option("ranges", json.dumps(ranges))
            .option("max_task_offsets", str(max_offsets or 0))
            .option("on_bad_record", on_bad_record)
            .load())


def check_python_workers(spark) -> None:
    """Fail early, with a hint, when Spark's local Python workers cannot import reclock.

    Only checks local masters; on a cluster the executors' interpreter is the deployment's business.
    """
    try:
        sc = spark.sparkContext
        master = sc.master
        python = sc.getConf().get("spark.pyspark.python") or sc.pythonExec
    except Exception:  # Spark Connect: no SparkContext here
        return
    if not master.startswith("local"):
        return
    problem = _python_problem(python)
    if problem:
        raise SourceError(
            f"Spark's Python workers run {python!r}, which cannot import reclock ({problem}); start the "
            f"session with PYSPARK_PYTHON (or spark.pyspark.python) set to the project's interpreter, "
            f"e.g. {sys.executable}")


@functools.lru_cache(maxsize=8)
def _python_problem(python: str) -> str | None:
    import shutil
    import subprocess

    path = shutil.which(python)
    if path is None:
        return None  # not on this machine: cannot check
    if os.path.realpath(path) == os.path.realpath(sys.executable):
        return None
    try:
        run = subprocess.run([path, "-c", "import reclock.sources, pyarrow"], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if run.returncode == 0:
        return None
    lines = run.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit code {run.returncode}"
