"""Shared fixtures. Other test modules may add fixtures here."""
from __future__ import annotations

import os
import sys
import uuid

import pytest


@pytest.fixture(scope="session")
def kafka_broker():
    """Bootstrap string ``host:port`` of a local Apache Kafka broker (KRaft), one per test session."""
    from devtools.kafka_broker import LocalBroker

    with LocalBroker() as broker:
        yield broker.bootstrap


@pytest.fixture
def kafka_topic(kafka_broker):
    """Factory: ``kafka_topic(partitions=1, prefix="t")`` creates a fresh topic on the session broker
    and returns its name."""
    from devtools.kafka_broker import create_topic

    def make(partitions: int = 1, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        create_topic(kafka_broker, name, partitions=partitions)
        return name

    return make


@pytest.fixture(scope="session", autouse=True)
def spark():
    """A local[2] Spark session whose Python workers run this interpreter (so they import reclock).

    Autouse: it is the session's first Spark session, so the one every in-process step gets back
    from ``getOrCreate`` has the S3 jars that tests/test_s3.py needs."""
    # Spark's Python workers default to `python3` on PATH, which is not the venv.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from reclock.spark_session import get_spark

    session = get_spark("local[2]", app_name="reclock-tests", s3=True)  # s3a too: tests/test_s3.py
    yield session
    session.stop()


def stage_parquet(tables, upto: int, rows: list[dict], schema=None) -> str:
    """Stage ``rows`` for the bindings up to ``upto`` as a completed Spark job would (one Parquet file and
    ``_SUCCESS`` in a fresh attempt directory), with pyarrow: no Spark job; returns the attempt directory.

    ``schema`` (default: the reclocked table's) lets a test stage a file the publish must refuse.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from reclock.warehouse import SUCCESS

    directory = tables.staging_dir(upto)
    os.makedirs(directory)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema or tables.schemas["reclocked"]),
                   f"{directory}/part-00000.parquet")
    open(f"{directory}/{SUCCESS}", "w").close()
    return directory


def write_config(tmp_path, bootstrap, topics, **options):
    """A sources file with one Kafka source per topic (``options`` added to each), warehouse under tmp_path."""
    import yaml

    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump({
        "warehouse": str(tmp_path / "warehouse"),
        "spark": {"master": "local[2]"},
        "sources": [{"name": name, "kind": "kafka", "retention_ms": 10_000,
                     "options": {"bootstrap_servers": bootstrap, "topic": topic, "group_id": f"g-{topic}", **options}}
                    for name, topic in topics.items()],
    }))
    return str(path)


def write_sources_config(tmp_path, *sources, retention_ms=2_500):
    """A sources file with the given ``(name, kind, options)`` sources, warehouse under tmp_path."""
    import yaml

    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump({
        "warehouse": str(tmp_path / "warehouse"),
        "spark": {"master": "local[2]"},
        "sources": [{"name": name, "kind": kind, "retention_ms": retention_ms, "options": options}
                    for name, kind, options in sources],
    }))
    return str(path)


def edit_config(config, edit) -> None:
    """Rewrite the sources file ``config`` with ``edit(doc)`` applied to its YAML document (a dict) in place."""
    import yaml

    with open(config) as f:
        doc = yaml.safe_load(f)
    edit(doc)
    with open(config, "w") as f:
        yaml.safe_dump(doc, f)


def reclocked_rows(name, config):
    from reclock import pipeline

    with pipeline.open_source(name, config) as ctx:
        table = ctx.tables.read_reclocked_arrow().to_pylist()
    return sorted((r["value"], r["partition"], r["offset"], r["into_time"], r["diff"]) for r in table)


def assert_reclocked_is_replay(name, config, spark):
    """Publish what is bound (one writer), then the reclocked table must equal the engine's single-writer
    ``reclock()`` of every record upstream under the same remap: nothing lost, nothing counted twice."""
    from reclock import pipeline
    from reclock.engine import reclock

    pipeline.stage(name, config, spark)
    pipeline.check(name, config)
    pipeline.publish(name, config, spark)
    with pipeline.open_source(name, config) as ctx:
        remap = ctx.tables.read_remap()
        updates = [(d["value"], p, o, diff) for p, upper in ctx.source.upper()
                   for d, o, diff in ctx.source.read(p, 0, upper)]
    expected = sorted((d, p, o, t, diff) for d, p, o, t, diff in reclock(updates, remap))
    assert expected and reclocked_rows(name, config) == expected


def run_cli(config, *args, env_extra=None):
    """``reclock --config config *args`` as a process of its own session (kill it with os.killpg)."""
    import subprocess

    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, **(env_extra or {})}
    return subprocess.Popen([sys.executable, "-m", "reclock.cli", "--config", config, *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
