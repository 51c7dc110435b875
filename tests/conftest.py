"""Shared fixtures. Other test modules may add fixtures here."""
from __future__ import annotations

import json
import os
import sys
import uuid
from collections import Counter

import pytest

from reclock.engine import Frontier


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


@pytest.fixture(scope="session")
def spark_connect():
    """URL ``sc://127.0.0.1:PORT`` of a local Spark Connect server with reclock's jars and settings (a long-lived
    Spark: devtools.spark_connect), one per test session.  Its clients run in subprocesses (airflow_env.run_python):
    a process with a local session (this one: the ``spark`` fixture) cannot open a Connect session too."""
    from devtools.spark_connect import LocalSparkConnect

    with LocalSparkConnect() as server:
        yield server.url


@pytest.fixture(scope="session")
def kinesis_server():
    """A Kinesis-compatible server (kinesis-local, on Node.js) on a free port, one per test session; stopped by PID."""
    from devtools.kinesis_server import KinesisServer

    with KinesisServer() as server:
        yield server


@pytest.fixture
def kinesis_stream(kinesis_server):
    """Factory: ``kinesis_stream(shards=1)`` creates a fresh stream on the session server; its name."""
    from devtools.kinesis_server import create_stream

    def make(shards: int = 1, prefix: str = "s") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        create_stream(kinesis_server.client(), name, shards=shards)
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


def spark_settings(remote: str | None = None) -> dict:
    """The sources file's ``spark``: a local master, or the Spark Connect server ``remote`` (the ``spark_connect``
    fixture's URL: its steps then run as Connect clients, and must run in subprocesses of the test)."""
    return {"master": "local[2]"} if remote is None else {"remote": remote}


def write_config(tmp_path, bootstrap, topics, spark_remote: str | None = None, **options):
    """A sources file with one Kafka source per topic (``options`` added to each), warehouse under tmp_path;
    ``spark_remote``: see :func:`spark_settings`."""
    import yaml

    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump({
        "warehouse": str(tmp_path / "warehouse"),
        "spark": spark_settings(spark_remote),
        "sources": [{"name": name, "kind": "kafka", "retention_ms": 10_000,
                     "options": {"bootstrap_servers": bootstrap, "topic": topic, "group_id": f"g-{topic}", **options}}
                    for name, topic in topics.items()],
    }))
    return str(path)


def write_sources_config(tmp_path, *sources, retention_ms=2_500, spark_remote: str | None = None):
    """A sources file with the given ``(name, kind, options)`` sources, warehouse under tmp_path; ``spark_remote``:
    see :func:`spark_settings`."""
    import yaml

    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump({
        "warehouse": str(tmp_path / "warehouse"),
        "spark": spark_settings(spark_remote),
        "sources": [{"name": name, "kind": kind, "retention_ms": retention_ms, "options": options}
                    for name, kind, options in sources],
    }))
    return str(path)


def over_connect(config: str, remote: str) -> str:
    """A copy of the sources file ``config``, beside it, whose steps are clients of the Spark Connect server
    ``remote`` (the ``spark_connect`` fixture's URL): the same sources and warehouse, without a cold JVM in a
    step's process (run such steps in subprocesses: see :func:`spark_settings`)."""
    import shutil

    path = shutil.copyfile(config, os.path.join(os.path.dirname(config), "sources-connect.yaml"))
    edit_config(path, lambda doc: doc.update(spark=spark_settings(remote)))
    return path


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


def engine_rows(name, config):
    """What the engine's single-writer ``reclock()`` gives for every record upstream (read with the source's own
    client, no Spark) under the stored remap: ``(value, partition, offset, into_time, diff)`` rows, sorted."""
    from reclock import pipeline
    from reclock.engine import reclock

    with pipeline.open_source(name, config) as ctx:
        remap, upper = ctx.tables.read_remap(), ctx.source.upper()
        updates = [(data["value"], p, offset, diff)
                   for p, end in upper for data, offset, diff in ctx.source.read(p, 0, end)]
    return sorted(tuple(r) for r in reclock(updates, remap))


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


# --- engine laws on a stream's records (recorded or live) ----------------------------------------


def canonical(data) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def updates_of(records) -> list[tuple]:
    """Engine updates ``(data, partition, offset, diff)`` of records ``{"partition", "offset", "data"}``
    (offsets as ints)."""
    return [(canonical(r["data"]), r["partition"], int(r["offset"]), 1) for r in records]


def upper_of(records) -> Frontier:
    last: dict = {}
    for r in records:
        last[r["partition"]] = max(last.get(r["partition"], 0), int(r["offset"]) + 1)
    return Frontier.of(last)


def check_engine_laws(data, records) -> None:
    """The engine laws on ``records`` (in an order that keeps each partition's offsets increasing), ticked at
    points hypothesis draws from ``data``: remap is monotone and replays exactly, every record lands at the
    first tick whose prefix holds it, AS OF a tick is exactly the records up to it, compaction commutes."""
    from hypothesis import strategies as st

    from reclock.engine import Remap, as_of, compact_updates, reclock

    cuts = sorted(data.draw(st.sets(st.integers(0, len(records)), max_size=6)))
    remap, t, ticks = Remap(), 1_700_000_000_000, []
    for cut in cuts:
        t += data.draw(st.integers(1, 5_000))
        remap = remap.mint(t, upper_of(records[:cut]))
        ticks.append((t, cut))
    updates = updates_of(records)
    for before, after in zip(remap.bindings, remap.bindings[1:]):  # monotone
        assert before.into_time < after.into_time and before.frontier.less_equal(after.frontier)
    assert Remap.from_increments(remap.increments(), remap.since, remap.upper) == remap  # exact replay
    # every record lands at the first tick whose prefix of the recording holds it
    for i, (d, p, o, _) in enumerate(updates):
        expected = next((t for t, cut in ticks if cut > i), None)
        assert remap.into_time_of(p, o) == expected
    reclocked = reclock(updates, remap)
    for t, cut in ticks:  # AS OF a tick: exactly the records up to it
        assert as_of(reclocked, t) == Counter(d for d, *_ in updates[:cut])
    since = data.draw(st.integers(remap.since, max(remap.since, remap.upper - 1)))
    compacted = remap.compact(since)  # compaction commutes with reclocking
    assert Counter({r[:4]: r[4] for r in reclock(updates, compacted)}) == compact_updates(reclocked, since)
    for _, p, start, end in compacted.ranges():  # ranges never split a record from its IntoTime
        assert start < end
