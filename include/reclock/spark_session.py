"""Spark sessions: local by default, any master by argument or RECLOCK_SPARK_MASTER."""
from __future__ import annotations

import os
import sys


def _builder(app_name: str):
    from pyspark.sql import SparkSession

    # Python workers must import reclock: run them on this interpreter unless told otherwise.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return (
        SparkSession.builder.appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.driver.memory", os.environ.get("RECLOCK_SPARK_DRIVER_MEMORY", "2g"))
    )


def get_spark(master: str | None = None, app_name: str = "reclock"):
    """A session on ``master`` (default ``$RECLOCK_SPARK_MASTER`` or ``local[2]``)."""
    return _builder(app_name).master(master or os.environ.get("RECLOCK_SPARK_MASTER", "local[2]")).getOrCreate()


def submitted_spark(app_name: str = "reclock"):
    """The session of a job started by spark-submit, which chose the master."""
    return _builder(app_name).getOrCreate()
