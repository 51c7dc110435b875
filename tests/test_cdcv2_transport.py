"""CDC v2 over transports: the cdcv2 source (Kafka topic or files) and the CDC v2 sink."""
from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from conftest import as_of_views, stage_parquet

from reclock import cli, pipeline
from reclock import runtime
from devtools.kafka_broker import create_topic, produce
from reclock.engine import Frontier
from reclock.engine.cdcv2 import Decoder, encode, from_json, to_json
from reclock.engine.frontier import Antichain
from reclock.sinks import SinkError, write_cdcv2
from reclock.sources import build_source
from reclock.sources.base import SourceError
from reclock.sources.cdcv2 import FINISHED, open_transport, transport_texts
from reclock.storage import Warehouse

# Non-negative multiplicities at every time; retractions at later times than their insertions.
HISTORY = [("a", 0, 1), ("b", 0, 2), (("x", 1), 3, 1), (7, 5, 1), ("b", 8, -1), ("c", 12, 1), ("a", 15, -1),
           (("x", 1), 21, -1), ("d", 21, 3), ("b", 25, -1), ("a", 30, 1), ("d", 33, -2), ("e", 39, 1)]


def js(datum) -> str:
    return json.dumps(datum, separators=(",", ":"))


def expected_reads(start: int, end: int) -> list:
    """What the source must read for ``[start, end)``: (JSON datum, time, diff) in decoder order."""
    return [({"data": js(d)}, t, r) for d, t, r in sorted((u for u in HISTORY if start <= u[1] < end),
                                                           key=lambda u: (u[1], repr(u)))]


def contents(before: int) -> Counter:
    acc = Counter()
    for d, t, r in HISTORY:
        if t < before:
            acc[js(d)] += r
    return +acc


def mangled(lower: int, upper: tuple, seed: int) -> list[str]:
    """The history's messages for ``[lower, upper)``, some duplicated, shuffled."""
    hist = [u for u in HISTORY if lower <= u[1] < (upper[0] if upper else FINISHED)]
    msgs = [to_json(m) for m in encode(hist, upper, (lower,), batch_size=2)]
    rng = random.Random(seed)
    msgs += rng.sample(msgs, len(msgs) // 2)
    rng.shuffle(msgs)
    return msgs


def write_files(directory: Path, texts: list[str], parts: int, prefix: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(parts):
        (directory / f"{prefix}-{i}.jsonl").write_text("".join(t + "\n\n" for t in texts[i::parts]))


def decode_texts(texts) -> tuple[Counter, Antichain]:
    """Consolidated ``{(datum, time): diff}`` and the frontier decoded from message texts."""
    decoder, acc = Decoder(), Counter()
    for text in texts:
        for updates, _ in decoder.push(from_json(text)):
            for d, t, r in updates:
                acc[(d, t)] += r
    return Counter({k: v for k, v in acc.items() if v}), decoder.frontier


# --- files transport (fast) ------------------------------------------------------------------


def test_files_source_upper_and_reads(tmp_path):
    source = build_source({"kind": "cdcv2", "transport": f"file://{tmp_path}/cdc"})
    assert source.upper() == Frontier()
    write_files(tmp_path / "cdc", mangled(0, (20,), seed=1), parts=3, prefix="a")
    (tmp_path / "cdc" / "ignored.txt").write_text("not matched by *.jsonl\n")
    assert source.upper() == Frontier.of({"": 20})
    write_files(tmp_path / "cdc", mangled(20, (40,), seed=2), parts=2, prefix="b")
    assert source.upper() == Frontier.of({"": 40})  # incremental: only the new files are decoded
    for start, end in [(0, 40), (0, 20), (3, 4), (5, 21), (21, 40), (13, 15), (7, 7)]:
        assert list(source.read("", start, end)) == expected_reads(start, end)
    assert list(source.read("", 5, 21)) == expected_reads(5, 21)  # repeatable
    with pytest.raises(SourceError, match="beyond the decoded upper 40"):
        list(source.read("", 30, 41))
    with pytest.raises(SourceError, match="single partition"):
        source.read("p", 0, 1)
    fresh = build_source({"kind": "cdcv2", "transport": str(tmp_path / "cdc")})
    assert fresh.upper() == Frontier.of({"": 40}) and fresh.committed() == Frontier()


def test_finished_stream_and_bad_messages(tmp_path):
    write_files(tmp_path / "done", mangled(0, (), seed=3), parts=2, prefix="m")
    source = build_source({"kind": "cdcv2", "transport": str(tmp_path / "done")})
    assert source.upper() == Frontier.of({"": FINISHED})
    assert list(source.read("", 0, FINISHED)) == expected_reads(0, FINISHED)
    write_files(tmp_path / "bad", ['{"updates": [["a", 0]]}'], parts=1, prefix="x")
    with pytest.raises(SourceError, match="not a CDC v2 message"):
        build_source({"kind": "cdcv2", "transport": str(tmp_path / "bad")}).upper()


def test_sink_to_files_incremental_idempotent_and_refuses_compacted(tmp_path, spark):
    schema = pa.schema([("value", pa.string())])
    tables = Warehouse(str(tmp_path / "wh")).source("orders", pa.int32(), schema, spark=spark)
    out = tmp_path / "out"

    def publish(into_time: int, uppers: dict, rows: list[tuple]) -> None:
        before = tables.read_remap()
        assert tables.append_binding(before, before.mint(into_time, Frontier.of(uppers)))
        stage_parquet(tables, into_time, [{"value": v, "partition": p, "offset": o, "into_time": into_time,
                                           "diff": 1} for v, p, o in rows])
        assert tables.publish_staged(into_time)

    def expected() -> Counter:
        return Counter({((r["value"], r["partition"], r["offset"]), r["into_time"]): r["diff"]
                        for r in tables.read_reclocked_arrow().to_pylist()})

    def decoded() -> tuple[Counter, Antichain]:
        return decode_texts(line for f in sorted(out.glob("*.jsonl")) for line in f.read_text().splitlines())

    assert write_cdcv2(tables, str(out))["written"] is False  # nothing published yet
    publish(1_000, {0: 2}, [("v0", 0, 0), ("v1", 0, 1)])
    first = write_cdcv2(tables, str(out), batch_size=1)
    assert first == {"lower": 0, "upper": 1_001, "updates": 2, "messages": 3, "written": True}
    publish(2_000, {0: 3}, [("v2", 0, 2)])
    assert write_cdcv2(tables, f"file://{out}")["lower"] == 1_001
    assert decoded() == (expected(), Antichain.of([2_001]))
    files = sorted(p.name for p in out.iterdir())
    assert write_cdcv2(tables, str(out))["written"] is False  # rerun: nothing new
    assert sorted(p.name for p in out.iterdir()) == files == [f"{0:020d}.jsonl", f"{1_001:020d}.jsonl"]
    # A run that died after writing its updates: the rerun writes the interval again, harmlessly.
    publish(3_000, {0: 4}, [("v3", 0, 3)])
    (out / "partial.jsonl").write_text(to_json(encode([(("v3", 0, 3), 3_000, 1)], (3_001,), (2_001,))[0]) + "\n")
    assert write_cdcv2(tables, str(out))["lower"] == 2_001
    assert decoded() == (expected(), Antichain.of([3_001]))
    # Read back as a reclock source.
    source = build_source({"kind": "cdcv2", "transport": str(out)})
    assert source.upper() == Frontier.of({"": 3_001})
    assert [(d["data"], t) for d, t, _ in source.read("", 1_500, 3_001)] == [('["v2",0,2]', 2_000),
                                                                              ('["v3",0,3]', 3_000)]
    # Compacted beyond the sink's upper: refused rather than written inexactly.
    publish(4_000, {0: 5}, [("v4", 0, 4)])
    tables.compact(4_000)
    with pytest.raises(SinkError, match="compacted to 4000"):
        write_cdcv2(tables, str(out))


# --- Kafka transport, pipeline, sink (slow) ---------------------------------------------------


def write_config(tmp_path, sources: list[dict]) -> str:
    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump({"warehouse": str(tmp_path / "warehouse"), "spark": {"master": "local[2]"},
                                    "sources": sources}))
    return str(path)


def shuffled_to_partitions(texts: list[str], seed: int) -> list[tuple]:
    rng = random.Random(seed)
    return [(None, t, rng.randrange(2)) for t in texts]


@pytest.mark.slow
def test_kafka_transport_source_pipeline_and_as_of(kafka_broker, spark, tmp_path):

    topic = f"cdc-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker, topic, partitions=2)
    transport = f"kafka://{kafka_broker}/{topic}"
    config = write_config(tmp_path, [{"name": "cdc", "kind": "cdcv2", "options": {"transport": transport}}])
    produce(kafka_broker, topic, shuffled_to_partitions(mangled(0, (20,), seed=4), seed=5))

    with build_source({"kind": "cdcv2", "transport": transport, "timeout_s": 5}) as source:
        assert source.upper() == Frontier.of({"": 20})
        assert list(source.read("", 0, 20)) == expected_reads(0, 20)
        first = pipeline.run_once("cdc", config, spark, now=1_000)
        assert first["tick"]["frontier"] == {"": 20} and first["publish"]["reclocked_upper"] == 1_001

        produce(kafka_broker, topic, shuffled_to_partitions(mangled(20, (40,), seed=6), seed=7))
        assert source.upper() == Frontier.of({"": 40})
        for start, end in [(0, 40), (5, 21), (21, 40), (39, 40)]:
            assert list(source.read("", start, end)) == expected_reads(start, end)
    pipeline.run_once("cdc", config, spark, now=2_000)

    for t, before in [(1_000, 20), (2_000, 40)]:
        as_of_views(spark, t, ["cdc"], config)  # Spark's, the same as the JVM-free query's
        rows = spark.sql("SELECT data, partition FROM cdc").collect()
        assert Counter(r.data for r in rows) == contents(before) and {r.partition for r in rows} == {""}
    with runtime.open_source("cdc", config) as ctx:
        assert {(r["offset"], r["into_time"]) for r in ctx.tables.read_reclocked_arrow().to_pylist()} == \
            {(t, 1_000 if t < 20 else 2_000) for _, t, _ in HISTORY}


@pytest.mark.slow
def test_sink_writes_reclocked_kafka_source_to_files_and_kafka(kafka_broker, spark, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    orders, sink_topic = f"orders-{suffix}", f"orders-cdc-{suffix}"
    create_topic(kafka_broker, orders, partitions=2)
    create_topic(kafka_broker, sink_topic, partitions=2)
    config = write_config(tmp_path, [{"name": "orders", "kind": "kafka", "options": {
        "bootstrap_servers": kafka_broker, "topic": orders, "group_id": f"g-{suffix}"}}])
    files, kafka = f"file://{tmp_path}/out", f"kafka://{kafka_broker}/{sink_topic}"

    def reclocked() -> tuple[Counter, Antichain]:
        with runtime.open_source("orders", config) as ctx:
            rows, upper = ctx.tables.read_reclocked_arrow().to_pylist(), ctx.tables.reclocked_upper()
        acc = Counter({((r["key"], r["value"], r["timestamp_ms"], r["partition"], r["offset"]), r["into_time"]):
                       r["diff"] for r in rows})
        return acc, Antichain.of([upper])

    def decoded(to: str) -> tuple[Counter, Antichain]:
        transport = open_transport(to)
        try:
            return decode_texts(list(transport_texts(transport)))
        finally:
            transport.close()

    produce(kafka_broker, orders, [("k0", "a", 0), ("k1", "b", 1), ("k0", "c", 0)])
    pipeline.run_once("orders", config, spark, now=1_000)
    for to in (files, kafka):
        assert pipeline_sink(config, to)["upper"] == 1_001
    produce(kafka_broker, orders, [("k2", "d", 1)])
    pipeline.run_once("orders", config, spark, now=2_000)
    for to in (files, kafka):
        assert pipeline_sink(config, to)["lower"] == 1_001
        assert decoded(to) == reclocked() and len(decoded(to)[0]) == 4
    # Re-running adds nothing (the CLI subcommand, once per transport).
    with open_transport(kafka) as topic:
        before = (sorted(p.name for p in (tmp_path / "out").iterdir()), topic.upper())
        for to in (files, kafka):
            assert cli.main(["--config", config, "sink-cdcv2", "orders", "--to", to]) == 0
            assert decoded(to) == reclocked()
        assert (sorted(p.name for p in (tmp_path / "out").iterdir()), topic.upper()) == before


def pipeline_sink(config: str, to: str) -> dict:
    from reclock.sinks import sink_cdcv2

    return sink_cdcv2("orders", to, config)
