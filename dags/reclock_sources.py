"""One Airflow DAG per source in the reclock config (``$RECLOCK_CONFIG`` or ``include/sources.yaml``).

``reclock_<name>``: tick >> reclock (spark-submit spark_jobs/reclock_job.py) >> check >> publish
>> resume >> compact.  A config error is raised at import, so it shows in the DAG import errors.

The Spark task uses the connection ``reclock_spark``.  Unless the environment already defines
``AIRFLOW_CONN_RECLOCK_SPARK`` itself, this file defines it from the config's ``spark.master``
(``{"conn_type": "spark", "host": "<master>"}``: the provider takes a spark-type host with no port
as the whole master URL, so ``local[2]``, ``yarn``, ``spark://h:7077`` and ``k8s://https://h`` all work).
For ``local``/``spark://`` masters spark-submit and the job's Python are this venv's; for remote
workers set ``spark.pyspark.python`` in the config's ``spark.conf``, and for yarn/k8s have
``spark-submit`` on PATH (or SPARK_HOME set) where the task runs.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, task

from reclock.config import Config, ConfigError, SourceConfig, load_config

REPO = Path(__file__).resolve().parents[1]
SPARK_JOB = REPO / "spark_jobs" / "reclock_job.py"
SPARK_CONN_ID = "reclock_spark"
_CONN_VAR = f"AIRFLOW_CONN_{SPARK_CONN_ID.upper()}"
_MANAGED = "reclock-managed"  # marks a connection this file defined, so a new master replaces it


def define_spark_connection(master: str) -> None:
    """Point ``reclock_spark`` at ``master`` unless the deployment defined the connection itself."""
    current = os.environ.get(_CONN_VAR)
    if current is None or _MANAGED in current:
        os.environ[_CONN_VAR] = json.dumps({"conn_type": "spark", "host": master, "extra": {_MANAGED: True}})


def spark_submit_args(config: Config, source: SourceConfig) -> dict:
    """SparkSubmitOperator arguments: this venv's spark-submit and Python for local/standalone masters."""
    bin_dir = Path(sys.executable).parent  # the venv's bin, not resolved through the python symlink
    same_python = config.spark_master.startswith(("local", "spark://"))
    return {
        "application": str(SPARK_JOB),
        "application_args": ["--config", str(config.path), "--source", source.name],
        "conn_id": SPARK_CONN_ID,
        "name": f"reclock-{source.name}",
        "spark_binary": str(bin_dir / "spark-submit") if (bin_dir / "spark-submit").exists() else "spark-submit",
        # pip's spark-submit finds SPARK_HOME by running $PYSPARK_PYTHON (default: python3 on PATH).
        "env_vars": {"PYSPARK_PYTHON": sys.executable} if same_python else None,
        "conf": {**({"spark.pyspark.python": sys.executable} if same_python else {}), **config.spark_conf},
    }


def build_dag(config: Config, source: SourceConfig) -> DAG:
    name, config_path = source.name, str(config.path)
    with DAG(
        dag_id=f"reclock_{name}",
        schedule=source.schedule,
        start_date=source.start_date,
        catchup=False,
        max_active_runs=1,
        tags=["reclock"],
        doc_md=(f"### Reclock `{name}` ({source.kind})\n\n"
                f"Reclocks `{name}` onto IntoTime and publishes Delta tables `{name}_remap` and "
                f"`{name}_reclocked` under `{config.warehouse}`.\n\n"
                f"* options: `{json.dumps(source.options, sort_keys=True)}`\n"
                f"* schedule: `{source.schedule}`, IntoTime retention: {source.retention_ms} ms\n"
                f"* Spark master: `{config.spark_master}`, config: `{config_path}`\n\n"
                "tick (bind the source frontier) >> reclock (Spark stages the new records) >> check "
                "(Great Expectations) >> publish >> resume (commit offsets upstream) >> compact"),
    ) as dag:
        # reclock.pipeline is imported when a task runs, not when the DAG file is parsed.
        @task
        def tick() -> dict:
            from reclock import pipeline
            return pipeline.tick(name, config_path)

        @task
        def check() -> dict:
            from reclock import pipeline
            return pipeline.check(name, config_path)

        @task
        def publish() -> dict:
            from reclock import pipeline
            return pipeline.publish(name, config_path)

        @task
        def resume() -> dict:
            from reclock import pipeline
            return pipeline.resume(name, config_path)

        @task
        def compact() -> dict:
            from reclock import pipeline
            return pipeline.compact(name, config_path)

        stage = SparkSubmitOperator(task_id="reclock", **spark_submit_args(config, source))
        tick() >> stage >> check() >> publish() >> resume() >> compact()
    return dag


def build_all(config: Config) -> dict[str, DAG]:
    define_spark_connection(config.spark_master)
    dags = {}
    for source in config.sources.values():
        try:
            dags[f"reclock_{source.name}"] = dag = build_dag(config, source)
            dag.validate()  # Airflow would only check the schedule later, without naming the source
        except Exception as e:  # e.g. an invalid cron string: say which source and file
            raise ConfigError(f"{config.path}: source {source.name}: cannot build its DAG "
                              f"(schedule {source.schedule!r}): {e}") from e
    return dags


globals().update(build_all(load_config()))
