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
S3_JARS = JARS.parent / "spark-s3"
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


class SparkSetupError(RuntimeError):
    """Spark cannot get the jars reclock needs."""


def jars_dir() -> Path:
    return Path(os.environ.get("RECLOCK_SPARK_JARS", JARS))


def spark_jars(s3: bool = False) -> list[str]:
    """The jars a reclock session loads: delta-spark and spark-sql-kafka with their dependencies, and with
    ``s3`` (or ``RECLOCK_SPARK_S3=1``) hadoop-aws for ``s3a://`` (``RECLOCK_SPARK_S3_JARS`` names its folder)."""
    folder = jars_dir()
    jars = sorted(str(p) for p in folder.glob("*.jar"))
    if not any("delta-spark" in j for j in jars) or not any("spark-sql-kafka" in j for j in jars):
        raise SparkSetupError(f"no delta-spark / spark-sql-kafka jars in {folder}: run `make setup` "
                              "(Maven copies them from jvm/spark/pom.xml) or set RECLOCK_SPARK_JARS")
    if s3 or os.environ.get("RECLOCK_SPARK_S3") == "1":
        s3_folder = Path(os.environ.get("RECLOCK_SPARK_S3_JARS", S3_JARS))
        s3_jars = sorted(str(p) for p in s3_folder.glob("*.jar"))
        if not any("hadoop-aws" in j for j in s3_jars):
            raise SparkSetupError(f"no hadoop-aws jars in {s3_folder}: run `make setup` (jvm/spark-s3/pom.xml)")
        jars += s3_jars
    return jars


def session_conf(s3: bool = False) -> dict[str, str]:
    """What every reclock session is configured with (also what spark-submit gets as --conf)."""
    return {
        "spark.jars": ",".join(spark_jars(s3)),
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


def _builder(app_name: str, s3: bool = False, conf: dict | None = None):
    from pyspark.sql import SparkSession

    # Python workers must import reclock: run them on this interpreter unless told otherwise.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    for key, value in {**session_conf(s3), **(conf or {})}.items():
        builder = builder.config(key, value)
    return builder


def get_spark(master: str | None = None, app_name: str = "reclock", s3: bool = False, conf: dict | None = None):
    """A session on ``master`` (default ``$RECLOCK_SPARK_MASTER`` or ``local[2]``); ``s3``: with s3a:// jars;
    ``conf``: the sources file's ``spark.conf`` (e.g. the s3a endpoint), over reclock's own settings.

    Like every ``getOrCreate``, an existing session of this process is returned (runtime settings applied).
    """
    return (_builder(app_name, s3, conf).master(master or os.environ.get("RECLOCK_SPARK_MASTER", "local[2]"))
            .getOrCreate())


def submitted_spark(app_name: str = "reclock", s3: bool = False):
    """The session of a job started by spark-submit, which chose the master."""
    return _builder(app_name, s3).getOrCreate()


def spark_schema(arrow_schema):
    """The Spark schema of an Arrow schema (``pyspark.sql.pandas.types.from_arrow_schema``)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(arrow_schema)
