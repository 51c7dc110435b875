"""A ``reclock`` command process started ahead of its use: ``python -m devtools.warm_step CONFIG``.

It imports what a step imports (reclock, pyspark, Great Expectations, deltalake) and opens the Spark session
the sources file ``CONFIG`` names (a local JVM, warmed on a scratch Delta table, or a client of its Spark
Connect server; ``--no-warm-delta``: not warmed), then waits for one
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
    spark = get_spark(config.spark_master, "reclock-warm", s3=config.warehouse.startswith("s3"),
                      conf=config.spark_conf, remote=config.spark_remote)
    if not config.spark_remote and "--no-warm-delta" not in argv[1:]:
        _warm_delta(spark)
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


def _warm_delta(spark, rounds: int = 3) -> None:
    """Load and compile what a step's Delta work uses, on a scratch table: writes from Arrow, appends, OPTIMIZE,
    and a compaction's filtered read, aggregate and ``replaceWhere`` overwrite, a few times over (a fresh JVM
    runs its first of each for seconds, interpreted)."""
    import tempfile

    import pyarrow as pa
    from pyspark.sql import functions as F

    from reclock.storage import spark_frame

    with tempfile.TemporaryDirectory(prefix="reclock-warm-") as scratch:
        rows = pa.table({"id": pa.array(range(100), pa.int64()), "value": [str(i % 7) for i in range(100)]})
        spark_frame(spark, rows, rows.schema).write.format("delta").save(scratch)
        for i in range(rounds):
            spark_frame(spark, rows, rows.schema).write.format("delta").mode("append").save(scratch)
            df = spark.read.format("delta").load(scratch).where(F.col("id") <= 50)
            df.agg(F.count(F.lit(1)).alias("n"), F.min("id").alias("lo")).first()
            summed = df.groupBy("value").agg(F.min("id").alias("id")).where(F.col("id") != 0)
            summed.count()
            (summed.select("id", "value").coalesce(1).write.format("delta").mode("overwrite")
             .option("replaceWhere", "id <= 50").option("mergeSchema", "false").save(scratch))
        spark.sql(f"OPTIMIZE delta.`{scratch}`").collect()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
