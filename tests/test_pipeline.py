"""The Kafka pipeline end to end against a real broker, real Spark and real Delta tables."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import signal
import uuid

import pyarrow as pa
import pytest
import yaml
from conftest import (WarmCommands, as_of_views, assert_reclocked_is_replay, edit_config, over_connect, reclocked_rows,
                      run_cli, wait_for, write_config)

from reclock import pipeline, runtime
from reclock.storage import commits
from reclock.storage.layout import WarehouseError
from devtools.kafka_broker import add_partitions, create_topic, produce
from reclock.engine import Frontier, RemapError
from reclock.query import QueryError, readable

pytestmark = pytest.mark.slow


@pytest.fixture
def topics(kafka_broker, tmp_path):
    suffix = uuid.uuid4().hex[:8]
    names = {"orders": f"orders-{suffix}", "clicks": f"clicks-{suffix}"}
    create_topic(kafka_broker, names["orders"], partitions=2)
    create_topic(kafka_broker, names["clicks"], partitions=3)
    return names, write_config(tmp_path, kafka_broker, names)


def test_ticks_reclock_exactly_what_each_binding_covers(kafka_broker, spark, topics):
    names, config = topics
    produce(kafka_broker, names["orders"], [("u1", "o1", 0), ("u2", "o2", 1), ("u1", "o3", 0)])
    first = pipeline.run_once("orders", config, spark, now=1_000)
    assert first["tick"]["frontier"] == {"0": 2, "1": 1}
    assert first["publish"]["reclocked_upper"] == 1_001
    assert reclocked_rows("orders", config) == [("o1", 0, 0, 1_000, 1), ("o2", 1, 0, 1_000, 1),
                                                ("o3", 0, 1, 1_000, 1)]

    add_partitions(kafka_broker, names["orders"], 3)  # a new partition must not break monotonicity
    produce(kafka_broker, names["orders"], [("u3", "o4", 2), ("u2", "o5", 1)])
    pipeline.run_once("orders", config, spark, now=2_000)
    rows = reclocked_rows("orders", config)
    assert [r[0] for r in rows if r[3] == 2_000] == ["o4", "o5"]
    assert len({(r[1], r[2]) for r in rows}) == len(rows) == 5

    # an idle tick moves the upper without rows; a tick back in time is refused and writes nothing
    pipeline.run_once("orders", config, spark, now=3_000)
    with pytest.raises(RemapError, match="strictly increase"):
        pipeline.tick("orders", config, now=2_500)
    assert readable("orders", config).upper == 3_001

    # resumption committed the durable frontier as the consumer group's offsets
    with runtime.open_source("orders", config) as ctx:
        assert ctx.source.committed() == Frontier.of({0: 2, 1: 2, 2: 1})


def test_a_tick_between_stage_and_publish_does_not_send_the_batch_back(kafka_broker, spark, topics, monkeypatch):
    """Ticks that bind more while a batch is staged and checked (a racing run, frequent ticks) do not stop it:
    the check checks the staged prefix of the pending window against the remap it was staged from, publish
    publishes that prefix, and the next run the rest: exactly the engine's replay, nothing refused.  The files
    Spark staged are proved healthy by their Arrow summary: the check reads nothing in Spark."""
    from reclock.storage.staging import StagingTables
    names, config = topics
    produce(kafka_broker, names["orders"], [("u1", "o1", 0), ("u2", "o2", 1)])
    pipeline.tick("orders", config, now=1_000, spark=spark)
    assert pipeline.stage("orders", config, spark)["upto"] == 1_000
    produce(kafka_broker, names["orders"], [("u3", "o3", 0)])
    pipeline.tick("orders", config, now=2_000, spark=spark)  # remap moves on: the pending window is ..2000
    with monkeypatch.context() as patch:
        patch.setattr(StagingTables, "read_staged_spark", lambda *a, **k: pytest.fail("the batch read in Spark"))
        pipeline.check("orders", config, spark)
    assert pipeline.publish("orders", config, spark) == {"published": True, "reclocked_upper": 1_001}
    assert [r[0] for r in reclocked_rows("orders", config)] == ["o1", "o2"]
    pipeline.run_once("orders", config, spark, steps=("stage", "check", "publish"))
    assert_reclocked_is_replay("orders", config, spark)
    assert sorted(r[0] for r in reclocked_rows("orders", config)) == ["o1", "o2", "o3"]


def test_a_check_reads_the_attempt_it_found_first(kafka_broker, spark, topics, tmp_path, monkeypatch):
    """A check decides on one staged attempt and reads that one (``StagingTables.pinned``).  Racing runs: one
    stages the window up to 2000 from before another run's publish of ..1000, its attempt completing only while
    the check of the window that is left (1001..2000) runs.  The check, which found no complete attempt, must not
    read that one (its records up to 1000 are published: the in_window check fails on them); it says none is
    staged, and the next run stages, checks and publishes the rest."""
    from reclock import check_step
    names, config = topics
    produce(kafka_broker, names["orders"], [("u1", "o1", 0), ("u2", "o2", 1)])
    pipeline.run_once("orders", config, spark, now=1_000, steps=("tick", "stage", "check"))
    produce(kafka_broker, names["orders"], [("u3", "o3", 0)])
    pipeline.run_once("orders", config, spark, now=2_000, steps=("tick", "stage"))  # from before the publish
    (success,) = (tmp_path / "warehouse").rglob("upto=2000/*/_SUCCESS")
    success.rename(success.with_name("_writing"))  # still being written
    assert pipeline.publish("orders", config, spark) == {"published": True, "reclocked_upper": 1_001}
    idle_check = check_step.idle_check

    def completes_meanwhile(*args, **kwargs):
        success.with_name("_writing").rename(success)
        return idle_check(*args, **kwargs)
    monkeypatch.setattr(check_step, "idle_check", completes_meanwhile)
    with pytest.raises(WarehouseError, match="no complete staged attempt"):
        pipeline.check("orders", config, spark)
    monkeypatch.undo()
    pipeline.run_once("orders", config, spark, steps=("stage", "check", "publish"))
    assert sorted(r[0] for r in reclocked_rows("orders", config)) == ["o1", "o2", "o3"]
    assert_reclocked_is_replay("orders", config, spark)


def test_a_publish_publishes_the_attempt_its_check_read(kafka_broker, spark, topics, tmp_path):
    """The check records the staged attempt it read (``last_check.json``: ``attempt``), and the publish publishes
    that one: not an attempt of the window staged after the check (here one holding every row twice; a racing
    stage's is equal by construction, but it was not checked), and nothing when the checked one is gone."""
    names, config = topics
    last_check = lambda: json.loads(next((tmp_path / "warehouse").rglob("last_check.json")).read_text())  # noqa: E731
    produce(kafka_broker, names["orders"], [("u1", "o1", 0), ("u2", "o2", 1)])
    pipeline.run_once("orders", config, spark, now=1_000, steps=("tick", "stage", "check"))
    (checked,) = (tmp_path / "warehouse").rglob("upto=1000/*/_SUCCESS")
    assert last_check()["attempt"] == checked.parent.name
    later = checked.parent.with_name("9999999999999-later")  # sorts after it: the latest complete attempt
    shutil.copytree(checked.parent, later)
    for data in list(later.glob("*.parquet")):
        shutil.copy(data, data.with_name(f"copy-{data.name}"))
    assert pipeline.publish("orders", config, spark) == {"published": True, "reclocked_upper": 1_001}
    assert sorted(r[0] for r in reclocked_rows("orders", config)) == ["o1", "o2"]
    assert not [f for f in later.rglob("*") if f.is_file()]  # removed (the object store leaves the folders)

    produce(kafka_broker, names["orders"], [("u3", "o3", 0)])
    pipeline.run_once("orders", config, spark, now=2_000, steps=("tick", "stage", "check"))
    (checked,) = (tmp_path / "warehouse").rglob("upto=2000/*/_SUCCESS")
    shutil.rmtree(checked.parent)  # removed by hand, say
    with pytest.raises(WarehouseError, match=f"attempt .*{checked.parent.name} that passed its checks is no longer"):
        pipeline.publish("orders", config, spark)
    assert sorted(r[0] for r in reclocked_rows("orders", config)) == ["o1", "o2"]
    pipeline.run_once("orders", config, spark, steps=("stage", "check", "publish"))
    assert sorted(r[0] for r in reclocked_rows("orders", config)) == ["o1", "o2", "o3"]
    assert_reclocked_is_replay("orders", config, spark)


def test_as_of_join_across_sources_and_refusals(kafka_broker, spark, topics):
    names, config = topics
    produce(kafka_broker, names["orders"], [("u1", "order-a", 0)])
    produce(kafka_broker, names["clicks"], [("u1", f"click-{i}", i % 3) for i in range(6)])
    for name in names:
        pipeline.run_once(name, config, spark, now=10_000)
    produce(kafka_broker, names["clicks"], [("u1", f"click-late-{i}", 0) for i in range(4)])
    produce(kafka_broker, names["orders"], [("u2", "order-b", 1)])
    for name in names:
        pipeline.run_once(name, config, spark, now=20_000)

    as_of_views(spark, 15_000, names, config)  # Spark's views, the same as the JVM-free query's
    joined = spark.sql("SELECT o.value AS o, count(c.value) AS n FROM orders o JOIN clicks c ON o.key = c.key "
                       "GROUP BY o.value").collect()
    assert {r.o: r.n for r in joined} == {"order-a": 6}
    progress = spark.sql("SELECT * FROM clicks_progress").collect()
    assert {(r.partition, r.offset) for r in progress} == {("0", 2), ("1", 2), ("2", 2)}
    as_of_views(spark, 20_000, names, config)
    assert spark.sql("SELECT count(*) AS n FROM clicks").first().n == 10

    with pytest.raises(QueryError, match="not complete"):
        as_of_views(spark, 20_001, names, config)
    pipeline.compact("clicks", config, now=40_000)  # retention 10s: since = min(20_000, 30_000)
    with pytest.raises(QueryError, match="compacted"):
        as_of_views(spark, 15_000, ["clicks"], config)
    as_of_views(spark, 20_000, ["clicks"], config)
    assert spark.sql("SELECT count(*) AS n FROM clicks").first().n == 10

    # The command answers without a JVM (DuckDB over the published tables): no pyspark imported, no java child.
    script = ("import sys\nfrom reclock.cli import main\ncode = main(sys.argv[1:])\n"
              "print('PYSPARK', 'pyspark' in sys.modules, 'CODE', code)")
    cmd = [sys.executable, "-c", script, "--config", config, "query", "--as-of", "20000", "--source", "clicks",
           "--source", "orders", "--sql", "SELECT count(*) AS clicks_seen FROM clicks JOIN orders USING (key)"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.splitlines()[0] == "AS OF 20000 (1970-01-01T00:00:20+00:00)", out
    assert "clicks_seen" in out.stdout and " 10 " in out.stdout and "PYSPARK False CODE 0" in out.stdout, out.stdout
    refused = subprocess.run([*cmd[:-2], "--sql", "SELECT * FROM nowhere"], capture_output=True, text=True,
                             timeout=120)
    assert "PYSPARK False CODE 2" in refused.stdout and refused.stderr.startswith(
        "reclock: error: the query failed in DuckDB: "), refused

    # Every diff 1 so far: the JVM-free views read the rows as they are.  A retraction of one click makes them
    # consolidate again (as Spark's do), by the table's statistics.
    with runtime.open_source("clicks", config, connect=False) as ctx:
        dt = ctx.tables.table("reclocked")
        first = dt.to_pyarrow_dataset().head(1)
        commits.append_rows(dt, first.set_column(first.schema.get_field_index("diff"), "diff",
                                                 pa.array([-1], pa.int64())), "test.retraction", 1)
    assert sum(as_of_views(spark, 20_000, ["clicks"], config)["clicks"].values()) == 9


@pytest.mark.parametrize("vacuum, survives", [
    ({}, True),  # VACUUM keeps replaced files for the AS OF window (retention_ms: 60 s here)
    ({"vacuum_retention_hours": 0, "force_vacuum": True}, False),  # forced: they go at once
])
def test_compact_keeps_the_files_of_a_read_in_flight(kafka_broker, spark, topics, vacuum, survives):
    """A read of version N (pinned, as AS OF reads and backfills pin it) defined before a compaction and
    collected after its VACUUM still finds its files, unless the sources file forces a shorter retention."""
    names, config = topics
    edit_config(config, lambda doc: [source.update(retention_ms=60_000, **vacuum) for source in doc["sources"]])
    for now in (10_000, 20_000):
        produce(kafka_broker, names["clicks"], [("u", f"click-{now}-{i}", i % 3) for i in range(3)])
        pipeline.run_once("clicks", config, spark, now=now)
    with runtime.open_source("clicks", config, connect=False, spark=spark) as ctx:
        version = ctx.tables.version("reclocked")
        in_flight = ctx.tables.read_reclocked_spark(spark, version=version)  # defined on version N
        assert pipeline.compact("clicks", config, now=90_000, spark=spark)["compacted"]
        assert ctx.tables.version("reclocked") > version  # compaction replaced the files of version N
    if survives:
        assert sorted(r.value for r in in_flight.collect()) == sorted(
            f"click-{now}-{i}" for now in (10_000, 20_000) for i in range(3))
    else:
        with pytest.raises(Exception, match="(?i)FileNotFound|does not exist|FAILED_READ_FILE"):
            in_flight.collect()


def test_kill_mid_tick_loses_and_duplicates_nothing(kafka_broker, spark, spark_connect, topics, tmp_path):
    """SIGKILL ``reclock run`` (a client of the run's Spark Connect server, as the DAGs' steps are) at several points,
    then run it again: the result is exact.  The kills land on events of the run, not after fixed delays: as it
    starts, as remap's log gains a commit (the tick), as a staged attempt appears (the server may finish writing it
    after the client is gone), as reclocked's log gains a commit (the publish).  A JVM dying inside its own
    commits is :func:`test_sigkill_at_every_step_boundary_and_delta_commit`'s."""
    names, config = topics
    connected = over_connect(config, spark_connect)
    source = tmp_path / "warehouse" / "clicks"

    def entries(path):
        return set(os.listdir(path)) if path.is_dir() else set()

    def staged():
        return {str(p) for p in source.glob("reclocked/staged/upto=*/*")}

    events = {"start": None, "remap commit": lambda: entries(source / "remap" / "_delta_log"),
              "staged attempt": staged, "reclocked commit": lambda: entries(source / "reclocked" / "_delta_log")}
    expected, killed_running = [], 0
    for round_, (event, seen) in enumerate(events.items()):
        values = [(f"u{i}", f"r{round_}-{i}", i % 3) for i in range(20)]
        produce(kafka_broker, names["clicks"], values)
        expected += [v[1] for v in values]
        before = seen() if seen else set()
        proc = run_cli(connected, "run", "clicks")
        if seen:
            wait_for(lambda: seen() - before or proc.poll() is not None, timeout=300, what=f"{event} of `reclock run`")
        killed_running += proc.poll() is None
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert killed_running >= 3, "the kills should land while the pipeline runs"
    # step-granular crashes too: a stage that is never published is simply redone
    assert pipeline.tick("clicks", config)["written"]
    pipeline.stage("clicks", config, spark)
    pipeline.run_once("clicks", config, spark)

    rows = reclocked_rows("clicks", config)
    assert sorted(r[0] for r in rows) == sorted(expected)
    assert len({(r[1], r[2]) for r in rows}) == len(rows)
    with runtime.open_source("clicks", config) as ctx:
        remap = ctx.tables.read_remap()
        assert all(remap.into_time_of(p, o) == t for _, p, o, t, _ in rows)
        assert remap.frontier == ctx.source.upper()


#: The crash points of devtools.crash_points, by the step whose process reaches them: after each step, and before,
#: inside and after the Delta commits of tick, publish and compaction (its since append, then its remap and
#: reclocked rewrites).
KILL_POINTS = {
    "tick": ("after-tick", "tick:before", "tick:inside", "tick:after"),
    "stage": ("after-stage",),
    "check": ("after-check",),
    "publish": ("after-publish", "publish:before", "publish:inside", "publish:after"),
    "resume": ("after-resume",),
    "compact": ("compact:before", "compact:inside", "compact:after", "compact-remap:inside",
                "compact-reclocked:inside"),
}
FAULT_ROUNDS = int(os.environ.get("RECLOCK_FAULT_ROUNDS", "1"))


def test_kill_points_cover_every_step():
    assert tuple(KILL_POINTS) == pipeline.STEPS


def test_run_once_refuses_an_unknown_step_before_any_work():
    with pytest.raises(ValueError, match=r"clicks: no such step \['publsh'\] \(the steps: tick, stage, check,"):
        pipeline.run_once("clicks", "/nonexistent/sources.yaml", steps=("tick", "publsh"))


def test_sigkill_at_every_step_boundary_and_delta_commit(kafka_broker, spark, spark_connect, topics):
    """``reclock <step>`` killed (SIGKILL, with its process group) at each crash point of :mod:`devtools.crash_points`
    that its step reaches, every point ``RECLOCK_FAULT_ROUNDS`` times (default 1, for CI's time budget; the
    issue's 50 each is ``RECLOCK_FAULT_ROUNDS=50``).  Records arrive before every run, and each run starts from
    what the last one's crash left: the steps before the killed one run here, then the killed one in a process
    of its own (steps share only what they store, so a step dies there as it would inside ``reclock run``),
    started ahead of its use (:class:`conftest.WarmCommands`: the same command on the same Spark, its cold start
    paid while the loop does other work).

    Every commit is the step's own (delta-rs, in its process; Spark only writes files before one), so a point
    lies between Spark calls or inside the step's own commit, where a driver holds nothing the tables need: the
    step is a client of the run's Spark Connect server (the DAGs' long-lived Spark), and dies without a cold JVM.
    Then one run completes, and the published table equals the engine's single-writer replay of remap: nothing
    lost, nothing twice."""
    names, config = topics
    connected = WarmCommands(over_connect(config, spark_connect),
                             uses=sum(map(len, KILL_POINTS.values())) * FAULT_ROUNDS)
    try:
        produced = kill_at_every_point(kafka_broker, names["clicks"], config, spark, connected)
    finally:
        connected.close()
    pipeline.run_once("clicks", config, spark)
    assert_reclocked_is_replay("clicks", config, spark)
    assert sorted(r[0] for r in reclocked_rows("clicks", config)) == sorted(produced)


def kill_at_every_point(broker, topic, config, spark, connected) -> list[str]:
    """The fault test's kills: the values produced."""
    produced = []
    for round_ in range(FAULT_ROUNDS):
        for step, points in KILL_POINTS.items():
            for point in points:
                for attempt in range(3):  # a point is not reached when there is nothing to do there yet
                    values = [(f"u{i}", f"{point}-{round_}-{attempt}-{i}", i % 3) for i in range(4)]
                    produce(broker, topic, values)
                    produced += [v[1] for v in values]
                    pipeline.run_once("clicks", config, spark, steps=pipeline.STEPS[:pipeline.STEPS.index(step)])
                    proc = connected.run(step, "clicks", env_extra={"RECLOCK_KILL_AT": point})
                    output = proc.communicate(timeout=600)[0].decode(errors="replace")
                    if proc.returncode == -signal.SIGKILL:
                        break
                    assert proc.returncode == 0, f"{point} (round {round_}): {output[-3000:]}"
                else:
                    pytest.fail(f"crash point {point} was never reached")
    return produced


def test_steps_get_the_sources_files_spark_conf(kafka_broker, spark, tmp_path):
    """A step's session carries the sources file's ``spark.conf`` (e.g. the s3a endpoint of a warehouse)."""
    config = write_config(tmp_path, kafka_broker, {"orders": "orders-conf"})
    document = yaml.safe_load(open(config))
    document["spark"]["conf"] = {"spark.reclock.test.marker": "from-the-sources-file"}
    open(config, "w").write(yaml.safe_dump(document))
    with runtime.open_source("orders", config, connect=False, spark=True) as ctx:
        assert ctx.spark.conf.get("spark.reclock.test.marker") == "from-the-sources-file"
