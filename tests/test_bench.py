"""The bench's profiles of missed targets (bench/profiling.py): which case each target gets, and a profile of a real
JVM and of this process."""
from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from bench.profiling import Profile, missed_cases
from bench.reclock_bench import PeakRss, _settled_rss, produce
from conftest import shared_server


@pytest.mark.parametrize("met, largest, cases", [
    ({}, None, {}),
    ({"ratio_100000": True, "empty": None}, 10_000_000, {}),           # met, or not run: nothing to profile
    ({"ratio_10000000": False, "check": True}, 10_000_000, {"size-10000000": ["ratio_10000000"]}),
    ({"ratio_10000000": False, "rss": False, "check": False}, 10_000_000,  # one run of 10M profiles all three
     {"size-10000000": ["ratio_10000000", "rss", "check"]}),
    ({"rss": False}, 30_000_000, {"size-30000000": ["rss"]}),            # the largest size run
    ({"rss": False, "compaction": False}, None, {}),                      # no size run: no case of a size
    ({"wide": False, "dag": False, "dag_scheduler": False, "parse": False, "own_dag": False, "query": False},
     1_000_000, {"wide": ["wide"], "dags-test": ["dag"], "scheduler": ["dag_scheduler"],
                 "parse": ["parse", "own_dag"], "query": ["query"]}),
    ({"compaction": False, "empty": False, "linearity": False}, 1_000_000,  # not a target: never profiled
     {"compaction-1000000": ["compaction"], "empty": ["empty"]}),
])
def test_missed_cases(met, largest, cases):
    assert missed_cases(met, largest) == cases


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("jcmd") is None or shutil.which("jfr") is None, reason="needs the JDK's jcmd and jfr")
def test_a_profile_samples_the_driver_jvm_and_this_process(spark, tmp_path):
    pid = spark.sparkContext._gateway.proc.pid
    with Profile(pid, tmp_path) as profile:
        total = spark.range(0, 20_000_000, numPartitions=4).selectExpr("sum(id * 7 % 13)").collect()[0][0]
    assert total > 0 and profile.seconds > 0
    report = profile.report()
    assert "== Python (cProfile, this process) ==" in report and "collect" in report
    jvm = report.split(f"== the driver JVM (Java Flight Recorder, pid {pid}) ==", 1)[1]
    samples = int(jvm.split(" execution samples", 1)[0].split()[-1])
    assert samples > 0 and "Executor task launch worker" in jvm and "org.apache.spark" in jvm
    assert "heap: " in jvm


def _heap(pid: int) -> tuple[int, int]:
    """The committed and used bytes of JVM ``pid``'s G1 heap (``jcmd GC.heap_info``)."""
    info = subprocess.run(["jcmd", str(pid), "GC.heap_info"], capture_output=True, text=True, timeout=60).stdout
    committed, used = re.search(r"garbage-first heap\s+total (?:reserved \d+K, committed )?(\d+)K, used (\d+)K",
                                info).groups()
    return int(committed) << 10, int(used) << 10


@pytest.mark.skipif(shutil.which("jcmd") is None, reason="needs the JDK's jcmd")
def test_a_peak_rss_block_starts_from_a_heap_shrunk_to_what_is_live_and_restores_the_ratios(spark):
    """The driver grows its heap, then a block collecting it starts below that: the collection shrank the heap
    (MaxHeapFreeRatio lowered for it) and the OS has the regions back before the mark is reset; after it the
    JVM's ratios are its own again."""
    pid = spark.sparkContext._gateway.proc.pid
    ratios = lambda: sorted(tuple(line.split()[1:4:2]) for line in subprocess.run(  # noqa: E731
        ["jcmd", str(pid), "VM.flags", "-all"], capture_output=True, text=True).stdout.splitlines()
        if "HeapFreeRatio" in line)
    before = ratios()
    grown = spark.range(0, 3_000_000, numPartitions=2).selectExpr("id", "repeat('x', 64) AS s").collect()
    assert len(grown) == 3_000_000
    committed, _ = _heap(pid)
    del grown
    with PeakRss(("driver",), shrink=True, driver=pid) as block:
        pass
    after, (shrunk, live) = _settled_rss(pid), _heap(pid)
    assert committed - shrunk > 256 << 20 and shrunk < live / 0.9 + (64 << 20)  # shrunk to what is live
    # the mark was reset once the OS had the regions back: the block's peak is what the settled driver holds
    assert block.peak["driver"] < after + (64 << 20)
    assert ratios() == before and ("MaxHeapFreeRatio", "70") in before


def _batch_sizes(partition_dir: Path) -> list[int]:
    """The record count of each record batch in a partition's log segments (Kafka's batch format v2: base offset
    int64, then the length of the rest int32; the count is the int32 at byte 57)."""
    sizes = []
    for segment in sorted(partition_dir.glob("*.log")):
        data, at = segment.read_bytes(), 0
        while at + 61 <= len(data):
            (length,) = struct.unpack_from(">i", data, at + 8)
            sizes.append(struct.unpack_from(">i", data, at + 57)[0])
            at += 12 + length
    return sizes


def test_the_bench_writes_a_wide_topic_in_batches_of_many_records(spark, pytestconfig, kafka_topic):
    """Over 64 partitions the producer's buffer (Kafka's default, 32 MiB) held too few batches of 1 MiB, and the
    producer sent a batch per record: the partitions section then compared reads of 15,000 batches per partition
    with reads of 28."""
    broker = shared_server(pytestconfig, "kafka")
    topic = kafka_topic(partitions=64)
    produce(spark, broker["bootstrap"], topic, 0, 64_000, 64, 100)
    sizes = _batch_sizes(Path(broker["log_dir"]) / f"{topic}-0")
    assert sum(sizes) == 1_000 and len(sizes) <= 100, (len(sizes), sizes[:20])


def test_the_partitions_section_times_both_counts_after_the_same_reads(monkeypatch, tmp_path):
    """Spark's untimed reads leave their consumers idle in the server, and a server holding hundreds read slower:
    timed one count after the other, 64 partitions read after 8's reads and their own (1.62x of 8 in the bench of
    1ec6e80).  Each round produces and reads both topics first, then times both ticks back to back, in alternating
    order; each tick reads on from where the last one stopped, and the copies read the last tick's offsets."""
    import bench.reclock_bench as rb

    events, uppers = [], {}

    class Recorded(rb.Bench):
        def add_source(self, name, partitions, topic=None):
            self.sources[name] = (f"t-{name}", partitions)
            return name

        def produce(self, name, count):
            topic, partitions = self.sources[name]
            uppers[topic] = {p: uppers.get(topic, {}).get(p, 0) + count // partitions for p in range(partitions)}
            events.append(("produce", name))

        def run(self, name, shrink=False):
            events.append(("run", name))
            return {"seconds": {"p8": 1.0, "p64": 1.2}[name] + len(events) / 1000, "steps_s": {}}

        def collect(self):
            pass

    monkeypatch.setattr(rb, "topic_upper", lambda bootstrap, topic: dict(uppers[topic]))
    monkeypatch.setattr(rb, "read_through", lambda spark, b, topic, bounds: events.append(("read", topic, bounds)))
    monkeypatch.setattr(rb, "spark_copy", lambda spark, b, topic, bounds, out: events.append(("copy", topic, bounds))
                        or 1.0)
    monkeypatch.setattr(rb.pipeline, "run_once", lambda name, config, spark: events.append(("create", name)))
    monkeypatch.setattr(rb.pipeline, "STEPS", ())
    args = type("Args", (), {"partitions": 8, "wide_partitions": 64, "partition_records": 64, "partition_rounds": 3})
    out = Recorded(args, tmp_path, "b", None, None).partitions()

    kinds = [e[0] + (e[1] if e[0] != "read" else e[1][2:]) for e in events]
    assert kinds[:2] == ["createp8", "createp64"]
    ticks = [kinds[i:i + 6] for i in range(2, 26, 6)]
    assert ticks[0] == ticks[2] == ["producep8", "readp8", "producep64", "readp64", "runp8", "runp64"]
    assert ticks[1] == ticks[3] == ["producep64", "readp64", "producep8", "readp8", "runp64", "runp8"]
    assert kinds[26:] == ["copyt-p8", "copyt-p64"]
    reads = {t: [e[2] for e in events if e[0] == "read" and e[1] == t] for t in ("t-p8", "t-p64")}
    assert reads["t-p8"] == [{p: (8 * i, 8 * (i + 1)) for p in range(8)} for i in range(4)]
    assert [e[2] for e in events if e[0] == "copy"] == [reads["t-p8"][-1], reads["t-p64"][-1]]
    assert len(out["next_seconds"]["64"]) == 3 and out["seconds"]["64"] == sorted(out["next_seconds"]["64"])[1]
