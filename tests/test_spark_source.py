"""Reading offset ranges into Spark: Kafka through Spark's Kafka source, and the "reclock" Python data source."""
from __future__ import annotations

import time
from collections import Counter

import pytest
from hypothesis import given, strategies as st

from devtools.kafka_broker import Transaction, add_partitions, delete_records, produce, produce_transaction
from reclock.spark import source as spark_source
from reclock.engine import Frontier, Range, Remap, reclock
from reclock.sources import build_source
from reclock.sources.base import SourceError
from reclock.spark import kafka as spark_kafka
from reclock.spark.kafka import (
    one_into_time, partition_spans, read_key, read_tasks, reader_group, spark_client_options, spark_options,
    spark_range_rows,
    spark_read,
)
from reclock.spark.source import read_ranges, read_ranges_python, segments, worker_source_error
from test_engine import remaps

pytestmark = pytest.mark.slow


def kafka_spec_of(kafka_broker: str, topic: str, **extra) -> dict:
    return {"kind": "kafka", "bootstrap_servers": kafka_broker, "topic": topic, "group_id": f"g-{topic}",
            "timeout_s": 5, **extra}


@pytest.fixture
def kafka_spec(kafka_broker, kafka_topic):
    topic = kafka_topic(partitions=2, prefix="s")
    produce(kafka_broker, topic, [(f"a{i}", f"x{i}") for i in range(5)], partition=0)  # 0..4
    produce_transaction(kafka_broker, topic, ["aborted"], partition=0, commit=False)  # 5 + marker 6
    produce(kafka_broker, topic, ["x7"], partition=0)  # 7
    produce(kafka_broker, topic, [(f"b{i}", f"y{i}") for i in range(3)], partition=1)  # 0..2
    return kafka_spec_of(kafka_broker, topic)


def test_read_ranges_two_partitions(spark, kafka_spec):
    ranges = [
        Range(1000, 0, 0, 2),
        [2000, 0, 2, 8],  # crosses the aborted record and its marker
        (2000, 1, 0, 1),
        Range(3000, 1, 1, 3),
        Range(4000, 1, 3, 3),  # empty
    ]
    df = read_ranges(spark, kafka_spec, ranges)
    assert df.columns == ["key", "value", "timestamp_ms", "partition", "offset", "into_time", "diff"]
    assert [f.dataType.simpleString() for f in df.schema.fields] == [
        "string", "string", "bigint", "int", "bigint", "bigint", "bigint"]
    rows = sorted((r.partition, r.offset, r.into_time, r.key, r.value, r.diff) for r in df.collect())
    assert rows == [
        (0, 0, 1000, "a0", "x0", 1),
        (0, 1, 1000, "a1", "x1", 1),
        (0, 2, 2000, "a2", "x2", 1),
        (0, 3, 2000, "a3", "x3", 1),
        (0, 4, 2000, "a4", "x4", 1),
        (0, 7, 2000, None, "x7", 1),
        (1, 0, 2000, "b0", "y0", 1),
        (1, 1, 3000, "b1", "y1", 1),
        (1, 2, 3000, "b2", "y2", 1),
    ]
    assert all(r.timestamp_ms > 0 for r in df.select("timestamp_ms").collect())
    assert df.rdd.getNumPartitions() == 1  # 9 offsets: one task (read_tasks)


def test_contiguous_ranges_of_a_partition_are_read_by_one_task(spark, kafka_spec, monkeypatch):
    monkeypatch.setattr(spark_kafka, "MIN_TASK_OFFSETS", 1)  # no partitions read together
    ranges = [(1000, 0, 0, 2), (2000, 0, 2, 8), (2000, 1, 0, 1), (3000, 1, 1, 3)]
    assert read_ranges(spark, kafka_spec, ranges).rdd.getNumPartitions() == 2


def test_read_ranges_empty_and_errors(spark, kafka_spec):
    assert read_ranges(spark, kafka_spec, []).count() == 0
    assert read_ranges(spark, kafka_spec, [(5, 0, 3, 3)]).count() == 0
    with pytest.raises(SourceError, match="start <= end"):
        read_ranges(spark, kafka_spec, [(5, 0, 3, 2)])
    with pytest.raises(SourceError, match="unknown source kind"):
        read_ranges(spark, {"kind": "nope"}, [(5, 0, 0, 1)])
    # A range beyond the upper fails the job with the source's message.
    with pytest.raises(Exception, match="beyond the partition's upper"):
        read_ranges(spark, kafka_spec, [(5, 1, 0, 50)]).collect()


@given(remaps(), st.integers(1, 7))
def test_spark_segments_read_each_offset_once_with_its_into_time(remap, max_offsets):
    segs = segments(remap.ranges(), max_offsets)
    seen = Counter()
    for seg in segs:
        assert 0 < seg.end - seg.start <= max_offsets
        for o in range(seg.start, seg.end):
            seen[(seg.partition, o)] += 1
            assert seg.into_time(o) == remap.into_time_of(seg.partition, o)
    assert seen == Counter({(p, o): 1 for p, u in remap.frontier for o in range(u)})
    per_partition = Counter(seg.partition for seg in segs)
    assert all(n == -(-remap.frontier[p] // max_offsets) for p, n in per_partition.items())


# --- Kafka through Spark's own Kafka source (reclock.spark.kafka) ----------------------------------

COLUMNS = ["key", "value", "timestamp_ms", "partition", "offset", "into_time", "diff"]


def by_position(rows) -> list[tuple]:
    """Rows of :data:`COLUMNS` ordered by (partition, offset), unique per record."""
    return sorted(rows, key=lambda r: (r[3], r[4]))


def rows_of(df) -> list[tuple]:
    return by_position(tuple(r) for r in df.select(*COLUMNS).collect())


def reference_rows(source, remap: Remap, from_into_time: int = 0) -> list[tuple]:
    """The engine's reclocking of every record below the source's upper, read record by record."""
    updates = [((d["key"], d["value"], d["timestamp_ms"]), p, o, diff)
               for p, upper in source.upper() for d, o, diff in source.read(p, 0, upper)]
    return by_position((*data, p, o, t, diff) for data, p, o, t, diff in reclock(updates, remap) if t >= from_into_time)


@pytest.fixture
def history(kafka_broker, kafka_topic):
    """A topic reclocked by four bindings: a partition added mid-run, committed and aborted
    transactions, a binding ending on a transaction marker, then records beyond the frontier
    (and an open transaction) that no binding covers yet.  Yields ``(spec, source, remap)``."""
    topic = kafka_topic(partitions=2, prefix="h")
    spec = kafka_spec_of(kafka_broker, topic)
    source = build_source(spec)
    remap = Remap()

    def bind(into_time: int) -> None:
        nonlocal remap
        remap = remap.mint(into_time, source.upper())

    produce(kafka_broker, topic, [(f"a{i}", f"x{i}") for i in range(3)], partition=0)  # p0: 0..2
    produce(kafka_broker, topic, [(None, "y0"), ("b1", None)], partition=1)  # p1: 0, 1
    bind(1000)
    produce(kafka_broker, topic, ["x3", "x4"], partition=0)  # p0: 3, 4
    produce_transaction(kafka_broker, topic, [("t", "c0"), ("t", "c1")], partition=1)  # p1: 2, 3 + marker 4
    bind(2000)
    add_partitions(kafka_broker, topic, 3)
    produce(kafka_broker, topic, [("n", "n0"), ("n", "n1")], partition=2)  # p2: 0, 1
    produce_transaction(kafka_broker, topic, ["ab0", "ab1"], partition=0, commit=False)  # p0: 5, 6 + marker 7
    produce(kafka_broker, topic, ["x8"], partition=0)  # p0: 8
    bind(3000)
    produce_transaction(kafka_broker, topic, ["ab2"], partition=2, commit=False)  # p2: 2 + marker 3
    produce_transaction(kafka_broker, topic, ["c2"], partition=0)  # p0: 9 + marker 10
    bind(4000)  # p2's range [2, 4) holds only an aborted record and a marker
    produce(kafka_broker, topic, ["late0", "late1"], partition=0)  # p0: 11, 12 - beyond the frontier
    produce(kafka_broker, topic, ["late2"], partition=2)  # p2: 4 - beyond the frontier
    txn = Transaction(kafka_broker, topic)
    txn.produce(["open"], partition=1)  # p1: 5, open: p1's upper stays at 5
    try:
        assert remap.frontier == Frontier.of({0: 11, 1: 5, 2: 4})
        assert source.upper() == Frontier.of({0: 13, 1: 5, 2: 5})
        yield spec, source, remap
    finally:
        txn.abort()
        source.close()


def test_spark_read_equals_engine_reference(spark, history, monkeypatch):
    spec, source, remap = history
    expected = reference_rows(source, remap)
    # The reference is meaningful: late records are held back, aborted ones and markers absent.
    values = {r[1] for r in expected}
    assert {"x8", "c0", "c1", "c2", "n1"} <= values
    assert not values & {"ab0", "ab1", "ab2", "late0", "late1", "late2", "open"}
    assert [(r[3], r[4], r[5]) for r in expected if r[3] == 0] == [
        (0, 0, 1000), (0, 1, 1000), (0, 2, 1000), (0, 3, 2000), (0, 4, 2000), (0, 8, 3000), (0, 9, 4000)]
    assert [(r[3], r[4], r[5]) for r in expected if r[3] == 2] == [(2, 0, 3000), (2, 1, 3000)]

    ranges = remap.ranges()
    df = read_ranges(spark, spec, ranges)
    assert df.columns == COLUMNS
    assert [f.dataType.simpleString() for f in df.schema.fields] == [
        "string", "string", "bigint", "int", "bigint", "bigint", "bigint"]
    assert rows_of(df) == expected
    assert rows_of(read_ranges_python(spark, spec, ranges)) == expected  # the per-record reader agrees
    assert rows_of(read_ranges(spark, spec, remap.ranges(3000))) == reference_rows(source, remap, 3000)
    # One binding's ranges (over three partitions, one ending on a marker): stamped without the join, same rows.
    assert one_into_time(spark_range_rows("t", [r for r in ranges if r[0] == 3000])) == 3000
    assert rows_of(read_ranges(spark, spec, [r for r in ranges if r[0] == 3000])) == [
        r for r in expected if r[5] == 3000]
    assert source.committed() == Frontier()  # Spark's reads leave the source's consumer group alone
    # read_uncommitted: aborted records are visible (below the frontier), markers still are not.
    uncommitted = {**spec, "isolation_level": "read_uncommitted"}
    with build_source(uncommitted) as dirty:
        dirty_expected = reference_rows(dirty, remap)
    assert {"ab0", "ab1", "ab2"} <= {r[1] for r in dirty_expected} and "open" not in {r[1] for r in dirty_expected}
    assert rows_of(read_ranges(spark, uncommitted, ranges)) == dirty_expected

    # Tasks cut inside partitions start and end on aborted records and markers: same rows.
    monkeypatch.setattr(spark_kafka, "SPARK_MAX_TASK_OFFSETS", 2)
    monkeypatch.setattr(spark_kafka, "MIN_TASK_OFFSETS", 1)  # as Spark cuts them
    split = read_ranges(spark, spec, ranges)
    assert split.rdd.getNumPartitions() == 6 + 3 + 2  # ceil(span / 2) tasks per partition: 11, 5, 4 offsets
    assert rows_of(split) == expected


def test_read_ranges_uses_spark_kafka_source(spark, kafka_spec, monkeypatch):
    def python_path(*args):
        raise AssertionError("the Python data source must not read Kafka")

    monkeypatch.setattr(spark_source, "read_ranges_python", python_path)
    assert read_ranges(spark, kafka_spec, [(1, 0, 0, 2)]).count() == 2


def test_a_local_session_loads_its_jars_in_place(spark):
    """A local session has reclock's jars (and the tests' S3 jars) on its driver's classpath, not as spark.jars,
    which would copy all 640 MB of them into the driver's scratch directory at each JVM's start (left in /tmp by
    every JVM a test kills: a CI machine ran out of disk)."""
    from pathlib import Path

    from pyspark import SparkFiles

    classpath = spark.sparkContext.getConf().get("spark.driver.extraClassPath", "")
    assert any("delta-spark_" in j for j in classpath.split(":")) and any("hadoop-aws" in j for j in classpath.split(":"))
    assert not spark.sparkContext.getConf().get("spark.jars", "")
    assert not list(Path(SparkFiles.getRootDirectory()).glob("*.jar"))


def test_spark_read_empty_ranges_do_not_contact_kafka(spark):
    spec = {"kind": "kafka", "bootstrap_servers": "127.0.0.1:1", "topic": "nowhere", "group_id": "g", "timeout_s": 1}
    t0 = time.monotonic()
    for ranges in ([], [(5, 0, 3, 3), Range(6, 1, 0, 0)]):
        df = read_ranges(spark, spec, ranges)
        assert df.columns == COLUMNS and df.count() == 0
    assert time.monotonic() - t0 < 30


def test_spark_read_decodes_like_read(spark, kafka_broker, kafka_topic):
    topic = kafka_topic(partitions=2, prefix="d")
    produce(kafka_broker, topic, [(None, None), ("ключ", "значение ✓"), (b"k", b"\xff\xfe latin")], partition=0)
    produce(kafka_broker, topic, [("fine", "ok"), (b"\xc3\x28", b"v")], partition=1)  # bad key at p1 offset 1
    ranges = [(7, 0, 0, 2), (8, 1, 0, 1)]
    for encoding in ("utf-8", "UTF8", "utf-16-le"):  # utf-16-le: no Spark decoding, the Python reader reads
        spec = kafka_spec_of(kafka_broker, topic, encoding=encoding)
        with build_source(spec) as source:
            native = spark_read(source, spark, ranges)
            assert (native is None) == (encoding == "utf-16-le")
            expected = reference_rows_for(source, ranges)
        assert rows_of(read_ranges(spark, spec, ranges)) == expected
    latin = kafka_spec_of(kafka_broker, topic, encoding="latin-1")
    with build_source(latin) as source:
        expected = reference_rows_for(source, [(7, 0, 0, 3), (8, 1, 0, 2)])
    assert rows_of(read_ranges(spark, latin, [(7, 0, 0, 3), (8, 1, 0, 2)])) == expected
    assert expected[2][1] == "\xff\xfe latin"

    for encoding, (partition, offset, column) in (("utf-8", (1, 1, "key")), ("ascii", (0, 1, "key"))):
        spec = kafka_spec_of(kafka_broker, topic, encoding=encoding)
        with pytest.raises(Exception) as failed:
            read_ranges(spark, spec, [(9, partition, 0, offset + 1)]).collect()
        assert worker_source_error(failed.value) == (
            f"topic {topic!r} partition {partition} offset {offset}: record is not valid {encoding} (undecodable {column})")


BAD_RECORDS = [(None, None), ("ключ", "значение ✓"), (b"k", b"\xff\xfe latin")], [("fine", "ok"), (b"\xc3\x28", b"v")]


@pytest.mark.parametrize("encoding, undecodable", [
    ("utf-8", {(0, 2): "value", (1, 1): "key"}),
    ("ascii", {(0, 1): "key, value", (0, 2): "value", (1, 1): "key"}),
    ("latin-1", {}),  # every byte string is valid
])
def test_spark_read_dead_letters_what_it_cannot_decode(spark, kafka_broker, kafka_topic, encoding, undecodable):
    """on_bad_record="dead_letter": the records that decode are those read() gives; the others come back as
    dead letters with their coordinates, IntoTime, raw bytes and one line of error."""
    topic = kafka_topic(partitions=2, prefix="dl")
    for partition, records in enumerate(BAD_RECORDS):
        produce(kafka_broker, topic, records, partition=partition)
    spec = kafka_spec_of(kafka_broker, topic, encoding=encoding)
    ranges = [(7, 0, 0, 3), (8, 1, 0, 2)]
    records, dead_letters = spark_source.split_bad_records(read_ranges(spark, spec, ranges, on_bad_record="dead_letter"),
                                                           "s")
    with build_source(spec) as source:
        expected = reference_rows_for(source, [(t, p, o, o + 1) for t, p, s, e in ranges for o in range(s, e)
                                               if (p, o) not in undecodable])
    assert rows_of(records) == expected
    raw = lambda v: v.encode() if isinstance(v, str) else v  # noqa: E731
    assert sorted(tuple(r) for r in dead_letters.collect()) == [
        ("s", p, o, 7 + p, raw(BAD_RECORDS[p][o][0]), raw(BAD_RECORDS[p][o][1]),
         f"topic {topic!r} partition {p} offset {o}: record is not valid {encoding} (undecodable {what})")
        for (p, o), what in sorted(undecodable.items())]


def test_dead_letters_need_a_read_that_goes_on(spark, kafka_broker, kafka_topic):
    topic = kafka_topic(partitions=1, prefix="dl")
    produce(kafka_broker, topic, ["x"])
    empty = read_ranges(spark, kafka_spec_of(kafka_broker, topic), [], on_bad_record="dead_letter")
    assert empty.columns == COLUMNS + list(spark_source.BAD_RECORD_COLUMNS) and empty.count() == 0
    with pytest.raises(SourceError, match="cannot dead-letter records .* record by record"):
        read_ranges(spark, kafka_spec_of(kafka_broker, topic, encoding="utf-16-le"), [(1, 0, 0, 1)],
                    on_bad_record="dead_letter")
    with pytest.raises(SourceError, match="on_bad_record must be one of"):
        read_ranges(spark, kafka_spec_of(kafka_broker, topic), [(1, 0, 0, 1)], on_bad_record="skip")


def test_a_read_that_fails_on_bad_records_is_not_split():
    """With ``on_bad_record: fail`` (the default) the read has no bad-record columns: the step does not ask Spark
    for the frame's columns (with Spark Connect, a round trip to the server) to find that out."""
    class Unasked:
        @property
        def columns(self):
            raise AssertionError("asked Spark for the frame's columns")

    frame = Unasked()
    assert spark_source.split_bad_records(frame, "s", "fail") == (frame, None)
    with pytest.raises(AssertionError, match="asked Spark"):
        spark_source.split_bad_records(frame, "s", "dead_letter")


def test_python_read_dead_letters_what_its_source_cannot_decode(spark, tmp_path):
    """A source without a native read whose read yields BadRecords (files) is read with on_bad_record="dead_letter"
    by the Python data source: the lines that decode as with "fail", the others as dead letters with their
    coordinates, IntoTime, raw bytes (as value, no key) and the error "fail" stops at."""
    from reclock.sources.files import fingerprint

    (tmp_path / "a.log").write_bytes(b"a0\n\xc3\x28\na2\n\x80\n")  # lines at bytes 0, 3, 6, 9
    (tmp_path / "b.log").write_bytes(b"b0\n")
    a, b = fingerprint(b"a0\n"), fingerprint(b"b0\n")
    spec = {"kind": "files", "url": str(tmp_path)}
    ranges = [(7, a, 0, 6), (8, a, 6, 11), (8, b, 0, 3)]
    read = read_ranges(spark, spec, ranges, on_bad_record="dead_letter")
    records, dead_letters = spark_source.split_bad_records(read, "s")
    assert sorted(tuple(r) for r in records.collect()) == [("a0", a, 0, 7, 1), ("a2", a, 6, 8, 1), ("b0", b, 0, 8, 1)]
    with build_source(spec) as source:
        errors = {}
        for offset, end in ((3, 6), (9, 11)):
            with pytest.raises(SourceError) as failed:
                list(source.read(a, offset, end))
            errors[offset] = str(failed.value)
    assert sorted(tuple(r) for r in dead_letters.collect()) == [
        ("s", a, 3, 7, None, b"\xc3\x28", errors[3]), ("s", a, 9, 8, None, b"\x80", errors[9])]
    assert "byte offset 9: line is not valid utf-8" in errors[9]
    empty = read_ranges(spark, spec, [], on_bad_record="dead_letter")
    assert empty.columns == ["line", "partition", "offset", "into_time", "diff", *spark_source.BAD_RECORD_COLUMNS]
    assert empty.count() == 0


def test_files_are_not_cut_inside_a_line(spark, tmp_path, monkeypatch):
    """A file's binding wider than a read task (``MAX_TASK_OFFSETS``) is read whole: a cut at a byte inside a line
    would fail the read ("not the start of a line"); every line once, with its binding's IntoTime."""
    from reclock.sources.files import fingerprint

    lines = [f"line {i:04d}\n".encode() for i in range(40)]  # 10 bytes each
    (tmp_path / "a.log").write_bytes(b"".join(lines))
    a, spec = fingerprint(lines[0]), {"kind": "files", "url": str(tmp_path)}
    monkeypatch.setattr(spark_source, "MAX_TASK_OFFSETS", 7)  # every cut of the old segmentation inside a line
    rows = read_ranges(spark, spec, [(5, a, 0, 250), (6, a, 250, 400)]).collect()
    assert sorted((r["offset"], r["line"], r["into_time"]) for r in rows) == [
        (10 * i, f"line {i:04d}", 5 if i < 25 else 6) for i in range(40)]


def reference_rows_for(source, ranges) -> list[tuple]:
    """Each range read record by record, stamped with its IntoTime."""
    return by_position((d["key"], d["value"], d["timestamp_ms"], p, o, t, diff)
                       for t, p, s, e in ranges for d, o, diff in source.read(p, s, e))


def test_spark_read_refuses_unreadable_ranges(spark, kafka_spec):
    topic = kafka_spec["topic"]
    with pytest.raises(SourceError, match=rf"topic '{topic}' partition 1: range \[2, 9\) reaches beyond"):
        read_ranges(spark, kafka_spec, [(1, 1, 0, 2), (2, 1, 2, 9)])
    with pytest.raises(SourceError, match=rf"topic '{topic}' has no partition 7"):
        read_ranges(spark, kafka_spec, [(1, 7, 0, 1)])
    with pytest.raises(SourceError, match=r"partition 0: ranges \[0, 3\) \(IntoTime 1\) and \[2, 4\) \(IntoTime 2\) overlap"):
        read_ranges(spark, kafka_spec, [(1, 0, 0, 3), (2, 0, 2, 4)])
    delete_records(kafka_spec["bootstrap_servers"], topic, 0, before=2)
    with pytest.raises(SourceError, match=rf"topic '{topic}' partition 0: offsets \[1, 2\) were released upstream"):
        read_ranges(spark, kafka_spec, [(1, 0, 1, 3)])
    assert [r.value for r in read_ranges(spark, kafka_spec, [(1, 0, 2, 4)]).orderBy("offset").collect()] == ["x2", "x3"]


def test_spark_range_rows_and_spans():
    rows = spark_range_rows("t", [(3000, 1, 4, 6), (1000, 0, 0, 2), (2000, 0, 2, 2), (2000, 0, 2, 5), (1000, 1, 0, 4)])
    assert rows == [(0, 0, 2, 1000), (0, 2, 5, 2000), (1, 0, 4, 1000), (1, 4, 6, 3000)]
    assert partition_spans(rows) == {0: (0, 5), 1: (0, 6)}
    assert spark_range_rows("t", []) == [] and partition_spans([]) == {}
    with pytest.raises(SourceError, match="int32"):
        spark_range_rows("t", [(1, -1, 0, 1)])
    with pytest.raises(SourceError, match="overlap"):
        spark_range_rows("t", [(1, 0, 0, 3), (2, 0, 1, 2)])


@pytest.mark.parametrize("rows, into_time", [
    ([], None),                                                 # nothing to read
    ([(0, 0, 5, 1000)], 1000),                                  # one binding, one partition
    ([(0, 0, 5, 1000), (1, 3, 9, 1000), (7, 0, 1, 1000)], 1000),  # one binding, three partitions
    ([(0, 0, 5, 1000), (0, 5, 8, 1000)], 1000),                 # contiguous ranges of one IntoTime
    ([(0, 0, 5, 1000), (1, 0, 5, 2000)], None),                 # two bindings, one in each partition
    ([(0, 0, 5, 1000), (0, 5, 8, 2000)], None),                 # two bindings in one partition
    ([(0, 0, 5, 1000), (0, 6, 8, 1000)], None),                 # a gap: offset 5 is read but not covered
])
def test_one_into_time(rows, into_time):
    assert one_into_time(rows) == into_time


@pytest.mark.parametrize("spans, tasks, natural", [
    ({}, 0, 0),                                             # nothing to read
    ({0: (0, 100)}, 1, 1),                                  # one small partition: its own task
    ({p: (0, 10) for p in range(8)}, 1, 8),                 # 80 offsets: one task reads all 8 partitions
    ({p: (5, 35) for p in range(8)}, 3, 8),                 # 240 offsets: ceil(240 / 100) tasks
    ({0: (0, 400), 1: (0, 0)}, 1, 1),                       # an empty span is no task
    ({0: (0, 1050)}, 3, 3),                                 # split at 500 offsets by Spark, never coalesced
    ({p: (0, 600) for p in range(4)}, 8, 8),                # wide partitions: as Spark splits them
    ({p: (0, 60) for p in range(64)}, 39, 64),              # 3,840 offsets
    ({p: (0, 1) for p in range(40)}, 3, 40),                # 40 offsets, but at most 16 partitions a task
    ({p: (0, 1) for p in range(16)}, 1, 16),
])
def test_read_tasks(spans, tasks, natural):
    assert read_tasks(spans, max_offsets=500, min_offsets=100, max_partitions=16) == (tasks, natural)


def test_small_partitions_are_read_in_fewer_tasks(spark, kafka_broker, kafka_topic, monkeypatch):
    """Many small partitions are read by a few tasks (``MIN_TASK_OFFSETS`` each at least), each partition whole,
    every record once with its range's IntoTime."""
    topic = kafka_topic(partitions=6, prefix="small")
    for p in range(6):
        produce(kafka_broker, topic, [f"p{p}-{i}" for i in range(5)], partition=p)
    spec = kafka_spec_of(kafka_broker, topic)
    ranges = [(1000, p, 0, 2) for p in range(6)] + [(2000, p, 2, 5) for p in range(6)]
    monkeypatch.setattr(spark_kafka, "MIN_TASK_OFFSETS", 12)
    df = read_ranges(spark, spec, ranges)
    assert df.rdd.getNumPartitions() == 3  # 30 offsets in tasks of 12 at least, instead of 6
    assert sorted((r.partition, r.offset, r.into_time, r.value) for r in df.collect()) == [
        (p, i, 1000 if i < 2 else 2000, f"p{p}-{i}") for p in range(6) for i in range(5)]
    monkeypatch.setattr(spark_kafka, "MIN_TASK_OFFSETS", 1000)
    monkeypatch.setattr(spark_kafka, "MAX_TASK_PARTITIONS", 4)
    df = read_ranges(spark, spec, ranges)
    assert df.rdd.getNumPartitions() == 2  # one task would do for the offsets, but 4 partitions at most each
    assert sorted((r.partition, r.offset, r.into_time, r.value) for r in df.collect()) == [
        (p, i, 1000 if i < 2 else 2000, f"p{p}-{i}") for p in range(6) for i in range(5)]
    monkeypatch.setattr(spark_kafka, "MIN_TASK_OFFSETS", 1)
    assert read_ranges(spark, spec, ranges).rdd.getNumPartitions() == 6  # one per partition, as Spark reads them


def _consumers(spark, group: str, topic: str) -> set[tuple[str, str]]:
    """``(client id, partition)`` of the Kafka consumers of ``group`` alive in the local session's JVM that fetch a
    partition of ``topic`` (their per-partition JMX beans; other tests' reads with the same options share the
    group, each of other partitions, and Spark's pool closes those idle for 5 minutes)."""
    gateway, jvm = spark.sparkContext._gateway, spark.sparkContext._jvm
    pattern = jvm.javax.management.ObjectName("kafka.consumer:type=consumer-fetch-manager-metrics,*")
    types = gateway.new_array(jvm.java.lang.Class, 2)  # the platform server's class is not exported: its interface
    types[0], types[1] = (jvm.java.lang.Class.forName(f"javax.management.{c}") for c in ("ObjectName", "QueryExp"))
    args = gateway.new_array(jvm.java.lang.Object, 2)
    args[0] = pattern
    beans = jvm.java.lang.Class.forName("javax.management.MBeanServer").getMethod("queryNames", types).invoke(
        jvm.java.lang.management.ManagementFactory.getPlatformMBeanServer(), args)
    return {(b.getKeyProperty("client-id"), b.getKeyProperty("partition")) for b in beans
            if f"-{group}-" in b.getKeyProperty("client-id") and b.getKeyProperty("topic") == topic
            and b.getKeyProperty("partition") is not None}


def test_a_read_takes_the_consumers_the_read_before_left(spark, kafka_spec):
    """Spark's reads of a source share a consumer group (:func:`reader_group`): a second read of the same
    partitions takes the consumers the first left in Spark's pool instead of making new ones, and the group is
    never joined or committed to (the broker does not know it)."""
    from confluent_kafka.admin import AdminClient

    with build_source(kafka_spec) as source:
        group = spark_options(source, {0: (0, 8)})["kafka.group.id"]
    ranges = [(1000, 0, 0, 8), (1000, 1, 0, 3)]
    assert len(read_ranges(spark, kafka_spec, ranges).collect()) == 9
    first = _consumers(spark, group, kafka_spec["topic"])
    assert len(read_ranges(spark, kafka_spec, ranges).collect()) == 9
    assert {p for _, p in first} == {"0", "1"} and _consumers(spark, group, kafka_spec["topic"]) == first
    admin = AdminClient({"bootstrap.servers": kafka_spec["bootstrap_servers"]})
    assert group not in {g.group_id for g in admin.list_consumer_groups().result(timeout=30).valid}


def test_reader_group_is_a_digest_of_every_option_and_none_with_credentials():
    base = {"kafka.bootstrap.servers": "b:9092", "kafka.isolation.level": "read_committed",
            "kafka.fetch.max.wait.ms": "3"}
    group = reader_group(base)["kafka.group.id"]
    assert group.startswith("reclock-read-") and reader_group(dict(reversed(base.items()))) == {"kafka.group.id": group}
    for key, value in [("kafka.isolation.level", "read_uncommitted"), ("kafka.client.id", "x"),
                       ("kafka.fetch.max.wait.ms", "4"), ("kafka.bootstrap.servers", "c:9092")]:
        assert reader_group({**base, key: value})["kafka.group.id"] != group
    assert reader_group({**base, "kafka.sasl.jaas.config": 'PlainLoginModule required password="pw";'}) == {}


def test_a_reader_group_of_options_with_credentials_is_keyed():
    """Options carrying a password get a group only with a key, an HMAC of the options: it changes with the password
    (Spark refuses one group with two sets of options) and with the key, and a digest of the options alone (what a
    guess of the password could be tested against) is not it."""
    import hashlib
    import json

    creds = {"kafka.bootstrap.servers": "b:9092", "kafka.sasl.jaas.config": 'PlainLoginModule required password="pw";'}
    group = reader_group(creds, b"k1")["kafka.group.id"]
    assert group.startswith("reclock-read-") and reader_group(dict(reversed(creds.items())), b"k1")["kafka.group.id"] == group
    other = {**creds, "kafka.sasl.jaas.config": 'PlainLoginModule required password="pw2";'}
    assert reader_group(other, b"k1")["kafka.group.id"] != group
    assert reader_group(creds, b"k2")["kafka.group.id"] != group
    plain = hashlib.sha256(json.dumps(sorted(creds.items())).encode()).hexdigest()[:24]
    assert plain not in group and "pw" not in group


def test_the_read_key_is_made_once_for_its_owner_and_read_after(tmp_path, monkeypatch):
    import os
    import stat

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    key = read_key()
    path = tmp_path / "state" / "reclock" / "read-key"
    assert key is not None and len(key) == 64 and path.read_bytes() == key
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and os.listdir(path.parent) == ["read-key"]
    assert read_key() == key  # read, not made again
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "file"))  # no directory can be made under a file
    assert read_key() is None


def test_reads_with_credentials_take_the_consumers_the_read_before_left(spark, kafka_broker, kafka_topic, tmp_path,
                                                                        monkeypatch):
    """A source whose config carries SASL credentials (here over PLAINTEXT, where the Java client leaves them unused)
    reads in a keyed group (:func:`read_key`), so its second read takes the consumers its first left, as a source
    without credentials does; without a key each read had a group of its own, and the first read's consumers idled
    in Spark's pool until closed."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    topic = kafka_topic(partitions=2, prefix="sasl")
    produce(kafka_broker, topic, [(f"k{i}", f"v{i}") for i in range(4)], partition=0)
    spec = kafka_spec_of(kafka_broker, topic, config={"sasl.mechanism": "PLAIN", "sasl.username": "ann",
                                                      "sasl.password": "not-used-over-plaintext"})
    with build_source(spec) as source:
        options = spark_options(source, {0: (0, 4)})
    assert "kafka.sasl.jaas.config" in options
    group = options["kafka.group.id"]
    ranges = [(1000, 0, 0, 4)]
    assert len(read_ranges(spark, spec, ranges).collect()) == 4
    first = _consumers(spark, group, topic)
    assert len(read_ranges(spark, spec, ranges).collect()) == 4
    assert {p for _, p in first} == {"0"} and _consumers(spark, group, topic) == first


@pytest.mark.parametrize("config, wait", [({}, "3"), ({"fetch.wait.max.ms": 200}, "200")])
def test_spark_reads_do_not_wait_at_the_log_end(kafka_broker, config, wait):
    """Spark's reads fetch with a short ``fetch.max.wait.ms`` (a span ends at the log end, where the Java client's
    default 500 ms is paid by every task), unless the source's config sets librdkafka's ``fetch.wait.max.ms``."""
    spec = {"kind": "kafka", "bootstrap_servers": kafka_broker, "topic": "t", "group_id": "g", "config": config}
    with build_source(spec) as source:
        assert spark_options(source, {0: (0, 5)})["kafka.fetch.max.wait.ms"] == wait


def test_spark_client_options(kafka_broker):
    certifi = pytest.importorskip("certifi")  # a real PEM file: librdkafka loads it when the client is made
    ca = certifi.where()
    config = {"client.id": "reclock", "security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512",
              "sasl.username": "ann", "sasl.password": 'p"w\\', "ssl.ca.location": ca,
              "ssl.endpoint.identification.algorithm": "none", "fetch.wait.max.ms": 50, "debug": "fetch",
              "statistics.interval.ms": 0, "enable.partition.eof": True}
    with build_source({"kind": "kafka", "bootstrap_servers": kafka_broker, "topic": "t", "group_id": "g",
                       "config": config}):
        pass  # librdkafka accepts every key
    assert spark_client_options(config) == {
        "kafka.client.id": "reclock",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                  'username="ann" password="p\\"w\\\\";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": ca,
        "kafka.ssl.endpoint.identification.algorithm": "",
        "kafka.fetch.max.wait.ms": "50",
    }
    assert spark_client_options({}) == {}
    with pytest.raises(SourceError, match="'ssl.key.location' cannot be passed to Spark"):
        spark_client_options({"ssl.key.location": "/k.pem"})
    with pytest.raises(SourceError, match="OAUTHBEARER"):
        spark_client_options({"sasl.mechanism": "OAUTHBEARER", "sasl.username": "u"})
