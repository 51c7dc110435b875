"""A local Spark standalone cluster (a master and its workers) from the pyspark distribution, for tests
and for trying reclock on Spark's own cluster manager.

:class:`LocalSparkCluster` runs ``spark-class org.apache.spark.deploy.master.Master`` and
``...deploy.worker.Worker`` of the installed pyspark (``SPARK_HOME`` is the pyspark package) on
loopback and free ports, each in a process group of its own with its log, work and scratch dirs in
one temporary directory. It waits until the master's JSON (``<ui>/json/``) lists every worker ALIVE,
and stops the groups by their PIDs (SIGTERM, then SIGKILL), which takes the executors the workers
started with them::

    with LocalSparkCluster(workers=2) as cluster:
        spark = get_spark(cluster.url)        # client mode: the driver is this process

Executors get the jars of the session (``spark.jars``) from the driver. Their Python workers run the
driver's ``PYSPARK_PYTHON`` (``reclock.spark.session`` sets it to this interpreter), where reclock is
installed: that is what a remote worker must have too (README, "On a Spark cluster").

``python -m devtools.spark_cluster`` starts one and prints its URL until Ctrl-C.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from devtools.kafka_broker import free_port, run_until_interrupted

log = logging.getLogger(__name__)


class ClusterError(RuntimeError):
    """A master or worker did not start, or the workers did not register."""


def spark_home() -> Path:
    """The pyspark package directory: a Spark distribution with ``bin/spark-class``."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class LocalSparkCluster:
    """A standalone master and ``workers`` workers (``cores`` and ``memory`` each) on ``host``."""

    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "1g", host: str = "127.0.0.1",
                 startup_timeout: float = 90.0) -> None:
        self.workers, self.cores, self.memory, self.host = workers, cores, memory, host
        self.startup_timeout = startup_timeout
        self.root: Path | None = None
        self.port: int | None = None
        self.ui_port: int | None = None
        self._procs: list[tuple[str, subprocess.Popen]] = []

    @property
    def url(self) -> str:
        """The master URL, ``spark://host:port``."""
        return f"spark://{self.host}:{self.port}"

    @property
    def ui(self) -> str:
        return f"http://{self.host}:{self.ui_port}"

    def state(self) -> dict:
        """The master's JSON: ``workers`` (with ``state``), ``activeapps``, ``completedapps`` (with ``cores``), ..."""
        with urllib.request.urlopen(f"{self.ui}/json/", timeout=5) as r:
            return json.load(r)

    def alive_workers(self) -> int:
        try:
            return sum(w["state"] == "ALIVE" for w in self.state()["workers"])
        except OSError:  # the master's UI is not up yet
            return -1

    def start(self) -> "LocalSparkCluster":
        self.root = Path(tempfile.mkdtemp(prefix="reclock-spark-"))
        self.port, self.ui_port = free_port(self.host), free_port(self.host)
        try:
            self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", self.host,
                        "--port", str(self.port), "--webui-port", str(self.ui_port))
            self._wait_for(0, "the master's UI")
            for i in range(1, self.workers + 1):
                work = self.root / f"worker-{i}"
                self._spawn(f"worker-{i}", "org.apache.spark.deploy.worker.Worker", self.url,
                            "--cores", str(self.cores), "--memory", self.memory, "--host", self.host,
                            "--webui-port", "0", "--work-dir", str(work))
            self._wait_for(self.workers, f"{self.workers} ALIVE workers")
        except BaseException:
            self.stop()
            raise
        atexit.register(self.stop)
        log.info("Spark standalone master %s (UI %s) with %d workers", self.url, self.ui, self.workers)
        return self

    def _spawn(self, name: str, main: str, *args: str) -> None:
        assert self.root is not None
        home = spark_home()
        env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": self.host,
               "SPARK_LOCAL_DIRS": str(self.root / "local" / name)}  # executors' scratch space too
        with open(self.root / f"{name}.log", "wb") as out:
            proc = subprocess.Popen([str(home / "bin" / "spark-class"), main, *args], env=env, cwd=self.root,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self._procs.append((name, proc))

    def _wait_for(self, workers: int, what: str) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while self.alive_workers() < workers:
            for name, proc in self._procs:
                if proc.poll() is not None:
                    raise ClusterError(f"Spark {name} exited with code {proc.returncode} while waiting for "
                                       f"{what}:\n{self.log_tail(name)}")
            if time.monotonic() > deadline:
                raise ClusterError(f"no {what} at {self.ui} within {self.startup_timeout:.0f}s:\n"
                                   + "\n".join(self.log_tail(name) for name, _ in self._procs))
            time.sleep(0.3)

    def log_tail(self, name: str, lines: int = 20) -> str:
        assert self.root is not None
        path = self.root / f"{name}.log"
        text = path.read_text(errors="replace").splitlines() if path.exists() else ["(no log)"]
        return f"--- {name} ---\n" + "\n".join(text[-lines:])

    def pids(self) -> list[int]:
        return [proc.pid for _, proc in self._procs if proc.poll() is None]

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM every process group (workers first), SIGKILL what lingers; remove the temporary dir."""
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            for _, proc in reversed(self._procs):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:  # the group is gone
                    pass
            deadline = time.monotonic() + wait
            for _, proc in self._procs:
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        self._procs = []
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
        atexit.unregister(self.stop)

    def __enter__(self) -> "LocalSparkCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m devtools.spark_cluster [--workers N] [--cores C] [--memory M]``: run a cluster until Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m devtools.spark_cluster", description=main.__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores of each worker")
    parser.add_argument("--memory", default="1g", help="memory of each worker")
    args = parser.parse_args(argv)
    with LocalSparkCluster(args.workers, args.cores, args.memory) as cluster:
        print(f"Spark master: {cluster.url} (UI {cluster.ui}, {args.workers} workers, logs in {cluster.root}); "
              "Ctrl-C stops", flush=True)
        run_until_interrupted(lambda: len(cluster.pids()) == args.workers + 1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
