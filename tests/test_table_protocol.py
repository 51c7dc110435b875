"""Other Delta users of reclock's tables (issue 37 item 2, :mod:`reclock.storage.table_protocol`): what a delta-spark user
changes that reclock goes on with, and what stops a source, naming the table and what it needs, with nothing
written.  The law as a table, then real tables changed with delta-spark."""
from __future__ import annotations

import pyarrow as pa
import pytest
from conftest import stage_parquet
from deltalake import DeltaTable

from reclock.engine import Frontier, Remap
from reclock.storage.table_protocol import Protocol, protocol_problems
from reclock.storage import Warehouse, WarehouseError

DATA = pa.schema([("value", pa.string())])


@pytest.mark.parametrize("protocol, configuration, problems", [
    # what reclock creates, and what the legacy versions reclock's writers keep correct
    (Protocol(1, 2), {}, []),
    (Protocol(1, 3), {}, []),  # check constraints supported, none defined
    (Protocol(1, 4), {"delta.enableChangeDataFeed": "true"}, []),
    (Protocol(1, 2), {"delta.checkpointInterval": "2", "delta.appendOnly": "false"}, []),
    # table features: the writable ones alone
    (Protocol(1, 7, ["appendOnly", "invariants", "changeDataFeed"], None), {}, []),
    (Protocol(3, 7, ["appendOnly", "invariants"], []), {}, []),
    # what stops a source
    (Protocol(3, 7, ["appendOnly", "invariants", "deletionVectors"], ["deletionVectors"]),
     {"delta.enableDeletionVectors": "true"}, ["reader feature deletionVectors"]),
    (Protocol(2, 5), {"delta.columnMapping.mode": "name"},
     ["reader version 2: columnMapping (reader version 2)", "writer version 5: columnMapping (writer version 5)"]),
    (Protocol(1, 6), {}, ["writer version 6: identityColumns (writer version 6)"]),
    (Protocol(1, 7, ["invariants", "rowTracking", "domainMetadata"], None), {},
     ["writer feature domainMetadata", "writer feature rowTracking"]),
    (Protocol(3, 7, ["v2Checkpoint", "typeWidening-preview"], ["v2Checkpoint"]), {},
     ["reader feature v2Checkpoint", "writer feature typeWidening-preview"]),
    (Protocol(1, 3), {"delta.constraints.positive": "diff > 0"}, ["check constraint positive (diff > 0)"]),
    (Protocol(1, 2), {"delta.appendOnly": "true"}, ["delta.appendOnly = true (compaction removes files)"]),
    (Protocol(4, 8), {}, ["reader version 4", "writer version 8"]),  # a future protocol: unknown, refused
])
def test_what_reclock_goes_on_with_and_what_stops_it(protocol, configuration, problems):
    assert protocol_problems(protocol, configuration) == problems


@pytest.fixture
def warehouse(tmp_path):
    return Warehouse(str(tmp_path / "warehouse"))


def open_orders(warehouse, spark):
    return warehouse.source("orders", pa.int32(), DATA, spark=spark)


def sql(spark, tables, kind: str, statement: str) -> None:
    spark.sql(f"ALTER TABLE delta.`{tables.spark_uri(kind)}` {statement}")


def versions(tables) -> dict[str, int]:
    return {kind: DeltaTable(tables.table_uri(kind)).version() for kind in ("remap", "reclocked")}


@pytest.mark.slow
def test_deletion_vectors_enabled_by_a_user_stop_the_source_naming_the_table(warehouse, spark):
    """A delta-spark user enables deletion vectors on ``reclocked`` (delta-rs's readers refuse them): opening the
    source refuses, naming the table and the feature, and so does a step holding the tables already; nothing is
    written to either table."""
    tables = open_orders(warehouse, spark)
    assert Protocol(*tables.table("remap").protocol()) == Protocol(1, 2)  # what reclock creates
    first = Remap().mint(10, Frontier.of({0: 2}))
    assert tables.append_binding(Remap(), first)
    sql(spark, tables, "reclocked", "SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    before = versions(tables)
    with pytest.raises(WarehouseError) as refused:
        open_orders(warehouse, spark)
    message = str(refused.value)
    assert "orders_reclocked" in message and "reader feature deletionVectors" in message
    assert "nothing written" in message and "Other Delta users" in message
    stage_parquet(tables, 10, [{"value": "a", "partition": 0, "offset": 0, "into_time": 10, "diff": 1}])
    with pytest.raises(WarehouseError, match="orders_reclocked.*deletionVectors"):
        tables.publish_staged(10)
    assert versions(tables) == before


@pytest.mark.slow
def test_a_check_constraint_stops_the_source_until_it_is_dropped(warehouse, spark):
    """A check constraint on ``remap`` (files delta-rs adds are not checked against it): a tick refuses, naming the
    table and the constraint, and writes nothing; with the constraint dropped, ticks and publishes go on."""
    tables = open_orders(warehouse, spark)
    first = Remap().mint(10, Frontier.of({0: 2}))
    assert tables.append_binding(Remap(), first)
    sql(spark, tables, "remap", "ADD CONSTRAINT small CHECK (increment < 100)")
    before = versions(tables)
    second = first.mint(11, Frontier.of({0: 3}))
    with pytest.raises(WarehouseError, match=r"orders_remap.*check constraint small \(increment < 100\)"):
        tables.append_binding(first, second)
    assert versions(tables) == before

    sql(spark, tables, "remap", "DROP CONSTRAINT small")
    tables = open_orders(warehouse, spark)
    assert tables.append_binding(first, second)
    stage_parquet(tables, 11, [{"value": v, "partition": 0, "offset": o, "into_time": t, "diff": 1}
                               for v, o, t in (("a", 0, 10), ("b", 1, 10), ("c", 2, 11))])
    assert tables.publish_staged(11)
    assert sorted(r["value"] for r in tables.read_reclocked_arrow().to_pylist()) == ["a", "b", "c"]


@pytest.mark.slow
def test_change_data_feed_enabled_by_a_user_survives_ticks_and_publishes(warehouse, spark):
    """A user turns on change data feed for ``reclocked``: reclock goes on, and Spark's change-data reader sees
    each publish's rows as inserts at the publish's version."""
    tables = open_orders(warehouse, spark)
    sql(spark, tables, "reclocked", "SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    start = DeltaTable(tables.table_uri("reclocked")).version()
    remap = Remap().mint(10, Frontier.of({0: 2}))
    tables = open_orders(warehouse, spark)
    assert tables.append_binding(Remap(), remap)
    stage_parquet(tables, 10, [{"value": v, "partition": 0, "offset": o, "into_time": 10, "diff": 1}
                               for v, o in (("a", 0), ("b", 1))])
    assert tables.publish_staged(10)
    changes = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", start + 1)
               .load(tables.spark_uri("reclocked")).collect())
    assert sorted((r["value"], r["_change_type"], r["_commit_version"]) for r in changes) == [
        ("a", "insert", start + 1), ("b", "insert", start + 1)]
