"""Crash points for the SIGKILL fault test (tests/test_pipeline.py): inert unless ``RECLOCK_KILL_AT`` is set.

``RECLOCK_KILL_AT=<point>`` makes the process SIGKILL itself, with its process group when it leads one (the
driver, its JVM and Spark's Python workers, all lost at once as in a machine crash), on reaching ``<point>``:

* ``after-<step>``: a step of :func:`reclock.pipeline.run_once` returned (``tick``, ``stage``, ...);
* ``<commit>:before``, ``<commit>:inside``, ``<commit>:after``: around a Delta commit: ``tick`` (the
  remap rows added) and ``publish`` (the staged files added to the reclocked table), both delta-rs's, in the
  step's own process; ``compact`` (the ``since`` append), ``compact-remap`` and ``compact-reclocked``
  (compaction's rewrites), delta-spark's; any other commit's points are named by its app transaction (e.g.
  ``reclock.landing``).  ``inside``: as soon as the write adds a file to the table's directory (a data file,
  or its ``_delta_log`` commit), before the write returns (local tables only).
"""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager

ENV = "RECLOCK_KILL_AT"


def kill_point(name: str) -> None:
    """Die here if ``RECLOCK_KILL_AT`` names this point."""
    if os.environ.get(ENV) == name:
        _die()


@contextmanager
def commit_point(name: str, table_uri: str):
    """The crash points ``<name>:before``, ``:inside`` and ``:after`` around a Delta commit to ``table_uri``."""
    point = os.environ.get(ENV, "")
    if not point.startswith(name + ":"):
        yield
        return
    kill_point(f"{name}:before")
    stop = threading.Event()
    if point == f"{name}:inside" and "://" not in table_uri.replace("file://", ""):
        threading.Thread(target=_die_on_new_file, args=(table_uri.replace("file://", ""), stop), daemon=True).start()
    try:
        yield
    finally:
        stop.set()
    kill_point(f"{name}:after")


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
