"""The S3 paths against a local S3-compatible server (moto's, a subprocess on a free port).

The ``files`` source over ``s3://`` (s3fs), and the Delta warehouse on ``s3://``: delta-spark
writing through ``s3a://`` (hadoop-aws, the session's S3 jars), the light reader (deltalake) with
the storage options docker/sources.yaml uses for MinIO; publishing Parquet staged on S3,
compaction and vacuum, and a pipeline tick.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from reclock.engine import Frontier, Remap, Update, reclock  # noqa: E402
from reclock.sources.base import SourceError  # noqa: E402
from reclock.sources.files import COMMITTED_NAME, FileSource, fingerprint  # noqa: E402
from reclock.storage import SUCCESS, Warehouse  # noqa: E402

from devtools.moto_server import delta_options, fsspec_options, s3a_conf  # noqa: E402

BUCKET = "reclock-test"
DATA = pa.schema([("value", pa.string())])



@pytest.fixture(scope="session")
def s3_endpoint():
    """``http://127.0.0.1:<port>`` of a moto S3 server with bucket ``BUCKET``, for the whole session."""
    from devtools.moto_server import MotoServer

    with MotoServer(BUCKET) as server:
        yield server.endpoint


@pytest.fixture
def s3_spark(spark, s3_endpoint):
    """The shared Spark session, its s3a:// pointed at the moto server."""
    conf = spark._jsc.hadoopConfiguration()
    for key, value in s3a_conf(s3_endpoint).items():
        conf.set(key.removeprefix("spark.hadoop."), value)
    return spark


@pytest.fixture
def prefix() -> str:
    """A fresh key prefix per test (the bucket is shared by the session)."""
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def s3fs_(s3_endpoint):
    import s3fs

    return s3fs.S3FileSystem(**fsspec_options(s3_endpoint), skip_instance_cache=True)


# --- (a) the files source over s3:// ------------------------------------------------------------


def lines(source: FileSource, ident: str, start: int, end: int) -> list[tuple[str, int]]:
    return [(r["line"], offset) for r, offset, _ in source.read(ident, start, end)]


A, B = fingerprint(b"one\n"), fingerprint(b"x\n")  # the partitions of files starting "one\n" and "x\n"


def test_files_source_over_s3(s3_endpoint, s3fs_, prefix):
    root = f"{BUCKET}/{prefix}/logs"
    s3fs_.pipe_file(f"{root}/a.log", b"one\ntwo\nthr")  # partial last line
    source = FileSource(f"s3://{root}", pattern="*.log", storage_options=fsspec_options(s3_endpoint))

    assert source.upper() == Frontier.of({A: 8})  # the partial line does not count
    assert source.names() == {A: "a.log"}
    assert lines(source, A, 0, 8) == [("one", 0), ("two", 4)]
    assert lines(source, A, 4, 8) == [("two", 4)]  # exact ranged read from the middle
    assert lines(source, A, 4, 5) == [("two", 4)]  # lines *starting* in the range
    with pytest.raises(SourceError, match="not the start of a line"):
        list(source.read(A, 5, 8))

    # Objects are replaced whole on S3: "appending" is a new PUT of the longer content.
    s3fs_.pipe_file(f"{root}/a.log", b"one\ntwo\nthree\n")
    s3fs_.pipe_file(f"{root}/b.log", b"x\n")  # a new key appears later
    s3fs_.pipe_file(f"{root}/ignored.txt", b"not matched\n")
    assert source.upper() == Frontier.of({A: 14, B: 2})
    assert lines(source, A, 8, 14) == [("three", 8)]
    assert lines(source, B, 0, 2) == [("x", 0)]

    assert source.committed() == Frontier()
    source.commit(Frontier.of({A: 8}))
    assert s3fs_.exists(f"{root}/{COMMITTED_NAME}") and not s3fs_.exists(f"{root}/{COMMITTED_NAME}.tmp")
    assert f'"{A}": 8'.encode() in s3fs_.cat_file(f"{root}/{COMMITTED_NAME}")
    source.commit(Frontier.of({B: 2}))  # joined with the last commit
    fresh = FileSource(f"s3://{root}", pattern="*.log", storage_options=fsspec_options(s3_endpoint))
    assert fresh.committed() == Frontier.of({A: 8, B: 2})
    assert fresh.upper() == Frontier.of({A: 14, B: 2})  # the commit file is not a key

    s3fs_.pipe_file(f"{root}/a.log", b"one\ntwo\n")  # shrank
    with pytest.raises(SourceError, match=rf"file {A} \(key 'a.log'\) shrank from 14 to 8"):
        source.upper()

    # overwritten with other first bytes: a new identity; the old one had lines not yet committed
    s3fs_.pipe_file(f"{root}/a.log", b"uno\ndos\n")
    with pytest.raises(SourceError, match=rf"file {A} \(key 'a.log'\) disappeared with lines \[8, 14\) not yet"):
        source.upper()
    with pytest.raises(SourceError, match=rf"file {A} does not exist"):  # and a stage could not read them
        list(fresh.read(A, 8, 14))
    s3fs_.pipe_file(f"{root}/a.log", b"one\ntwo\nthree\n")
    source.commit(source.upper())
    # committed, then overwritten: refused (an object store has no rename: lines the two share would be
    # published twice), by this process and by a fresh one (the commit file's names), until it moves to a new key
    s3fs_.pipe_file(f"{root}/a.log", b"uno\ndos\n")
    uno = fingerprint(b"uno\n")
    for src in (source, FileSource(f"s3://{root}", pattern="*.log", storage_options=fsspec_options(s3_endpoint))):
        with pytest.raises(SourceError, match=rf"file {A} \(key 'a.log'\) was overwritten: .* \(file {uno}\)"):
            src.upper()
    s3fs_.mv(f"{root}/a.log", f"{root}/a.2.log")
    assert source.upper() == Frontier.of({A: 14, B: 2, uno: 8}) and source.names() == {B: "b.log", uno: "a.2.log"}
    assert lines(fresh, uno, 0, 8) == [("uno", 0), ("dos", 4)]


def test_files_source_delete_committed_over_s3(s3_endpoint, s3fs_, prefix):
    root = f"{BUCKET}/{prefix}/logs"
    s3fs_.pipe_file(f"{root}/a.log", b"a\n")
    s3fs_.pipe_file(f"{root}/b.log", b"b\nbb\n")
    a, b = fingerprint(b"a\n"), fingerprint(b"b\n")
    source = FileSource(f"s3://{root}", storage_options=fsspec_options(s3_endpoint), delete_committed=True)
    source.commit(Frontier.of({a: 2, b: 2}))
    assert not s3fs_.exists(f"{root}/a.log") and s3fs_.exists(f"{root}/b.log")
    assert source.released() == Frontier.of({a: 2, b: 2})
    assert source.upper() == Frontier.of({a: 2, b: 5})
    with pytest.raises(SourceError, match="already released"):
        list(source.read(a, 0, 2))


# --- (b) the warehouse on s3:// --------------------------------------------------------------------


def s3_rounds(in_ci: int) -> int:
    """Rounds of an S3 race: ``in_ci`` in ``make test``, ``RECLOCK_S3_ROUNDS`` (100 in ``make soak --part s3``)."""
    return int(os.environ.get("RECLOCK_S3_ROUNDS", in_ci))


def ticks(remap: Remap, *bindings: tuple[int, dict]) -> list[Remap]:
    out = [remap]
    for into_time, uppers in bindings:
        out.append(out[-1].mint(into_time, Frontier.of(uppers)))
    return out


def as_rows(reclocked) -> list[dict]:
    return [{"value": d, "partition": p, "offset": o, "into_time": t, "diff": diff} for d, p, o, t, diff in reclocked]


def stage_on_s3(tables, s3fs_, upto: int, rows: list[dict]) -> str:
    """Stage like a completed Spark job would (Parquet + _SUCCESS), written with pyarrow to S3."""
    directory = tables.staging_dir(upto)  # s3a://bucket/...: the spelling Spark writes to
    assert directory.startswith("s3a://")
    path = directory[len("s3a://"):]
    with s3fs_.open(f"{path}/part-00000.parquet", "wb") as f:
        pq.write_table(pa.Table.from_pylist(rows, schema=tables.schemas["reclocked"]), f)
    s3fs_.pipe_file(f"{path}/{SUCCESS}", b"")
    return path


def test_warehouse_on_s3(s3_endpoint, s3fs_, prefix, s3_spark):
    root = f"s3://{BUCKET}/{prefix}/warehouse"
    tables = Warehouse(root, delta_options(s3_endpoint)).source("orders", pa.int32(), DATA, spark=s3_spark)
    assert s3fs_.exists(f"{BUCKET}/{prefix}/warehouse/orders/remap/_delta_log/00000000000000000000.json")
    # a second open finds the tables and checks their schema
    tables = Warehouse(root + "/", delta_options(s3_endpoint)).source("orders", pa.int32(), DATA, spark=s3_spark)

    remaps = ticks(Remap(), (10, {0: 2}), (20, {0: 3, 1: 1}), (30, {0: 5, 1: 2}))
    for before, after in zip(remaps, remaps[1:]):
        assert tables.append_binding(before, after)
    assert not tables.append_binding(remaps[1], remaps[2])  # idempotent retick
    stored = tables.read_remap()
    assert stored.upper == remaps[-1].upper and stored.frontier == remaps[-1].frontier
    assert stored.at(20) == remaps[-1].at(20) and tables.remap_upper() == 31

    updates = [Update("a", 0, 0), Update("b", 0, 1), Update("b", 0, 2, -1), Update("c", 1, 0),
               Update("d", 0, 3), Update("e", 0, 4), Update("f", 1, 1)]
    expected = as_rows(reclock(updates, remaps[-1]))
    published: list[dict] = []
    for lower, upto in ((0, 20), (21, 30)):
        batch = [r for r in expected if lower <= r["into_time"] <= upto]
        stage_on_s3(tables, s3fs_, upto, batch)
        assert len(tables.read_staged(upto)) == len(batch)
        assert tables.publish_staged(upto)
        assert not tables.publish_staged(upto)  # idempotent
        published += batch
        got = tables.read_reclocked_arrow().to_pylist()
        assert sorted(got, key=str) == sorted(published, key=str)
    assert tables.reclocked_upper() == 31
    assert all(f.startswith("s3a://") for f in tables.snapshot_files("reclocked"))

    before = tables.read_reclocked_arrow()
    tables.compact(20, retention_hours=0)  # vacuum at once: the replaced files go
    assert tables.since() == 20 and tables.read_remap().since == 20
    after = tables.read_reclocked_arrow()
    assert pc_min(after["into_time"]) == 20
    assert _sums(after) == _sums(before)  # consolidation keeps every (record, offset)'s total diff
    tables.compact(20, retention_hours=0)  # idempotent rerun (and vacuum with nothing left to delete)
    # vacuum removed the files the compaction replaced: only the snapshot's files remain
    live = {u.rsplit("/", 1)[-1] for u in tables.table("reclocked").file_uris()}
    on_s3 = {p.rsplit("/", 1)[-1] for p in s3fs_.find(f"{BUCKET}/{prefix}/warehouse/orders/reclocked")
             if p.endswith(".parquet")}
    assert on_s3 == live


def pc_min(column) -> int:
    import pyarrow.compute as pc

    return pc.min(column).as_py()


def _sums(table: pa.Table) -> dict:
    out: dict = {}
    for r in table.to_pylist():
        k = (r["value"], r["partition"], r["offset"])
        out[k] = out.get(k, 0) + r["diff"]
    return {k: v for k, v in out.items() if v}


# --- (c) a pipeline tick with both on s3:// ---------------------------------------------------------


def test_pipeline_on_s3(s3_endpoint, s3fs_, prefix, tmp_path, s3_spark, monkeypatch):
    """Ticks, then a batch staged by Spark on s3a://, checked from its Arrow summary read over S3 (nothing read in
    Spark), published by delta-rs."""
    import yaml

    from reclock import pipeline, runtime
    from reclock.storage.staging import StagingTables

    logs = f"{BUCKET}/{prefix}/logs"
    s3fs_.pipe_file(f"{logs}/a.log", b"one\ntwo\npart")
    config = {
        "warehouse": f"s3://{BUCKET}/{prefix}/warehouse",
        "storage_options": delta_options(s3_endpoint),
        "sources": [{"name": "logs", "kind": "files",
                     "options": {"url": f"s3://{logs}", "pattern": "*.log",
                                 "storage_options": fsspec_options(s3_endpoint)}}],
    }
    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump(config))

    out = pipeline.tick("logs", str(path), now=100)
    assert out["frontier"] == {A: 8} and out["new_offsets"] == 8 and out["written"]
    s3fs_.pipe_file(f"{logs}/a.log", b"one\ntwo\npartial\n")
    out = pipeline.tick("logs", str(path), now=200)
    assert out["frontier"] == {A: 16} and out["new_offsets"] == 8
    with runtime.open_source("logs", str(path), connect=False) as ctx:
        remap = ctx.tables.read_remap()
    assert remap.upper == 201 and remap.at(150) == Frontier.of({A: 8})
    assert pipeline.resume("logs", str(path))["offsets"] == {}  # nothing published yet
    assert pipeline.stage("logs", str(path), s3_spark)["staged_rows"] == 3
    with monkeypatch.context() as patch:
        patch.setattr(StagingTables, "read_staged_spark", lambda *a, **k: pytest.fail("the batch read in Spark"))
        checked = pipeline.check("logs", str(path), s3_spark)
    assert checked["reclocked"].startswith("reclocked batch: 6/6 checks passed on 3 rows"), checked
    assert pipeline.publish("logs", str(path), s3_spark) == {"published": True, "reclocked_upper": 201}
    with runtime.open_source("logs", str(path), connect=False) as ctx:
        rows = sorted((r["line"], r["into_time"]) for r in ctx.tables.read_reclocked_arrow().to_pylist())
    assert rows == [("one", 100), ("partial", 200), ("two", 100)]


CREATE_ON_S3 = """
import json, sys, time
import pyarrow as pa
from reclock.storage import Warehouse
root, options, start = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])
while time.time() < start:  # start together
    pass
Warehouse(root, options).source("s", pa.int32(), pa.schema([("value", pa.string())]), create=True)
"""


def test_racing_first_steps_create_each_table_once_on_s3(s3_endpoint, s3fs_, prefix):
    """First steps of a source in four processes at once on an ``s3://`` warehouse, rounds of them, no lock of any
    kind: each table is created by exactly one commit (version 0 claimed with a conditional put, never a second
    creation at version 1), and every process goes on with it."""
    import json

    from reclock.storage import KINDS

    for round_ in range(s3_rounds(3)):
        root = f"s3://{BUCKET}/{prefix}/w{round_}"
        start = time.time() + 4
        procs = [subprocess.Popen([sys.executable, "-c", CREATE_ON_S3, root, json.dumps(delta_options(s3_endpoint)),
                                   str(start)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(4)]
        outputs = [(p.wait(timeout=120), p.stdout.read().decode()) for p in procs]
        assert all(code == 0 for code, _ in outputs), outputs
        for kind in KINDS:
            commits = [os.path.basename(k) for k in s3fs_.ls(f"{BUCKET}/{prefix}/w{round_}/s/{kind}/_delta_log")
                       if k.endswith(".json")]
            assert commits == ["00000000000000000000.json"], (kind, commits)
        assert Warehouse(root, delta_options(s3_endpoint)).source("s", pa.int32(), DATA).read_remap() == Remap()


RACE_TICKS_ON_S3 = """
import json, sys, time
import pyarrow as pa
from reclock.storage import ConcurrentWriteError, Warehouse
root, options, start, me, ticks = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
tables = Warehouse(root, options).source("s", pa.int32(), pa.schema([("value", pa.string())]))
while time.time() < start:  # start together
    pass
lost = 0
for _ in range(ticks):  # a tick binds one more offset of partition `me`; one that loses the race reads and tries again
    while True:
        before = tables.read_remap()
        try:  # False: another tick stored a binding at this IntoTime (before.upper) since this one read remap
            if tables.append_binding(before, before.mint(before.upper, before.frontier.advanced_by({me: 1}))):
                break
        except ConcurrentWriteError:
            pass
        lost += 1
print(json.dumps({"lost": lost}))
"""


def test_racing_ticks_on_s3_lose_no_commit(s3_endpoint, s3fs_, prefix):
    """Four processes tick one source's remap at once on an ``s3://`` warehouse, five ticks each, each tick
    retried until it commits: every version is claimed with a conditional put, so no commit overwrites another's
    log entry. Remap ends with every tick (versions 1-20, each carrying ``reclock.remap``, strictly increasing
    IntoTimes) and every offset bound once."""
    import json

    options = delta_options(s3_endpoint)
    for round_ in range(s3_rounds(1)):
        root = f"s3://{BUCKET}/{prefix}/ticks{round_}"
        tables = Warehouse(root, options).source("s", pa.int32(), DATA, create=True)
        start = time.time() + 4
        procs = [subprocess.Popen([sys.executable, "-c", RACE_TICKS_ON_S3, root, json.dumps(options), str(start),
                                   str(me), "5"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for me in range(4)]
        outputs = [(p.wait(timeout=300), p.stdout.read().decode()) for p in procs]
        assert all(code == 0 for code, _ in outputs), (round_, outputs)
        remap = tables.read_remap()
        assert remap.frontier == Frontier.of({me: 5 for me in range(4)}), round_  # every tick's offset, none twice
        assert len(remap.increments()) == 20 and len({i.into_time for i in remap.increments()}) == 20, round_
        log = sorted(os.path.basename(k) for k in s3fs_.ls(f"{BUCKET}/{prefix}/ticks{round_}/s/remap/_delta_log")
                     if k.endswith(".json"))
        assert log == [f"{v:020d}.json" for v in range(21)], round_
        assert tables.remap_upper() - 1 == max(i.into_time for i in remap.increments()), round_


def test_publishes_racing_compactions_on_s3(s3_endpoint, s3fs_, prefix, s3_spark):
    """A publish and a compaction of one source at once on an ``s3://`` warehouse, round after round (3 here, 100
    in ``make soak --part s3``): round ``k`` publishes the batch bound at IntoTime ``10k`` while compaction
    rewrites the rows up to ``10(k - 1)``.  Both claim their log versions with conditional puts, so neither
    overwrites the other's entry; a compaction the publish made Delta refuse (:class:`ConcurrentWriteError`) is run
    again.  After every round: each record's total as published, ``since`` where it was asked, no row below it,
    the published upper past the batch, and the log's versions without a gap."""
    import threading

    from reclock.storage import ConcurrentWriteError

    tables = Warehouse(f"s3://{BUCKET}/{prefix}/race", delta_options(s3_endpoint)).source(
        "s", pa.int32(), DATA, spark=s3_spark)
    remap, expected, refused = Remap(), {}, 0
    for k in range(1, s3_rounds(3) + 2):
        t = 10 * k
        after = remap.mint(t, remap.frontier.advanced_by({0: 2}))
        assert tables.append_binding(remap, after)
        remap = after
        batch = [{"value": f"r{k}{x}", "partition": 0, "offset": 2 * k - 2 + i, "into_time": t, "diff": 1}
                 for i, x in enumerate("ab")]
        stage_on_s3(tables, s3fs_, t, batch)
        expected.update({(r["value"], 0, r["offset"]): 1 for r in batch})
        if k == 1:
            assert tables.publish_staged(t)
            continue
        start, errors = threading.Barrier(2), []

        def publish():
            start.wait()
            assert tables.publish_staged(t)

        def compact():
            start.wait()
            try:
                tables.compact(t - 10)
            except ConcurrentWriteError as e:
                errors.append(e)

        threads = [threading.Thread(target=publish), threading.Thread(target=compact)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        if errors:  # refused, nothing rewritten: the next compaction does it
            refused += 1
            tables.compact(t - 10)
        rows = tables.read_reclocked_arrow()
        assert _sums(rows) == expected, k
        assert tables.since() == t - 10 and pc_min(rows["into_time"]) == t - 10, k
        assert tables.reclocked_upper() == t + 1, k
        for kind in ("remap", "reclocked"):
            log = sorted(int(os.path.basename(p)[:20]) for p in s3fs_.ls(f"{BUCKET}/{prefix}/race/s/{kind}/_delta_log")
                         if p.endswith(".json"))
            assert log == list(range(len(log))), (k, kind, log)
    print(f"\n{k - 1} rounds of a publish racing a compaction on s3://: {refused} compactions refused and run again")
