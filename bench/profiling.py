"""Profiles of the cases whose targets a bench run missed (issue 38: "a profile for every target missed").

After the summary, :func:`profile_missed` runs each missed target's case once more, outside the figures, and
writes what it spent its time on to ``<profiles>/<case>.txt`` (``bench/profiles/`` beside ``results.json``, whose
``profiles`` lists them; the folder holds only the last run's):

* a case run in the bench's process (a full run of one size, a run with nothing new, the wide and narrow
  sources, a compaction): cProfile of the process (the steps' Python side, with what they wait on Spark Connect
  for), and Java Flight Recorder on the driver JVM (``jcmd <pid> JFR.start``, its ``profile`` settings, Java code
  sampled every millisecond, which slows the run) over the same block: the threads sampled, the frames with the
  most samples on top of the stack, Spark's, Kafka's, Parquet's and Delta's frames by samples anywhere in the
  stack, and the heap at its collections;
* a case that is a command (``reclock query``, ``airflow dags test``, parsing the DAG file): the command again
  under ``python -m cProfile``;
* a DAG run under the scheduler, whose tasks are processes of their own: its task instances' times from the
  metadata database, against the floor's.

Which case a target belongs to is :data:`CASES`.  A profile is a diagnosis, not a figure: its run is timed only to
say how long the profiled run took.
"""
from __future__ import annotations

import collections
import cProfile
import io
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: target (``targets_met`` key) -> the case profiled for it; ``{n}`` is the largest size run.
CASES = {"ratio_100000": "size-100000", "ratio_1000000": "size-1000000", "ratio_10000000": "size-10000000",
         "check": "size-{n}", "rss": "size-{n}", "empty": "empty", "wide": "wide", "compaction": "compaction-{n}",
         "query": "query", "dag": "dags-test", "dag_scheduler": "scheduler", "parse": "parse", "own_dag": "parse"}
#: Frames counted by inclusive samples in a JVM profile.
JVM_FRAMES = re.compile(r"org\.apache\.(spark|kafka|parquet|hadoop)|io\.delta|snappy|zstd")
TOP = 30


class Profile:
    """cProfile of this process and, for ``jvm`` (a pid), Java Flight Recorder on that JVM, over a block;
    :meth:`report` summarizes both."""

    def __init__(self, jvm: int | None, workdir: Path) -> None:
        self.jvm = jvm if jvm is not None and shutil.which("jcmd") and shutil.which("jfr") else None
        self.recording = Path(tempfile.mkstemp(suffix=".jfr", dir=workdir)[1])
        self.python = cProfile.Profile()
        self.seconds = 0.0

    def __enter__(self) -> "Profile":
        if self.jvm is not None and _jcmd(self.jvm, "JFR.start", "name=bench-profile", "settings=profile",
                                          "method-profiling=max", f"filename={self.recording}") != 0:
            self.jvm = None
        self.start = time.perf_counter()
        self.python.enable()
        return self

    def __exit__(self, *exc) -> None:
        self.python.disable()
        self.seconds = time.perf_counter() - self.start
        if self.jvm is not None:
            _jcmd(self.jvm, "JFR.stop", "name=bench-profile")

    def report(self) -> str:
        text = (f"profiled run: {self.seconds:.2f}s\n\n== Python (cProfile, this process) ==\n"
                + python_report(self.python))
        if self.jvm is not None:
            text += f"\n== the driver JVM (Java Flight Recorder, pid {self.jvm}) ==\n" + jvm_report(self.recording)
        return text


def _jcmd(pid: int, *args: str) -> int:
    return subprocess.run(["jcmd", str(pid), *args], capture_output=True, timeout=120).returncode


def python_report(profile: cProfile.Profile | str) -> str:
    """The :data:`TOP` functions with the most cumulative time, then with the most time of their own."""
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out).strip_dirs()
    stats.sort_stats("cumulative").print_stats(TOP)
    stats.sort_stats("tottime").print_stats(TOP)
    return re.sub(r"\n{3,}", "\n\n", out.getvalue())


def jvm_report(recording: Path) -> str:
    """A JFR recording's execution samples by thread, by top frame and by Spark/Kafka/Parquet/Delta frame anywhere
    in the stack; and the heap at its collections."""
    printed = subprocess.run(["jfr", "print", "--events", "jdk.ExecutionSample", "--stack-depth", "64",
                              str(recording)], capture_output=True, text=True, timeout=600)
    samples = []
    for block in printed.stdout.split("jdk.ExecutionSample")[1:]:
        thread = re.search(r'sampledThread = "([^"]*)"', block)
        frames = re.findall(r"^\s+([\w$.<>]+)\(", block.split("stackTrace = [", 1)[-1], re.M)
        samples.append((re.sub(r"\d+", "N", thread[1]) if thread else "?", frames))
    if not samples:
        return f"no execution samples ({printed.stderr.strip()[:300]})\n"
    share = lambda n: f"{n:7d} {100 * n / len(samples):5.1f}%  "  # noqa: E731
    lines = [f"{len(samples)} execution samples", "", "threads:"]
    lines += [share(n) + name for name, n in collections.Counter(t for t, _ in samples).most_common(12)]
    lines += ["", "top of the stack:"]
    lines += [share(n) + name for name, n in collections.Counter(f[0] for _, f in samples if f).most_common(TOP)]
    inclusive = collections.Counter(name for _, frames in samples for name in set(frames) if JVM_FRAMES.search(name))
    lines += ["", "anywhere in the stack (Spark, Kafka, Parquet, Hadoop, Delta, compression):"]
    lines += [share(n) + name for name, n in inclusive.most_common(2 * TOP)]
    return "\n".join(lines) + "\n" + heap_report(recording)


def heap_report(recording: Path) -> str:
    """Collections in a JFR recording, the heap committed at most and the heap in use after them at most."""
    printed = subprocess.run(["jfr", "print", "--events", "jdk.GCHeapSummary", str(recording)],
                             capture_output=True, text=True, timeout=600).stdout
    after, committed = [], []
    for block in printed.split("jdk.GCHeapSummary")[1:]:
        size = re.search(r"committedSize = ([\d.]+) ([kMG]B)", block)
        used = re.search(r"heapUsed = ([\d.]+) ([kMG]B)", block)
        if size:
            committed.append(_mb(*size.groups()))
        if used and '"After GC"' in block:
            after.append(_mb(*used.groups()))
    if not after:
        return "\nheap: no collection recorded\n"
    return (f"\nheap: {len(after)} collections; committed at most {max(committed):,.0f} MB; in use after a collection "
            f"at most {max(after):,.0f} MB, at least {min(after):,.0f} MB\n")


def _mb(value: str, unit: str) -> float:
    return float(value) * {"kB": 1 / 1024, "MB": 1, "GB": 1024}[unit]


def command_report(command: list[str], env: dict, workdir: Path, timeout: float = 900) -> str:
    """``command`` (a Python script or ``-m`` module and its arguments, run by this interpreter) again under
    cProfile: its seconds and :func:`python_report`."""
    out = Path(tempfile.mkstemp(suffix=".prof", dir=workdir)[1])
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(out), *command], env=env,
                          capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - start
    if done.returncode:
        return f"the profiled command failed ({done.returncode}): {done.stderr[-2000:]}\n"
    return f"profiled command: {seconds:.2f}s (python -m cProfile {' '.join(command)})\n\n" + python_report(str(out))


def missed_cases(met: dict, largest: int | None) -> dict[str, list[str]]:
    """The case to profile for each target missed (``met[target]`` False; None is not run), with its targets:
    :data:`CASES`, ``{n}`` the ``largest`` size run."""
    cases: dict[str, list[str]] = {}
    for target, ok in met.items():
        if ok is False and target in CASES and ("{n}" not in CASES[target] or largest):
            cases.setdefault(CASES[target].format(n=largest), []).append(target)
    return cases


def profile_missed(bench, results: dict, met: dict, folder: Path) -> dict:
    """Each missed target's case (:data:`CASES`) run once more under a profile, written to ``folder/<case>.txt``
    (the folder's earlier profiles removed first); ``{case: {"targets": [...], "file": path}}``."""
    cases = missed_cases(met, max((r["records"] for r in results.get("sizes", [])), default=None))
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.txt"):
        old.unlink()
    out = {}
    for case, targets in cases.items():
        print(f"  profiling {case} (missed: {', '.join(targets)})", flush=True)
        try:
            text = bench.profile_case(case, results)
        except Exception as e:  # noqa: BLE001 - a profile that fails is said, never fails the bench
            text = f"profiling failed: {type(e).__name__}: {e}\n"
        path = folder / f"{case}.txt"
        path.write_text(f"# {case}: a profile for the missed target(s) {', '.join(targets)}\n"
                        f"# commit {results.get('commit')}, bench run of {results.get('started')}\n\n{text}")
        out[case] = {"targets": targets, "file": str(path)}
    return out


def scheduler_report(scheduler: dict) -> str:
    """A DAG run under the scheduler against the floor's, task by task: when each was queued, started and ended,
    in seconds from its run's ``queued_at`` (the bench's ``task_times``)."""
    lines = [f"DAG run {scheduler['seconds']:.2f}s, the floor's {scheduler['floor_s']:.2f}s; per task: queued, "
             "started, ended (s from the run's queued_at), and its own seconds", ""]
    for label, times in (("reclock", scheduler["task_times"]["run"]), ("floor", scheduler["task_times"]["floor"])):
        lines.append(f"{label}:")
        for t in times:
            own = "" if None in (t["start"], t["end"]) else f"  {t['end'] - t['start']:6.2f}s"
            lines.append(f"  {t['task']:10s} {t['queued']!s:>8} {t['start']!s:>8} {t['end']!s:>8}{own}")
    return "\n".join(lines) + "\n"
