"""The local platform for a person to look at: ``python -m devtools.up`` (``make up``).

It starts what the demo starts (a Kafka broker, a Postgres cluster, kinesis-local and a Spark Connect server) and
``airflow standalone`` (scheduler, dag-processor, triggerer and API server) on this checkout's DAGs and plugins,
with the demo's five sources (``devtools.demo``) on a one-minute schedule, unpaused, their Airflow connections
defined; then generators write to every source every ``--every`` seconds.  It prints the UI's URL (the local
simple auth manager: every visitor is an admin, no login) and runs until Ctrl-C (or SIGTERM), which stops
everything it started, by process group, and leaves no process behind.  Everything lives under ``var/up``
(removed at the start); Airflow's own log is ``var/up/standalone.log``.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

import yaml

from devtools.airflow_home import AIRFLOW, REPO, airflow_env, http_ok, migrate, stop_group
from devtools.demo import SOURCES, change_round, connections, start_servers, write_config
from devtools.kafka_broker import free_port

SCHEDULE = "* * * * *"


def schedule_every_minute(config: Path) -> None:
    """Give every source of the sources file ``config`` the one-minute schedule, starting an hour ago (the DAGs
    do not catch up: the first scheduled run is the latest minute)."""
    doc = yaml.safe_load(config.read_text())
    start = time.strftime("%Y-%m-%dT%H:00:00Z", time.gmtime(time.time() - 3600))
    doc["sources"] = [{**s, "schedule": SCHEDULE, "start_date": start} for s in doc["sources"]]
    config.write_text(yaml.safe_dump(doc, sort_keys=False))


def platform_env(home: Path, config: Path, port: int) -> dict[str, str]:
    """The environment of ``airflow standalone``: this checkout's DAGs and plugins, new DAGs unpaused, the API on
    ``port``, every visitor an admin (a local platform), and the venv's ``bin`` first on ``PATH`` (standalone
    starts its components as ``airflow ...`` by name)."""
    env = airflow_env(home, config)
    env.update({
        "PATH": os.pathsep.join([str(Path(AIRFLOW).parent), env.get("PATH", "")]),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "30",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
    })
    return env


class Stop(Exception):
    """Ctrl-C or SIGTERM while starting up: stop what was started."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=REPO / "var" / "up")
    parser.add_argument("--port", type=int, default=0, help="the Airflow UI's port (default: a free one)")
    parser.add_argument("--every", type=float, default=15.0, help="seconds between two rounds of new records")
    parser.add_argument("--for", dest="duration", type=float, default=None,
                        help="stop by itself after this many seconds (default: run until Ctrl-C)")
    args = parser.parse_args(argv)

    state = {"generating": False, "stopping": False}  # in the generators' loop a signal ends it between rounds

    def stop(signum, frame):
        state["stopping"] = True
        if not state["generating"]:  # starting up: stop at once
            raise Stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    shutil.rmtree(args.dir, ignore_errors=True)
    logs = args.dir / "weblogs"
    logs.mkdir(parents=True)
    config = args.dir / "sources.yaml"
    port = args.port or free_port()
    env = platform_env(args.dir / "airflow", config, port)
    env["RECLOCK_VALIDATOR_DIR"] = str(args.dir / "validator")  # its check tasks' Great Expectations validator
    airflow = None
    try:
        with ExitStack() as stack:
            print("starting a Kafka broker, a Postgres cluster, kinesis-local and a Spark Connect server", flush=True)
            broker, cluster, kinesis_server, spark = start_servers(stack, args.dir)
            kinesis, dsn = kinesis_server.client(), cluster.dsn()
            write_config(config, logs, kinesis_server.options(), spark.url)
            schedule_every_minute(config)
            conns = connections(broker.bootstrap, dsn)
            env.update(conns)
            os.environ.update(conns)
            from reclock import pipeline

            pipeline.tick("payments", str(config))  # the replication slot, before any change
            print("initialising Airflow (SQLite) in", args.dir / "airflow", flush=True)
            migrate(args.dir / "airflow", env)
            log = open(args.dir / "standalone.log", "w")
            airflow = subprocess.Popen([AIRFLOW, "standalone"], env=env, cwd=args.dir, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 300
            while not http_ok(f"{base}/api/v2/monitor/health"):
                if airflow.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"airflow standalone did not come up (see {args.dir / 'standalone.log'}):\n"
                                       + (args.dir / "standalone.log").read_text()[-3000:])
                time.sleep(2)
            print(f"\nreclock is up: the Airflow UI at {base} (local: no login, every visitor is an admin);"
                  f"\n  the progress page at {base}/reclock/; DAGs reclock_<source> for {', '.join(SOURCES)},"
                  f" every minute;\n  sources file {config}; Ctrl-C stops everything.\n", flush=True)
            rng, round_ = random.Random(7), 0
            started = time.monotonic()
            state["generating"] = True  # Ctrl-C now ends the loop between rounds (never inside a client's C code)
            while not state["stopping"] and (args.duration is None or time.monotonic() - started < args.duration):
                round_ += 1
                changed = change_round(broker.bootstrap, logs, dsn, kinesis, round_, rng)
                print(f"round {round_}: {changed}", flush=True)
                if airflow.poll() is not None:
                    raise RuntimeError(f"airflow standalone exited ({airflow.returncode}); see "
                                       f"{args.dir / 'standalone.log'}")
                pause = time.monotonic() + args.every
                while not state["stopping"] and time.monotonic() < pause:
                    time.sleep(0.1)
            if state["stopping"]:
                print("\nstopping", flush=True)
    except (KeyboardInterrupt, Stop):
        print("\nstopping", flush=True)
    finally:
        if airflow is not None:
            stop_group(airflow)  # its process group: scheduler, dag-processor, triggerer, API server, tasks
        from reclock import validator

        validator.stop(env["RECLOCK_VALIDATOR_DIR"])  # the one its check tasks started (a session of its own)
    print("stopped: every process this started has ended", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
