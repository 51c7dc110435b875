"""Backfill and replay against a real broker, Spark and Delta: verify, repair and the refusals."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from airflow_env import DAGS_FOLDER, airflow_env, http_ok, prepare_home, run, run_python, stop_group
from airflow_env import airflow_db_template  # noqa: F401  (a session fixture)

from reclock import pipeline, runtime
from devtools.airflow_home import AIRFLOW
from reclock import cli
from reclock.backfill import BackfillError, replay, window_of_interval
from devtools.kafka_broker import create_topic, delete_records, free_port, produce
from reclock.engine import Frontier
from conftest import edit_config, reclocked_rows, spark_settings, write_config

TIMES = [1_000, 2_000, 3_000, 4_000]  # one tick (with new records) per IntoTime


def ticked_source(kafka_broker, spark, directory, name="events"):
    """A 2-partition Kafka source ticked, staged, checked, published, resumed at every TIMES."""
    topic = f"backfill-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker, topic, partitions=2)
    config = write_config(directory, kafka_broker, {name: topic})
    for round_, now in enumerate(TIMES):
        produce(kafka_broker, topic, [(f"k{i}", f"r{round_}-{i}", i % 2) for i in range(3 + round_)])
        pipeline.run_once(name, config, spark, now=now)
    return topic, config


@pytest.fixture(scope="module")
def source(kafka_broker, spark, tmp_path_factory):
    return ticked_source(kafka_broker, spark, tmp_path_factory.mktemp("backfill"))


# --- the DAG (parsed only) ----------------------------------------------------------------------------

DESCRIBE = """
import os
from types import SimpleNamespace
from airflow.models import DagBag
out = {}
for case, config in CASES.items():
    os.environ["RECLOCK_CONFIG"] = config
    bag = DagBag(dag_folder=DAGS)
    dags = {}
    for dag_id, dag in bag.dags.items():
        if dag_id.startswith("reclock_backfill_"):
            replay = dag.get_task("replay")
            dags[dag_id] = {"downstream": {t.task_id: sorted(t.downstream_task_ids) for t in dag.tasks},
                            "timetable": type(dag.timetable).__name__, "cron": dag.timetable.expression,
                            "start_date": dag.start_date.isoformat(), "catchup": dag.catchup,
                            "params": {k: dag.params[k] for k in dag.params},
                            "args": replay.application_args, "name": replay.name,
                            "replays": {t: dag.get_task("backfill_run").python_callable(dag_run=SimpleNamespace(
                                run_type=t)) for t in ("backfill", "scheduled", "manual")}}
        elif dag.has_task("tick"):  # a backfill of the pipeline DAG fails at its tick
            try:
                dag.get_task("tick").python_callable(dag_run=SimpleNamespace(run_type="backfill"))
            except Exception as e:
                dags[dag_id] = {"tick_in_backfill": f"{type(e).__name__}: {e}"}
    out[case] = {"dags": dags, "all": sorted(bag.dags),
                 "errors": {os.path.basename(k): v for k, v in bag.import_errors.items()}}
emit(out)
"""


def test_backfill_dag_per_source(tmp_path):
    (tmp_path / "good").mkdir(), (tmp_path / "clash").mkdir()
    good = write_config(tmp_path / "good", "127.0.0.1:1", {"orders": "orders", "clicks": "clicks"})
    clash = write_config(tmp_path / "clash", "127.0.0.1:1", {"x": "t1", "backfill_x": "t2"})
    code = f"CASES = {{'good': {good!r}, 'clash': {clash!r}}}\nDAGS = {str(DAGS_FOLDER)!r}\n"
    parsed = run_python(code + DESCRIBE, airflow_env(tmp_path / "airflow"), timeout=300)
    assert parsed["good"]["errors"] == {}
    assert parsed["good"]["all"] == ["reclock_backfill_clicks", "reclock_backfill_orders", "reclock_clicks",
                                     "reclock_example_as_of_join", "reclock_orders"]  # orders and clicks: the example
    dag = parsed["good"]["dags"]["reclock_backfill_orders"]
    assert dag["downstream"] == {"backfill_run": ["replay"], "replay": []}
    assert (dag["timetable"], dag["cron"]) == ("CronDataIntervalTimetable", "0 * * * *")
    assert (dag["start_date"], dag["catchup"], dag["params"]) == ("1970-01-01T00:00:00+00:00", False,
                                                                  {"backfill_mode": "verify"})
    assert dag["args"] == ["--config", good, "--source", "orders", "--replay-interval",
                           "{{ (data_interval_start.timestamp() * 1000) | round | int }}",
                           "{{ (data_interval_end.timestamp() * 1000) | round | int }}",
                           "--mode", "{{ params.backfill_mode }}"]
    assert dag["replays"] == {"backfill": True, "scheduled": False, "manual": False}
    assert parsed["good"]["dags"]["reclock_orders"]["tick_in_backfill"] == (
        "AirflowFailException: a backfill of reclock_orders would tick now, not replay its interval: "
        "backfill reclock_backfill_orders to replay published IntoTimes")
    [(file, error)] = parsed["clash"]["errors"].items()
    assert file == "reclock_sources.py" and "DAG id reclock_backfill_x is already another source's DAG" in error


def test_window_of_an_interval():
    assert window_of_interval(3_600_000, 7_200_000) == (3_600_000, 7_199_999)
    with pytest.raises(BackfillError, match="empty"):
        window_of_interval(3_600_000, 3_600_000)  # a cron *trigger* timetable's data interval


@pytest.mark.slow
def test_replay_is_identical_at_every_into_time_and_over_any_window(spark, source):
    _, config = source
    whole = replay("events", config, 0, 4_000, spark)
    assert whole["equal"] and not whole["repaired"]
    assert whole["replayed"] == {k: whole["published"][k] for k in ("rows", "digest")}
    assert whole["published"]["rows"] == len(reclocked_rows("events", config)) == 3 + 4 + 5 + 6
    assert (whole["bindings"], whole["reclocked_upper"]) == (4, 4_001)

    per_time = {t: replay("events", config, t, t, spark) for t in TIMES}
    assert [r["replayed"]["rows"] for r in per_time.values()] == [3, 4, 5, 6]
    assert all(r["equal"] and r["replayed"]["digest"] == r["published"]["digest"] for r in per_time.values())
    assert len({r["replayed"]["digest"] for r in per_time.values()}) == 4
    # sub-windows and windows without a binding
    assert replay("events", config, 1_500, 3_000, spark)["replayed"]["rows"] == 4 + 5
    empty = replay("events", config, 2_001, 2_999, spark)
    assert empty["equal"] and empty["replayed"]["rows"] == 0 and empty["ranges"] == 0
    # resume committed the group's offsets beyond every window: Kafka still holds the records
    with runtime.open_source("events", config) as ctx:
        assert ctx.source.committed() != Frontier() and ctx.source.released() == Frontier()


@pytest.mark.slow
def test_corrupted_window_fails_verification_and_repair_restores_it(spark, source):
    _, config = source
    original_rows = reclocked_rows("events", config)
    original = replay("events", config, 2_000, 3_000, spark)
    with runtime.open_source("events", config) as ctx:
        uri, upper = ctx.tables.table_uri("reclocked"), ctx.tables.reclocked_upper()
    DeltaTable(uri).delete("value = 'r2-3'")  # lose one published row of IntoTime 3000
    DeltaTable(uri).update({"diff": "2"}, predicate="value = 'r1-0'")  # and double another one

    with pytest.raises(BackfillError) as failed:
        replay("events", config, 2_000, 3_000, spark)
    message = str(failed.value)
    assert "events: IntoTimes [2000, 3000]: the published rows differ from the replay" in message
    assert "'value': 'r2-3'" in message and "'value': 'r1-0'" in message and "'diff': 2" in message
    assert replay("events", config, 4_000, 4_000, spark)["equal"]  # other windows are untouched

    repaired = replay("events", config, 2_000, 3_000, spark, mode="repair")
    assert repaired["repaired"] and repaired["equal"]
    assert repaired["published"]["before"]["rows"] == original["published"]["rows"] - 1
    assert repaired["published"]["digest"] == original["published"]["digest"] == original["replayed"]["digest"]
    assert reclocked_rows("events", config) == original_rows  # rows outside the window kept as they were
    with runtime.open_source("events", config) as ctx:
        assert ctx.tables.reclocked_upper() == upper  # the app transaction is unchanged
    again = replay("events", config, 2_000, 3_000, spark, mode="repair")
    assert again["equal"] and not again["repaired"]  # nothing to repair: no commit

    # a stray row where no binding is: the replay is empty, the repair removes it
    with runtime.open_source("events", config) as ctx:
        stray = ctx.tables.read_reclocked_arrow().slice(0, 1).to_pylist()[0] | {"into_time": 2_500, "value": "stray"}
        write_deltalake(uri, pa.Table.from_pylist([stray], schema=ctx.tables.schemas["reclocked"]), mode="append")
    with pytest.raises(BackfillError, match=r"replayed but not published \(up to 5\): \[\]; published but not "
                                            r"replayed \(up to 5\): \[\{.*'value': 'stray'"):
        replay("events", config, 2_001, 2_999, spark)
    assert replay("events", config, 2_001, 2_999, spark, mode="repair")["published"]["rows"] == 0
    assert reclocked_rows("events", config) == original_rows


@pytest.mark.slow
def test_cli_backfill(source, capsys):
    _, config = source
    assert cli.main(["--config", config, "backfill", "events", "--from", "2000",
                     "--to", "1970-01-01T00:00:03"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["window"], report["equal"], report["replayed"]["rows"]) == ([2_000, 3_000], True, 4 + 5)
    assert cli.main(["--config", config, "backfill", "events", "--from", "3000", "--to", "9000", "--repair"]) == 2
    assert "reclock: error: events: cannot replay IntoTimes [3000, 9000]: not published yet" in capsys.readouterr().err


@pytest.mark.slow
def test_refusals_and_the_compacted_binding(kafka_broker, spark, tmp_path):
    topic, config = ticked_source(kafka_broker, spark, tmp_path, name="audit")
    assert pipeline.compact("audit", config, now=12_500)["since"] == 2_500  # retention 10 s
    with pytest.raises(BackfillError, match=r"audit: cannot replay IntoTimes \[2000, 4000\]: IntoTimes before "
                                            r"since = 2500 were compacted away"):
        replay("audit", config, 2_000, 4_000, spark)
    with pytest.raises(BackfillError, match=r"IntoTimes \[3000, 4001\]: not published yet \(the last "
                                            r"published IntoTime is 4000"):
        replay("audit", config, 3_000, 4_001, spark)
    with pytest.raises(BackfillError, match="start is after end"):
        replay("audit", config, 3_000, 2_999, spark)

    # [since]: the folded binding (everything up to remap[2500], consolidated at 2500) replays from offset 0
    folded = replay("audit", config, 2_500, 2_500, spark)
    assert folded["equal"] and folded["replayed"]["rows"] == 3 + 4
    assert replay("audit", config, 2_500, 4_000, spark)["replayed"]["rows"] == 3 + 4 + 5 + 6

    with runtime.open_source("audit", config) as ctx:
        at_3000 = ctx.tables.read_remap().at(3_000)  # where the window [4000, 4000] starts reading
    delete_records(kafka_broker, topic, 0, before=at_3000[0] - 1)  # release some records of IntoTime 3000
    assert replay("audit", config, 4_000, 4_000, spark)["equal"]  # still held: it reads from remap[3999]
    with pytest.raises(BackfillError) as refused:
        replay("audit", config, 3_000, 4_000, spark)
    message = str(refused.value)
    assert message.startswith("audit: cannot replay IntoTimes [3000, 4000]: upstream already released data the "
                              "window needs: it reads from {0: ")
    assert f"released up to {{0: {at_3000[0] - 1}}}" in message and "committed frontier {0: " in message
    with pytest.raises(BackfillError, match="the beginning of the source"):
        replay("audit", config, 2_500, 2_500, spark)


# --- Airflow: `airflow backfill create` run by a real scheduler -------------------------------------

class AirflowServices:
    """``airflow api-server`` (the execution API the task runners call), then ``airflow scheduler``."""

    def __init__(self, env: dict[str, str], directory: Path, port: int):
        self.env, self.directory, self.port, self.procs = env, directory, port, []

    def __enter__(self) -> "AirflowServices":
        try:
            self._start("api-server")
            deadline = time.monotonic() + 180
            while not http_ok(f"http://127.0.0.1:{self.port}/api/v2/monitor/health"):
                self.check_running()
                assert time.monotonic() < deadline, f"api-server not up:\n{self.log('api-server')[-5000:]}"
                time.sleep(1)
            self._start("scheduler", "--skip-serve-logs")
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self, name: str, *args: str) -> None:
        log = open(self.directory / f"{name}.log", "w")
        self.procs.append((name, log, subprocess.Popen(
            [AIRFLOW, name, *args], env=self.env, cwd=self.directory, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)))

    def check_running(self) -> None:
        for name, _, proc in self.procs:
            if proc.poll() is not None:
                raise AssertionError(f"airflow {name} exited {proc.returncode}:\n{self.log(name)[-5000:]}")

    def log(self, name: str) -> str:
        return (self.directory / f"{name}.log").read_text()

    def __exit__(self, *exc) -> None:
        for _, log, proc in self.procs:  # each process group this object started
            stop_group(proc)
            log.close()


def airflow(env, *args) -> str:
    return run([AIRFLOW, *args], env, timeout=300)


def dag_runs(home: Path, dag_id: str) -> list[dict]:
    with sqlite3.connect(home / "airflow.db") as db:
        db.row_factory = sqlite3.Row
        runs = db.execute("SELECT r.run_id, r.run_type, r.state, r.backfill_id, r.data_interval_start, "
                          "r.data_interval_end, b.completed_at FROM dag_run r LEFT JOIN backfill b "
                          "ON r.backfill_id = b.id WHERE r.dag_id = ? ORDER BY r.id", (dag_id,)).fetchall()
        tis = db.execute("SELECT run_id, task_id, state FROM task_instance WHERE dag_id = ?", (dag_id,)).fetchall()
    states = {}
    for ti in tis:
        states.setdefault(ti["run_id"], {})[ti["task_id"]] = ti["state"]
    return [{**dict(r), "tasks": states.get(r["run_id"], {})} for r in runs]


def wait_for_runs(services: AirflowServices, home: Path, dag_id: str, count: int, timeout: float = 600,
                  run_types=("backfill",)):
    """The runs of ``run_types`` once ``count`` of them finished (success or failed)."""
    deadline = time.monotonic() + timeout
    while True:
        runs = [r for r in dag_runs(home, dag_id) if r["run_type"] in run_types]
        if len(runs) >= count and all(r["state"] in ("success", "failed") for r in runs):
            return runs
        services.check_running()
        if time.monotonic() > deadline:
            raise AssertionError(f"backfill runs not done: {runs}\n{services.log('scheduler')[-5000:]}")
        time.sleep(2)


def _event(line: dict) -> str:
    """A task log line's message, with the exception's type and message when it has one (a Python task's failure)."""
    errors = [f"{e.get('exc_type')}: {e.get('exc_value')}" for e in line.get("error_detail") or []]
    return "\n".join([line.get("event", ""), *errors])


def task_log(home: Path, dag_id: str, run_id: str, task_id: str) -> list[str]:
    """The events (messages) of a task's log: JSON lines, one per message."""
    paths = sorted((home / "logs").glob(f"dag_id={dag_id}/run_id={run_id}/task_id={task_id}/attempt=*.log"))
    return [_event(json.loads(line)) for p in paths for line in p.read_text().splitlines() if line]


@pytest.mark.slow
def test_airflow_backfill_create_replays_each_data_interval(kafka_broker, spark, spark_connect, tmp_path,
                                                            airflow_db_template):  # noqa: F811
    """``airflow backfill create`` over three hours, run by a real scheduler (LocalExecutor, with the
    ``reclock_preload`` plugin: the replays run in task processes forked with the task modules imported) and API
    server.

    Hour 1 is intact, hour 2 lost a published row, hour 3 is not published yet; in "repair" mode the
    runs verify hour 1, rewrite hour 2 and refuse hour 3.  The history is made here (local Spark); then the
    sources file names the session's Spark Connect server, so the replays are Python tasks, its clients.
    """
    topic = f"airflow-backfill-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker, topic, partitions=2)
    config = write_config(tmp_path, kafka_broker, {"events": topic})
    first = (int(time.time()) // 3600 - 3) * 3_600_000  # three past hours (backfills refuse future dates)
    hours = [first + h * 3_600_000 for h in range(3)]
    for round_, now in enumerate([hours[0] + 60_000, hours[1] + 60_000, hours[1] + 1_800_000, hours[2] + 1_000]):
        produce(kafka_broker, topic, [(f"k{i}", f"r{round_}-{i}", i % 2) for i in range(4)])
        pipeline.tick("events", config, now=now)  # every step but compaction (retention is 10 s)
        pipeline.stage("events", config, spark)
        pipeline.check("events", config)
        pipeline.publish("events", config)
        pipeline.resume("events", config)
    original = reclocked_rows("events", config)
    intact = replay("events", config, hours[1], hours[1] + 3_599_999, spark)  # by hand, before the corruption
    assert intact["replayed"]["rows"] == 8
    with runtime.open_source("events", config) as ctx:
        DeltaTable(ctx.tables.table_uri("reclocked")).delete("value = 'r2-2'")  # corrupt hour 2

    edit_config(config, lambda doc: doc.update(spark=spark_settings(spark_connect)))  # the DAG's Spark from now on
    home, port = tmp_path / "airflow", free_port()
    env = prepare_home(home, config, db_template=airflow_db_template)
    env.update({"AIRFLOW__CORE__EXECUTOR": "LocalExecutor", "AIRFLOW__API__PORT": str(port),
                "AIRFLOW__CORE__PLUGINS_FOLDER": str(DAGS_FOLDER.parent / "plugins"),  # reclock_preload
                "AIRFLOW__API__WORKERS": "1", "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/"})
    dag_id = "reclock_backfill_events"
    iso = [datetime.fromtimestamp(h / 1000, timezone.utc).isoformat() for h in (hours[0], hours[2])]
    airflow(env, "dags", "reserialize")  # the scheduler reads serialized DAGs (no dag-processor here)
    airflow(env, "dags", "unpause", dag_id)  # backfill runs of a paused DAG stay queued
    airflow(env, "backfill", "create", "--dag-id", dag_id, "--from-date", iso[0], "--to-date", iso[1],
            "--max-active-runs", "1", "--dag-run-conf", json.dumps({"backfill_mode": "repair"}))
    airflow(env, "dags", "trigger", dag_id)  # a manual run: replays nothing
    with pytest.raises(RuntimeError, match="reclock_events has a non-periodic schedule that does not support "
                                           "backfills"):  # why the backfill DAG is a DAG of its own
        airflow(env, "backfill", "create", "--dag-id", "reclock_events", "--from-date", iso[0], "--to-date", iso[1])
    with AirflowServices(env, tmp_path, port) as services:
        runs = wait_for_runs(services, home, dag_id, 3)
        others = wait_for_runs(services, home, dag_id, 1, run_types=("manual", "scheduled"))
    # the task processes were forked with reclock's task modules imported (Spark Connect's client among them)
    assert "reclock: task modules imported for the LocalExecutor's task processes in" in services.log("scheduler")
    logs = [task_log(home, dag_id, r["run_id"], "replay") for r in runs]
    windows = [[h, h + 3_599_999] for h in hours]
    assert [(r["state"], r["tasks"]) for r in runs] == [
        ("success", {"backfill_run": "success", "replay": "success"}),
        ("success", {"backfill_run": "success", "replay": "success"}),
        ("failed", {"backfill_run": "success", "replay": "failed"})], logs
    reports = [json.loads(next(e for e in log if e.startswith('{"source": "events"'))) for log in logs[:2]]
    assert [r["window"] for r in reports] == windows[:2]  # [data_interval_start, data_interval_end) in ms
    assert [(r["equal"], r["repaired"], r["replayed"]["rows"]) for r in reports] == [(True, False, 4),
                                                                                     (True, True, 8)]
    assert reports[1]["published"]["before"]["rows"] == 7
    assert reports[1]["published"]["digest"] == intact["published"]["digest"]
    assert (f"events: cannot replay IntoTimes [{windows[2][0]}, {windows[2][1]}]: not published yet (the last "
            f"published IntoTime is {hours[2] + 1_000}") in "\n".join(logs[2])
    assert reclocked_rows("events", config) == original
    # manual runs and the unpaused DAG's scheduled runs (if the backfill left it one to make) replay nothing
    assert all(r["state"] == "success" and r["tasks"] == {"backfill_run": "success", "replay": "skipped"}
               for r in others), others
