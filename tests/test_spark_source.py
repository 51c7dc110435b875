"""The "reclock" PySpark data source reading offset ranges of a Kafka topic."""
from __future__ import annotations

import uuid
from collections import Counter

import pytest
from hypothesis import given, strategies as st

from reclock.broker import create_topic, produce, produce_transaction
from reclock.engine import Range
from reclock.sources.base import SourceError
from reclock.spark_source import read_ranges, segments
from test_engine import remaps

pytestmark = pytest.mark.slow


@pytest.fixture
def kafka_spec(kafka_broker):
    topic = f"s-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker, topic, partitions=2)
    produce(kafka_broker, topic, [(f"a{i}", f"x{i}") for i in range(5)], partition=0)  # 0..4
    produce_transaction(kafka_broker, topic, ["aborted"], partition=0, commit=False)  # 5 + marker 6
    produce(kafka_broker, topic, ["x7"], partition=0)  # 7
    produce(kafka_broker, topic, [(f"b{i}", f"y{i}") for i in range(3)], partition=1)  # 0..2
    return {"kind": "kafka", "bootstrap_servers": kafka_broker, "topic": topic, "group_id": "spark-test",
            "timeout_s": 5}


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
    assert df.rdd.getNumPartitions() == 2  # contiguous ranges of a partition are read by one task


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
