"""The Debezium transactions step as configured: config entries, its DAG, and compaction waiting for it."""
from __future__ import annotations

import pyarrow as pa
import pytest
import yaml

from airflow_env import DAGS_FOLDER, airflow_env, run_python
from reclock.config import ConfigError, load_config
from reclock.pipeline import _consumers_progress
from reclock.runtime import Runtime
from reclock.sources.kafka import KafkaSource
from reclock.transactions import TEMP_APP, TxnTables
from reclock.storage import Warehouse


def write_config(tmp_path, transactions, tx_kind="kafka"):
    kafka = {"bootstrap_servers": "127.0.0.1:1", "group_id": "g"}
    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump({
        "warehouse": str(tmp_path / "warehouse"),
        "sources": [{"name": "dbz_data", "kind": "kafka", "options": {**kafka, "topic": "d"}},
                    {"name": "dbz_tx", "kind": tx_kind,
                     "options": {**kafka, "topic": "t"} if tx_kind == "kafka" else {"url": str(tmp_path)}},
                    {"name": "other", "kind": "kafka", "options": {**kafka, "topic": "o"}}],
        "transactions": transactions,
    }))
    return str(path)


MAIN = [{"name": "main", "data_source": "dbz_data", "tx_source": "dbz_tx", "schedule": "@hourly",
         "start_date": "2026-01-01"}]


def test_transactions_entries_are_validated(tmp_path):
    config = load_config(write_config(tmp_path, MAIN))
    assert config.transaction("main").tx_source == "dbz_tx"
    with pytest.raises(ConfigError, match="no transactions entry named 'nope'"):
        config.transaction("nope")
    with pytest.raises(ConfigError, match=r"transactions\[0\] \(main\).tx_source: must name a configured source"):
        load_config(write_config(tmp_path, [{**MAIN[0], "tx_source": "missing"}]))
    with pytest.raises(ConfigError, match="must be a kafka source, dbz_tx is files"):
        load_config(write_config(tmp_path, MAIN, tx_kind="files"))
    with pytest.raises(ConfigError, match="duplicate transactions name"):
        load_config(write_config(tmp_path, MAIN + MAIN))


def test_compaction_of_its_sources_waits_for_the_step(tmp_path, spark):
    path = write_config(tmp_path, MAIN)
    assert _consumers_progress("dbz_data", Runtime.load(path)) == [-1]  # never ran: its sources must not compact
    config = load_config(path)
    tables = TxnTables(Warehouse(config.warehouse), "main", pa.int32(), KafkaSource.data_schema, spark)
    assert _consumers_progress("dbz_data", Runtime.load(path)) == [-1]  # tables created, nothing processed yet
    tables.append("temp", [], TEMP_APP, 5_000)
    assert _consumers_progress("dbz_data", Runtime.load(path)) == [5_000]
    assert _consumers_progress("dbz_tx", Runtime.load(path)) == [5_000]
    assert _consumers_progress("other", Runtime.load(path)) == []


def test_one_dag_per_transactions_entry(tmp_path):
    path = write_config(tmp_path, MAIN)
    code = f"""
import os
os.environ["RECLOCK_CONFIG"] = {path!r}
from airflow.models import DagBag
bag = DagBag(dag_folder={str(DAGS_FOLDER)!r})
dag = bag.dags["reclock_txn_main"]
emit({{"errors": list(bag.import_errors), "tasks": [t.task_id for t in dag.tasks],
       "cron": getattr(dag.timetable, "expression", None)}})
"""
    result = run_python(code, airflow_env(tmp_path / "airflow"), timeout=300)
    assert result["errors"] == []
    assert result["tasks"] == ["publish_transactions"]
    assert result["cron"] == "0 * * * *"


def test_transactions_run_when_both_sources_have_published(tmp_path):
    """``schedule: assets`` (the default): the DAG is scheduled on its two sources' reclocked-table Assets (all of
    them), which their ``publish`` tasks update."""
    path = write_config(tmp_path, [{k: v for k, v in MAIN[0].items() if k != "schedule"}])
    assert load_config(path).transaction("main").schedule == "assets"
    code = f"""
import os
os.environ["RECLOCK_CONFIG"] = {path!r}
from airflow.models import DagBag
bag = DagBag(dag_folder={str(DAGS_FOLDER)!r})
dag = bag.dags["reclock_txn_main"]
condition = dag.timetable.asset_condition
emit({{"errors": list(bag.import_errors), "timetable": type(dag.timetable).__name__,
       "condition": type(condition).__name__, "assets": sorted((a.name, a.uri) for a in condition.objects),
       "outlets": {{n: [(a.name, a.uri) for a in bag.dags[f"reclock_{{n}}"].get_task("publish").outlets]
                   for n in ("dbz_data", "dbz_tx", "other")}}}})
"""
    result = run_python(code, airflow_env(tmp_path / "airflow"), timeout=300)
    assert result["errors"] == []
    warehouse = tmp_path / "warehouse"
    asset = {n: [f"reclock_{n}_reclocked", f"file://{warehouse}/{n}/reclocked"] for n in ("dbz_data", "dbz_tx", "other")}
    assert (result["timetable"], result["condition"]) == ("AssetTriggeredTimetable", "AssetAll")
    assert result["assets"] == [asset["dbz_data"], asset["dbz_tx"]]
    assert result["outlets"] == {n: [a] for n, a in asset.items()}
