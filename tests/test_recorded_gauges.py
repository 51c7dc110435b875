"""Kinesis (shard, sequence number) and PubNub (region, timetoken) gauges, on recorded streams.

No live Kinesis or PubNub here: the ``recorded`` source replays what they deliver.  Kinesis
sequence numbers (56 digits in practice, up to 129 in the API) overflow int64 and Delta's
decimal(38), so they are stored with the order-preserving codec of :mod:`reclock.offsets`.
Covered: the codec, the source, the engine laws on recorded ticks, an exact warehouse round
trip and compaction of big increments, the checks, and (slow) the whole pipeline per gauge
with AS OF queries returning exactly the recorded records up to each tick.
"""
from __future__ import annotations

import base64
import json
import uuid
from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml
from conftest import canonical, check_engine_laws, stage_parquet, updates_of, upper_of
from hypothesis import given, settings, strategies as st

from reclock import offsets, pipeline
from reclock import runtime
from reclock.checks import check_reclocked, check_remap
from reclock.engine import Frontier, Remap, as_of, compact_updates, reclock
from reclock.offsets import OffsetError
from reclock.sources import SourceError, build_source
from reclock.sources.recorded import RecordedSource
from reclock.spark.source import Segment, output_arrow_schema, read_segment_batches, segments
from reclock.storage import Warehouse, WarehouseError

# --- recorded data --------------------------------------------------------------------------------

SHARD0, SHARD1, SHARD2 = "shardId-000000000000", "shardId-000000000001", "shardId-000000000002"
SEQ0 = 49590338271490256608559692538361571095921575989136588898  # a real-shaped 56-digit sequence number
# First sequence numbers of shards 1 and 2 (shard 2 is opened by a reshard, later) and the gaps
# between consecutive records of a shard: far beyond int64 (2^63 ~ 9.2e18).
SHARD_BASE = {SHARD0: SEQ0, SHARD1: 49590338271512557353758223161503106818570237350642483218,
              SHARD2: 49590338271534858098956753784644642541218598712148377634}
SEQ_STEP = 2_564_131_663_402_632_534_000_926_720


def kinesis_record(shard: str, k: int) -> dict:
    """The ``k``-th record of ``shard`` as recorded from GetRecords (sequence number as a string)."""
    payload = json.dumps({"order": f"{shard[-1]}-{k}", "amount": 10 * k + 1}).encode()
    return {"partition": shard, "offset": str(SHARD_BASE[shard] + k * SEQ_STEP + k * k),
            "data": {"PartitionKey": f"customer-{k % 3}", "Data": base64.b64encode(payload).decode(),
                     "ApproximateArrivalTimestamp": 1718000000.123 + k}}


def pubnub_record(region: int, k: int) -> dict:
    """The ``k``-th message seen in ``region``; timetokens are 17 digits (100 ns ticks since the epoch)."""
    return {"partition": region, "offset": 17180000001234567 + region * 1_000 + k * 10_000_017,
            "data": {"channel": "orders", "message": {"n": k, "region": region}, "publisher": f"client-{k % 2}"}}


# Four phases of each stream, appended one per tick.  Kinesis: shard 1 is closed and shard 2
# opened by a reshard in phase 3.  PubNub: region 12 first appears in phase 3.
KINESIS = [
    [kinesis_record(SHARD0, 0), kinesis_record(SHARD1, 0), kinesis_record(SHARD0, 1), kinesis_record(SHARD0, 2),
     kinesis_record(SHARD1, 1)],
    [kinesis_record(SHARD0, 3), kinesis_record(SHARD1, 2), kinesis_record(SHARD0, 4)],
    [kinesis_record(SHARD2, 0), kinesis_record(SHARD0, 5), kinesis_record(SHARD2, 1), kinesis_record(SHARD2, 2)],
    [kinesis_record(SHARD2, 3)],
]
PUBNUB = [
    [pubnub_record(1, 0), pubnub_record(4, 0), pubnub_record(1, 1)],
    [pubnub_record(4, 1), pubnub_record(4, 2)],
    [pubnub_record(12, 0), pubnub_record(1, 2), pubnub_record(12, 1)],
    [pubnub_record(1, 3)],
]
STREAMS = {"kinesis": KINESIS, "pubnub": PUBNUB}


def jsonl(records) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


@pytest.fixture(params=["local", "memory"])
def where(request, tmp_path):
    """A fresh directory URL and an ``append(key, bytes)`` writer for it."""
    import fsspec

    if request.param == "local":
        fs, url = fsspec.filesystem("file"), str(tmp_path / "rec")
        root = url
    else:
        fs, url = fsspec.filesystem("memory"), f"memory://reclock-rec-{uuid.uuid4().hex}"
        root = url[len("memory:/"):]

    def append(key: str, data: bytes) -> None:
        path = f"{root}/{key}"
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(path, (fs.cat_file(path) if fs.exists(path) else b"") + data)

    yield url, append
    if request.param == "memory" and fs.exists(root):
        fs.rm(root, recursive=True)


# --- the offset codec -----------------------------------------------------------------------------

def test_codec_examples():
    assert offsets.encode(0) == "001:0" and offsets.encode(42) == "002:42"
    assert offsets.encode(SEQ0) == f"056:{SEQ0}"
    assert offsets.decode(f"056:{SEQ0}") == SEQ0
    assert offsets.decode(offsets.encode(10 ** 128)) == 10 ** 128  # the API's longest, 129 digits
    for bad in ["002:07", "3:123", "003:12", "001:-", "-01", "001:x", "", "0001:1", "001:١", 42]:
        with pytest.raises(OffsetError):
            offsets.decode(bad)
    for bad in [-1, True, "5", 10 ** 999]:
        with pytest.raises(OffsetError):
            offsets.encode(bad)
    assert offsets.to_storage(2 ** 63 - 1) == 2 ** 63 - 1
    with pytest.raises(OffsetError, match="does not fit int64"):
        offsets.to_storage(SEQ0)
    assert offsets.to_storage(SEQ0, offsets.BIG) == f"056:{SEQ0}"
    assert offsets.from_storage(f"056:{SEQ0}") == SEQ0 and offsets.from_storage(7) == 7


big_ints = st.one_of(st.integers(0, 10 ** 20), st.integers(0, 10 ** 130), st.sampled_from([0, 9, 10, 99, 100]))


@given(big_ints, big_ints)
def test_codec_order_is_numeric_order(a, b):
    ea, eb = offsets.encode(a), offsets.encode(b)
    assert offsets.decode(ea) == a
    assert (ea < eb) == (a < b) and (ea == eb) == (a == b)
    assert (ea.encode() < eb.encode()) == (a < b)  # byte-wise too (Parquet statistics, Spark strings)


@given(st.lists(big_ints, max_size=30))
def test_codec_arrow_round_trip_and_sort(values):
    array = offsets.to_arrow(values, offsets.BIG)
    assert array.type == pa.string() and offsets.from_arrow(array) == values
    assert offsets.from_arrow(array.take(pc.sort_indices(array))) == sorted(values)
    small = [v for v in values if v < 2 ** 63]
    assert offsets.from_arrow(offsets.to_arrow(small)) == small


# --- the recorded source --------------------------------------------------------------------------

def test_kinesis_upper_reads_and_reshard(where):
    url, append = where
    append("stream.jsonl", jsonl(KINESIS[0] + KINESIS[1]))
    src = build_source({"kind": "recorded", "url": url, "gauge": "kinesis"})
    assert isinstance(src, RecordedSource)
    assert src.partition_type == pa.string() and src.offset_type == offsets.BIG and src.max_task_offsets is None
    first = src.upper()
    assert first == upper_of(KINESIS[0] + KINESIS[1]) and first[SHARD0] > 2 ** 63 and first[SHARD2] == 0
    s0 = [int(r["offset"]) for r in KINESIS[0] + KINESIS[1] if r["partition"] == SHARD0]
    got = list(src.read(SHARD0, s0[1], s0[3] + 1))
    assert [o for _, o, _ in got] == s0[1:4] and all(d == 1 for *_, d in got)
    assert json.loads(got[0][0]["data"]) == kinesis_record(SHARD0, 1)["data"]
    assert list(src.read(SHARD0, s0[1] + 1, s0[2])) == []  # between two sequence numbers: nothing
    with pytest.raises(SourceError, match="beyond the recorded upper"):
        list(src.read(SHARD0, 0, first[SHARD0] + 1))

    append("stream.jsonl", jsonl(KINESIS[2]) + b'{"partition": "shardId-000000000002", "offs')  # being written
    second = src.upper()
    assert first.less_equal(second) and second[SHARD2] == int(KINESIS[2][-1]["offset"]) + 1  # a new shard
    assert second[SHARD1] == first[SHARD1]  # the closed parent shard stays where it ended
    assert [o for _, o, _ in src.read(SHARD2, 0, second[SHARD2])] == [int(r["offset"]) for r in KINESIS[2]
                                                                      if r["partition"] == SHARD2]


def test_directory_of_recordings_and_commit(where):
    url, append = where
    append("part-0001.jsonl", jsonl(PUBNUB[0]))
    append("part-0002.jsonl", jsonl(PUBNUB[1]))
    append("notes.txt", b"not a recording\n")
    src = build_source({"kind": "recorded", "url": url, "gauge": "pubnub"})
    assert src.partition_type == pa.int64() and src.offset_type == offsets.INT64
    assert src.upper() == upper_of(PUBNUB[0] + PUBNUB[1]) and src.upper().partitions == (1, 4)
    assert src.committed() == Frontier()
    src.commit(Frontier.of({4: src.upper()[4]}))
    src.commit(Frontier.of({1: src.upper()[1]}))  # joins: never backwards
    again = build_source({"kind": "recorded", "url": url, "gauge": "pubnub"})
    assert again.committed() == src.upper() and again.committed().partitions == (1, 4)  # int regions kept
    assert again.released() == Frontier()
    assert again.upper() == src.upper()  # the commit file is not a recording
    with pytest.raises(SourceError, match="beyond the recorded upper"):
        src.commit(Frontier.of({12: 5}))


@pytest.mark.parametrize("lines, message", [
    ([kinesis_record(SHARD0, 1), kinesis_record(SHARD0, 0)], "does not increase"),
    ([kinesis_record(SHARD0, 1), kinesis_record(SHARD0, 1)], "does not increase"),
    ([{"partition": 3, "offset": "1", "data": {}}], "non-empty string"),
    ([{"partition": SHARD0, "offset": "0x10", "data": {}}], "an offset is an int"),
    ([{"partition": SHARD0, "offset": -1, "data": {}}], "an offset is an int"),
    ([{"partition": SHARD0, "data": {}}], "a record is"),
])
def test_kinesis_bad_recordings(where, lines, message):
    url, append = where
    append("s.jsonl", jsonl(lines))
    with pytest.raises(SourceError, match=message):
        build_source({"kind": "recorded", "url": url, "gauge": "kinesis"}).upper()


def test_pubnub_and_generic_limits(where):
    url, append = where
    append("a.jsonl", jsonl([{"partition": 2 ** 32, "offset": 1, "data": 1}]))
    with pytest.raises(SourceError, match=r"region\) is an int in \[0, 4294967295\]"):
        build_source({"kind": "recorded", "url": url, "gauge": "pubnub"}).upper()
    assert build_source({"kind": "recorded", "url": f"{url}-none", "gauge": "pubnub"}).upper() == Frontier()
    with pytest.raises(SourceError, match="unknown recorded gauge"):
        build_source({"kind": "recorded", "url": url, "gauge": "kafka"})
    with pytest.raises(SourceError, match="offset_type is 'int64' or 'big'"):
        build_source({"kind": "recorded", "url": url, "offset_type": "decimal"})


def test_generic_big_offsets_and_going_backwards(tmp_path):
    path = tmp_path / "one.jsonl"
    path.write_bytes(jsonl([{"partition": "p", "offset": str(2 ** 70), "data": {"x": 1}}]))
    src = RecordedSource(str(path), offset_type="big")  # a single file
    assert src.upper() == Frontier.of({"p": 2 ** 70 + 1}) and src.offset_type == offsets.BIG
    with pytest.raises(SourceError, match="does not fit int64"):
        RecordedSource(str(path)).upper()
    src.commit(src.upper())
    assert (tmp_path / "one.jsonl._reclock_committed.json").exists() and src.committed() == src.upper()
    path.write_bytes(b"")
    with pytest.raises(SourceError, match="went backwards"):
        src.upper()


# --- engine laws on the recorded streams ----------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.data(), st.sampled_from(["kinesis", "pubnub"]))
def test_engine_laws_on_recorded_streams(data, gauge):
    check_engine_laws(data, [r for phase in STREAMS[gauge] for r in phase])


def test_segments_of_sparse_gauges_are_not_cut():
    records = [r for phase in KINESIS for r in phase]
    remap = Remap().mint(1_000, upper_of(records[:5])).mint(2_000, upper_of(records))
    segs = segments(remap.ranges(), max_offsets=None)
    assert sorted(s.partition for s in segs) == [SHARD0, SHARD1, SHARD2]  # one task per shard, not 10^50
    shard0 = next(s for s in segs if s.partition == SHARD0)
    assert shard0.start == 0 and shard0.end == remap.frontier[SHARD0]
    assert shard0.into_time(int(records[0]["offset"])) == 1_000
    assert shard0.into_time(int(KINESIS[1][0]["offset"])) == 2_000


def test_segment_batches_store_big_offsets_encoded(tmp_path):
    (tmp_path / "k.jsonl").write_bytes(jsonl(KINESIS[0]))
    src = RecordedSource(str(tmp_path), gauge="kinesis")
    upper = src.upper()
    assert output_arrow_schema(src).field("offset").type == pa.string()
    batch = pa.Table.from_batches(list(read_segment_batches(src, Segment(SHARD0, 0, upper[SHARD0],
                                                                          ((upper[SHARD0], 1_000),)))))
    shard0 = [r for r in KINESIS[0] if r["partition"] == SHARD0]
    assert batch["offset"].to_pylist() == [offsets.encode(int(r["offset"])) for r in shard0]
    assert batch["into_time"].to_pylist() == [1_000] * len(shard0)


# --- warehouse: big increments round trip and compact exactly -------------------------------------

DATA = pa.schema([("data", pa.string())])


def test_warehouse_round_trips_and_compacts_big_increments_exactly(tmp_path, spark):
    tables = Warehouse(str(tmp_path / "wh")).source("kin", pa.string(), DATA, offset_type=offsets.BIG, spark=spark)
    assert tables.schemas["remap"].field("increment").type == pa.string()
    assert tables.schemas["reclocked"].field("offset").type == pa.string()
    records = [r for phase in KINESIS for r in phase]
    cuts = {1_000: 5, 2_000: 8, 3_000: 12, 4_000: 13}
    remap, before = Remap(), Remap()
    updates = updates_of(records)
    for t, cut in cuts.items():
        remap = remap.mint(t, upper_of(records[:cut]))
        assert tables.append_binding(before, remap)
        batch = [r for r in reclock(updates, remap) if r.into_time == t]
        rows = [{"data": d, "partition": p, "offset": offsets.encode(o), "into_time": it, "diff": diff}
                for d, p, o, it, diff in batch]
        stage_parquet(tables, t, rows)
        assert tables.publish_staged(t)
        before = remap
    stored = tables.read_remap()
    assert stored == remap  # exact: every increment as a Python int
    raw = tables.remap_frame()
    assert raw["increment"].map(offsets.decode).map(lambda v: v > 2 ** 64).any()
    assert check_remap(raw).success

    tables.compact(2_500)  # folds the bindings at 1_000 and 2_000: increments summed in Python ints
    assert tables.since() == 2_500
    assert tables.read_remap() == remap.compact(2_500)
    folded = {r["partition"]: offsets.decode(r["increment"]) for r in tables.remap_frame().to_dict("records")
              if r["into_time"] == 2_500}
    assert folded == upper_of(records[:8]).as_dict()  # the sums are the exact sequence numbers + 1
    after = [(r["data"], r["partition"], offsets.decode(r["offset"]), r["into_time"], r["diff"])
             for r in tables.read_reclocked_arrow().to_pylist()]
    assert Counter({r[:4]: r[4] for r in after}) == compact_updates(reclock(updates, remap), 2_500)
    for t in (3_000, 4_000):
        assert as_of(after, t) == as_of(reclock(updates, remap), t)

    with pytest.raises(WarehouseError, match="exists with another schema"):
        Warehouse(str(tmp_path / "wh")).source("kin", pa.string(), DATA)  # int64 offsets: refused
    small = Warehouse(str(tmp_path / "wh")).source("small", pa.string(), DATA, spark=spark)
    with pytest.raises(WarehouseError, match="does not fit int64"):
        small.append_binding(Remap(), Remap().mint(1, Frontier.of({SHARD0: SEQ0})))


@pytest.mark.slow
def test_checks_decode_big_offsets(spark):
    records = [r for phase in KINESIS for r in phase]
    remap = Remap().mint(1_000, upper_of(records[:5])).mint(2_000, upper_of(records))
    rows = [(p, offsets.encode(o), t, diff) for _, p, o, t, diff in reclock(updates_of(records), remap)]
    schema = "partition string, offset string, into_time long, diff long"  # what the checks read of a batch
    assert check_reclocked(spark.createDataFrame(rows, schema), remap, start=1_000).success
    rows[0] = rows[0][:2] + (2_000,) + rows[0][3:]  # a shard-0 record of the first tick stamped late
    rows[1] = rows[1][:1] + ("bogus",) + rows[1][2:]
    report = check_reclocked(spark.createDataFrame(rows, schema), remap, start=1_000)
    assert report.failed == ["reclocked.first_covering_binding", "reclocked.within_frontier"], report.summary()


# --- the whole pipeline, per gauge ----------------------------------------------------------------

def write_config(tmp_path, name, options, retention_ms):
    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump({
        "warehouse": str(tmp_path / "warehouse"), "spark": {"master": "local[2]"},
        "sources": [{"name": name, "kind": "recorded", "retention_ms": retention_ms, "options": options}]}))
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("gauge", ["kinesis", "pubnub"])
def test_pipeline_end_to_end_on_recorded_stream(spark, tmp_path, gauge):
    from reclock.query import QueryError, register_as_of

    root = tmp_path / "recording"
    root.mkdir()
    name = f"rec_{gauge}"
    # retention 1.5 s: the tick at 3_000 compacts to 1_500, the one at 4_000 to 2_500, folding two
    # bindings' increments into one (big ones for Kinesis, summed exactly)
    config = write_config(tmp_path, name, {"url": str(root), "gauge": gauge}, retention_ms=1_500)
    codec = (lambda o: offsets.encode(int(o))) if gauge == "kinesis" else int
    expected, ticks = {}, [1_000, 2_000, 3_000, 4_000]

    def view(t):
        register_as_of(spark, t, [name], config)
        return Counter((r["data"], r["partition"], r["offset"]) for r in spark.table(name).collect())

    for i, (t, phase) in enumerate(zip(ticks, STREAMS[gauge])):
        (root / f"part-{i:04d}.jsonl").write_bytes(jsonl(phase))
        pipeline.run_once(name, config, spark, now=t)
        recorded = [r for p in STREAMS[gauge][:i + 1] for r in p]
        expected[t] = Counter((canonical(r["data"]), r["partition"], codec(r["offset"])) for r in recorded)
        for s in ticks[max(0, i - 1):i + 1]:  # this tick, and the previous one again: unchanged
            assert view(s) == expected[s]
        # the progress view holds offsets stored like the records': comparing them is gauge order
        bound = spark.sql(f"SELECT count(*) AS n FROM {name} r JOIN {name}_progress p "
                          f"ON r.partition = p.partition AND p.into_time = {t} AND r.offset < p.offset").first().n
        assert bound == len(recorded)
        with runtime.open_source(name, config) as ctx:
            assert ctx.source.committed() == upper_of(recorded)  # resumed upstream: everything published

    with runtime.open_source(name, config, connect=False) as ctx:
        assert ctx.tables.since() == 2_500
        stored = pa.string() if gauge == "kinesis" else pa.int64()
        assert ctx.tables.read_reclocked_arrow().schema.field("offset").type == stored
        assert ctx.tables.remap_frame()["increment"].map(offsets.from_storage).gt(0).all()
        remap = ctx.tables.read_remap()
        assert remap.at(2_500) == upper_of([r for p in STREAMS[gauge][:2] for r in p])
        assert remap.at(4_000) == upper_of([r for p in STREAMS[gauge] for r in p])
    with pytest.raises(QueryError, match="compacted away"):
        register_as_of(spark, 2_000, [name], config)
    for t in (3_000, 4_000):
        assert view(t) == expected[t]
