"""TRUNCATE as row diffs: a marker replaced by the retraction of every row its table held.

A Postgres TRUNCATE has no row-level diffs; the source yields one marker per table
(``op = "truncate"``, ``row`` null, ``diff`` 0) at the transaction's commit LSN and its ``seq``.
reclock knows the state, so for a marker of table ``T`` at ``(offset o, seq s)``::

    held(T) = consolidate(before[T] + batch[T] with (offset, seq) < (o, s))     # row -> multiplicity
    marker  ->  {(T, row, diff = -n) for row, n in held(T) if n > 0}           # at o, s, its IntoTime

``before`` is every record published before the window; the batch's own records count when they
come earlier (snapshot partitions before every change; earlier markers' retractions included).
AS OF the marker's IntoTime the table is then empty, earlier times are unchanged.
"""
from __future__ import annotations

MARKER = "truncate"


def expand_truncates(batch, before):
    """``batch`` (Spark, reclocked columns) with every TRUNCATE marker replaced by its retractions.

    ``batch`` is read once per marker: give a materialized one (e.g. ``localCheckpoint``).
    """
    from pyspark.sql import functions as F

    is_marker = F.col("op") == MARKER
    markers = batch.where(is_marker).orderBy("offset", "seq").collect()
    if not markers:
        return batch
    rows = batch.where(~is_marker | F.col("op").isNull())
    columns = batch.columns
    for m in markers:
        earlier = (F.col("partition") != "") | (F.col("offset") < m["offset"]) | \
            ((F.col("offset") == m["offset"]) & (F.col("seq") < m["seq"]))
        held = (before.where(F.col("table") == m["table"]).select("row", "diff")
                .unionByName(rows.where((F.col("table") == m["table"]) & earlier).select("row", "diff"))
                .groupBy("row").agg(F.sum("diff").alias("n")).where(F.col("n") > 0))
        fixed = {c: F.lit(m[c]).cast(batch.schema[c].dataType) for c in columns if c not in ("row", "diff")}
        retractions = held.select(*[fixed[c].alias(c) if c in fixed else
                                    (-F.col("n")).alias("diff") if c == "diff" else F.col(c) for c in columns])
        rows = rows.unionByName(retractions)
    return rows
