"""No secret of a source in any log line or error (issue 40 item 4, :mod:`reclock.secrets`): which option values are
secrets, their masking in every logger's records, and a tick and a stage of a Postgres source (a DSN with a
password) and a Kafka source (a SASL password) with every logger at DEBUG, py4j's included."""
from __future__ import annotations

import logging
import uuid

import pytest

from conftest import fresh_database, write_sources_config
from devtools.kafka_broker import produce
from reclock import pipeline, secrets


@pytest.mark.parametrize("options, expected", [
    ({"dsn": "host=/tmp port=5432 password=pg-pass-1 dbname=x"}, {"pg-pass-1"}),
    ({"dsn": "postgresql://alice:uri-pass-2@db.example:5432/app"}, {"uri-pass-2"}),
    ({"dsn": r"host=h password='two words\'q' dbname=x"}, {r"'two words\'q'", "two words'q"}),
    ({"config": {"sasl.username": "alice", "sasl.password": "kafka-pass-3"}}, {"kafka-pass-3"}),
    ({"config": {"ssl.key.password": "key-pass-4"}}, {"key-pass-4"}),
    ({"aws_access_key_id": "AKIAEXAMPLE", "aws_secret_access_key": "aws-secret-5"}, {"aws-secret-5"}),
    ({"dsn": "host=h dbname=x"}, set()),  # no password
    ({"password": "abc"}, set()),  # shorter than MIN_CHARS: it would mask every word it occurs in
    ({"topic": "password-topic", "group_id": "g"}, set()),  # a name, not a secret
])
def test_the_secrets_of_a_sources_options(options, expected):
    assert secrets.secrets_of(options) == expected


def test_a_remembered_secret_is_masked_in_every_loggers_records(caplog, monkeypatch):
    """A secret in a record's message, its arguments, and the exception it logs (and the one that caused it),
    whether a formatter writes the record's exception text (the stdlib's) or renders the exception itself
    (structlog's, as Airflow's task logs do)."""
    import io

    import structlog

    monkeypatch.setattr(secrets, "_secrets", frozenset())  # not the secrets other tests' sources left (e.g. "reclock")
    secret = f"hunter-{uuid.uuid4().hex[:8]}"
    secrets.remember([secret])
    caplog.set_level(logging.DEBUG)
    rendered = io.StringIO()
    handler = logging.StreamHandler(rendered)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(processors=[
        structlog.stdlib.ProcessorFormatter.remove_processors_meta,  # tracebacks as dicts, as Airflow's: no locals
        structlog.processors.ExceptionRenderer(structlog.tracebacks.ExceptionDictTransformer(show_locals=False)),
        structlog.processors.JSONRenderer()]))
    task_log = logging.getLogger("airflow.task")
    task_log.addHandler(handler)
    try:
        logging.getLogger("py4j.clientserver").debug("Command to send: %s", f"c\no1\noption\ns{secret}\ne\n")
        logging.getLogger("reclock").info(f"connecting with {secret}")
        try:
            try:
                raise KeyError(f"password={secret}")
            except KeyError as e:
                raise RuntimeError(f"could not connect: password={secret}") from e
        except RuntimeError:
            task_log.exception("the task failed")
    finally:
        task_log.removeHandler(handler)
    # as the stdlib writes each record (caplog's own formatter may be another test's: pyspark's JSON one, say)
    written = "\n".join(logging.Formatter().format(r) for r in caplog.records)
    assert secret not in written and written.count(secrets.MASK) == 4  # command, message, error and cause
    assert secret not in rendered.getvalue() and rendered.getvalue().count(secrets.MASK) == 2  # error and cause
    assert secrets.redact(f"reclock: error: {secret}!") == f"reclock: error: {secrets.MASK}!"


def test_a_tick_and_a_stage_at_debug_log_no_password(pg_cluster, kafka_broker, kafka_topic, spark, tmp_path, caplog):
    """Every logger at DEBUG (py4j logs each command it sends the JVM: the Spark options, the source's spec with
    its DSN, the Kafka JAAS config): a Postgres source's first tick (its snapshot copied by Spark) and stage, and a
    Kafka source's tick and stage (Spark's Kafka source), then a Postgres source that cannot connect.  Neither
    password is in any record or error; the masks show where they would have been."""
    pg_password, kafka_password = (f"{what}-{uuid.uuid4().hex[:10]}" for what in ("pgpw", "kafkapw"))
    topic = kafka_topic()
    produce(kafka_broker, topic, [("k", "v1"), ("k", "v2")])
    with fresh_database(pg_cluster, "CREATE TABLE acct (id int PRIMARY KEY, v text)",
                        "INSERT INTO acct VALUES (1, 'a'), (2, 'b')") as dsn:
        config = write_sources_config(
            tmp_path,
            ("acct", "postgres", {"dsn": f"{dsn} password={pg_password}", "slot": "s_secrets", "tables": ["acct"]}),
            ("clicks", "kafka", {"bootstrap_servers": kafka_broker, "topic": topic, "group_id": "g-secrets",
                                 "config": {"sasl.mechanism": "PLAIN", "sasl.username": "alice",
                                            "sasl.password": kafka_password}}),
            ("down", "postgres", {"dsn": f"host=127.0.0.1 port=1 dbname=x password={pg_password}", "slot": "s_down",
                                  "tables": ["acct"]}))
        caplog.set_level(logging.DEBUG)
        for name in ("acct", "clicks"):
            pipeline.run_once(name, config, spark, steps=("tick", "stage"), now=1_000)
        with pytest.raises(Exception) as failed:
            pipeline.tick("down", config, now=1_000)
    text = caplog.text + "\n" + str(failed.value)
    assert pg_password not in text and kafka_password not in text
    assert any(r.name.startswith("py4j") for r in caplog.records), "py4j logged nothing at DEBUG"
    assert text.count(secrets.MASK) >= 2  # masked where the py4j commands carried them
