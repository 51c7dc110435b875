"""Crash points for the SIGKILL fault tests (tests/test_pipeline.py, tests/test_kinesis_source.py): an observer of
:mod:`reclock.points` that SIGKILLs this process, with its process group when it leads one (the driver, its JVM and
Spark's Python workers, all lost at once as in a machine crash), on reaching the point ``RECLOCK_KILL_AT`` names:

* ``after-<step>``: a step of :func:`reclock.pipeline.run_once` returned (``tick``, ``stage``, ...);
* ``<commit>:before``, ``<commit>:inside``, ``<commit>:after``: around a Delta commit (the names of
  :mod:`reclock.points`).  ``inside``: as soon as the write adds a file to the table's directory (a data file, or
  its ``_delta_log`` commit), before the write returns; a watcher thread polls for it, and when the write added one
  before the watcher saw it (a loaded machine: the thread was not scheduled meanwhile), as the write returns,
  before the step goes on (local tables only).

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
        stop, watcher = threading.Event(), None
        if self.point == f"{name}:inside" and "://" not in table_uri.replace("file://", ""):
            table = table_uri.replace("file://", "")
            watcher = threading.Thread(target=_die_on_new_file, args=(table, _files(table), stop), daemon=True)
            watcher.start()
        try:
            yield
        finally:
            stop.set()
            if watcher is not None:
                watcher.join()  # its last look, after the write: a file it added is never missed
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


def _files(table: str) -> set[str]:
    return {f"{d}/{n}" for d in (table, f"{table}/_delta_log") if os.path.isdir(d) for n in os.listdir(d)}


def _die_on_new_file(table: str, before: set[str], stop: threading.Event) -> None:
    """Die once ``table`` holds a file not in ``before``, looking every 2 ms and once more after ``stop``."""
    while True:
        if _files(table) - before:
            _die()
        if stop.wait(0.002):
            if _files(table) - before:
                _die()
            return


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
