"""Airflow's dag.test() runs the real pipeline: broker, Spark, Great Expectations, Delta.

Its Spark steps are clients of the session's long-lived Spark Connect server (``spark_connect``), as the demo's
and compose's are; a DAG whose reclock task is a spark-submit runs in tests/test_connections.py."""
from __future__ import annotations

import uuid

import pytest

from airflow_env import prepare_home, run_dag_test
from airflow_env import airflow_db_template  # noqa: F401  (a session fixture)
from reclock import runtime
from devtools.kafka_broker import create_topic, produce
from conftest import reclocked_rows, write_config

pytestmark = pytest.mark.slow

# Insert a task between the Spark job and the checks that corrupts what Spark staged,
# as a buggy job would: one record moved to a later IntoTime than its first covering binding.
CORRUPT = """
from airflow.sdk import task
@task(task_id="corrupt")
def corrupt():
    import glob, pyarrow.compute as pc, pyarrow.parquet as pq
    pending = max(glob.glob(STAGED + "/reclocked/staged/upto=*"), key=lambda d: int(d.rsplit("=", 1)[1]))
    attempt = sorted(glob.glob(pending + "/*/"))[-1]  # the newest attempt: what check reads
    for path in sorted(glob.glob(attempt + "*.parquet")):
        table = pq.read_table(path)
        if table.num_rows:
            times = pc.add(table["into_time"], 1_000_000)
            pq.write_table(table.set_column(table.schema.get_field_index("into_time"), "into_time", times), path)
            return path
    raise RuntimeError("nothing staged to corrupt")
with dag:
    c = corrupt()
    dag.get_task("reclock") >> c >> dag.get_task("check")
"""


def test_scheduled_dag_reclocks_and_a_failed_check_publishes_nothing(tmp_path, kafka_broker, spark_connect,
                                                                     airflow_db_template):  # noqa: F811
    topic = f"airflow-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker, topic, partitions=2)
    config = write_config(tmp_path, kafka_broker, {"events": topic}, spark_remote=spark_connect)
    env = prepare_home(tmp_path / "airflow", config=config, db_template=airflow_db_template)

    produce(kafka_broker, topic, [(f"k{i}", f"v{i}", i % 2) for i in range(10)])
    first = run_dag_test("reclock_events", env)
    assert first["state"] == "success", first["output"][-4000:]
    assert set(first["tasks"].values()) == {"success"}
    rows = reclocked_rows("events", config)
    assert sorted(r[0] for r in rows) == sorted(f"v{i}" for i in range(10))
    with runtime.open_source("events", config) as ctx:
        upper_after_first = ctx.tables.reclocked_upper()
        staged_root = ctx.tables.uri

    produce(kafka_broker, topic, [("k", "bad-batch", 0)])
    failed = run_dag_test("reclock_events", env, adjust=f"STAGED = {staged_root!r}\n" + CORRUPT)
    assert failed["state"] == "failed"
    assert failed["tasks"]["check"] == "failed"
    assert failed["tasks"]["publish"] in ("upstream_failed", "None")
    with runtime.open_source("events", config) as ctx:
        assert ctx.tables.reclocked_upper() == upper_after_first  # nothing new published
    assert reclocked_rows("events", config) == rows

    healed = run_dag_test("reclock_events", env)  # the next run restages from remap and publishes
    assert healed["state"] == "success", healed["output"][-4000:]
    values = [r[0] for r in reclocked_rows("events", config)]
    assert sorted(values) == sorted([f"v{i}" for i in range(10)] + ["bad-batch"])
