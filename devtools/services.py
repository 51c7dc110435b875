"""One set of servers per test run, shared by every pytest-xdist worker: a Kafka broker, a Spark Connect server,
a Postgres cluster and kinesis-local, each started once, on first use, and stopped once, at the run's end.

The run's *controller* (the pytest process that is not a worker; the only process under ``-n 0``) opens a
:class:`Run`: a directory, with the controller's PID in ``owner``, that it hands to the workers.  The first
process to ask for a server (:func:`address`) takes that server's lock in the directory and starts a *keeper*
(``python -m devtools.services keep NAME DIR``): a process in a session of its own that starts the server,
writes ``NAME.json`` (its address and PIDs) and holds the server until the controller writes ``stop``
(:meth:`Run.close`) or the controller's process is gone.  Whoever asks next finds ``NAME.json`` under the lock.
So a run that needs no broker starts none, a server outlives the worker that asked for it first, and it stops
by its PID with the run, however the run ends.  Tests isolate by name on a shared server (topic, database,
stream, warehouse directory), never by server.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The servers a run can share.
NAMES = ("kafka", "spark_connect", "postgres", "kinesis")
STARTUP_TIMEOUT = 300.0


class ServiceError(RuntimeError):
    """A shared server did not start (its keeper's error or log tail says why)."""


def _server(name: str):
    """A fresh server object of ``name`` and a function of it to its address (a JSON-able dict)."""
    if name == "kafka":
        from devtools.kafka_broker import LocalBroker

        return LocalBroker(), lambda b: {"bootstrap": b.bootstrap, "log_dir": str(b.data_dir / "logs")}
    if name == "spark_connect":
        from devtools.spark_connect import LocalSparkConnect

        return LocalSparkConnect(), lambda s: {"url": s.url}
    if name == "postgres":
        from devtools.pg_cluster import PgCluster

        return PgCluster(), lambda c: {"dsn": c.dsn(), "port": c.port, "socket": str(c.sock)}
    if name == "kinesis":
        from devtools.kinesis_server import KinesisServer

        return KinesisServer(), lambda k: {"endpoint": k.endpoint}
    raise ValueError(f"no shared server {name!r} (the servers: {', '.join(NAMES)})")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover
        return True
    return True


def _write_json(path: Path, value: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


VALIDATOR = "validator"  # in the run directory: the folder of the run's Great Expectations validator


class Run:
    """The controller's side: the run directory, and the servers' stop at the end (and the Great Expectations
    validator's, :mod:`reclock.validator`, whose folder is in it)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    @classmethod
    def open(cls) -> "Run":
        """A new run directory, after removing those of runs that were killed (owner and keepers gone)."""
        for old in Path(tempfile.gettempdir()).glob("reclock-test-servers-*"):
            if not (old / "owner").exists():
                continue  # being opened right now
            pids = [p.read_text() for p in [old / "owner", *old.glob("*.keeper")] if p.exists()]
            if not any(_alive(int(pid)) for pid in pids if pid.strip().isdigit()):
                shutil.rmtree(old, ignore_errors=True)
        directory = Path(tempfile.mkdtemp(prefix="reclock-test-servers-"))
        (directory / "owner.tmp").write_text(str(os.getpid()))
        (directory / "owner.tmp").rename(directory / "owner")  # whole, for a sweep that reads it
        return cls(directory)

    def started(self) -> dict[str, dict]:
        """The servers started so far, by name: their addresses and PIDs."""
        return {p.stem: json.loads(p.read_text()) for p in sorted(self.dir.glob("*.json"))}

    def close(self, timeout: float = 60.0) -> None:
        """Tell every keeper to stop its server; wait for them, then SIGKILL what lingers; remove the directory."""
        (self.dir / "stop").write_text("")
        from reclock import validator

        validator.stop(str(self.dir / VALIDATOR))  # the run's Great Expectations validator (tests' check steps)
        keepers = {p.stem: int(p.read_text()) for p in self.dir.glob("*.keeper")}
        deadline = time.monotonic() + timeout
        while any(_alive(pid) for pid in keepers.values()) and time.monotonic() < deadline:
            time.sleep(0.2)
        started = self.started()
        for name, pid in keepers.items():
            if not _alive(pid):
                continue  # it stopped its server
            # A keeper that did not stop its server in time: it, and the server's own group (all but Postgres).
            for group in [pid, *started.get(name, {}).get("pids", ())]:
                try:
                    os.killpg(group, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        shutil.rmtree(self.dir, ignore_errors=True)


def address(run_dir: str | os.PathLike, name: str) -> dict:
    """The address of the run's server ``name``, started now by a keeper if nobody started it yet."""
    run_dir = Path(run_dir)
    info, error = run_dir / f"{name}.json", run_dir / f"{name}.error"
    with open(run_dir / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not info.exists() and not error.exists():
            _spawn_keeper(run_dir, name)
        if error.exists():
            raise ServiceError(f"the shared {name} server did not start:\n{error.read_text()}")
        return json.loads(info.read_text())


def _spawn_keeper(run_dir: Path, name: str) -> None:
    log = open(run_dir / f"{name}.log", "ab")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    proc = subprocess.Popen([sys.executable, "-m", "devtools.services", "keep", name, str(run_dir)], cwd=REPO,
                            env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    log.close()
    (run_dir / f"{name}.keeper").write_text(str(proc.pid))
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while not (run_dir / f"{name}.json").exists() and not (run_dir / f"{name}.error").exists():
        if proc.poll() is not None:
            tail = (run_dir / f"{name}.log").read_text(errors="replace")[-3000:]
            (run_dir / f"{name}.error").write_text(f"its keeper exited with code {proc.returncode}:\n{tail}")
        elif time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            (run_dir / f"{name}.error").write_text(f"not up within {STARTUP_TIMEOUT:.0f} s")
        else:
            time.sleep(0.2)


def keep(name: str, run_dir: Path) -> int:
    """The keeper: start ``name``, publish its address, hold it until the run stops or its controller is gone."""
    owner = int((run_dir / "owner").read_text())
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server, address_of = _server(name)
    try:
        server.start()
    except Exception as e:
        (run_dir / f"{name}.error").write_text(f"{type(e).__name__}: {e}")
        return 1
    try:
        pids = [server.pid] if getattr(server, "pid", None) else []
        _write_json(run_dir / f"{name}.json", {**address_of(server), "pids": pids})
        while not (run_dir / "stop").exists() and _alive(owner):
            time.sleep(0.5)
    finally:
        server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[0] != "keep":
        print("usage: python -m devtools.services keep NAME RUN_DIR", file=sys.stderr)
        return 2
    return keep(argv[1], Path(argv[2]))


if __name__ == "__main__":
    raise SystemExit(main())
