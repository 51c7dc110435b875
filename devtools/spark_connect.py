"""A local Spark Connect server with reclock's jars and settings, for tests, the demo and the benchmark: the
long-lived Spark that steps connect to (``spark.remote`` in the sources file) instead of starting a JVM each.

:class:`LocalSparkConnect` runs the command of :func:`reclock.spark.session.connect_server_command` (pyspark's
``spark-submit`` of ``SparkConnectServer`` on ``local[2]``, gRPC on loopback and a free port, its Python
workers on this interpreter with this checkout's ``include/`` on ``PYTHONPATH``) in a process group of its
own, with its log and scratch space in a temporary directory; it waits until the gRPC port accepts
connections (the server opens it once its Spark session is up) and stops the group by its PID (SIGTERM, then SIGKILL)::

    with LocalSparkConnect() as server:
        spark = get_spark(remote=server.url)        # sc://127.0.0.1:PORT

``python -m devtools.spark_connect`` starts one and prints its URL until Ctrl-C.
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devtools.kafka_broker import free_port, run_until_interrupted

log = logging.getLogger(__name__)


class ConnectError(RuntimeError):
    """The Spark Connect server did not start."""


class LocalSparkConnect:
    """One Spark Connect server (its driver runs ``master``) serving on ``host:port`` (``port=None``: a free one)."""

    def __init__(self, port: int | None = None, host: str = "127.0.0.1", master: str = "local[2]",
                 conf: dict | None = None, startup_timeout: float = 180.0) -> None:
        self.host, self.port, self.master, self.conf = host, port, master, conf
        self.startup_timeout = startup_timeout
        self.root: Path | None = None
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"sc://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def log_path(self) -> Path | None:
        return self.root / "connect.log" if self.root else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> "LocalSparkConnect":
        from reclock.spark.session import connect_server_command

        if self.running():
            return self
        self.root = Path(tempfile.mkdtemp(prefix="reclock-connect-"))
        self.port = self.port or free_port(self.host)
        argv, env = connect_server_command(self.port, self.host, self.master, conf={
            "spark.local.dir": str(self.root / "local"), **(self.conf or {})})
        env = {**os.environ, **env, "SPARK_LOCAL_IP": self.host}
        with open(self.log_path, "wb") as out:
            self._proc = subprocess.Popen(argv, env=env, cwd=self.root, stdin=subprocess.DEVNULL, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        atexit.register(self.stop)
        try:
            self._wait()
        except BaseException:
            self.stop()
            raise
        log.info("Spark Connect server (pid %s) serving on %s, log %s", self.pid, self.url, self.log_path)
        return self

    def _wait(self) -> None:
        """Until the gRPC port accepts connections (opened once the server's Spark session is up)."""
        deadline = time.monotonic() + self.startup_timeout
        while not _accepts(self.host, self.port):
            if self._proc.poll() is not None:
                raise ConnectError(f"the Spark Connect server exited with code {self._proc.returncode} while "
                                   f"starting on {self.url}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise ConnectError(f"no Spark Connect server on {self.url} within {self.startup_timeout:.0f}s:\n"
                                   f"{self.log_tail()}")
            time.sleep(0.3)

    def log_tail(self, lines: int = 30) -> str:
        path = self.log_path
        text = path.read_text(errors="replace").splitlines() if path and path.exists() else ["(no log)"]
        return "\n".join(text[-lines:])

    def stop(self, timeout: float = 20.0) -> None:
        """Stop this process's Connect session of the server, SIGTERM the server's process group (its Python
        workers too), SIGKILL what lingers; remove its dir.

        A Connect client left open asks its server once more when the interpreter exits (PySpark's atexit), and
        retries for about ten minutes when the server is gone: its session is stopped first."""
        _stop_client_of(self.url)
        if self._proc is not None:
            for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self._proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self._proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    log.warning("Spark Connect server (pid %s) still running after %s", self._proc.pid, sig.name)
            self._proc = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
        atexit.unregister(self.stop)

    def kill(self) -> None:
        """SIGKILL the server's process group, as a machine losing it would (this process's own Connect session of
        it stopped first, while the server answers); :meth:`start` starts it again on the same port."""
        _stop_client_of(self.url)
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._proc.wait()
        self.stop()

    def __enter__(self) -> "LocalSparkConnect":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalSparkConnect({f'pid={self.pid} {self.url}' if self.running() else 'stopped'})"


def _stop_client_of(url: str) -> None:
    """Stop this process's default Spark Connect session if it is a client of ``url`` (``sc://host:port``)."""
    connect = sys.modules.get("pyspark.sql.connect.session")
    session = connect.SparkSession._get_default_session() if connect else None
    if session is not None and f"sc://{session.client._builder.endpoint}" == url:
        session.stop()


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    """``python -m devtools.spark_connect [--port P] [--master M]``: run a Spark Connect server until Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m devtools.spark_connect", description=main.__doc__)
    parser.add_argument("--port", type=int, default=None, help="gRPC port (default: a free one)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--master", default="local[2]", help="the server's Spark master")
    args = parser.parse_args(argv)
    with LocalSparkConnect(args.port, args.host, args.master) as server:
        print(server.url, flush=True)
        print(f"Spark Connect server pid {server.pid}, log {server.log_path}; Ctrl-C stops", flush=True)
        run_until_interrupted(server.running)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
