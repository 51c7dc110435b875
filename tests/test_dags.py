"""The generated DAGs, parsed by a real DagBag in a subprocess with a temp AIRFLOW_HOME and config."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_env import DAGS_FOLDER, PYTHON, REPO, airflow_env, prepare_home, run, run_dag_test, run_python
from airflow_env import airflow_db_template  # noqa: F401  (a session fixture)

ORDER = ["tick", "reclock", "check", "publish", "resume", "compact"]


def write_config(directory: Path, schedule_clicks="@hourly", kind="kafka") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    options = {"bootstrap_servers": "127.0.0.1:1", "group_id": "g"}
    doc = {
        "warehouse": str(directory / "warehouse"),
        "spark": {"master": "local[1]", "conf": {"spark.ui.enabled": False}},
        "sources": [
            {"name": "orders", "kind": kind, "schedule": None, "start_date": "2026-01-01",
             "options": {**options, "topic": "orders"}},
            {"name": "clicks", "kind": "kafka", "schedule": schedule_clicks, "start_date": "2026-02-01T06:00:00",
             "retention_ms": 60000, "options": {**options, "topic": "clicks"}},
        ],
    }
    path = directory / "sources.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def write_pg_files_config(directory: Path) -> Path:
    """A Postgres and a files source: same DAG shape as Kafka (parsing connects to neither)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "sources.yaml"
    path.write_text(yaml.safe_dump({"warehouse": str(directory / "warehouse"), "sources": [
        {"name": "pg", "kind": "postgres", "start_date": "2026-01-01",
         "options": {"dsn": "host=/nowhere dbname=app", "slot": "reclock_pg"}},
        {"name": "logs", "kind": "files", "schedule": "@daily", "start_date": "2026-01-01",
         "options": {"url": "s3://bucket/logs"}},
    ]}))
    return path


# Parse one DagBag per config in one subprocess and describe what Airflow saw.
DESCRIBE = """
import os
from airflow.models import DagBag
out = {}
for case, config in CASES.items():
    os.environ["RECLOCK_CONFIG"] = config
    before = dict(os.environ)
    bag = DagBag(dag_folder=DAGS)
    side_effects = sorted(k for k in {*before, *os.environ} if before.get(k) != os.environ.get(k))
    dags = {}
    examples = {}
    for dag_id, dag in bag.dags.items():
        if dag_id.startswith("reclock_example_"):
            examples[dag_id] = {"assets": sorted(a.name for a in dag.timetable.asset_condition.objects),
                                "tasks": {t.task_id: t.pool for t in dag.tasks}}
        if dag_id.startswith(("reclock_backfill_", "reclock_example_")):  # test_backfill.py describes backfills
            continue
        spark = dag.get_task("reclock")
        parsed_conn = os.environ.get("AIRFLOW_CONN_RECLOCK_SPARK")
        spark.define_connection()  # what the task does when it runs
        dags[dag_id] = {
            "policy": {t.task_id: [t.retries, t.retry_delay.total_seconds(), t.retry_exponential_backoff,
                                   t.max_retry_delay.total_seconds(), t.execution_timeout.total_seconds(), t.pool]
                       for t in dag.tasks},
            "connection_at_parse": parsed_conn,
            "downstream": {t.task_id: sorted(t.downstream_task_ids) for t in dag.tasks},
            "schedule": dag.schedule, "timetable": type(dag.timetable).__name__,
            "cron": getattr(dag.timetable, "expression", None),
            "start_date": dag.start_date.isoformat(), "catchup": dag.catchup,
            "max_active_runs": dag.max_active_runs, "tags": sorted(dag.tags), "doc_md": dag.doc_md,
            "spark": {"application": spark.application, "args": spark.application_args, "conf": spark.conf,
                      "env_vars": spark.env_vars, "binary": spark._spark_binary, "conn_id": spark._conn_id,
                      "master": spark._get_hook()._connection["master"]},
        }
        os.environ.pop("AIRFLOW_CONN_RECLOCK_SPARK", None)  # as the task's own process would have it
    os.environ.pop("AIRFLOW_CONN_RECLOCK_SPARK", None)
    out[case] = {"dags": dags, "errors": {os.path.basename(k): v for k, v in bag.import_errors.items()},
                 "side_effects": side_effects, "examples": examples}
emit(out)
"""


@pytest.fixture(scope="module")
def parsed(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("dags")
    cases = {
        "good": write_config(base / "good"),
        "bad_kind": write_config(base / "bad_kind", kind="pubnub"),
        "bad_cron": write_config(base / "bad_cron", schedule_clicks="every tuesday"),
        "missing": base / "absent.yaml",
        "pg_files": write_pg_files_config(base / "pg_files"),
        "demo": REPO / "include" / "sources.yaml",
    }
    code = f"CASES = {({k: str(v) for k, v in cases.items()})!r}\nDAGS = {str(DAGS_FOLDER)!r}\n"
    result = run_python(code + DESCRIBE, airflow_env(base / "airflow"), timeout=300)
    return {**result, "paths": cases}


def test_one_dag_per_source_without_errors(parsed):
    good = parsed["good"]
    assert good["errors"] == {}
    assert sorted(good["dags"]) == ["reclock_clicks", "reclock_orders"]
    assert sorted(parsed["demo"]["dags"]) == ["reclock_clicks", "reclock_orders"]


def test_example_as_of_join_runs_on_its_sources_assets(parsed):
    """With orders and clicks configured, the example DAG is scheduled on both their Assets; without, not built."""
    for case in ("good", "demo"):
        assert parsed[case]["examples"] == {"reclock_example_as_of_join": {
            "assets": ["reclock_clicks_reclocked", "reclock_orders_reclocked"],
            "tasks": {"publish_as_of": "reclock_spark"}}}, case
    assert parsed["pg_files"]["examples"] == {} and parsed["pg_files"]["errors"] == {}


@pytest.mark.parametrize("case, dag_id", [("good", "reclock_orders"), ("good", "reclock_clicks"),
                                           ("pg_files", "reclock_pg"), ("pg_files", "reclock_logs")])
def test_task_order(parsed, case, dag_id):
    assert parsed[case]["errors"] == {}
    downstream = parsed[case]["dags"][dag_id]["downstream"]
    assert downstream == {task: ORDER[i + 1:i + 2] for i, task in enumerate(ORDER)}


def test_schedule_and_dag_settings(parsed):
    orders, clicks = (parsed["good"]["dags"][f"reclock_{n}"] for n in ("orders", "clicks"))
    assert orders["timetable"] == "NullTimetable"  # schedule: null = manual only
    assert clicks["schedule"] == "@hourly"
    assert (clicks["timetable"], clicks["cron"]) == ("CronTriggerTimetable", "0 * * * *")
    assert orders["start_date"] == "2026-01-01T00:00:00+00:00"
    assert clicks["start_date"] == "2026-02-01T06:00:00+00:00"
    for dag in (orders, clicks):
        assert (dag["catchup"], dag["max_active_runs"], dag["tags"]) == (False, 1, ["reclock"])
    assert "Reclock `clicks` (kafka)" in clicks["doc_md"] and '"topic": "clicks"' in clicks["doc_md"]


def test_parsing_has_no_side_effects(parsed):
    for case in ("good", "pg_files", "bad_cron"):
        assert parsed[case]["side_effects"] == [], case
    assert parsed["good"]["dags"]["reclock_orders"]["connection_at_parse"] is None


# task: (retries, execution_timeout in s, pool): retries back off exponentially from 30 s (x2, at most 10 min)
POLICY = {"tick": (3, 7200, "reclock_spark"), "reclock": (2, 21600, "reclock_spark"),
          "check": (2, 3600, "reclock_spark"), "publish": (2, 3600, "reclock_spark"),
          "resume": (3, 900, "default_pool"), "compact": (1, 7200, "reclock_spark")}


@pytest.mark.parametrize("task", ORDER)
def test_retries_timeouts_and_pool(parsed, task):
    retries, timeout, pool = POLICY[task]
    for case, dag_id in (("good", "reclock_orders"), ("pg_files", "reclock_pg")):
        assert parsed[case]["dags"][dag_id]["policy"][task] == [retries, 30.0, 2.0, 600.0, timeout, pool]


def test_dags_report_parses_without_spark_or_gx(tmp_path, airflow_db_template):
    """``airflow dags report`` parses the DAG file of the demo's config, and parsing it imports none of the heavy
    libraries the tasks use (Spark, GX, pandas, delta-rs): the dag processor parses it every few seconds."""
    env = prepare_home(tmp_path / "airflow", REPO / "include" / "sources.yaml", db_template=airflow_db_template)
    out = run([str(Path(PYTHON).parent / "airflow"), "dags", "report", "-o", "json"], env, stderr=False)
    [report] = [r for r in json.loads(out.strip().splitlines()[-1]) if r["file"].endswith("reclock_sources.py")]
    assert int(report["dag_num"]) >= 2 and int(report["task_num"]) >= 12, report
    probe = ("import importlib.util, sys\n"
             "spec = importlib.util.spec_from_file_location('dags', sys.argv[1])\n"
             "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'pyspark', 'great_expectations', 'pandas', "
             "'deltalake', 'py4j'}))")
    imported = run([PYTHON, "-c", probe, str(REPO / "dags" / "reclock_sources.py")], env, stderr=False)
    assert imported.strip().splitlines()[-1] == "[]"


PRELOAD = """
import sys
sys.argv = ARGV
sys.path.insert(0, PLUGINS)
from reclock_preload import Preload
heavy = lambda: sorted({m.split('.')[0] for m in sys.modules} & {'pyspark', 'pandas', 'deltalake', 'pyarrow'})
before = heavy()
Preload().on_starting(component=None)
emit({"before": before, "after": heavy()})
"""


@pytest.mark.parametrize("argv, executor, preloaded", [
    (["airflow", "scheduler"], "LocalExecutor", True),  # forks the workers that fork the task processes
    (["airflow", "scheduler"], "CeleryExecutor", False),  # the Celery workers fork them
    (["airflow", "dag-processor"], "LocalExecutor", False),
    (["airflow", "api-server"], "LocalExecutor", False),
])
def test_only_the_scheduler_that_forks_task_processes_imports_the_task_modules(tmp_path, argv, executor, preloaded):
    """The ``reclock_preload`` plugin's listener: the scheduler of a LocalExecutor imports the task modules before
    its workers are forked (tests/test_backfill.py runs tasks so); no other process imports more than it did."""
    env = {**airflow_env(tmp_path / "airflow"), "AIRFLOW__CORE__EXECUTOR": executor}
    code = PRELOAD.replace("ARGV", repr(argv)).replace("PLUGINS", repr(str(REPO / "plugins")))
    found = run_python(code, env)
    heavy = ["deltalake", "pandas", "pyarrow", "pyspark"]
    assert (found["before"], found["after"]) == ([], heavy if preloaded else []), found


# What a task process parses: Airflow sets the parsing context to the task's DAG (get_parsing_context).
TASK_PARSE = """
import importlib.util, os, sys
os.environ["RECLOCK_CONFIG"] = CONFIG
out = {}
for dag_id in ("reclock_orders", "reclock_backfill_clicks", "reclock_nothing"):
    os.environ["_AIRFLOW_PARSING_CONTEXT_DAG_ID"] = dag_id
    spec = importlib.util.spec_from_file_location("dags_" + dag_id, DAG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out[dag_id] = sorted(k for k, v in vars(module).items() if type(v).__name__ == "DAG")
emit(out)
"""


def test_a_task_process_builds_only_its_own_dag(tmp_path):
    """In a task's process (Airflow's parsing context names the DAG) the DAG file builds that DAG alone; a DAG id
    no entry has builds none, and the whole parse (no context) builds every one (``parsed``)."""
    config = write_config(tmp_path / "config")
    code = f"CONFIG = {str(config)!r}\nDAG_FILE = {str(DAGS_FOLDER / 'reclock_sources.py')!r}\n"
    built = run_python(code + TASK_PARSE, airflow_env(tmp_path / "airflow"), timeout=300)
    assert {k: built[k] for k in ("reclock_orders", "reclock_backfill_clicks", "reclock_nothing")} == {
        "reclock_orders": ["reclock_orders"], "reclock_backfill_clicks": ["reclock_backfill_clicks"],
        "reclock_nothing": []}


def test_description_masks_credentials(parsed):
    doc = parsed["pg_files"]["dags"]["reclock_pg"]["doc_md"]
    assert '"dsn": "***"' in doc and "host=/nowhere" not in doc
    assert '"slot": "reclock_pg"' in doc


def test_spark_task(parsed):
    spark = parsed["good"]["dags"]["reclock_orders"]["spark"]
    assert Path(spark["application"]) == REPO / "spark_jobs" / "reclock_job.py"
    assert spark["args"] == ["--config", str(parsed["paths"]["good"]), "--source", "orders"]
    assert spark["conn_id"] == "reclock_spark"
    assert spark["master"] == "local[1]"  # the connection follows the config's spark.master
    assert spark["binary"] == str(Path(PYTHON).parent / "spark-submit")
    assert spark["env_vars"] == {"PYSPARK_PYTHON": PYTHON}
    # Every session setting, jars included (Spark's Kafka source, Delta), then the config's spark.conf.
    from reclock.spark.session import session_conf

    assert spark["conf"] == {**session_conf(master="local[1]"), "spark.pyspark.python": PYTHON,
                             "spark.ui.enabled": "false"}
    assert "spark.jars" not in spark["conf"]  # a local master: the jars on the driver's classpath, not copied


@pytest.mark.parametrize("case, message", [
    ("bad_kind", r"sources[0] (orders).kind: unknown kind 'pubnub' (known: "),
    ("bad_cron", "sources[1] (clicks).schedule: not a cron expression"),
    ("missing", "cannot read config"),
])
def test_broken_config_is_an_import_error(parsed, case, message):
    result = parsed[case]
    assert result["dags"] == {}
    [(file, error)] = result["errors"].items()
    assert file == "reclock_sources.py"
    assert "ConfigError" in error and message in error and str(parsed["paths"][case]) in error


@pytest.mark.slow
def test_dag_test_runs_every_task(tmp_path, airflow_db_template):
    """dag.test() with a stub pipeline and a tiny Spark job: the Spark connection and binaries work."""
    job = tmp_path / "job.py"
    job.write_text(
        "import sys\nfrom pyspark.sql import SparkSession\n"
        "spark = SparkSession.builder.getOrCreate()\n"
        "assert spark.sparkContext.master == 'local[1]', spark.sparkContext.master\n"
        "assert spark.range(3).rdd.map(lambda r: r.id).sum() == 3  # a Python worker runs\n"
        "print('JOB', sys.executable, sys.argv[1:], flush=True)\nspark.stop()\n")
    setup = (
        "import sys, types, reclock\n"
        "calls = []\n"
        "stub = types.ModuleType('reclock.pipeline')\n"
        "for step in ('tick', 'check', 'resume', 'compact'):\n"
        "    setattr(stub, step, lambda name, path, step=step: calls.append(step) or {'step': step})\n"
        "stub.publish = lambda name, path: {'published': True, 'reclocked_upper': 4242}\n"
        "sys.modules['reclock.pipeline'] = reclock.pipeline = stub\n")
    config = write_config(tmp_path / "conf")
    env = prepare_home(tmp_path / "airflow", config, db_template=airflow_db_template)
    env["PATH"] = "/usr/bin:/bin"  # spark-submit and Python must come from the venv without PATH
    adjust = f"dag.get_task('reclock').application = {str(job)!r}"
    result = run_dag_test("reclock_orders", env, setup=setup, adjust=adjust)
    assert result["state"] == "success", result["output"][-3000:]
    assert set(result["tasks"].values()) == {"success"} and len(result["tasks"]) == len(ORDER)
    assert f"JOB {PYTHON} ['--config', '{config}', '--source', 'orders']" in result["output"]
    with sqlite3.connect(tmp_path / "airflow" / "airflow.db") as db:  # publish updated the source's Asset
        events = db.execute("SELECT a.name, a.uri, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id"
                            ).fetchall()
    assert [(n, u, json.loads(x)) for n, u, x in events] == [
        ("reclock_orders_reclocked", f"file://{tmp_path / 'conf' / 'warehouse'}/orders/reclocked",
         {"source": "orders", "reclocked_upper": 4242, "published": True})]


KINESIS_TICK = {"into_time": 1_795_882_184_221, "written": True,
                "frontier": [["shardId-000000000000", 49_668_001_349_874_552_233_806_236_962_493_116_145_408_930_817_362_755_586]],
                "new_offsets": 49_668_001_349_874_552_233_806_236_962_493_116_145_408_930_817_362_755_586}


def test_a_kinesis_ticks_result_is_stored_as_xcom():
    """Airflow's task runner sends a task's XCom as msgpack (msgspec), whose ints are 64 bits: a Kinesis tick's
    result failed every tick task of a scheduled DAG (OverflowError) after its binding was committed."""
    import msgspec

    from reclock.orchestration import xcom_safe

    with pytest.raises(OverflowError):
        msgspec.msgpack.encode(KINESIS_TICK)
    safe = xcom_safe(KINESIS_TICK)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(safe)) == {
        **KINESIS_TICK, "frontier": [["shardId-000000000000", str(KINESIS_TICK["new_offsets"])]],
        "new_offsets": str(KINESIS_TICK["new_offsets"])}


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=3),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)))
def test_xcom_safe_values_encode_and_keep_every_int_that_fits(value):
    """Whatever a step returns encodes; an int that fits stays an int, a wider one is its decimal string."""
    import msgspec

    from reclock.orchestration import xcom_safe

    def same(stored, original) -> bool:
        if isinstance(original, bool) or not isinstance(original, (int, list, dict)):
            return stored == original and type(stored) is type(original)
        if isinstance(original, int):
            return stored == original if -2**63 <= original < 2**63 else stored == str(original)
        if isinstance(original, list):
            return len(stored) == len(original) and all(map(same, stored, original))
        return stored.keys() == original.keys() and all(same(stored[k], original[k]) for k in original)

    assert same(msgspec.msgpack.decode(msgspec.msgpack.encode(xcom_safe(value))), value)
