"""The sources file: parsing, env overrides and expansion, and clear validation errors."""
from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from reclock import sources
from reclock import cli
from reclock.config import DEFAULT_PATH, ConfigError, config_schema, config_schema_text, load_config

#: The JSON schema of the sources file in the docs, for editors (``reclock config-schema`` prints it).
SCHEMA_PATH = Path(__file__).resolve().parents[1] / "docs" / "sources.schema.json"

GOOD = {
    "warehouse": "var/warehouse",
    "storage_options": {"AWS_ALLOW_HTTP": True},
    "spark": {"master": "local[1]", "conf": {"spark.sql.shuffle.partitions": 2}},
    "sources": [
        {"name": "orders", "kind": "kafka", "schedule": None, "start_date": "2026-01-01",
         "retention_ms": 1000,
         "options": {"bootstrap_servers": "${BROKER:-127.0.0.1:19092}", "topic": "orders", "group_id": "g"}},
        {"name": "clicks", "kind": "kafka", "schedule": "@hourly",
         "options": {"bootstrap_servers": "b:9092", "topic": "clicks", "group_id": "g2"}},
    ],
}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in ("RECLOCK_CONFIG", "RECLOCK_WAREHOUSE", "RECLOCK_SPARK_MASTER", "RECLOCK_SPARK_REMOTE", "BROKER"):
        monkeypatch.delenv(var, raising=False)


def write(tmp_path: Path, doc, name: str = "sources.yaml") -> Path:
    path = tmp_path / "conf" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


def variant(**changes) -> dict:
    """GOOD with the first source's keys changed (``None`` values delete the key)."""
    doc = yaml.safe_load(yaml.safe_dump(GOOD))
    for key, value in changes.items():
        if value is None:
            doc["sources"][0].pop(key)
        else:
            doc["sources"][0][key] = value
    return doc


def test_parses_good_config(tmp_path):
    config = load_config(write(tmp_path, GOOD))
    assert list(config.sources) == ["orders", "clicks"]
    assert config.warehouse == str(tmp_path / "var" / "warehouse")  # relative to the file's dir's parent
    assert config.storage_options == {"AWS_ALLOW_HTTP": "true"}
    assert config.spark_master == "local[1]"
    assert config.spark_conf == {"spark.sql.shuffle.partitions": "2"}
    orders = config.source("orders")
    assert orders.start_date == datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert orders.retention_ms == 1000 and orders.offsets_unique
    assert orders.options["bootstrap_servers"] == "127.0.0.1:19092"
    clicks = config.source("clicks")
    assert clicks.schedule == "@hourly" and clicks.start_date is None and clicks.retention_ms > 0


def test_demo_config_is_valid():
    config = load_config(DEFAULT_PATH)
    assert {"orders", "clicks"} <= set(config.sources)


def test_demo_config_commented_examples_are_valid(tmp_path):
    """The commented-out postgres and files entries of the demo config parse once uncommented."""
    lines = DEFAULT_PATH.read_text().splitlines()
    entries = [line[:2] + line[4:] for line in lines if line.startswith(("  # - ", "  #   "))]
    doc = "\n".join([line for line in lines if not line.lstrip().startswith("#")] + entries)
    sources = load_config(write(tmp_path, doc)).sources
    assert {name: s.kind for name, s in sources.items() if s.kind != "kafka"} == {"inventory": "postgres",
                                                                                 "logs": "files"}


def test_env_overrides_and_expansion(tmp_path, monkeypatch):
    path = write(tmp_path, GOOD)
    monkeypatch.setenv("RECLOCK_CONFIG", str(path))
    monkeypatch.setenv("RECLOCK_WAREHOUSE", "s3://bucket/prefix")
    monkeypatch.setenv("RECLOCK_SPARK_MASTER", "spark://master:7077")
    monkeypatch.setenv("BROKER", "kafka:9092")
    config = load_config()
    assert config.path == path
    assert config.warehouse == "s3://bucket/prefix"
    assert config.spark_master == "spark://master:7077"
    assert config.source("orders").options["bootstrap_servers"] == "kafka:9092"


@pytest.mark.parametrize("spark, env, remote, problem", [
    ({"master": "local[1]"}, None, None, None),
    ({"remote": "sc://spark-connect:15002"}, None, "sc://spark-connect:15002", None),
    ({"master": "local[1]"}, "sc://127.0.0.1:15002", "sc://127.0.0.1:15002", None),  # the environment wins
    ({"remote": "sc://a:1"}, "", None, None),  # an empty RECLOCK_SPARK_REMOTE: no server
    ({"remote": "spark://master:7077"}, None, None, r"spark\.remote: a Spark Connect URL is sc://host:port"),
    ({"remote": 15002}, None, None, r"spark\.remote"),
])
def test_spark_remote_selects_a_spark_connect_server(tmp_path, monkeypatch, spark, env, remote, problem):
    if env is not None:
        monkeypatch.setenv("RECLOCK_SPARK_REMOTE", env)
    path = write(tmp_path, {**GOOD, "spark": spark})
    if problem:
        with pytest.raises(ConfigError, match=problem):
            load_config(path)
    else:
        assert load_config(path).spark_remote == remote


def test_unknown_source_lists_known_names(tmp_path):
    config = load_config(write(tmp_path, GOOD))
    with pytest.raises(ConfigError, match=r"no source named 'nope' \(known: orders, clicks\)"):
        config.source("nope")


def test_registered_kind_is_accepted(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "_REGISTRY", dict(sources._REGISTRY))  # keep the registry clean for other tests
    sources.register_source("test_files", lambda root, **more: None, ("root",), offsets_unique=False)
    doc = variant(kind="test_files", options={"root": "/data"})
    assert not load_config(write(tmp_path, doc)).source("orders").offsets_unique
    with pytest.raises(ConfigError, match=r"missing required option\(s\) for kind test_files: root"):
        load_config(write(tmp_path, variant(kind="test_files", options={"url": "/data"})))


@pytest.mark.parametrize("kind, options, offsets_unique", [
    ("postgres", {"dsn": "host=/tmp dbname=app", "slot": "reclock_app", "tables": ["public.items"]}, False),
    ("files", {"url": "s3://bucket/logs", "pattern": "*.jsonl"}, True),
    ("recorded", {"url": "s3://bucket/kinesis", "gauge": "kinesis"}, True),
    ("kinesis", {"stream": "orders", "region": "us-east-1", "max_records": 1000}, True),
])
def test_postgres_and_files_kinds(tmp_path, kind, options, offsets_unique):
    config = load_config(write(tmp_path, variant(kind=kind, options=options)))
    assert config.source("orders").kind == kind and config.source("orders").offsets_unique is offsets_unique
    for missing in sources.source_kind(kind).required_options:
        doc = variant(kind=kind, options={k: v for k, v in options.items() if k != missing})
        with pytest.raises(ConfigError, match=rf"missing required option\(s\) for kind {kind}: {missing}$"):
            load_config(write(tmp_path, doc))


def test_config_kinds_are_the_buildable_kinds(tmp_path):
    """One registry: every kind the sources file accepts builds, and vice versa."""
    assert {"kafka", "files", "postgres"} <= set(sources.source_kinds())
    for kind in sources.source_kinds():
        assert callable(sources._resolve(kind))
    known = "cdcv2, files, kafka, kinesis, postgres, recorded"
    with pytest.raises(ConfigError, match=rf"unknown kind 'nope' \(known: {known}\)"):
        load_config(write(tmp_path, variant(kind="nope")))


@pytest.mark.parametrize("doc, message", [
    (variant(kind="pubnub"), r"sources\[0\] \(orders\)\.kind: unknown kind 'pubnub' \(known: .*kafka"),
    (variant(name="Orders"), r"sources\[0\]\.name: must match"),
    (variant(name="clicks"), r"sources\[1\] \(clicks\)\.name: duplicate source name 'clicks'"),
    (variant(options={"topic": "t"}), r"\(orders\)\.options: missing required option\(s\) for kind kafka: "
                                      r"bootstrap_servers, group_id"),
    (variant(options=None), r"missing required option"),
    (variant(retention_ms=-1), r"\(orders\)\.retention_ms: must be a positive integer"),
    (variant(retention_ms=0), r"\(orders\)\.retention_ms: must be a positive integer"),
    (variant(options={**GOOD["sources"][0]["options"], "startng_offsets": "latest"}),
     r"sources\[0\] \(orders\)\.options: unknown option\(s\) for kind kafka: startng_offsets "
     r"\(did you mean starting_offsets\?\) \(allowed: bootstrap_servers, topic, group_id, "),
    (variant(options={**GOOD["sources"][0]["options"], "timeout_s": 0}),
     r"\(orders\)\.options\.timeout_s: must be > 0 \(seconds\), got 0$"),
    (variant(options={**GOOD["sources"][0]["options"], "timeout_s": "fast"}),
     r"\(orders\)\.options\.timeout_s: must be float, got 'fast'$"),
    (variant(options={**GOOD["sources"][0]["options"], "starting_offsets": -5}),
     r"\(orders\)\.options\.starting_offsets: must be >= 0, got -5$"),
    (variant(options={**GOOD["sources"][0]["options"], "config": "client.id=x"}),
     r"\(orders\)\.options\.config: must be Mapping\[str, Any\] \| None, got 'client.id=x'$"),
    (variant(kind="postgres", options={"dsn": "host=/tmp", "slot": "s", "tables": "public.items"}),
     r"\(orders\)\.options\.tables: must be Sequence\[str\], got 'public.items'$"),
    (variant(kind="files", options={"url": "/data", "delete_committed": "yes"}),
     r"\(orders\)\.options\.delete_committed: must be bool, got 'yes'$"),
    (variant(schedule="hourly"), r"\(orders\)\.schedule: not a cron expression \(.*\) nor an Airflow preset"),
    (variant(schedule="61 * * * *"), r"\(orders\)\.schedule: not a cron expression"),
    (variant(retention_ms=86_400_000, vacuum_retention_hours=1),
     r"\(orders\)\.vacuum_retention_hours: 1 h is below the AS OF window \(retention_ms 86400000 = 24 h\).*"
     r"force_vacuum: true"),
    (variant(vacuum_retention_hours=-1), r"\(orders\)\.vacuum_retention_hours: must be a number of hours >= 0"),
    (variant(force_vacuum="yes"), r"\(orders\)\.force_vacuum: must be true or false, got 'yes'"),
    ({**GOOD, "transactions": [{"name": "tx", "data_source": "orders", "tx_source": "clicks", "schedule": "@often"}]},
     r"transactions\[0\] \(tx\)\.schedule: not a cron expression"),
    (variant(color="red"), r"sources\[0\] \(orders\): unknown key\(s\) color"),
    (variant(start_date="soon"), r"start_date: must be an ISO date"),
    (variant(schedule=5), r"schedule: must be a non-empty string"),
    ({**GOOD, "extra": 1}, r"top level: unknown key\(s\) extra"),
    ({**GOOD, "spark": {"master": "local", "cores": 2}}, r"spark: unknown key\(s\) cores"),
    ({**GOOD, "sources": []}, r"sources: must be a non-empty list"),
    ({k: v for k, v in GOOD.items() if k != "warehouse"}, r"warehouse: must be a non-empty string"),
    (variant(options={"bootstrap_servers": "${NOT_SET_ANYWHERE}", "topic": "t", "group_id": "g"}),
     r"sources\[0\]\.options\.bootstrap_servers: environment variable NOT_SET_ANYWHERE is not set"),
    ("sources: [", r"invalid YAML"),
])
def test_validation_errors_name_file_and_field(tmp_path, doc, message):
    path = write(tmp_path, doc)
    with pytest.raises(ConfigError, match=message) as e:
        load_config(path)
    assert str(e.value).startswith(f"{path}: ")


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "absent.yaml")


def test_a_local_warehouse_must_not_be_a_file(tmp_path):
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "warehouse").write_text("not a directory")
    with pytest.raises(ConfigError, match=r": warehouse: .*var/warehouse is a file, not a directory"):
        load_config(write(tmp_path, GOOD))


def test_every_problem_is_reported_on_a_line_of_its_own(tmp_path):
    doc = variant(schedule="every hour", retention_ms=0, options={"topic": "t", "group_id": "g", "startng_offsets": 1})
    doc["sources"][1]["options"]["timeout_s"] = -1
    doc["sources"].append({"name": "Bad", "kind": "kafka"})
    path = write(tmp_path, doc)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value).splitlines() == e.value.problems
    assert [line.removeprefix(f"{path}: ").split(":")[0] for line in e.value.problems] == [
        "sources[0] (orders).options", "sources[0] (orders).options", "sources[0] (orders).retention_ms",
        "sources[0] (orders).schedule", "sources[1] (clicks).options.timeout_s", "sources[2].name"]
    assert "missing required option(s) for kind kafka: bootstrap_servers" in e.value.problems[0]
    assert "startng_offsets (did you mean starting_offsets?)" in e.value.problems[1]


@pytest.mark.parametrize("schedule, valid", [
    (None, True), ("None", True), ("@once", True), ("@continuous", True), ("@hourly", True), ("@daily", True),
    ("@quarterly", True), ("@midnight", True), ("*/5 * * * *", True), ("0 0 30 2 *", True), ("0 0 * * 1-5", True),
    ("0 0 * * * 30", True), ("hourly", False), ("61 * * * *", False), ("* * *", False), ("@every 5m", False),
    ("0 0 * * mon-xyz", False),
])
def test_schedules_are_what_airflow_accepts(tmp_path, schedule, valid):
    """Null, Airflow's presets and the cron expressions its cron timetables accept (checked with Airflow)."""
    from airflow.sdk.definitions.timetables.trigger import CronTriggerTimetable

    if schedule not in (None, "None", "@once", "@continuous"):
        try:
            CronTriggerTimetable(schedule, timezone="UTC").validate()
            airflow_accepts = True
        except Exception:  # noqa: BLE001 - AirflowTimetableInvalid, or croniter's own error
            airflow_accepts = False
        assert airflow_accepts is valid
    path = write(tmp_path, variant(schedule=schedule))
    if valid:
        assert load_config(path).source("orders").schedule == (None if schedule == "None" else schedule)
    else:
        with pytest.raises(ConfigError, match=rf"\(orders\)\.schedule: not a cron expression .* got '{re.escape(schedule)}'"):
            load_config(path)


@pytest.mark.parametrize("settings, hours", [
    ({"retention_ms": 3_600_000}, 1.0),  # default: the AS OF window
    ({}, 1000 / 3_600_000),  # GOOD's retention_ms: 1000
    ({"retention_ms": 1}, 1 / 3_600_000),  # the default though (1 / 3_600_000) * 3_600_000 < 1 in floats
    ({"retention_ms": 7_200_000, "vacuum_retention_hours": 2}, 2.0),
    ({"retention_ms": 7_200_000, "vacuum_retention_hours": 48}, 48.0),
    ({"retention_ms": 7_200_000, "vacuum_retention_hours": 0, "force_vacuum": True}, 0.0),
])
def test_vacuum_retention_is_at_least_the_as_of_window_unless_forced(tmp_path, settings, hours):
    assert load_config(write(tmp_path, variant(**settings))).source("orders").vacuum_retention_hours == hours


@pytest.mark.parametrize("kind, options, on_bad_record, problem", [
    ("kafka", {}, None, None),  # default: fail
    ("kafka", {}, "fail", None),
    ("kafka", {}, "dead_letter", None),
    ("kafka", {"encoding": "latin-1"}, "dead_letter", None),
    ("kafka", {"encoding": "ascii"}, "dead_letter", None),
    ("kafka", {"encoding": "utf-16-le"}, "dead_letter",
     r"on_bad_record: dead_letter: encoding 'utf-16-le' is read record by record in Python"),
    ("files", {"url": "/data"}, "dead_letter", None),  # its read yields a line it cannot decode as a BadRecord
    ("postgres", {"dsn": "postgresql:///x", "slot": "s"}, "dead_letter",
     r"on_bad_record: dead_letter: kind postgres stops at a record it cannot decode; only kafka and files can"),
    ("files", {"url": "/data"}, "fail", None),
    ("kafka", {}, "skip", r"\(orders\)\.on_bad_record: must be one of fail, dead_letter, got 'skip'$"),
])
def test_on_bad_record_is_fail_or_dead_letter_where_the_kind_can(tmp_path, kind, options, on_bad_record, problem):
    if kind == "kafka":
        options = {**GOOD["sources"][0]["options"], **options}
    path = write(tmp_path, variant(kind=kind, options=options, **({"on_bad_record": on_bad_record} if on_bad_record
                                                                 else {})))
    if problem is None:
        assert load_config(path).source("orders").on_bad_record == (on_bad_record or "fail")
    else:
        with pytest.raises(ConfigError, match=rf"sources\[0\] \(orders\)\.{problem}" if problem.startswith("on_")
                           else problem):
            load_config(path)


def test_options_are_the_constructor_parameters(tmp_path, monkeypatch):
    """A kind's options come from its constructor: a new parameter is an option, with its type and range."""
    monkeypatch.setattr(sources, "_REGISTRY", dict(sources._REGISTRY))

    def make(url: str, poll_s: float = 1.0, labels: dict | None = None, any_thing=None):
        raise AssertionError("validation never builds a source")

    sources.register_source("test_kind", make, ("url",))
    good = {"url": "/d", "poll_s": 2, "labels": {"a": 1}, "any_thing": object.__name__}
    assert load_config(write(tmp_path, variant(kind="test_kind", options=good))).source("orders").options == good
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, variant(kind="test_kind", options={"url": "/d", "pol_s": 2, "poll_s": 0,
                                                                       "labels": ["a"]})))
    assert [p.split(": ", 2)[1:] for p in e.value.problems] == [
        ["sources[0] (orders).options", "unknown option(s) for kind test_kind: pol_s (did you mean poll_s?) "
                                        "(allowed: url, poll_s, labels, any_thing)"],
        ["sources[0] (orders).options.labels", "must be dict | None, got ['a']"],  # YAML sorted the keys
        ["sources[0] (orders).options.poll_s", "must be > 0 (seconds), got 0"]]


def test_kafka_client_properties_pass_through_config(tmp_path):
    options = {**GOOD["sources"][0]["options"], "config": {"client.id": "reclock", "security.protocol": "PLAINTEXT"},
               "starting_offsets": 1_767_225_600_000, "timeout_s": 2.5}
    assert load_config(write(tmp_path, variant(options=options))).source("orders").options["config"] == {
        "client.id": "reclock", "security.protocol": "PLAINTEXT"}


def test_the_committed_schema_is_the_models(capsys):
    """docs/sources.schema.json is what the model says now (regenerate: reclock config-schema > docs/sources.schema.json)."""
    assert SCHEMA_PATH.read_text() == config_schema_text(), "regenerate docs/sources.schema.json"
    assert cli.main(["config-schema"]) == 0
    assert json.loads(capsys.readouterr().out) == config_schema()
    assert DEFAULT_PATH.read_text().startswith("# yaml-language-server: $schema=../docs/sources.schema.json\n")


@pytest.mark.parametrize("doc, valid", [
    (GOOD, True),
    (variant(kind="postgres", options={"dsn": "host=/tmp", "slot": "s", "tables": ["public.items"]}), True),
    (variant(options={**GOOD["sources"][0]["options"], "startng_offsets": "latest"}), False),
    (variant(options={"topic": "t"}), False),
    (variant(retention_ms=0), False),
    (variant(kind="pubnub"), False),
    (variant(color="red"), False),
    (variant(options={**GOOD["sources"][0]["options"], "timeout_s": 0}), False),
    ({**GOOD, "sources": []}, False),
])
def test_an_editor_checks_with_the_schema_what_load_config_checks(tmp_path, doc, valid):
    """What a JSON-schema validator (as editors run) says of a file agrees with load_config on these."""
    import jsonschema

    errors = list(jsonschema.Draft202012Validator(config_schema()).iter_errors(doc))
    assert (not errors) is valid, errors
    if valid:
        load_config(write(tmp_path, doc))
    else:
        with pytest.raises(ConfigError):
            load_config(write(tmp_path, doc))


def test_the_demo_config_is_valid_for_the_schema():
    import jsonschema

    doc = yaml.safe_load(DEFAULT_PATH.read_text())
    # as editors read YAML (1.2: a date is a string)
    jsonschema.Draft202012Validator(config_schema()).validate(json.loads(json.dumps(doc, default=str)))


def test_a_loaded_config_pickles(tmp_path):
    """The per-kind entry classes are made at run time; a config still pickles (as the dataclasses did)."""
    import pickle

    config = load_config(write(tmp_path, GOOD))
    again = pickle.loads(pickle.dumps(config))
    assert again == config and type(again.source("orders")) is type(config.source("orders"))
    assert again.source("orders").offsets_unique and again.source("orders").options == config.source("orders").options


@pytest.mark.parametrize("kind, connection, options, problem", [
    ("kafka", "reclock_kafka", {"topic": "t", "group_id": "g"}, None),
    ("postgres", "reclock_pg", {"slot": "s", "tables": ["public.items"]}, None),
    ("kafka", "reclock_kafka", {"topic": "t", "group_id": "g", "bootstrap_servers": "b:9092"},
     r"\(orders\)\.options: bootstrap_servers and connection 'reclock_kafka' are given together: the connection "
     r"gives bootstrap_servers; say one or the other$"),
    ("postgres", "reclock_pg", {"dsn": "host=/tmp", "slot": "s"}, r"\(orders\)\.options: dsn and connection"),
    ("kafka", "reclock_kafka", {"topic": "t"}, r"\(orders\)\.options: missing required option\(s\) for kind kafka: "
                                               r"group_id$"),
    ("kafka", "", {"topic": "t", "group_id": "g"},
     r"\(orders\)\.connection: must be a non-empty string \(an Airflow connection id\), got ''$"),
    ("files", "logs", {"url": "/data"}, r"\(orders\)\.connection: only kinds with an Airflow connection type take "
                                        r"a connection \(kafka, postgres\), got 'logs'$"),
])
def test_a_connection_id_instead_of_the_address(tmp_path, kind, connection, options, problem):
    """An Airflow connection id names the upstream (resolved when a step runs, reclock.connections), instead of,
    not together with, the options it gives; loading the file reads no connection."""
    path = write(tmp_path, variant(kind=kind, connection=connection, options=options))
    if problem is None:
        source = load_config(path).source("orders")
        assert source.connection == connection and source.options == options
    else:
        with pytest.raises(ConfigError, match=problem):
            load_config(path)
