"""The production-shaped soak (``make soak``'s part ``production``; issue 37): reclock under Airflow as it runs where
one machine is not enough, for ``--minutes`` with records arriving all the time and faults injected on a timer.

The platform:

* Airflow with the CeleryExecutor: a Redis broker (Debian's ``redis-server``), two Celery workers, a Postgres
  metadata database, and ``scheduler``, ``dag-processor`` and ``api-server`` as processes of their own;
* Spark Connect on a Spark standalone cluster (a master and 2 workers);
* the warehouse on S3 (a moto server), three sources scheduled every minute: ``orders`` (Kafka, 2 partitions),
  ``payments`` (Postgres logical replication, with its typed table) and ``weblogs`` (files).

Every ``--every`` seconds the generators write to all three.  Every ``--fault-every`` seconds one fault, in turn:
the Spark Connect server SIGKILLed and restarted; the broker restarted; the scheduler SIGKILLed and restarted; a
running task process of a step that commits (tick, publish, compact) SIGKILLed; a manual DAG run triggered, and
``reclock run`` started from the command line, beside a scheduled run.  Every minute each source's answer AS OF
its latest complete IntoTime is recorded (a count and a digest of its contents).

Then the generators stop and the schedule goes on until every source has published what its upstream holds, and:

* ``orders``: every ``(partition, offset)`` of the topic published once, nothing else;
* ``payments``: the published rows are the table's rows, each once (by primary key and contents);
* ``weblogs``: the published lines are the files' lines, each once;
* every recorded AS OF answer is the same again, unless compaction folded its time away (then refused);
* no DAG run is left queued or running;
* no check failed: nothing corrupt is injected, so a failed check (a run racing another of its source, a fault)
  is a wrong answer of the checks.

What it finds goes to ``--out`` (JSON: the faults and when, the runs by state, the records, the anomalies);
``python -m devtools.soak --part production`` merges it into ``soak/results.json``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from contextlib import ExitStack
from pathlib import Path

import yaml

from devtools.airflow_home import AIRFLOW, PYTHON, REPO, http_ok, migrate, run, stop_group
from devtools.demo import KAFKA_CONN, PG_CONN, connections
from devtools.kafka_broker import LocalBroker, create_topic, free_port, produce
from devtools.moto_server import MotoServer
from devtools.pg_cluster import PgCluster
from devtools.spark_cluster import LocalSparkCluster
from devtools.spark_connect import LocalSparkConnect
from devtools.up import platform_env, schedule_every_minute

log = logging.getLogger("production-soak")
BUCKET = "reclock-soak"
SOURCES = ("orders", "payments", "weblogs")
COMMITTING = ("tick", "publish", "compact")  # the steps whose task processes the task fault kills
STUCK_MINUTES = 15  # a run queued this long ago and not ended at the end is stuck (its tasks time out sooner)
FAULTS = ("spark-connect", "broker", "scheduler", "task", "manual-run")
ANSWERS = {  # DuckDB over a source's AS OF view: a count and a digest of its contents
    "orders": 'SELECT count(*), coalesce(sum(hash("partition", "offset", "value")), 0) FROM orders',
    "payments": 'SELECT count(*), coalesce(sum(hash("table", "row")), 0) FROM payments',
    "weblogs": 'SELECT count(*), coalesce(sum(hash("partition", "offset", "line")), 0) FROM weblogs',
}


def say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


class Process:
    """One platform process, in a session of its own (so a kill takes what it started), restartable."""

    def __init__(self, name: str, argv: list[str], env: dict, logs: Path) -> None:
        self.name, self.argv, self.env, self.logs = name, argv, env, logs
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        out = open(self.logs / f"{self.name}.log", "ab")
        self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.logs, stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        out.close()

    def kill(self) -> None:
        """SIGKILL to its whole session, as a machine losing it would."""
        from devtools.airflow_home import session_members

        for pid in session_members(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop_group(self.proc)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Soak:
    def __init__(self, args, directory: Path, stack: ExitStack) -> None:
        self.args, self.dir, self.stack = args, directory, stack
        self.rng = random.Random(args.seed)
        self.kafka_lock = threading.Lock()  # the generators do not write while the broker restarts
        self.stop_generating = threading.Event()
        self.faults: list[dict] = []
        self.answers: list[dict] = []  # recorded AS OF answers
        self.anomalies: list[str] = []
        self.written = {"orders": 0, "payments": 0, "weblogs": 0, "failed_rounds": 0}
        self.processes: dict[str, Process] = {}

    # --- the platform ----------------------------------------------------------------------------

    def start(self) -> None:
        d = self.dir
        say("starting Redis, Postgres, a Kafka broker, a moto S3 server, a Spark cluster and Spark Connect")
        redis_port = free_port()
        self.redis = Process("redis", ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save",
                                       "", "--appendonly", "no"], dict(os.environ), d)
        self.redis.start()
        self.stack.callback(self.redis.stop)
        self.pg = self.stack.enter_context(PgCluster())
        self.broker = self.stack.enter_context(LocalBroker(data_dir=str(d / "broker")))
        create_topic(self.broker.bootstrap, "orders", partitions=2)
        self.s3 = self.stack.enter_context(MotoServer(BUCKET))
        os.environ["RECLOCK_SPARK_S3"] = "1"  # the Connect server loads the s3a jars
        self.cluster = self.stack.enter_context(LocalSparkCluster(workers=2, cores=1, memory="1g"))
        self.connect = self.stack.enter_context(LocalSparkConnect(master=self.cluster.url, conf=self.s3.s3a_conf()))
        import psycopg

        with psycopg.connect(self.pg.dsn(), autocommit=True) as db:
            db.execute("CREATE DATABASE airflow")
            db.execute("CREATE TABLE payments (id serial PRIMARY KEY, user_id text NOT NULL, amount int NOT NULL)")
        self.logs = d / "weblogs"
        self.logs.mkdir()
        self.config = d / "sources.yaml"
        self.config.write_text(yaml.safe_dump({
            "warehouse": f"s3://{BUCKET}/warehouse",
            "storage_options": self.s3.delta_options(),
            "spark": {"remote": self.connect.url},
            "sources": [
                {"name": "orders", "kind": "kafka", "retention_ms": self.args.retention_ms, "connection": KAFKA_CONN,
                 "options": {"topic": "orders", "group_id": "reclock-orders"}},
                {"name": "payments", "kind": "postgres", "retention_ms": self.args.retention_ms,
                 "connection": PG_CONN, "options": {"slot": "reclock_payments", "tables": ["public.payments"]}},
                {"name": "weblogs", "kind": "files", "retention_ms": self.args.retention_ms,
                 "options": {"url": str(self.logs)}},
            ]}, sort_keys=False))
        schedule_every_minute(self.config)
        conns = connections(self.broker.bootstrap, self.pg.dsn())
        os.environ.update(conns)
        os.environ.update({"RECLOCK_GX_HOME": str(d / "gx"), "RECLOCK_VALIDATOR_DIR": str(d / "validator")})
        from reclock import pipeline

        pipeline.tick("payments", str(self.config))  # the replication slot, before any change

        api_port = free_port()
        self.api = f"http://127.0.0.1:{api_port}"
        db_url = f"postgresql+psycopg2://postgres@/airflow?host={self.pg.sock}&port={self.pg.port}"
        from cryptography.fernet import Fernet

        env = platform_env(d / "airflow", self.config, api_port)
        env.update(conns)
        env.update({
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db_url,
            "AIRFLOW__CELERY__BROKER_URL": f"redis://127.0.0.1:{redis_port}/0",
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{db_url}",
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "2",
            "AIRFLOW__CORE__PARALLELISM": "8",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
            "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
            "RECLOCK_GX_HOME": str(d / "gx"),
            "RECLOCK_VALIDATOR_DIR": str(d / "validator"),
            "RECLOCK_SPARK_S3": "1",
        })
        self.env = env
        say(f"migrating Airflow's metadata database (Postgres) in {d / 'airflow'}")
        migrate(d / "airflow", env)
        airflow_logs = d / "processes"
        airflow_logs.mkdir()
        for name, argv, extra in [
            ("api-server", [AIRFLOW, "api-server"], {}),
            ("scheduler", [AIRFLOW, "scheduler"], {}),
            ("dag-processor", [AIRFLOW, "dag-processor"], {}),
            ("worker-1", [AIRFLOW, "celery", "worker", "--celery-hostname", "worker1@%h", "--concurrency", "2"],
             {"AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port())}),
            ("worker-2", [AIRFLOW, "celery", "worker", "--celery-hostname", "worker2@%h", "--concurrency", "2"],
             {"AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port())}),
        ]:
            process = Process(name, argv, {**env, **extra}, airflow_logs)
            process.start()
            self.processes[name] = process
        deadline = time.monotonic() + 300
        while not http_ok(f"{self.api}/api/v2/monitor/health"):
            self.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the api-server did not come up (see {airflow_logs})")
            time.sleep(2)
        say(f"Airflow is up at {self.api}; processes: {', '.join(self.processes)}")

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if not process.alive():
                raise RuntimeError(f"{name} exited ({process.proc.returncode}): see "
                                   f"{process.logs / (name + '.log')}")

    def stop(self) -> None:
        for process in reversed(list(self.processes.values())):
            process.stop()
        from reclock import validator

        validator.stop(str(self.dir / "validator"))

    # --- the metadata database -----------------------------------------------------------------

    def sql(self, query: str, *params) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.pg.dsn("airflow"), autocommit=True) as db:
            return db.execute(query, params).fetchall()

    # --- records arriving --------------------------------------------------------------------------

    def generate(self) -> None:
        """A round every ``--every`` seconds until told to stop: orders, payment transactions, log lines."""
        import psycopg

        round_ = 0
        while not self.stop_generating.wait(self.args.every if round_ else 0):
            round_ += 1
            try:
                with self.kafka_lock:
                    orders = [(f"user-{self.rng.randrange(5)}", f"order-{round_}-{i}", i % 2) for i in range(20)]
                    produce(self.broker.bootstrap, "orders", orders)
                    self.written["orders"] += len(orders)
                with psycopg.connect(self.pg.dsn(), autocommit=True) as db:
                    with db.transaction():
                        for _ in range(3):
                            db.execute("INSERT INTO payments (user_id, amount) VALUES (%s, %s)",
                                       (f"user-{self.rng.randrange(5)}", self.rng.randint(1, 100)))
                    db.execute("UPDATE payments SET amount = amount + 1 WHERE id = (SELECT max(id) FROM payments)")
                    db.execute("DELETE FROM payments WHERE id = (SELECT min(id) FROM payments)")
                    self.written["payments"] += 5
                with open(self.logs / f"web-{round_ % 2}.log", "a") as f:
                    f.writelines(f"user-{self.rng.randrange(5)} GET /page/{round_}/{i}\n" for i in range(10))
                self.written["weblogs"] += 10
            except Exception as e:  # noqa: BLE001 - e.g. the broker restarting: the next round writes again
                self.written["failed_rounds"] += 1
                say(f"generator round {round_} failed: {e}")

    # --- AS OF answers ---------------------------------------------------------------------------

    def answer(self, name: str, t: int) -> tuple[int, int]:
        from reclock.query import query_as_of_duckdb

        row = query_as_of_duckdb(ANSWERS[name], t, [name], str(self.config)).to_pylist()[0]
        values = list(row.values())
        return int(values[0]), int(values[1])

    def latest(self, name: str) -> int | None:
        """The latest IntoTime ``name`` answers AS OF (within its typed tables too); None when none."""
        from reclock import runtime
        from reclock.query import readable

        window = readable(name, str(self.config))
        t = window.upper - 1
        if name == "payments":  # its typed tables are typed by the publish after the one that published
            with runtime.open_source(name, str(self.config), connect=False) as ctx:
                t = min(t, ctx.tables.typed_frontier())
        return t if t >= window.since else None

    def record_answers(self) -> None:
        """Each source's answer AS OF its latest IntoTime now; and every answer recorded before asked again while
        its time is still readable (compaction folds it away a retention later)."""
        from reclock.query import QueryError

        for recorded in self.answers:
            if recorded.get("compacted"):
                continue
            try:
                again = self.answer(recorded["source"], recorded["t"])
            except QueryError as e:
                if "compact" in str(e):
                    recorded["compacted"] = True
                    continue
                raise
            recorded["asked_again"] = recorded.get("asked_again", 0) + 1
            if again != tuple(recorded["answer"]):
                self.anomalies.append(f"{recorded['source']} AS OF {recorded['t']}: {recorded['answer']} when "
                                      f"recorded, {again} later")
        for name in SOURCES:
            try:
                if (t := self.latest(name)) is None:
                    continue
                self.answers.append({"source": name, "t": t, "answer": self.answer(name, t), "asked_again": 0})
            except Exception as e:  # noqa: BLE001 - e.g. nothing published yet
                say(f"{name}: no AS OF answer now ({type(e).__name__}: {str(e)[:200]})")

    # --- faults ------------------------------------------------------------------------------------

    def fault(self, kind: str) -> dict:
        started = time.monotonic()
        if kind == "spark-connect":
            pid = self.connect.pid
            self.connect.kill()
            self.connect.start()
            done = {"killed": pid, "restarted": self.connect.pid}
        elif kind == "broker":
            with self.kafka_lock:
                pid = self.broker.pid
                self.broker.stop()
                self.broker.start()
            done = {"stopped": pid, "restarted": self.broker.pid}
        elif kind == "scheduler":
            process = self.processes["scheduler"]
            pid = process.proc.pid
            process.kill()
            time.sleep(self.rng.uniform(0, 10))
            process.start()
            done = {"killed": pid, "restarted": process.proc.pid}
        elif kind == "task":
            done = self.kill_a_task()
        elif kind == "manual-run":
            done = self.manual_runs()
        else:
            raise ValueError(kind)
        return {"fault": kind, "at_s": round(started - self.began, 1), "took_s": round(time.monotonic() - started, 1),
                **done}

    def kill_a_task(self, timeout: float = 120.0) -> dict:
        """SIGKILL the process of a running task that commits (``COMMITTING``), the first seen within ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            running = self.sql("SELECT id::text, dag_id, task_id FROM task_instance WHERE state = 'running' AND "
                               "task_id = ANY(%s)", list(COMMITTING))
            for ti, dag, task in running:
                for pid in pids_with(f"airflow worker -- {ti}"):
                    time.sleep(self.rng.uniform(0, 0.5))  # somewhere inside the step
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        continue
                    return {"killed": pid, "dag": dag, "task": task}
            time.sleep(0.1)
        return {"killed": None, "why": f"no task of {COMMITTING} running within {timeout:.0f}s"}

    def manual_runs(self, timeout: float = 120.0) -> dict:
        """Beside a scheduled run that is running: a manual DAG run of its source, and ``reclock run`` of it.  The
        sources take turns, ``payments`` first (its check reads the published history: the race of a check and
        another run's publish); another source's run when the one whose turn it is has none running in time."""
        turn = [f"reclock_{s}" for s in ("payments", *(s for s in SOURCES if s != "payments"))]
        wanted = turn[sum(f["fault"] == "manual-run" for f in self.faults) % len(turn)]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            running = [row[0] for row in self.sql(
                "SELECT dag_id FROM dag_run WHERE state = 'running' AND run_type = 'scheduled' AND dag_id = ANY(%s)",
                [f"reclock_{s}" for s in SOURCES])]
            if wanted in running or (running and time.monotonic() > deadline - timeout / 2):
                dag = wanted if wanted in running else self.rng.choice(running)
                source = dag.removeprefix("reclock_")
                run([AIRFLOW, "dags", "trigger", dag], self.env, timeout=120)
                cli = subprocess.run([PYTHON, "-m", "reclock.cli", "run", source], env=self.env, cwd=REPO,
                                     capture_output=True, text=True, timeout=900)
                said = next((line for line in reversed(cli.stderr.splitlines()) if line.startswith("reclock:")),
                            (cli.stdout.strip().splitlines() or [""])[-1])
                if cli.returncode not in (0,) and (cli.returncode != 2 or "Traceback" in cli.stderr
                                                  or not said.startswith("reclock: error:")):
                    self.anomalies.append(f"reclock run {source} beside a scheduled run: exit {cli.returncode}, "
                                          f"not one clear line:\n{cli.stderr[-3000:]}")
                if "checks passed on" in cli.stderr:  # ChecksFailed: nothing corrupt was injected
                    self.anomalies.append(f"reclock run {source} beside a scheduled run: a check failed: {said[:2000]}")
                return {"dag": dag, "cli_exit": cli.returncode, "cli_said": said[:300]}
            time.sleep(0.5)
        return {"dag": None, "why": f"no scheduled run running within {timeout:.0f}s"}

    # --- the run -----------------------------------------------------------------------------------

    def soak(self) -> None:
        self.began = time.monotonic()
        generator = threading.Thread(target=self.generate, name="generator", daemon=True)
        generator.start()
        end = self.began + self.args.minutes * 60
        next_fault = self.began + self.args.fault_every
        next_answer = self.began + 60
        turn = 0
        while time.monotonic() < end:
            self.check_alive()
            now = time.monotonic()
            if now >= next_fault:
                kind = FAULTS[turn % len(FAULTS)]
                turn += 1
                try:
                    done = self.fault(kind)
                except Exception as e:  # noqa: BLE001 - the soak goes on, and says so
                    done = {"fault": kind, "error": f"{type(e).__name__}: {e}"}
                    self.anomalies.append(f"fault {kind} could not be injected: {traceback.format_exc()[-2000:]}")
                self.faults.append(done)
                say(f"fault: {json.dumps(done)}")
                next_fault = time.monotonic() + self.args.fault_every
            if now >= next_answer:
                self.record_answers()
                next_answer = now + 60
            time.sleep(1)
        self.stop_generating.set()
        generator.join(timeout=300)
        say(f"generators stopped: {self.written}")

    def upstream_truth(self) -> dict:
        """What each upstream holds now: the topic's records, the table's rows, the files' lines."""
        import psycopg
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.broker.bootstrap, "group.id": f"soak-{time.time()}",
                             "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        records = []
        try:
            ends = {p: consumer.get_watermark_offsets(TopicPartition("orders", p), timeout=30) for p in (0, 1)}
            consumer.assign([TopicPartition("orders", p, lo) for p, (lo, _) in ends.items()])
            wanted = sum(hi - lo for lo, hi in ends.values())
            deadline = time.monotonic() + 120
            while len(records) < wanted and time.monotonic() < deadline:
                for m in consumer.consume(1000, timeout=1):
                    if m.error() is None:
                        records.append((m.partition(), m.offset(), m.value().decode()))
        finally:
            consumer.close()
        with psycopg.connect(self.pg.dsn(), autocommit=True) as db:
            rows = db.execute("SELECT id, user_id, amount FROM payments ORDER BY id").fetchall()
        lines = []
        for path in sorted(self.logs.glob("*.log")):
            lines += path.read_text().splitlines()
        return {"orders": sorted(records), "payments": [list(r) for r in rows], "weblogs": sorted(lines)}

    def published(self) -> dict:
        """What each source published, AS OF its latest complete IntoTime (DuckDB over the S3 warehouse)."""
        from reclock.query import query_as_of_duckdb

        out = {}
        for name, sql in {
            "orders": 'SELECT "partition", "offset", "value" FROM orders',
            "payments": 'SELECT "row" FROM payments',
            "weblogs": 'SELECT "line" FROM weblogs',
        }.items():
            t = self.latest(name)
            out[name] = [] if t is None else query_as_of_duckdb(sql, t, [name], str(self.config)).to_pylist()
        return out

    def exact(self, truth: dict, published: dict) -> dict[str, str | None]:
        """Per source: None when the published contents are exactly the upstream's, else what differs."""
        orders = sorted((int(r["partition"]), int(r["offset"]), _text(r["value"])) for r in published["orders"])
        payments = sorted((int(r["id"]), r["user_id"], int(r["amount"]))
                          for r in (json.loads(p["row"]) for p in published["payments"]))
        lines = sorted(r["line"] for r in published["weblogs"])
        want = {"orders": truth["orders"], "payments": [tuple(r) for r in truth["payments"]],
                "weblogs": truth["weblogs"]}
        got = {"orders": orders, "payments": payments, "weblogs": lines}
        return {name: None if got[name] == want[name] else _difference(want[name], got[name]) for name in want}

    def catch_up(self, timeout: float) -> dict:
        """Until every source has published what its upstream holds (the schedule goes on), or ``timeout``."""
        deadline = time.monotonic() + timeout
        truth = self.upstream_truth()
        while True:
            try:
                differs = self.exact(truth, self.published())
            except Exception as e:  # noqa: BLE001 - e.g. a source refusing AS OF while a run compacts
                differs = {"query": f"{type(e).__name__}: {e}"}
            if not any(differs.values()) or time.monotonic() > deadline:
                return {k: v for k, v in differs.items() if v}
            time.sleep(15)

    def verify(self) -> dict:
        say("waiting for every source to publish what its upstream holds")
        started = time.monotonic()
        differs = self.catch_up(self.args.catch_up_minutes * 60)
        caught_up_s = time.monotonic() - started
        for name, what in differs.items():
            self.anomalies.append(f"{name}: not exactly the upstream's after {caught_up_s:.0f}s: {what}")
        from reclock.query import QueryError

        unchanged = changed = folded = 0
        for recorded in self.answers:
            try:
                again = self.answer(recorded["source"], recorded["t"])
            except QueryError as e:
                if "compact" in str(e):
                    folded += 1
                    continue
                raise
            if again == tuple(recorded["answer"]):
                unchanged += 1
            else:
                changed += 1
                self.anomalies.append(f"{recorded['source']} AS OF {recorded['t']}: {recorded['answer']} during the "
                                      f"soak, {again} at the end")
        # No run stuck: the schedule goes on (a run every minute), so none may have been queued for long.
        for dag, run_id, state, minutes in self.sql(
                "SELECT dag_id, run_id, state, extract(epoch FROM now() - queued_at) / 60 FROM dag_run "
                "WHERE state IN ('queued', 'running') AND queued_at < now() - make_interval(mins => %s)",
                STUCK_MINUTES):
            self.anomalies.append(f"{dag} run {run_id} still {state}, queued {float(minutes):.0f} min ago")
        runs = {f"{dag}:{state}": n for dag, state, n in self.sql(
            "SELECT dag_id, state, count(*) FROM dag_run GROUP BY dag_id, state ORDER BY 1, 2")}
        tries = {f"{task}:{state}": n for task, state, n in self.sql(
            "SELECT task_id, state, count(*) FROM task_instance_history GROUP BY task_id, state ORDER BY 1, 2")}
        failed = [f"{dag} {run_id} {task} try {n}: {self.task_error(dag, run_id, task, n)}"
                  for dag, run_id, task, n in self.sql(
                      "SELECT dag_id, run_id, task_id, try_number FROM task_instance WHERE state = 'failed' "
                      "UNION ALL SELECT dag_id, run_id, task_id, try_number FROM task_instance_history "
                      "WHERE state = 'failed' ORDER BY 1, 2, 3, 4")]
        self.anomalies += [f"a check failed: {line}" for line in failed if "checks passed on" in line]  # ChecksFailed
        from reclock import validator

        return {"caught_up_s": round(caught_up_s, 1), "as_of_answers": {
                    "recorded": len(self.answers), "asked_again_during": sum(a["asked_again"] for a in self.answers),
                    "unchanged_at_end": unchanged, "changed_at_end": changed, "compacted_away_at_end": folded},
                "runs": runs, "retried_tries": tries, "failed_tasks": failed,
                "validator_serving": bool(validator.serving(str(self.dir / "validator")))}


    def task_error(self, dag: str, run_id: str, task: str, attempt: int) -> str:
        """The error a task's attempt failed with, from its log (Airflow's JSON lines); '' when none says."""
        path = self.dir / "airflow" / "logs" / f"dag_id={dag}" / f"run_id={run_id}" / f"task_id={task}" / \
            f"attempt={attempt}.log"
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        for line in reversed(lines):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            for detail in event.get("error_detail") or []:
                return f"{detail.get('exc_type')}: {str(detail.get('exc_value'))[:400]}"
        return lines[-1][:400] if lines else ""


def pids_with(command: str) -> list[int]:
    """The processes whose command line is ``command`` (a process title Airflow set)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:
                continue
            if cmdline == command:
                found.append(int(entry))
    return found


def _text(value) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def _difference(want: list, got: list) -> str:
    from collections import Counter

    missing, extra = Counter(want) - Counter(got), Counter(got) - Counter(want)
    return (f"{len(want)} upstream, {len(got)} published; missing {sum(missing.values())} "
            f"(e.g. {list(missing)[:3]}), extra or doubled {sum(extra.values())} (e.g. {list(extra)[:3]})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=10.0, help="seconds between two rounds of records")
    parser.add_argument("--fault-every", type=float, default=120.0, help="seconds between two faults")
    parser.add_argument("--catch-up-minutes", type=float, default=10.0)
    parser.add_argument("--retention-ms", type=int, default=600_000, help="the sources' retention: compaction")
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--out", type=Path, default=None, help="the results (JSON)")
    parser.add_argument("--keep", action="store_true", help="keep the soak's directory")
    args = parser.parse_args(argv)

    def interrupted(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)  # stops what it started, as Ctrl-C does
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    directory = Path(tempfile.mkdtemp(prefix="reclock-production-"))
    say(f"production-shaped soak for {args.minutes:g} min in {directory}")
    started = time.monotonic()
    result: dict = {"minutes": args.minutes, "every_s": args.every, "fault_every_s": args.fault_every,
                    "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    soak = None
    try:
        with ExitStack() as stack:
            soak = Soak(args, directory, stack)
            try:
                soak.start()
                soak.soak()
                result.update(soak.verify())
            finally:
                soak.stop()
    except BaseException:  # noqa: BLE001 - written down as the soak's failure (Ctrl-C too, once all stopped)
        result["error"] = traceback.format_exc()[-5000:]
    finally:
        if soak is not None:
            result.update({"faults": soak.faults, "written": soak.written, "answers_recorded": len(soak.answers),
                           "anomalies": soak.anomalies})
        result["wall_s"] = round(time.monotonic() - started, 1)
        if args.keep or result.get("error") or (soak and soak.anomalies):
            say(f"kept {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)
    text = json.dumps(result, indent=2, default=str)
    if args.out:
        args.out.write_text(text + "\n")
    print(text, flush=True)
    return 0 if not result.get("error") and not result.get("anomalies") else 1


if __name__ == "__main__":
    sys.exit(main())
