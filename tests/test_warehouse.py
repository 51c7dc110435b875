"""Delta Lake warehouse: real tables on disk, real local Spark for the Parquet bridge.

Spark tests use the session-scoped ``spark`` fixture of conftest.py (a module-scoped one
here would stop the shared getOrCreate session under other modules).
"""
from __future__ import annotations

import os
import tempfile
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.engine import Frontier, Remap, Update, as_of, compact_updates, reclock
from reclock.warehouse import SINCE_APP, SUCCESS, Warehouse, WarehouseError

DATA = pa.schema([("value", pa.string())])


@pytest.fixture
def tables(tmp_path):
    return Warehouse(str(tmp_path / "warehouse")).source("orders", pa.int32(), DATA)


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


def stage_with_pyarrow(tables, upto: int, rows: list[dict], schema: pa.Schema | None = None) -> str:
    """Stage like a completed Spark job would (Parquet file + _SUCCESS), without starting Spark."""
    directory = tables.staging_dir(upto)
    os.makedirs(directory)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema or tables.schemas["reclocked"]),
                   f"{directory}/part-00000.parquet")
    open(f"{directory}/{SUCCESS}", "w").close()
    return directory


def spark_frame(spark, tables, rows: list[dict]):
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = from_arrow_schema(tables.schemas["reclocked"])
    return spark.createDataFrame([tuple(r.values()) for r in rows], schema).repartition(2)


# --- 1. the Spark -> Parquet -> deltalake commit bridge ---------------------------------------


@pytest.mark.slow
def test_spark_staged_files_publish_in_one_commit(spark, tables):
    remap = store(tables, ticks(Remap(), (10, {0: 2}), (11, {0: 3, 1: 1})))
    updates = [Update("a", 0, 0), Update("b", 0, 1), Update("c", 0, 2), Update("d", 1, 0), Update("late", 1, 5)]
    expected = as_rows(reclock(updates, remap))
    assert tables.stage(spark_frame(spark, tables, expected), 11) == 4
    assert rows_of(pa.Table.from_pandas(tables.read_staged(11))) == rows_of(pa.Table.from_pylist(expected))
    version = tables.table("reclocked").version()

    assert tables.publish_staged(11)

    dt = DeltaTable(tables.table_uri("reclocked"))
    assert dt.version() == version + 1
    assert dt.history(1)[0]["operation"] == "WRITE"
    assert rows_of(dt.to_pyarrow_table()) == rows_of(pa.Table.from_pylist(expected))
    assert dt.count() == len(expected) == 4  # "late" is beyond the frontier; numRecords stats are right
    assert len(tables.snapshot_files("reclocked")) == 2
    spark_rows = Counter(tuple(r) for r in tables.read_reclocked_spark(spark).collect())
    assert spark_rows == rows_of(pa.Table.from_pylist(expected))
    assert tables.reclocked_upper() == 12

    assert not tables.publish_staged(11)  # idempotent: already published
    assert tables.stage(spark_frame(spark, tables, expected), 11) == 0  # nothing staged again
    assert DeltaTable(tables.table_uri("reclocked")).version() == version + 1


@pytest.mark.slow
def test_spark_reads_empty_table_with_schema(spark, tables):
    df = tables.read_reclocked_spark(spark)
    assert df.columns == ["value", "partition", "offset", "into_time", "diff"]
    assert df.count() == 0


# --- 2. remap: append_binding, read_remap, since ---------------------------------------------


def test_append_binding_is_idempotent_and_round_trips(tables):
    remaps = ticks(Remap(), (5, {0: 3}), (7, {0: 3, 1: 2}), (9, {0: 3, 1: 2}))  # last tick does not move
    version = tables.table("remap").version()
    remap = store(tables, remaps)
    assert tables.table("remap").version() == version + 3  # one commit per tick, even the empty one
    assert not tables.append_binding(remaps[-2], remaps[-1])  # same tick twice
    assert not tables.append_binding(remaps[0], remaps[1])
    assert tables.table("remap").version() == version + 3
    stored = tables.read_remap()
    assert stored == remap and stored.upper == 10 and tables.remap_upper() == 10
    assert rows_of(tables._read("remap")) == Counter(tuple(r) for r in remap.increments())


def test_append_binding_refuses_a_gap(tables):
    remaps = ticks(Remap(), (5, {0: 3}), (7, {0: 4}))
    with pytest.raises(WarehouseError, match="stored remap has upper 0"):
        tables.append_binding(remaps[1], remaps[2])
    assert tables.read_remap() == Remap()


def test_tables_reopen_with_same_state_and_check_schema(tmp_path):
    warehouse = Warehouse(str(tmp_path / "w"))
    first = warehouse.source("s", pa.string(), DATA)
    remap = store(first, ticks(Remap(), (3, {"a": 1})))
    again = Warehouse(str(tmp_path / "w")).source("s", pa.string(), DATA)
    assert again.read_remap() == remap and again.since() == 0
    with pytest.raises(WarehouseError, match="partition: string"):
        warehouse.source("s", pa.int32(), DATA)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.dictionaries(st.sampled_from([0, 1, 2]), st.integers(0, 2))),
                max_size=6))
def test_read_remap_round_trips_any_ticks(steps):
    remaps, into_time, frontier = [Remap()], 0, Frontier()
    for gap, growth in steps:
        into_time += gap
        frontier = frontier.advanced_by(growth)
        remaps.append(remaps[-1].mint(into_time, frontier))
    with tempfile.TemporaryDirectory() as root:
        tables = Warehouse(root).source("s", pa.int32(), DATA)
        store(tables, remaps)
        assert tables.read_remap() == remaps[-1]


# --- publishing checks (no Spark needed) ---------------------------------------------------------


def test_publish_refuses_wrong_schema_incomplete_or_out_of_range_files(tables):
    store(tables, ticks(Remap(), (10, {0: 1}), (20, {0: 2})))
    with pytest.raises(WarehouseError, match="no complete staged attempt"):
        tables.publish_staged(10)
    wrong = pa.schema([("value", pa.string()), ("partition", pa.int64()), ("offset", pa.int64()),
                       ("into_time", pa.int64()), ("extra", pa.int64())])
    stage_with_pyarrow(tables, 10, [{"value": "a", "partition": 0, "offset": 0, "into_time": 10, "extra": 1}], wrong)
    with pytest.raises(WarehouseError, match=r"missing \['diff'\]; unexpected \['extra'\]; partition: int64"):
        tables.publish_staged(10)
    stage_with_pyarrow(tables, 10, as_rows([("b", 0, 1, 20, 1)]))
    with pytest.raises(WarehouseError, match=r"IntoTimes \[20, 20\] outside \[0, 10\]"):
        tables.publish_staged(10)
    with pytest.raises(WarehouseError, match="remap upper is 21"):
        tables.publish_staged(21)
    assert tables.table("reclocked").version() == 0 and tables.reclocked_upper() == 0


def test_publish_of_an_empty_tick_records_the_upper(tables):
    store(tables, ticks(Remap(), (10, {}), (11, {})))
    directory = tables.staging_dir(11)
    os.makedirs(directory)
    open(f"{directory}/{SUCCESS}", "w").close()
    assert tables.publish_staged(11)
    assert tables.reclocked_upper() == 12 and tables.read_reclocked_arrow().num_rows == 0


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
        stage_with_pyarrow(tables, upto, as_rows(batch))
        assert tables.publish_staged(upto)
        published += batch
    return remap, published


def test_compact_preserves_queries_at_or_after_since(tables):
    remap, updates = build_history(tables)
    before = tables.read_reclocked_arrow().to_pylist()
    first_files = tables.snapshot_files("reclocked", 1)

    tables.compact(25)

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
    assert not any(os.path.exists(f) for f in first_files)  # vacuumed
    with pytest.raises(FileNotFoundError):
        tables.read_reclocked_arrow(version=1)

    versions = {k: tables.table(k).version() for k in ("remap", "reclocked")}
    tables.compact(25)  # rerun: no-op
    tables.compact(10)  # below since: nothing to do
    assert {k: tables.table(k).version() for k in versions} == versions


def test_compact_resumes_after_a_crash_after_recording_since(tables):
    remap, updates = build_history(tables)
    tables._append("remap", tables.schemas["remap"].empty_table(), SINCE_APP, 25)  # step 1 only
    assert tables.read_remap() == remap.compact(25)  # readers already see the compacted remap
    tables.compact(25)
    assert tables.read_remap() == remap.compact(25)
    after = [tuple(r.values()) for r in tables.read_reclocked_arrow().to_pylist()]
    assert Counter({r[:4]: r[4] for r in after}) == compact_updates(updates, 25)


def test_compact_refuses_unpublished_times(tables):
    build_history(tables)
    with pytest.raises(WarehouseError, match="published only below 41"):
        tables.compact(41)
    assert tables.since() == 0


# --- 4. a Spark job killed before publishing ------------------------------------------------


@pytest.mark.slow
def test_staged_but_unpublished_files_leave_the_table_unchanged(spark, tables):
    remap = store(tables, ticks(Remap(), (10, {0: 2})))
    rows = as_rows(reclock([Update("a", 0, 0), Update("b", 0, 1)], remap))
    crashed = tables.staging_dir(10)
    spark_frame(spark, tables, rows).write.parquet(crashed)
    os.remove(f"{crashed}/{SUCCESS}")  # killed before the job committed
    assert tables.table("reclocked").version() == 0 and tables.reclocked_upper() == 0
    assert tables.snapshot_files("reclocked") == [] and tables.read_reclocked_spark(spark).count() == 0

    assert tables.stage(spark_frame(spark, tables, rows), 10) == 2  # the rerun stages a fresh attempt
    assert tables.publish_staged(10)
    assert rows_of(tables.read_reclocked_arrow()) == rows_of(pa.Table.from_pylist(rows))  # no duplicates
    # the unpublished attempt's files are deleted (delta-rs leaves the empty local directory)
    assert not [name for _, _, names in os.walk(crashed) for name in names]


def test_many_ticks_keep_the_remap_table_small(tables):
    from reclock.warehouse import REMAP_MAX_FILES

    remaps = ticks(Remap(), *[(t, {0: t, 1: 2 * t}) for t in range(1, 3 * REMAP_MAX_FILES)])
    stored = store(tables, remaps)
    assert len(tables.table("remap").file_uris()) <= REMAP_MAX_FILES + 1
    assert tables.read_remap() == stored
