"""TRUNCATE and resync markers as row diffs (reclock.truncate): tables of a published history, a batch with
markers, and what each marker becomes.  Real Spark (the session's)."""
from __future__ import annotations

from collections import Counter

from reclock.truncate import expand_truncates, resynced_tables

SCHEMA = "table string, op string, row string, seq int, partition string, offset long, into_time long, diff long"
SNAPSHOTS = {"t@B": 50, "t@C": 100}  # snapshot partition -> the LSN it was taken at


def snap(partition, line, row):  # a snapshot row at ctid (1, line)
    return (partition, (1 << 16) | line, 0, "snapshot", row, 1)


def resync(partition, *table):
    return (partition, 0, 0, "resync", None, 0, *table)


def change(offset, seq, op, row, diff=1):
    return ("", offset, seq, op, row, diff)


# (published rows before the window: (row, diff) of the case's table, or (row, diff, another table)),
# (the batch: (partition, offset, seq, op, row, diff[, table])), what the batch becomes: (partition, op, row, diff)
CASES = {
    "truncate": ([("a", 1), ("b", 2), ("z", 1, "u")], [change(200, 0, "truncate", None, 0)],
                 [("", "truncate", "a", -1), ("", "truncate", "b", -2)]),
    "truncate after a change, then a row": (
        [("a", 1)], [change(200, 0, "insert", "c"), change(200, 1, "truncate", None, 0), change(300, 0, "insert", "d")],
        [("", "insert", "c", 1), ("", "truncate", "a", -1), ("", "truncate", "c", -1), ("", "insert", "d", 1)]),
    "resync publishes only the difference": (
        [("a", 1), ("b", 1), ("z", 1, "u")], [resync("t@C"), snap("t@C", 1, "a"), snap("t@C", 2, "c")],
        [("t@C", "resync", "b", -1), ("t@C", "snapshot", "c", 1)]),
    "resync keeps the copies beyond those held": (
        [("a", 2)], [resync("t@C"), snap("t@C", 1, "a"), snap("t@C", 2, "a"), snap("t@C", 3, "a")],
        [("t@C", "snapshot", "a", 1)]),
    "resync retracts the copies gone": (
        [("a", 3), ("b", 1), ("b", -1)], [resync("t@C"), snap("t@C", 1, "a"), snap("t@C", 2, "b")],
        [("t@C", "resync", "a", -2), ("t@C", "snapshot", "b", 1)]),
    "resync of a table left empty": ([("a", 1)], [resync("t@C")], [("t@C", "resync", "a", -1)]),
    "changes after a resync see its rows": (
        [("a", 1)], [resync("t@C"), snap("t@C", 1, "a2"), change(150, 0, "insert", "e"),
                     change(160, 0, "truncate", None, 0)],
        [("t@C", "resync", "a", -1), ("t@C", "snapshot", "a2", 1), ("", "insert", "e", 1),
         ("", "truncate", "a2", -1), ("", "truncate", "e", -1)]),
    "a resync after an unpublished snapshot retracts it": (
        [], [snap("t@B", 1, "x"), snap("t@B", 2, "y"), resync("t@C"), snap("t@C", 1, "y")],
        [("t@B", "snapshot", "x", 1), ("t@B", "snapshot", "y", 1), ("t@C", "resync", "x", -1)]),
    "two resyncs in one window": (
        [("a", 1)], [resync("t@B"), snap("t@B", 1, "b"), resync("t@C"), snap("t@C", 1, "c")],
        [("t@B", "resync", "a", -1), ("t@B", "snapshot", "b", 1), ("t@C", "resync", "b", -1),
         ("t@C", "snapshot", "c", 1)]),
}


def frame(spark, records, table="t"):
    """Records of ``table`` (or the table a record names) as reclocked rows; partitions ``t@X`` renamed ``table@X``."""
    return spark.createDataFrame(frame_rows(records, table), SCHEMA)


def frame_rows(records, table="t") -> list[tuple]:
    """The rows of :func:`frame`."""
    return [(r[6] if len(r) > 6 else table, r[3], r[4], r[2], r[0].replace("t@", f"{table}@"), r[1], 9, r[5])
            for r in records]


def test_markers_become_what_they_change(spark):
    """Every case at once (one Spark job), each case its own table."""
    tables = {case: f"t{i}" for i, case in enumerate(CASES)}
    published, batch = [], []  # one frame each (a union of a frame per case plans for a minute)
    for case, (before, records, _) in CASES.items():
        published += frame_rows([("", 1, 0, "insert", r[0], r[1], *r[2:]) for r in before], tables[case])
        batch += frame_rows(records, tables[case])
    published, batch = spark.createDataFrame(published, SCHEMA), spark.createDataFrame(batch, SCHEMA)
    out = expand_truncates(batch.localCheckpoint(eager=True), published,
                           lambda p: SNAPSHOTS[p.replace(p.split("@")[0], "t")]).collect()
    got = {case: Counter((r["partition"].replace(f"{t}@", "t@"), r["op"], r["row"], r["diff"])
                         for r in out if r["table"] == t) for case, t in tables.items()}
    assert got == {case: Counter(expected) for case, (_, _, expected) in CASES.items()}
    assert not [r for r in out if r["table"] == "u"]  # another table is never touched


def test_resynced_tables(spark):
    batch = frame(spark, [resync("t@C"), resync("u@C", "u"), change(1, 0, "truncate", None, 0)])
    assert resynced_tables(batch) == ["t", "u"]
