"""The primary-key check of Postgres sources (``reclocked.primary_key_unique``) on the real cluster.

The law (:func:`reclock.checks.check_primary_keys`): for a table with a primary key, every key the batch
touches is held by at most one row AS OF the new upper, over the published history and the batch.  The keys
come from the catalog (with ``REPLICA IDENTITY FULL`` the WAL flags every column as key), read when staging.
"""
from __future__ import annotations

import glob

import pytest

psycopg = pytest.importorskip("psycopg")

from conftest import fresh_database, write_sources_config  # noqa: E402
from reclock import check_log, pipeline, runtime  # noqa: E402
from reclock.checks import ChecksFailed  # noqa: E402
from reclock.sources.postgres import PostgresSource, int_to_lsn  # noqa: E402

TABLES = ("CREATE TABLE acct (id int PRIMARY KEY, bal numeric)",
          "CREATE TABLE log (msg text)",  # no primary key: the same row may be held twice
          "CREATE SCHEMA ops",
          "CREATE TABLE ops.pair (a text, b int, v text, PRIMARY KEY (b, a))",  # key order is the constraint's
          "INSERT INTO acct VALUES (1, 10), (2, 20)", "INSERT INTO log VALUES ('hi')",
          "INSERT INTO ops.pair VALUES ('x', 1, 'v')")
PUBLISHED = ["acct", "log", "ops.pair"]


@pytest.fixture
def db(pg_cluster, tmp_path):
    with fresh_database(pg_cluster, *TABLES, "CREATE TABLE other (k int PRIMARY KEY)") as dsn:
        yield dsn, write_sources_config(tmp_path, ("bank", "postgres", {"dsn": dsn, "slot": "s_pk",
                                                                        "tables": PUBLISHED}), retention_ms=10**9)


def test_primary_keys_come_from_the_catalog(db):
    dsn, _ = db
    with PostgresSource(dsn, "s_cat", tables=PUBLISHED, snapshot=False) as src:
        published = {"public.acct": ["id"], "ops.pair": ["b", "a"]}
        assert src.primary_keys() == published  # the publication's tables, not public.other
        assert src.primary_keys(["public.other", "public.log", "public.acct"]) == {"public.other": ["k"],
                                                                                  "public.acct": ["id"]}
        assert src.primary_keys([]) == {}
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("ALTER TABLE log ADD COLUMN id serial PRIMARY KEY")
        assert src.primary_keys() == {**published, "public.log": ["id"]}


def run(config, spark, now):
    pipeline.tick("bank", config, now=now, spark=spark)
    return pipeline.stage("bank", config, spark)["upto"]  # the window's last IntoTime


def test_updates_and_duplicate_rows_without_a_key_pass(spark, db):
    """Updates of a key (the old key retracted, the new one held once), a composite key, and two identical rows in
    a table without a key: every check passes and the batch is published."""
    dsn, config = db
    pipeline.run_once("bank", config, spark, now=1_000)  # the initial snapshot
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("UPDATE acct SET id = 3 WHERE id = 1")
        c.execute("UPDATE acct SET id = 1 WHERE id = 2")  # a key retracted by the update before is held again
        c.execute("INSERT INTO log VALUES ('hi'), ('hi')")
        c.execute("UPDATE ops.pair SET b = 2")
        c.execute("INSERT INTO ops.pair VALUES ('x', 1, 'w')")
    upto = run(config, spark, 2_000)
    with runtime.open_source("bank", config, connect=False) as ctx:
        staged = ctx.tables.staged_metadata(upto)
        assert staged == {"start": 1_001, "primary_keys": {"public.acct": ["id"], "ops.pair": ["b", "a"]}}
    summary = pipeline.check("bank", config, spark)["primary_key"]
    assert "PASS reclocked.primary_key_unique" in summary, summary
    pipeline.publish("bank", config, spark)
    with runtime.open_source("bank", config, connect=False) as ctx:
        assert ctx.tables.reclocked_upper() == upto + 1


def test_a_key_held_twice_is_refused(spark, db, tmp_path):
    """The change inserting a key, replayed twice in the staged batch (the history holds the key twice): the
    check fails naming the table, the key and the commit LSN, and nothing is published.  Only this check fails:
    no multiplicity is negative."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    dsn, config = db
    pipeline.run_once("bank", config, spark, now=1_000)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO acct VALUES (7, 70)")
    upto = run(config, spark, 2_000)
    pipeline.check("bank", config, spark)  # as staged: passes
    with runtime.open_source("bank", config, connect=False) as ctx:
        staged, schema = ctx.tables.read_staged(upto), ctx.tables.schemas["reclocked"]
    insert = staged[staged["row"] == '{"id":7,"bal":"70"}']
    assert len(insert) == 1 and insert["diff"].iloc[0] == 1
    (attempt,) = glob.glob(f"{tmp_path}/warehouse/bank/reclocked/staged/upto={upto}/*/")
    pq.write_table(pa.Table.from_pandas(insert, schema=schema, preserve_index=False), f"{attempt}/part-replayed.parquet")
    with pytest.raises(ChecksFailed) as failed:
        pipeline.check("bank", config, spark)
    message = str(failed.value)
    assert "FAIL reclocked.primary_key_unique" in message and "'multiplicity': 2" in message, message
    assert "public.acct" in message and '{"id":"7"}' in message, message
    assert f"commit LSN {int_to_lsn(int(insert['offset'].iloc[0]))}" in message, message
    with pytest.raises(ChecksFailed, match="not passed its checks"):
        pipeline.publish("bank", config, spark)
    with runtime.open_source("bank", config, connect=False) as ctx:
        assert ctx.tables.reclocked_upper() == 1_001
        reports = check_log.read(ctx.tables.uri)["reports"]
    assert [kind for kind, report in reports.items() if not report["success"]] == ["primary_key"], reports


def test_a_check_whose_window_another_run_publishes_meanwhile_ends_saying_so(spark, db, monkeypatch, caplog):
    """A schedule and a manual run of one source stage one window (the manual run's attempt is the later one) and
    the schedule checks it; while the manual run's check runs, the schedule publishes the window: the manual run's
    check reads those rows twice, published and staged, and its primary-key check fails (multiplicity 2).  That
    is the race, not the batch: the check ends saying the window was published by another run, raising nothing,
    and every change is published once (found in the soak, 2026-11-30)."""
    import reclock.checks

    dsn, config = db
    pipeline.run_once("bank", config, spark, now=1_000)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO acct VALUES (7, 70)")
        c.execute("UPDATE acct SET bal = 21 WHERE id = 2")
    upto = run(config, spark, 2_000)  # the schedule stages
    assert pipeline.stage("bank", config, spark)["upto"] == upto  # the manual run stages the same window
    assert "PASS reclocked.primary_key_unique" in pipeline.check("bank", config, spark)["primary_key"]  # schedule

    real, published = reclock.checks.check_primary_keys, []

    def publish_meanwhile(*args, **kwargs):  # the schedule publishes while the manual run's check runs
        if not published:
            published.append(pipeline.publish("bank", config, spark))
        return real(*args, **kwargs)

    monkeypatch.setattr(reclock.checks, "check_primary_keys", publish_meanwhile)
    done = pipeline.check("bank", config, spark)  # the manual run's
    assert [(p["published"], p["reclocked_upper"]) for p in published] == [(True, upto + 1)]
    assert done["published_by_another_run"] is True and set(done) == {"remap", "published_by_another_run"}, done
    assert "another run published IntoTimes up to" in caplog.text and "primary_key checks failed" in caplog.text
    with runtime.open_source("bank", config, connect=False) as ctx:
        assert check_log.read(ctx.tables.uri)["success"]
        rows = ctx.tables.read_reclocked_arrow().to_pylist()
    held = {}
    for r in (r for r in rows if r["table"] == "public.acct"):
        held[r["row"]] = held.get(r["row"], 0) + r["diff"]
    assert {row: n for row, n in held.items() if n} == {'{"id":1,"bal":"10"}': 1, '{"id":2,"bal":"21"}': 1,
                                                       '{"id":7,"bal":"70"}': 1}
    assert pipeline.publish("bank", config, spark)["published"] is False
