"""Spark's side of the tables that is no commit: a Spark DataFrame of Arrow rows."""
from __future__ import annotations

import pyarrow as pa

from ..spark.session import spark_schema


def spark_frame(spark, rows: pa.Table, schema: pa.Schema):
    """A Spark DataFrame of Arrow ``rows`` with ``schema`` (small tables: remap, TEMP)."""
    if rows.num_rows == 0:
        return spark.createDataFrame([], spark_schema(schema))
    # From Arrow directly: a pandas round trip would turn a nullable int64 column into floats.
    return spark.createDataFrame(rows.select(schema.names).cast(schema), spark_schema(schema))

