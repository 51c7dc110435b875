"""Kafka topic lifecycle against what remap bound (issue 11): recreated and shrunk topics are refused until
``new-epoch`` starts the source over on them (what was published stays as it was), a source starts where
``starting_offsets`` says (never where a reused consumer group stands), and records lost to retention stop
the source until ``accept-lost`` records the gap.  Real broker, Spark and Delta."""
from __future__ import annotations

import re
import time

import pytest
from conftest import over_connect, reclocked_rows, run_cli, write_config

from devtools.kafka_broker import delete_records, produce, recreate_topic
from reclock import epochs, pipeline, runtime
from reclock.backfill import BackfillError, replay
from reclock.clock import now_ms
from reclock.engine import Frontier
from reclock.query import query_as_of
from reclock.status import status
from reclock.sources.base import SourceError
from reclock.sources.kafka import KafkaSource

pytestmark = pytest.mark.slow


@pytest.fixture
def topic(kafka_topic):
    return kafka_topic(partitions=1, prefix="life")


def config_for(tmp_path, kafka_broker, topic, **options) -> str:
    return write_config(tmp_path, kafka_broker, {"events": topic}, **options)


def offsets(config) -> list[int]:
    return sorted(r[2] for r in reclocked_rows("events", config))


def upper(config) -> int:
    with runtime.open_source("events", config, connect=False) as ctx:
        return ctx.tables.remap_upper()


def values(n: int, first: int = 0, partition: int = 0) -> list[tuple]:
    return [(f"k{i}", f"v{i}", partition) for i in range(first, first + n)]


def test_a_recreated_topic_is_refused(kafka_broker, spark, topic, tmp_path):
    config = config_for(tmp_path, kafka_broker, topic)
    produce(kafka_broker, topic, values(5))
    pipeline.run_once("events", config, spark, now=1_000)
    recreate_topic(kafka_broker, topic, partitions=1)
    produce(kafka_broker, topic, values(8))  # the new topic grows past the old offsets
    with pytest.raises(SourceError, match=r"events .*kafka\.topic_id was '.+' when remap's epoch began, now '.+'.*"
                                          r"nothing written.*reclock new-epoch"):
        pipeline.tick("events", config, now=2_000, spark=spark)
    assert upper(config) == 1_001 and offsets(config) == [0, 1, 2, 3, 4]


def test_a_topic_with_fewer_partitions_is_refused(kafka_broker, spark, kafka_topic, tmp_path):
    topic = kafka_topic(partitions=2, prefix="shrink")
    config = config_for(tmp_path, kafka_broker, topic)
    produce(kafka_broker, topic, values(3, partition=1))
    pipeline.tick("events", config, now=1_000, spark=spark)
    recreate_topic(kafka_broker, topic, partitions=1)
    with pytest.raises(SourceError, match=r"partition 1: upstream upper 0 is below the bound offset 3 \(the "
                                          r"partition no longer exists\)"):
        pipeline.tick("events", config, now=2_000, spark=spark)


def test_a_log_starting_above_zero_starts_there(kafka_broker, spark, topic, tmp_path):
    config = config_for(tmp_path, kafka_broker, topic)
    produce(kafka_broker, topic, values(10))
    delete_records(kafka_broker, topic, 0, before=5)  # retention already removed offsets 0..4
    pipeline.run_once("events", config, spark, now=1_000)
    assert offsets(config) == [5, 6, 7, 8, 9]
    # a backfill of that first window replays it from the recorded start, not from offset 0
    assert replay("events", config, 1_000, 1_000, spark=spark)["replayed"]["rows"] == 5


def test_a_reused_consumer_group_does_not_move_the_start(kafka_broker, spark, topic, tmp_path):
    config = config_for(tmp_path, kafka_broker, topic)
    produce(kafka_broker, topic, values(10))
    with KafkaSource(kafka_broker, topic, group_id=f"g-{topic}") as other_application:
        other_application.commit(Frontier.of({0: 6}))
    pipeline.run_once("events", config, spark, now=1_000)
    assert offsets(config) == list(range(10))


@pytest.mark.parametrize("starting", ["latest", "timestamp"])
def test_starting_offsets(kafka_broker, spark, topic, tmp_path, starting):
    produce(kafka_broker, topic, values(4))
    time.sleep(0.05)
    start = now_ms()
    time.sleep(0.05)
    produce(kafka_broker, topic, values(2, first=4))
    config = config_for(tmp_path, kafka_broker, topic,
                        starting_offsets="latest" if starting == "latest" else start)
    pipeline.run_once("events", config, spark, now=1_000)
    produce(kafka_broker, topic, values(3, first=6))
    pipeline.run_once("events", config, spark, now=2_000)
    assert offsets(config) == ([6, 7, 8] if starting == "latest" else [4, 5, 6, 7, 8])


def test_bad_starting_offsets_name_the_topic(kafka_broker, topic):
    with pytest.raises(SourceError, match=f"topic '{topic}': starting_offsets must be one of"):
        KafkaSource(kafka_broker, topic, group_id="g", starting_offsets="beginning")


def test_retention_overtaking_bound_records_stops_until_the_gap_is_accepted(kafka_broker, spark, topic, tmp_path):
    config = config_for(tmp_path, kafka_broker, topic)
    produce(kafka_broker, topic, values(4))
    pipeline.run_once("events", config, spark, now=1_000)
    produce(kafka_broker, topic, values(6, first=4))
    pipeline.tick("events", config, now=2_000, spark=spark)  # binds 4..9 at 2000, not yet published
    delete_records(kafka_broker, topic, 0, before=7)  # retention removes 4..6 before staging reads them
    with pytest.raises(SourceError, match=r"bindings 1001\.\.2000 need records the upstream no longer holds.*"
                                          r"partition 0: offsets \[4, 7\) were released"):
        pipeline.stage("events", config, spark)
    produce(kafka_broker, topic, values(2, first=10))
    delete_records(kafka_broker, topic, 0, before=11)  # 10 is lost too, never bound
    with pytest.raises(SourceError, match=r"offsets \[10, 11\) were released upstream"):
        pipeline.tick("events", config, now=3_000, spark=spark)

    lost = epochs.accept_lost("events", config, spark)["lost"]
    assert [(g["partition"], g["start"], g["end"], g["bound_at"]) for g in lost] == [(0, 4, 11, [2_000, None])]
    pipeline.run_once("events", config, spark, now=3_000)
    assert offsets(config) == [0, 1, 2, 3, 11]
    with runtime.open_source("events", config, connect=False) as ctx:
        assert ctx.tables.upstream_record().gaps == lost  # the gap stays on record with remap
    assert epochs.accept_lost("events", config, spark)["lost"] == []


# --- new epochs ---------------------------------------------------------------------------------------


def topic_id(kafka_broker, topic) -> str:
    with KafkaSource(kafka_broker, topic, group_id="identity") as source:
        return source.identity()["kafka.topic_id"]


def as_of(spark, config, t: int) -> list[str]:
    return sorted(r.value for r in query_as_of(spark, "SELECT value FROM events", t, ["events"], config).collect())


def test_new_epochs_on_recreated_topics_keep_what_was_published(kafka_broker, spark, spark_connect, kafka_topic,
                                                                 tmp_path):
    """Recreated twice, the second time with fewer partitions: each time the tick refuses, naming both topic IDs,
    until ``reclock new-epoch``; then the new topic's records are bound at later IntoTimes, once each."""
    topic = kafka_topic(partitions=2, prefix="epoch")
    config = config_for(tmp_path, kafka_broker, topic)
    old = values(15) + values(15, first=15, partition=1)
    produce(kafka_broker, topic, old)
    pipeline.run_once("events", config, spark, now=1_000)
    first_id = topic_id(kafka_broker, topic)

    recreate_topic(kafka_broker, topic, partitions=2)
    second_id = topic_id(kafka_broker, topic)
    new = values(12, first=100) + values(8, first=112, partition=1)
    produce(kafka_broker, topic, new)
    with pytest.raises(SourceError, match=re.escape(f"kafka.topic_id was '{first_id}' when remap's epoch began, now "
                                                    f"'{second_id}'") + ".*reclock new-epoch"):
        pipeline.tick("events", config, now=2_000, spark=spark)
    cli = run_cli(over_connect(config, spark_connect), "new-epoch", "events")
    output = cli.communicate(timeout=300)[0].decode()
    assert cli.returncode == 0 and f'"kafka.topic_id": "{second_id}"' in output, output[-3000:]
    pipeline.run_once("events", config, spark, now=2_000)

    assert as_of(spark, config, 1_000) == sorted(v for _, v, _ in old)
    assert as_of(spark, config, 2_000) == sorted(v for _, v, _ in old + new)
    # one gauge: the new topic's offsets follow the old ones (base {0: 15, 1: 15}), each once
    assert sorted((r[1], r[2]) for r in reclocked_rows("events", config)) == \
        [(0, o) for o in range(27)] + [(1, o) for o in range(23)]
    (row,) = status(config)
    assert (row["bound_frontier"], row["upstream_frontier"], row["lag_offsets"]) == ({"0": 27, "1": 23},) * 2 + (0,)
    assert pipeline.resume("events", config)["upstream_offsets"] == {"0": 12, "1": 8}
    with KafkaSource(kafka_broker, topic, group_id=f"g-{topic}") as group:  # the new topic's own offsets
        assert group.committed() == Frontier.of({0: 12, 1: 8})

    recreate_topic(kafka_broker, topic, partitions=1)  # fewer partitions this time
    third_id = topic_id(kafka_broker, topic)
    newer = values(7, first=200)
    produce(kafka_broker, topic, newer)
    with pytest.raises(SourceError, match=re.escape(f"'{second_id}' when remap's epoch began, now '{third_id}'") + ".*partition 1: "
                                          r"upstream upper 15 is below the bound offset 23"):  # in the gauge: base 15 + 0
        pipeline.tick("events", config, now=3_000, spark=spark)
    epoch = epochs.new_epoch("events", config, spark)
    assert (epoch["epoch"], epoch["began_at"], epoch["base"]) == (2, 2_001, {"0": 27, "1": 23})
    pipeline.run_once("events", config, spark, now=3_000)

    assert as_of(spark, config, 1_000) == sorted(v for _, v, _ in old)
    assert as_of(spark, config, 2_000) == sorted(v for _, v, _ in old + new)
    assert as_of(spark, config, 3_000) == sorted(v for _, v, _ in old + new + newer)
    assert status(config)[0]["lag_offsets"] == 0
    # a backfill replays the current epoch's windows, and refuses earlier epochs' (their topics are gone)
    assert replay("events", config, 3_000, 3_000, spark=spark)["replayed"]["rows"] == 7
    with pytest.raises(BackfillError, match="earlier epoch"):
        replay("events", config, 2_000, 2_000, spark=spark)
    with pytest.raises(SourceError, match="still the stream remap has bound"):
        epochs.new_epoch("events", config, spark)


def test_records_bound_before_the_topic_was_recreated_are_accepted_lost_first(kafka_broker, spark, topic, tmp_path):
    """Bound but unpublished when the topic went: staging and new-epoch refuse (the new topic must not serve
    them) until accept-lost records them as lost."""
    config = config_for(tmp_path, kafka_broker, topic)
    produce(kafka_broker, topic, values(4))
    pipeline.run_once("events", config, spark, now=1_000)
    produce(kafka_broker, topic, values(3, first=4))
    pipeline.tick("events", config, now=2_000, spark=spark)  # binds 4..6, not yet published
    recreate_topic(kafka_broker, topic, partitions=1)
    produce(kafka_broker, topic, values(9, first=100))  # offsets 0..8 of the new topic: other records
    with pytest.raises(SourceError, match="bindings 1001..2000 need records of the upstream they were bound from, "
                                          "which was replaced"):
        pipeline.stage("events", config, spark)
    with pytest.raises(SourceError, match=r"partition 0: offsets \[4, 7\) bound at IntoTime 2000 are not published.*"
                                          "accept-lost"):
        epochs.new_epoch("events", config, spark)

    lost = epochs.accept_lost("events", config, spark)["lost"]
    assert [(g["partition"], g["start"], g["end"], g["bound_at"]) for g in lost] == [(0, 4, 7, [2_000, 2_000])]
    assert epochs.new_epoch("events", config, spark)["base"] == {"0": 7}
    pipeline.run_once("events", config, spark, now=3_000)
    assert as_of(spark, config, 2_000) == [f"v{i}" for i in range(4)]
    assert as_of(spark, config, 3_000) == sorted([f"v{i}" for i in range(4)] + [f"v{i}" for i in range(100, 109)])
    assert offsets(config) == [0, 1, 2, 3] + list(range(7, 16))
