"""Spark sessions with Delta Lake and Spark's Kafka source: local by default, any master by argument
or ``RECLOCK_SPARK_MASTER``.

The JVM jars Spark lacks (delta-spark, spark-sql-kafka and their dependencies) are fetched by
``make setup`` from ``jvm/spark/pom.xml`` into ``var/jars/spark``; every session loads them with
``spark.jars`` (``RECLOCK_SPARK_JARS`` names another folder, e.g. in a container image).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

JARS = Path(__file__).resolve().parents[2] / "var" / "jars" / "spark"
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


class SparkSetupError(RuntimeError):
    """Spark cannot get the jars reclock needs."""


def jars_dir() -> Path:
    return Path(os.environ.get("RECLOCK_SPARK_JARS", JARS))


def spark_jars() -> list[str]:
    """The jars every reclock session loads: delta-spark and spark-sql-kafka with their dependencies."""
    folder = jars_dir()
    jars = sorted(str(p) for p in folder.glob("*.jar"))
    if not any("delta-spark" in j for j in jars) or not any("spark-sql-kafka" in j for j in jars):
        raise SparkSetupError(f"no delta-spark / spark-sql-kafka jars in {folder}: run `make setup` "
                              "(Maven copies them from jvm/spark/pom.xml) or set RECLOCK_SPARK_JARS")
    return jars


def session_conf() -> dict[str, str]:
    """What every reclock session is configured with (also what spark-submit gets as --conf)."""
    return {
        "spark.jars": ",".join(spark_jars()),
        **DELTA_CONF,
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.databricks.delta.snapshotPartitions": "2",
        # Delta VACUUM lists files in this many tasks (Spark's default, 10000, costs minutes on small tables).
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": "4",
        "spark.driver.memory": os.environ.get("RECLOCK_SPARK_DRIVER_MEMORY", "2g"),
    }


def _builder(app_name: str):
    from pyspark.sql import SparkSession

    # Python workers must import reclock: run them on this interpreter unless told otherwise.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    for key, value in session_conf().items():
        builder = builder.config(key, value)
    return builder


def get_spark(master: str | None = None, app_name: str = "reclock"):
    """A session on ``master`` (default ``$RECLOCK_SPARK_MASTER`` or ``local[2]``)."""
    return _builder(app_name).master(master or os.environ.get("RECLOCK_SPARK_MASTER", "local[2]")).getOrCreate()


def submitted_spark(app_name: str = "reclock"):
    """The session of a job started by spark-submit, which chose the master."""
    return _builder(app_name).getOrCreate()
