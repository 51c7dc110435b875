"""Delta Lake warehouse: real tables on disk, written by delta-spark, read by Spark and by deltalake.

Every write goes through the session-scoped ``spark`` fixture of conftest.py (a module-scoped
one here would stop the shared getOrCreate session under other modules); without a session
the tables are read-only (the light ``deltalake`` reader).  Batches are staged with pyarrow as a
completed Spark job would (conftest ``stage_parquet``) unless a test is about Spark's own staging.
Delta operations take seconds each, so the published history the compaction tests start from
is built once per module and copied for each test.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pytest
from conftest import stage_parquet
from deltalake import DeltaTable, write_deltalake
from hypothesis import example, given, settings
from hypothesis import strategies as st

from reclock import storage
from reclock.storage.files import files_with_rows, parquet_stats
from reclock.storage.rewrites import covering
from reclock.engine import Frontier, Increment, Remap, Update, as_of, compact_updates, reclock
from reclock.storage import (KINDS, RECLOCKED_APP, REMAP_APP, SINCE_APP, SUCCESS, UpstreamRecord, Warehouse,
                               WarehouseError, vacuum_due)

DATA = pa.schema([("value", pa.string())])


@pytest.fixture
def tables(tmp_path, spark):
    return Warehouse(str(tmp_path / "warehouse")).source("orders", pa.int32(), DATA, spark=spark)


def ticks(remap: Remap, *bindings: tuple[int, dict]) -> list[Remap]:
    """``remap`` followed by the remaps minted by each ``(into_time, {partition: upper})`` tick."""
    out = [remap]
    for into_time, uppers in bindings:
        out.append(out[-1].mint(into_time, Frontier.of(uppers)))
    return out


def store(tables, remaps: list[Remap]) -> Remap:
    for before, after in zip(remaps, remaps[1:]):
        assert tables.append_binding(before, after)
    return remaps[-1]


def as_rows(reclocked) -> list[dict]:
    return [{"value": d, "partition": p, "offset": o, "into_time": t, "diff": diff} for d, p, o, t, diff in reclocked]


def rows_of(table: pa.Table) -> Counter:
    return Counter(tuple(r.values()) for r in table.to_pylist())


def spark_rows(df) -> Counter:
    return Counter(tuple(r) for r in df.collect())


def reclocked_frame(spark, tables, rows: list[dict]):
    """A Spark DataFrame of reclocked rows, in two partitions (so Spark writes several files)."""
    schema = tables.spark_schema("reclocked")
    return spark.createDataFrame([tuple(r.values()) for r in rows], schema).repartition(2)


def operations_after(tables, kind, version: int) -> list[str]:
    """The Delta operations committed to the table after ``version``, oldest first."""
    return [c["operation"] for c in sorted(tables.table(kind).history(), key=lambda c: c["version"])
            if c["version"] > version]


# --- 1. Spark stages, publish appends in one idempotent commit ---------------------------------


@pytest.mark.slow
def test_spark_staged_files_publish_in_one_commit(spark, tables):
    remap = store(tables, ticks(Remap(), (10, {0: 2}), (11, {0: 3, 1: 1})))
    updates = [Update("a", 0, 0), Update("b", 0, 1), Update("c", 0, 2), Update("d", 1, 0), Update("late", 1, 5)]
    expected = as_rows(reclock(updates, remap))
    assert tables.stage(reclocked_frame(spark, tables, expected), 11) == 4
    assert rows_of(pa.Table.from_pandas(tables.read_staged(11))) == rows_of(pa.Table.from_pylist(expected))
    version = tables.version("reclocked")
    staged = f"{tables.uri}/reclocked/staged"  # in the table's directory, not in its log
    written = {n for _, _, names in os.walk(f"{staged}/upto=11") for n in names if n.endswith(".parquet")}
    assert written

    assert tables.publish_staged(11)

    dt = DeltaTable(tables.table_uri("reclocked"))
    assert dt.version() == version + 1  # one commit
    (commit,) = dt.history(1)
    assert commit["operation"] == "WRITE" and commit["operationParameters"]["mode"] == "Append"
    assert dt.transaction_version(RECLOCKED_APP) == 11  # the app transaction commits with the rows
    assert rows_of(dt.to_pyarrow_table()) == rows_of(pa.Table.from_pylist(expected))
    assert dt.count() == len(expected) == 4  # "late" is beyond the frontier; numRecords stats are right
    snapshot = spark.read.parquet(*tables.snapshot_files("reclocked")).select(*tables.schemas["reclocked"].names)
    assert spark_rows(snapshot) == rows_of(pa.Table.from_pylist(expected))  # the snapshot's files, read by Spark
    assert spark_rows(tables.read_reclocked_spark(spark)) == rows_of(pa.Table.from_pylist(expected))
    assert tables.reclocked_upper() == 12
    # the staged files are the table's files now: committed as they are, not copied; the rest of the attempt goes
    assert {unquote(os.path.basename(f)) for f in dt.file_uris()} == written
    assert {n for _, _, names in os.walk(staged) for n in names if not n.endswith(".crc")} == written

    assert not tables.publish_staged(11)  # idempotent: already published
    assert tables.stage(reclocked_frame(spark, tables, expected), 11) == 0  # nothing staged again
    assert DeltaTable(tables.table_uri("reclocked")).version() == version + 1


@pytest.mark.slow
def test_spark_reads_empty_table_with_schema(spark, tables):
    df = tables.read_reclocked_spark(spark)
    assert df.columns == ["value", "partition", "offset", "into_time", "diff"]
    assert df.count() == 0


# --- 2. remap: append_binding, read_remap, since ---------------------------------------------


def test_append_binding_is_idempotent_and_round_trips(tables):
    remaps = ticks(Remap(), (5, {0: 3}), (7, {0: 3, 1: 2}), (9, {0: 3, 1: 2}))  # last tick does not move
    assert tables.version("remap") == 0  # delta-spark's CREATE TABLE
    remap = store(tables, remaps)
    assert tables.version("remap") == 3  # one commit per tick, even the empty one
    assert operations_after(tables, "remap", 0) == ["WRITE"] * 3
    assert not tables.append_binding(remaps[-2], remaps[-1])  # same tick twice
    assert not tables.append_binding(remaps[0], remaps[1])
    # Delta's idempotent write: an append at a txnVersion not above the stored one is skipped
    stale = tables._remap_rows(remaps[1].increments())
    assert not storage.append_rows(tables.table("remap"), stale, REMAP_APP, 5)
    assert tables.version("remap") == 3
    stored = tables.read_remap()
    assert stored == remap and stored.upper == 10 and tables.remap_upper() == 10
    assert rows_of(tables._read("remap")) == Counter(tuple(r) for r in remap.increments())


def test_append_binding_refuses_a_gap(tables):
    remaps = ticks(Remap(), (5, {0: 3}), (7, {0: 4}))
    with pytest.raises(WarehouseError, match="stored remap of .* has upper 0"):
        tables.append_binding(remaps[1], remaps[2])
    assert tables.read_remap() == Remap() and tables.version("remap") == 0


def test_tables_reopen_with_same_state_and_check_schema(tmp_path, spark):
    wh = Warehouse(str(tmp_path / "w"))
    first = wh.source("s", pa.string(), DATA, spark=spark)
    remaps = ticks(Remap(), (3, {"a": 1}), (4, {"a": 2}))
    remap = store(first, remaps[:2])
    again = Warehouse(str(tmp_path / "w")).source("s", pa.string(), DATA)  # no Spark: the light reader
    assert again.read_remap() == remap and again.since() == 0 and again.reclocked_upper() == 0
    with pytest.raises(WarehouseError, match="needs a Spark session"):  # what Spark writes, refused without one
        again.spark
    assert again.upstream_record() is None
    again.record_upstream(UpstreamRecord(Frontier.of({"a": 0}), None))  # a delta-rs commit: no Spark
    assert again.upstream_record() == UpstreamRecord(Frontier.of({"a": 0}), None)
    assert again.append_binding(remaps[1], remaps[2])  # a tick's binding needs no Spark: delta-rs commits it
    assert again.remap_upper() == 5 and again.read_remap() == remaps[2]
    with pytest.raises(WarehouseError, match="partition: string"):
        wh.source("s", pa.int32(), DATA)
    with pytest.raises(WarehouseError, match="partition: string"):
        wh.source("s", pa.int32(), DATA, spark=spark)  # not created over, either
    missing = wh.source("never", pa.int32(), DATA)  # without Spark, missing tables read as empty
    assert missing.read_remap() == Remap() and missing.reclocked_upper() == 0 and missing.version("remap") == -1
    assert missing.read_reclocked_arrow().num_rows == 0 and not os.path.exists(tmp_path / "w" / "never")


@settings(max_examples=5, deadline=None)  # every example creates its tables with Spark: few, small examples
@given(st.lists(st.tuples(st.integers(1, 3), st.dictionaries(st.sampled_from([0, 1, 2]), st.integers(0, 2))),
                max_size=4))
@example([(1, {0: 2}), (2, {}), (1, {1: 1, 2: 0}), (3, {0: 1, 2: 2})])  # an empty tick, a partition at 0
def test_read_remap_round_trips_any_ticks(spark, steps):
    remaps, into_time, frontier = [Remap()], 0, Frontier()
    for gap, growth in steps:
        into_time += gap
        frontier = frontier.advanced_by(growth)
        remaps.append(remaps[-1].mint(into_time, frontier))
    with tempfile.TemporaryDirectory() as root:
        tables = Warehouse(root).source("s", pa.int32(), DATA, spark=spark)
        store(tables, remaps)
        assert tables.read_remap() == remaps[-1]
        assert Warehouse(root).source("s", pa.int32(), DATA).read_remap() == remaps[-1]  # reopened, no Spark


# --- publishing checks (no Spark job reads a refused file) -----------------------------------------


def test_publish_refuses_wrong_schema_incomplete_or_out_of_range_files(tables):
    store(tables, ticks(Remap(), (10, {0: 1}), (20, {0: 2})))
    with pytest.raises(WarehouseError, match="no complete staged attempt"):
        tables.publish_staged(10)
    wrong = pa.schema([("value", pa.string()), ("partition", pa.int64()), ("offset", pa.int64()),
                       ("into_time", pa.int64()), ("extra", pa.int64())])
    stage_parquet(tables, 10, [{"value": "a", "partition": 0, "offset": 0, "into_time": 10, "extra": 1}], wrong)
    with pytest.raises(WarehouseError, match=r"missing \['diff'\]; unexpected \['extra'\]; partition: int64"):
        tables.publish_staged(10)
    stage_parquet(tables, 10, as_rows([("b", 0, 1, 20, 1)]))
    with pytest.raises(WarehouseError, match=r"IntoTimes \[20, 20\] outside \[0, 10\]"):
        tables.publish_staged(10)
    with pytest.raises(WarehouseError, match="remap upper is 21"):
        tables.publish_staged(21)
    assert tables.version("reclocked") == 0 and tables.reclocked_upper() == 0


def test_publish_of_an_empty_tick_records_the_upper(tables):
    store(tables, ticks(Remap(), (10, {}), (11, {})))
    directory = tables.staging_dir(11)
    os.makedirs(directory)
    open(f"{directory}/{SUCCESS}", "w").close()
    assert tables.publish_staged(11)
    assert tables.reclocked_upper() == 12 and tables.read_reclocked_arrow().num_rows == 0
    assert tables.version("reclocked") == 1  # the upper commits alone, with no rows


def test_a_batch_without_rows_commits_its_upper_and_no_file(tables):
    """After published rows, a staged batch whose files hold none commits the app transaction alone: no file is added
    (the staged empty one is removed with its attempt), and the window is published once."""
    store(tables, ticks(Remap(), (10, {0: 1}), (11, {0: 1})))
    stage_parquet(tables, 10, as_rows([("a", 0, 0, 10, 1)]))
    assert tables.publish_staged(10)
    files, version = tables.snapshot_files("reclocked"), tables.version("reclocked")
    stage_parquet(tables, 11, [])
    assert tables.publish_staged(11)
    assert tables.reclocked_upper() == 12 and tables.read_reclocked_arrow().num_rows == 1
    assert tables.version("reclocked") == version + 1 and tables.snapshot_files("reclocked") == files
    assert not [name for _, _, names in os.walk(f"{tables.uri}/reclocked/staged/upto=11") for name in names]
    assert not tables.publish_staged(11)


def test_published_file_statistics_keep_strings_only_short_and_ascii(tmp_path):
    """A published file's Delta statistics come from its footer: exact int bounds and null counts; a string's
    bounds only when both are ASCII of at most ``STATS_STRING_CHARS`` (a reader skips files by them, so a bound
    must order as Delta orders strings; a missing one only skips nothing)."""
    import pyarrow.parquet as pq

    long = "x" * (storage.STATS_STRING_CHARS + 1)
    table = pa.table({"n": pa.array([3, None, -7], pa.int64()), "short": ["b", None, "a"],
                      "long": ["a", long, "b"], "accent": ["é", "a", "b"]})
    pq.write_table(table, tmp_path / "f.parquet", row_group_size=2)  # bounds over two row groups
    stats = parquet_stats(pq.read_metadata(tmp_path / "f.parquet"), storage.STATS_STRING_CHARS)
    assert stats == {"numRecords": 3, "minValues": {"n": -7, "short": "a"}, "maxValues": {"n": 3, "short": "b"},
                     "nullCount": {"n": 1, "short": 1, "long": 0, "accent": 0}}


# --- 3. compaction ---------------------------------------------------------------------------


def build_history(tables) -> tuple[Remap, list]:
    """Four ticks; updates with a retraction so consolidation has zeros to drop; published per tick."""
    remaps = ticks(Remap(), (10, {0: 2}), (20, {0: 3, 1: 1}), (30, {0: 3, 1: 1}), (40, {0: 5, 1: 2}))
    updates = [Update("a", 0, 0), Update("b", 0, 1), Update("b", 0, 2, -1), Update("c", 1, 0),
               Update("d", 0, 3), Update("e", 0, 4), Update("f", 1, 1)]
    remap = store(tables, remaps)
    published = []
    for upto in (10, 20, 30, 40):
        batch = [r for r in reclock(updates, remap) if upto - 10 < r.into_time <= upto]
        stage_parquet(tables, upto, as_rows(batch))
        assert tables.publish_staged(upto)
        published += batch
    return remap, published


@pytest.fixture(scope="module")
def built_history(tmp_path_factory, spark):
    """One warehouse with :func:`build_history` published (versions: remap 0-4, reclocked 0-4)."""
    root = tmp_path_factory.mktemp("history")
    remap, published = build_history(Warehouse(str(root)).source("orders", pa.int32(), DATA, spark=spark))
    return root, remap, published


@pytest.fixture
def history(built_history, tmp_path, spark):
    """A fresh copy of the built history: ``(tables, remap, published updates)``."""
    root, remap, published = built_history
    shutil.copytree(root, tmp_path / "warehouse")
    return Warehouse(str(tmp_path / "warehouse")).source("orders", pa.int32(), DATA, spark=spark), remap, published


@pytest.mark.parametrize("offsets_unique", [False, True])  # the history has one row per offset: the same result
def test_compact_preserves_queries_at_or_after_since(history, tmp_path, offsets_unique, monkeypatch):
    tables, remap, updates = history
    monkeypatch.setattr(storage.tables, "SMALL_FILES_MAX", 1)  # the few small files of the history are many
    before = tables.read_reclocked_arrow().to_pylist()
    first_files = tables.snapshot_files("reclocked", 1)
    assert first_files and all(os.path.exists(f) for f in first_files)

    tables.compact(25, retention_hours=0, offsets_unique=offsets_unique)  # vacuum at once: the replaced files go

    assert tables.since() == 25
    assert tables.read_remap() == remap.compact(25)
    assert tables.remap_upper() == 41 and tables.reclocked_upper() == 41
    after = [tuple(r.values()) for r in tables.read_reclocked_arrow().to_pylist()]
    for t in (25, 30, 39, 40):
        assert as_of(after, t) == as_of([tuple(r.values()) for r in before], t)
    assert Counter({r[:4]: r[4] for r in after}) == compact_updates(updates, 25)
    assert len({r[:4] for r in after}) == len(after) and all(r[4] for r in after)  # consolidated
    assert min(r[3] for r in after) == 25
    assert len(tables.snapshot_files("reclocked")) == 1  # optimized
    assert "OPTIMIZE" in operations_after(tables, "reclocked", 4)
    assert not any(os.path.exists(f) for f in first_files)  # vacuumed
    with pytest.raises(FileNotFoundError):
        tables.read_reclocked_arrow(version=1)

    versions = {k: tables.version(k) for k in KINDS}
    files = {k: sorted(tables.snapshot_files(k)) for k in KINDS}
    vacuums, vacuum = [], storage.commits.vacuum
    monkeypatch.setattr(storage.commits, "vacuum", lambda dt, hours: (vacuums.append(hours), vacuum(dt, hours)))
    tables.compact(10)  # below since: compacts to since (25) again, a rerun with nothing to do
    for kind in KINDS:  # no rows rewritten, and no VACUUM: each table was vacuumed under 168 h / 4 ago
        assert sorted(tables.snapshot_files(kind)) == files[kind]
        assert operations_after(tables, kind, versions[kind]) == []
    assert set(tables.vacuumed()) == set(KINDS) and vacuums == []
    (tmp_path / "warehouse" / "orders" / "vacuumed.json").write_text("{not json")  # unreadable: vacuum again
    tables.compact(10)
    assert vacuums == [168.0] * len(KINDS)
    for kind in KINDS:  # nothing old enough to delete: delta-rs's VACUUM commits nothing
        assert operations_after(tables, kind, versions[kind]) == []
    assert set(tables.vacuumed()) == set(KINDS)
    assert tables.read_remap() == remap.compact(25) and tables.since() == 25


def test_a_rewrite_reads_the_files_holding_rows_it_covers(tables):
    """A rewrite of ``low <= into_time <= high`` (compaction: no ``low``) reads and replaces the files whose
    statistics say they may hold such rows, not those wholly outside (from the Delta log)."""
    remap = store(tables, ticks(Remap(), (10, {0: 2}), (11, {0: 2}), (20, {0: 3})))
    for upto, rows in ((10, [("a", 0, 0), ("b", 0, 1)]), (11, []), (20, [("c", 0, 2)])):
        stage_parquet(tables, upto, as_rows((d, p, o, remap.into_time_of(p, o), 1) for d, p, o in rows))
        assert tables.publish_staged(upto)
    files = files_with_rows(tables.table("reclocked"))
    size = {f["max.into_time"]: f["size_bytes"] for f in files.to_pylist()}
    assert set(size) == {10, 20}
    covered = {(low, high): sorted(covering(files, "into_time", low, high)["size_bytes"].to_pylist())
               for low, high in ((None, 9), (None, 10), (None, 15), (None, 20), (11, 19), (11, 20), (10, 10))}
    assert covered == {(None, 9): [], (None, 10): [size[10]], (None, 15): [size[10]],
                       (None, 20): sorted([size[10], size[20]]), (11, 19): [], (11, 20): [size[20]],
                       (10, 10): [size[10]]}


def test_compaction_optimizes_only_files_below_the_minimum(history, monkeypatch):
    """OPTIMIZE leaves files of ``OPTIMIZE_MIN_FILE_BYTES`` or more alone (here: every file): the files the
    consolidation just wrote are not rewritten a second time."""
    tables, remap, _ = history
    monkeypatch.setattr(storage.tables, "OPTIMIZE_MIN_FILE_BYTES", 1)
    version, files = tables.version("reclocked"), tables.snapshot_files("reclocked")
    tables.compact(25)
    assert tables.read_remap() == remap.compact(25)
    assert operations_after(tables, "reclocked", version) == ["WRITE"]  # no OPTIMIZE (nor files old enough to VACUUM)
    after = tables.snapshot_files("reclocked")
    assert len(set(after) - set(files)) == 1  # the rows at or before 25, in one file; the others' files as they were
    assert len(after) < len(files)


def test_compaction_with_few_small_files_runs_no_optimize(history):
    """Up to ``SMALL_FILES_MAX`` small files (here 2 after the rewrite) are left as they are: no OPTIMIZE, whose
    Spark jobs take seconds even when they merge nothing."""
    tables, remap, _ = history
    versions = {k: tables.version(k) for k in KINDS}
    tables.compact(25)
    assert tables.read_remap() == remap.compact(25)
    assert operations_after(tables, "reclocked", versions["reclocked"]) == ["WRITE"]  # the rewrite alone
    assert "OPTIMIZE" not in operations_after(tables, "remap", versions["remap"])
    assert len(tables.snapshot_files("reclocked")) == 2  # the rows at or before 25; the publish of 40 (30's was empty)


H = 3_600_000  # an hour in ms


@pytest.mark.parametrize("last, now, hours, due", [
    (None, 0, 168, True),  # never vacuumed
    (0, 42 * H - 1, 168, False),  # within a quarter of the retention
    (0, 42 * H, 168, True),
    (0, 1, 0, True),  # forced: retention 0, every compaction
    (0, 15 * 60_000 - 1, 0.01, False),  # Delta keeps whole hours: 0.01 h is 1 h, a quarter 15 min
    (0, 15 * 60_000, 0.01, True),
    (10 * H, 9 * H, 168, True),  # the clock stepped back: not trusted
])
def test_vacuum_is_due_a_quarter_of_its_retention_after_the_last(last, now, hours, due):
    assert vacuum_due(last, now, hours) is due


def age_removals(table: Path, hours: float) -> list[Path]:
    """Make the files a Delta table's commits removed look removed, and written, ``hours`` ago: their
    tombstones' ``deletionTimestamp`` in its JSON commits (checkpoints and checksums dropped, so the log is
    read from those) and their mtimes; the files."""
    then = time.time() - hours * 3600
    log = table / "_delta_log"
    for f in log.iterdir():
        if f.suffix == ".crc" or "checkpoint" in f.name:
            f.unlink()
    removed = []
    for commit in sorted(log.glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines() if line]
        for action in actions:
            if "remove" in action:
                action["remove"]["deletionTimestamp"] = int(then * 1000)
                removed.append(table / unquote(action["remove"]["path"]))
        commit.write_text("".join(json.dumps(a) + "\n" for a in actions))
    for path in removed:
        os.utime(path, (then, then))
    return removed


def test_vacuum_deletes_files_removed_longer_ago_than_the_retention_it_is_given(history, tmp_path, spark):
    """The source's ``vacuum_retention_hours`` is the retention VACUUM keeps: Delta 4 ignores ``RETAIN n
    HOURS`` other than 0 (for its table property, 7 days by default) unless told not to."""
    tables, _, _ = history
    assert tables._consolidate_reclocked(25)  # replaces the files of the rows at or before 25
    shutil.copytree(tables.uri, tmp_path / "aged" / "orders")  # a path the session has not read: a fresh log
    aged = Warehouse(str(tmp_path / "aged")).source("orders", pa.int32(), DATA, spark=spark)
    removed = age_removals(Path(aged.table_uri("reclocked")), hours=2)
    assert removed and all(p.exists() for p in removed)
    aged._vacuum("reclocked", 3)
    assert all(p.exists() for p in removed)  # removed 2 h ago: kept 3 h
    aged._vacuum("reclocked", 1)
    assert not any(p.exists() for p in removed)  # kept 1 h: deleted, not kept 7 days
    assert aged.read_reclocked_arrow().num_rows == tables.read_reclocked_arrow().num_rows


def test_compact_resumes_after_a_crash_after_recording_since(history):
    tables, remap, updates = history
    storage.commits.commit_added(tables.table("remap"), [], SINCE_APP, 25)  # step 1 only
    assert tables.read_remap() == remap.compact(25)  # readers already see the compacted remap
    tables.compact(25, retention_hours=0)  # vacuum at once: the replaced files go
    assert tables.read_remap() == remap.compact(25)
    after = [tuple(r.values()) for r in tables.read_reclocked_arrow().to_pylist()]
    assert Counter({r[:4]: r[4] for r in after}) == compact_updates(updates, 25)


def test_compact_refuses_unpublished_times(history):
    tables, _, _ = history
    with pytest.raises(WarehouseError, match="published only below 41"):
        tables.compact(41)
    assert tables.since() == 0 and tables.version("remap") == 4


# --- 4. a Spark job killed before publishing ------------------------------------------------


@pytest.mark.slow
def test_staged_but_unpublished_files_leave_the_table_unchanged(spark, tables):
    remap = store(tables, ticks(Remap(), (10, {0: 2})))
    rows = as_rows(reclock([Update("a", 0, 0), Update("b", 0, 1)], remap))
    crashed = tables.staging_dir(10)
    reclocked_frame(spark, tables, rows).write.parquet(crashed)
    os.remove(f"{crashed}/{SUCCESS}")  # killed before the job committed
    assert tables.version("reclocked") == 0 and tables.reclocked_upper() == 0
    assert tables.snapshot_files("reclocked") == [] and tables.read_reclocked_spark(spark).count() == 0
    with pytest.raises(WarehouseError, match="no complete staged attempt"):
        tables.publish_staged(10)  # an incomplete attempt is never published

    assert tables.stage(reclocked_frame(spark, tables, rows), 10) == 2  # the rerun stages a fresh attempt
    assert tables.publish_staged(10)
    assert rows_of(tables.read_reclocked_arrow()) == rows_of(pa.Table.from_pylist(rows))  # no duplicates
    assert not [name for _, _, names in os.walk(crashed) for name in names]  # the unpublished attempt is deleted


def test_many_ticks_keep_the_remap_table_small(tables, monkeypatch):
    monkeypatch.setattr(storage.tables, "SMALL_FILES_MAX", 3)  # small, so that a few ticks (commits) exceed it
    remaps = ticks(Remap(), *[(t, {0: t, 1: 2 * t}) for t in range(1, 5)])
    for before, after in zip(remaps, remaps[1:]):
        assert tables.append_binding(before, after)
        assert len(tables.table("remap").file_uris()) <= 3
    assert "OPTIMIZE" in operations_after(tables, "remap", 0)  # the files were merged, not just few
    assert tables.read_remap() == remaps[-1]


# --- 5. delta-spark and deltalake read what delta-rs wrote ------------------------------------------


@pytest.mark.slow
def test_delta_spark_and_deltalake_read_the_same_tables(spark, history):
    """Appends with app transactions, a compaction (rewrites, OPTIMIZE, VACUUM), a backfill repair and checkpoints
    (every other version here): delta-spark and deltalake see the same rows, versions and app transactions."""
    tables, remap, updates = history
    for kind in KINDS:  # checkpoint every other commit, so the reader meets Spark's checkpoints too
        spark.sql(f"ALTER TABLE delta.`{tables.spark_uri(kind)}` SET TBLPROPERTIES ('delta.checkpointInterval' = '2')")
    tables.compact(25, retention_hours=0)  # vacuum at once: the replaced files go
    at_40 = [r for r in tables.read_reclocked_arrow().to_pylist() if r["into_time"] == 40]
    repaired = [{**r, "value": r["value"] + "*"} for r in at_40[1:]]  # one row fewer, the others changed
    replaced_at = tables.version("reclocked")
    assert tables.replace_reclocked(reclocked_frame(spark, tables, repaired), 40, 40) == len(repaired)

    from delta.tables import DeltaTable as SparkDeltaTable

    for kind in KINDS:
        dt = DeltaTable(tables.table_uri(kind))
        assert dt.version() == SparkDeltaTable.forPath(spark, tables.spark_uri(kind)).history(1).first().version
        names = tables.schemas[kind].names
        assert rows_of(dt.to_pyarrow_table().select(names)) == spark_rows(tables.read_spark(kind))
        assert any(f.endswith(".checkpoint.parquet") for f in os.listdir(f"{tables.table_uri(kind)}/_delta_log"))
    # time travel to before the repair: the same rows through both readers
    assert rows_of(tables.read_reclocked_arrow(replaced_at)) == spark_rows(tables.read_spark("reclocked", replaced_at))
    assert rows_of(tables.read_reclocked_arrow()) == \
        rows_of(tables.read_reclocked_arrow(replaced_at)) - rows_of(pa.Table.from_pylist(at_40)) + \
        rows_of(pa.Table.from_pylist(repaired))
    # the app transactions, as the writes carried them (the repair carries none)
    remap_dt, reclocked_dt = DeltaTable(tables.table_uri("remap")), DeltaTable(tables.table_uri("reclocked"))
    assert remap_dt.transaction_version(REMAP_APP) == 40  # the last tick
    assert remap_dt.transaction_version(SINCE_APP) == 25
    assert reclocked_dt.transaction_version(RECLOCKED_APP) == 40  # the last publish, unchanged by the repair
    assert reclocked_dt.transaction_version("reclock.unknown") is None
    assert (tables.since(), tables.remap_upper(), tables.reclocked_upper()) == (25, 41, 41)
    assert tables.read_remap() == remap.compact(25)


# --- racing writers (issue 11, issue 37) -------------------------------------------------------


def test_append_binding_refuses_when_another_tick_stored_increments(tables):
    """Two ticks read the same remap; the second to commit writes nothing (it would count twice)."""
    base = store(tables, ticks(Remap(), (5, {0: 3})))
    first, second = base.mint(8, Frontier.of({0: 6})), base.mint(9, Frontier.of({0: 6}))
    assert tables.append_binding(base, first)
    with pytest.raises(storage.ConcurrentWriteError, match="another tick committed"):
        tables.append_binding(base, second)
    assert tables.read_remap() == first


@pytest.mark.parametrize("moved", [False, True], ids=["idle", "with-rows"])
def test_a_tick_commits_without_spark_and_loses_a_race_to_another_tick(tables, monkeypatch, moved):
    """A tick commits with delta-rs, no Spark write: an idle one (no new offsets) its app transaction and the
    upstream it saw alone, no file; one with rows its rows in one file.  Another tick committing while it runs
    (after it read remap) makes Delta refuse it: it writes nothing."""
    base = store(tables, ticks(Remap(), (5, {0: 3})))
    files, upstream = tables.snapshot_files("remap"), Frontier.of({0: 3 + moved})
    monkeypatch.setattr(tables, "_spark", lambda: pytest.fail("a tick ran Spark"))
    first, second = (base.mint(t, upstream) for t in (7, 8))
    remap_rows = tables._remap_rows

    def racing_rows(rows):  # the tick binding 7 commits while the one binding 8 prepares its commit
        monkeypatch.setattr(tables, "_remap_rows", remap_rows)
        assert tables.append_binding(base, first, upstream=upstream)
        return remap_rows(rows)

    monkeypatch.setattr(tables, "_remap_rows", racing_rows)
    with pytest.raises(storage.ConcurrentWriteError, match="another writer committed reclock.remap"):
        tables.append_binding(base, second, upstream=upstream)
    assert tables.remap_upper() == 8 and tables.read_remap() == first
    seen = upstream.join(Frontier.of({1: 2})) if moved else upstream
    later = first.mint(9, seen)
    assert tables.append_binding(first, later, upstream=seen)
    assert tables.remap_upper() == 10 and tables.read_remap() == later
    assert len(tables.snapshot_files("remap")) == len(files) + 2 * moved  # a file for each tick with rows
    assert {t: u for t, u in tables.recorded_upstreams().items() if t > 5} == {7: upstream, 9: seen}
    assert DeltaTable(tables.table_uri("remap")).transaction_version(REMAP_APP) == 9


def test_an_append_after_a_rewrite_removed_files_it_read_is_a_lost_race(tmp_path):
    """delta-rs refuses an append (even of no file: compaction's ``since``) whose read version had files another
    writer's rewrite removed since ("a concurrent transaction deleted data this operation read"): that is a
    ConcurrentWriteError, nothing committed, as every lost race (a raw CommitFailedError ended racing runs with a
    traceback in ``make soak --part runs``)."""
    from reclock.storage import commits

    rows = pa.table({"a": pa.array([1, 2, 3], pa.int64())})
    write_deltalake(str(tmp_path), rows)
    write_deltalake(str(tmp_path), rows, mode="append")
    read = DeltaTable(str(tmp_path))
    DeltaTable(str(tmp_path)).delete("a = 1")  # a rewrite: removes the files `read` holds
    with pytest.raises(storage.ConcurrentWriteError, match="another writer committed since this step read the table "
                                                           r"\(committing reclock.since = 5\); nothing written"):
        commits.commit_added(read, [], commits.SINCE_APP, 5)
    assert DeltaTable(str(tmp_path)).transaction_version(commits.SINCE_APP) is None


@pytest.mark.parametrize("racer", ["publish", "covered-rows", "rewrite"])
def test_a_rewrite_goes_on_over_commits_outside_it_and_loses_to_those_inside(history, monkeypatch, racer):
    """A compaction's rewrite of reclocked whose version another commit took meanwhile: over a commit that added
    no row it covers (a publish) it commits at the next version; a commit that added covered rows, or removed a
    file it read (another rewrite), refuses it: ConcurrentWriteError, nothing rewritten, its files deleted."""
    tables, _, updates = history
    replace = storage.commits.replace_files
    racing_row = {"value": "late", "partition": 0, "offset": 99, "into_time": 40 if racer == "publish" else 20,
                  "diff": 1}

    def racing(dt, *args, **kw):  # another writer commits between the rewrite's read and its commit
        monkeypatch.setattr(storage.commits, "replace_files", replace)
        if racer == "rewrite":
            tables.replace_reclocked(reclocked_frame(tables.spark, tables, []), 19, 20)
        else:
            assert storage.append_rows(tables.table("reclocked"), pa.Table.from_pylist(
                [racing_row], schema=tables.schemas["reclocked"]), "test.racer", 1)
        return replace(dt, *args, **kw)

    monkeypatch.setattr(storage.commits, "replace_files", racing)
    before = tables.version("reclocked")
    if racer == "publish":
        assert tables._consolidate_reclocked(25)
        assert tables.version("reclocked") == before + 2
        after = [tuple(r.values()) for r in tables.read_reclocked_arrow().to_pylist()]
        expected = compact_updates(updates, 25)
        expected[tuple(racing_row.values())[:4]] += 1
        assert Counter({r[:4]: r[4] for r in after}) == expected
    else:
        raced = tables.read_reclocked_arrow()
        with pytest.raises(storage.ConcurrentWriteError, match="another writer committed while compaction"):
            tables._consolidate_reclocked(25)
        assert tables.version("reclocked") == before + 1  # the racer's commit alone
        assert rows_of(tables.read_reclocked_arrow()) != rows_of(raced)  # the racer's rows, not rewritten
    rewritten = Path(tables.table_uri("reclocked")) / "rewritten"
    committed = {unquote(p) for p in DeltaTable(tables.table_uri("reclocked")).file_uris()}
    left = {str(p) for p in rewritten.rglob("*") if p.is_file() and p.suffix != ".crc"} if rewritten.exists() else set()
    assert left <= committed  # a refused rewrite's files are gone, a committed one's are the table's


def test_publish_refuses_a_window_another_publish_covered(tables, monkeypatch):
    store(tables, ticks(Remap(), (5, {0: 1}), (6, {0: 2})))
    row = {"value": "a", "partition": 0, "offset": 0, "into_time": 5, "diff": 1}
    stage_parquet(tables, 5, [row])
    stage_parquet(tables, 6, [row, {**row, "value": "b", "offset": 1, "into_time": 6}])
    check = tables._check_staged

    def racing_check(*args):  # a faster publish of [5, 5] commits while this one checks its files
        monkeypatch.setattr(tables, "_check_staged", check)
        assert tables.publish_staged(5)
        return check(*args)

    monkeypatch.setattr(tables, "_check_staged", racing_check)
    with pytest.raises(storage.ConcurrentWriteError):  # [5, 6] would publish offset 0 a second time
        tables.publish_staged(6)
    assert tables.reclocked_upper() == 6
    assert tables.read_reclocked_arrow().to_pylist() == [row]
    with pytest.raises(WarehouseError, match="outside"):  # the stale batch is refused; staging again mends it
        tables.publish_staged(6)


def test_a_publish_racing_a_rewrite_of_the_table_tries_again(tables, monkeypatch):
    """A rewrite of the reclocked table that changes data (a compaction's fold; here a delete) landing while a publish
    prepares its commit removes files of the version the publish read, and delta-rs refuses the commit: no publish
    landed, so the publish reads the table again and commits (the step failed on it before)."""
    store(tables, ticks(Remap(), (5, {0: 1}), (6, {0: 2}), (7, {0: 3})))
    rows = [{"value": v, "partition": 0, "offset": o, "into_time": t, "diff": 1} for v, o, t in
            [("a", 0, 5), ("b", 1, 6), ("c", 2, 7)]]
    for row in rows[:2]:
        stage_parquet(tables, row["into_time"], [row])
        assert tables.publish_staged(row["into_time"])
    stage_parquet(tables, 7, rows[2:])
    check, rewrites = tables._check_staged, []

    def racing_check(*args):  # a rewrite drops the file of "a" while this publish checks its own
        monkeypatch.setattr(tables, "_check_staged", check)
        rewrites.append(DeltaTable(tables.table_uri("reclocked")).delete("value = 'a'"))
        return check(*args)

    monkeypatch.setattr(tables, "_check_staged", racing_check)
    assert tables.publish_staged(7)
    assert rewrites[0]["num_removed_files"] == 1
    assert sorted(r["value"] for r in tables.read_reclocked_arrow().to_pylist()) == ["b", "c"]
    assert tables.reclocked_upper() == 8


@pytest.mark.parametrize("corruption, failing", [
    ("double-increment", ["remap.within_upstream"]),
    ("beyond-upstream", ["remap.within_upstream"]),
    # read as folded to since (a compaction killed before its remap rewrite leaves such rows), what it adds counts
    ("before-since", ["remap.within_upstream"]),
])
def test_the_remap_check_catches_corruption_injected_into_the_table(tables, corruption, failing):
    from reclock.checks import check_remap

    remaps = ticks(Remap(), (5, {0: 3}), (8, {0: 6, 1: 2}))
    for before, after in zip(remaps, remaps[1:]):
        assert tables.append_binding(before, after, upstream=after.frontier)
    healthy = check_remap(tables.remap_frame(), since=0, upstreams=tables.recorded_upstreams())
    assert healthy.success, healthy.summary()
    assert tables.recorded_upstreams() == {5: Frontier.of({0: 3}), 8: Frontier.of({0: 6, 1: 2})}
    if corruption == "double-increment":  # a racing tick's rows stored a second time, as a blind append would
        rows = tables._remap_rows(remaps[2].increments()[-2:])
        storage.append_rows(tables.table("remap"), rows, REMAP_APP, 9)
    elif corruption == "beyond-upstream":  # a tick bound more than the upstream had
        after = remaps[2].mint(12, Frontier.of({0: 9, 1: 2}))
        assert tables.append_binding(remaps[2], after, upstream=Frontier.of({0: 7, 1: 2}))
    else:  # a binding earlier than the compaction frontier
        storage.append_rows(tables.table("remap"), tables._remap_rows([Increment(1, 2, 1)]), REMAP_APP, 9)
    report = check_remap(tables.remap_frame(), since=4 if corruption == "before-since" else 0,
                         upstreams=tables.recorded_upstreams())
    assert report.failed == failing, report.summary()


@pytest.mark.parametrize("left_behind", [[], [".00000000000000000000.json.1f2e.tmp"]])
def test_a_table_creation_killed_before_its_first_commit_does_not_wedge_the_source(tmp_path, left_behind):
    log_dir = tmp_path / "w" / "s" / "remap" / "_delta_log"  # what a SIGKILL during a creation leaves
    log_dir.mkdir(parents=True)
    for name in left_behind:
        (log_dir / name).write_text("")
    tables = Warehouse(str(tmp_path / "w")).source("s", pa.int32(), DATA, create=True)  # no Spark: delta-rs
    assert tables.version("remap") == 0 and tables.read_remap() == Remap()


CREATE = """
import sys, time
import pyarrow as pa
from reclock.storage import Warehouse
while time.time() < float(sys.argv[2]):  # start together
    pass
Warehouse(sys.argv[1]).source("s", pa.int32(), pa.schema([("value", pa.string())]), create=True)
"""


def test_racing_first_steps_create_each_table_once_without_a_lock(tmp_path):
    """First steps of a source in four processes at once, rounds of them: each table is created by exactly one
    commit (version 0, never a second creation at version 1), every process goes on with it, and no lock file
    is left (the creation holds on an object store as on a local disk)."""
    import subprocess
    import sys

    for round_ in range(5):
        root = str(tmp_path / f"w{round_}")
        start = time.time() + 3
        procs = [subprocess.Popen([sys.executable, "-c", CREATE, root, str(start)], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT) for _ in range(4)]
        outputs = [(p.wait(timeout=120), p.stdout.read().decode()) for p in procs]
        assert all(code == 0 for code, _ in outputs), outputs
        for kind in KINDS:
            log_dir = os.path.join(root, "s", kind, "_delta_log")
            assert sorted(n for n in os.listdir(log_dir) if n.endswith(".json")) == ["00000000000000000000.json"]
        assert not [n for n in os.listdir(os.path.join(root, "s")) if n.endswith(".lock")]
        assert Warehouse(root).source("s", pa.int32(), DATA).read_remap() == Remap()
