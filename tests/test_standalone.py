"""A Kafka tick on Spark's own cluster manager: a standalone master and two workers on loopback
(devtools.spark_cluster), the driver in client mode.

The shared ``spark`` session (local[2]) cannot share this process with a second SparkContext, so the
tick on the cluster runs in a subprocess: the session a DAG task gets for a ``spark://`` master
(``get_spark``, the jars of ``spark.jars``, Python workers on this interpreter), then every step.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import yaml
from airflow_env import run_python
from conftest import engine_rows, reclocked_rows, write_config

from devtools.kafka_broker import produce
from devtools.spark_cluster import LocalSparkCluster
from reclock import pipeline

pytestmark = pytest.mark.slow

WORKERS = 2

# In the subprocess: a session on the config's master, every step at IntoTime NOW, and a read of every
# bound range through the Python data source (Python workers on the executors import reclock).
TICK_ON_CLUSTER = """
import time
from reclock import pipeline, runtime
from reclock.config import load_config
from reclock.spark.session import get_spark
from reclock.spark.source import read_ranges_python

spark = get_spark(load_config(CONFIG).spark_master, "reclock-" + NAME)
status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus  # block managers: the driver's and executors'
deadline = time.monotonic() + 90
while status().size() < 1 + WORKERS and time.monotonic() < deadline:
    time.sleep(0.2)
executors = status().size() - 1
steps = pipeline.run_once(NAME, CONFIG, spark, now=NOW)
with runtime.open_source(NAME, CONFIG) as ctx:
    python_rows = read_ranges_python(spark, ctx.spec, ctx.tables.read_remap().ranges()).collect()
emit({"app_id": spark.sparkContext.applicationId, "master": spark.sparkContext.master, "executors": executors,
      "steps": steps, "python_rows": [[r.value, r.partition, r.offset, r.into_time, r.diff] for r in python_rows]})
spark.stop()
"""


@pytest.fixture(scope="module")
def cluster():
    with LocalSparkCluster(workers=WORKERS, cores=1, memory="1g") as running:
        root = str(running.root)
        yield running
    # Nothing left: the master, the workers, their executors and the executors' Python workers all work in root
    # (the Python workers, in groups of their own, exit once their executor is gone).
    deadline = time.monotonic() + 10
    while working_in(root) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not working_in(root)


def working_in(root: str) -> list[str]:
    """The processes whose working directory is under ``root`` (Linux /proc)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd").startswith(root):
                found.append(Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")[:200])
        except OSError:  # gone, or not ours to read
            pass
    return found


def on_cluster(cluster, config: str, name: str, now: int) -> dict:
    code = f"CONFIG, NAME, NOW, WORKERS = {config!r}, {name!r}, {now}, {WORKERS}\n" + TICK_ON_CLUSTER
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": cluster.host}  # driver on loopback
    return run_python(code, env, timeout=300)


def test_kafka_tick_on_a_standalone_cluster(cluster, kafka_broker, kafka_topic, spark, tmp_path):
    topic = kafka_topic(partitions=3, prefix="standalone")
    config = write_config(tmp_path, kafka_broker, {"orders": topic})
    doc = yaml.safe_load(Path(config).read_text())
    Path(config).write_text(yaml.safe_dump({**doc, "spark": {"master": cluster.url}}))
    produce(kafka_broker, topic, [(f"u{i}", f"a{i}", i % 3) for i in range(9)])
    pipeline.tick("orders", config, now=1_000, spark=spark)  # on local[2]: the cluster stages two bindings
    produce(kafka_broker, topic, [(f"u{i}", f"b{i}", i % 3) for i in range(30)])

    result = on_cluster(cluster, config, "orders", now=2_000)
    assert result["master"] == cluster.url
    assert result["executors"] == WORKERS, result["output"][-3000:]
    assert result["steps"]["tick"]["frontier"] == {"0": 13, "1": 13, "2": 13}
    assert result["steps"]["stage"]["staged_rows"] == 39 and result["steps"]["publish"]["published"]
    state = cluster.state()
    [app] = [a for a in state["activeapps"] + state["completedapps"] if a["id"] == result["app_id"]]
    assert app["cores"] == WORKERS  # one core of each worker

    expected = engine_rows("orders", config)  # every record, read with the Kafka client (no Spark), under remap
    assert [r[3] for r in expected].count(2_000) == 30 and len(expected) == 39
    assert reclocked_rows("orders", config) == expected
    assert sorted(map(tuple, result["python_rows"])) == expected
