"""``make soak``: the long repetitions CI has no time for, at the counts the guarantees were asked at.

Each part runs pytest on tests of ``tests/`` with their repetition count raised through the environment variable
the test reads (``make test`` runs the same tests at small counts, so every path is covered in CI too):

* ``races``: ``tests/test_races.py``'s racing ticks, 100 rounds of four tick threads in one process and 100
  rounds of two ``reclock tick`` processes (``RECLOCK_RACE_ROUNDS``, ``RECLOCK_RACE_PROCESS_ROUNDS``);
* ``runs``: ``tests/test_races.py``'s racing runs, 100 rounds of three ``reclock run`` processes of one source
  (``RECLOCK_RACE_RUN_ROUNDS``);
* ``kills``: ``tests/test_pipeline.py``'s SIGKILL fault test, 50 kills at every crash point
  (``RECLOCK_FAULT_ROUNDS``), in one run of the test (``--kill-shards N``: N runs at once sharing the rounds;
  docs/testing.md says why one is the default);
* ``long-run``: records arriving without pause while tick threads race and a publisher publishes, for 30 minutes
  (``RECLOCK_SOAK_SECONDS``);
* ``s3``: ``tests/test_s3.py``'s races on an ``s3://`` warehouse (moto's server), 100 rounds each of four
  processes creating one source's tables, four processes ticking it, and a publish racing a compaction
  (``RECLOCK_S3_ROUNDS``);
* ``platform``: ``tests/test_up.py``, ``make up`` as a person uses it: two scheduled runs of every DAG within five
  minutes, the UI's pages in headless Chromium (their screenshots into ``docs/images``), Ctrl-C leaving no process
  (``RECLOCK_PLATFORM``; ``make test`` skips it: it starts servers of its own);
* ``production``: ``devtools/production_soak.py``, not a test: reclock under Airflow with the CeleryExecutor, a
  Spark standalone cluster behind Spark Connect and the warehouse on S3, three sources scheduled every minute
  for 30 minutes (``--production-minutes``) while faults are injected; its own JSON becomes the part's result.

An anomaly is what those tests assert never happens: a record lost or counted twice, remap not strictly
monotone, a frontier beyond the upstream; a part whose test fails reports the failure as its anomaly.  Each
part's result goes to ``soak/results.json`` as soon as it ends, beside the last result of the parts not run
(each with its commit, start, the machine and its load, counts, wall time and anomalies), and a summary is
printed.  ``python -m devtools.soak --part kills --fault-rounds 5`` runs less (the file says what ran).
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
                  "shards": [{"RECLOCK_FAULT_ROUNDS": str(n)} for n in split(args.fault_rounds, args.kill_shards)]},
        "runs": {"tests": ["tests/test_races.py::test_racing_runs_end_cleanly"],
                 "env": {"RECLOCK_RACE_RUN_ROUNDS": str(args.run_rounds)}},
        "long-run": {"tests": ["tests/test_races.py::test_records_arriving_while_ticks_race"],
                     "env": {"RECLOCK_SOAK_SECONDS": str(args.seconds)}},
        "s3": {"tests": ["tests/test_s3.py::test_racing_first_steps_create_each_table_once_on_s3",
                         "tests/test_s3.py::test_racing_ticks_on_s3_lose_no_commit",
                         "tests/test_s3.py::test_publishes_racing_compactions_on_s3"],
               "env": {"RECLOCK_S3_ROUNDS": str(args.s3_rounds)}},
        "platform": {"tests": ["tests/test_up.py"],
                     "env": {"RECLOCK_PLATFORM": "1", "RECLOCK_SCREENSHOTS": str(REPO / "docs" / "images")}},
        "production": {"module": "devtools.production_soak",
                       "args": ["--minutes", str(args.production_minutes)]},
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


def split(total: int, shards: int) -> list[int]:
    """``total`` rounds as ``shards`` near-equal counts (none empty)."""
    shards = max(1, min(shards, total))
    return [total // shards + (i < total % shards) for i in range(shards)]


def failure(output: str) -> str:
    """What a failed pytest run says of its failure: its ``E`` lines (the assertion and its values) and the
    short summary, not the logs captured around them."""
    lines = output.splitlines()
    said = [line for line in lines if line.startswith("E ")][:80]
    summary = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    return "\n".join(said + summary)[-8000:] or output[-6000:]


def run_module(name: str, part: dict) -> dict:
    """Run a part that is a program of its own (``module``, writing its results as JSON with ``--out``)."""
    print(f"soak: {name}: python -m {part['module']} {' '.join(part['args'])}", flush=True)
    when, where, started, tested = datetime.now(timezone.utc).isoformat(timespec="seconds"), machine(), \
        time.monotonic(), commit()
    out = Path(f"/tmp/reclock-soak-{name}.json")
    out.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-m", part["module"], *part["args"], "--out", str(out)], cwd=REPO)
    wall = time.monotonic() - started
    try:
        found = json.loads(out.read_text())
    except (OSError, ValueError):
        found = {"anomalies": [f"{part['module']} exited {proc.returncode} without its results"]}
    anomalies = list(found.pop("anomalies", [])) + ([found["error"]] if found.get("error") else [])
    passed = proc.returncode == 0 and not anomalies
    print(f"soak: {name}: {'passed' if passed else 'FAILED'} in {wall / 60:.1f} min", flush=True)
    return {"commit": tested, "started": when, "machine": where, "module": part["module"], "args": part["args"],
            "passed": passed, "wall_s": round(wall, 1), "found": found, "anomalies": anomalies}


def run_part(name: str, part: dict) -> dict:
    """Run the part's tests: once with its ``env``, or once per shard at the same time, each shard with its own
    environment (its share of the rounds), test servers and temporary directory (so its own topic and
    warehouse): the rounds add up, on a machine whose cores one sequential run of the test leaves half idle."""
    if "module" in part:
        return run_module(name, part)
    shards = part.get("shards") or [part["env"]]
    print(f"soak: {name}: " + " | ".join(" ".join(f"{k}={v}" for k, v in env.items()) for env in shards), flush=True)
    when, where, started = datetime.now(timezone.utc).isoformat(timespec="seconds"), machine(), time.monotonic()
    tested = commit()  # before the run: the platform part's screenshots change tracked files
    procs = [subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", *part["tests"],
                               "--basetemp", f"/tmp/reclock-soak-{name}-{i}"],
                              cwd=REPO, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for i, env in enumerate(shards)]
    outputs = [proc.communicate()[0] for proc in procs]
    wall = time.monotonic() - started
    summaries = [next((line.strip("= ") for line in reversed(output.splitlines())
                       if " in " in line and (" passed" in line or " failed" in line or " error" in line)), "")
                 for output in outputs]
    passed = all(proc.returncode == 0 for proc in procs)
    anomalies = [failure(output) for proc, output in zip(procs, outputs) if proc.returncode != 0]
    print(f"soak: {name}: {'passed' if passed else 'FAILED'} in {wall / 60:.1f} min {'; '.join(summaries)}",
          flush=True)
    return {"commit": tested, "started": when, "machine": where, "tests": part["tests"],
            **({"shards": shards} if part.get("shards") else {"env": part["env"]}), "passed": passed,
            "wall_s": round(wall, 1), "pytest": "; ".join(summaries), "anomalies": anomalies}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", action="append", choices=["races", "runs", "kills", "long-run", "s3", "platform",
                                                              "production"],
                        help="run only this part (repeatable; default all)")
    parser.add_argument("--race-rounds", type=int, default=100)
    parser.add_argument("--process-rounds", type=int, default=100)
    parser.add_argument("--run-rounds", type=int, default=100, help="rounds of three racing `reclock run`s")
    parser.add_argument("--fault-rounds", type=int, default=50, help="kills at every crash point, in all")
    parser.add_argument("--kill-shards", type=int, default=1,
                        help="fault tests run at once, each on its own source and servers, sharing the rounds")
    parser.add_argument("--seconds", type=int, default=1800, help="the long run's length")
    parser.add_argument("--s3-rounds", type=int, default=100, help="rounds of each race on s3://")
    parser.add_argument("--production-minutes", type=float, default=30.0,
                        help="the production-shaped soak's length (devtools/production_soak.py)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    chosen = {k: v for k, v in parts(args).items() if not args.part or k in args.part}
    started, ran = time.monotonic(), {}
    for name, part in chosen.items():
        ran[name] = run_part(name, part)
        record(args.out, name, ran[name])
    wall, anomalies = time.monotonic() - started, sum(len(p["anomalies"]) for p in ran.values())
    print(f"soak: {len(chosen)} part(s) in {wall / 60:.1f} min, {anomalies} anomalies; {args.out}", flush=True)
    return 0 if anomalies == 0 else 1


def record(out: Path, name: str, result: dict) -> None:
    """Store part ``name``'s ``result`` in ``out`` beside the other parts' last results (each says its commit);
    soaks running at once (one part each) take turns."""
    import fcntl

    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            results = json.loads(out.read_text())
        except (OSError, ValueError):
            results = {}
        results = {"parts": {**results.get("parts", {}), name: result}}
        results["anomalies"] = sum(len(p["anomalies"]) for p in results["parts"].values())
        out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
