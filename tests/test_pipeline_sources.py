"""The Postgres and files sources through the whole pipeline, and malformed Kafka records (fail, dead_letter).

Real Postgres (private cluster), real Spark, real Delta tables and Great Expectations checks;
every tick at an explicit IntoTime so the expected contents at each time are known exactly.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections import Counter, defaultdict

import pytest

from conftest import edit_config, fresh_database, over_connect, write_sources_config
from reclock import check_log, pipeline
from reclock import runtime
from devtools.kafka_broker import create_topic, produce
from reclock.checks import ChecksFailed
from reclock.engine import Frontier
from reclock.query import readable, register_as_of
from reclock.sources.base import SourceError
from reclock.sources.files import FileSource
from reclock.storage import DEAD_LETTER_APP, RECLOCKED_APP, WarehouseError, commits

pytestmark = pytest.mark.slow


def reclocked(name, config):
    with runtime.open_source(name, config, connect=False) as ctx:
        return ctx.tables.read_reclocked_arrow().to_pylist()


def view(spark, config, name, t):
    """The AS OF ``t`` view of ``name`` as a multiset of rows (dicts without None-free noise)."""
    register_as_of(spark, t, [name], config)
    return [r.asDict() for r in spark.table(name).collect()]


def assert_resumed(name, config):
    """resume committed upstream exactly the remap frontier at the last published IntoTime."""
    with runtime.open_source(name, config) as ctx:
        remap, upper = ctx.tables.read_remap(), ctx.tables.reclocked_upper()
        assert ctx.source.committed() == remap.at(upper - 1)
        return ctx.source.committed()


# --- Postgres -----------------------------------------------------------------------------------


@pytest.fixture
def pg(pg_cluster, tmp_path):
    """A fresh database with table ``items`` and a config with the source ``pg`` reading it."""
    pytest.importorskip("psycopg")
    with fresh_database(pg_cluster, "CREATE TABLE items (id int PRIMARY KEY, name text, qty numeric)") as dsn:
        yield dsn, write_sources_config(tmp_path, ("pg", "postgres", {"dsn": dsn, "slot": "reclock_pg", "tables": ["items"]}))


def txn(dsn, *statements):
    """Run ``statements`` as one transaction; its xid."""
    import psycopg

    with psycopg.connect(dsn) as c:
        for s in statements:
            c.execute(s)
        return c.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0]


def pg_contents(dsn):
    """The rows of ``items`` now, as the AS OF view spells them."""
    import psycopg

    with psycopg.connect(dsn) as c:
        rows = c.execute("SELECT id, name, qty::text FROM items").fetchall()
    return Counter(("public.items", row) for row in rows)


def pg_view(spark, config, t):
    rows = view(spark, config, "pg", t)
    assert all(set(r) == {"table", "row"} for r in rows), rows[:1]  # contents, no change metadata
    return Counter((r["table"], tuple(json.loads(r["row"]).values())) for r in rows)


def confirmed_lsn(dsn):
    import psycopg

    from reclock.sources.postgres import lsn_to_int

    with psycopg.connect(dsn) as c:
        (lsn,) = c.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                           "WHERE slot_name = 'reclock_pg'").fetchone()
    return lsn_to_int(lsn)


def test_postgres_end_to_end(spark, spark_connect, pg):
    import psycopg

    dsn, config = pg
    snapshots, xids = {}, []

    def tick(t):
        pipeline.run_once("pg", config, spark, now=t)
        snapshots[t] = pg_contents(dsn)
        assert pg_view(spark, config, t) == snapshots[t]
        committed = assert_resumed("pg", config)
        assert committed[""] == confirmed_lsn(dsn)  # the slot itself advanced

    pipeline.tick("pg", config, now=500)  # creates the slot: changes from here on are the source's
    xids.append(txn(dsn, "INSERT INTO items VALUES (1, 'a', 1.50), (2, 'b', 2), (3, 'c', 3)"))
    xids.append(txn(dsn, "INSERT INTO items VALUES (4, 'd', 4)"))
    tick(1_000)
    xids.append(txn(dsn, "UPDATE items SET qty = qty + 1 WHERE id IN (1, 2)", "DELETE FROM items WHERE id = 3",
                    "INSERT INTO items VALUES (5, 'e', 5)"))
    xids.append(txn(dsn, "UPDATE items SET name = 'a2' WHERE id = 1"))
    tick(2_000)
    tick(3_000)  # idle: same contents

    # one transaction = one offset = one IntoTime; commit order is offset order is IntoTime order
    rows = [r for r in reclocked("pg", config) if r["into_time"] > 500]
    by_xid = defaultdict(list)
    for r in rows:
        by_xid[r["xid"]].append(r)
    assert set(by_xid) == set(xids)
    assert all(len({(r["offset"], r["into_time"]) for r in rs}) == 1 for rs in by_xid.values())
    first = {x: (rs[0]["offset"], rs[0]["into_time"]) for x, rs in by_xid.items()}
    assert sorted(xids, key=lambda x: first[x][0]) == xids
    assert [first[x][1] for x in xids] == [1_000, 1_000, 2_000, 2_000]
    t3 = sorted(by_xid[xids[2]], key=lambda r: (r["seq"], r["diff"]))
    assert [(r["seq"], r["op"], r["diff"]) for r in t3] == [
        (0, "update", -1), (0, "update", 1), (1, "update", -1), (1, "update", 1), (2, "delete", -1), (3, "insert", 1)]
    assert all(r["commit_time"].tzinfo is not None and r["partition"] == "" for r in rows)

    # the old row comes back with the same values (multiplicity 1 again); an open transaction is not bound
    xids.append(txn(dsn, "DELETE FROM items WHERE id IN (1, 4)", "INSERT INTO items VALUES (3, 'c', 3)"))
    open_txn = psycopg.connect(dsn)
    open_txn.execute("INSERT INTO items VALUES (9, 'open', 9)")
    tick(4_000)  # also compacts to since = 1_500 (retention 2.5 s)
    open_txn.commit()
    open_txn.close()
    tick(5_000)  # since = 2_500: the history of 1_000 and 2_000 is folded
    assert readable("pg", config).since == 2_500
    folded = [r for r in reclocked("pg", config) if r["into_time"] == 2_500]  # compaction grouped them
    assert len(folded) == 12 and {r["op"] for r in folded} == {"insert", "update", "delete"}
    for t in (3_000, 4_000, 5_000):
        assert pg_view(spark, config, t) == snapshots[t]

    # restart: a new process ticks (a new PostgresSource, over the session's Spark Connect server: no cold JVM);
    # a transaction commits before resume
    connected = over_connect(config, spark_connect)
    code = f"from reclock import pipeline; print(pipeline.tick('pg', {connected!r}, now=6_000))"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=300,
                   env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    snapshots[6_000] = pg_contents(dsn)
    txn(dsn, "INSERT INTO items VALUES (6, 'after the tick', 6)")
    for step in (pipeline.stage, pipeline.check, pipeline.publish, pipeline.resume):
        step("pg", config, spark) if step is pipeline.stage else step("pg", config)
    assert pg_view(spark, config, 6_000) == snapshots[6_000]
    assert_resumed("pg", config)  # released up to the 6_000 binding only: the late insert is kept
    tick(7_000)
    assert ("public.items", (6, "after the tick", "6")) in snapshots[7_000]

    # the slot is dropped after a tick: staging fails loudly, nothing more is published
    txn(dsn, "INSERT INTO items VALUES (7, 'lost', 7)")
    pipeline.tick("pg", config, now=8_000)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pg_drop_replication_slot('reclock_pg')")
    with pytest.raises(SourceError, match="the slot was dropped"):
        pipeline.stage("pg", config, spark)
    assert readable("pg", config).upper == 7_001
    # the next tick refuses: no slot is created behind the source's back (its changes are lost); nothing written
    with pytest.raises(SourceError, match="the slot was dropped"):
        pipeline.run_once("pg", config, spark, now=9_000)
    with runtime.open_source("pg", config, connect=False) as ctx:
        assert ctx.tables.remap_upper() == 8_001
    # published history stays queryable, without touching Postgres (no slot created by queries)
    for t in (5_000, 7_000):
        assert pg_view(spark, config, t) == snapshots[t]
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT count(*) FROM pg_replication_slots WHERE database = current_database()"
                         ).fetchone()[0] == 0


# --- files --------------------------------------------------------------------------------------


def test_files_end_to_end(spark, tmp_path):
    root = tmp_path / "in"
    root.mkdir()
    config = write_sources_config(tmp_path, ("logs", "files", {"url": str(root), "pattern": "*.log"}))

    def append(key, text):
        with open(root / key, "ab") as f:
            f.write(text.encode())

    def lines():
        """Every complete line now, as ``(line, key, byte offset)``."""
        out = Counter()
        for path in sorted(root.glob("*.log")):
            data, at = path.read_bytes(), 0
            while (end := data.find(b"\n", at)) >= 0:
                out[(data[at:end].decode(), path.name, at)] += 1
                at = end + 1
        return out

    keys = {}  # partition (file identity) -> key; no file is renamed here

    def files_view(t):
        rows = view(spark, config, "logs", t)
        return Counter((r["line"], keys[r["partition"]], r["offset"]) for r in rows)

    snapshots = {}

    def tick(t):
        pipeline.run_once("logs", config, spark, now=t)
        keys.update(FileSource(str(root), pattern="*.log").names())
        snapshots[t] = lines()
        assert files_view(t) == snapshots[t]
        assert_resumed("logs", config)

    append("a.log", '{"n": 1}\n{"n": 2}\n')
    append("b.log", "b1\nb2 partial, no newl")
    tick(1_000)
    assert ("b2 partial, no newline yet", "b.log", 3) not in snapshots[1_000]
    append("b.log", "ine yet\nb3\n")
    append("a.log", '{"n": 3}\n')
    tick(2_000)
    assert ("b2 partial, no newline yet", "b.log", 3) in snapshots[2_000]
    append("c.log", "c1\n")  # a new key
    append("a.log", "é\n")
    tick(3_000)
    assert {k for _, k, _ in snapshots[3_000]} == {"a.log", "b.log", "c.log"} == set(keys.values())
    for t in (1_000, 2_000):  # since = 500 after tick 3_000: earlier times stay exact
        assert files_view(t) == snapshots[t]
    assert len(reclocked("logs", config)) == sum(snapshots[3_000].values())

    # a file shrinks: the tick fails loudly and writes nothing; published data stays queryable
    (root / "b.log").write_bytes(b"b1\n")
    append("c.log", "c2\n")
    with pytest.raises(SourceError, match=r"b\.log.* shrank from 33 to 3 bytes"):
        pipeline.run_once("logs", config, spark, now=4_000)
    assert readable("logs", config).upper == 3_001
    with runtime.open_source("logs", config, connect=False) as ctx:
        assert ctx.tables.remap_upper() == 3_001
    assert files_view(3_000) == snapshots[3_000]


def test_files_rotation_end_to_end(spark, tmp_path):
    """Rename, then copy-truncate rotation between ticks: the published table has every line exactly once."""
    root = tmp_path / "in"
    root.mkdir()
    config = write_sources_config(tmp_path, ("logs", "files", {"url": str(root), "pattern": "app.log*"}))
    n, at = 0, {}  # line -> the IntoTime of the first tick after it was written

    def append(key, count, tick):
        nonlocal n
        with open(root / key, "a") as f:
            for _ in range(count):
                f.write(f"line {n}\n")
                at[f"line {n}"] = tick
                n += 1

    append("app.log", 100, 1_000)
    pipeline.run_once("logs", config, spark, now=1_000)
    (root / "app.log").rename(root / "app.log.1")  # rotation by rename
    append("app.log.1", 5, 2_000)  # the writer had not reopened yet
    append("app.log", 100, 2_000)
    pipeline.run_once("logs", config, spark, now=2_000)
    (root / "app.log.1").rename(root / "app.log.2")  # rotation by copy-truncate
    (root / "app.log.1").write_bytes((root / "app.log").read_bytes())
    (root / "app.log").write_bytes(b"")
    append("app.log", 100, 3_000)
    pipeline.run_once("logs", config, spark, now=3_000)

    rows = reclocked("logs", config)
    assert Counter(r["line"] for r in rows) == Counter(list(at)) and all(r["diff"] == 1 for r in rows)
    assert {r["line"]: r["into_time"] for r in rows} == at
    assert len({r["partition"] for r in rows}) == 3  # three files, whatever their names now
    names = FileSource(str(root), pattern="app.log*").names()
    assert sorted(names.values()) == ["app.log", "app.log.1", "app.log.2"]
    assert Counter(r["line"] for r in view(spark, config, "logs", 3_000)) == Counter(list(at))
    assert set(assert_resumed("logs", config).partitions) == {r["partition"] for r in rows}  # commit by identity


def test_files_rotated_away_are_retired(spark, tmp_path):
    """A log rotated 20 times, twice between runs, as logrotate with ``rotate 2`` does (app.log.2 deleted, app.log.1
    renamed app.log.2, app.log renamed app.log.1; the writer appends to the renamed file before it reopens):
    compaction retires each deleted file once read whole, so remap's frontier keeps the live files only (2) and the
    commit file forgets the retired; every line is published once.  A retired file back unchanged binds nothing;
    back with new lines it is refused, and so is a replay of the folded binding at since (it would need the
    deleted files)."""
    from reclock.backfill import BackfillError, replay

    root = tmp_path / "in"
    root.mkdir()
    config = write_sources_config(tmp_path, ("logs", "files", {"url": str(root), "pattern": "app.log*"}),
                                  retention_ms=500)
    lines, n, deleted, results = [], 0, None, []

    def append(key, count):
        nonlocal n
        with open(root / key, "a") as f:
            for _ in range(count):
                f.write(f"line {n} of {key}\n")
                lines.append(f"line {n} of {key}")
                n += 1

    def rotate():
        nonlocal deleted
        if (root / "app.log.2").exists():
            deleted = (root / "app.log.2").read_bytes()
            (root / "app.log.2").unlink()
        if (root / "app.log.1").exists():
            (root / "app.log.1").rename(root / "app.log.2")
        (root / "app.log").rename(root / "app.log.1")
        append("app.log.1", 1)  # the writer has not reopened yet

    for k in range(1, 11):
        for _ in range(2):
            append("app.log", 3)
            rotate()
        results.append(pipeline.run_once("logs", config, spark, now=1_000 * k))
    results.append(pipeline.run_once("logs", config, spark, now=11_000))

    with runtime.open_source("logs", config) as ctx:
        remap, record = ctx.tables.read_remap(), ctx.tables.upstream_record()
        held = set(ctx.source.held_partitions())
        assert set(remap.frontier.partitions) == held and len(held) == 2  # app.log.1 and app.log.2
        assert len(record.retired.partitions) == 18 and not held & set(record.retired.partitions)
        assert set(ctx.tables.remap_frame()["partition"]) == held  # their rows are gone from remap too
        assert set(ctx.upstream.committed().partitions) == held  # resume commits remap's frontier: the retired
        since = remap.since                                           # forgotten
    assert [result["compact"]["retired"] for result in results] == [0] + [2] * 9 + [0]  # each run retires the two files deleted since the last
    rows = reclocked("logs", config)
    assert Counter(r["line"] for r in rows) == Counter(lines) and all(r["diff"] == 1 for r in rows)
    assert len({r["partition"] for r in rows}) == 20  # the published rows of retired files stay

    (root / "app.log.old").write_bytes(deleted)  # a retired file back, unchanged: nothing to bind
    assert pipeline.tick("logs", config, now=12_000)["new_offsets"] == 0
    with open(root / "app.log.old", "ab") as f:
        f.write(b"one more\n")
    with pytest.raises(SourceError, match=r"was retired at offset \d+ .* and is back with records up to"):
        pipeline.tick("logs", config, now=13_000)
    with pytest.raises(BackfillError, match="partitions retired"):
        replay("logs", config, since, since, spark)


def test_files_bad_line_fails_or_is_dead_lettered(spark, tmp_path):
    """A line not valid utf-8 stops staging by default, naming file and byte offset; with on_bad_record:
    dead_letter the tick goes on: the good lines are published, the bad one is bound like them and is in
    logs_dead_letter with its coordinates, raw bytes and error; the checks and the progress page count it."""
    from reclock.progress import collect
    from reclock.sources.files import fingerprint

    root = tmp_path / "in"
    root.mkdir()
    config = write_sources_config(tmp_path, ("logs", "files", {"url": str(root)}))
    (root / "a.log").write_bytes(b"ok 1\n\xff\xfe bad\nok 2\n")  # lines at bytes 0, 5, 12
    a = fingerprint(b"ok 1\n")
    error = f"{root} file {a} (key 'a.log') byte offset 5: line is not valid utf-8: 'utf-8' codec can't decode " \
            "byte 0xff in position 0: invalid start byte"
    with pytest.raises(SourceError, match=rf"^logs: staging IntoTimes \d+\.\.1000 failed: {re.escape(error)}$"):
        pipeline.run_once("logs", config, spark, now=1_000)  # on_bad_record: fail, the default

    edit_config(config, lambda doc: doc["sources"][0].update(on_bad_record="dead_letter"))
    with open(root / "a.log", "ab") as f:
        f.write(b"ok 3\n")  # byte 17
    done = pipeline.run_once("logs", config, spark, now=2_000)
    assert done["stage"]["dead_letters"] == 1 and done["publish"]["reclocked_upper"] == 2_001
    assert sorted((r["line"], r["offset"], r["into_time"]) for r in reclocked("logs", config)) == [
        ("ok 1", 0, 1_000), ("ok 2", 12, 1_000), ("ok 3", 17, 2_000)]
    assert assert_resumed("logs", config) == Frontier.of({a: 22})  # committed past the bad line
    with runtime.open_source("logs", config, connect=False, spark=spark) as ctx:
        rows = [tuple(r) for r in ctx.tables.read_dead_letters_spark(spark).collect()]
    assert rows == [("logs", a, 5, 1_000, None, b"\xff\xfe bad", error)]
    checked = check_log.read(f"{tmp_path}/warehouse/logs")
    results = {r["name"]: r for r in checked["reports"]["dead_letter"]["results"]}
    assert results["dead_letter.count"]["observed"] == 1 and all(r["success"] for r in results.values())
    assert collect(config, upstream=False)["sources"][0]["dead_letters"] == 1


# --- Kafka: a malformed record -----------------------------------------------------------------


def test_kafka_malformed_record_stops_at_stage(kafka_broker, spark, tmp_path):
    topic = f"bad-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker, topic, partitions=1)
    config = write_sources_config(tmp_path, ("events", "kafka", {"bootstrap_servers": kafka_broker, "topic": topic,
                                                         "group_id": f"g-{topic}"}))
    produce(kafka_broker, topic, [("k", "ok-1"), ("k", "ok-2")])
    pipeline.run_once("events", config, spark, now=1_000)
    produce(kafka_broker, topic, [("k", "ok-3"), ("k", b"\xff\xfe not utf-8")])
    pipeline.tick("events", config, now=2_000)
    with pytest.raises(SourceError, match=rf"^events: staging IntoTimes 1001..2000 failed: topic '{topic}' partition 0 "
                                          r"offset 3: record is not valid utf-8 \(undecodable value\)$"):
        pipeline.stage("events", config, spark)  # on_bad_record: fail, the default
    with pytest.raises(ChecksFailed, match="not been checked"):
        pipeline.publish("events", config)
    with pytest.raises(WarehouseError, match="no complete staged attempt"):
        pipeline.check("events", config)
    assert readable("events", config).upper == 1_001  # nothing of the bad tick published
    rows = view(spark, config, "events", 1_000)
    assert sorted(r["value"] for r in rows) == ["ok-1", "ok-2"]
    with pytest.raises(SourceError, match="not valid utf-8"):  # and it stays stuck, loudly
        pipeline.run_once("events", config, spark, now=3_000)


def test_kafka_dead_letter_goes_on_and_keeps_the_bad_records(kafka_broker, spark, tmp_path, monkeypatch):
    """on_bad_record: dead_letter: the tick goes on; an undecodable record is bound like the others (remap covers
    it, resume commits past it) but not published: its coordinates, raw bytes and error are in events_dead_letter,
    written with its batch, once, even when the publish is cut between the two tables and the batch staged again."""
    from reclock.backfill import replay
    from reclock.progress import collect
    from reclock.progress_view import render_page

    topic = f"dead-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker, topic, partitions=2)
    config = write_sources_config(tmp_path, ("events", "kafka", {"bootstrap_servers": kafka_broker, "topic": topic,
                                                                 "group_id": f"g-{topic}"}))
    edit_config(config, lambda doc: doc["sources"][0].update(on_bad_record="dead_letter"))
    produce(kafka_broker, topic, [("k", "ok-1"), ("k", "ok-2")], partition=0)
    first = pipeline.run_once("events", config, spark, now=1_000)
    assert first["stage"]["dead_letters"] == 0 and first["publish"]["published"]
    with runtime.open_source("events", config, connect=False) as ctx:  # nothing to add: no dead-letter commit
        assert ctx.tables._app_version("dead_letter", DEAD_LETTER_APP, -1) == -1
        assert ctx.tables.dead_letter_count() == 0  # the table is there, empty

    produce(kafka_broker, topic, [("k", "ok-3"), ("k", b"\xff\xfe not utf-8"), ("k", "ok-4")], partition=0)  # 2..4
    produce(kafka_broker, topic, [(b"\xc3\x28", b"bad key")], partition=1)  # offset 0
    second = pipeline.run_once("events", config, spark, now=2_000)
    assert second["stage"] == {"staged_rows": 2, "start": 1_001, "upto": 2_000, "ranges": 2, "dead_letters": 2}
    assert readable("events", config).upper == 2_001  # the tick went on
    assert sorted((r["value"], r["partition"], r["offset"], r["into_time"]) for r in reclocked("events", config)) == [
        ("ok-1", 0, 0, 1_000), ("ok-2", 0, 1, 1_000), ("ok-3", 0, 2, 2_000), ("ok-4", 0, 4, 2_000)]
    with runtime.open_source("events", config) as ctx:
        remap = ctx.tables.read_remap()
        assert (remap.into_time_of(0, 3), remap.into_time_of(1, 0)) == (2_000, 2_000)  # bound like the others
        assert ctx.source.committed() == Frontier.of({0: 5, 1: 1})  # and resumed past
        table = ctx.tables.read_dead_letters_spark(spark)  # a Delta table beside remap and reclocked, read by Spark
        assert ctx.tables.table_uri("dead_letter") == f"{ctx.tables.uri}/dead_letter"
    rows = sorted(tuple(r) for r in table.collect())
    where = f"topic '{topic}' partition"
    assert rows == [
        ("events", 0, 3, 2_000, b"k", b"\xff\xfe not utf-8", f"{where} 0 offset 3: record is not valid utf-8 (undecodable value)"),
        ("events", 1, 0, 2_000, b"\xc3\x28", b"bad key", f"{where} 1 offset 0: record is not valid utf-8 (undecodable key)")]
    assert table.schema.simpleString() == ("struct<source:string,partition:int,offset:bigint,into_time:bigint,"
                                           "key:binary,value:binary,error:string>")

    checked = check_log.read(f"{tmp_path}/warehouse/events")  # the checks report the batch's count, and pass
    assert checked["success"] and checked["window"] == [1_001, 2_000]
    results = {r["name"]: r for r in checked["reports"]["dead_letter"]["results"]}
    assert results["dead_letter.count"]["observed"] == 2 and all(r["success"] for r in results.values())
    assert checked["reports"]["dead_letter"]["rows"] == 2
    assert "PASS dead_letter.count: records of the batch that could not be decoded" in second["check"]["dead_letter"]

    # A publish cut after the dead letters and before the records; the next tick brings one more bad record, and
    # the batch is staged again over the longer window: each dead letter is in the table once.
    real = commits.commit_added  # the reclocked commit (and the dead letters')

    def cut(dt, added, app_id, version, metadata=None):
        if app_id == RECLOCKED_APP:
            raise RuntimeError("killed between the dead-letter and the reclocked commits")
        real(dt, added, app_id, version, metadata)

    produce(kafka_broker, topic, [("k", b"\x80")], partition=1)  # offset 1
    pipeline.tick("events", config, now=3_000, spark=spark)
    pipeline.stage("events", config, spark)
    pipeline.check("events", config)
    monkeypatch.setattr(commits, "commit_added", cut)
    with pytest.raises(RuntimeError, match="killed"):
        pipeline.publish("events", config, spark)
    monkeypatch.setattr(commits, "commit_added", real)
    with runtime.open_source("events", config, connect=False, spark=spark) as ctx:
        assert (ctx.tables.dead_letter_count(), ctx.tables.reclocked_upper()) == (3, 2_001)
    produce(kafka_broker, topic, [("k", "ok-5")], partition=1)  # offset 2
    fourth = pipeline.run_once("events", config, spark, now=4_000)
    assert fourth["stage"]["dead_letters"] == 1 and fourth["publish"]["reclocked_upper"] == 4_001
    assert not pipeline.publish("events", config, spark)["published"]  # a rerun adds nothing
    with runtime.open_source("events", config, connect=False, spark=spark) as ctx:
        assert ctx.tables.dead_letter_count() == 3
        offsets = sorted((r.partition, r.offset, r.into_time) for r in ctx.tables.read_dead_letters_spark(spark).collect())
    assert offsets == [(0, 3, 2_000), (1, 0, 2_000), (1, 1, 3_000)]
    assert sorted(r["value"] for r in reclocked("events", config)) == ["ok-1", "ok-2", "ok-3", "ok-4", "ok-5"]
    since = readable("events", config).since  # run_once compacted (retention 2.5 s)
    assert since > 0 and replay("events", config, since, 4_000, spark)["equal"]  # a backfill replays what was published

    data = collect(config, upstream=False)  # the progress page shows the source's count
    assert data["sources"][0]["dead_letters"] == 3
    assert "3 in events_dead_letter" in render_page(data)
