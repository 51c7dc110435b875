"""reclock benchmark: a full tick against Spark's own Kafka -> Delta copy of the same offsets, in one run.

It starts a local Apache Kafka broker (KRaft) and one Spark session (local, or a Spark Connect server with
``--spark-remote``), writes a temporary sources file, and measures:

sizes        for each N of ``--sizes`` (default 100K, 1M, 10M records) on a fresh topic of ``--partitions``
             (8) partitions, whose source has already ticked once with nothing (its tables exist):

             reclock = one full run through the real code path, ``pipeline.run_once``:
                       tick -> stage -> check -> publish -> resume -> compact, on the one Spark session
             copy    = Spark's own Kafka source reading the same offsets into a Delta table (no remap, no
                       IntoTime, no checks): the physical limit here; once before reclock and once after,
                       all three after an untimed read of the offsets (the first reader of records just
                       produced is the slowest, and the JVM warms up from one size to the next)
             ratio   = reclock / mean of the two copies

             and the peak RSS, during the reclock run, of the Spark driver (the JVM of a local session, or the
             Connect server's) and of this Python process (where an Airflow task runs the steps), the driver
             collected fully first (:class:`PeakRss`: the run's own peak, not the heap the copy before it grew);
             with ``--connect``, also the most
             heap the driver held right after a garbage collection (its GC log; in local mode the driver's JVM
             runs the tasks too, so this includes the tasks' buffers), and what it still holds after a full
             collection once the run is over (``jcmd <pid> GC.run``): neither follows the collector's lazy
             sizing of the heap, as RSS does;

             compaction = then one more run binds 1,000 records at a later IntoTime, and a compaction a
                       retention later folds every row at that IntoTime (a full run's compact step has nothing
                       old enough to fold); against Spark rewriting the copy's Delta table in place
                       (``--no-compaction`` skips it);
empty        the same run with no new records: a tick's fixed cost with Spark up (median of 3);
partitions   the same ``--partition-records`` over ``--wide-partitions`` (64) and ``--partitions``
             partitions, each a source's next tick (its first tick that reads took as many records before it,
             timed too: ``first_ratio``), after an untimed read of them as in sizes, the two counts back to back
             in ``--partition-rounds`` (5) rounds of alternating order: reclock time wide / narrow, medians; and
             Spark's own copy of the last tick's offsets after it, wide / narrow (its baseline: Spark's Kafka
             source pays a consumer per partition too, in a group of its own per read);
airflow      one DAG run of ``--dag-records`` (100K) records under ``airflow dags test reclock_<name>``
             (after one run with nothing, which creates the tables), in a fresh Airflow home; then Airflow's
             own cost of such a run: ``reclock_floor`` (bench/airflow_floor), the same tasks in the same order
             doing nothing, under the same command in the same home (its second run); and the import of Great
             Expectations in a fresh process (over a bare Python start), which the check task pays;
scheduler    the same DAG run under a real scheduler (``airflow standalone``, a process per task), triggered from
             the CLI and timed from its ``queued_at`` to its ``end_date``; and ``reclock_floor`` the same way;
parse        the DAG file over a sources file of 1,000 sources, in fresh processes (Airflow imported first,
             untimed): parsed whole, and as a task process parses it (its own DAG only);
linearity    reclock seconds per record at 10M / at 1M (without both sizes, at the largest / at the smallest),
             and the marginal cost per record between them against the copy's.

It asserts nothing.  It prints each figure with issue 38's targets (MET / NOT MET) and writes everything,
with the machine it ran on, to ``--results`` (default ``bench/results.json``), which the README quotes.  Then it
runs the case of each target missed once more under a profile (:mod:`bench.profiling`), written to
``profiles/<case>.txt`` beside the results (``--no-profile``: none).
Records are produced by Spark's Kafka sink (untimed).  All figures are wall times: other load on the machine
inflates them, so the header and footer print the load average.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

from devtools.kafka_broker import LocalBroker, create_topic
from reclock import pipeline, runtime
from reclock.config import load_config
from reclock.sources.kafka import KafkaSource
from reclock.spark.kafka import SPARK_FETCH_MAX_WAIT_MS

RESULTS = Path(__file__).resolve().parent / "results.json"
FLOOR_DAGS = Path(__file__).resolve().parent / "airflow_floor"  # reclock_floor: the same tasks doing nothing
COMPACTED_EXTRA = 1_000  # records bound after a size's batch, before the compaction that folds both
TARGETS = {  # issue 38's
    "ratio": {100_000: 1.6, 1_000_000: 1.25, 10_000_000: 1.1},  # full run <= this x Spark's own copy
    "empty_s": 0.5,        # a full run with no new records, Spark up
    "check_share": 0.10,   # the check step at 10M <= 10% of the copy's time
    "dag_over_floor_s": 3.0,  # one DAG run of 100K records <= Airflow's floor (the same tasks doing nothing) + 3 s
    "parse_s": 5.0,        # the DAG file of 1,000 sources parses whole in <= 5 s
    "own_dag_s": 0.3,      # a task process builds its own DAG of those in <= 0.3 s
    "compaction": 1.5,     # a compaction folding a batch <= 1.5x Spark rewriting the same rows
    "rss_growth": 1.3,     # peak driver RSS at 10M within 1.3x of that at 1M
    "wide": 1.3,           # 64 partitions <= 1.3x 8 for the same records
    "query_s": 2.0,        # reclock query --as-of latest counting 10M rows without Spark
    "linearity": 0.2,      # 10M ~ 10x 1M, +-20% (per-record cost ratio within [0.8, 1.2]): shown, not a target
}
#: The parse measurement: the imports a DAG processor (or a task process) has done before it parses the file,
#: untimed, then the file itself, timed; its DAGs counted.
PARSE_SCRIPT = """
import json, runpy, sys, time
import airflow.sdk
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
start = time.perf_counter()
found = runpy.run_path(sys.argv[1])
parse_s = time.perf_counter() - start
print(json.dumps({"parse_s": parse_s, "dags": sum(isinstance(v, airflow.sdk.DAG) for v in found.values())}))
"""
PARSE_SOURCES = 1_000


# --- measuring ---------------------------------------------------------------------------------


def median_run(runs: list[dict]) -> dict:
    """The run of ``runs`` (:meth:`Bench.run`'s) whose ``seconds`` is the median (of an even count, the lower)."""
    return sorted(runs, key=lambda r: r["seconds"])[(len(runs) - 1) // 2]


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


class PeakRss:
    """Peak resident set size of processes over a block: their high-water mark (``VmHWM``) is reset on entry
    (``/proc/<pid>/clear_refs``, 5) and read on exit, in bytes; None where Linux does not let it be read.

    ``collect``: the names of JVMs among them to collect fully first (``jcmd <pid> GC.run``, :func:`_collect`): a
    JVM keeps the heap it grew to until a collection shrinks it, so without this a block's peak holds what earlier
    work (a copy of the same records, a compaction) made it commit.  ``shrink``: the collection shrinks the heap to
    what is live, so the peak is what the block itself made the JVM commit (a block's times are then not a warm
    JVM's: the heap grows back during it)."""

    def __init__(self, collect: tuple[str, ...] = (), shrink: bool = False, **pids: int | None) -> None:
        self.pids, self.collect, self.shrink = pids, collect, shrink
        self.peak: dict[str, int | None] = {}

    def __enter__(self) -> "PeakRss":
        for name in self.collect:
            if (pid := self.pids.get(name)) is not None and shutil.which("jcmd"):
                _collect(pid, self.shrink)
        for pid in self.pids.values():
            if pid is not None:
                try:
                    Path(f"/proc/{pid}/clear_refs").write_text("5")
                except OSError:
                    pass
        return self

    def __exit__(self, *exc) -> None:
        self.peak = {name: _hwm(pid) for name, pid in self.pids.items()}


class HeapAfterGc:
    """The most heap the driver JVM held right after a garbage collection over a block, in bytes (None without a
    log or a collection in the block): what survived the collections, so a batch held by the driver shows here,
    the collector's lazy sizing of the heap (which RSS follows) does not.  Read from the JVM's unified GC log
    (``-Xlog:gc:file=<path>:timemillis``: the Connect server that ``--connect`` starts writes one), whose lines
    ``[<epoch ms>ms] GC(n) Pause Young (Normal) (G1 Evacuation Pause) 512M->123M(1024M) 5.1ms`` are kept when
    their time lies in the block."""

    LINE = re.compile(r"^\[(\d+)ms\].*?(\d+)([KMG])->(\d+)([KMG])\((\d+)([KMG])\)")
    UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}

    def __init__(self, path: Path | None) -> None:
        self.path, self.peak = path, None

    def __enter__(self) -> "HeapAfterGc":
        self.start = time.time() * 1000
        return self

    def __exit__(self, *exc) -> None:
        self.peak = max((after for _, after, _ in self.collections(self.start, time.time() * 1000)), default=None)

    def collections(self, start: float, end: float) -> list[tuple[int, int, str]]:
        """``(epoch ms, bytes in use after it, line)`` of each collection logged from ``start`` to ``end`` (ms)."""
        if self.path is None or not self.path.exists():
            return []
        return [(int(m[1]), int(m[4]) * self.UNITS[m[5]], line) for line in self.path.read_text().splitlines()
                if (m := self.LINE.match(line)) and start <= int(m[1]) <= end]

    def retained(self, pid: int | None) -> int | None:
        """The heap in use after a full collection of JVM ``pid`` asked for now (``jcmd <pid> GC.run``): what the
        driver still holds once a run is over; None when it cannot be asked or logged no full collection."""
        if pid is None or self.path is None or shutil.which("jcmd") is None:
            return None
        start = time.time() * 1000
        if subprocess.run(["jcmd", str(pid), "GC.run"], capture_output=True, timeout=60).returncode:
            return None
        for _ in range(20):  # the log line may follow the command's return
            full = [after for _, after, line in self.collections(start, time.time() * 1000) if "Pause Full" in line]
            if full:
                return full[-1]
            time.sleep(0.1)
        return None


def _collect(pid: int, shrink: bool = False) -> None:
    """Collect JVM ``pid`` fully, then wait until the OS has back what the collection gave up.

    After a full collection G1 keeps ``MaxHeapFreeRatio`` of its heap free (70 %: up to 3.3x the live heap, when
    earlier work grew it that far); ``shrink``: the collection runs with the ratios lowered (manageable flags),
    restored after, so the heap is shrunk to what is live.  G1 gives the regions it shrank back to the OS in a
    concurrent task after the collection (``Concurrent Uncommit`` in ``-Xlog:gc+heap=debug``, about 0.15 s
    later): :func:`_settled_rss` waits for it, or a mark reset now holds the heap the collection gave up."""
    jcmd = ["jcmd", str(pid)]
    ratios = {}
    if shrink:
        flags = subprocess.run([*jcmd, "VM.flags", "-all"], capture_output=True, text=True, timeout=60).stdout
        ratios = dict(re.findall(r"\b(M(?:in|ax)HeapFreeRatio)\s+=\s+(\d+)", flags))
    if len(ratios) == 2:  # lowered Min first, restored Max first: Min never exceeds Max
        for name, value in (("MinHeapFreeRatio", "0"), ("MaxHeapFreeRatio", "10")):
            subprocess.run([*jcmd, "VM.set_flag", name, value], capture_output=True, timeout=60)
    subprocess.run([*jcmd, "GC.run"], capture_output=True, timeout=60)
    for name in ("MaxHeapFreeRatio", "MinHeapFreeRatio") if len(ratios) == 2 else ():
        subprocess.run([*jcmd, "VM.set_flag", name, ratios[name]], capture_output=True, timeout=60)
    _settled_rss(pid)


def _settled_rss(pid: int, interval_s: float = 0.05, quiet: int = 10, timeout_s: float = 5.0) -> int | None:
    """Process ``pid``'s RSS once it has not fallen by more than 1 MiB over ``quiet`` reads ``interval_s`` apart
    (or after ``timeout_s``), in bytes; None where Linux does not let it be read."""
    deadline, low, calm = time.monotonic() + timeout_s, None, 0
    while (rss := _status(pid, "VmRSS:")) is not None and time.monotonic() < deadline:
        calm = calm + 1 if low is not None and rss > low - (1 << 20) else 0
        low = rss if low is None else min(low, rss)
        if calm >= quiet:
            break
        time.sleep(interval_s)
    return low


def _hwm(pid: int | None) -> int | None:
    return None if pid is None else _status(pid, "VmHWM:")


def _status(pid: int, field: str) -> int | None:
    """Field ``field`` (a size in kB) of ``/proc/<pid>/status``, in bytes."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def driver_pid(spark) -> int | None:
    """The pid of a local session's driver JVM (py4j's gateway process); None over Spark Connect."""
    try:
        return spark.sparkContext._gateway.proc.pid
    except Exception:  # noqa: BLE001 - a Connect session has no sparkContext
        return None


def mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:,.0f} MiB"


def rate(records: int, seconds: float) -> str:
    return f"{records / seconds:,.0f}" if seconds > 0 else "inf"


def table(headers: list[str], rows: list[list], indent: str = "  ") -> str:
    cells = [[str(c) for c in r] for r in [headers] + rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    fmt = lambda r: indent + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([fmt(cells[0]), indent + "  ".join("-" * w for w in widths)] + [fmt(r) for r in cells[1:]])


def section(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 76 - len(title)), flush=True)


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("MET" if ok else "NOT MET")


def load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def machine() -> dict:
    """What the figures came from."""
    model = next((line.split(":", 1)[1].strip() for line in _lines("/proc/cpuinfo") if line.startswith("model name")),
                 platform.processor())
    memory = next((int(line.split()[1]) * 1024 for line in _lines("/proc/meminfo") if line.startswith("MemTotal:")),
                  None)
    return {"cpus": os.cpu_count(), "cpu": model, "memory_bytes": memory, "os": platform.platform(),
            "python": platform.python_version(), "load_average_start": load()}


def commit() -> str | None:
    """The commit the bench runs, short, with ``+changes`` when tracked files differ from it; None outside git."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                 capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+changes" if changed else "")


def _lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


# --- the data ----------------------------------------------------------------------------------


def produce(spark, bootstrap: str, topic: str, start: int, count: int, partitions: int, value_bytes: int) -> None:
    """Records ``start .. start+count-1`` by Spark's Kafka sink, record i to partition ``i % partitions``.

    Its producers batch up to :data:`BATCH_BYTES` per partition within 20 ms, with buffer room for two batches of
    every partition: a producer whose buffer (Kafka's default, 32 MiB) runs out sends every batch at once, a record
    each, and reads of such a topic measure the consumer's cost per batch rather than per partition
    (``bench/README.md``, "Batches of the 64-partition topic")."""
    pad = max(0, value_bytes - 11)
    (spark.range(start, start + count)
     .selectExpr("CAST(id % 1000 AS STRING) AS key",
                 f"concat('v', lpad(CAST(id AS STRING), 10, '0'), repeat('x', {pad})) AS value",
                 f"CAST(id % {partitions} AS INT) AS partition")
     .write.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
     .option("kafka.linger.ms", "20").option("kafka.batch.size", str(BATCH_BYTES))
     .option("kafka.buffer.memory", str(max(32 << 20, 2 * partitions * BATCH_BYTES))).save())


#: The most bytes :func:`produce` batches for one partition.
BATCH_BYTES = 1 << 20


def kafka_range(spark, bootstrap: str, topic: str, bounds: dict[int, tuple[int, int]], group: str | None = None):
    """Spark's own Kafka source over offsets ``[start, end)`` of each partition in ``bounds``, with reclock's
    ``fetch.max.wait.ms`` (:data:`reclock.spark.kafka.SPARK_FETCH_MAX_WAIT_MS`): Kafka's default would cost it
    ~0.5 s per partition at the log end, and the baseline must not be slower than it need be.  ``group``: the
    consumers' group (Spark's default: one of its own per read)."""
    offsets_at = lambda i: json.dumps({topic: {str(p): b[i] for p, b in bounds.items()}})  # noqa: E731
    reader = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("kafka.isolation.level", "read_committed").option("subscribe", topic)
              .option("kafka.fetch.max.wait.ms", str(SPARK_FETCH_MAX_WAIT_MS)))
    if group is not None:
        reader = reader.option("kafka.group.id", group)
    return reader.option("startingOffsets", offsets_at(0)).option("endingOffsets", offsets_at(1)).load()


def read_through(spark, bootstrap: str, topic: str, bounds: dict[int, tuple[int, int]]) -> None:
    """Read the offsets once, untimed, writing nothing (Spark's ``noop`` sink): the first reader of records just
    produced is slower than the next ones (1M records copied three times in a row, in a local session on 2026-11-27:
    7.61, 6.23 and 6.00 s), and no timed reader should be that first one.  The reads share one consumer group,
    :data:`READ_THROUGH_GROUP`, so the server's consumer pool keeps one consumer per partition for them: in a group
    of its own per read, each left a consumer per partition idle in the pool for five minutes, and a server
    holding hundreds of them reads slower (``bench/README.md``, "Idle consumers")."""
    (kafka_range(spark, bootstrap, topic, bounds, group=READ_THROUGH_GROUP)
     .write.format("noop").mode("overwrite").save())


#: The consumer group of the bench's untimed reads (:func:`read_through`).
READ_THROUGH_GROUP = "reclock-bench-read-through"


def spark_copy(spark, bootstrap: str, topic: str, bounds: dict[int, tuple[int, int]], out: Path) -> float:
    """Spark's own Kafka source reads offsets ``[start, end)`` of each partition and writes a Delta table; the
    seconds it took (the row count is checked afterwards, untimed)."""
    start = time.perf_counter()
    (kafka_range(spark, bootstrap, topic, bounds)
     .selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value", "partition", "offset", "timestamp")
     .write.format("delta").mode("overwrite").save(out.as_uri()))
    seconds = time.perf_counter() - start
    expected = sum(end - begin for begin, end in bounds.values())
    if (rows := spark.read.format("delta").load(out.as_uri()).count()) != expected:
        raise RuntimeError(f"Spark copy of {topic} wrote {rows} rows, expected {expected}")
    return seconds


def topic_upper(bootstrap: str, topic: str) -> dict[int, int]:
    """Per partition of ``topic``, its upper (the offset the next record gets: what a tick binds now)."""
    source = KafkaSource(bootstrap_servers=bootstrap, topic=topic, group_id="reclock-bench")
    try:
        return source.upper().as_dict()
    finally:
        source.close()


def bound_offsets(name: str, config: str, into_time: int) -> dict[int, tuple[int, int]]:
    """Per partition, the offsets ``[start, end)`` the binding at ``into_time`` added."""
    with runtime.open_source(name, config, connect=False) as ctx:
        return {p: (start, end) for t, p, start, end in ctx.tables.read_remap().ranges(0) if t == into_time}


# --- the benchmark -----------------------------------------------------------------------------


class Bench:
    def __init__(self, args, workdir: Path, bootstrap: str, spark, driver: int | None,
                 gc_log: Path | None = None) -> None:
        self.args, self.workdir, self.bootstrap, self.spark, self.gc_log = args, workdir, bootstrap, spark, gc_log
        self.config = workdir / "sources.yaml"
        self.sources: dict[str, tuple[str, int]] = {}  # name -> (topic, partitions)
        self.last_bounds: dict[str, dict[int, tuple[int, int]]] = {}  # name -> offsets its last produce added
        self.produced: dict[str, int] = {}
        self.pids = {"driver": driver, "python": os.getpid()}

    def add_source(self, name: str, partitions: int, topic: str | None = None) -> str:
        """A Kafka source ``name`` of a new topic, or of ``topic`` (another source's: both bind what it holds)."""
        if topic is None:
            topic = f"bench-{name}-{uuid.uuid4().hex[:6]}".replace("_", "-")
            create_topic(self.bootstrap, topic, partitions=partitions)
        self.sources[name] = (topic, partitions)
        self.produced[name] = 0
        self.write_config()
        return name

    def write_config(self) -> None:
        spark = {"master": self.args.spark_master}
        if self.args.spark_remote:
            spark["remote"] = self.args.spark_remote
        self.config.write_text(yaml.safe_dump({
            "warehouse": str(self.workdir / "warehouse"), "spark": spark,
            "sources": [{"name": name, "kind": "kafka", "schedule": None,
                         "options": {"bootstrap_servers": self.bootstrap, "topic": topic, "group_id": f"bench-{name}"}}
                        for name, (topic, _) in self.sources.items()]}))

    def produce(self, name: str, count: int) -> None:
        topic, partitions = self.sources[name]
        produce(self.spark, self.bootstrap, topic, self.produced[name], count, partitions, self.args.value_bytes)
        self.produced[name] += count

    def collect(self) -> None:
        """Start a timed baseline as reclock's timed runs start (:meth:`run`): from a driver collected fully."""
        if (pid := self.pids["driver"]) is not None and shutil.which("jcmd"):
            _collect(pid)

    def run(self, name: str, shrink: bool = False) -> dict:
        """One full run of ``name``: every step in order, as ``pipeline.run_once`` does them, each timed; with the
        peak RSS of the driver (collected first; ``shrink``: its heap shrunk to what is live, :class:`PeakRss`) and
        of this process over the run."""
        config, steps, out = str(self.config), {}, {}
        with PeakRss(("driver",), shrink, **self.pids) as rss, HeapAfterGc(self.gc_log) as heap:
            for step in pipeline.STEPS:
                done, steps[step] = timed(lambda: pipeline.run_once(name, config, self.spark, steps=(step,)))
                out[step] = done[step]
        return {"seconds": sum(steps.values()), "steps_s": steps, "into_time": out["tick"]["into_time"],
                "staged_rows": out["stage"]["staged_rows"], "peak_rss": rss.peak, "driver_heap_after_gc": heap.peak,
                "driver_heap_retained": heap.retained(self.pids["driver"])}

    def warmup(self) -> float:
        """A first source run end to end, untimed in the figures: the JVM's JIT, Spark's first jobs, the Python
        workers and the GX import are paid here, not by the first measured size."""
        name = self.add_source("warmup", self.args.partitions)
        pipeline.run_once(name, str(self.config), self.spark)
        self.produce(name, 10_000)
        return self.run(name)["seconds"]

    # sizes ------------------------------------------------------------------------------------

    def size(self, records: int) -> dict:
        """reclock's full run of ``records`` new records, between two of Spark's copies of the same offsets (one
        before, one after: the JVM is still warming up from one size to the next, and the mean of the two
        copies is what a copy takes at the time of the run), all three after an untimed read of them
        (:func:`read_through`), each from a driver collected fully.  The memory figures are of two more blocks,
        untimed: a run of another source of the topic binding the same offsets, and one more of Spark's copies,
        each from a driver whose heap is shrunk to what is live (:class:`PeakRss`)."""
        a = self.args
        name = self.add_source(f"n{records}", a.partitions)
        topic = self.sources[name][0]
        memory = self.add_source(f"n{records}_memory", a.partitions, topic)
        for source in (name, memory):
            pipeline.run_once(source, str(self.config), self.spark)  # creates the tables; binds nothing
        before = topic_upper(self.bootstrap, topic)
        self.produce(name, records)
        bounds = {p: (before.get(p, 0), end) for p, end in topic_upper(self.bootstrap, topic).items()}
        read_through(self.spark, self.bootstrap, topic, bounds)
        self.collect()
        copies = [spark_copy(self.spark, self.bootstrap, topic, bounds, self.workdir / f"copy-{name}-before")]
        reclock = self.run(name)
        if reclock["staged_rows"] != records:
            raise RuntimeError(f"{name}: staged {reclock['staged_rows']} rows, produced {records}")
        if (bound := bound_offsets(name, str(self.config), reclock["into_time"])) != bounds:
            raise RuntimeError(f"{name}: the tick bound {bound}, the copies read {bounds}")
        copy = self.workdir / f"copy-{name}"
        self.collect()
        copies.append(spark_copy(self.spark, self.bootstrap, topic, bounds, copy))
        copy_s = sum(copies) / len(copies)
        # Memory, untimed: a second source of the topic binds the same offsets and runs from a driver whose heap is
        # shrunk to what is live, then Spark's copy does the same; each block's peak is then its own.
        held = self.run(memory, shrink=True)
        if held["staged_rows"] != records:
            raise RuntimeError(f"{memory}: staged {held['staged_rows']} rows, produced {records}")
        with PeakRss(("driver",), True, **self.pids) as copy_rss, HeapAfterGc(self.gc_log) as copy_heap:
            spark_copy(self.spark, self.bootstrap, topic, bounds, self.workdir / f"copy-{memory}")
        query = self.query(name, copy, records)
        compaction = self.compaction(name, copy) if a.compaction else {}
        return {"records": records, "partitions": a.partitions, "reclock_s": reclock["seconds"], "copy_s": copy_s,
                "copies_s": copies, "ratio": reclock["seconds"] / copy_s, "steps_s": reclock["steps_s"],
                "peak_rss": held["peak_rss"], "driver_heap_after_gc": held["driver_heap_after_gc"],
                "driver_heap_retained": held["driver_heap_retained"], "timed_peak_rss": reclock["peak_rss"],
                "copy_peak_rss": copy_rss.peak,
                "copy_driver_heap_after_gc": copy_heap.peak, "source": name, **query, **compaction}

    def query(self, name: str, copy: Path, records: int) -> dict:
        """``reclock query --as-of latest`` counting the source's rows, as a command of its own (no JVM: DuckDB
        over the published table), against Spark counting the copy's Delta table and answering the same AS OF
        query (:func:`reclock.query.query_as_of`), both in the warm session of the run."""
        from reclock.query import common_readable, query_as_of

        sql = f"SELECT count(*) AS n FROM {name}"
        command = [sys.executable, "-m", "reclock.cli", "--config", str(self.config), "query", "--as-of", "latest",
                   "--source", name, "--sql", sql]
        start = time.perf_counter()
        out = subprocess.run(command, capture_output=True, text=True, timeout=600)
        query_s = time.perf_counter() - start
        if out.returncode != 0 or f"{records:,}".replace(",", "") not in out.stdout.replace(",", ""):
            raise RuntimeError(f"{name}: reclock query answered {out.stdout[-2000:]}{out.stderr[-2000:]}")
        start = time.perf_counter()
        counted = self.spark.read.format("delta").load(copy.as_uri()).count()
        spark_count_s = time.perf_counter() - start
        t = common_readable([name], str(self.config))[1] - 1
        start = time.perf_counter()
        answered = query_as_of(self.spark, sql, t, [name], str(self.config)).first()["n"]
        spark_query_s = time.perf_counter() - start
        if counted != records or answered != records:
            raise RuntimeError(f"{name}: the copy holds {counted} rows, Spark's AS OF query counted {answered}")
        print(f"    reclock query --as-of latest (count, no JVM, a process of its own): {query_s:.2f}s; Spark in the "
              f"warm session: the copy's count {spark_count_s:.2f}s, the same AS OF query {spark_query_s:.2f}s",
              flush=True)
        return {"query_s": query_s, "spark_count_s": spark_count_s, "spark_query_s": spark_query_s}

    def compaction(self, name: str, copy: Path) -> dict:
        """A compaction that folds the measured batch: one more run binds ``COMPACTED_EXTRA`` records at a later
        IntoTime, then compaction runs a retention later (``now``), so ``since`` is that run's IntoTime and every
        row is rewritten there (the step's share of a full run is 0.0x s: nothing is old enough yet).  Against
        Spark rewriting the copy's Delta table in place (the same rows, one overwrite)."""
        config = str(self.config)
        self.produce(name, COMPACTED_EXTRA)
        last = pipeline.run_once(name, config, self.spark)["tick"]["into_time"]
        retention = load_config(config).source(name).retention_ms
        with PeakRss(("driver",), **self.pids) as rss:
            result, compact_s = timed(pipeline.compact, name, config, last + retention, self.spark)
        if not result["compacted"] or result["since"] != last:
            raise RuntimeError(f"{name}: compaction to {last} did not run: {result}")
        self.collect()
        start = time.perf_counter()
        self.spark.read.format("delta").load(copy.as_uri()).write.format("delta").mode("overwrite").save(copy.as_uri())
        rewrite_s = time.perf_counter() - start
        with runtime.open_source(name, config, connect=False) as ctx:
            from pyspark.sql import functions as F

            stats = ctx.tables.read_reclocked_spark(self.spark).agg(F.min("into_time"), F.count(F.lit(1))).first()
        if stats[1] != self.produced[name] or stats[0] != last:
            raise RuntimeError(f"{name}: after compaction {stats[1]} rows from IntoTime {stats[0]}, "
                               f"expected {self.produced[name]} from {last}")
        return {"compact_s": compact_s, "rewrite_s": rewrite_s, "compact_peak_rss": rss.peak}

    def sizes(self) -> list[dict]:
        a = self.args
        section(f"sizes: a full tick vs Spark's own Kafka -> Delta copy, {a.partitions} partitions")
        rows, out = [], []
        for records in a.sizes:
            r = self.size(records)
            out.append(r)
            rows.append([f"{records:,}", f"{r['reclock_s']:.2f}", f"{r['copy_s']:.2f}", f"{r['ratio']:.2f}x",
                         rate(records, r["reclock_s"]), rate(records, r["copy_s"]),
                         mib(r["peak_rss"]["driver"]), mib(r["driver_heap_after_gc"]), mib(r["driver_heap_retained"]),
                         mib(r["peak_rss"]["python"])])
            print(f"  {records:,}: reclock {r['reclock_s']:.2f}s (" + ", ".join(
                f"{s} {t:.2f}" for s, t in r["steps_s"].items()) + f"), copy {r['copy_s']:.2f}s (before "
                f"{r['copies_s'][0]:.2f}s, after {r['copies_s'][1]:.2f}s)", flush=True)
            if "compact_s" in r:
                print(f"    a compaction folding them (and {COMPACTED_EXTRA:,} more, bound later) at one IntoTime: "
                      f"{r['compact_s']:.2f}s; Spark rewriting the copy's Delta table: {r['rewrite_s']:.2f}s "
                      f"({r['compact_s'] / r['rewrite_s']:.2f}x)", flush=True)
        print(table(["records", "reclock s", "copy s", "ratio", "reclock rec/s", "copy rec/s",
                     "driver peak RSS", "driver heap after GC", "driver heap retained", "python peak RSS"], rows))
        return out

    # the fixed cost ---------------------------------------------------------------------------

    def empty(self, name: str) -> dict:
        section("empty: a full run with no new records (Spark up)")
        runs = [self.run(name) for _ in range(3)]
        seconds = [r["seconds"] for r in runs]
        median = median_run(runs)
        print(f"  3 runs: {', '.join(f'{s:.2f}s' for s in seconds)}; median {median['seconds']:.2f}s: "
              + ", ".join(f"{s} {t:.2f}s" for s, t in median["steps_s"].items()))
        return {"runs_s": seconds, "median_s": median["seconds"], "steps_s": median["steps_s"]}

    # partitions -------------------------------------------------------------------------------

    def partitions(self) -> dict:
        """The same records over ``--wide-partitions`` and ``--partitions`` partitions, each a source's next tick,
        in rounds that run both counts back to back under one server state (:meth:`partition_ticks`)."""
        a = self.args
        counts = (a.partitions, a.wide_partitions)
        section(f"partitions: {a.partition_records:,} records over {a.wide_partitions} vs {a.partitions} partitions"
                f" ({a.partition_rounds} next ticks each)")
        names = {count: self.add_source(f"p{count}", count) for count in counts}
        for name in names.values():
            pipeline.run_once(name, str(self.config), self.spark)
        firsts = self.partition_ticks(names, counts)
        rounds = [self.partition_ticks(names, counts if r % 2 else counts[::-1])
                  for r in range(a.partition_rounds)]
        times = {count: median_run([r[count] for r in rounds]) for count in counts}
        copies = {}
        for count, name in names.items():  # the baseline: Spark's own copy of the last tick's offsets, after reclock
            self.collect()
            copies[count] = spark_copy(self.spark, self.bootstrap, self.sources[name][0], self.last_bounds[name],
                                       self.workdir / f"copy-{name}")
        ratio = times[a.wide_partitions]["seconds"] / times[a.partitions]["seconds"]
        first_ratio = firsts[a.wide_partitions]["seconds"] / firsts[a.partitions]["seconds"]
        copy_ratio = copies[a.wide_partitions] / copies[a.partitions]
        print(table(["partitions", "first tick s", "reclock s"] + [f"{s} s" for s in pipeline.STEPS]
                    + ["next ticks s", "Spark's copy s"],
                    [[p, f"{firsts[p]['seconds']:.2f}", f"{r['seconds']:.2f}"]
                     + [f"{r['steps_s'][s]:.2f}" for s in pipeline.STEPS]
                     + [" ".join(f"{x[p]['seconds']:.2f}" for x in rounds), f"{copies[p]:.2f}"]
                     for p, r in times.items()]))
        print(f"  {a.wide_partitions} / {a.partitions}: {ratio:.2f}x, medians of {a.partition_rounds} next ticks (a "
              f"source's first tick that reads: {first_ratio:.2f}x; Spark's own copy of the same offsets: "
              f"{copy_ratio:.2f}x)")
        return {"records": a.partition_records, "rounds": a.partition_rounds,
                "seconds": {str(p): r["seconds"] for p, r in times.items()},
                "steps_s": {str(p): r["steps_s"] for p, r in times.items()}, "ratio": ratio,
                "next_seconds": {str(p): [x[p]["seconds"] for x in rounds] for p in counts},
                "first_seconds": {str(p): r["seconds"] for p, r in firsts.items()}, "first_ratio": first_ratio,
                "copy_s": {str(p): c for p, c in copies.items()}, "copy_ratio": copy_ratio}

    def partition_ticks(self, names: dict[int, str], order) -> dict[int, dict]:
        """One tick of each source of ``names`` (partition count -> source), timed, in ``order``: first every
        topic gets ``--partition-records`` more records and an untimed read of them (as in sizes: no timed reader
        is the first), then the ticks run back to back, each from a driver collected fully.  Spark's reads leave their consumers idle in the
        server's pool (a group of its own per read), and a server holding hundreds of them read slower
        (``bench/README.md``, "Idle consumers"): both counts are timed after the same reads."""
        for count in order:
            name = names[count]
            done = {p: end for p, (_, end) in self.last_bounds.get(name, {}).items()}
            self.produce(name, self.args.partition_records)
            topic = self.sources[name][0]
            self.last_bounds[name] = {p: (done.get(p, 0), end)
                                      for p, end in topic_upper(self.bootstrap, topic).items()}
            read_through(self.spark, self.bootstrap, topic, self.last_bounds[name])
        runs = {}
        for count in order:
            self.collect()  # each from a driver collected fully, as the sizes' runs
            runs[count] = self.run(names[count])
        return runs

    # profiles of missed targets ---------------------------------------------------------------

    def profile_case(self, case: str, results: dict) -> str:
        """Run ``case`` (:data:`bench.profiling.CASES`) once more under a profile; its report."""
        from bench.profiling import Profile, command_report, scheduler_report

        a, config = self.args, str(self.config)
        kind, _, arg = case.partition("-")
        if kind in ("size", "compaction", "empty", "wide"):
            reports = []
            for count, records in ([(a.partitions, a.partition_records), (a.wide_partitions, a.partition_records)]
                                   if kind == "wide" else [(a.partitions, 0 if kind == "empty" else int(arg))]):
                name = self.add_source(f"prof_{kind}{count}", count)
                pipeline.run_once(name, config, self.spark)  # creates the tables
                if records:
                    topic = self.sources[name][0]
                    self.produce(name, records)
                    read_through(self.spark, self.bootstrap, topic, {p: (0, e) for p, e in topic_upper(
                        self.bootstrap, topic).items()})
                if kind == "compaction":  # as Bench.compaction: the batch, then COMPACTED_EXTRA later, folded
                    pipeline.run_once(name, config, self.spark)
                    self.produce(name, COMPACTED_EXTRA)
                    last = pipeline.run_once(name, config, self.spark)["tick"]["into_time"]
                    with Profile(self.pids["driver"], self.workdir) as profile:
                        pipeline.compact(name, config, last + load_config(config).source(name).retention_ms, self.spark)
                    reports.append(f"a compaction folding {records:,} records\n\n" + profile.report())
                    continue
                steps = {}
                with Profile(self.pids["driver"], self.workdir) as profile:
                    for step in pipeline.STEPS:
                        steps[step] = timed(pipeline.run_once, name, config, self.spark, steps=(step,))[1]
                reports.append(f"a full run of {records:,} records over {count} partitions: " + ", ".join(
                    f"{step} {t:.2f}s" for step, t in steps.items()) + "\n\n" + profile.report())
            return "\n\n".join(reports)
        if case == "query":
            name = max(results["sizes"], key=lambda r: r["records"])["source"]
            return command_report(["-m", "reclock.cli", "--config", config, "query", "--as-of", "latest", "--source",
                                   name, "--sql", f"SELECT count(*) AS n FROM {name}"], dict(os.environ), self.workdir)
        if case == "dags-test":
            from devtools.airflow_home import AIRFLOW, airflow_env

            self.produce("dag", a.dag_records)
            return command_report([AIRFLOW, "dags", "test", "reclock_dag"],
                                  airflow_env(self.workdir / "airflow", self.config), self.workdir)
        if case == "scheduler":
            return scheduler_report(results["scheduler"])
        if case == "parse":
            from devtools.airflow_home import DAGS_FOLDER, airflow_env

            script = self.workdir / "parse_script.py"
            script.write_text(PARSE_SCRIPT)
            env = airflow_env(self.workdir / "parse-airflow", self.workdir / "parse-sources.yaml")
            command = [str(script), str(DAGS_FOLDER / "reclock_sources.py")]
            return ("the DAG file parsed whole\n\n" + command_report(command, env, self.workdir)
                    + "\n\nas a task process of reclock_s0500 parses it\n\n" + command_report(command, {
                        **env, "_AIRFLOW_PARSING_CONTEXT_DAG_ID": "reclock_s0500",
                        "_AIRFLOW_PARSING_CONTEXT_TASK_ID": "tick"}, self.workdir))
        raise ValueError(f"no profile for case {case!r}")

    # Airflow ----------------------------------------------------------------------------------

    def airflow(self) -> dict:
        """One DAG run of ``--dag-records`` under ``airflow dags test``, in a fresh Airflow home."""
        from devtools.airflow_home import AIRFLOW, airflow_env, migrate, run

        a = self.args
        section(f"airflow: one DAG run of {a.dag_records:,} records under `airflow dags test`")
        name = self.add_source("dag", a.partitions)
        fresh_validator()
        env = airflow_env(self.workdir / "airflow", self.config)
        migrate(self.workdir / "airflow", env)
        command = [AIRFLOW, "dags", "test", f"reclock_{name}"]
        _, empty_s = timed(run, command, env, 900)
        self.produce(name, a.dag_records)
        _, dag_s = timed(run, command, env, 900)
        self.dag_runs_done(name, empty_s, dag_s)
        validator = served_by_validator()
        tasks = run_tasks(self.workdir / "airflow" / "airflow.db", f"reclock_{name}")
        floor_env = {**airflow_env(self.workdir / "airflow", dags_folder=FLOOR_DAGS),
                     "RECLOCK_FLOOR_TASKS": ",".join(tasks)}
        floor_s = [timed(run, [AIRFLOW, "dags", "test", "reclock_floor"], floor_env, 900)[1] for _ in range(2)]
        if run_tasks(self.workdir / "airflow" / "airflow.db", "reclock_floor") != tasks:
            raise RuntimeError(f"reclock_floor did not run the tasks {tasks}")
        python_s = timed(subprocess.run, [sys.executable, "-c", "pass"], check=True)[1]
        gx_s = timed(subprocess.run, [sys.executable, "-c", "import great_expectations"], check=True)[1] - python_s
        print(f"  Airflow alone, the same {len(tasks)} tasks doing nothing (bench/airflow_floor): "
              + ", ".join(f"{s:.2f}s" for s in floor_s) + f"; reclock's part of the run: {dag_s - floor_s[-1]:.2f}s")
        print(f"  importing Great Expectations in a fresh process (the validator does, once: reclock.validator): {gx_s:.2f}s")
        return {"records": a.dag_records, "seconds": dag_s, "first_run_s": empty_s, "tasks": tasks,
                "floor_s": floor_s[-1], "floor_first_run_s": floor_s[0], "gx_import_s": gx_s, "validator": validator}


    def dag_runs_done(self, name: str, empty_s: float, dag_s: float) -> None:
        """Refuse DAG runs of ``name`` that did not publish exactly the ``--dag-records`` produced; print their times."""
        with runtime.open_source(name, str(self.config), connect=False) as ctx:
            published = ctx.tables.read_reclocked_spark(self.spark).count()
        if published != self.args.dag_records:
            raise RuntimeError(f"the DAG runs of {name} published {published} rows, produced {self.args.dag_records}")
        print(f"  first run (nothing to read; creates the tables): {empty_s:.2f}s")
        print(f"  run of {self.args.dag_records:,} records: {dag_s:.2f}s")

    def scheduler(self, tasks: list[str]) -> dict:
        """One DAG run of ``--dag-records`` under a real scheduler: ``airflow standalone`` (scheduler, dag-processor,
        triggerer and API server; the LocalExecutor runs each task in a process of its own) on the bench's Airflow
        home, its run triggered from the CLI and timed from the run's ``queued_at`` to its ``end_date`` (the
        metadata database's own times); after one run with nothing (which creates the tables).  Then
        ``reclock_floor``, ``tasks`` doing nothing, twice, the same way."""
        from devtools.airflow_home import AIRFLOW, DAGS_FOLDER, migrate, run, stop_group
        from devtools.kafka_broker import free_port
        from devtools.up import platform_env

        a = self.args
        section(f"scheduler: one DAG run of {a.dag_records:,} records under `airflow standalone`")
        name = self.add_source("sched", a.partitions)
        fresh_validator()
        home, dags = self.workdir / "scheduler-airflow", self.workdir / "scheduler-dags"
        dags.mkdir()
        (dags / "reclock_sources.py").symlink_to(DAGS_FOLDER / "reclock_sources.py")
        (dags / "reclock_floor.py").symlink_to(FLOOR_DAGS / "reclock_floor.py")
        port = free_port()
        env = {**platform_env(home, self.config, port), "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
               "RECLOCK_FLOOR_TASKS": ",".join(tasks), "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5"}
        db = migrate(home, env)
        log = open(self.workdir / "standalone.log", "w")
        airflow = subprocess.Popen([AIRFLOW, "standalone"], env=env, cwd=self.workdir, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            dag_id = f"reclock_{name}"
            wait_for(lambda: set(dag_ids(db)) >= {dag_id, "reclock_floor"}, 300, airflow, "its DAGs parsed")

            runs: list[tuple[str, str]] = []

            def triggered(dag: str) -> float:
                run_id = f"bench_{uuid.uuid4().hex[:8]}"
                run([AIRFLOW, "dags", "trigger", dag, "--run-id", run_id], env, 300)
                state = wait_for(lambda: finished(db, dag, run_id), 900, airflow, f"{dag} run {run_id}")
                if state[0] != "success":
                    raise RuntimeError(f"{dag} run {run_id} ended {state[0]} (see {self.workdir / 'standalone.log'})")
                runs.append((dag, run_id))
                return state[1]

            empty_s = triggered(dag_id)
            self.produce(name, a.dag_records)
            dag_s = triggered(dag_id)
            floor_s = [triggered("reclock_floor") for _ in range(2)]
        finally:
            stop_group(airflow)
            log.close()
        self.dag_runs_done(name, empty_s, dag_s)
        validator = served_by_validator()
        print(f"  Airflow alone, the same {len(tasks)} tasks doing nothing: " + ", ".join(f"{s:.2f}s" for s in floor_s)
              + f"; reclock's part of the run: {dag_s - floor_s[-1]:.2f}s")
        return {"records": a.dag_records, "seconds": dag_s, "first_run_s": empty_s, "floor_s": floor_s[-1],
                "floor_first_run_s": floor_s[0], "validator": validator,
                "task_times": {"run": task_times(db, *runs[1]), "floor": task_times(db, *runs[-1])}}


def fresh_validator() -> None:
    """No Great Expectations validator serving the bench (:mod:`reclock.validator`): a section's first DAG run
    starts one, and pays GX's import."""
    from reclock import validator

    validator.stop(os.environ["RECLOCK_VALIDATOR_DIR"])  # and waits for it to end


def served_by_validator() -> bool:
    """Whether a validator serves the bench (started by the section's first DAG run); printed."""
    from reclock import validator

    pids = validator.serving(os.environ["RECLOCK_VALIDATOR_DIR"])
    print("  the check tasks validated through the Great Expectations validator (pid "
          f"{pids[0]}, started by the first run)" if pids else "  no Great Expectations validator served: the check "
          "tasks imported GX")
    return bool(pids)


def task_times(db: Path, dag_id: str, run_id: str) -> list[dict]:
    """Each task instance of a DAG run, in the order they started: seconds from the run's ``queued_at`` to the
    task's queueing, its start and its end (the metadata database's own times)."""
    import sqlite3
    from datetime import datetime

    with contextlib.closing(sqlite3.connect(db)) as conn:
        (queued_at,) = conn.execute("SELECT queued_at FROM dag_run WHERE dag_id = ? AND run_id = ?",
                                    (dag_id, run_id)).fetchone()
        rows = conn.execute("SELECT task_id, queued_dttm, start_date, end_date FROM task_instance WHERE dag_id = ? "
                            "AND run_id = ? ORDER BY start_date", (dag_id, run_id)).fetchall()
    zero = datetime.fromisoformat(queued_at)
    at = lambda t: None if t is None else round((datetime.fromisoformat(t) - zero).total_seconds(), 3)  # noqa: E731
    return [{"task": task, "queued": at(queued), "start": at(start), "end": at(end)} for task, queued, start, end in rows]


def dag_ids(db: Path) -> list[str]:
    """The DAGs the Airflow home's database knows (parsed by its dag-processor)."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(db)) as conn:
        return [row[0] for row in conn.execute("SELECT dag_id FROM dag")]


def finished(db: Path, dag_id: str, run_id: str) -> tuple[str, float] | None:
    """A finished run's state and seconds from its ``queued_at`` to its ``end_date``; None while it runs."""
    import sqlite3
    from datetime import datetime

    with contextlib.closing(sqlite3.connect(db)) as conn:
        row = conn.execute("SELECT state, queued_at, end_date FROM dag_run WHERE dag_id = ? AND run_id = ?",
                           (dag_id, run_id)).fetchone()
    if row is None or row[0] not in ("success", "failed") or row[2] is None:
        return None
    return row[0], (datetime.fromisoformat(row[2]) - datetime.fromisoformat(row[1])).total_seconds()


def wait_for(condition, timeout: float, process: subprocess.Popen, what: str):
    """``condition()``'s first truthy value, polled every 0.2 s; RuntimeError when ``process`` exits or
    ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"airflow standalone: no {what} (exited: {process.poll()})")
        time.sleep(0.2)
    return value


def parse(workdir: Path, bootstrap: str) -> dict:
    """The DAG file over a sources file of ``PARSE_SOURCES`` Kafka sources (nothing contacted: parsing has no side
    effect), in fresh processes: parsed whole (as the DAG processor does: every source's DAG and backfill DAG),
    and as a task process of one source parses it (``get_parsing_context``: only its DAG), best of 3 each."""
    from devtools.airflow_home import DAGS_FOLDER, airflow_env

    section(f"parse: the DAG file with {PARSE_SOURCES:,} sources")
    config = workdir / "parse-sources.yaml"
    config.write_text(yaml.safe_dump({"warehouse": str(workdir / "parse-warehouse"), "sources": [
        {"name": f"s{i:04d}", "kind": "kafka", "schedule": "*/5 * * * *",
         "options": {"bootstrap_servers": bootstrap, "topic": f"t{i}", "group_id": f"g{i}"}}
        for i in range(PARSE_SOURCES)]}))
    env = airflow_env(workdir / "parse-airflow", config)
    dag_file = str(DAGS_FOLDER / "reclock_sources.py")

    def measure(extra: dict) -> dict:
        runs = []
        for _ in range(3):
            out = subprocess.run([sys.executable, "-c", PARSE_SCRIPT, dag_file], env={**env, **extra},
                                 capture_output=True, text=True, timeout=600, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        return min(runs, key=lambda r: r["parse_s"])

    whole = measure({})
    own = measure({"_AIRFLOW_PARSING_CONTEXT_DAG_ID": "reclock_s0500", "_AIRFLOW_PARSING_CONTEXT_TASK_ID": "tick"})
    if whole["dags"] != 2 * PARSE_SOURCES or own["dags"] != 1:
        raise RuntimeError(f"parsed {whole['dags']} DAGs whole and {own['dags']} as a task process")
    print(f"  whole: {whole['parse_s']:.2f}s for {whole['dags']:,} DAGs; a task process of reclock_s0500: "
          f"{own['parse_s']:.3f}s for {own['dags']} DAG (best of 3, Airflow imported before)")
    return {"sources": PARSE_SOURCES, "whole_s": whole["parse_s"], "own_dag_s": own["parse_s"],
            "dags": whole["dags"]}


def run_tasks(db: Path, dag_id: str) -> list[str]:
    """The task ids of ``dag_id``'s latest run, in the order they started (from the Airflow home's database)."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(db)) as conn:
        return [row[0] for row in conn.execute(
            "SELECT task_id FROM task_instance WHERE dag_id = ? AND run_id = (SELECT run_id FROM dag_run "
            "WHERE dag_id = ? ORDER BY start_date DESC LIMIT 1) ORDER BY start_date", (dag_id, dag_id))]


def summary(results: dict) -> dict:
    """Issue 38's targets against the figures; each None where its section was not run."""
    section("summary (issue 38's targets)")
    by = {r["records"]: r for r in results.get("sizes", [])}
    met: dict = {}
    for n, target in TARGETS["ratio"].items():
        if n in by:
            met[f"ratio_{n}"] = by[n]["ratio"] <= target
            print(f"  full run at {n:,} <= {target}x Spark's copy: {verdict(met[f'ratio_{n}'])} ({by[n]['ratio']:.2f}x)")
    if 10_000_000 in by:
        big = by[10_000_000]
        share = big["steps_s"]["check"] / big["copy_s"]
        met["check"] = share <= TARGETS["check_share"]
        print(f"  the check step at 10M <= {TARGETS['check_share']:.0%} of the copy: {verdict(met['check'])} "
              f"({big['steps_s']['check']:.2f}s, {share:.0%})")
        met["query"] = big["query_s"] <= TARGETS["query_s"]
        print(f"  reclock query counting 10M without Spark <= {TARGETS['query_s']:.0f}s: {verdict(met['query'])} "
              f"({big['query_s']:.2f}s)")
    compactions = {n: r["compact_s"] / r["rewrite_s"] for n, r in by.items() if "compact_s" in r}
    if compactions:
        met["compaction"] = all(x <= TARGETS["compaction"] for x in compactions.values())
        print(f"  a compaction folding a batch <= {TARGETS['compaction']}x Spark's rewrite: {verdict(met['compaction'])}"
              " (" + ", ".join(f"{n:,}: {x:.2f}x" for n, x in sorted(compactions.items())) + ")")
    if "empty" in results:
        met["empty"] = results["empty"]["median_s"] <= TARGETS["empty_s"]
        print(f"  a run with no new records <= {TARGETS['empty_s']}s: {verdict(met['empty'])} "
              f"({results['empty']['median_s']:.2f}s)")
    if "airflow" in results:
        dag = results["airflow"]
        met["dag"] = dag["seconds"] <= dag["floor_s"] + TARGETS["dag_over_floor_s"]
        print(f"  one DAG run of {dag['records']:,} under airflow dags test <= Airflow's floor + "
              f"{TARGETS['dag_over_floor_s']:.0f}s: {verdict(met['dag'])} ({dag['seconds']:.2f}s; Airflow alone, its "
              f"{len(dag['tasks'])} tasks doing nothing: {dag['floor_s']:.2f}s; importing Great Expectations: "
              f"{dag['gx_import_s']:.2f}s)")
    if "scheduler" in results:
        dag = results["scheduler"]
        met["dag_scheduler"] = dag["seconds"] <= dag["floor_s"] + TARGETS["dag_over_floor_s"]
        print(f"  one DAG run of {dag['records']:,} under the scheduler <= Airflow's floor + "
              f"{TARGETS['dag_over_floor_s']:.0f}s: {verdict(met['dag_scheduler'])} ({dag['seconds']:.2f}s; Airflow "
              f"alone: {dag['floor_s']:.2f}s)")
    if "parse" in results:
        parsed = results["parse"]
        met["parse"] = parsed["whole_s"] <= TARGETS["parse_s"]
        met["own_dag"] = parsed["own_dag_s"] <= TARGETS["own_dag_s"]
        print(f"  the DAG file of {parsed['sources']:,} sources parsed whole <= {TARGETS['parse_s']:.0f}s: "
              f"{verdict(met['parse'])} ({parsed['whole_s']:.2f}s); a task process's own DAG <= "
              f"{TARGETS['own_dag_s']}s: {verdict(met['own_dag'])} ({parsed['own_dag_s']:.3f}s)")
    if 1_000_000 in by and 10_000_000 in by:
        small, large = by[1_000_000]["peak_rss"]["driver"], by[10_000_000]["peak_rss"]["driver"]
        growth = large / small if small and large else None
        met["rss"] = None if growth is None else growth <= TARGETS["rss_growth"]
        copy_small, copy_large = (by[n].get("copy_peak_rss", {}).get("driver") for n in (1_000_000, 10_000_000))
        baseline = (f"; Spark's own copy after it: {mib(copy_small)} -> {mib(copy_large)} "
                    f"({copy_large / copy_small:.2f}x)") if copy_small and copy_large else ""
        print(f"  peak driver RSS at 10M within {TARGETS['rss_growth']}x of 1M: {verdict(met['rss'])} "
              f"({mib(small)} -> {mib(large)}{f', {growth:.2f}x' if growth else ''}{baseline})")
        small, large = by[1_000_000]["driver_heap_after_gc"], by[10_000_000]["driver_heap_after_gc"]
        if small and large:
            results["heap_after_gc_growth"] = large / small
            copy_small, copy_large = (by[n].get("copy_driver_heap_after_gc") for n in (1_000_000, 10_000_000))
            baseline = (f"; Spark's own copy: {mib(copy_small)} -> {mib(copy_large)}"
                        if copy_small and copy_large else "")
            print(f"    the driver's heap after GC, at its peak: {mib(small)} -> {mib(large)} ({large / small:.2f}x"
                  f"{baseline})")
    if len(by) >= 2:
        lo, hi = (1_000_000, 10_000_000) if {1_000_000, 10_000_000} <= set(by) else (min(by), max(by))
        per = (by[hi]["reclock_s"] / hi) / (by[lo]["reclock_s"] / lo)
        results["linearity"] = per
        print(f"  cost per record at {hi:,} / at {lo:,} (not a target): {per:.2f}; Spark's copy: "
              f"{(by[hi]['copy_s'] / hi) / (by[lo]['copy_s'] / lo):.2f}")
        marginal = {k: (by[hi][f"{k}_s"] - by[lo][f"{k}_s"]) / (hi - lo) * 1e6 for k in ("reclock", "copy")}
        results["marginal_us_per_record"] = marginal
        print(f"  marginal cost per record from {lo:,} to {hi:,}: reclock {marginal['reclock']:.2f} us, Spark's copy "
              f"{marginal['copy']:.2f} us ({marginal['reclock'] / marginal['copy']:.2f}x)")
    beyond = [n for n in by if n > 10_000_000]
    if 10_000_000 in by and beyond:  # past the fixed cost: is the cost per record flat?
        hi = max(beyond)
        per = (by[hi]["reclock_s"] / hi) / (by[10_000_000]["reclock_s"] / 10_000_000)
        copy = (by[hi]["copy_s"] / hi) / (by[10_000_000]["copy_s"] / 10_000_000)
        marginal = {k: (by[hi][f"{k}_s"] - by[10_000_000][f"{k}_s"]) / (hi - 10_000_000) * 1e6 for k in ("reclock", "copy")}
        results["beyond_10m"] = {"records": hi, "per_record_ratio": per, "copy_per_record_ratio": copy,
                                 "marginal_us_per_record": marginal}
        print(f"  from 10,000,000 to {hi:,}: cost per record {per:.2f} of 10M's (Spark's copy: {copy:.2f}); marginal "
              f"{marginal['reclock']:.2f} us against {marginal['copy']:.2f} us ({marginal['reclock'] / marginal['copy']:.2f}x)")
    retained = {n: r.get("driver_heap_retained") for n, r in sorted(by.items())}
    if any(retained.values()):
        print("  the driver's heap after a full GC once a run is over: "
              + ", ".join(f"{n:,}: {mib(v)}" for n, v in retained.items()))
    if "partitions" in results:
        met["wide"] = results["partitions"]["ratio"] <= TARGETS["wide"]
        print(f"  {results['args']['wide_partitions']} partitions <= {TARGETS['wide']}x {results['args']['partitions']}"
              f" for the same records: {verdict(met['wide'])} ({results['partitions']['ratio']:.2f}x a next tick; a first"
              f" tick that reads {results['partitions'].get('first_ratio', float('nan')):.2f}x; Spark's own copy: "
              f"{results['partitions']['copy_ratio']:.2f}x)")
    return met


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    counts = lambda s: [int(float(x)) for x in s.split(",") if x.strip()]  # noqa: E731
    parser.add_argument("--sizes", type=counts, default=[100_000, 1_000_000, 10_000_000],
                        help="records per full tick, comma-separated (default 100000,1000000,10000000)")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--wide-partitions", type=int, default=64)
    parser.add_argument("--partition-records", type=int, default=1_000_000,
                        help="records of the partitions comparison (default 1000000)")
    parser.add_argument("--partition-rounds", type=int, default=5,
                        help="next ticks of each partition count, the median timed (default 3)")
    parser.add_argument("--dag-records", type=int, default=100_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--spark-master", default="local[2]")
    parser.add_argument("--spark-remote", default=None, help="a Spark Connect URL (sc://host:port) to run on")
    parser.add_argument("--connect", action="store_true",
                        help="start a local Spark Connect server (devtools.spark_connect) and run everything on it")
    parser.add_argument("--skip", default="", help="comma-separated: sizes,empty,partitions,airflow,scheduler,parse")
    parser.add_argument("--results", type=Path, default=RESULTS, help=f"results JSON (default {RESULTS})")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (printed)")
    parser.add_argument("--no-compaction", dest="compaction", action="store_false",
                        help="do not time, per size, a compaction that folds the batch")
    parser.add_argument("--profiles", type=Path, default=None,
                        help="where the profiles of missed targets go (default: a folder profiles/ beside --results)")
    parser.add_argument("--no-profile", dest="profile", action="store_false",
                        help="do not profile the cases of missed targets")
    args = parser.parse_args(argv)
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.setLevel(logging.WARNING)  # GX sets its own loggers to INFO
    logging.getLogger("py4j").setLevel(logging.ERROR)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    workdir = Path(tempfile.mkdtemp(prefix="reclock-bench-"))
    os.environ["RECLOCK_VALIDATOR_DIR"] = str(workdir / "validator")  # the bench's own, stopped at its end
    started = time.perf_counter()
    results: dict = {"machine": machine(), "commit": commit(), "args": {k: (sorted(v) if isinstance(v, set) else str(v) if isinstance(
        v, Path) else v) for k, v in vars(args).items()}, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(f"reclock benchmark: sizes={','.join(f'{n:,}' for n in args.sizes)} partitions={args.partitions} "
          f"master={args.spark_remote or args.spark_master} cpus={os.cpu_count()} load average {load()}\n"
          f"work dir: {workdir}", flush=True)
    try:
        with LocalBroker() as broker, contextlib.ExitStack() as stack:
            from reclock.spark.session import get_spark

            server, gc_log = None, None
            if args.connect:
                from devtools.spark_connect import LocalSparkConnect

                gc_log = workdir / "connect-gc.log"
                server, results["connect_server_start_s"] = timed(lambda: stack.enter_context(LocalSparkConnect(
                    master=args.spark_master,
                    conf={"spark.driver.extraJavaOptions": f"-Xlog:gc:file={gc_log}:timemillis"})))
                args.spark_remote = server.url
            spark, results["spark_start_s"] = timed(get_spark, args.spark_master, "reclock-bench",
                                                    remote=args.spark_remote)
            try:
                bench = Bench(args, workdir, broker.bootstrap, spark, server.pid if server else driver_pid(spark),
                              gc_log)
                results["warmup_s"] = bench.warmup()
                print(f"Spark session start {results['spark_start_s']:.1f}s; warm-up run (not in the figures) "
                      f"{results['warmup_s']:.1f}s", flush=True)
                if "sizes" not in args.skip:
                    results["sizes"] = bench.sizes()
                if "empty" not in args.skip:
                    name = results["sizes"][0]["source"] if results.get("sizes") else bench.add_source("empty", 8)
                    results["empty"] = bench.empty(name)
                if "partitions" not in args.skip:
                    results["partitions"] = bench.partitions()
                if "airflow" not in args.skip:
                    results["airflow"] = bench.airflow()
                if "scheduler" not in args.skip:
                    results["scheduler"] = bench.scheduler(results.get("airflow", {}).get("tasks") or [
                        "tick", "reclock", "check", "publish", "resume", "compact"])
                if "parse" not in args.skip:
                    results["parse"] = parse(workdir, broker.bootstrap)
                results["targets_met"] = summary(results)
                if args.profile:
                    from bench.profiling import profile_missed

                    section("profiles of the targets missed (bench/profiling.py)")
                    results["profiles"] = profile_missed(bench, results, results["targets_met"],
                                                         args.profiles or args.results.parent / "profiles")
            finally:
                spark.stop()
    finally:
        from reclock import validator

        validator.stop(os.environ["RECLOCK_VALIDATOR_DIR"])
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    results["wall_s"] = time.perf_counter() - started
    results["machine"]["load_average_end"] = load()
    args.results.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nbenchmark wall time {results['wall_s']:.0f}s; load average now {load()} (wall times: other load "
          f"inflates them); results in {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
