"""``make soak``: the long repetitions CI has no time for, at the counts the guarantees were asked at.

Each part runs pytest on tests of ``tests/`` with their repetition count raised through the environment variable
the test reads (``make test`` runs the same tests at small counts, so every path is covered in CI too):

* ``races``: ``tests/test_races.py``'s racing ticks, 100 rounds of four tick threads in one process and 100
  rounds of two ``reclock tick`` processes (``RECLOCK_RACE_ROUNDS``, ``RECLOCK_RACE_PROCESS_ROUNDS``);
* ``kills``: ``tests/test_pipeline.py``'s SIGKILL fault test, 50 kills at every crash point
  (``RECLOCK_FAULT_ROUNDS``);
* ``long-run``: records arriving without pause while tick threads race and a publisher publishes, for 30 minutes
  (``RECLOCK_SOAK_SECONDS``).

An anomaly is what those tests assert never happens: a record lost or counted twice, remap not strictly
monotone, a frontier beyond the upstream; a part whose test fails reports the failure as its anomaly.  The
results go to ``soak/results.json`` (the commit, the machine and its load, each part's counts, wall time and
anomalies) and a summary is printed.  ``python -m devtools.soak --part kills --fault-rounds 5`` runs less (the
file says what ran).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "soak" / "results.json"


def parts(args) -> dict[str, dict]:
    """Each part: the tests it runs and the environment that sizes them."""
    return {
        "races": {"tests": ["tests/test_races.py::test_racing_tick_threads_count_nothing_twice",
                            "tests/test_races.py::test_racing_tick_processes_count_nothing_twice"],
                  "env": {"RECLOCK_RACE_ROUNDS": str(args.race_rounds),
                          "RECLOCK_RACE_PROCESS_ROUNDS": str(args.process_rounds)}},
        "kills": {"tests": ["tests/test_pipeline.py::test_sigkill_at_every_step_boundary_and_delta_commit"],
                  "env": {"RECLOCK_FAULT_ROUNDS": str(args.fault_rounds)}},
        "long-run": {"tests": ["tests/test_races.py::test_records_arriving_while_ticks_race"],
                     "env": {"RECLOCK_SOAK_SECONDS": str(args.seconds)}},
    }


def machine() -> dict:
    load = os.getloadavg()
    memory = next((int(line.split()[1]) // 1024 for line in open("/proc/meminfo") if line.startswith("MemTotal")), None)
    return {"cores": os.cpu_count(), "memory_mib": memory, "platform": platform.platform(),
            "load_average_at_start": [round(x, 2) for x in load]}


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()
    return head + ("-dirty" if dirty else "")


def run_part(name: str, part: dict) -> dict:
    print(f"soak: {name}: {' '.join(f'{k}={v}' for k, v in part['env'].items())}", flush=True)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", *part["tests"]],
                          cwd=REPO, env={**os.environ, **part["env"]}, capture_output=True, text=True)
    wall = time.monotonic() - started
    output = proc.stdout + proc.stderr
    summary = next((line for line in reversed(output.splitlines())
                    if " in " in line and (" passed" in line or " failed" in line or " error" in line)), "")
    anomalies = [] if proc.returncode == 0 else [output[-6000:]]
    print(f"soak: {name}: {'passed' if proc.returncode == 0 else 'FAILED'} in {wall / 60:.1f} min {summary}",
          flush=True)
    return {"tests": part["tests"], "env": part["env"], "passed": proc.returncode == 0, "wall_s": round(wall, 1),
            "pytest": summary.strip("= "), "anomalies": anomalies}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", action="append", choices=["races", "kills", "long-run"],
                        help="run only this part (repeatable; default all)")
    parser.add_argument("--race-rounds", type=int, default=100)
    parser.add_argument("--process-rounds", type=int, default=100)
    parser.add_argument("--fault-rounds", type=int, default=50)
    parser.add_argument("--seconds", type=int, default=1800, help="the long run's length")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    chosen = {k: v for k, v in parts(args).items() if not args.part or k in args.part}
    results = {"commit": commit(), "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "machine": machine(), "parts": {}}
    started = time.monotonic()
    for name, part in chosen.items():
        results["parts"][name] = run_part(name, part)
    results["wall_s"] = round(time.monotonic() - started, 1)
    results["anomalies"] = sum(len(p["anomalies"]) for p in results["parts"].values())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"soak: {len(chosen)} part(s) in {results['wall_s'] / 60:.1f} min, {results['anomalies']} anomalies; "
          f"{args.out}", flush=True)
    return 0 if results["anomalies"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
