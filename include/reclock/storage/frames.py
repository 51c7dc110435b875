"""Spark's side of the tables that is no commit: a Spark DataFrame of Arrow rows, and whether Spark reads a Delta
table at a location."""
from __future__ import annotations

import pyarrow as pa

from ..spark.session import spark_schema
from .layout import spark_uri


def spark_frame(spark, rows: pa.Table, schema: pa.Schema):
    """A Spark DataFrame of Arrow ``rows`` with ``schema`` (small tables: remap, TEMP)."""
    if rows.num_rows == 0:
        return spark.createDataFrame([], spark_schema(schema))
    # From Arrow directly: a pandas round trip would turn a nullable int64 column into floats.
    return spark.createDataFrame(rows.select(schema.names).cast(schema), spark_schema(schema))


def is_delta_table(spark, uri: str) -> bool:
    """Whether Spark reads a Delta table at ``uri``."""
    try:
        spark.read.format("delta").load(spark_uri(uri)).schema
        return True
    except Exception:
        return False
