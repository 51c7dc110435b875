"""One way to get a Spark session: local by default, any master by argument or RECLOCK_SPARK_MASTER."""
from __future__ import annotations

import os


def get_spark(master: str | None = None, app_name: str = "reclock"):
    from pyspark.sql import SparkSession

    master = master or os.environ.get("RECLOCK_SPARK_MASTER", "local[2]")
    return (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", os.environ.get("RECLOCK_SPARK_DRIVER_MEMORY", "2g"))
        .getOrCreate()
    )
