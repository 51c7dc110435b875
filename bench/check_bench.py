"""The check step's wall time and the Python process's peak RSS on a staged batch of a files source.

``prepare``: writes ``--records`` lines into ``--files`` files under ``--dir``, a sources file, and runs one
tick and one stage (a staged, unpublished batch of ``--records`` records).  ``measure``: runs only
``pipeline.check`` in this process and prints its wall time and the process's peak RSS (``ru_maxrss``: the
Python process, not Spark's JVM).  Run ``measure`` in a fresh process each time (peak RSS is per process)::

    python bench/check_bench.py prepare --dir /tmp/cb --records 1000000
    python bench/check_bench.py measure --dir /tmp/cb [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path


def prepare(root: Path, records: int, files: int) -> None:
    import yaml

    from reclock import pipeline

    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        with open(data / f"part-{f}.log", "w") as out:
            out.writelines(f"file {f} line {i} {'x' * 40}\n" for i in range(f, records, files))
    config = root / "sources.yaml"
    config.write_text(yaml.safe_dump({
        "warehouse": str(root / "warehouse"), "spark": {"master": "local[2]"},
        "sources": [{"name": "logs", "kind": "files", "retention_ms": 10 ** 12,
                     "options": {"url": str(data), "pattern": "*.log"}}]}))
    pipeline.tick("logs", str(config), now=1_700_000_000_000)
    print(json.dumps(pipeline.stage("logs", str(config))))


def measure(root: Path, repeat: int) -> None:
    """``repeat`` checks in this process: the first pays the process's start-up (imports, Spark's JVM, the first
    job), the next ones show the step with them warm (as with a long-lived Spark)."""
    from reclock import pipeline

    for run in range(1, repeat + 1):
        start = time.perf_counter()
        try:
            pipeline.check("logs", str(root / "sources.yaml"))
            outcome = "passed"
        except Exception as e:  # noqa: BLE001 - a figure either way
            outcome = f"failed: {e}"
        seconds = time.perf_counter() - start
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps({"run": run, "check_s": round(seconds, 2), "peak_rss_mb": round(peak_mb),
                          "outcome": outcome[:300]}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("step", choices=["prepare", "measure"])
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=None,
                        help="files written (default: one per 5000 records; the files source reads a file's "
                             "ranges in chunks of 500,000 bytes, which must start at a line)")
    parser.add_argument("--repeat", type=int, default=1, help="checks run in the measuring process")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if args.step == "prepare":
        prepare(args.dir, args.records, args.files or max(1, args.records // 5000))
    else:
        measure(args.dir, args.repeat)


if __name__ == "__main__":
    main()
