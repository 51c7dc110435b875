"""A ``reclock`` command process started ahead of its use: ``python -m devtools.warm_step CONFIG``.

It imports what a step imports (reclock, pyspark, Great Expectations, deltalake) and opens the Spark session
the sources file ``CONFIG`` names (a local JVM, or a client of its Spark Connect server), then waits for one
request line on stdin, ``{"argv": [...], "env": {...}}``: it sets ``env`` (e.g. ``RECLOCK_KILL_AT``: the crash
point of :mod:`devtools.crash_points` it installs) and runs ``reclock --config CONFIG *argv`` in this process, whose session :func:`reclock.spark.session.get_spark` returns
(``getOrCreate``).  So the command behaves as ``python -m reclock.cli`` would, the same code on the same
session, without paying a cold start while a test waits: ``tests/conftest.py``'s :class:`WarmCommands` starts
the next one while the last runs.  Started as the leader of its own session, it dies with its JVM when a crash
point of :mod:`devtools.crash_points` kills its process group.
"""
from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    config_path = argv[0]
    _die_with_parent()
    from reclock import checks, cli, pipeline  # noqa: F401  (the imports a step pays)
    from reclock.config import load_config
    from reclock.spark.session import get_spark

    config = load_config(config_path)
    get_spark(config.spark_master, "reclock-warm", s3=config.warehouse.startswith("s3"),
                      conf=config.spark_conf, remote=config.spark_remote)
    print("warm: ready", flush=True)
    line = sys.stdin.readline()
    if not line:  # the pool closed without using this one
        return 0
    request = json.loads(line)
    os.environ.update(request.get("env") or {})
    from devtools.crash_points import install_from_env

    install_from_env()
    return cli.main(["--config", config_path, *request["argv"]])


def _die_with_parent() -> None:
    """SIGKILL this process when the one that started it ends (a test run that stopped without using it)."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
