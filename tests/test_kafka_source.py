"""KafkaSource against a real Apache Kafka broker (KRaft, devtools.kafka_broker)."""
from __future__ import annotations

import pickle
import time
import uuid

import pytest

from devtools.kafka_broker import (BrokerError, LocalBroker, Transaction, add_partitions, create_topic, delete_records,
                            produce, produce_transaction)
from reclock.engine import Frontier
from reclock.sources import build_source
from reclock.sources.base import SourceError
from reclock.sources.kafka import KafkaSource

pytestmark = pytest.mark.slow


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def topic2(kafka_topic):
    """A fresh topic with two partitions."""
    return kafka_topic(partitions=2)


@pytest.fixture
def source(kafka_broker, topic2):
    src = KafkaSource(kafka_broker, topic2, group_id=_name("g"), timeout_s=5)
    yield src
    src.close()


def values(rows):
    return [(offset, data["key"], data["value"], diff) for data, offset, diff in rows]


def test_upper_moves_as_records_are_produced(kafka_broker, topic2, source):
    assert source.upper() == Frontier()
    produce(kafka_broker, topic2, [("a", "1"), ("b", "2")], partition=0)
    assert source.upper() == Frontier.of({0: 2})
    produce(kafka_broker, topic2, [("c", "3")], partition=1)
    produce(kafka_broker, topic2, [("d", "4")], partition=0)
    assert source.upper() == Frontier.of({0: 3, 1: 1})


def test_read_exact_ranges_two_partitions_repeatable(kafka_broker, topic2, source):
    produce(kafka_broker, topic2, [(f"k{i}", f"v{i}") for i in range(6)], partition=0)
    produce(kafka_broker, topic2, [(f"q{i}", f"w{i}") for i in range(4)], partition=1)
    before = int(time.time() * 1000) - 60_000

    rows = list(source.read(0, 2, 5))
    assert values(rows) == [(2, "k2", "v2", 1), (3, "k3", "v3", 1), (4, "k4", "v4", 1)]
    assert all(before < data["timestamp_ms"] < before + 3_600_000 for data, _, _ in rows)
    assert set(rows[0][0]) == {"key", "value", "timestamp_ms"}

    assert values(source.read(1, 0, 4)) == [(i, f"q{i}", f"w{i}", 1) for i in range(4)]
    assert values(source.read(1, 3, 4)) == [(3, "q3", "w3", 1)]
    assert list(source.read(0, 4, 4)) == []
    # Repeatable, and reads in any order on the same source do not disturb each other.
    assert values(source.read(0, 2, 5)) == values(rows)
    assert values(source.read(0, 0, 6)) == [(i, f"k{i}", f"v{i}", 1) for i in range(6)]
    assert values(source.read(0, 5, 6)) == [(5, "k5", "v5", 1)]
    # Two reads interleaved.
    a, b = source.read(0, 0, 3), source.read(1, 0, 3)
    interleaved = [next(a), next(b), next(a), next(b)]
    assert [(o, d["key"]) for d, o, _ in interleaved] == [(0, "k0"), (0, "q0"), (1, "k1"), (1, "q1")]
    assert [o for _, o, _ in a] == [2] and [o for _, o, _ in b] == [2]


def test_null_key_and_value(kafka_broker, topic2, source):
    produce(kafka_broker, topic2, [(None, "only-value"), ("only-key", None)], partition=0)
    assert [(d["key"], d["value"]) for d, _, _ in source.read(0, 0, 2)] == [(None, "only-value"), ("only-key", None)]


def test_read_beyond_upper_is_an_error(kafka_broker, topic2, source):
    produce(kafka_broker, topic2, ["x"], partition=0)
    with pytest.raises(SourceError, match="beyond"):
        list(source.read(0, 0, 5))


def test_new_partition_appears_in_upper(kafka_broker, topic2, source):
    produce(kafka_broker, topic2, ["a"], partition=1)
    assert source.upper() == Frontier.of({1: 1})
    assert source.partitions() == [0, 1]
    add_partitions(kafka_broker, topic2, 3)
    produce(kafka_broker, topic2, ["n1", "n2"], partition=2)
    assert source.partitions() == [0, 1, 2]
    assert source.upper() == Frontier.of({1: 1, 2: 2})
    assert [d["value"] for d, _, _ in source.read(2, 0, 2)] == ["n1", "n2"]


def test_commit_committed_round_trip(kafka_broker, topic2, source):
    produce(kafka_broker, topic2, ["a", "b", "c"], partition=0)
    produce(kafka_broker, topic2, ["d", "e"], partition=1)
    assert source.committed() == Frontier()
    source.commit(Frontier())  # nothing to commit is fine
    source.commit(Frontier.of({0: 2}))
    assert source.committed() == Frontier.of({0: 2})
    source.commit(Frontier.of({0: 3, 1: 2}))
    assert source.committed() == Frontier.of({0: 3, 1: 2})
    # Another client of the same group sees the same offsets; another group sees none.
    with KafkaSource(kafka_broker, topic2, group_id=source.group_id) as same:
        assert same.committed() == Frontier.of({0: 3, 1: 2})
    with KafkaSource(kafka_broker, topic2, group_id=_name("other")) as other:
        assert other.committed() == Frontier()


def test_read_committed_hides_open_transaction_and_skips_aborted(kafka_broker, topic2, source):
    produce(kafka_broker, topic2, ["c0", "c1"], partition=0)  # offsets 0, 1
    produce_transaction(kafka_broker, topic2, ["ab0", "ab1"], partition=0, commit=False)  # 2, 3 + marker 4
    produce_transaction(kafka_broker, topic2, ["ok0"], partition=0, commit=True)  # 5 + marker 6
    assert source.upper() == Frontier.of({0: 7})

    uncommitted = KafkaSource(kafka_broker, topic2, group_id=_name("g"), isolation_level="read_uncommitted",
                              timeout_s=5)
    txn = Transaction(kafka_broker, topic2)
    try:
        txn.produce(["open0", "open1"], partition=0)  # 7, 8: written, not committed
        produce(kafka_broker, topic2, ["after-open"], partition=1)
        # read_committed: the upper stops at the last stable offset (the open transaction's first offset).
        assert source.upper() == Frontier.of({0: 7, 1: 1})
        assert uncommitted.upper() == Frontier.of({0: 9, 1: 1})
        assert [(o, d["value"]) for d, o, _ in source.read(0, 0, 7)] == [(0, "c0"), (1, "c1"), (5, "ok0")]
        # A range ending on a gap (aborted records, control marker) stops without waiting.
        t0 = time.monotonic()
        assert [o for _, o, _ in source.read(0, 1, 5)] == [1]
        assert [o for _, o, _ in source.read(0, 2, 5)] == []
        assert time.monotonic() - t0 < 3
        assert [(o, d["value"]) for d, o, _ in uncommitted.read(0, 0, 9)] == [
            (0, "c0"), (1, "c1"), (2, "ab0"), (3, "ab1"), (5, "ok0"), (7, "open0"), (8, "open1")]
        txn.commit()  # 7, 8 + marker 9
        assert source.upper() == Frontier.of({0: 10, 1: 1})
        assert [(o, d["value"]) for d, o, _ in source.read(0, 5, 10)] == [(5, "ok0"), (7, "open0"), (8, "open1")]
    finally:
        if not txn.done:
            txn.abort()
        uncommitted.close()


def test_undecodable_record_is_a_source_error(kafka_broker, topic2, source):
    produce(kafka_broker, topic2, [("fine", "ok"), (b"k", b"\xff\xfe not utf-8")], partition=1)
    assert values(source.read(1, 0, 1)) == [(0, "fine", "ok", 1)]
    with pytest.raises(SourceError, match=rf"topic '{topic2}' partition 1 offset 1"):
        list(source.read(1, 0, 2))
    latin = KafkaSource(kafka_broker, topic2, group_id=_name("g"), encoding="latin-1")
    assert [d["value"][:2] for d, _, _ in latin.read(1, 1, 2)] == ["\xff\xfe"]
    latin.close()


def test_read_released_offsets_is_a_source_error(kafka_broker, topic2, source):
    produce(kafka_broker, topic2, ["a", "b", "c", "d"], partition=0)
    try:
        delete_records(kafka_broker, topic2, 0, before=2)
    except BrokerError as e:  # pragma: no cover - depends on the broker
        pytest.skip(f"broker does not support DeleteRecords: {e}")
    assert source.low_watermarks() == Frontier.of({0: 2})
    assert values(source.read(0, 2, 4)) == [(2, None, "c", 1), (3, None, "d", 1)]
    with pytest.raises(SourceError, match="released upstream"):
        list(source.read(0, 1, 4))
    assert source.upper() == Frontier.of({0: 4})


def test_unreachable_broker_fails_within_timeout():
    src = KafkaSource("127.0.0.1:1", "nope", group_id="g", timeout_s=1.5)
    t0 = time.monotonic()
    with pytest.raises(SourceError, match="127.0.0.1:1"):
        src.upper()
    assert time.monotonic() - t0 < 5
    src.close()


def test_bad_config_and_unknown_topic(kafka_broker):
    with pytest.raises(SourceError, match="configuration"):
        KafkaSource(kafka_broker, "t", group_id="g", config={"no.such.property": 1})
    with pytest.raises(SourceError, match="isolation_level"):
        KafkaSource(kafka_broker, "t", group_id="g", isolation_level="dirty")
    with pytest.raises(SourceError, match="encoding"):
        KafkaSource(kafka_broker, "t", group_id="g", encoding="no-such-codec")
    with KafkaSource(kafka_broker, _name("missing"), group_id="g", timeout_s=3) as src:
        with pytest.raises(SourceError, match="topic not available"):
            src.upper()
        with pytest.raises(SourceError, match="partition"):
            list(src.read(-1, 0, 1))


def test_build_source_and_pickle(kafka_broker, topic2):
    produce(kafka_broker, topic2, ["x"], partition=0)
    src = build_source({"kind": "kafka", "bootstrap_servers": kafka_broker, "topic": topic2, "group_id": "g"})
    assert isinstance(src, KafkaSource)
    assert src.upper() == Frontier.of({0: 1})
    clone = pickle.loads(pickle.dumps(src))
    assert clone.upper() == Frontier.of({0: 1})
    src.close()
    clone.close()
    with pytest.raises(SourceError, match="unknown source kind"):
        build_source({"kind": "nope"})
    with pytest.raises(SourceError, match="bad arguments"):
        build_source({"kind": "kafka", "topic": topic2})


def test_local_broker_restart_keeps_data(tmp_path):
    with LocalBroker(data_dir=tmp_path / "d") as broker:
        create_topic(broker.bootstrap, "keep", partitions=1)
        produce(broker.bootstrap, "keep", ["a", "b"])
        pid = broker.pid
    assert not broker.running()
    with pytest.raises(ProcessLookupError):
        import os
        os.kill(pid, 0)
    with LocalBroker(data_dir=tmp_path / "d") as broker:
        with KafkaSource(broker.bootstrap, "keep", group_id="g") as src:
            assert src.upper() == Frontier.of({0: 2})


@pytest.mark.parametrize("draws, expected", [
    ([bytes(16)], "AAAAAAAAAAAAAAAAAAAAAA"),
    ([b"\xf8" + bytes(15), bytes(16)], "AAAAAAAAAAAAAAAAAAAAAA"),  # "-AAA...": an option to kafka-storage
    ([bytes(15) + b"\xf8", b"\xff" * 16], "_____________________w"),  # "AAA...-A" too
])
def test_cluster_id_never_has_a_dash(draws, expected):
    from devtools.kafka_broker import cluster_id

    drawn = iter(draws)
    assert cluster_id(lambda: next(drawn)) == expected


def test_broker_start_failure_reports_log_tail():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(BrokerError, match=rf"(?s)log tail:.*{port}"):
            LocalBroker(port=port, startup_timeout=120).start()  # exits at once; a loaded machine starts the JVM slowly
