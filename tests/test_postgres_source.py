"""PostgresSource against a private Postgres 15 cluster (logical decoding with pgoutput)."""
from __future__ import annotations

import json
import pickle
import threading
from collections import Counter, defaultdict

import pytest

psycopg = pytest.importorskip("psycopg")

from conftest import fresh_database  # noqa: E402
from reclock.engine import Frontier  # noqa: E402
from reclock.sources.base import SourceError  # noqa: E402
from reclock.sources.postgres import PostgresSource, lsn_to_int  # noqa: E402

TABLE = "CREATE TABLE items (id int PRIMARY KEY, name text, qty numeric, flag bool, doc jsonb, big text)"


@pytest.fixture
def dsn(pg_cluster):
    """A fresh database per test; its slots and the database are dropped afterwards."""
    with fresh_database(pg_cluster, TABLE, "ALTER TABLE items ALTER COLUMN big SET STORAGE EXTERNAL") as dsn:
        yield dsn


@pytest.fixture
def source(dsn):
    src = PostgresSource(dsn, "s1", tables=["items"], snapshot=False)
    yield src
    src.close()


def txn(dsn, *statements):
    """Run ``statements`` as one transaction."""
    with psycopg.connect(dsn) as c:
        for s in statements:
            c.execute(s)


def read(src, start=None, end=None):
    start = src.committed()[""] if start is None else start
    end = src.upper()[""] if end is None else end
    return list(src.read("", start, end))


def by_offset(records):
    groups = defaultdict(list)
    for data, offset, diff in records:
        groups[offset].append((data["op"], json.loads(data["row"])["id"], diff, data["xid"]))
    return dict(groups)


def test_transaction_changes_share_one_offset_in_commit_order(dsn, source):
    txn(dsn, "INSERT INTO items (id, name) VALUES (1, 'a'), (2, 'b')", "INSERT INTO items (id) VALUES (3)")
    txn(dsn, "INSERT INTO items (id) VALUES (4)")
    txn(dsn, "UPDATE items SET name = 'z' WHERE id = 1", "DELETE FROM items WHERE id = 2")
    # interleaved: A starts first but commits after B, so B's offset is smaller
    a, b = psycopg.connect(dsn), psycopg.connect(dsn)
    a.execute("INSERT INTO items (id) VALUES (10)")
    b.execute("INSERT INTO items (id) VALUES (11)")
    b.commit()
    a.commit()
    a.close(), b.close()
    records = read(source)
    groups = by_offset(records)
    assert [[(op, i, d) for op, i, d, _ in g] for g in groups.values()] == [
        [("insert", 1, 1), ("insert", 2, 1), ("insert", 3, 1)],
        [("insert", 4, 1)],
        [("update", 1, -1), ("update", 1, 1), ("delete", 2, -1)],
        [("insert", 11, 1)],
        [("insert", 10, 1)],
    ]
    assert [o for _, o, _ in records] == sorted(o for _, o, _ in records)  # yielded in commit order
    assert all(len({x for *_, x in g}) == 1 for g in groups.values())  # one xid per offset
    xid_a, xid_b = (groups[o][0][3] for o in list(groups)[-1:-3:-1])
    assert xid_a < xid_b  # A got its xid first, yet B's commit LSN is lower
    assert [d["seq"] for d, _, _ in records[:3]] == [0, 1, 2]


def test_upper_excludes_open_transaction_until_it_commits(dsn, source):
    start = source.upper()[""]
    open_txn = psycopg.connect(dsn)
    open_txn.execute("INSERT INTO items (id, name) VALUES (20, 'open')")  # wrote WAL, not committed
    txn(dsn, "INSERT INTO items (id, name) VALUES (21, 'done')")
    u1 = source.upper()[""]
    with psycopg.connect(dsn) as c:
        flush = lsn_to_int(c.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
    assert start < u1 <= flush
    first = read(source, start, u1)
    assert [json.loads(d["row"])["id"] for d, _, _ in first] == [21]
    open_txn.commit()
    open_txn.close()
    u2 = source.upper()[""]
    assert u2 > u1
    later = read(source, u1, u2)
    assert [json.loads(d["row"])["id"] for d, _, _ in later] == [20]
    assert all(o >= u1 for _, o, _ in later)  # committed after the sample: never below it
    assert read(source, start, u1) == first  # the earlier range did not change
    assert source.upper()[""] >= u2  # monotone


def test_upper_includes_commit_followed_by_unflushed_wal(dsn, source):
    """A commit, then an open transaction writes WAL nobody flushes: upper still covers the commit."""
    start = source.upper()[""]
    txn(dsn, "INSERT INTO items (id) VALUES (30)")
    open_txn = psycopg.connect(dsn)
    open_txn.execute("INSERT INTO items (id) SELECT g FROM generate_series(100, 110) g")
    with psycopg.connect(dsn) as c:
        insert, flush = c.execute("SELECT pg_current_wal_insert_lsn()::text, pg_current_wal_flush_lsn()::text").fetchone()
    assert lsn_to_int(flush) < lsn_to_int(insert)  # the situation under test
    u = source.upper()[""]
    assert [json.loads(d["row"])["id"] for d, _, _ in read(source, start, u)] == [30]
    open_txn.commit()
    open_txn.close()
    assert len(read(source, u)) == 11


def test_read_is_exact_and_repeatable(dsn, source):
    for i in range(5):
        txn(dsn, f"INSERT INTO items (id) VALUES ({i})")
    everything = read(source)
    offsets = [o for _, o, _ in everything]
    assert len(set(offsets)) == 5
    o = offsets
    ids = lambda rs: [json.loads(d["row"])["id"] for d, _, _ in rs]  # noqa: E731
    assert ids(read(source, o[1], o[3])) == [1, 2]
    assert ids(read(source, o[1], o[1] + 1)) == [1]
    assert ids(read(source, o[1] + 1, o[3] + 1)) == [2, 3]
    assert read(source, o[1], o[1]) == []
    c0, u = source.committed()[""], source.upper()[""]
    assert read(source, c0, o[2]) + read(source, o[2], u) == everything
    assert read(source, c0, u) == everything  # repeatable: the slot was not consumed
    with pytest.raises(SourceError, match="beyond the upper"):
        read(source, c0, u + 10**9)
    with pytest.raises(SourceError, match="snapshot partitions, (not|frontier names)"):
        source.read("p", c0, u)


def test_insert_update_delete_diffs_and_row_json(dsn, source):
    big = "x" * 20000  # stored out of line (TOAST, STORAGE EXTERNAL)
    txn(dsn, f"INSERT INTO items VALUES (1, 'a', 1.50, true, '{{\"k\": [1, 2]}}', '{big}')")
    txn(dsn, "UPDATE items SET name = 'b', flag = NULL WHERE id = 1")  # big unchanged: not resent
    txn(dsn, "DELETE FROM items WHERE id = 1")
    records = read(source)
    rows = [(d["op"], json.loads(d["row"]), diff) for d, _, diff in records]
    a = {"id": 1, "name": "a", "qty": "1.50", "flag": True, "doc": {"k": [1, 2]}, "big": big}
    b = {k: v for k, v in {**a, "name": "b"}.items() if k != "flag"}  # a NULL is a missing key
    assert rows == [("insert", a, 1), ("update", a, -1), ("update", b, 1), ("delete", b, -1)]
    assert {d["columns"] for d, _, _ in records} == {json.dumps(  # the relation's (name, type OID, typmod)
        [["id", 23, -1], ["name", 25, -1], ["qty", 1700, -1], ["flag", 16, -1], ["doc", 3802, -1],
         ["big", 25, -1]], separators=(",", ":"))}
    totals = Counter()
    for d, _, diff in records:
        totals[d["row"]] += diff
    assert set(totals.values()) == {0}
    assert records[0][0]["table"] == "public.items"
    assert records[0][0]["commit_time"] is not None


def test_columns_follow_schema_changes_within_a_read(dsn, source):
    """pgoutput describes a relation again after its schema changed: each change carries the columns it was
    decoded with, and the session settings pin the output text of times (UTC, ISO)."""
    txn(dsn, "INSERT INTO items (id, name) VALUES (1, 'a')")
    txn(dsn, "ALTER TABLE items ADD COLUMN at timestamptz, ADD COLUMN n numeric(6,2)")
    txn(dsn, "SET TIME ZONE 'Asia/Kolkata'", "INSERT INTO items (id, at, n) VALUES (2, '2026-01-01 05:30+05:30', 1.5)")
    txn(dsn, "ALTER TABLE items DROP COLUMN name")
    txn(dsn, "UPDATE items SET n = 2 WHERE id = 2")
    records = read(source)
    names = [[c[0] for c in json.loads(d["columns"])] for d, _, _ in records]
    assert names[0] == ["id", "name", "qty", "flag", "doc", "big"]
    assert names[1] == names[0] + ["at", "n"]
    assert names[2] == names[3] == ["id", "qty", "flag", "doc", "big", "at", "n"]
    assert json.loads(records[1][0]["columns"])[-1] == ["n", 1700, ((6 << 16) | 2) + 4]
    assert json.loads(records[1][0]["row"]) == {"id": 2, "at": "2026-01-01 00:00:00+00", "n": "1.50"}
    txn(dsn, "ALTER TABLE items ADD COLUMN d int DEFAULT 5, ADD COLUMN e int, ADD COLUMN f timestamptz DEFAULT now()")
    assert source.filled_columns("public.items", ["d", "e", "f", "n"]) == ["d", "f"]  # now() is no volatile default
    assert source.filled_columns("public.gone", ["d"]) == []


def test_missing_old_row_is_a_clear_error(dsn):
    txn(dsn, "CREATE TABLE plain (id int PRIMARY KEY, v text)", "CREATE PUBLICATION p_plain FOR TABLE plain")
    src = PostgresSource(dsn, "s_plain", publication="p_plain", snapshot=False)
    try:
        txn(dsn, "INSERT INTO plain VALUES (1, 'a')")
        u_insert = src.upper()[""]
        txn(dsn, "DELETE FROM plain WHERE id = 1")
        assert len(read(src, end=u_insert)) == 1  # inserts need no old row
        with pytest.raises(SourceError, match="REPLICA IDENTITY FULL"):
            read(src)
    finally:
        src.close()


def test_truncate_is_a_marker_per_table(dsn, source):
    """TRUNCATE has no row diffs: one marker per table, in its transaction's order (reclock.truncate expands it)."""
    txn(dsn, "INSERT INTO items (id) VALUES (1)")
    txn(dsn, "INSERT INTO items (id) VALUES (2)", "TRUNCATE items", "INSERT INTO items (id) VALUES (3)")
    records = read(source)
    assert [(d["op"], d["seq"], diff) for d, _, diff in records] == [
        ("insert", 0, 1), ("insert", 0, 1), ("truncate", 1, 0), ("insert", 2, 1)]
    assert records[2][0]["table"] == "public.items" and records[2][0]["row"] is None
    assert records[2][0]["columns"] == records[0][0]["columns"]  # its retractions carry the table's columns
    assert len({o for _, o, _ in records[1:]}) == 1


def test_commit_advances_slot_and_releases_data(dsn, source, pg_cluster):
    for i in range(3):
        txn(dsn, f"INSERT INTO items (id) VALUES ({i})")
    c0 = source.committed()[""]
    everything = read(source)
    o = sorted({off for _, off, _ in everything})
    source.commit(Frontier.of({"": o[1]}))
    assert source.committed() == Frontier.of({"": o[1]})
    with psycopg.connect(pg_cluster.dsn(), autocommit=True) as c:
        lsn = c.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 's1'").fetchone()
    assert lsn_to_int(lsn[0]) == o[1]
    with pytest.raises(SourceError, match="already released upstream"):
        read(source, c0)
    assert read(source, o[1]) == [r for r in everything if r[1] >= o[1]]
    source.commit(Frontier.of({"": o[0]}))  # going back is a no-op
    assert source.committed()[""] == o[1]
    with pytest.raises(SourceError, match="beyond the upper"):
        source.commit(Frontier.of({"": source.upper()[""] + 10**9}))
    with pytest.raises(SourceError, match="snapshot partitions, (not|frontier names)"):
        source.commit(Frontier.of({"other": 5}))


def test_dropped_slot_is_a_clear_error(dsn, source):
    txn(dsn, "INSERT INTO items (id) VALUES (1)")
    u = source.upper()[""]
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pg_drop_replication_slot('s1')")
    for call in (source.upper, source.committed, lambda: source.read("", 0, u)):
        with pytest.raises(SourceError, match="no longer exists"):
            call()
    with pytest.raises(SourceError, match="does not exist"):
        PostgresSource(dsn, "s1", tables=["items"], create_slot=False)


def test_restart_resumes_from_committed_frontier(dsn):
    first = PostgresSource(dsn, "s_restart", tables=["items"], snapshot=False)
    for i in range(3):
        txn(dsn, f"INSERT INTO items (id) VALUES ({i})")
    before = read(first)
    o = sorted({off for _, off, _ in before})
    first.commit(Frontier.of({"": o[1]}))
    first.close()
    txn(dsn, "INSERT INTO items (id) VALUES (3)", "INSERT INTO items (id) VALUES (4)")
    second = PostgresSource(dsn, "s_restart", tables=["items"], snapshot=False)  # slot and publication exist: reused
    try:
        assert second.committed() == Frontier.of({"": o[1]})
        assert second.upper()[""] > o[2]
        after = read(second)
        assert after[:2] == [r for r in before if r[1] >= o[1]]  # same records, same offsets
        assert [json.loads(d["row"])["id"] for d, _, _ in after] == [1, 2, 3, 4]
        with pytest.raises(SourceError, match="already released"):
            read(second, o[0])
    finally:
        second.close()


def test_bad_configuration(dsn):
    with pytest.raises(SourceError, match="publication 'nope' does not exist"):
        PostgresSource(dsn, "s_bad", publication="nope")
    with pytest.raises(SourceError, match="slot name"):
        PostgresSource(dsn, "Bad-Name", tables=["items"])
    with pytest.raises(SourceError, match="cannot connect"):
        PostgresSource("host=/nonexistent port=1 user=x dbname=x connect_timeout=2", "s_x")


def test_concurrent_readers_share_the_slot(dsn, source):
    for i in range(5):
        txn(dsn, f"INSERT INTO items (id) VALUES ({i})")
    expected = read(source)
    c0, u = source.committed()[""], source.upper()[""]
    clone = pickle.loads(pickle.dumps(source))  # as a Spark task gets it
    results, errors = [], []

    def work(src):
        try:
            for _ in range(5):
                results.append(list(src.read("", c0, u)))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in (source, clone)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    clone.close()
    assert not errors and len(results) == 10 and all(r == expected for r in results)


def test_build_source_kind(dsn):
    sources = pytest.importorskip("reclock.sources")
    if "postgres" not in sources.source_kinds():
        pytest.skip("postgres kind not registered")
    src = sources.build_source({"kind": "postgres", "dsn": dsn, "slot": "s_built", "tables": ["items"], "snapshot": False})
    try:
        assert isinstance(src, PostgresSource) and src.committed().less_equal(src.upper())
    finally:
        src.close()
