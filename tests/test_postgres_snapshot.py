"""A Postgres source on tables that already hold rows: the initial snapshot at the slot's consistent point.

The law (module doc of :mod:`reclock.sources.postgres`): the snapshot exported with the slot at its
consistent point ``C`` plus the changes the slot decodes from ``C`` is exactly the table's history.
Real Postgres (the session's private cluster), real Spark and Delta tables.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter

import pytest

psycopg = pytest.importorskip("psycopg")

from conftest import fresh_database, run_cli, write_sources_config  # noqa: E402
from reclock import epochs, pipeline, runtime  # noqa: E402
from reclock.checks import ChecksFailed  # noqa: E402
from reclock.query import register_as_of  # noqa: E402
from reclock.sources.base import SourceError  # noqa: E402
from reclock.sources.postgres import PostgresSource, snapshot_partition  # noqa: E402

ROWS = int(os.environ.get("RECLOCK_SNAPSHOT_ROWS", "100000"))
TABLE = ("CREATE TABLE acct (id int PRIMARY KEY, bal numeric, owner text, ok bool, doc jsonb, tags text[], "
         "at timestamptz, note text)")


def fill(rows: int) -> str:
    return (f"INSERT INTO acct SELECT i, i * 1.25, 'owner ' || i, i % 3 = 0, jsonb_build_object('i', i, 'z', 'x'), "
            f"ARRAY['a' || i, NULL], '2026-01-01 00:00:00+00'::timestamptz + i * interval '1 minute', "
            f"CASE WHEN i % 7 = 0 THEN NULL ELSE 'n' END FROM generate_series(1, {rows}) i")


def table_now(dsn) -> Counter:
    """``SELECT *`` of acct, each row as the AS OF view's row decodes (numeric and times as Postgres prints them
    in UTC, arrays as lists)."""
    with psycopg.connect(dsn) as c:
        c.execute("SET TimeZone = 'UTC'")
        rows = c.execute("SELECT id, bal::text, owner, ok, doc::text, tags, at::text, note FROM acct").fetchall()
    return Counter((i, bal, owner, ok, canonical(None if doc is None else json.loads(doc)),
                    None if tags is None else tuple(tags), at, note) for i, bal, owner, ok, doc, tags, at, note in rows)


def canonical(doc) -> str:
    return json.dumps(doc, sort_keys=True)


def as_of(spark, config, t) -> Counter:
    register_as_of(spark, t, ["acct"], config)
    out = Counter()
    rows = spark.table("acct").where("table = 'public.acct'").select("row").toArrow()["row"].to_pylist()  # not Rows
    for row in rows:
        v = json.loads(row)  # a NULL column is a missing key
        tags = v.get("tags")
        out[(v["id"], v.get("bal"), v.get("owner"), v.get("ok"), canonical(v.get("doc")),
             None if tags is None else tuple(tags), v.get("at"), v.get("note"))] += 1
    return out


class Writer(threading.Thread):
    """Small transactions on acct until stopped: updates and deletes of existing rows, inserts of new ones.
    With ``slot``, it also stops ``after`` transactions once that slot exists: writes both before the slot's
    consistent point (in the snapshot) and after it (decoded changes), without thousands more while a slow
    machine lands the snapshot."""

    def __init__(self, dsn, slot: str | None = None, after: int = 0):
        super().__init__(daemon=True)
        self.dsn, self.stop, self.done = dsn, threading.Event(), 0
        self.slot, self.after, self.after_slot = slot, after, 0

    def run(self):
        with psycopg.connect(self.dsn, autocommit=True) as c:
            i = 0
            while not self.stop.is_set() and (self.slot is None or self.after_slot < self.after):
                i += 1
                with c.transaction():
                    c.execute("UPDATE acct SET bal = bal + 1, note = 'w' || %s WHERE id = %s", (i, 1 + (i * 7919) % ROWS))
                    c.execute("DELETE FROM acct WHERE id = %s", (1 + (i * 104729) % ROWS,))
                    c.execute("INSERT INTO acct (id, bal, owner) VALUES (%s, %s, 'new')", (ROWS + i, i))
                self.done += 1
                if self.after_slot or (self.slot and c.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s",
                                                               (self.slot,)).fetchone()):
                    self.after_slot += 1
                time.sleep(0.005)


@pytest.fixture
def acct(pg_cluster, tmp_path):
    with fresh_database(pg_cluster, TABLE, fill(ROWS)) as dsn:
        yield dsn, write_sources_config(tmp_path, ("acct", "postgres", {"dsn": dsn, "slot": "s_acct", "tables": ["acct"]}),
                                        retention_ms=10**9)


def test_snapshot_and_changes_are_the_tables_history(acct):
    """Snapshot rows read under the exported snapshot + changes from the consistent point = the table, with
    writes committing while the snapshot is open (no Spark: the source alone)."""
    dsn, _ = acct
    src = PostgresSource(dsn, "s_law", tables=["acct"])
    writer = Writer(dsn)
    try:
        with src.export_snapshot() as snapshot:
            writer.start()
            reader = PostgresSource(dsn, "s_law", tables=["acct"], exported=snapshot.spec)
            (partition, upper), = snapshot.uppers.items()
            assert partition == snapshot_partition("public.acct", snapshot.consistent_lsn)
            half = (upper >> 17) << 16  # two ctid ranges, split on a block boundary
            rows = list(reader.read(partition, 0, half)) + list(reader.read(partition, half, upper))
            reader.close()
        writer.stop.set()
        writer.join()
        assert writer.done > 0
        assert len(rows) == ROWS and {d for _, _, d in rows} == {1}  # the table as it was at C, each row once
        assert len({o for _, o, _ in rows}) == ROWS
        assert src.committed()[""] == snapshot.consistent_lsn
        changes = list(src.read("", snapshot.consistent_lsn, src.upper()[""]))
        total = Counter()
        for data, _, diff in rows + changes:
            total[data["row"]] += diff
        history = Counter({row: n for row, n in total.items() if n})
        assert set(history.values()) == {1}
        with psycopg.connect(dsn) as c:
            ids = sorted(i for (i,) in c.execute("SELECT id FROM acct").fetchall())
        assert sorted(json.loads(row)["id"] for row in history) == ids
    finally:
        writer.stop.set()
        src.close()


def test_existing_rows_with_writes_during_the_snapshot(spark, acct):
    dsn, config = acct
    writer = Writer(dsn, slot="s_acct", after=500)
    writer.start()
    try:
        started = time.monotonic()
        pipeline.run_once("acct", config, spark, now=1_000)  # the first tick lands the snapshot
        took = time.monotonic() - started
    finally:
        writer.stop.set()
        writer.join()
    assert writer.done > writer.after_slot > 0, "no write committed both before and after the slot was created"
    first = as_of(spark, config, 1_000)
    assert len(first) == sum(first.values()) and len({k[0] for k in first}) == len(first)  # one row per key
    assert len(first) >= ROWS - writer.done
    pipeline.run_once("acct", config, spark, now=2_000)
    assert as_of(spark, config, 2_000) == table_now(dsn)
    # the case: an update and a delete of rows the table held before the source started
    with psycopg.connect(dsn, autocommit=True) as c:
        a, b = (i for (i,) in c.execute("SELECT id FROM acct WHERE id <= %s ORDER BY id LIMIT 2", (ROWS,)))
        c.execute("UPDATE acct SET bal = 50 WHERE id = %s", (a,))
        c.execute("DELETE FROM acct WHERE id = %s", (b,))
    pipeline.run_once("acct", config, spark, now=3_000)
    now = table_now(dsn)
    assert (a, "50") in {k[:2] for k in now} and b not in {k[0] for k in now}
    assert as_of(spark, config, 3_000) == now
    assert as_of(spark, config, 1_000) == first  # earlier times unchanged
    print(f"\n{ROWS} rows: first run_once (snapshot landed, staged, checked, published) {took:.1f} s, "
          f"{writer.done} concurrent transactions")


def test_kill_during_the_snapshot_copy(spark, acct):
    dsn, config = acct
    proc = run_cli(config, "tick", "acct")
    try:
        with psycopg.connect(dsn, autocommit=True) as c:  # the slot exists: the snapshot is being copied
            deadline = time.monotonic() + 240
            while not c.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = 's_acct'").fetchone():
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline
                time.sleep(0.05)
            first_slot = c.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots").fetchone()
            c.execute("UPDATE acct SET bal = -1 WHERE id = 4")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    with runtime.open_source("acct", config, connect=False) as ctx:
        assert not ctx.tables.landed().partitions, "killed too late: the snapshot had landed"
        assert ctx.tables.remap_upper() == 0
    pipeline.run_once("acct", config, spark, now=1_000)  # drops the orphan slot, takes the snapshot again
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots").fetchone() != first_slot
        c.execute("DELETE FROM acct WHERE id = 5")
        c.commit()
    pipeline.run_once("acct", config, spark, now=2_000)
    assert as_of(spark, config, 2_000) == table_now(dsn)


def test_checks_refuse_retracting_rows_the_history_lacks(spark, pg_cluster, tmp_path):
    """Without the snapshot (``snapshot: false``), changes to rows from before the slot retract rows the
    history never held: the check fails naming the table, the row and the commit LSN; nothing is published."""
    with fresh_database(pg_cluster, TABLE, fill(5)) as dsn:
        config = write_sources_config(tmp_path, ("acct", "postgres", {"dsn": dsn, "slot": "s_old", "tables": ["acct"],
                                                                      "snapshot": False}), retention_ms=10**9)
        pipeline.run_once("acct", config, spark, now=1_000)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("UPDATE acct SET bal = 50 WHERE id = 1")
            c.execute("DELETE FROM acct WHERE id = 2")
        pipeline.tick("acct", config, now=2_000, spark=spark)
        pipeline.stage("acct", config, spark)
        with pytest.raises(ChecksFailed) as failed:
            pipeline.check("acct", config, spark)
        message = str(failed.value)
        assert "FAIL reclocked.consolidates" in message and "public.acct" in message, message
        assert '"id":1' in message and '"id":2' in message and "commit LSN" in message, message
        with pytest.raises(ChecksFailed, match="not passed its checks"):
            pipeline.publish("acct", config, spark)
        with runtime.open_source("acct", config, connect=False) as ctx:
            assert ctx.tables.reclocked_upper() == 1_001


def test_truncate_retracts_what_the_table_held(spark, pg_cluster, tmp_path):
    with fresh_database(pg_cluster, TABLE, fill(50)) as dsn:
        config = write_sources_config(tmp_path, ("acct", "postgres", {"dsn": dsn, "slot": "s_tr", "tables": ["acct"]}),
                                      retention_ms=10**9)
        pipeline.run_once("acct", config, spark, now=1_000)
        before = table_now(dsn)
        with psycopg.connect(dsn) as c:  # one transaction: a change, the TRUNCATE, a row after it
            c.execute("UPDATE acct SET bal = 0 WHERE id = 1")
            c.execute("TRUNCATE acct")
            c.execute("INSERT INTO acct (id, bal, owner) VALUES (7, 7, 'after')")
        pipeline.run_once("acct", config, spark, now=2_000)
        assert as_of(spark, config, 2_000) == table_now(dsn) and len(table_now(dsn)) == 1
        with psycopg.connect(dsn) as c:  # and alone, twice in a window
            c.execute("TRUNCATE acct")
        with psycopg.connect(dsn) as c:
            c.execute("INSERT INTO acct (id) VALUES (8)")
        with psycopg.connect(dsn) as c:
            c.execute("TRUNCATE acct")
        pipeline.run_once("acct", config, spark, now=3_000)
        assert as_of(spark, config, 3_000) == Counter() == table_now(dsn)
        assert as_of(spark, config, 1_000) == before and len(before) == 50
        with runtime.open_source("acct", config, connect=False) as ctx:
            ops = Counter(r["op"] for r in ctx.tables.read_reclocked_arrow().to_pylist())
        assert ops["truncate"] == 50 + 1 + 1  # the retractions (the markers are gone)


def test_lost_slot_recovers_from_a_fresh_snapshot(spark, pg_cluster, tmp_path, monkeypatch):
    """The slot is dropped with changes bound but not published and more made after it; `new-epoch` takes a
    fresh snapshot and the next IntoTime publishes the difference: AS OF earlier times unchanged, later ones
    equal to the table, and only what changed is published."""
    with fresh_database(pg_cluster, TABLE, fill(200), "CREATE TABLE side (k int PRIMARY KEY)",
                        "INSERT INTO side VALUES (1), (2)") as dsn:
        config = write_sources_config(tmp_path, ("acct", "postgres", {"dsn": dsn, "slot": "s_lost",
                                                                      "tables": ["acct", "side"]}), retention_ms=10**9)
        pipeline.run_once("acct", config, spark, now=1_000)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("UPDATE acct SET bal = 1 WHERE id = 1")
        pipeline.run_once("acct", config, spark, now=2_000)
        published = {t: as_of(spark, config, t) for t in (1_000, 2_000)}
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("UPDATE acct SET bal = 2 WHERE id = 2")  # bound at 3000, never published
            c.execute("INSERT INTO acct (id, owner) VALUES (1000, 'dup'), (1001, 'dup')")
        pipeline.tick("acct", config, now=3_000, spark=spark)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("SELECT pg_drop_replication_slot('s_lost')")
            c.execute("UPDATE acct SET bal = 3, note = NULL WHERE id IN (3, 4)")  # while no slot exists
            c.execute("DELETE FROM acct WHERE id IN (5, 1000)")
            c.execute("INSERT INTO acct (id, owner) VALUES (1002, 'dup')")
            c.execute("TRUNCATE side")  # a table left empty: no block to snapshot, its rows retracted all the same
        with pytest.raises(SourceError, match=r"slot 's_lost' (no longer exists|does not exist).*reclock new-epoch"):
            pipeline.run_once("acct", config, spark, now=4_000)

        recorded, calls = epochs._record_snapshot_epoch, []  # killed after its snapshot landed: run again

        def killed(*args):
            calls.append(args)
            raise KeyboardInterrupt("killed")
        monkeypatch.setattr(epochs, "_record_snapshot_epoch", killed)
        with pytest.raises(KeyboardInterrupt):
            epochs.new_epoch("acct", config, spark)
        monkeypatch.setattr(epochs, "_record_snapshot_epoch", recorded)
        with pytest.raises(SourceError, match="beyond|released"):  # a tick before the epoch is recorded: refused
            pipeline.tick("acct", config, now=4_500, spark=spark)
        epoch = epochs.new_epoch("acct", config, spark)
        assert epoch["snapshot_at"] == calls[0][-1] and epoch["began_at"] == 3_001, epoch
        (gap,) = epoch["gaps"]
        assert gap["partition"] == "" and gap["end"] == epoch["snapshot_at"] and gap["bound_at"][0] == 3_000, gap
        with psycopg.connect(dsn, autocommit=True) as c:  # a change after the new slot's consistent point
            c.execute("UPDATE acct SET bal = 6 WHERE id = 6")
        pipeline.run_once("acct", config, spark, now=5_000)
        assert as_of(spark, config, 5_000) == table_now(dsn)
        assert {t: as_of(spark, config, t) for t in (1_000, 2_000)} == published
        assert as_of(spark, config, 3_000) == published[2_000]  # its changes were never read one by one
        with runtime.open_source("acct", config, connect=False) as ctx:
            at = [r for r in ctx.tables.read_reclocked_arrow().to_pylist() if r["into_time"] == 5_000]
        # only the difference: ids 2, 3, 4 retracted and inserted, 5 and 1000 retracted, 1001 and 1002
        # inserted (1001 was never published: the snapshot brings it), and the change of 6 on the new slot
        assert sorted((r["table"], *json.loads(r["row"]).values(), r["diff"]) for r in at if r["table"] == "public.side") \
            == [("public.side", 1, -1), ("public.side", 2, -1)]
        at = [(json.loads(r["row"])["id"], r["diff"], r["partition"] == "") for r in at if r["table"] == "public.acct"]
        assert sorted(at) == [(2, -1, False), (2, 1, False), (3, -1, False), (3, 1, False), (4, -1, False),
                              (4, 1, False), (5, -1, False), (6, -1, True), (6, 1, True), (1001, 1, False),
                              (1002, 1, False)]
        register_as_of(spark, 5_000, ["acct"], config)
        assert spark.table("acct_side").count() == 0
