"""Airflow connections instead of addresses in the sources file: resolved through Airflow's Connection API when
a step runs (here from Airflow's AIRFLOW_CONN_<ID> variables, as the CLI does), never shown with the password."""
from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml

from airflow_env import prepare_home, run, run_dag_test
from airflow_env import airflow_db_template  # noqa: F401  (a session fixture)
from conftest import fresh_database, over_connect, reclocked_rows, run_cli, spark_settings
from devtools.airflow_home import AIRFLOW, kafka_connection, postgres_connection
from devtools.kafka_broker import create_topic, produce
from reclock import pipeline, runtime
from reclock.config import load_config
from reclock.connections import environment, resolved_options
from reclock.sources import SourceError

PASSWORD = "pg-Secret-7f3a9c"  # the cluster trusts local connections: a password is passed, never needed


def config_with(tmp_path, *sources, spark_remote: str | None = None) -> str:
    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump({"warehouse": str(tmp_path / "warehouse"), "spark": spark_settings(spark_remote),
                                    "sources": list(sources)}))
    return str(path)


def kafka_entry(connection="reclock_kafka", **options):
    return {"name": "orders", "kind": "kafka", "connection": connection,
            "options": {"topic": "orders", "group_id": "g", **options}}


def pg_entry(connection="reclock_pg", **options):
    return {"name": "inventory", "kind": "postgres", "connection": connection,
            "options": {"slot": "reclock_inventory", "tables": ["public.items"], **options}}


def test_a_kafka_connection_gives_the_bootstrap_servers_and_client_config(tmp_path, monkeypatch):
    for var, value in kafka_connection("reclock_kafka", "b1:9092,b2:9092", **{
            "security.protocol": "SSL", "client.id": "from-conn", "group.id": "ignored"}).items():
        monkeypatch.setenv(var, value)
    source = load_config(config_with(tmp_path, kafka_entry(config={"client.id": "from-file"}))).source("orders")
    assert "bootstrap_servers" not in source.options and source.connection == "reclock_kafka"
    assert resolved_options(source) == {
        "topic": "orders", "group_id": "g", "bootstrap_servers": "b1:9092,b2:9092",
        "config": {"security.protocol": "SSL", "client.id": "from-file"}}  # the file's properties win; no group.id


def test_a_postgres_connection_makes_the_dsn(tmp_path, monkeypatch):
    for var, value in postgres_connection("reclock_pg", "host=db.internal port=6543 user=rc dbname=app "
                                          "sslmode=require", password=PASSWORD).items():
        monkeypatch.setenv(var, value)
    from psycopg.conninfo import conninfo_to_dict

    source = load_config(config_with(tmp_path, pg_entry())).source("inventory")
    assert conninfo_to_dict(resolved_options(source)["dsn"]) == {
        "host": "db.internal", "port": "6543", "user": "rc", "password": PASSWORD, "dbname": "app",
        "sslmode": "require"}
    assert PASSWORD not in repr(source) and PASSWORD not in str(dict(source))
    assert json.loads(environment(source)["AIRFLOW_CONN_RECLOCK_PG"])["password"] == PASSWORD  # for spark-submit


@pytest.mark.parametrize("entry, env, message", [
    (pg_entry("nope"), {}, "source 'inventory': Airflow connection 'nope' is not defined (add it in Airflow, "
                           "Admin > Connections, of type 'postgres', or set AIRFLOW_CONN_NOPE)"),
    (kafka_entry("reclock_kafka"), {"AIRFLOW_CONN_RECLOCK_KAFKA": json.dumps({"conn_type": "postgres"})},
     "source 'orders': Airflow connection 'reclock_kafka' is of type 'postgres'; kind kafka needs one of type "
     "'kafka'"),
    (kafka_entry("reclock_kafka"), {"AIRFLOW_CONN_RECLOCK_KAFKA": json.dumps({"conn_type": "kafka", "extra": {}})},
     "source 'orders': Airflow connection 'reclock_kafka' has no 'bootstrap.servers' in its extra"),
])
def test_a_missing_or_wrong_connection_names_the_source_and_the_conn_id(tmp_path, monkeypatch, entry, env, message):
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    config = config_with(tmp_path, entry)
    with pytest.raises(SourceError) as e:
        resolved_options(load_config(config).source(entry["name"]))
    assert str(e.value).startswith(message)
    with pytest.raises(SourceError, match="is not defined" if not env else "reclock_kafka"):
        with runtime.open_source(entry["name"], config):  # the composition root resolves it
            pass


def test_the_password_is_in_no_repr_error_or_log(tmp_path, monkeypatch, pg_cluster, spark, spark_connect):
    """A Postgres source from a connection with a password: its repr, the error of a failed connect and the
    logs of ticks by the CLI (which resolves AIRFLOW_CONN_<ID> as Airflow does; clients of the run's Spark
    Connect server) never show the password."""
    with fresh_database(pg_cluster, "CREATE TABLE items (id int PRIMARY KEY, name text)",
                        "INSERT INTO items VALUES (1, 'a')") as dsn:
        env = postgres_connection("reclock_pg", dsn, password=PASSWORD)
        config = config_with(tmp_path, pg_entry())
        connected = over_connect(config, spark_connect)
        proc = run_cli(connected, "tick", "inventory", env_extra=env)
        logs = proc.communicate(timeout=600)[0].decode()
        assert proc.returncode == 0 and "inventory: tick at" in logs, logs[-3000:]
        monkeypatch.setenv(*env.popitem())
        with runtime.open_source("inventory", config) as ctx:
            shown = [repr(ctx.source), repr(ctx.upstream), repr(ctx.config)]
        env = postgres_connection("reclock_pg", dsn.replace("dbname=", "dbname=absent_"), password=PASSWORD)
        monkeypatch.setenv(*env.popitem())
        with pytest.raises(SourceError) as e:
            pipeline.tick("inventory", config)
        assert "absent_" in str(e.value)  # the error is about the database it could not reach
        proc = run_cli(connected, "tick", "inventory", env_extra=env)
        failed = proc.communicate(timeout=600)[0].decode()
        assert proc.returncode == 2 and "absent_" in failed, failed[-3000:]
    for text in shown + [str(e.value), logs, failed]:
        assert PASSWORD not in text


@pytest.mark.slow
def test_a_dag_reclocks_a_kafka_source_named_by_its_connection(tmp_path, monkeypatch, kafka_broker,
                                                                airflow_db_template):  # noqa: F811
    """dag.test(): the file names the connection only; tick and check read it in the task, the Spark job gets
    it from the task as AIRFLOW_CONN_<ID>."""
    topic = f"conn-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker, topic, partitions=2)
    config = config_with(tmp_path, {"name": "events", "kind": "kafka", "connection": "reclock_kafka",
                                    "retention_ms": 10_000, "options": {"topic": topic, "group_id": f"g-{topic}"}})
    assert kafka_broker not in Path(config).read_text()
    env = prepare_home(tmp_path / "airflow", config=Path(config), db_template=airflow_db_template)
    connection = kafka_connection("reclock_kafka", kafka_broker)
    env.update(connection)
    produce(kafka_broker, topic, [(f"k{i}", f"v{i}", i % 2) for i in range(10)])
    result = run_dag_test("reclock_events", env)
    assert result["state"] == "success", result["output"][-4000:]
    assert set(result["tasks"].values()) == {"success"}
    monkeypatch.setenv(*connection.popitem())  # this process reads the rows through the connection too
    assert sorted(r[0] for r in reclocked_rows("events", config)) == sorted(f"v{i}" for i in range(10))


@pytest.mark.slow
def test_a_dag_reclocks_a_postgres_source_named_by_a_connection_in_airflow(tmp_path, pg_cluster, spark_connect,
                                                                           airflow_db_template):  # noqa: F811
    """dag.test() with the connection in Airflow's metadata DB (``airflow connections add``), not in the
    environment: the tasks read it through Airflow's Connection API; its password is in no task's log.  Every
    Spark step is a client of a long-lived Spark Connect server (the snapshot's landing and the changes read by
    reclock's Python data source on the server's workers, the history and primary-key checks)."""
    with fresh_database(pg_cluster, "CREATE TABLE items (id int PRIMARY KEY, name text)",
                        "INSERT INTO items VALUES (1, 'a'), (2, 'b'), (3, 'c')") as dsn:
        config = config_with(tmp_path, {**pg_entry(), "retention_ms": 10_000}, spark_remote=spark_connect)
        env = prepare_home(tmp_path / "airflow", config=Path(config), db_template=airflow_db_template)
        (conn_json,) = postgres_connection("reclock_pg", dsn, password=PASSWORD).values()
        run([AIRFLOW, "connections", "add", "reclock_pg", "--conn-json", conn_json], env, timeout=300)
        assert not any(k.startswith("AIRFLOW_CONN_") for k in env)
        result = run_dag_test("reclock_inventory", env)
        assert result["state"] == "success", result["output"][-4000:]
        assert set(result["tasks"].values()) == {"success"}
        assert PASSWORD not in result["output"]
        with runtime.open_source("inventory", config, connect=False) as ctx:  # reads the tables only
            rows = ctx.tables.read_reclocked_arrow().to_pylist()
    assert sorted(json.loads(r["row"])["name"] for r in rows) == ["a", "b", "c"]
    assert {r["diff"] for r in rows} == {1}
