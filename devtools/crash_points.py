"""Crash points for the SIGKILL fault tests (tests/test_pipeline.py, tests/test_kinesis_source.py): an observer of
:mod:`reclock.points` that SIGKILLs this process, with its process group when it leads one (the driver, its JVM and
Spark's Python workers, all lost at once as in a machine crash), on reaching the point ``RECLOCK_KILL_AT`` names:

* ``after-<step>``: a step of :func:`reclock.pipeline.run_once` returned (``tick``, ``stage``, ...);
* ``<commit>:before``, ``<commit>:inside``, ``<commit>:after``: around a Delta commit (the names of
  :mod:`reclock.points`).  ``inside``: as soon as the write adds a file to the table's directory (a data file, or
  its ``_delta_log`` commit), before the write returns (local tables only).

A command process installs it with :func:`install_from_env` (``devtools/warm_step.py``, ``python -m
devtools.crash_points ARGS``: ``reclock ARGS`` with the crash point of the environment).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager

ENV = "RECLOCK_KILL_AT"


class KillAt:
    """SIGKILL this process at ``point``."""

    def __init__(self, point: str) -> None:
        self.point = point

    def reached(self, point: str) -> None:
        if point == self.point:
            _die()

    @contextmanager
    def commit(self, name: str, table_uri: str):
        if not self.point.startswith(name + ":"):
            yield
            return
        self.reached(f"{name}:before")
        stop = threading.Event()
        if self.point == f"{name}:inside" and "://" not in table_uri.replace("file://", ""):
            threading.Thread(target=_die_on_new_file, args=(table_uri.replace("file://", ""), stop),
                             daemon=True).start()
        try:
            yield
        finally:
            stop.set()
        self.reached(f"{name}:after")


def install_from_env() -> KillAt | None:
    """Observe :mod:`reclock.points` with the crash point ``RECLOCK_KILL_AT`` names, if it names one."""
    from reclock import points

    point = os.environ.get(ENV)
    if not point:
        return None
    observer = KillAt(point)
    points.observe(observer)
    return observer


def _die_on_new_file(table: str, stop: threading.Event) -> None:
    def files() -> set[str]:
        return {f"{d}/{n}" for d in (table, f"{table}/_delta_log") if os.path.isdir(d) for n in os.listdir(d)}

    before = files()
    while not stop.wait(0.002):
        if files() - before:
            _die()


def _die() -> None:
    leader = os.getpgid(0) == os.getpid()  # never the group of whoever started this process (a test runner)
    os.killpg(os.getpid(), signal.SIGKILL) if leader else os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> int:
    """``reclock *argv`` in this process, with the crash point of the environment."""
    from reclock import cli

    install_from_env()
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
