"""Shared fixtures. Other test modules may add fixtures here."""
from __future__ import annotations

import json
import os
import sys
import uuid
from collections import Counter
from contextlib import contextmanager

import pytest

from reclock.engine import Frontier

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- the order workers take test files in ----------------------------------------------------------

#: The test files that take longest (measured: pytest --durations), handed to the workers first, so that the last
#: file a worker takes is a short one and neither worker waits long for the other at the end (`make test` passes
#: --no-loadscope-reorder, else xdist orders files by their number of tests).  A scheduling hint only: any order
#: gives the same results.
LONGEST_FIRST = ("test_pipeline.py", "test_connections.py", "test_postgres_snapshot.py", "test_warehouse.py",
                 "test_pipeline_sources.py", "test_recorded_gauges.py", "test_checks.py", "test_backfill.py",
                 "test_upstream.py", "test_spark_connect.py", "test_races.py", "test_postgres_types.py",
                 "test_dags.py", "test_kinesis_source.py", "test_spark_source.py", "test_progress_view.py",
                 "test_airflow_e2e.py", "test_standalone.py", "test_truncate.py", "test_transactions.py",
                 "test_secrets.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order is kept


# --- one set of servers per test run (devtools.services) ------------------------------------------


def pytest_configure(config):
    """The controller (not an xdist worker) opens the run's shared servers and hands them to the workers."""
    from devtools import services

    if not hasattr(config, "workerinput"):
        config.reclock_load_at_start = _load_average()  # what else ran on the machine, for the wall time's reader
        config.reclock_servers = services.Run.open()
        # Every Spark JVM of the run (workers', steps', servers') keeps its scratch (block manager, userFiles,
        # pyspark) in the run directory, removed at the end: a JVM a test kills cannot clean its own.
        scratch = config.reclock_servers.dir / "spark-scratch"
        scratch.mkdir()
        os.environ.setdefault("SPARK_LOCAL_DIRS", str(scratch))
        # The check steps of the run validate through one Great Expectations validator (reclock.validator), the
        # run's own, stopped at its end.
        os.environ["RECLOCK_VALIDATOR_DIR"] = str(config.reclock_servers.dir / services.VALIDATOR)
        # Keys reclock keeps for the user (reclock.spark.kafka.read_key) go to the run directory, not the home.
        os.environ["XDG_STATE_HOME"] = str(config.reclock_servers.dir / "state")
        if config.pluginmanager.hasplugin("xdist"):
            config.pluginmanager.register(_HandServersToWorkers(config.reclock_servers.dir))


class _HandServersToWorkers:
    def __init__(self, directory):
        self.directory = str(directory)

    def pytest_configure_node(self, node):
        node.workerinput["reclock_servers"] = self.directory


def _load_average() -> str:
    """The 1-, 5- and 15-minute load averages, as ``uptime`` prints them."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def pytest_unconfigure(config):
    run = getattr(config, "reclock_servers", None)
    if run is not None:
        run.close()


def shared_server(config, name: str) -> dict:
    """The address of the run's shared server ``name`` (started on first use: devtools.services)."""
    from devtools import services

    directory = config.workerinput["reclock_servers"] if hasattr(config, "workerinput") else config.reclock_servers.dir
    return services.address(directory, name)


@pytest.fixture(scope="session")
def kafka_broker(pytestconfig):
    """Bootstrap string ``host:port`` of the run's Apache Kafka broker (KRaft)."""
    return shared_server(pytestconfig, "kafka")["bootstrap"]


@pytest.fixture
def kafka_topic(kafka_broker):
    """Factory: ``kafka_topic(partitions=1, prefix="t")`` creates a fresh topic on the run's broker
    and returns its name."""
    from devtools.kafka_broker import create_topic

    def make(partitions: int = 1, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        create_topic(kafka_broker, name, partitions=partitions)
        return name

    return make


@pytest.fixture(scope="session")
def spark_connect(pytestconfig):
    """URL ``sc://127.0.0.1:PORT`` of the run's Spark Connect server with reclock's jars and settings (a
    long-lived Spark: devtools.spark_connect).  Its clients run in subprocesses (airflow_env.run_python): a
    process with a local session (the ``spark`` fixture's) cannot open a Connect session too."""
    return shared_server(pytestconfig, "spark_connect")["url"]


class SharedKinesis:
    """The run's kinesis-local server, as tests use it: ``endpoint``, ``client()``, ``options()``."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint

    def client(self):
        from devtools.kinesis_server import client

        return client(self.endpoint)

    def options(self) -> dict:
        from devtools.kinesis_server import CREDENTIALS, REGION

        return {"endpoint_url": self.endpoint, "region": REGION, **CREDENTIALS}


@pytest.fixture(scope="session")
def kinesis_server(pytestconfig):
    """The run's Kinesis-compatible server (kinesis-local, on Node.js)."""
    return SharedKinesis(shared_server(pytestconfig, "kinesis")["endpoint"])


@pytest.fixture
def kinesis_stream(kinesis_server):
    """Factory: ``kinesis_stream(shards=1)`` creates a fresh stream on the run's server; its name."""
    from devtools.kinesis_server import create_stream

    def make(shards: int = 1, prefix: str = "s") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        create_stream(kinesis_server.client(), name, shards=shards)
        return name

    return make


class SharedPostgres:
    """The run's Postgres cluster (wal_level=logical), as tests use it: ``dsn(dbname)``."""

    def __init__(self, socket: str, port: int):
        self.socket, self.port = socket, port

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host={self.socket} port={self.port} user=postgres dbname={dbname}"


@pytest.fixture(scope="session")
def pg_cluster(pytestconfig):
    """The run's private Postgres cluster (skips when Postgres is not installed)."""
    from devtools.pg_cluster import pg_bin_dir

    if pg_bin_dir() is None:
        pytest.skip("PostgreSQL server binaries not installed")
    info = shared_server(pytestconfig, "postgres")
    return SharedPostgres(info["socket"], info["port"])


@contextmanager
def fresh_database(cluster, *statements: str):
    """A new database of ``cluster`` with ``statements`` run in it; its DSN.  Afterwards the database and its
    replication slots are dropped.  Slot names are the cluster's, not the database's: two test files that run at
    once on the run's cluster must not use the same slot name."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(cluster.dsn(), autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    with psycopg.connect(cluster.dsn(name), autocommit=True) as c:
        for statement in statements:
            c.execute(statement)
    try:
        yield cluster.dsn(name)
    finally:
        with psycopg.connect(cluster.dsn(), autocommit=True) as c:
            for (slot,) in c.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s",
                                     (name,)).fetchall():
                c.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            c.execute(f"DROP DATABASE {name} WITH (FORCE)")


# --- Spark, only where asked ----------------------------------------------------------------------

# Every local Spark session of a test process, the ``spark`` fixture's or one a step starts itself, runs its Python
# workers on this interpreter (Spark's default, `python3` on PATH, is not the venv) and has the S3 jars
# tests/test_s3.py needs, whichever test starts it first.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("RECLOCK_SPARK_S3", "1")


@pytest.fixture(scope="session")
def spark():
    """A local[2] Spark session.  Only tests that ask for it (or run a step that starts Spark) get a JVM:
    ``pytest tests/test_engine.py`` starts none."""
    from reclock.spark.session import get_spark

    session = get_spark("local[2]", app_name="reclock-tests")
    yield session
    session.stop()


def wait_for(condition, timeout: float, what: str, every: float = 0.05):
    """Poll ``condition()`` until it is truthy (returned) or ``timeout`` seconds passed (AssertionError naming
    ``what``): a test waits on the event it needs (a port, a file, a commit), never for a fixed time."""
    import time

    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        time.sleep(every)
    return result


def stage_parquet(tables, upto: int, rows: list[dict], schema=None) -> str:
    """Stage ``rows`` for the bindings up to ``upto`` as a completed Spark job would (one Parquet file and
    ``_SUCCESS`` in a fresh attempt directory), with pyarrow: no Spark job; returns the attempt directory.

    ``schema`` (default: the reclocked table's) lets a test stage a file the publish must refuse.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from reclock.storage import SUCCESS

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
    from reclock import runtime

    with runtime.open_source(name, config) as ctx:
        table = ctx.tables.read_reclocked_arrow().to_pylist()
    return sorted((r["value"], r["partition"], r["offset"], r["into_time"], r["diff"]) for r in table)


def engine_rows(name, config):
    """What the engine's single-writer ``reclock()`` gives for every record upstream (read with the source's own
    client, no Spark) under the stored remap: ``(value, partition, offset, into_time, diff)`` rows, sorted."""
    from reclock import runtime
    from reclock.engine import reclock

    with runtime.open_source(name, config) as ctx:
        remap, upper = ctx.tables.read_remap(), ctx.source.upper()
        updates = [(data["value"], p, offset, diff)
                   for p, end in upper for data, offset, diff in ctx.source.read(p, 0, end)]
    return sorted(tuple(r) for r in reclock(updates, remap))


def assert_reclocked_is_replay(name, config, spark):
    """Publish what is bound (one writer), then the reclocked table must equal the engine's single-writer
    ``reclock()`` of every record upstream under the same remap: nothing lost, nothing counted twice."""
    from reclock import pipeline, runtime
    from reclock.engine import reclock

    pipeline.stage(name, config, spark)
    pipeline.check(name, config)
    pipeline.publish(name, config, spark)
    with runtime.open_source(name, config) as ctx:
        remap = ctx.tables.read_remap()
        updates = [(d["value"], p, o, diff) for p, upper in ctx.source.upper()
                   for d, o, diff in ctx.source.read(p, 0, upper)]
    expected = sorted((d, p, o, t, diff) for d, p, o, t, diff in reclock(updates, remap))
    assert expected and reclocked_rows(name, config) == expected


def as_of_views(spark, t: int, names, config) -> dict:
    """Spark's AS OF views of ``names`` at ``t`` (:func:`reclock.query.register_as_of`), each checked against the
    views of the JVM-free query (:func:`reclock.query.duckdb_as_of`): the same columns, the same rows as multisets,
    or the same refusal.  ``{view: Counter of rows}``; a :class:`QueryError` both raised is raised."""
    from reclock.query import QueryError, duckdb_as_of, register_as_of

    def rows(records):
        return Counter(tuple(bytes(v) if isinstance(v, (bytes, bytearray)) else v for v in r) for r in records)

    try:
        register_as_of(spark, t, list(names), config)
    except QueryError as spark_refusal:
        with pytest.raises(QueryError) as duckdb_refusal:
            duckdb_as_of(t, list(names), config)
        assert str(duckdb_refusal.value) == str(spark_refusal)
        raise
    con, _ = duckdb_as_of(t, list(names), config)
    views = {}
    for view in [v for n in names for v in (n, f"{n}_progress")]:
        table = con.table(view).to_arrow_table()
        views[view] = rows(spark.table(view).collect())
        assert table.column_names == spark.table(view).columns, view
        assert rows(tuple(r.values()) for r in table.to_pylist()) == views[view], (view, t)
    typed = {v for v, in con.sql("SELECT view_name FROM duckdb_views() WHERE temporary AND NOT internal").fetchall()
             if not v.startswith("_reclock_")} - set(views)
    for view in sorted(typed):  # a Postgres source's typed views, compared through Arrow (timestamps with zones)
        table, theirs = con.table(view).to_arrow_table(), spark.table(view).toArrow()
        assert table.column_names == theirs.column_names, view

        def values(arrow):
            return rows(tuple("NaN" if v != v else v for v in r.values()) for r in arrow.to_pylist())

        views[view] = values(theirs)
        assert values(table) == views[view], (view, t)
    return views


def run_cli(config, *args, env_extra=None):
    """``reclock --config config *args`` as a process of its own session (kill it with os.killpg); with
    ``RECLOCK_KILL_AT`` in ``env_extra``, with that crash point (:mod:`devtools.crash_points`)."""
    import subprocess

    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, **(env_extra or {})}
    entry = "devtools.crash_points" if "RECLOCK_KILL_AT" in (env_extra or {}) else "reclock.cli"
    return subprocess.Popen([sys.executable, "-m", entry, "--config", config, *args], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


class WarmCommands:
    """``reclock --config config ...`` processes started ahead of their use (:mod:`devtools.warm_step`): each has
    imported what a step imports and opened the sources file's Spark (a local JVM, or a Connect client) before
    it is asked for its command: ``ahead`` of them start at once, and another each time one is taken.  :meth:`run` returns the process
    like :func:`run_cli` does (its own session: kill it with os.killpg; stdout and stderr in one pipe), so a
    test that runs many commands in a row (the SIGKILL fault test) waits for none of their cold starts."""

    def __init__(self, config: str, ahead: int = 1, uses: int | None = None):
        """``uses``: how many commands the test expects to run (no more start ahead than that: a started JVM
        costs CPU whether used or not)."""
        self.config, self.ahead, self.left = config, ahead, uses
        self.ready = []
        self._top_up()

    def _top_up(self) -> None:
        while len(self.ready) < self.ahead and (self.left is None or self.left > len(self.ready)):
            self.ready.append(self._start())

    def _start(self):
        import subprocess

        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        return subprocess.Popen([sys.executable, "-m", "devtools.warm_step", self.config], env=env,
                                cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def run(self, *args, env_extra=None):
        proc = self.ready.pop(0) if self.ready else self._start()
        if self.left is not None:
            self.left -= 1
        self._top_up()
        proc.stdin.write((json.dumps({"argv": list(args), "env": env_extra or {}}) + "\n").encode())
        proc.stdin.close()
        proc.stdin = None  # so communicate() reads its output as of a run_cli process
        return proc

    def close(self) -> None:
        for proc in self.ready:
            proc.stdin.close()  # an unused one exits on end of input, stopping its Spark
            proc.stdin = None
        for proc in self.ready:
            try:
                proc.communicate(timeout=120)
            except Exception:
                os.killpg(proc.pid, 9)
                proc.wait()
        self.ready = []


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


#: Per xdist worker: the test files it ran, their summed durations, and when its last test ended (controller only).
_WORKERS: dict = {}


def pytest_runtest_logreport(report):
    node = getattr(report, "node", None)  # set by xdist on the controller's copy of a worker's report
    if node is None:
        return
    import time

    worker = _WORKERS.setdefault(node.workerinput["workerid"], {"files": Counter(), "ended": 0.0})
    worker["files"][report.nodeid.split("::")[0]] += report.duration
    worker["ended"] = time.time()


def pytest_terminal_summary(terminalreporter, config):
    """The wall time of ``make test`` (set-up included) when it started this run, and when each worker ended: the
    gap between the workers is what a better file order (LONGEST_FIRST) could save."""
    started = os.environ.get("RECLOCK_MAKE_STARTED")
    if started and not hasattr(config, "workerinput"):
        import time

        seconds = int(time.time()) - int(started)
        terminalreporter.write_line(f"make test: wall time {seconds // 60} min {seconds % 60} s (set-up included); "
                                    f"load average {config.reclock_load_at_start} at the tests' start, "
                                    f"{_load_average()} at their end")
        for name, worker in sorted(_WORKERS.items()):
            at = int(worker["ended"]) - int(started)
            longest = ", ".join(f"{f.split('/')[-1]} {s:.0f} s" for f, s in worker["files"].most_common(3))
            terminalreporter.write_line(f"make test: worker {name} ran {len(worker['files'])} files, "
                                        f"{sum(worker['files'].values()):.0f} s of tests, its last ended "
                                        f"{at // 60} min {at % 60} s after make started (longest: {longest})")
