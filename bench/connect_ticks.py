"""What a tick costs with a long-lived Spark (Spark Connect) and without: issue 10, "Fast ticks".

    python bench/connect_ticks.py [--records 100000] [--partitions 8] [--empty 3]

On a local Kafka broker (devtools.kafka_broker) and a local Spark Connect server (devtools.spark_connect), one
run staging ``--records`` records, then ``--empty`` runs with nothing new, each of:

* connect   ``pipeline.run_once`` over the server (``spark.remote``) in this process (each step timed);
* local     ``pipeline.run_once`` in a fresh process with a local[2] session of its own (what ``reclock run``
            or a DAG task pays without a server: interpreter, JVM start, steps), on a warehouse of its own;
* submit    (empty runs) ``spark-submit spark_jobs/reclock_job.py`` (the DAG's ``reclock`` task without a
            server) with nothing to stage.

The three run right after each other, so that they meet about the same load.

The machine's load average is printed with the figures: they are wall-clock seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "include")]

from devtools.kafka_broker import LocalBroker, create_topic, produce  # noqa: E402
from devtools.spark_connect import LocalSparkConnect  # noqa: E402

TIMED_RUN = """
import json, sys, time
t0 = time.monotonic()
from reclock import pipeline
config, now = sys.argv[1], int(sys.argv[2])
times = {}
for step in pipeline.STEPS:
    t = time.monotonic()
    pipeline.run_once("orders", config, now=now, steps=(step,))
    times[step] = round(time.monotonic() - t, 2)
print("RESULT " + json.dumps({"steps": times, "in_process": round(time.monotonic() - t0, 2)}))
"""


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def timed_steps(config: str, now: int) -> dict:
    from reclock import pipeline

    times = {}
    for step in pipeline.STEPS:
        t = time.monotonic()
        result = pipeline.run_once("orders", config, now=now, steps=(step,))[step]
        times[step] = round(time.monotonic() - t, 2)
        if step == "stage":
            times["staged_rows"] = result["staged_rows"]
    times["total"] = round(sum(v for k, v in times.items() if k in pipeline.STEPS), 2)
    return times


def write_config(path: Path, bootstrap: str, topic: str, group: str, spark: dict) -> str:
    path.write_text(yaml.safe_dump({"warehouse": str(path.parent / f"wh-{group}"), "spark": spark, "sources": [
        {"name": "orders", "kind": "kafka", "retention_ms": 3_600_000,
         "options": {"bootstrap_servers": bootstrap, "topic": topic, "group_id": group}}]}))
    return str(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--empty", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="reclock-connect-bench-"))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join([str(REPO / "include"), str(REPO), os.environ.get("PYTHONPATH", "")])}
    with LocalBroker() as broker:
        create_topic(broker.bootstrap, "orders", partitions=args.partitions)
        t = time.monotonic()
        with LocalSparkConnect() as server:
            print(f"Spark Connect server up in {time.monotonic() - t:.1f} s at {server.url} (load {load()})", flush=True)
            remote = write_config(work / "remote.yaml", broker.bootstrap, "orders", "remote", {"remote": server.url})
            local = write_config(work / "local.yaml", broker.bootstrap, "orders", "local", {"master": "local[2]"})
            produce(broker.bootstrap, "orders", ((str(i % 1000), f"v{i:010d}".ljust(100, "x"), i % args.partitions)
                                                 for i in range(args.records)))
            print(f"produced {args.records} records in {args.partitions} partitions", flush=True)
            # Each kind of run right after the other, so that both meet about the same load.
            for i in range(args.empty + 1):
                label = f"{args.records} new records" if i == 0 else f"empty run {i}"
                now = 1_000 * (i + 1)
                print(f"connect, {label}: {timed_steps(remote, now)} (load {load()})", flush=True)
                print(f"local process, {label}: {local_run(local, now, env)} (load {load()})", flush=True)
                if i:
                    print(f"spark-submit of the stage job, nothing pending: {submit(local, env)} (load {load()})",
                          flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return 0


def local_run(config: str, now: int, env: dict) -> str:
    """``run_once`` in a fresh interpreter with a local session: wall time, and each step's in the process."""
    t = time.monotonic()
    out = subprocess.run([sys.executable, "-c", TIMED_RUN, config, str(now)], env=env, capture_output=True, text=True,
                         timeout=1800)
    wall = time.monotonic() - t
    result = next((json.loads(line[7:]) for line in out.stdout.splitlines() if line.startswith("RESULT ")), None)
    if result is None:
        raise RuntimeError(out.stdout[-3000:] + out.stderr[-3000:])
    return f"wall {wall:.2f} s, {result}"


def submit(config: str, env: dict) -> str:
    """The DAG's ``reclock`` task without a server: spark-submit of the stage job (here nothing is pending)."""
    from reclock.spark.session import session_conf

    conf = [a for k, v in session_conf().items() for a in ("--conf", f"{k}={v}")]
    t = time.monotonic()
    out = subprocess.run([str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]", *conf,
                          str(REPO / "spark_jobs" / "reclock_job.py"), "--config", config, "--source", "orders"],
                         env=env, capture_output=True, text=True, timeout=1800)
    return f"{time.monotonic() - t:.2f} s (exit {out.returncode})"


if __name__ == "__main__":
    raise SystemExit(main())
