"""A self-contained Airflow home (SQLite metadata DB) for the demo and tests, run in subprocesses.

Airflow reads ``AIRFLOW_HOME`` and ``AIRFLOW__*`` once, at import, so callers run Airflow
commands in child processes with the environment built here.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DAGS_FOLDER = REPO / "dags"
PYTHON = sys.executable  # the venv's python (not resolved: the venv is found through this path)
AIRFLOW = str(Path(PYTHON).parent / "airflow")


def airflow_env(home: Path, config: Path | None = None, dags_folder: Path = DAGS_FOLDER,
                extra_pythonpath: Path | None = None) -> dict[str, str]:
    """Environment for an Airflow process rooted at ``home`` (reclock config from ``config``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "PYSPARK_PYTHON": PYTHON,
    })
    if extra_pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(extra_pythonpath), env.get("PYTHONPATH")]))
    if config is not None:
        env["RECLOCK_CONFIG"] = str(config)
    return env


def run(cmd: list[str], env: dict[str, str], timeout: float = 600, stderr: bool = True) -> str:
    """Run ``cmd``; return its output (with stderr unless told not), or raise RuntimeError with its tail."""
    proc = subprocess.run(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT if stderr else subprocess.PIPE, text=True, timeout=timeout)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd[:3])} ... exited {proc.returncode}:\n"
                           f"{(proc.stdout + (proc.stderr or ''))[-5000:]}")
    return proc.stdout


def stop_group(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """Stop a process started with ``start_new_session=True`` and everything it started: SIGTERM to its group,
    then, once the leader ended or ``timeout`` passed, SIGKILL to whatever is left of the group and of its session
    (processes that made groups of their own, like Airflow's task processes)."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # what outlived its leader, or a leader that did not stop
    except ProcessLookupError:
        pass
    proc.wait()
    for _ in range(50):  # groups of their own in its session (Airflow's task processes), started until the end
        left = session_members(proc.pid)
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def http_ok(url: str) -> bool:
    """Whether ``url`` answers 200 now."""
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def session_members(sid: int) -> list[int]:
    """The PIDs of the processes in session ``sid`` (Linux ``/proc``)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    members.append(int(entry))
            except (ProcessLookupError, PermissionError):
                pass
    return members


SPARK_POOL, SPARK_POOL_SLOTS = "reclock_spark", 4  # the DAGs' pool for Spark work (dags/reclock_sources.py)


def migrate(home: Path, env: dict[str, str]) -> Path:
    """``airflow db migrate`` in ``home`` and the pool of the DAGs' Spark tasks; returns the SQLite file."""
    home.mkdir(parents=True, exist_ok=True)
    run([AIRFLOW, "db", "migrate"], env, timeout=300)
    run([AIRFLOW, "pools", "set", SPARK_POOL, str(SPARK_POOL_SLOTS), "reclock: tasks that start Spark"], env,
        timeout=120)
    return home / "airflow.db"


# --- Airflow connections of the upstreams (reclock.connections resolves them when a step runs) ----------------

def kafka_connection(conn_id: str, bootstrap: str, **client: str) -> dict[str, str]:
    """``{AIRFLOW_CONN_<ID>: ...}``: a connection of the Kafka provider's type ``kafka``, whose extra is the
    librdkafka client config (``bootstrap.servers`` and ``client`` properties)."""
    import json

    from reclock.connections import env_var

    return {env_var(conn_id): json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": bootstrap, **client}})}


def postgres_connection(conn_id: str, dsn: str, password: str | None = None) -> dict[str, str]:
    """``{AIRFLOW_CONN_<ID>: ...}``: a connection of the Postgres provider's type ``postgres`` for a libpq ``dsn``
    (host, port, user, dbname; the other parameters go to the extra), with ``password`` if given."""
    import json

    from psycopg.conninfo import conninfo_to_dict

    from reclock.connections import env_var

    params = {k: str(v) for k, v in conninfo_to_dict(dsn).items()}
    port = params.pop("port", None)
    fields = {"conn_type": "postgres", "host": params.pop("host", None), "port": int(port) if port else None,
              "login": params.pop("user", None), "password": password or params.pop("password", None),
              "schema": params.pop("dbname", None), "extra": params}
    return {env_var(conn_id): json.dumps({k: v for k, v in fields.items() if v not in (None, {})})}
