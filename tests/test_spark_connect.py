"""A long-lived Spark: every step of a Kafka source over a Spark Connect server (the config's ``spark.remote``),
in a process that starts no JVM, and the DAG's Connect path (no spark-submit) under Airflow's dag.test().

Clients of the server run in subprocesses: this process has the local ``spark`` session, and PySpark cannot
hold a Connect session beside it (docs: operations/spark.md, A long-lived Spark)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml
from airflow_env import DAGS_FOLDER, airflow_env, prepare_home, run_python
from airflow_env import airflow_db_template  # noqa: F401  (a session fixture)
from conftest import engine_rows, fresh_database, reclocked_rows, write_config, write_sources_config

from devtools.kafka_broker import produce
from reclock import pipeline, runtime

pytestmark = pytest.mark.slow

# In the subprocess: every step at IntoTime NOW over the server, and what the process holds afterwards.
RUN_ONCE = """
from pyspark import SparkContext
from pyspark.sql.connect.client.core import SparkConnectClient
from reclock import pipeline, runtime
from reclock.spark.session import is_remote
analyzed, analyze = [], SparkConnectClient._analyze
def counted(self, method, **kwargs):  # a round trip to the server that runs no job (a schema, unpersist, ...)
    analyzed.append(method)
    return analyze(self, method, **kwargs)
SparkConnectClient._analyze = counted
steps = [pipeline.run_once(NAME, CONFIG, now=now) for now in NOWS]
with runtime.open_source(NAME, CONFIG, spark=True) as ctx:
    remote = is_remote(ctx.spark)
emit({"steps": steps, "remote": remote, "local_jvm": SparkContext._active_spark_context is not None,
      "analyzed": analyzed})
"""


def remote_config(tmp_path, kafka_broker, topic: str, url: str) -> str:
    return write_config(tmp_path, kafka_broker, {"orders": topic}, spark_remote=url)


def test_kafka_run_once_over_spark_connect(spark_connect, kafka_broker, kafka_topic, tmp_path):
    topic = kafka_topic(partitions=3, prefix="connect")
    config = remote_config(tmp_path, kafka_broker, topic, spark_connect)
    produce(kafka_broker, topic, [(f"u{i}", f"a{i}", i % 3) for i in range(9)])
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    first = run_python(f"CONFIG, NAME, NOWS = {config!r}, 'orders', [1000]\n" + RUN_ONCE, env, timeout=600)
    produce(kafka_broker, topic, [(f"u{i}", f"b{i}", i % 3) for i in range(30)])
    second = run_python(f"CONFIG, NAME, NOWS = {config!r}, 'orders', [2000, 3000]\n" + RUN_ONCE, env, timeout=600)

    assert first["remote"] and not first["local_jvm"], first["output"][-3000:]
    assert second["remote"] and not second["local_jvm"], second["output"][-3000:]
    assert second["analyzed"] == [], second["analyzed"]  # the runs' only round trips are their Spark jobs
    [one], [two, idle] = first["steps"], second["steps"]
    assert one["tick"]["frontier"] == {"0": 3, "1": 3, "2": 3} and one["stage"]["staged_rows"] == 9
    assert two["tick"]["frontier"] == {"0": 13, "1": 13, "2": 13} and two["stage"]["staged_rows"] == 30
    assert idle["tick"]["new_offsets"] == 0 and idle["stage"]["staged_rows"] == 0
    assert all(run["publish"]["published"] for run in (one, two))
    assert idle["publish"]["reclocked_upper"] == 3001
    expected = engine_rows("orders", config)
    assert [r[3] for r in expected].count(2_000) == 30 and len(expected) == 39
    assert reclocked_rows("orders", config) == expected


def test_files_run_once_over_spark_connect(spark_connect, tmp_path):
    """A files source is read by the "reclock" Python data source: over Connect, registered from the client and
    run by the server's Python workers, which import reclock."""
    root = tmp_path / "in"
    root.mkdir()
    (root / "a.log").write_bytes(b"a1\na2\n")
    (root / "b.log").write_bytes(b"b1\nb2 partial")
    config = write_sources_config(tmp_path, ("logs", "files", {"url": str(root), "pattern": "*.log"}),
                                  spark_remote=spark_connect)
    result = run_python(f"CONFIG, NAME, NOWS = {config!r}, 'logs', [1000]\n" + RUN_ONCE,
                        {**os.environ, "PYSPARK_PYTHON": sys.executable}, timeout=600)
    assert result["remote"] and not result["local_jvm"], result["output"][-3000:]
    [run] = result["steps"]
    assert run["stage"]["staged_rows"] == 3 and run["publish"]["published"]
    with runtime.open_source("logs", config) as ctx:
        rows = ctx.tables.read_reclocked_arrow().to_pylist()
    assert sorted((r["line"], r["offset"], r["into_time"], r["diff"]) for r in rows) == [
        ("a1", 0, 1000, 1), ("a2", 3, 1000, 1), ("b1", 0, 1000, 1)]


# In the subprocess: one step of source NAME, as an Airflow task runs it, in a process of its own.
STEP = """
from reclock import pipeline
emit({"result": getattr(pipeline, STEP)(NAME, CONFIG, **KWARGS)})
"""


def test_a_postgres_check_alone_in_its_process_over_spark_connect(spark_connect, pg_cluster, tmp_path):
    """Each step of a DAG run is a task process of its own. A Postgres check whose batch its summary proves opens
    Spark only for the history: the checks' columns (the offsets spelled as commit LSNs) are made once its
    session is open, which makes pyspark's functions Spark Connect's (before it, they fail)."""
    import psycopg

    with fresh_database(pg_cluster, "CREATE TABLE acct (id int PRIMARY KEY, bal numeric)",
                        "INSERT INTO acct VALUES (1, 10)") as dsn:
        config = write_sources_config(tmp_path, ("bank", "postgres", {"dsn": dsn, "slot": "s_alone",
                                                                      "tables": ["acct"]}),
                                      retention_ms=10**9, spark_remote=spark_connect)
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}

        def step(name: str, **kwargs):
            code = f"CONFIG, NAME, STEP, KWARGS = {config!r}, 'bank', {name!r}, {kwargs!r}\n" + STEP
            return run_python(code, env, timeout=600)["result"]

        step("run_once", now=1_000)  # the snapshot
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("UPDATE acct SET bal = 11 WHERE id = 1")
            c.execute("INSERT INTO acct VALUES (2, 20)")
        step("tick", now=2_000)
        assert step("stage")["staged_rows"] == 3
        checked = step("check")
        assert "PASS reclocked.primary_key_unique" in checked["primary_key"], checked
        assert step("publish")["published"]


# Over Connect: a compaction's rewrite (Spark reads the files it replaces by their paths and writes the new ones,
# delta-rs commits) and a backfill repair's refusal of a row outside its range; a worker's SourceError, which comes
# back as a gRPC error, is still recognized.
GUARDS = """
import pyarrow as pa
from pyspark.sql import functions as F
from reclock.engine import Frontier, Remap
from reclock.spark.session import get_spark
from reclock.spark.source import source_error, worker_source_error
from reclock.storage import Warehouse, spark_frame
spark = get_spark(remote=URL)
tables = Warehouse(ROOT).source("t", pa.int32(), pa.schema([("value", pa.string())]), spark=spark)
tables.create_if_absent()
remaps = [Remap()]
for t, upper in ((5, 2), (9, 3)):
    remaps.append(remaps[-1].mint(t, Frontier.of({0: upper})))
    assert tables.append_binding(remaps[-2], remaps[-1])
rows = [("a", 0, 0, 5, 1), ("b", 0, 1, 5, 1), ("c", 0, 2, 9, 1)]
for upto in (5, 9):
    batch = [dict(zip(["value", "partition", "offset", "into_time", "diff"], r)) for r in rows if upto - 4 < r[3] <= upto]
    tables.stage(spark_frame(spark, pa.Table.from_pylist(batch, schema=tables.schemas["reclocked"]),
                             tables.schemas["reclocked"]), upto)
    assert tables.publish_staged(upto)
tables.compact(7)
compacted = tables.version("reclocked")
try:
    tables.replace_reclocked(spark_frame(spark, pa.Table.from_pylist([dict(zip(["value", "partition", "offset",
        "into_time", "diff"], ("z", 0, 2, 9, 1)))], schema=tables.schemas["reclocked"]), tables.schemas["reclocked"]), 7, 7)
    outside = None
except Exception as e:
    outside = str(e)
try:
    spark.range(1).select(source_error(F.lit("orders: partition 3 offset 7 cannot be decoded"))).collect()
    failed = None
except Exception as e:
    failed = worker_source_error(e)
emit({"rows": sorted(map(list, spark.read.format("delta").load(ROOT + "/t/reclocked").select(
          "value", "into_time", "diff").collect())),
      "outside": outside, "failed": failed, "versions": [compacted, tables.version("reclocked")]})
"""


def test_a_rewrite_and_source_errors_over_spark_connect(spark_connect, tmp_path):
    code = f"URL, ROOT = {spark_connect!r}, {str(tmp_path / 'warehouse')!r}\n" + GUARDS
    result = run_python(code, {**os.environ, "PYSPARK_PYTHON": sys.executable}, timeout=300)
    assert result["rows"] == [["a", 7, 1], ["b", 7, 1], ["c", 9, 1]], result["output"][-3000:]
    assert "a row to replace lies outside 7 <= into_time <= 7: into_time 9" in result["outside"]
    assert result["versions"][0] == result["versions"][1]  # the refused repair committed nothing
    assert result["failed"] == "orders: partition 3 offset 7 cannot be decoded"


# The DAG as Airflow parses it with a Spark Connect server configured: which operator runs each Spark step.
OPERATORS = """
import os, sys
from airflow.models import DagBag
before = dict(os.environ)
bag = DagBag(dag_folder=DAGS)
assert not bag.import_errors, bag.import_errors
emit({"operators": {dag_id: {t.task_id: type(t).__name__ for t in dag.tasks} for dag_id, dag in bag.dags.items()},
      "side_effects": sorted(k for k in {*before, *os.environ} if before.get(k) != os.environ.get(k)),
      "imported": sorted({m.split(".")[0] for m in sys.modules if m.startswith(("pyspark", "great_expectations"))})})
"""

# dag.test() of the source's DAG in this one process: which tasks ran, and whether any started a JVM here.
DAG_TEST = """
import os
from airflow.models import DagBag
from pyspark import SparkContext
dag = DagBag(dag_folder=DAGS).dags["reclock_orders"]
dag_run = dag.test()
emit({"state": str(dag_run.state), "tasks": {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()},
      "local_jvm": SparkContext._active_spark_context is not None,
      "connect_mode": "SPARK_CONNECT_MODE_ENABLED" in os.environ})
"""


def test_the_dag_runs_its_spark_steps_over_spark_connect(spark_connect, kafka_broker, kafka_topic, tmp_path,
                                                         airflow_db_template):  # noqa: F811
    topic = kafka_topic(partitions=2, prefix="connect-dag")
    config = remote_config(tmp_path, kafka_broker, topic, spark_connect)
    env = prepare_home(tmp_path / "airflow", config=Path(config), db_template=airflow_db_template)
    dags = f"DAGS = {str(DAGS_FOLDER)!r}\n"

    parsed = run_python(dags + OPERATORS, env, timeout=300)
    operators = parsed["operators"]
    assert operators["reclock_orders"]["reclock"] == "_PythonDecoratedOperator", operators["reclock_orders"]
    assert operators["reclock_backfill_orders"]["replay"] == "_PythonDecoratedOperator"
    assert not any("SparkSubmit" in op for dag in operators.values() for op in dag.values())
    assert parsed["side_effects"] == [] and parsed["imported"] == []  # parsing opens no session, imports no Spark
    (tmp_path / "local").mkdir()
    local = Path(write_config(tmp_path / "local", kafka_broker, {"orders": topic}))
    without = run_python(dags + OPERATORS, airflow_env(tmp_path / "airflow", local), timeout=300)
    assert without["operators"]["reclock_orders"]["reclock"] == "ReclockSparkSubmitOperator"  # no remote: spark-submit

    produce(kafka_broker, topic, [(f"k{i}", f"v{i}", i % 2) for i in range(10)])
    result = run_python(dags + DAG_TEST, env, timeout=900)
    assert result["state"] == "success", result["output"][-4000:]
    assert set(result["tasks"]) == {"tick", "reclock", "check", "publish", "resume", "compact"}
    assert set(result["tasks"].values()) == {"success"}
    assert result["connect_mode"] and not result["local_jvm"]  # every Spark step was a Connect client
    assert reclocked_rows("orders", config) == engine_rows("orders", config)
    assert sorted(r[0] for r in reclocked_rows("orders", config)) == sorted(f"v{i}" for i in range(10))


def test_the_server_command_has_reclocks_jars_settings_and_the_sources_files_conf(tmp_path):
    """``python -m reclock.spark.session --print``: how production starts the server (docs: operations/spark.md, A long-lived Spark)."""
    import shlex
    import subprocess

    config = write_sources_config(tmp_path, ("logs", "files", {"url": str(tmp_path)}))
    doc = yaml.safe_load(Path(config).read_text())
    s3a = {"spark.hadoop.fs.s3a.endpoint": "http://s3:9000"}
    Path(config).write_text(yaml.safe_dump({**doc, "spark": {"conf": s3a}}))
    command = [sys.executable, "-m", "reclock.spark.session", "--print", "--port", "15002", "--config", config]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout
    words = shlex.split(out)
    env = dict(w.split("=", 1) for w in words[:3])
    argv = words[3:]
    conf = dict(argv[i + 1].split("=", 1) for i, w in enumerate(argv) if w == "--conf")
    assert argv[0].endswith("pyspark/bin/spark-submit") and argv[-1] == "spark-internal"
    assert argv[argv.index("--class") + 1] == "org.apache.spark.sql.connect.service.SparkConnectServer"
    # The server's master is local[2]: the jars on its driver's classpath.
    assert any("delta-spark_4.1_2.13" in jar for jar in conf["spark.driver.extraClassPath"].split(os.pathsep))
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert conf["spark.connect.grpc.binding.port"] == "15002" and conf["spark.sql.session.timeZone"] == "UTC"
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://s3:9000"  # the server's business, not a session's
    assert conf["spark.pyspark.python"] == env["PYSPARK_PYTHON"] == sys.executable
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(Path(pipeline.__file__).parent.parent)  # reclock's include/
