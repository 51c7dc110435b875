"""The ``kinesis`` source against a live Kinesis-compatible server (kinesis-local, started by a fixture).

Covered: the parent-before-child and expiry rules (tables), the engine laws on live records, the
whole pipeline over 4 shards with a split and a merge mid-run (every record bound exactly once, every
child after its parents, AS OF each tick exactly what was bound by then), a recreated or deleted
stream refused, expired records refused, and a restart after SIGKILL mid-tick.
"""
from __future__ import annotations

import base64
import signal
import uuid
from collections import Counter

import pytest
from conftest import as_of_views, check_engine_laws, over_connect, run_cli, write_sources_config
from hypothesis import HealthCheck, given, settings, strategies as st

from devtools.kinesis_server import create_stream, delete_stream, merge, open_shards, put, shards, split
from reclock import offsets, pipeline, status
from reclock import runtime
from reclock.engine import Frontier
from reclock.sources import SourceError
from reclock.sources.kinesis import KinesisSource, Shard, expiry_problems, readable_shards

A, B, C, D, E = (f"shardId-00000000000{i}" for i in range(5))


# --- the rules ------------------------------------------------------------------------------------

@pytest.mark.parametrize("listed, bound, complete, readable", [
    # no parents: every shard not complete
    ([Shard(A, (), None), Shard(B, (), None)], {}, {}, [A, B]),
    ([Shard(A, (), 7), Shard(B, (), None)], {A: 7}, {A: 7}, [B]),
    # a split: children wait until the parent is complete ...
    ([Shard(A, (), 9), Shard(B, (A,), None), Shard(C, (A,), None)], {A: 5}, {}, [A]),
    # ... and bound up to where it completed
    ([Shard(A, (), 9), Shard(B, (A,), None), Shard(C, (A,), None)], {A: 5}, {A: 10}, []),
    ([Shard(A, (), 9), Shard(B, (A,), None), Shard(C, (A,), None)], {A: 10}, {A: 10}, [B, C]),
    # a merge: the child waits for both parents
    ([Shard(A, (), 9), Shard(B, (), 4), Shard(C, (A, B), None)], {A: 10, B: 3}, {A: 10, B: 5}, []),
    ([Shard(A, (), 9), Shard(B, (), 4), Shard(C, (A, B), None)], {A: 10, B: 5}, {A: 10, B: 5}, [C]),
    # a parent expired from the listing, never read: the child's history begins after it
    ([Shard(B, (A,), None)], {}, {}, [B]),
])
def test_readable_shards(listed, bound, complete, readable):
    assert readable_shards(listed, Frontier.of(bound), complete) == readable


@pytest.mark.parametrize("read_to, now, expired", [
    ({}, 10 ** 12, []),                          # never read to its end: nothing landed to be behind of
    ({A: 1_000}, 1_000 + 3_599_999, []),         # within the retention (1 h)
    ({A: 1_000}, 1_000 + 3_600_000, [A]),        # a record arriving just after 1_000 may be gone
    ({A: 1_000, B: 5_000_000}, 4_000_000, [A]),
])
def test_expiry_problems(read_to, now, expired):
    problems = expiry_problems([A, B], Frontier.of({A: 43, B: 9}), read_to, now, 3_600_000)
    assert [p.split(":")[0] for p in problems] == [f"shard {s}" for s in expired]
    assert all("sequence number 42" in p for p in problems if A in p)


# --- live ---------------------------------------------------------------------------------------

def live_records(source: KinesisSource) -> list[dict]:
    """Every record the stream holds, as recorded Kinesis records (``partition``, ``offset``, ``data``), read
    with the source's own tick (parents before children: read until nothing more is readable)."""
    landed, complete, records = Frontier(), {}, []
    while True:
        taken = source.take(landed, landed, {"complete": complete})
        if taken.uppers == landed and taken.state["complete"] == complete:
            return records
        records += [{"partition": p, "offset": str(o), "data": {"PartitionKey": d["partition_key"],
                                                                "Data": base64.b64encode(d["data"]).decode()}}
                    for p, o, d in taken.records]
        landed, complete = taken.uppers, taken.state["complete"]


@pytest.fixture(scope="module")
def resharded_stream(kinesis_server):
    """A stream of 4 shards with records before and after a split and a merge; its records."""
    k, name = kinesis_server.client(), f"laws-{uuid.uuid4().hex[:8]}"  # the server is the whole run's
    create_stream(k, name, shards=4)
    first = open_shards(k, name)
    for round_, change in enumerate([None, lambda: split(k, name, first[0]),
                                     lambda: merge(k, name, first[2], first[3])]):
        if change:
            change()
        for s in open_shards(k, name):
            put(k, name, [f"{round_}-{s}-{i}".encode() for i in range(3)], s)
    with KinesisSource(name, **kinesis_server.options()) as source:
        return live_records(source)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_engine_laws_on_live_records(resharded_stream, data):
    assert len(resharded_stream) == 3 * (4 + 5 + 4)  # rounds of 4, 5 (split) and 4 (merge) open shards
    assert len({r["partition"] for r in resharded_stream}) == 7
    check_engine_laws(data, resharded_stream)


def kinesis_config(tmp_path, server, stream, **options):
    return write_sources_config(tmp_path, ("kin", "kinesis", {**server.options(), "stream": stream, **options}),
                                retention_ms=3_600_000)  # ticks at 1_000.. ms: nothing compacted


def bound_rows(config) -> Counter:
    """``(shard, sequence number, data) -> multiplicity`` of the published table, and each record's IntoTime."""
    rows = reclocked_rows_kinesis(config)
    return Counter({(p, o, d): n for p, o, d, _, n in rows}), {(p, o): t for p, o, _, t, _ in rows}


def reclocked_rows_kinesis(config) -> list[tuple]:
    with runtime.open_source("kin", config) as ctx:
        table = ctx.tables.read_reclocked_arrow().to_pylist()
    return [(r["partition"], offsets.decode(r["offset"]), r["data"], r["into_time"], r["diff"]) for r in table]


@pytest.mark.slow
def test_four_shards_resharded_mid_run_bound_once_parent_before_child_as_of(
        spark, tmp_path, kinesis_server, kinesis_stream):

    k, stream = kinesis_server.client(), kinesis_stream(shards=4)
    config = kinesis_config(tmp_path, kinesis_server, stream)
    first, sent, remaps = open_shards(k, stream), {}, {}

    def put_round(tag):
        for s in open_shards(k, stream):
            data = [f"{tag}-{s[-1]}-{i}".encode() for i in range(3)]
            sent.update({(s, int(seq)): d for seq, d in zip(put(k, stream, data, s), data)})

    # the split's children are read at 3_000, once their parent is bound complete at 2_000; the merged
    # shards complete at 3_000, their child is read at 4_000
    steps = [(1_000, None), (2_000, lambda: split(k, stream, first[0])),
             (3_000, lambda: merge(k, stream, first[2], first[3])), (4_000, None), (5_000, None)]
    committed = Frontier()
    for t, change in steps:
        if change:
            change()
        put_round(t)
        if t in (2_000, 5_000):  # every step at the split and at the end; ticks only in between
            pipeline.run_once("kin", config, spark, now=t)
        else:
            pipeline.tick("kin", config, now=t, spark=spark)
        with runtime.open_source("kin", config) as ctx:
            remaps[t] = ctx.tables.read_remap().at(t)
            assert committed.less_equal(ctx.source.committed()) and ctx.source.committed().less_equal(remaps[t])
            committed = ctx.source.committed()  # resumed: never backwards, never beyond what is bound
    assert committed.partitions

    counts, into_time = bound_rows(config)
    assert counts == Counter({(p, o, d): 1 for (p, o), d in sent.items()})  # every record bound exactly once
    assert sum(1 for t in into_time.values() if t == 1_000) == 12  # the first round: 3 records in each of 4 shards
    for shard in shards(k, stream):  # parent before child: every child record bound after every parent record
        parents = [p for p in (shard.get("ParentShardId"), shard.get("AdjacentParentShardId")) if p]
        child = [t for (p, _), t in into_time.items() if p == shard["ShardId"]]
        for parent in parents:
            assert child and min(child) > max(t for (p, _), t in into_time.items() if p == parent)
    for t in remaps:  # AS OF each tick: exactly the records bound by then
        as_of_views(spark, t, ["kin"], config)  # Spark's, the same as the JVM-free query's
        got = Counter(bytes(r["data"]) for r in spark.table("kin").collect())  # AS OF views: the contents
        assert got == Counter(d for (p, o), d in sent.items() if o < remaps[t][p]), t


@pytest.mark.slow
def test_recreated_or_deleted_stream_is_refused(spark, tmp_path, kinesis_server, kinesis_stream):
    k, stream = kinesis_server.client(), kinesis_stream(shards=2)
    config = kinesis_config(tmp_path, kinesis_server, stream)
    put(k, stream, [b"a", b"b"], open_shards(k, stream)[0])
    pipeline.tick("kin", config, now=1_000, spark=spark)
    delete_stream(k, stream)
    with pytest.raises(SourceError, match=f"kinesis stream '{stream}'.* does not exist"):
        pipeline.tick("kin", config, now=2_000, spark=spark)
    create_stream(k, stream, shards=2)
    put(k, stream, [b"c"], open_shards(k, stream)[0])
    with pytest.raises(SourceError, match="not the stream remap has bound: created was .*nothing landed"):
        pipeline.tick("kin", config, now=3_000, spark=spark)
    with runtime.open_source("kin", config) as ctx:
        assert ctx.tables.read_remap().upper == 1_001 and len(ctx.tables.landed().partitions) == 1


@pytest.mark.slow
def test_records_that_may_have_expired_are_refused(spark, tmp_path, kinesis_server, kinesis_stream, monkeypatch):
    """A shard not read for longer than the stream's retention: refused once it no longer holds the last record
    landed from it (records after it may be gone: kinesis-mock trims nothing, so the trim is simulated); while it
    still holds it, every record after it is there, and the tick goes on."""
    from reclock.sources import kinesis

    k, stream = kinesis_server.client(), kinesis_stream(shards=1)
    config = kinesis_config(tmp_path, kinesis_server, stream)
    shard = open_shards(k, stream)[0]
    seqs = put(k, stream, [b"a"], shard)
    pipeline.tick("kin", config, now=1_000, spark=spark)
    seqs += put(k, stream, [b"b"], shard)
    later = kinesis.now_ms() + 24 * 3_600_000 + 60_000  # the stream keeps records 24 h
    monkeypatch.setattr(kinesis, "now_ms", lambda: later)
    with monkeypatch.context() as trimmed:
        trimmed.setattr(kinesis.KinesisSource, "_holds", lambda self, shard, seq: False)
        with pytest.raises(SourceError, match=f"shard {shard}: records after sequence number {seqs[0]} may have "
                                              "expired"):
            pipeline.tick("kin", config, now=2_000, spark=spark)
    assert pipeline.tick("kin", config, now=2_000, spark=spark)["written"]  # the shard still holds "a": nothing lost
    with runtime.open_source("kin", config) as ctx:
        assert ctx.tables.landed() == Frontier.of({shard: int(seqs[1]) + 1})


@pytest.mark.slow
def test_restart_after_sigkill_mid_tick_loses_and_duplicates_nothing(spark, spark_connect, tmp_path, kinesis_server,
                                                                     kinesis_stream):
    k, stream = kinesis_server.client(), kinesis_stream(shards=4)
    config = kinesis_config(tmp_path, kinesis_server, stream, max_records=700)
    sent = {}
    for s in open_shards(k, stream):
        data = [f"{s[-1]}-{i}".encode() for i in range(250)]
        sent.update({(s, int(seq)): d for seq, d in zip(put(k, stream, data, s), data)})
    # a tick (a client of the run's Spark Connect server) killed right after its landing committed, before it
    # bound anything (the crash point after the landing's commit, devtools.crash_points: a tick's binding follows the
    # landing within milliseconds, sooner than a kill on reading its log line would land)
    proc = run_cli(over_connect(config, spark_connect), "tick", "kin",
                   env_extra={"RECLOCK_KILL_AT": "reclock.landing:after"})
    output = proc.communicate(timeout=300)[0].decode(errors="replace")
    assert proc.returncode == -signal.SIGKILL, output[-3000:]
    with runtime.open_source("kin", config) as ctx:
        landed = ctx.tables.landed()
        assert ctx.tables.read_remap().upper == 0 and landed.partitions  # landed, nothing bound
        assert ctx.tables.read_spark("landing", spark=spark).count() == 700  # the tick's budget
    pipeline.run_once("kin", config, spark, now=1_000)  # lands the other 300 after what landed, binds all 1000
    counts, _ = bound_rows(config)
    assert counts == Counter({(p, o, d): 1 for (p, o), d in sent.items()})
    with runtime.open_source("kin", config) as ctx:
        last = {p: max(o for q, o in sent if q == p) for p, _ in sent}
        assert ctx.tables.read_remap().frontier == Frontier.of({p: o + 1 for p, o in last.items()})


@pytest.mark.slow
def test_compaction_keeps_the_landing_bounded(spark, tmp_path, kinesis_server, kinesis_stream):
    """Ten ticks of records, every third one a whole run compacting with an AS OF window of two ticks: the landing
    then holds exactly the records bound after ``since`` (each landing file is one tick's records, pruned once all
    lie below ``remap[since]``); what is published is untouched; a backfill replaying the folded binding is
    refused, one after it still verifies; status shows each shard's lag in time."""
    from reclock.backfill import BackfillError, replay

    k, stream = kinesis_server.client(), kinesis_stream(shards=2)
    config = write_sources_config(tmp_path, ("kin", "kinesis", {**kinesis_server.options(), "stream": stream}),
                                  retention_ms=2_000)
    sent = {}
    for t in range(1_000, 11_000, 1_000):
        for s in open_shards(k, stream):
            data = [f"{t}-{s[-1]}-{i}".encode() for i in range(3)]
            sent.update({(s, int(seq)): d for seq, d in zip(put(k, stream, data, s), data)})
        if t not in (4_000, 7_000, 10_000):
            pipeline.tick("kin", config, now=t, spark=spark)
            continue
        pipeline.run_once("kin", config, spark, now=t)  # compacts to since = t - 2_000
        with runtime.open_source("kin", config, connect=False) as ctx:
            remap = ctx.tables.read_remap()
            landing = ctx.tables.table("landing").to_pyarrow_table().to_pylist()
            held = Counter((r["partition"], offsets.decode(r["offset"])) for r in landing)
            assert remap.since == t - 2_000 and len(held) == 12, t  # two ticks of 3 records in each of 2 shards
            assert held == Counter({(p, o): 1 for p, o in sent if o >= remap.at(remap.since)[p]}), t
            assert ctx.tables.pruned() == remap.at(remap.since)
    counts, _ = bound_rows(config)
    assert counts == Counter({(p, o, d): 1 for (p, o), d in sent.items()})  # every record published once
    with pytest.raises(BackfillError, match="the landing pruned below"):
        replay("kin", config, remap.since, remap.since, spark)
    report = replay("kin", config, remap.since + 1, 10_000, spark)
    assert report["equal"] and report["replayed"]["rows"] == len(held)
    (row,) = status.status(config)  # each shard's lag at its last read: caught up
    assert row["lag_ms"] == 0 and set(row["lag_ms_by_partition"]) == set(open_shards(k, stream))
