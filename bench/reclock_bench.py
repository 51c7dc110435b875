"""reclock benchmark: throughput of tick -> stage -> check -> publish against plain copies of the same records.

Starts a local Apache Kafka broker (KRaft) and one local Spark session, writes a temporary sources file and
measures, each on its own topic with ``--partitions`` partitions:

1. ticks     ``--records`` records produced in ``--ticks`` batches; after each batch one
             tick + stage + check + publish (wall time per step; records/s with and without the
             one-off Spark JVM start-up and first-job warm-up);
2. replay    ``--records`` records produced in ``--bindings`` batches with a tick (no staging) after
             each, then one stage + check + publish covering every binding;
3. remap     rows and bytes of the remap Delta tables before and after ``pipeline.compact`` with a
             retention that compacts everything (bounded by partitions afterwards?);
4. baselines the ticks topic copied to Parquet (a) in one process with confluent-kafka + pyarrow,
             (b) by Spark's own Kafka source into a Delta table, over the same per-tick offsets
             (reclock's own overhead without Spark's); ratios reclock / baseline;
5. linearity for each of ``--sizes`` records (same ``--ticks``), reclock throughput and per-record cost.

No assertions: it prints figures and says honestly whether the targets (reclock <= 1.5x the plain copy,
linear in records, remap bounded by partitions after compaction) hold.  Defaults take ~2-3 minutes on
2 cores; e.g. ``--records 200000 --sizes 50000,100000,200000 --bindings 200`` for a larger run.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from reclock import pipeline
from devtools.kafka_broker import LocalBroker, create_topic

QUIET = logging.getLogger("reclock.bench.librdkafka")
T0 = 1_700_000_000_000  # synthetic IntoTimes (ms): every source ticks at T0 + i * 1000


# --- small helpers --------------------------------------------------------------------------


class Clock:
    """Accumulates wall time per named step."""

    def __init__(self) -> None:
        self.steps: dict[str, list[float]] = {}

    def run(self, step: str, fn, *args, **kwargs):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        self.steps.setdefault(step, []).append(time.perf_counter() - start)
        return out

    def total(self, *steps: str) -> float:
        return sum(sum(self.steps.get(s, [])) for s in (steps or self.steps))


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def rate(records: int, seconds: float) -> str:
    return f"{records / seconds:,.0f}" if seconds > 0 else "inf"


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


def table(headers: list[str], rows: list[list], indent: str = "  ") -> str:
    cells = [[str(c) for c in r] for r in [headers] + rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    fmt = lambda r: indent + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(cells[0]), indent + "  ".join("-" * w for w in widths)] + [fmt(r) for r in cells[1:]])


def section(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 76 - len(title)), flush=True)


# --- broker side ----------------------------------------------------------------------------


def produce_records(bootstrap: str, topic: str, start: int, count: int, partitions: int, value_bytes: int) -> None:
    """Records ``start .. start+count-1``, record i to partition ``i % partitions`` (so every batch moves all)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "logger": QUIET, "linger.ms": 5,
                         "enable.idempotence": False, "queue.buffering.max.messages": 200_000})
    errors: list[str] = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(str(err))

    pad = "x" * max(0, value_bytes - 12)
    for i in range(start, start + count):
        while True:
            try:
                producer.produce(topic, key=f"k{i % 1000}", value=f"v{i:010d}{pad}", partition=i % partitions,
                                 on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 2000 == 0:
            producer.poll(0)
    if producer.flush(60) or errors:
        raise RuntimeError(f"produce to {topic} failed: {errors[:3]}")


def plain_copy(bootstrap: str, topic: str, partitions: int, out: Path) -> int:
    """Baseline: every record of ``topic`` to one Parquet file, with confluent-kafka + pyarrow in this process.

    Same columns as reclock's data columns plus partition and offset (decoded to str like KafkaSource).
    """
    from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-plain-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "auto.offset.reset": "error",
                         "isolation.level": "read_committed", "enable.partition.eof": True, "logger": QUIET})
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    pending = {p for p, end in ends.items() if end > 0}
    consumer.assign([TopicPartition(topic, p, 0) for p in pending])
    schema = pa.schema([("key", pa.string()), ("value", pa.string()), ("timestamp_ms", pa.int64()),
                        ("partition", pa.int32()), ("offset", pa.int64())])
    cols: dict[str, list] = {n: [] for n in schema.names}
    written = 0
    writer = pq.ParquetWriter(out, schema)

    def flush() -> None:
        nonlocal written
        writer.write_table(pa.table(cols, schema=schema))
        written += len(cols["offset"])
        for v in cols.values():
            v.clear()

    deadline = time.monotonic() + 60
    while pending:
        if time.monotonic() > deadline:
            raise RuntimeError(f"plain copy stuck, partitions {pending} unfinished")
        for msg in consumer.consume(10_000, timeout=0.05):  # returns early only with 10000 messages
            err = msg.error()
            p = msg.partition()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    if msg.offset() >= ends[p]:
                        pending.discard(p)
                    continue
                raise RuntimeError(f"plain copy: {err}")
            offset = msg.offset()
            if offset >= ends[p]:
                pending.discard(p)
                continue
            key, value = msg.key(), msg.value()
            ts_type, ts = msg.timestamp()
            cols["key"].append(None if key is None else key.decode())
            cols["value"].append(None if value is None else value.decode())
            cols["timestamp_ms"].append(None if ts_type == TIMESTAMP_NOT_AVAILABLE else ts)
            cols["partition"].append(p)
            cols["offset"].append(offset)
            if offset + 1 >= ends[p]:
                pending.discard(p)
        if len(cols["offset"]) >= 65_536:
            flush()
    flush()
    writer.close()
    consumer.close()
    return written


def spark_copy(spark, spec: dict, ranges: list, out: Path) -> float:
    """Baseline: Spark's own Kafka source reads the offsets ``ranges`` cover (per partition ``[min start, max
    end)``, ``startingOffsets``/``endingOffsets``) and writes a Delta table (no remap, no IntoTime, no checks);
    seconds taken (the row count is checked afterwards, untimed)."""
    bounds: dict = {}
    for _, p, begin, end in ranges:
        low, high = bounds.get(p, (begin, end))
        bounds[p] = (min(low, begin), max(high, end))
    topic = spec["topic"]
    offsets_at = lambda i: json.dumps({topic: {str(p): b[i] for p, b in bounds.items()}})  # noqa: E731
    start = time.perf_counter()
    (spark.read.format("kafka").option("kafka.bootstrap.servers", spec["bootstrap_servers"])
     .option("kafka.isolation.level", spec.get("isolation_level", "read_committed")).option("subscribe", topic)
     .option("startingOffsets", offsets_at(0)).option("endingOffsets", offsets_at(1)).load()
     .selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value", "partition", "offset", "timestamp")
     .write.format("delta").mode("overwrite").save(out.as_uri()))
    seconds = time.perf_counter() - start
    expected = sum(end - begin for _, _, begin, end in ranges)
    if (rows := pq.ParquetDataset(out).read(columns=["offset"]).num_rows) != expected:
        raise RuntimeError(f"Spark copy wrote {rows} rows, expected {expected}")
    return seconds


# --- warehouse side -------------------------------------------------------------------------


def dir_bytes(path: Path) -> tuple[int, int]:
    """(bytes of data files, bytes of _delta_log) on disk under a Delta table directory."""
    data = log = 0
    for root, _, files in os.walk(path):
        size = sum((Path(root) / f).stat().st_size for f in files)
        if "_delta_log" in Path(root).relative_to(path).parts:
            log += size
        else:
            data += size
    return data, log


def remap_size(name: str, config: str) -> dict:
    with pipeline.open_source(name, config) as ctx:
        dt = ctx.tables.table("remap")
        snapshot = sum(os.path.getsize(u.removeprefix("file://")) for u in dt.file_uris())
        data, log = dir_bytes(Path(ctx.tables.table_uri("remap").removeprefix("file://")))
        return {"rows": dt.to_pyarrow_dataset().count_rows(), "files": len(dt.file_uris()),
                "snapshot_bytes": snapshot, "disk_data_bytes": data, "log_bytes": log,
                "version": dt.version(), "bindings": len(ctx.tables.read_remap().bindings)}


def remap_ranges(name: str, config: str) -> list:
    with pipeline.open_source(name, config) as ctx:
        return [tuple(r) for r in ctx.tables.read_remap().ranges(0)]


def spec_of(name: str, config: str) -> dict:
    with pipeline.open_source(name, config) as ctx:
        return ctx.spec


# --- the benchmark ---------------------------------------------------------------------------


class Bench:
    def __init__(self, args, workdir: Path, bootstrap: str, spark) -> None:
        self.args, self.workdir, self.bootstrap, self.spark = args, workdir, bootstrap, spark
        self.suffix = uuid.uuid4().hex[:6]
        self.topics: dict[str, str] = {}
        names = ["warmup", "ticks", "replay"] + [f"lin_{n}" for n in args.sizes]
        for name in names:
            self.topics[name] = f"bench-{name}-{self.suffix}".replace("_", "-")
            create_topic(bootstrap, self.topics[name], partitions=args.partitions)
        self.config = str(workdir / "sources.yaml")
        Path(self.config).write_text(yaml.safe_dump({
            "warehouse": str(workdir / "warehouse"),
            "spark": {"master": args.spark_master},
            "sources": [{"name": name, "kind": "kafka", "retention_ms": 1,
                         "options": {"bootstrap_servers": bootstrap, "topic": topic,
                                     "group_id": f"bench-{name}-{self.suffix}"}}
                        for name, topic in self.topics.items()],
        }))

    def produce(self, name: str, start: int, count: int) -> None:
        produce_records(self.bootstrap, self.topics[name], start, count, self.args.partitions, self.args.value_bytes)

    def cycle(self, clock: Clock, name: str, now: int) -> int:
        """tick + stage + check + publish; rows staged."""
        clock.run("tick", pipeline.tick, name, self.config, now=now)
        staged = clock.run("stage", pipeline.stage, name, self.config, self.spark)
        clock.run("check", pipeline.check, name, self.config)
        published = clock.run("publish", pipeline.publish, name, self.config)
        if not published["published"]:
            raise RuntimeError(f"{name}: nothing published at {now}: {published}")
        return staged["staged_rows"]

    def ticked_run(self, name: str, records: int, ticks: int, after_cycle=None) -> tuple[Clock, list[int]]:
        """Produce ``records`` in ``ticks`` batches, one full cycle after each (production not timed)."""
        clock, rows, done = Clock(), [], 0
        for i in range(ticks):
            count = records * (i + 1) // ticks - done
            self.produce(name, done, count)
            done += count
            rows.append(self.cycle(clock, name, T0 + i * 1000))
            if after_cycle is not None:
                after_cycle(i, T0 + i * 1000)
        if sum(rows) != records:
            raise RuntimeError(f"{name}: staged {sum(rows)} rows, produced {records}")
        return clock, rows

    # 0. warm-up ---------------------------------------------------------------------------

    def warmup(self) -> float:
        self.produce("warmup", 0, 200)
        _, seconds = timed(self.cycle, Clock(), "warmup", T0)
        return seconds

    # 1. ticks -----------------------------------------------------------------------------

    def ticks(self, startup: float) -> dict:
        a = self.args
        section(f"1. ticks: {a.records:,} records, {a.partitions} partitions, {a.ticks} ticks")
        spec, copies = spec_of("ticks", self.config), []

        def spark_baseline(i: int, now: int) -> None:
            """Section 4's Spark baseline, interleaved right after each cycle so both see the same machine load."""
            rs = [r for r in remap_ranges("ticks", self.config) if r[0] == now]
            copies.append((len(rs), spark_copy(self.spark, spec, rs, self.workdir / f"baseline-spark-{i}")))

        clock, rows = self.ticked_run("ticks", a.records, a.ticks, after_cycle=spark_baseline)
        steps = ["tick", "stage", "check", "publish"]
        lines = [[i + 1, f"{rows[i]:,}"] + [f"{clock.steps[s][i]:.2f}" for s in steps]
                 + [f"{sum(clock.steps[s][i] for s in steps):.2f}", f"{copies[i][1]:.2f}"] for i in range(a.ticks)]
        lines.append(["sum", f"{sum(rows):,}"] + [f"{clock.total(s):.2f}" for s in steps]
                     + [f"{clock.total():.2f}", f"{sum(c[1] for c in copies):.2f}"])
        print(table(["tick", "records", "tick s", "stage s", "check s", "publish s", "total s",
                     "(Spark copy s)"], lines))
        total = clock.total()
        print(f"  records/s excluding Spark start-up: {rate(a.records, total)}"
              f"   including JVM start + first-job warm-up ({startup:.1f}s): {rate(a.records, total + startup)}")
        print(f"  share of time: " + ", ".join(f"{s} {100 * clock.total(s) / total:.0f}%" for s in steps))
        return {"seconds": total, "records": a.records, "clock": clock,
                "spark_copy_s": sum(c[1] for c in copies), "spark_copy_ranges": sum(c[0] for c in copies)}

    # 2. replay ----------------------------------------------------------------------------

    def replay(self) -> dict:
        a = self.args
        section(f"2. replay: {a.records:,} records bound by {a.bindings} ticks, then one stage + check + publish")
        clock, done = Clock(), 0
        for i in range(a.bindings):
            count = a.records * (i + 1) // a.bindings - done
            self.produce("replay", done, count)
            done += count
            clock.run("tick", pipeline.tick, "replay", self.config, now=T0 + i * 1000)
        ticks = clock.steps["tick"]
        k = max(1, len(ticks) // 10)
        print(f"  {a.bindings} ticks (no staging): {sum(ticks):.2f}s, first {k} avg {statistics.mean(ticks[:k]) * 1e3:.0f} ms, "
              f"last {k} avg {statistics.mean(ticks[-k:]) * 1e3:.0f} ms per tick")
        staged = clock.run("stage", pipeline.stage, "replay", self.config, self.spark)
        clock.run("check", pipeline.check, "replay", self.config)
        clock.run("publish", pipeline.publish, "replay", self.config)
        if staged["staged_rows"] != a.records:
            raise RuntimeError(f"replay staged {staged['staged_rows']} rows, produced {a.records}")
        replay_s = clock.total("stage", "check", "publish")
        print(table(["step", "seconds", "records/s"], [
            [f"stage ({staged['ranges']} ranges)", f"{clock.total('stage'):.2f}",
             rate(a.records, clock.total("stage"))],
            ["check", f"{clock.total('check'):.2f}", ""],
            ["publish", f"{clock.total('publish'):.2f}", ""],
            ["stage + check + publish", f"{replay_s:.2f}", rate(a.records, replay_s)],
        ]))
        # Where does the stage time go: the same records as one range per partition.
        spec, ranges = spec_of("replay", self.config), remap_ranges("replay", self.config)
        partitions = len({r[1] for r in ranges})
        coalesced_s = spark_copy(self.spark, spec, ranges, self.workdir / "baseline-replay")  # one range each
        stage_s = clock.total("stage")
        extra_ms = 1e3 * (stage_s - coalesced_s) / max(1, len(ranges) - partitions)
        print(f"  the same records as {partitions} ranges (one per partition), Spark's Kafka source -> "
              f"Delta: {coalesced_s:.2f}s ({rate(a.records, coalesced_s)} rec/s)\n"
              f"  => about {extra_ms:.0f} ms per extra range: replay cost follows "
              f"{'bindings x partitions' if extra_ms > 20 else 'records, not bindings'}")
        return {"seconds": replay_s, "ranges": len(ranges), "coalesced_s": coalesced_s}

    # 3. remap size ------------------------------------------------------------------------

    def remap_sizes(self) -> dict:
        section("3. remap size before / after pipeline.compact (retention 1 ms: compacts everything)")
        rows, bounded = [], True
        for name in ("ticks", "replay"):
            before = remap_size(name, self.config)
            result, seconds = timed(pipeline.compact, name, self.config, now=T0 + 10**9)
            after = remap_size(name, self.config)
            bounded &= after["rows"] <= self.args.partitions
            for label, s in (("before", before), ("after", after)):
                rows.append([name if label == "before" else "", label, s["bindings"], s["rows"], s["files"],
                             human_bytes(s["snapshot_bytes"]), human_bytes(s["disk_data_bytes"]),
                             human_bytes(s["log_bytes"]), s["version"],
                             f"{seconds:.2f}" if label == "after" else ""])
        print(table(["source", "", "bindings", "rows", "files", "snapshot", "data on disk", "_delta_log",
                     "version", "compact s"], rows))
        print(f"  remap rows after compaction <= partitions ({self.args.partitions}): {'YES' if bounded else 'NO'}"
              f"  (the _delta_log keeps one JSON commit per tick; delta-rs only drops them after"
              f" delta.logRetentionDuration, 30 days by default)")
        return {"bounded": bounded}

    # 4. baselines -------------------------------------------------------------------------

    def baselines(self, reclock: dict) -> dict:
        a = self.args
        section("4. baselines over the same records as section 1 (Spark copy run interleaved with section 1)")
        n, plain_s = timed(plain_copy, self.bootstrap, self.topics["ticks"], a.partitions,
                           self.workdir / "baseline-plain.parquet")
        assert n == a.records, n
        spark_s = reclock["spark_copy_s"]
        rec_s = reclock["seconds"]
        stage_s = reclock["clock"].total("stage")
        print(table(["run", "seconds", "records/s", "reclock / this"], [
            ["reclock tick+stage+check+publish", f"{rec_s:.2f}", rate(a.records, rec_s), "1.00x"],
            ["  of which stage (Spark)", f"{stage_s:.2f}", rate(a.records, stage_s), ""],
            ["plain: confluent-kafka -> pyarrow Parquet, 1 process", f"{plain_s:.2f}", rate(a.records, plain_s),
             f"{rec_s / plain_s:.2f}x"],
            [f"Spark: Kafka source -> Delta, {a.ticks} jobs / {reclock['spark_copy_ranges']} ranges", f"{spark_s:.2f}",
             rate(a.records, spark_s), f"{rec_s / spark_s:.2f}x"],
        ]))
        print(f"  reclock's own overhead beyond the Spark copy: {rec_s - spark_s:.2f}s "
              f"(tick {reclock['clock'].total('tick'):.2f}s, check {reclock['clock'].total('check'):.2f}s, "
              f"publish {reclock['clock'].total('publish'):.2f}s, stage beyond the copy {stage_s - spark_s:.2f}s)")
        return {"plain_s": plain_s, "spark_s": spark_s, "ratio_plain": rec_s / plain_s, "ratio_spark": rec_s / spark_s}

    # 5. linearity -------------------------------------------------------------------------

    def linearity(self) -> dict:
        a = self.args
        section(f"5. linearity: reclock (tick+stage+check+publish, {a.ticks} ticks each) per size")
        points = []
        for size in a.sizes:
            clock, _ = self.ticked_run(f"lin_{size}", size, a.ticks)
            plain_s = timed(plain_copy, self.bootstrap, self.topics[f"lin_{size}"], a.partitions,
                            self.workdir / f"baseline-plain-{size}.parquet")[1]
            points.append((size, clock.total(), clock.total("stage"), plain_s))
        lines = [[f"{n:,}", f"{s:.2f}", rate(n, s), f"{s / n * 1e6:.1f}", f"{st:.2f}", f"{p:.2f}", f"{s / p:.2f}x"]
                 for n, s, st, p in points]
        print(table(["records", "seconds", "records/s", "us/record", "stage s", "plain copy s", "reclock/plain"],
                    lines))
        (n0, s0, *_), (n1, s1, *_) = points[0], points[-1]
        ratio = (s1 / n1) / (s0 / n0)
        # time = fixed + marginal * records, least squares
        xs = [p[0] for p in points]
        fixed, slope = fit(xs, [p[1] for p in points])
        plain_fixed, plain_slope = fit(xs, [p[3] for p in points])
        print(f"  per-record cost largest/smallest ({n1:,} vs {n0:,}): {ratio:.2f}"
              f"  (<= 1: no worse than linear; < 1: fixed per-tick costs dominate)")
        print(f"  least-squares fit  reclock: {fixed:.2f}s fixed + {slope * 1e6:.1f} us/record   "
              f"plain copy: {plain_fixed:.2f}s fixed + {plain_slope * 1e6:.1f} us/record")
        marginal = slope / plain_slope if slope > 0 and plain_slope > 0 else None
        if marginal is None:
            print("  marginal cost not measurable at these sizes (fixed costs and noise dominate): use larger --sizes")
        else:
            print(f"  marginal (large-N) cost ratio reclock/plain: {marginal:.2f}x")
        return {"ratio": ratio, "fixed": fixed, "slope": slope, "marginal_ratio": marginal}


def load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares ``y = fixed + slope * x``."""
    mx, my = statistics.mean(xs), statistics.mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - slope * mx, slope


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sizes = lambda s: [int(x) for x in s.split(",") if x.strip()]
    parser.add_argument("--records", type=int, default=20_000, help="records for sections 1, 2, 4 (default 20000)")
    parser.add_argument("--partitions", type=int, default=4, help="topic partitions (default 4)")
    parser.add_argument("--ticks", type=int, default=4, help="ticks per reclock run in sections 1 and 5 (default 4)")
    parser.add_argument("--bindings", type=int, default=50, help="bindings minted before the replay (default 50)")
    parser.add_argument("--sizes", type=sizes, default=[10_000, 20_000, 40_000],
                        help="comma-separated record counts for the linearity sweep (default 10000,20000,40000)")
    parser.add_argument("--value-bytes", type=int, default=100, help="bytes per record value (default 100)")
    parser.add_argument("--spark-master", default="local[2]")
    parser.add_argument("--skip", default="", help="comma-separated sections to skip: replay,remap,baselines,linearity")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (printed)")
    args = parser.parse_args(argv)
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if args.records < args.ticks or args.records < args.bindings or min(args.sizes, default=args.ticks) < args.ticks:
        parser.error("every record count must be at least --ticks and --bindings")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.setLevel(logging.WARNING)  # GX sets its own loggers to INFO
    logging.getLogger("py4j").setLevel(logging.ERROR)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # no console progress bars in the figures (the session is reclock's own, from get_spark)
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", "--conf spark.ui.showConsoleProgress=false pyspark-shell")
    workdir = Path(tempfile.mkdtemp(prefix="reclock-bench-"))
    started = time.perf_counter()
    print(f"reclock benchmark: records={args.records:,} partitions={args.partitions} ticks={args.ticks} "
          f"bindings={args.bindings} sizes={','.join(map(str, args.sizes))} value_bytes={args.value_bytes} "
          f"master={args.spark_master} cpus={os.cpu_count()} load average {load()}\nwork dir: {workdir}", flush=True)
    try:
        with LocalBroker() as broker:
            from reclock.spark_session import get_spark

            spark, jvm_s = timed(get_spark, args.spark_master, "reclock-bench")
            spark.sparkContext.setLogLevel("ERROR")
            try:
                bench = Bench(args, workdir, broker.bootstrap, spark)
                warm_s = bench.warmup()
                print(f"Spark session start {jvm_s:.1f}s; first cycle warm-up (Python workers, GX import) "
                      f"{warm_s:.1f}s (excluded below unless stated)")
                results = {"ticks": bench.ticks(jvm_s + warm_s)}
                if "replay" not in args.skip:
                    results["replay"] = bench.replay()
                if "remap" not in args.skip:
                    results["remap"] = bench.remap_sizes()
                if "baselines" not in args.skip:
                    results["baselines"] = bench.baselines(results["ticks"])
                if "linearity" not in args.skip and len(args.sizes) >= 2:
                    results["linearity"] = bench.linearity()
                summary(args, results, jvm_s, warm_s)
            finally:
                spark.stop()
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nbenchmark wall time {time.perf_counter() - started:.0f}s; load average now {load()} "
          f"(figures are wall times: other load on the machine inflates them)")
    return 0


def summary(args, results: dict, jvm_s: float, warm_s: float) -> None:
    section("summary")
    t = results["ticks"]
    print(f"  reclock (tick+stage+check+publish): {rate(t['records'], t['seconds'])} records/s "
          f"({rate(t['records'], t['seconds'] + jvm_s + warm_s)} with Spark start-up)")
    if "replay" in results:
        r = results["replay"]
        print(f"  replay of {args.bindings} bindings ({r['ranges']} ranges): "
              f"{rate(args.records, r['seconds'])} records/s for stage+check+publish")
    if "baselines" in results:
        b = results["baselines"]
        verdict = "MET" if b["ratio_plain"] <= 1.5 else "NOT MET"
        print(f"  target reclock <= 1.5x plain copy: {verdict} ({b['ratio_plain']:.2f}x the confluent-kafka+pyarrow "
              f"copy; {b['ratio_spark']:.2f}x Spark's own Kafka -> Delta copy)")
    if "linearity" in results:
        lin = results["linearity"]
        verdict = "YES" if lin["ratio"] <= 1.2 else "NO"
        m = lin["marginal_ratio"]
        marginal = ("marginal cost not measurable at these sizes" if m is None else
                    f"marginal cost {m:.2f}x the plain copy's ({'within' if m <= 1.5 else 'above'} 1.5x)")
        print(f"  linear in records (per-record cost largest/smallest <= 1.2): {verdict} ({lin['ratio']:.2f}); "
              f"{marginal}")
    if "remap" in results:
        print(f"  remap rows bounded by partitions after compaction: {'YES' if results['remap']['bounded'] else 'NO'}")


if __name__ == "__main__":
    raise SystemExit(main())
