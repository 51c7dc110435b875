"""TRUNCATE and a fresh snapshot as row diffs: markers replaced by what they change of a table's rows.

A Postgres TRUNCATE has no row-level diffs, and a new epoch's snapshot (``reclock new-epoch`` after a lost
slot) replaces whatever the table held.  The source and the new epoch leave *markers* (``row`` null,
``diff`` 0) of a table ``T``; reclock knows the state, so staging replaces them:

* ``op = "truncate"`` at a change's ``(offset o, seq s)`` in the changes' partition ``""``: TRUNCATE T.
* ``op = "resync"`` at offset 0 of a snapshot partition ``P`` of ``T`` taken at LSN ``C`` (a ctid offset
  is never 0: the marker precedes ``P``'s rows): from now on ``T`` is exactly ``P``'s rows.

Records are ordered by *position*: a change ``(o, s)``; a snapshot partition's rows ``(C, -1)`` (its
snapshot sees the commits before ``C``, the slot decodes those from ``C``); a resync marker ``(C, -2)``.
With ``before`` every record published before the window and ``earlier`` the batch's records (earlier
markers' output included) at positions below the marker's::

    held(T)     = consolidate(before[T] + earlier[T])                          # row -> n > 0
    truncate    ->  {(T, row, -n) for row, n in held(T)}
    resync      ->  {(T, row, -(n - min(n, k))) for row, n in held(T) if n > k}          k = P's copies of row
                    and of P's copies of each row (by offset) only those beyond the first n are kept

AS OF the marker's IntoTime the table is then empty (truncate) or exactly ``P`` (resync), with only the
difference published (a row the table held before and still holds is neither retracted nor inserted);
earlier times are unchanged.  The output rows carry the marker's coordinates and ``op``.
"""
from __future__ import annotations

from functools import reduce
from typing import Callable

TRUNCATE, RESYNC = "truncate", "resync"
MARKERS = (TRUNCATE, RESYNC)


def expand_truncates(batch, before, snapshot_lsn: Callable[[str], int] | None = None):
    """``batch`` (Spark, reclocked columns) with every marker replaced by its diffs (module doc).

    ``snapshot_lsn`` gives a snapshot partition's LSN ``C`` (needed only when the batch has resync markers:
    without it every snapshot partition comes before every change).  Markers of different tables are independent;
    a table's own markers apply in order, its rows checkpointed between them.  ``batch`` is read once per table
    with markers: give a materialized one (e.g. ``localCheckpoint``).
    """
    from pyspark.sql import functions as F

    is_marker = F.col("op").isin(*MARKERS)
    markers = batch.where(is_marker).collect()
    if not markers:
        return batch
    snapshots = {r["partition"] for r in batch.where(F.col("partition") != "").select("partition").distinct().collect()}
    at = {p: snapshot_lsn(p) for p in snapshots} if snapshot_lsn else {p: -1 for p in snapshots}
    lsn = F.col("offset")  # a record's position (lsn, seq): module doc
    for partition, c in at.items():
        lsn = F.when(F.col("partition") == partition, F.lit(c)).otherwise(lsn)
    seq = F.when(F.col("partition") == "", F.col("seq")).otherwise(F.lit(-1))

    def position(m) -> tuple[int, int]:
        return (at[m["partition"]], -2) if m["partition"] != "" else (m["offset"], m["seq"])

    rows = batch.where(~is_marker | F.col("op").isNull())
    tables = sorted({m["table"] for m in markers})
    parts = [rows.where(~F.col("table").isin(*tables))]  # markers of one table leave the others as they are
    for table in tables:
        ours = sorted((m for m in markers if m["table"] == table), key=position)
        table_rows = rows.where(F.col("table") == table)
        for i, m in enumerate(ours):
            table_rows = _expand(table_rows, before.where(F.col("table") == table), m, position(m), lsn, seq)
            if i + 1 < len(ours):  # each marker reads what the earlier ones made: keep the plan flat
                table_rows = table_rows.localCheckpoint(eager=True)
        parts.append(table_rows)
    return reduce(lambda a, b: a.unionByName(b), parts)


def _expand(rows, before, m, at: tuple[int, int], lsn, seq):
    """``rows`` (one table's) with marker ``m`` at position ``at`` replaced by its diffs (module doc)."""
    from pyspark.sql import functions as F

    c, s = at
    earlier = (lsn < c) | ((lsn == c) & (seq < s))
    held = (before.select("row", "diff").unionByName(rows.where(earlier).select("row", "diff"))
            .groupBy("row").agg(F.sum("diff").alias("n")).where(F.col("n") > 0))
    if m["op"] == RESYNC:
        rows, held = _resync(rows, held, m["partition"])
    columns = rows.columns
    fixed = {c: F.lit(m[c]).cast(rows.schema[c].dataType) for c in columns if c not in ("row", "diff")}
    retractions = held.select(*[fixed[c].alias(c) if c in fixed else
                                (-F.col("n")).alias("diff") if c == "diff" else F.col(c) for c in columns])
    return rows.unionByName(retractions)


def _resync(rows, held, partition: str):
    """``(rows with the snapshot partition's copies already held dropped, held less what the snapshot holds)``."""
    from pyspark.sql import Window, functions as F

    snapshot = rows.where(F.col("partition") == partition)
    copies = snapshot.groupBy("row").agg(F.count("*").alias("k"))
    kept = (snapshot.withColumn("_copy", F.row_number().over(Window.partitionBy("row").orderBy("offset")))
            .join(held.withColumnRenamed("n", "_held"), "row", "left")
            .where(F.col("_copy") > F.coalesce(F.col("_held"), F.lit(0))).drop("_copy", "_held"))
    gone = (held.join(copies, "row", "left").select("row", (F.col("n") - F.least(F.col("n"), F.coalesce(
        F.col("k"), F.lit(0)))).alias("n")).where(F.col("n") > 0))
    return rows.where(F.col("partition") != partition).unionByName(kept), gone


def resynced_tables(batch) -> list[str]:
    """The tables a resync marker of ``batch`` starts over from a snapshot (their earlier columns no longer
    matter: every row stored with them is retracted or found again in the snapshot)."""
    from pyspark.sql import functions as F

    return sorted(r["table"] for r in batch.where(F.col("op") == RESYNC).select("table").distinct().collect())
