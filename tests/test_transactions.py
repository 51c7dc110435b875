"""Debezium-style transactions over reclocked data and metadata topics (seed 000 addendum, seed 001).

Engine properties are fast (pure Python); the end-to-end test is ``slow`` (broker, Spark, Delta).
"""
from __future__ import annotations

import json
import uuid

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from reclock.config import load_config

from reclock.engine.transactions import (
    BEGIN, EMPTY, END, DataEvent, PublishedTx, TransactionError, TxEvent, TxState, batches, fold,
    fold_with_updates, publish_times, step,
)
from reclock.sources.kafka import KafkaSource
from reclock.transactions import collection_of, parse_data, parse_tx
from reclock.storage import Warehouse

SETTINGS = settings(max_examples=150, deadline=None)


# --- generated well-formed histories ---------------------------------------------------------------


@st.composite
def histories(draw):
    """A Debezium-like history and the IntoTime at which each record arrives (None: not yet).

    Transactions have 0-3 events over two collections, spread over a 2-partition data topic in
    any order; the 1-partition transaction topic has the BEGINs in order and each END somewhere
    after its BEGIN.  Arrival respects each partition's offset order (reclocking is monotone).
    """
    n = draw(st.integers(0, 5))
    events, ends = [], []
    for i in range(n):
        collections = draw(st.lists(st.sampled_from(["s.a", "s.b"]), max_size=3))
        counts = {c: collections.count(c) for c in sorted(set(collections))}
        ends.append((len(collections), tuple(counts.items())))
        events += [(f"tx{i}", c) for c in collections]
    order = draw(st.permutations(range(len(events))))
    partitions = [draw(st.integers(0, 1)) for _ in events]
    next_offset = [0, 0]
    data = []
    for j in order:
        p = partitions[j]
        tx_id, collection = events[j]
        data.append(DataEvent(tx_id, collection, p, next_offset[p], f"row{j}"))
        next_offset[p] += 1
    tokens = [(BEGIN, i) for i in range(n)]
    for i in range(n):
        begin_at = tokens.index((BEGIN, i))
        tokens.insert(draw(st.integers(begin_at + 1, len(tokens))), (END, i))
    txs = [TxEvent(BEGIN, f"tx{i}", 0, o) if s == BEGIN else TxEvent(END, f"tx{i}", 0, o, *ends[i])
           for o, (s, i) in enumerate(tokens)]
    steps = draw(st.integers(1, 4))

    def arrivals(records):
        times = sorted(draw(st.lists(st.integers(1, steps + 1), min_size=len(records), max_size=len(records))))
        return [(10 * t, r) for t, r in zip(times, records) if t <= steps]  # steps + 1: not arrived

    stamped_data = []
    for p in (0, 1):
        stamped_data += arrivals(sorted((d for d in data if d.partition == p), key=lambda d: d.offset))
    return stamped_data, arrivals(txs)


def flatten(published: list[PublishedTx]) -> list[tuple[int, str, tuple]]:
    return [(p.into_time, p.tx_id, p.events) for p in published]


@SETTINGS
@given(histories())
def test_published_in_order_once_complete_at_first_allowed_time(history):
    data, txs = history
    out, state = fold(batches(data, txs))
    expected = publish_times(data, txs)
    assert [(p.tx_id, p.into_time) for p in out] == list(expected.items())  # transaction order, each once
    ids = [p.tx_id for p in out]
    assert ids == sorted(ids, key=lambda i: int(i[2:]))
    for p in out:
        assert set(p.events) == {d for _, d in data if d.tx_id == p.tx_id}
        end = next(t for _, t in txs if t.tx_id == p.tx_id and t.status == END)
        assert len(p.events) == end.event_count
    # TEMP: everything seen that is not published (plus the published ids)
    assert state.data == {d for _, d in data if d.tx_id not in expected}
    assert state.txs == {t for _, t in txs if t.tx_id not in expected}
    assert state.published == set(expected)


@SETTINGS
@given(histories(), st.data())
def test_batching_changes_only_publish_times_by_the_coarsening(history, more):
    """Merging IntoTimes (coarser ticks) publishes the same transactions at the coarsened times."""
    data, txs = history
    times = sorted({t for t, _ in data + txs})
    cuts = more.draw(st.lists(st.booleans(), min_size=len(times), max_size=len(times)))
    coarse, current = {}, None
    for t, cut in zip(reversed(times), reversed(cuts)):  # each time maps to the next cut at or after it
        current = t if cut or current is None else current
        coarse[t] = current
    fine, _ = fold(batches(data, txs))
    merged, merged_state = fold(batches([(coarse[t], d) for t, d in data], [(coarse[t], x) for t, x in txs]))
    assert flatten(merged) == [(coarse[t], i, e) for t, i, e in flatten(fine)]
    assert merged_state == fold(batches(data, txs))[1]


@SETTINGS
@given(histories())
def test_restart_from_temp_at_any_into_time_gives_the_same_future(history):
    """Seed 000: the summary at ``it`` plus the inputs beyond ``remap[it]`` determine the future."""
    data, txs = history
    all_batches = batches(data, txs)
    full, updates, final = fold_with_updates(all_batches)
    for k in range(len(all_batches) + 1):
        head, state = fold(all_batches[:k])
        as_of = all_batches[k - 1][0] if k else -1
        assert TxState.from_updates(updates, as_of) == state  # the durable TEMP collection as of it
        tail, end_state = fold(all_batches[k:], TxState.from_updates(updates, as_of))
        assert head + tail == full
        assert end_state == final


# --- examples and errors ---------------------------------------------------------------------------


def d(tx, off, coll="s.a", part=0):
    return DataEvent(tx, coll, part, off, f"{tx}@{part}/{off}")


def begin(tx, off):
    return TxEvent(BEGIN, tx, 0, off)


def end(tx, off, count, collections=None):
    return TxEvent(END, tx, 0, off, count, collections)


def test_later_transaction_completing_first_waits_for_the_earlier_one():
    out1, s1 = step(EMPTY, [d("B", 0)], [begin("A", 0), begin("B", 1), end("B", 2, 1)], 10)
    assert out1 == [] and s1.pending() == ["A", "B"]
    out2, s2 = step(s1, [d("A", 0, part=1)], [end("A", 3, 2)], 20)  # A needs 2 events, has 1
    assert out2 == []
    out3, s3 = step(s2, [d("A", 1, coll="s.b", part=1)], [], 30)
    assert [(p.tx_id, p.into_time, len(p.events)) for p in out3] == [("A", 30, 2), ("B", 30, 1)]
    assert s3 == TxState(published=frozenset({"A", "B"}))


def test_empty_transaction_and_data_before_begin():
    out, s = step(EMPTY, [d("X", 0)], [begin("E", 0), end("E", 1, 0)], 5)
    assert out == [PublishedTx(5, "E", ())]
    assert s.data == {d("X", 0)} and s.pending() == []  # data ahead of its BEGIN waits in TEMP
    out, s = step(s, [], [begin("X", 2), end("X", 3, 1, (("s.a", 1),))], 6)
    assert out == [PublishedTx(6, "X", (d("X", 0),))]


@pytest.mark.parametrize("state_records, new_data, new_tx, match", [
    ([], [], [end("A", 0, 1)], "END without BEGIN"),
    ([], [], [end("A", 0, 1), begin("A", 1)], "END without BEGIN"),
    ([begin("A", 0)], [], [begin("A", 1)], "reused"),
    ([], [], [begin("A", 0), begin("A", 1)], "reused"),
    ([begin("A", 0), end("A", 1, 0)], [], [end("A", 2, 0)], "reused"),
    ([], [d("A", 0), d("A", 1)], [begin("A", 0), end("A", 1, 1)], "more events than event_count"),
    ([begin("A", 0)], [d("A", 0, coll="s.b")], [end("A", 1, 1, (("s.a", 1),))], "collection 's.b'"),
    ([begin("A", 0), d("A", 0)], [d("A", 0)], [], "seen twice"),
    ([], [], [end("A", 0, 2, (("s.a", 1),))], "do not add up"),
    ([], [], [TxEvent("COMMIT", "A", 0, 0)], "BEGIN or END"),
    ([], [], [end("A", 0, -1)], "non-negative"),
])
def test_malformed_metadata_is_refused(state_records, new_data, new_tx, match):
    with pytest.raises(TransactionError, match=match):
        step(TxState.from_records(state_records), new_data, new_tx, 1)


def test_ids_and_events_after_publication_are_refused():
    _, s = step(EMPTY, [d("A", 0)], [begin("A", 0), end("A", 1, 1)], 1)
    assert s.published == {"A"}
    with pytest.raises(TransactionError, match="reused.*already published"):
        step(s, [], [begin("A", 2)], 2)
    with pytest.raises(TransactionError, match="more events than event_count.*already published"):
        step(s, [d("A", 1)], [], 2)
    with pytest.raises(TransactionError, match="strictly increase"):
        fold([(2, [], []), (2, [], [])])


# --- the Debezium JSON format ----------------------------------------------------------------------


COLUMNS = ["key", "value", "timestamp_ms"]


def row(value, partition=0, offset=0):
    return {"key": None, "value": value, "timestamp_ms": 0, "partition": partition, "offset": offset}


def test_parse_debezium_change_events_and_boundaries():
    event = {"after": {"id": 1}, "op": "c",
             "source": {"connector": "postgresql", "db": "d", "schema": "s1", "table": "a"},
             "transaction": {"id": "571", "total_order": "1", "data_collection_order": "1"}}
    assert parse_data(row(json.dumps(event), 1, 7), COLUMNS) == DataEvent("571", "s1.a", 1, 7,
                                                                           (None, json.dumps(event), 0))
    wrapped = json.dumps({"schema": {"type": "struct"}, "payload": event})  # JsonConverter schemas.enable
    assert parse_data(row(wrapped), COLUMNS).collection == "s1.a"
    assert parse_data(row(None), COLUMNS) is None  # tombstone
    for source, name in [({"connector": "mysql", "db": "inventory", "table": "t"}, "inventory.t"),
                         ({"connector": "sqlserver", "db": "testDB", "schema": "dbo", "table": "t"}, "testDB.dbo.t"),
                         ({"connector": "mongodb", "rs": "rs0", "db": "testDB", "collection": "c"}, "rs0.testDB.c")]:
        assert collection_of({"source": source}) == name
    assert collection_of({"source": source, "transaction": {"id": "x", "data_collection": "given"}}) == "given"
    with pytest.raises(TransactionError, match="no transaction id"):
        parse_data(row(json.dumps({**event, "transaction": None})), COLUMNS)
    with pytest.raises(TransactionError, match="not JSON"):
        parse_data(row("{nope", 0, 3), COLUMNS)

    end_value = json.dumps({"status": "END", "id": "571", "event_count": 2,
                            "data_collections": [{"data_collection": "s1.a", "event_count": "1"},
                                                 {"data_collection": "s2.a", "event_count": 1}]})
    assert parse_tx(row(end_value, 0, 5), COLUMNS)[:6] == (END, "571", 0, 5, 2, (("s1.a", 1), ("s2.a", 1)))
    begin_value = json.dumps({"status": "BEGIN", "id": "571", "event_count": None, "data_collections": None})
    assert parse_tx(row(begin_value), COLUMNS)[:6] == (BEGIN, "571", 0, 0, None, None)


# --- end to end: Kafka -> reclock -> transactions in Delta -------------------------------------------


def change(tx_id, table, pk, order):
    """A Debezium (PostgreSQL connector) change event, JSON, with transaction metadata."""
    return json.dumps({"before": None, "after": {"id": pk}, "op": "c", "ts_ms": 1_700_000_000_000,
                       "source": {"connector": "postgresql", "db": "shop", "schema": "s", "table": table},
                       "transaction": {"id": tx_id, "total_order": order, "data_collection_order": order}})


def boundary(status, tx_id, counts=None):
    return json.dumps({"status": status, "id": tx_id, "ts_ms": 1_700_000_000_000,
                       "event_count": None if counts is None else sum(counts.values()),
                       "data_collections": None if counts is None else
                       [{"data_collection": c, "event_count": n} for c, n in counts.items()]})


@pytest.fixture
def debezium(kafka_broker, tmp_path):
    import yaml
    from devtools.kafka_broker import create_topic

    suffix = uuid.uuid4().hex[:8]
    topics = {"dbz_data": f"dbz-data-{suffix}", "dbz_tx": f"dbz-tx-{suffix}"}
    create_topic(kafka_broker, topics["dbz_data"], partitions=2)
    create_topic(kafka_broker, topics["dbz_tx"], partitions=1)
    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump({
        "warehouse": str(tmp_path / "warehouse"), "spark": {"master": "local[2]"},
        "sources": [{"name": name, "kind": "kafka", "options": {"bootstrap_servers": kafka_broker, "topic": topic,
                                                                 "group_id": f"g-{topic}"}}
                    for name, topic in topics.items()]}))
    return topics, str(path)


@pytest.mark.slow
def test_debezium_transactions_end_to_end(kafka_broker, spark, debezium, monkeypatch):
    from reclock import pipeline
    from devtools.kafka_broker import produce
    from reclock.transactions import TxnTables, publish_transactions

    topics, config = debezium
    data_topic, tx_topic = topics["dbz_data"], topics["dbz_tx"]

    def tick(now, *sources):
        for source in sources or ("dbz_data", "dbz_tx"):
            pipeline.run_once(source, config, spark, now=now)

    def publish(name, session=spark):
        return publish_transactions(name, "dbz_data", "dbz_tx", config, spark=session)

    def output(name):
        return [(r["tx_id"], r["into_time"], r["partition"], r["offset"], json.loads(r["value"])["after"]["id"])
                for r in txn_tables(name).read_output()]

    def txn_tables(name):
        c = load_config(config)
        return TxnTables(Warehouse(c.warehouse, c.storage_options), name, pa.int32(), KafkaSource.data_schema)

    # tick 1000: A has 2 of its 3 events; B (after A) is complete but must wait for A
    produce(kafka_broker, tx_topic, [(None, boundary(BEGIN, "A"), 0), (None, boundary(BEGIN, "B"), 0),
                                     (None, boundary(END, "B", {"s.b": 1}), 0),
                                     (None, boundary(END, "A", {"s.a": 2, "s.b": 1}), 0)])
    produce(kafka_broker, data_topic, [("k1", change("A", "a", 1, 1), 0), ("k2", change("B", "b", 2, 1), 1),
                                       ("k3", change("A", "b", 3, 2), 1)])
    tick(1_000)
    first = publish("main")
    assert (first["published_transactions"], first["pending"]) == (0, ["A", "B"])
    assert output("main") == []

    # tick 2000: A's last event arrives (A straddles ticks) -> A and B at 2000; C begins, incomplete
    produce(kafka_broker, data_topic, [("k4", change("A", "a", 4, 3), 0), ("k5", change("C", "a", 5, 1), 1)])
    produce(kafka_broker, tx_topic, [(None, boundary(BEGIN, "C"), 0)])
    tick(2_000)
    real_append = TxnTables.append

    def killed_before_temp(self, kind, *args):
        if kind == "temp":
            raise KeyboardInterrupt("killed between the output and the TEMP commits")
        return real_append(self, kind, *args)

    monkeypatch.setattr(TxnTables, "append", killed_before_temp)
    with pytest.raises(KeyboardInterrupt):
        publish("main")
    monkeypatch.setattr(TxnTables, "append", real_append)
    main = txn_tables("main")
    assert (main.output_version(), main.temp_version()) == (2_000, 1_000)
    assert publish("main")["published_transactions"] == 0  # rerun: output already there, TEMP caught up
    assert main.temp_version() == 2_000 and main.read_temp().pending() == ["C"]
    at_2000 = output("main")
    assert sorted(at_2000) == [("A", 2_000, 0, 0, 1), ("A", 2_000, 0, 1, 4), ("A", 2_000, 1, 1, 3),
                               ("B", 2_000, 1, 0, 2)]

    # tick 3000 on the data source only: the transaction source is behind, nothing moves
    produce(kafka_broker, tx_topic, [(None, boundary(END, "C", {"s.a": 1}), 0)])
    tick(3_000, "dbz_data")
    assert publish("main")["upto"] == 2_000
    tick(3_000, "dbz_tx")
    third = publish("main")
    assert (third["published_transactions"], third["pending"]) == (1, [])
    assert publish("main")["published_transactions"] == 0  # idempotent
    final = output("main")
    assert final[:4] == at_2000 and final[4:] == [("C", 3_000, 1, 2, 5)]

    # order: publish times never decrease along BEGIN order; each data event exactly once
    times = {tx: t for tx, t, *_ in final}
    assert times["A"] <= times["B"] <= times["C"]
    assert len({(p, o) for _, _, p, o, _ in final}) == len(final) == 5

    # one uninterrupted run over all IntoTimes at once gives identical output and TEMP
    publish("ref", session=None)  # the step opens its (this process's) Spark session itself
    assert output("ref") == final
    ref = txn_tables("ref")
    assert ref.read_temp() == main.read_temp()
    # the durable TEMP of the stepwise run is recoverable as of each IntoTime
    assert main.read_temp(as_of=1_000).pending() == ["A", "B"]
    assert main.read_temp(as_of=2_000).pending() == ["C"]
