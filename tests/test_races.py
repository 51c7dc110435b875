"""Racing ticks of one source (issue 11): whoever runs them, remap stays exact.

Tickers start together each round while records arrive: four as threads of one process (one Spark
session, like Airflow tasks of one worker) and two as ``reclock tick`` processes (a scheduled and a
manual run, the CLI).  After every round remap is strictly monotone, its increments sum to its
frontier, and no frontier is beyond the upstream's high watermark; at the end the published
reclocked table equals the engine's single-writer replay of the same remap.

Whole ``reclock run`` processes race too, three per round: each ends with exit 0 or one error line.

``RECLOCK_RACE_ROUNDS`` (default 10), ``RECLOCK_RACE_PROCESS_ROUNDS`` (default 3), ``RECLOCK_RACE_RUN_ROUNDS``
(default 3) and ``RECLOCK_SOAK_SECONDS`` (default 5) size the tests for CI; ``make soak`` (devtools/soak.py) runs
them at 100, 100, 100 and 1800.  The tick
processes are clients of the run's Spark Connect server (the DAGs' long-lived Spark), so a round costs no cold JVM.
"""
from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter

import pytest
from conftest import assert_reclocked_is_replay, over_connect, run_cli, write_config

from devtools.kafka_broker import produce
from reclock import pipeline, runtime
from reclock.check_report import CheckReport, CheckResult
from reclock.check_step import failed_by_another_run
from reclock.engine import Frontier
from reclock.storage import ConcurrentWriteError, SourceTables

pytestmark = pytest.mark.slow

TICKERS = 4
PROCESS_TICKERS = 2
ROUNDS = int(os.environ.get("RECLOCK_RACE_ROUNDS", "10"))
PROCESS_ROUNDS = int(os.environ.get("RECLOCK_RACE_PROCESS_ROUNDS", "3"))
SOAK_SECONDS = float(os.environ.get("RECLOCK_SOAK_SECONDS", "5"))


@pytest.fixture
def source(kafka_broker, kafka_topic, tmp_path):
    topic = kafka_topic(partitions=2, prefix="race")
    return topic, write_config(tmp_path, kafka_broker, {"orders": topic})


def assert_sound(config: str) -> None:
    """Remap is strictly monotone, sums to its frontier and is not beyond the upstream."""
    with runtime.open_source("orders", config) as ctx:
        rows = ctx.tables._read("remap").to_pylist()
        remap = ctx.tables.read_remap()  # RemapError if the stored increments are not monotone
        upstream = ctx.source.upper()
    times = [b.into_time for b in remap.bindings]
    assert times == sorted(set(times)), f"bindings not strictly later: {times}"
    sums = Counter()
    for r in rows:
        sums[r["partition"]] += r["increment"]
    assert Frontier.of(dict(sums)) == remap.frontier
    assert remap.frontier.less_equal(upstream), f"remap frontier {remap.frontier} beyond upstream {upstream}"


def produce_round(kafka_broker: str, topic: str, round_: int) -> None:
    produce(kafka_broker, topic, [(f"k{i}", f"r{round_}-{i}", (round_ + i) % 2) for i in range(3 + round_ % 4)])


def test_racing_tick_threads_count_nothing_twice(kafka_broker, spark, source, monkeypatch):
    topic, config = source
    rows = SourceTables._remap_rows

    def slow_worker(self, increments):  # jitter between reading remap and writing: a slow or paused worker
        time.sleep(random.uniform(0, 0.5))
        return rows(self, increments)

    monkeypatch.setattr(SourceTables, "_remap_rows", slow_worker)
    lost = 0
    for round_ in range(ROUNDS):
        produce_round(kafka_broker, topic, round_)
        start, failures, errors = threading.Barrier(TICKERS), [], []

        def ticker():
            start.wait()
            try:
                pipeline.tick("orders", config, spark=spark)
            except ConcurrentWriteError:  # lost every retry: a clean failure, nothing written
                failures.append(1)
            except BaseException as e:  # anything else fails the test
                errors.append(e)

        threads = [threading.Thread(target=ticker) for _ in range(TICKERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, [f"{type(e).__name__}: {str(e)[:800]}" for e in errors]
        lost += len(failures)
        assert_sound(config)
    assert lost < ROUNDS * TICKERS  # most ticks commit (or find their tick already stored)
    assert_reclocked_is_replay("orders", config, spark)


def test_racing_tick_processes_count_nothing_twice(kafka_broker, spark, spark_connect, source):
    topic, config = source
    connected = over_connect(config, spark_connect)
    for round_ in range(PROCESS_ROUNDS):
        produce_round(kafka_broker, topic, round_)
        procs = [run_cli(connected, "tick", "orders") for _ in range(PROCESS_TICKERS)]
        outputs = [(p.wait(timeout=300), p.stdout.read().decode()) for p in procs]
        for code, output in outputs:  # a loser fails cleanly, naming the race
            assert code == 0 or "another" in output, output[-2000:]
        assert any(code == 0 for code, _ in outputs)
        assert_sound(config)
    assert_reclocked_is_replay("orders", config, spark)


RUNNERS = 3
RUN_ROUNDS = int(os.environ.get("RECLOCK_RACE_RUN_ROUNDS", "3"))


def test_racing_runs_end_cleanly(kafka_broker, spark, spark_connect, source):
    """Whole runs of one source race (a scheduled run beside manual ones, ``reclock run`` processes), records
    arriving between rounds: each run exits 0, or with one ``reclock: error:`` line naming the source and no
    traceback; at the end every record is published once (the engine's single-writer replay of remap)."""
    topic, config = source
    connected = over_connect(config, spark_connect)
    for round_ in range(RUN_ROUNDS):
        produce_round(kafka_broker, topic, round_)
        procs = [run_cli(connected, "run", "orders") for _ in range(RUNNERS)]
        outputs = [(p.wait(timeout=600), p.stdout.read().decode(errors="replace")) for p in procs]
        for code, output in outputs:
            errors = [line for line in output.splitlines() if line.startswith("reclock: error:")]
            assert code == 0 or (code == 2 and len(errors) == 1 and "orders" in errors[0]), _ends(output)
            assert "Traceback" not in output, _ends(output)
        assert_sound(config)
    assert_reclocked_is_replay("orders", config, spark)


def _ends(output: str) -> str:
    """A failed process's output for the assertion: from its Python traceback on (its start when it has none),
    the first 4,000 characters and the last 2,000 (a JVM's stack trace fills the rest)."""
    output = output[max(output.find("Traceback"), 0):]
    return output if len(output) <= 6000 else f"{output[:4000]}\n...\n{output[-2000:]}"


#: A publishing run whose window a tick moved between its stage and its publish refuses with one of these, and
#: publishes nothing (the next run stages the larger window).
PUBLISH_RACES = ("their staged batch has not been checked", "no complete staged attempt")


def test_records_arriving_while_ticks_race(kafka_broker, spark, source):
    """For ``RECLOCK_SOAK_SECONDS``: a producer writes records without pause, two tick threads race, and a
    publisher stages, checks and publishes what is bound, over and over.  Remap stays sound throughout, and at
    the end the published table is the engine's single-writer replay: nothing lost, nothing counted twice."""
    topic, config = source
    stop, errors, counts = threading.Event(), [], Counter()

    def guarded(work):
        def loop():
            while not stop.is_set():
                try:
                    work()
                except ConcurrentWriteError:  # lost every retry to the other ticker: clean, nothing written
                    pass
                except BaseException as e:
                    errors.append(e)
                    stop.set()
        return threading.Thread(target=loop)

    def produce_some():
        produce_round(kafka_broker, topic, counts["produced"])
        counts["produced"] += 1
        time.sleep(0.05)

    def tick():  # like scheduled runs of a source, a while apart, and these two racing each other
        counts["bindings"] += bool(pipeline.tick("orders", config, spark=spark)["written"])
        time.sleep(random.uniform(0, 1))

    def publish():
        try:
            pipeline.run_once("orders", config, spark, steps=("stage", "check", "publish"))
            counts["publish runs"] += 1
        except Exception as e:  # a tick landed after the stage: the window moved, nothing is published
            if not any(race in str(e) for race in PUBLISH_RACES):
                raise
            counts["publish races"] += 1

    threads = [guarded(produce_some), guarded(tick), guarded(tick), guarded(publish)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + SOAK_SECONDS
    while time.monotonic() < deadline and not stop.is_set():
        time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join()
    assert not errors, [f"{type(e).__name__}: {str(e)[:800]}" for e in errors]
    # a publish whose window a tick moved refuses; over a long run some publish while the ticks go on
    assert counts["produced"] and counts["bindings"] and counts["publish runs"] + counts["publish races"], counts
    assert counts["publish runs"] or SOAK_SECONDS < 60, counts
    assert_sound(config)
    assert_reclocked_is_replay("orders", config, spark)


def test_a_clock_stepped_back_binds_at_the_upper(kafka_broker, spark, source, monkeypatch, caplog):
    """A wall clock that steps back (an NTP correction, a skewed worker) does not wedge the source."""
    topic, config = source
    clock = iter([50_000, 20_000])
    monkeypatch.setattr(pipeline, "now_ms", lambda: next(clock))
    produce_round(kafka_broker, topic, 0)
    assert pipeline.tick("orders", config, spark=spark)["into_time"] == 50_000
    produce_round(kafka_broker, topic, 1)
    with caplog.at_level("WARNING", logger="reclock"):
        assert pipeline.tick("orders", config, spark=spark)["into_time"] == 50_001
    assert "the wall clock 20000 is behind the remap upper 50001" in caplog.text
    assert_sound(config)
    assert_reclocked_is_replay("orders", config, spark)


class _Published:
    """The tables of a source as :func:`reclock.pipeline.published_meanwhile` asks them: the published upper."""

    def __init__(self, upper: int):
        self.upper = upper

    def reclocked_upper(self) -> int:
        return self.upper


@pytest.mark.parametrize("error, published_upper, outcome", [
    # a racing run published the window (upper 11 > upto 10): it removed this step's staged attempt, or its
    # publish won: this step has nothing left to do
    (FileNotFoundError("attempt-2/part-0.parquet"), 11, "by another run"),
    (Exception("[PATH_NOT_FOUND] Path does not exist: .../upto=10/attempt-2"), 11, "by another run"),
    (ConcurrentWriteError("orders/reclocked: another writer committed reclock.reclocked"), 11, "by another run"),
    (None, 11, "done here"),  # no error: the step did its work (e.g. it published the window itself)
    (None, 10, "done here"),
    # the window is not published (or only a prefix of it): the error is this step's own
    (FileNotFoundError("attempt-2/part-0.parquet"), 10, FileNotFoundError),
    (Exception("[PATH_NOT_FOUND] Path does not exist"), 0, Exception),
    (ConcurrentWriteError("orders/reclocked: another writer committed reclock.reclocked"), 6, ConcurrentWriteError),
    # a source's error passes as it is, published or not
    (pipeline.SourceError("orders: partition 0 at offset 7: not JSON"), 11, pipeline.SourceError),
])
def test_a_step_whose_window_another_run_published_ends_saying_so(error, published_upper, outcome):
    """Stage, check and publish write, read or publish the staged attempts of their window; a racing run that
    publishes the window first removes them underneath, or wins the publish: the step then ends, saying the
    window was published by another run, instead of failing on what vanished."""
    ctx = type("Ctx", (), {"tables": _Published(published_upper)})()
    if isinstance(outcome, type):
        with pytest.raises(outcome) as caught:
            with pipeline.published_meanwhile("orders", ctx, 10, "check"):
                raise error
        assert caught.value is error
        return
    with pipeline.published_meanwhile("orders", ctx, 10, "check") as raced:
        if error is not None:
            raise error
    assert raced.by_another_run == (outcome == "by another run")


def _report(success: bool) -> CheckReport:
    return CheckReport("a batch", 3, (CheckResult("reclocked.primary_key_unique", "expect", success, "keys once"),))


@pytest.mark.parametrize("remap, batch, published_upper, by_another_run", [
    # the window is IntoTimes 10..20; its check began with nothing of it published (upper 10)
    (True, {"primary_key": False}, 16, True),  # a prefix published meanwhile: its rows were read twice
    (True, {"history": False, "primary_key": False}, 21, True),  # the whole window
    (False, {"primary_key": False}, 21, True),  # the remap's own report stands (recorded, raised)
    (True, {"primary_key": False}, 10, False),  # nothing published: the failure is the batch's own
    (True, {"reclocked": True, "primary_key": True}, 21, False),  # passed: nothing to explain
    (False, {"reclocked": True}, 21, False),  # only the remap failed: its own failure
])
def test_a_check_failing_on_a_window_another_run_published_meanwhile_says_so(remap, batch, published_upper,
                                                                             by_another_run, caplog):
    ctx = type("Ctx", (), {"tables": _Published(published_upper)})()
    results = {"remap": _report(remap), **{kind: _report(ok) for kind, ok in batch.items()}}
    assert failed_by_another_run("orders", ctx, (10, 20), results) == by_another_run
    said = f"orders: another run published IntoTimes up to {published_upper - 1} while this check of IntoTimes 10..20"
    assert (said in caplog.text) == by_another_run


def test_a_batch_staged_before_another_run_published_is_neither_checked_nor_published(spark, tmp_path, caplog):
    """Run B stages and checks a window; a tick binds more; run A stages the whole pending window (from the same
    start); B publishes the window it checked. A's batch holds records B published: A's check and publish end
    saying so (it is neither checked against the window left, whose ``in_window`` check it would fail, nor
    published twice), and the next run stages what is left: every line published once."""
    from conftest import write_sources_config

    from reclock.runtime import Runtime

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.log").write_bytes(b"one\ntwo\n")
    config = write_sources_config(tmp_path, ("web", "files", {"url": str(logs)}), retention_ms=10**9)
    run = Runtime.of(config, spark)
    pipeline.tick("web", run, now=1_000)
    b = pipeline.stage("web", run)
    assert pipeline.check("web", run)["reclocked"].startswith("reclocked batch: 6/6 checks passed on 2 rows")
    (logs / "a.log").write_bytes(b"one\ntwo\nthree\n")
    pipeline.tick("web", run, now=2_000)
    a = pipeline.stage("web", run)
    assert (a["start"], a["upto"], a["staged_rows"]) == (b["start"], 2_000, 3)
    assert pipeline.publish("web", run) == {"published": True, "reclocked_upper": 1_001}  # B: its window

    stale = {"published_by_another_run": True, "stale_batch": [a["start"], 2_000]}
    assert pipeline.check("web", run) == stale  # A
    assert "web: another run published IntoTimes up to 1000 after this batch of IntoTimes" in caplog.text
    assert pipeline.publish("web", run) == {"published": False, "reclocked_upper": 1_001, **stale}
    done = pipeline.run_once("web", run, now=3_000)  # the next run
    assert done["stage"]["start"] == 1_001 and done["publish"] == {"published": True, "reclocked_upper": 3_001}
    with runtime.open_source("web", config, connect=False) as ctx:
        rows = sorted((r["line"], r["into_time"]) for r in ctx.tables.read_reclocked_arrow().to_pylist())
    assert rows == [("one", 1_000), ("three", 2_000), ("two", 1_000)]
