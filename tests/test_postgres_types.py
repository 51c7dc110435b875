"""Typed AS OF views of Postgres tables and schema changes, on the real cluster (reclock.pg_types).

Each table of a Postgres source is a view ``<source>_<table>`` read from its typed Delta table
(reclock.typed_tables), with the table's columns then, typed from the relation's type OIDs; an added column is
followed (rows before it read NULL for it, AS OF times before it lack it), a dropped one stops the source at
staging with an error naming the source, table, column and commit LSN.
"""
from __future__ import annotations

import datetime as dt
import json
import re
from contextlib import contextmanager
from decimal import Decimal

import pytest

psycopg = pytest.importorskip("psycopg")

from conftest import as_of_views, fresh_database, write_sources_config  # noqa: E402
from reclock import epochs, pipeline, runtime  # noqa: E402
from reclock.query import register_as_of  # noqa: E402
from reclock.sources.base import SourceError  # noqa: E402
from reclock.sources.postgres import lsn_to_int  # noqa: E402

ACCT = ("CREATE TABLE acct (id int PRIMARY KEY, bal numeric(12,2), free numeric, ok bool, score float8, day date, "
        "at timestamptz, local timestamp, doc jsonb, tags text[], nums int[], raw bytea, big text, note varchar(20))",
        "ALTER TABLE acct ALTER COLUMN big SET STORAGE EXTERNAL",  # stored out of line, uncompressed: TOASTed
        "INSERT INTO acct VALUES "
        "(1, 10.50, 1e-30, true, 0.5, '2026-01-02', '2026-01-02 03:04:05.5+02', '2026-01-02 03:04:05', "
        "'{\"k\": [1, \"x\"]}', ARRAY['a', NULL, 'b c'], ARRAY[1, 2], '\\x00ff', repeat('t', 30000), 'n1'),"
        "(2, -3.25, NULL, false, 'NaN', 'infinity', NULL, NULL, NULL, '{}', NULL, NULL, NULL, NULL),"
        "(3, NULL, 123456789012345678901234567890.5, NULL, NULL, NULL, NULL, NULL, '[]', NULL, NULL, NULL, NULL, 'n3')")


def typed(spark, config, t, sql):
    register_as_of(spark, t, ["bank"], config)
    return {r["id"]: r.asDict() for r in spark.sql(sql).collect()}


def test_typed_columns_as_of_with_updates_and_deletes_of_existing_rows(spark, pg_cluster, tmp_path):
    with fresh_database(pg_cluster, *ACCT) as dsn:
        options = {"dsn": dsn, "slot": "s_bank", "tables": ["acct"]}
        config = write_sources_config(tmp_path, ("bank", "postgres", options), retention_ms=10**9)
        pipeline.run_once("bank", config, spark, now=1_000)  # rows 1-3 from the initial snapshot
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("UPDATE acct SET bal = 11.75, note = NULL WHERE id = 1")  # big unchanged: TOASTed, not resent
            c.execute("DELETE FROM acct WHERE id = 2")
            c.execute("UPDATE acct SET ok = true, tags = ARRAY['z'] WHERE id = 3")
            c.execute("INSERT INTO acct (id, bal, at, raw) VALUES (4, 4, '2026-11-25 00:00:00+00', '\\x0a')")
        pipeline.run_once("bank", config, spark, now=2_000)

        first = typed(spark, config, 1_000, "SELECT * FROM bank_acct")
        schema = {f.name: f.dataType.simpleString() for f in spark.table("bank_acct").schema.fields}
        assert schema == {"id": "int", "bal": "decimal(12,2)", "free": "string", "ok": "boolean", "score": "double",
                          "day": "date", "at": "timestamp", "local": "timestamp_ntz", "doc": "string",
                          "tags": "array<string>", "nums": "array<int>", "raw": "binary", "big": "string",
                          "note": "string"}
        one = {"id": 1, "bal": Decimal("10.50"), "free": "0.000000000000000000000000000001", "ok": True, "score": 0.5,
               "day": dt.date(2026, 1, 2), "at": dt.datetime(2026, 1, 2, 1, 4, 5, 500000),
               "local": dt.datetime(2026, 1, 2, 3, 4, 5), "doc": '{"k":[1,"x"]}', "tags": ["a", None, "b c"],
               "nums": [1, 2], "raw": b"\x00\xff", "big": "t" * 30000, "note": "n1"}
        assert first[1] == one
        two = first[2]
        assert (two["bal"], two["ok"], two["day"], two["tags"], two["at"]) == (Decimal("-3.25"), False, None, [], None)
        assert two["score"] != two["score"]  # NaN
        assert first[3]["free"] == "123456789012345678901234567890.5" and first[3]["doc"] == "[]"
        assert first[3]["bal"] is None and first[3]["note"] == "n3" and set(first) == {1, 2, 3}

        later = typed(spark, config, 2_000, "SELECT id, bal, note, big, ok, tags, raw, at FROM bank_acct")
        assert set(later) == {1, 3, 4}
        assert later[1] == {"id": 1, "bal": Decimal("11.75"), "note": None, "big": "t" * 30000, "ok": True,
                            "tags": ["a", None, "b c"], "raw": b"\x00\xff",
                            "at": dt.datetime(2026, 1, 2, 1, 4, 5, 500000)}
        assert (later[3]["ok"], later[3]["tags"]) == (True, ["z"])
        assert later[4] == {"id": 4, "bal": Decimal("4.00"), "note": None, "big": None, "ok": None, "tags": None,
                            "raw": b"\n", "at": dt.datetime(2026, 11, 25)}
        assert typed(spark, config, 1_000, "SELECT id, bal FROM bank_acct") == \
            {i: {"id": i, "bal": r["bal"]} for i, r in first.items()}  # earlier times unchanged
        register_as_of(spark, 2_000, ["bank"], config)  # the untyped view still holds table and row
        assert {json.loads(r["row"])["id"] for r in spark.table("bank").collect()} == {1, 3, 4}


def test_added_column_is_followed_and_a_dropped_or_filled_one_stops_the_source(spark, pg_cluster, tmp_path):
    with fresh_database(pg_cluster, "CREATE TABLE t (id int PRIMARY KEY, v text)",
                        "INSERT INTO t VALUES (1, 'a'), (2, 'b')") as dsn:
        config = write_sources_config(tmp_path, ("src", "postgres", {"dsn": dsn, "slot": "s_t", "tables": ["t"]}),
                                      retention_ms=10**9)
        pipeline.run_once("src", config, spark, now=1_000)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("ALTER TABLE t ADD COLUMN extra int")
            c.execute("UPDATE t SET v = 'a2' WHERE id = 1")  # a row from before the column: retracted exactly
            c.execute("INSERT INTO t VALUES (3, 'c', 7)")
            c.execute("UPDATE t SET extra = 5 WHERE id = 2")
        pipeline.run_once("src", config, spark, now=2_000)  # staged, checked (consolidates) and published
        sql = "SELECT id, v, extra FROM src_t"
        assert typed_rows(spark, config, 1_000, "SELECT * FROM src_t") == {(1, "a"), (2, "b")}  # before the column
        assert typed_rows(spark, config, 2_000, sql) == {(1, "a2", None), (2, "b", 5), (3, "c", 7)}
        assert dict(spark.table("src_t").dtypes)["extra"] == "int"

        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("ALTER TABLE t ADD COLUMN filled int DEFAULT 1")  # rows 1-3 now hold 1: no change says so
            c.execute("UPDATE t SET v = 'b2' WHERE id = 2")
            c.execute("ALTER TABLE t DROP COLUMN extra")
            lsn = c.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]
            c.execute("UPDATE t SET v = 'c2' WHERE id = 3")
        pipeline.tick("src", config, now=3_000, spark=spark)
        with pytest.raises(SourceError) as refused:
            pipeline.stage("src", config, spark)
        message = str(refused.value)
        assert message.startswith("src (") and "public.t: column 'extra' was dropped at commit LSN" in message, message
        assert "public.t: column 'filled' was added at commit LSN" in message and "with a default" in message
        at = re.search(r"was dropped at commit LSN ([0-9A-F]+/[0-9A-F]+)", message)[1]
        assert lsn_to_int(at) >= lsn_to_int(lsn), (at, lsn)
        assert "nothing staged" in message and "reclock new-epoch <source> --drop-slot" in message, message
        with runtime.open_source("src", config, connect=False) as ctx:
            assert ctx.tables.reclocked_upper() == 2_001  # nothing after the drop was published
        assert typed_rows(spark, config, 2_000, sql) == {(1, "a2", None), (2, "b", 5), (3, "c", 7)}

        # the documented recovery: a new epoch from a fresh snapshot, the tables as they are now
        with pytest.raises(SourceError, match="slot still exists.*--drop-slot"):
            epochs.new_epoch("src", config, spark)
        epoch = epochs.new_epoch("src", config, spark, drop_slot=True)
        assert epoch["epoch"] == 1 and epoch["began_at"] == 3_001, epoch
        pipeline.run_once("src", config, spark, now=4_000)
        now = "SELECT id, v, filled FROM src_t"
        assert typed_rows(spark, config, 4_000, now) == {(1, "a2", 1), (2, "b2", 1), (3, "c2", 1)}
        assert "extra" not in dict(spark.table("src_t").dtypes)  # the columns then; earlier times keep theirs:
        assert typed_rows(spark, config, 2_000, "SELECT * FROM src_t") == {(1, "a2", None), (2, "b", 5), (3, "c", 7)}
        assert spark.table("src_t").columns == ["id", "v", "extra"]
        with runtime.open_source("src", config, connect=False) as ctx:  # one typed table, every column it had
            assert ctx.tables.typed_tables() == ["public.t"]
            assert ctx.tables.typed_schema("public.t").names == ["id", "v", "_into_time", "_diff", "extra", "filled"]
        assert {json.loads(r["row"])["id"]: json.loads(r["row"]).get("extra") for r in spark.table("src").collect()} \
            == {1: None, 2: 5, 3: 7}
        assert typed_rows(spark, config, 1_000, "SELECT * FROM src_t") == {(1, "a"), (2, "b")}  # before ADD COLUMN
        assert spark.table("src_t").columns == ["id", "v"]
        for t in (1_000, 2_000, 3_000, 4_000):  # the JVM-free query's typed views: the same rows and columns
            as_of_views(spark, t, ["src"], config)
        with psycopg.connect(dsn, autocommit=True) as c:  # and the new slot goes on
            c.execute("UPDATE t SET filled = 9 WHERE id = 1")
        pipeline.run_once("src", config, spark, now=5_000)
        assert typed_rows(spark, config, 5_000, now) == {(1, "a2", 9), (2, "b2", 1), (3, "c2", 1)}


@contextmanager
def killed_at_the_typed_frontier():
    """A typing that dies after its typed tables' commits, before the typed frontier's (reclock.points)."""
    from reclock import points

    class Killer:
        def reached(self, point):
            pass

        @contextmanager
        def commit(self, name, uri):
            if name == "reclock.typed" and uri.rstrip("/").endswith("/reclocked"):
                raise RuntimeError(f"killed before the commit of {name} to {uri}")
            yield

    killer = Killer()
    points.observe(killer)
    try:
        yield
    finally:
        points._observers.remove(killer)


def typed_rows(spark, config, t, sql):
    register_as_of(spark, t, ["src"], config)
    return {tuple(r) for r in spark.sql(sql).collect()}


def test_typed_tables_of_an_old_warehouse_folded_and_rewritten_after_a_retype(spark, pg_cluster, tmp_path,
                                                                              monkeypatch):
    """A warehouse from before typed tables gets them at its next publish; compaction waits for them and folds
    them; a column retyped in a new epoch rewrites its typed table with the column as text at every time."""
    with fresh_database(pg_cluster, "CREATE TABLE t (id int PRIMARY KEY, v int)",
                        "INSERT INTO t VALUES (1, 10), (2, 20)") as dsn:
        config = write_sources_config(tmp_path, ("src", "postgres", {"dsn": dsn, "slot": "s_t", "tables": ["t"]}),
                                      retention_ms=1_000)
        monkeypatch.setattr(pipeline, "type_published", lambda name, ctx: {})  # as published before typed tables
        pipeline.run_once("src", config, spark, now=1_000)
        with psycopg.connect(dsn, autocommit=True) as c:
            for _ in range(3):
                c.execute("UPDATE t SET v = v + 1")
        assert not pipeline.run_once("src", config, spark, now=2_000)["compact"]["compacted"]  # waits for typing
        with runtime.open_source("src", config, connect=False) as ctx:
            assert (ctx.tables.typed_tables(), ctx.tables.typed_frontier(), ctx.tables.since()) == ([], -1, 0)
        monkeypatch.undo()

        typed = pipeline.publish("src", config, spark)["typed"]  # nothing to publish: the published rows typed
        assert typed == {"typed_upto": 2_000, "rows": {"public.t": 2 + 3 * 2 * 2}}, typed
        assert typed_rows(spark, config, 1_000, "SELECT * FROM src_t") == {(1, 10), (2, 20)}
        assert typed_rows(spark, config, 2_000, "SELECT * FROM src_t") == {(1, 13), (2, 23)}

        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("UPDATE t SET v = v + 1 WHERE id = 1")
        with pytest.raises(RuntimeError, match="killed"), killed_at_the_typed_frontier():  # the table typed, not
            pipeline.run_once("src", config, spark, now=3_000)                           # the frontier
        assert pipeline.publish("src", config, spark)["typed"] == {"typed_upto": 3_000, "rows": {}}  # none twice
        done = pipeline.compact("src", config, now=3_000, spark=spark)
        assert done["since"] == 2_000 and done["typed_folded"] == ["public.t"], done
        with runtime.open_source("src", config, connect=False) as ctx:  # at since: the rows then, once each
            rows = ctx.tables.typed_table("public.t").to_pyarrow_table().to_pylist()
        assert sorted((r["id"], r["v"], r["_into_time"], r["_diff"]) for r in rows if r["_into_time"] <= 2_000) == \
            [(1, 13, 2_000, 1), (2, 23, 2_000, 1)]
        assert typed_rows(spark, config, 3_000, "SELECT * FROM src_t") == {(1, 14), (2, 23)}
        as_of_views(spark, 2_000, ["src"], config)

        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("ALTER TABLE t ALTER COLUMN v TYPE text USING 'v' || v")
            c.execute("UPDATE t SET v = v || '!' WHERE id = 2")
        pipeline.tick("src", config, now=4_000, spark=spark)
        with pytest.raises(SourceError, match="column 'v' was retyped"):
            pipeline.stage("src", config, spark)
        epochs.new_epoch("src", config, spark, drop_slot=True)
        pipeline.run_once("src", config, spark, now=5_000)
        assert typed_rows(spark, config, 5_000, "SELECT * FROM src_t") == {(1, "v14"), (2, "v23!")}
        assert typed_rows(spark, config, 4_000, "SELECT * FROM src_t") == {(1, "14"), (2, "23")}  # text at every time
        for t in (4_000, 5_000):
            as_of_views(spark, t, ["src"], config)
        with runtime.open_source("src", config, connect=False) as ctx:
            assert ctx.tables.typed_schema("public.t").field("v").type == "string"


def test_a_backfill_repair_rewrites_the_typed_rows_of_its_window(spark, pg_cluster, tmp_path):
    from pyspark.sql import functions as F

    from reclock.backfill import replay
    from reclock.typed_tables import retype_window

    with fresh_database(pg_cluster, "CREATE TABLE t (id int PRIMARY KEY, v int)", "INSERT INTO t VALUES (1, 10)") as dsn:
        config = write_sources_config(tmp_path, ("src", "postgres", {"dsn": dsn, "slot": "s_t", "tables": ["t"]}),
                                      retention_ms=10**9)
        pipeline.run_once("src", config, spark, now=1_000)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("INSERT INTO t VALUES (2, 20), (3, 30)")
            c.execute("ALTER TABLE t ADD COLUMN w text")
            c.execute("INSERT INTO t VALUES (4, 40, 'x')")
        pipeline.run_once("src", config, spark, now=2_000, steps=("tick", "stage", "check", "publish"))  # held
        assert typed_rows(spark, config, 2_000, "SELECT * FROM src_t") == {(1, 10, None), (2, 20, None),
                                                                          (3, 30, None), (4, 40, "x")}
        with runtime.open_source("src", config, connect=False, spark=spark) as ctx:  # a row lost from the window
            window = ctx.tables.read_reclocked_spark().where(F.col("into_time") == 2_000)
            ctx.tables.replace_reclocked(window.where(~F.col("row").contains('"id":3')), 2_000, 2_000)
            retype_window(ctx, 2_000, 2_000)
        assert typed_rows(spark, config, 2_000, "SELECT id FROM src_t") == {(1,), (2,), (4,)}
        repaired = replay("src", config, 2_000, 2_000, spark, mode="repair")
        assert repaired["repaired"] and repaired["equal"], repaired
        assert typed_rows(spark, config, 2_000, "SELECT * FROM src_t") == {(1, 10, None), (2, 20, None),
                                                                          (3, 30, None), (4, 40, "x")}
        as_of_views(spark, 2_000, ["src"], config)
