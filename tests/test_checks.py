"""Great Expectations checks: good data passes, and each deliberately broken case fails its own check, through the
checks' GX checkpoints; the batch checks aggregate in Spark and accept exactly what the per-record law accepts."""
from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reclock import offsets
from reclock.checks import (ChecksFailed, _by_binding, _duplicate_frame, _small_frame, check_dead_letters,
                            check_primary_keys, check_reclocked, check_remap)
from reclock.engine import Frontier, Remap, Update, reclock

REMAP = (Remap()
         .mint(10, Frontier.of({0: 3, 1: 2}))
         .mint(20, Frontier.of({0: 5, 1: 2}))
         .mint(30, Frontier.of({0: 5, 1: 4})))
UPDATES = [Update(f"r{p}-{o}", p, o, 1) for p, n in ((0, 5), (1, 4)) for o in range(n)]


def remap_frame(remap: Remap = REMAP, extra: list[tuple] = ()) -> pd.DataFrame:
    return pd.DataFrame(list(remap.increments()) + list(extra), columns=["partition", "into_time", "increment"])


def test_good_remap_passes():
    report = check_remap(remap_frame())
    assert report.success, report.summary()
    assert report.rows == 4 and len(report.results) == 6
    report.raise_for_failure()


def test_good_remap_with_repeated_rows_and_compaction_passes():
    # Rows at one time may repeat a partition (they sum); a compacted remap has a binding at since.
    split = remap_frame(extra=[(0, 20, 1), (0, 20, -1)])
    assert check_remap(split).success
    compacted = REMAP.compact(20)
    assert check_remap(remap_frame(compacted), since=compacted.since).success
    # A compaction killed after recording since and before folding remap: read as folded, so it passes.
    assert check_remap(remap_frame(), since=15).success
    assert check_remap(remap_frame(), since=30).success
    assert check_remap(remap_frame(extra=[(1, 20, -1)]), since=15).failed == ["remap.monotone"]


@pytest.mark.parametrize("frame, since, failing", [
    (remap_frame(extra=[(None, 20, 1)]), 0, "remap.partition_not_null"),
    (remap_frame(extra=[(0, None, 1)]), 0, "remap.into_time_not_null"),
    (remap_frame(extra=[(1, 20, -1)]), 0, "remap.monotone"),
    (remap_frame(extra=[(0, -5, 1), (0, 10, -1)]), 0, "remap.times_increasing"),  # before the epoch
    (remap_frame(extra=[(1, 40, 0)]), 0, "remap.bindings_move"),
], ids=["null-partition", "null-into_time", "not-monotone", "negative-time", "empty-binding"])
def test_broken_remap_fails_its_check(frame, since, failing):
    report = check_remap(frame, since=since)
    assert report.failed == [failing], report.summary()
    with pytest.raises(ChecksFailed, match=f"FAIL {failing}"):
        report.raise_for_failure()


UPSTREAMS = {10: Frontier.of({0: 3, 1: 2}), 20: Frontier.of({0: 5, 1: 2}), 30: Frontier.of({0: 5, 1: 4})}


@pytest.mark.parametrize("frame, upstreams, success", [
    (remap_frame(), UPSTREAMS, True),
    (remap_frame(), {}, True),  # nothing recorded (ticks from before reclock recorded it): nothing to compare
    (remap_frame(), {20: Frontier.of({0: 9, 1: 9})}, True),  # the upstream may be ahead of what was bound
    (remap_frame(extra=[(0, 20, 2)]), UPSTREAMS, False),  # increment counted twice (racing ticks)
    (remap_frame(extra=[(1, 40, 2)]), {**UPSTREAMS, 40: Frontier.of({0: 5, 1: 4})}, False),  # twice, later tick
    (remap_frame(), {**UPSTREAMS, 30: Frontier.of({0: 5, 1: 3})}, False),  # bound beyond the upstream's upper
    (remap_frame(), {**UPSTREAMS, 10: Frontier.of({0: 3})}, False),  # a partition the upstream did not have
], ids=["recorded", "none-recorded", "upstream-ahead", "double-increment", "double-later", "beyond-upstream",
        "unknown-partition"])
def test_remap_within_recorded_upstream(frame, upstreams, success):
    report = check_remap(frame, upstreams=upstreams)
    assert report.failed == ([] if success else ["remap.within_upstream"]), report.summary()


BATCH_SCHEMA = "data string, partition int, offset long, into_time long, diff long"


def spark_batch(spark, rows=None, extra: list[tuple] = (), schema: str = BATCH_SCHEMA):
    """The staged batch as Spark sees it: the good one (every update reclocked), or ``rows``, plus ``extra``."""
    rows = list(reclock(UPDATES, REMAP)) if rows is None else list(rows)
    return spark.createDataFrame([tuple(r) for r in rows] + list(extra), schema)


@pytest.mark.slow
def test_good_batch_passes(spark):
    report = check_reclocked(spark_batch(spark), REMAP, start=10)
    assert report.success, report.summary()
    assert report.rows == len(UPDATES)
    assert report.as_dict() == {"subject": "reclocked batch", "rows": 9, "success": True, "failed": []}
    assert [r.name for r in report.results] == [
        "reclocked.stamped", "reclocked.first_covering_binding", "reclocked.within_frontier",
        "reclocked.diff_non_zero", "reclocked.in_window", "reclocked.offsets_unique"]


def _changed(offset_in_p0: int, **fields) -> list:
    """The good batch with the record at ``(0, offset_in_p0)`` changed."""
    return [r._replace(**fields) if (r.partition, r.offset) == (0, offset_in_p0) else r
            for r in reclock(UPDATES, REMAP)]


@pytest.mark.slow
@pytest.mark.parametrize("rows, extra, start, failing, named", [
    (_changed(0, into_time=20), [], None, "reclocked.first_covering_binding", (0, 0, 20)),   # a later binding
    (_changed(4, into_time=10), [], None, "reclocked.first_covering_binding", (0, 4, 10)),   # an earlier one
    (None, [("late", 1, 4, 30, 1)], None, "reclocked.within_frontier", (1, 4, 30)),
    (None, [("lost", 7, 0, 30, 1)], None, "reclocked.within_frontier", (7, 0, 30)),         # unknown partition
    (None, [("nowhere", None, 0, 30, 1)], None, "reclocked.within_frontier", (None, 0, 30)),
    (_changed(1, diff=0), [], None, "reclocked.diff_non_zero", (0, 1, 10)),
    (None, [("again", 1, 3, 30, 1)], None, "reclocked.offsets_unique", None),
    (_changed(0, into_time=None), [], None, "reclocked.stamped", (0, 0, None)),
    (None, [], 20, "reclocked.in_window", (0, 0, 10)),                               # records of binding 10 restaged
], ids=["later-binding", "earlier-binding", "beyond-frontier", "unknown-partition", "null-partition", "zero-diff",
        "duplicate-offset", "null-into_time", "outside-window"])
def test_broken_batch_fails_its_check(spark, rows, extra, start, failing, named):
    """Each broken batch fails its own check only, naming the record (partition, offset, into_time) that breaks it."""
    report = check_reclocked(spark_batch(spark, rows, extra), REMAP, start)
    assert report.failed == [failing], report.summary()
    result = next(r for r in report.results if r.name == failing)
    if named is not None:
        assert result.unexpected_count >= 1 and named in [(s["partition"], s["offset"], s["into_time"])
                                                          for s in result.sample], result.sample
    else:
        assert result.unexpected_count == 2 and result.sample == [{"partition": 1, "offset": 3, "records": 2}]
    with pytest.raises(ChecksFailed, match=f"FAIL {failing}"):
        report.raise_for_failure()


@pytest.mark.slow
def test_bad_records_are_counted(spark):
    """The count is of records, not of the (partition, binding) groups Spark aggregated them into."""
    rows = [r._replace(into_time=30) for r in reclock(UPDATES, REMAP)]  # every record stamped at the last binding
    report = check_reclocked(spark_batch(spark, rows), REMAP, start=10)
    result = next(r for r in report.results if r.name == "reclocked.first_covering_binding")
    assert report.failed == ["reclocked.first_covering_binding"] and result.unexpected_count == 7, report.summary()
    assert [(s["partition"], s["offset"]) for s in result.sample] == [(0, 0), (1, 0)]  # the least per group


@pytest.mark.slow
def test_missing_column_fails_with_the_error(spark):
    with pytest.raises(Exception, match="diff"):
        check_reclocked(spark_batch(spark).drop("diff"), REMAP)


@pytest.mark.slow
def test_empty_window_holds_no_records(spark):
    assert check_reclocked(spark_batch(spark, []), REMAP, start=REMAP.upper).success
    # A batch known to be empty (its footers) is not collected: the same report, but for the run's Data Docs page.
    collected, known = (check_reclocked(spark_batch(spark, []), REMAP, start=REMAP.upper, empty=empty)
                        for empty in (False, True))
    assert known.summary() == collected.summary() and [r.observed for r in known.results] == [
        r.observed for r in collected.results]
    assert check_reclocked(spark_batch(spark), REMAP, start=REMAP.upper).failed == ["reclocked.in_window"]


@pytest.mark.slow
@pytest.mark.parametrize("offsets_, duplicated", [
    ([-65537, -65536, -32769, -32768, -1, 0, 1, 32768, 32769, 65536, 2 ** 62], 0),  # across buckets, none twice
    ([0, 32768, 32768, 5], 2),
    ([-32768, -32768, -32768], 3),
    ([7, None, None], 2),  # (0, null) twice: the bitmaps cannot count it, the exact count does
    ([None, 3, 3], 2),
    ([None, None, 3, 3], 4),
])
def test_duplicate_keys_counted_exactly(spark, offsets_, duplicated):
    """The bitmap count (no shuffle) agrees with the exact GROUP BY of every key: 0 per partition, else the
    exact count of records whose key is not unique."""
    from reclock.checks import _duplicate_frame, _duplicates, _small_frame

    batch = spark_batch(spark, [("x", 0, o, 10, 1) for o in offsets_] + [("y", 1, 0, 10, 1)])
    fast, exact = _duplicate_frame(batch), _small_frame(_duplicates(batch))
    assert fast.sort_values("partition").to_dict("records") == exact.sort_values("partition").to_dict("records")
    assert int(fast["duplicated_records"].sum()) == duplicated


@pytest.mark.slow
def test_duplicate_offsets_allowed_when_not_unique(spark):
    report = check_reclocked(spark_batch(spark, extra=[("retraction", 1, 3, 30, -1)]), REMAP, offsets_unique=False)
    assert report.success and "reclocked.offsets_unique" not in [r.name for r in report.results]


@pytest.mark.slow
def test_several_laws_broken_at_once(spark):
    broken = spark_batch(spark, _changed(0, into_time=20) + [("late", 1, 4, 30, 1), ("gone", 0, 1, 10, 0)])
    report = check_reclocked(broken, REMAP)
    assert report.failed == ["reclocked.first_covering_binding", "reclocked.within_frontier",
                             "reclocked.diff_non_zero", "reclocked.offsets_unique"], report.summary()


@pytest.mark.slow
def test_big_offsets_compare_as_numbers(spark):
    """Offsets stored as strings (reclock.offsets) order as numbers: "003:100" is after "002:99"; an unreadable one
    is beyond the frontier, as the engine cannot place it."""
    remap = Remap().mint(10, Frontier.of({0: 99})).mint(20, Frontier.of({0: 10 ** 30}))
    rows = [("a", 0, offsets.encode(98), 10, 1), ("b", 0, offsets.encode(99), 20, 1),
            ("c", 0, offsets.encode(100), 20, 1), ("d", 0, offsets.encode(10 ** 30 - 1), 20, 1)]
    schema = BATCH_SCHEMA.replace("offset long", "offset string")
    assert check_reclocked(spark_batch(spark, rows, schema=schema), remap, start=10).success
    for bad, failing in [(("e", 0, offsets.encode(101), 10, 1), "reclocked.first_covering_binding"),
                         (("f", 0, offsets.encode(10 ** 30), 20, 1), "reclocked.within_frontier"),
                         (("g", 0, "002:0100", 20, 1), "reclocked.within_frontier"),   # not canonical
                         (("h", 0, "bogus", 20, 1), "reclocked.within_frontier")]:
        report = check_reclocked(spark_batch(spark, rows + [bad], schema=schema), remap, start=10)
        assert report.failed == [failing], (bad, report.summary())


# --- the aggregate law is the per-record law -------------------------------------------------------

def per_record_failures(rows, remap: Remap, start: int | None) -> set[str]:
    """The laws, record by record, with the engine (what the checks computed per record before aggregating)."""
    failed, seen = set(), set()
    for _, p, o, t, diff in rows:
        expected = None if p is None or o is None else remap.into_time_of(p, o)
        if t is None:
            failed.add("reclocked.stamped")
        if expected is None:
            failed.add("reclocked.within_frontier")
        elif t is not None and t != expected:
            failed.add("reclocked.first_covering_binding")
        if diff == 0:
            failed.add("reclocked.diff_non_zero")
        if t is not None and (t >= remap.upper or start is not None and t < start):  # no start: (-inf, upper)
            failed.add("reclocked.in_window")
        if (p, o) in seen and (p, o) != (None, None):
            failed.add("reclocked.offsets_unique")
        seen.add((p, o))
    return failed


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_aggregate_checks_accept_what_the_per_record_law_accepts(spark, data):
    """On random small batches and remaps, the Spark aggregates fail exactly the checks some record breaks."""
    partitions = st.sampled_from([0, 1, 2])
    steps = data.draw(st.lists(st.dictionaries(partitions, st.integers(1, 4), min_size=1), min_size=1, max_size=4))
    remap, upper = Remap(), {}
    for i, step in enumerate(steps):
        upper = {p: upper.get(p, 0) + step.get(p, 0) for p in {*upper, *step}}
        remap = remap.mint(10 * (i + 1), Frontier.of(upper))
    times = st.one_of(st.none(), st.sampled_from([5] + [10 * (i + 1) for i in range(len(steps) + 1)]))
    record = st.tuples(st.just("x"), st.one_of(partitions, st.none()), st.one_of(st.integers(-1, 14), st.none()),
                       times, st.sampled_from([1, -1, 0]))
    good = [("x", p, o, t, 1) for t, p, o in
            ((r.into_time, r.partition, o) for r in remap.ranges(0) for o in range(r.start, r.end))]
    rows = data.draw(st.one_of(st.lists(record, max_size=8),
                               st.lists(st.sampled_from(good), max_size=8, unique=True) if good else st.just([]),
                               st.lists(st.one_of(st.sampled_from(good), record), max_size=8) if good
                               else st.just([])))
    start = data.draw(st.sampled_from([None] + [s for s in (10, 20) if s <= remap.upper]))  # a window's start
    report = check_reclocked(spark_batch(spark, rows), remap, start)
    failures = per_record_failures(rows, remap, start)
    assert set(report.failed) == failures, (rows, steps, start, report.summary())
    # The Arrow summary of the same rows, as files of the batch: it proves only batches whose records keep the
    # laws it decides, and then makes the very frames Spark does.
    cuts = sorted(data.draw(st.lists(st.integers(0, len(rows)), max_size=2)))
    summary = summary_of(rows, [0, *cuts, len(rows)], data.draw(st.integers(1, 4)))
    assert summary_of(good, [0, len(good) // 2, len(good)], 3).proved(remap)  # a healthy batch as staged
    if summary.proved(remap):
        from pyspark.sql import functions as F

        assert not failures & SUMMARY_LAWS, (rows, steps)
        batch = spark_batch(spark, rows)
        assert frame_rows(summary.binding_frame()) == frame_rows(_small_frame(_by_binding(batch, remap, {
            "zero_diffs": F.sum((F.col("diff") == 0).cast("long")),
            "first_zero_diff": F.min(F.when(F.col("diff") == 0, F.col("offset")))})))
        assert frame_rows(summary.duplicate_frame()) == frame_rows(_duplicate_frame(batch))


SUMMARY_LAWS = {"reclocked.first_covering_binding", "reclocked.within_frontier", "reclocked.diff_non_zero",
                "reclocked.offsets_unique"}


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_summary_proves_no_batch_a_record_of_which_breaks_its_laws(data):
    """The Arrow summary (no Spark) of random batches near healthy ones, as files read in record batches: a batch a
    record of which is beyond the frontier, off its covering binding, of diff 0 or a repeated offset is never
    proved; a healthy batch in the order it was staged always is."""
    steps = data.draw(st.lists(st.dictionaries(st.sampled_from([0, 1, 2]), st.integers(1, 40), min_size=1),
                               min_size=1, max_size=3))
    remap, upper = Remap(), {}
    for i, step in enumerate(steps):
        upper = {p: upper.get(p, 0) + step.get(p, 0) for p in {*upper, *step}}
        remap = remap.mint(10 * (i + 1), Frontier.of(upper))
    good = [("x", r.partition, o, r.into_time, 1) for r in remap.ranges(0) for o in range(r.start, r.end)]
    rows = list(good)
    for _ in range(data.draw(st.integers(0, 2))):  # changes: a field of a record, a record again, one dropped
        i = data.draw(st.integers(0, len(rows) - 1))
        change = data.draw(st.sampled_from(["fields", "again", "drop", "swap"]))
        if change == "again":
            rows.insert(data.draw(st.integers(0, len(rows))), rows[i])
        elif change == "drop":
            del rows[i]
        elif change == "swap":
            j = data.draw(st.integers(0, len(rows) - 1))
            rows[i], rows[j] = rows[j], rows[i]
        else:  # one or two fields of a record
            row = list(rows[i])
            for name in data.draw(st.sets(st.sampled_from(["partition", "offset", "into_time", "diff"]), min_size=1,
                                          max_size=2)):
                row[["data", "partition", "offset", "into_time", "diff"].index(name)] = data.draw({
                    "partition": st.sampled_from([0, 1, 2, 7, None]), "offset": st.one_of(st.integers(-2, 130),
                                                                                          st.none()),
                    "into_time": st.sampled_from([None, 5, 10, 20, 30, 40]), "diff": st.sampled_from([0, 1, -1])}[name])
            rows[i] = tuple(row)
        if not rows:
            break
    cuts = sorted(data.draw(st.lists(st.integers(0, len(rows)), max_size=3)))
    summary = summary_of(rows, [0, *cuts, len(rows)], data.draw(st.integers(1, 50)))
    if rows == good:
        assert summary.proved(remap)
    if summary.proved(remap):
        assert not per_record_failures(rows, remap, None) & SUMMARY_LAWS, rows


GOOD = list(reclock(UPDATES, REMAP))  # REMAP's records, as staged: (0, 0..2) at 10, (0, 3..4) at 20, (1, 2..3) at 30


@pytest.mark.parametrize("rows, cuts, proved", [
    (GOOD, [], True),
    (GOOD, [3, 5], True),  # files of a partition's consecutive offsets
    ([], [], True),
    (GOOD + [("x", 0, 5, None, 1)], [], False),  # unstamped, beyond the frontier (the stamped check names it)
    (GOOD + [("x", 0, 4, None, 1)], [], False),  # offset 4 of partition 0 twice
    (GOOD[:-1] + [("x", 1, 3, None, 1)], [], True),  # unstamped only: the stamped check fails it
    (GOOD + [("x", 7, 0, 30, 1)], [], False),  # a partition the remap does not know
    (GOOD + [("x", None, 0, 30, 1)], [], False),
    (GOOD + [("x", 1, None, 30, 1)], [], False),
    ([r._replace(into_time=20) if r.offset == 2 and r.partition == 0 else r for r in GOOD], [], False),  # not its
    ([r._replace(into_time=10) if r.offset == 3 and r.partition == 0 else r for r in GOOD], [], False),  # binding
    ([r._replace(diff=0) if r.offset == 3 else r for r in GOOD], [], False),
    (GOOD[1:] + GOOD[:1], [], False),  # offset 0 after 4 in one file: not proved unique (Spark counts them)
    (GOOD[1:] + GOOD[:1], [8], True),  # ... in a file of its own: the files' intervals are disjoint
    (GOOD + GOOD[:1], [9], False),  # offset 0 in two files
    (GOOD[:2] + GOOD[1:], [], False),  # offset 1 twice in a row
], ids=["healthy", "three-files", "empty", "unstamped-beyond", "unstamped-twice", "unstamped", "unknown-partition",
        "null-partition", "null-offset", "later-binding", "earlier-binding", "zero-diff", "out-of-order",
        "own-file", "in-two-files", "repeated"])
def test_what_a_summary_proves(rows, cuts, proved):
    for batch_rows in (1, 4):  # each record a batch of its own; records of two partitions in a batch
        assert summary_of(rows, [0, *cuts, len(rows)], batch_rows).proved(REMAP) == proved, batch_rows


def test_a_summary_of_a_source_whose_records_are_diffs_proves_repeated_offsets():
    assert summary_of(GOOD + GOOD[:1], [0, 10], 4).proved(REMAP, offsets_unique=False)  # a change's -1 and +1
    assert not summary_of(GOOD + [("x", 1, None, 30, 1)], [0, 10], 4).proved(REMAP, offsets_unique=False)


def summary_of(rows, cuts: list[int], batch_rows: int):
    """:func:`reclock.batch_summary.summarize` of ``rows`` as files ``rows[cuts[i]:cuts[i + 1]]``, read in record
    batches of ``batch_rows``."""
    import pyarrow as pa

    from reclock.batch_summary import COLUMNS, summarize

    schema = pa.schema([("data", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                        ("into_time", pa.int64()), ("diff", pa.int64())])
    files = [pa.Table.from_pylist([dict(zip(schema.names, r)) for r in rows[a:b]], schema)
             for a, b in zip(cuts, cuts[1:])]
    strict = pa.schema([f.with_nullable(False) if f.name in ("partition", "into_time") else f for f in schema])
    files = [t.cast(strict) if i % 2 and not (t["partition"].null_count or t["into_time"].null_count) else t
             for i, t in enumerate(files)]  # the files of a batch may differ in their fields' nullability
    return summarize((t.select(COLUMNS).to_batches(max_chunksize=batch_rows) for t in files))


def frame_rows(frame: pd.DataFrame) -> list[tuple]:
    return sorted((tuple(None if pd.isna(v) else v for v in r) for r in frame[sorted(frame.columns)].itertuples(
        index=False)), key=repr)


def dead_letter_rows(rows) -> list[tuple]:
    return [("s", p, o, t, b"k", b"\xff", error) for p, o, t, error in rows]


DEAD_SCHEMA = "source string, partition int, offset long, into_time long, key binary, value binary, error string"
GOOD_DEAD = [(0, 3, 20, "topic 't' partition 0 offset 3: record is not valid utf-8 (undecodable value)"),
             (1, 2, 30, "topic 't' partition 1 offset 2: record is not valid utf-8 (undecodable key)")]


@pytest.mark.slow
@pytest.mark.parametrize("dead, failing", [
    (GOOD_DEAD, []),
    ([], []),  # none: reported as 0
    (GOOD_DEAD + [(0, 2, 20, "x")], ["dead_letter.first_covering_binding"]),  # offset 2 was bound at 10
    ([(0, 0, 10, "x")], ["dead_letter.in_window"]),  # before the window
    ([(1, 2, 30, None)], ["dead_letter.has_error"]),
    ([(0, 4, 20, "x")], ["dead_letter.not_in_batch"]),  # (0, 4) is in the batch too: counted twice
], ids=["good", "none", "wrong-binding", "out-of-window", "no-error", "also-in-batch"])
def test_dead_letters_are_counted_and_checked(spark, dead, failing):
    """The count is reported (observed) and never fails; a dead letter must be bound like every record, in the
    window, say why, and not be in the batch as well."""
    dead_offsets = {(p, o) for p, o, _, _ in GOOD_DEAD}
    batch = spark_batch(spark, [r for r in reclock(UPDATES, REMAP) if r[3] > 10 and (r[1], r[2]) not in dead_offsets])
    report = check_dead_letters(spark.createDataFrame(dead_letter_rows(dead), DEAD_SCHEMA), batch, REMAP, 11)
    assert report.failed == failing, report.summary()
    count = next(r for r in report.results if r.name == "dead_letter.count")
    assert count.success and (count.observed or 0) == len(dead) and report.rows == len(dead)
    assert "PASS dead_letter.count: records of the batch that could not be decoded" in report.summary()
    for name in failing:
        bad = next(r for r in report.results if r.name == name)
        assert bad.unexpected_count == 1 and len(bad.sample) == 1 and bad.sample[0]["partition"] == dead[-1][0], bad


# Postgres-like histories (table, row JSON, partition, offset, diff) for the primary-key check.
ACCT, LOG, PAIR = "public.acct", "public.log", "public.pair"
KEYS = {ACCT: ["id"], PAIR: ["a", "b"]}  # public.log has no primary key
HELD = [(ACCT, '{"id":1,"bal":"1"}', "", 100, 1), (ACCT, '{"id":2,"bal":"2"}', "", 100, 1),
        (PAIR, '{"a":1,"b":"x"}', "", 100, 1), (LOG, '{"m":"hi"}', "", 100, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("published, staged, keys, failing", [
    (HELD, [(ACCT, '{"id":1,"bal":"1"}', "", 200, -1), (ACCT, '{"id":1,"bal":"5"}', "", 200, 1)], KEYS, []),
    (HELD, [(ACCT, '{"id":1,"bal":"1"}', "", 200, -1), (ACCT, '{"id":3,"bal":"1"}', "", 200, 1)], KEYS, []),
    (HELD, [(LOG, '{"m":"hi"}', "", 200, 1), (LOG, '{"m":"hi"}', "", 300, 1)], KEYS, []),
    (HELD, [(PAIR, '{"a":1,"b":"y"}', "", 200, 1), (PAIR, '{"a":2,"b":"x"}', "", 200, 1)], KEYS, []),
    (HELD + [(ACCT, '{"id":2,"bal":"9"}', "", 150, 1)], [(ACCT, '{"id":4}', "", 200, 1)], KEYS, []),
    (HELD, [(ACCT, '{"id":1,"bal":"5"}', "", 200, 1)], KEYS, [(ACCT, '{"id":"1"}', 200)]),
    (HELD, [(ACCT, '{"id":7}', "", 200, 1), (ACCT, '{"id":7}', "", 300, 1)], KEYS, [(ACCT, '{"id":"7"}', 300)]),
    (HELD, [(PAIR, '{"a":1,"b":"x","c":true}', "", 200, 1)], KEYS, [(PAIR, '{"a":"1","b":"x"}', 200)]),
    ([], [(ACCT, '{"id":1}', "public.acct@0/10", 65537, 1), (ACCT, '{"id":1}', "", 200, 1)], KEYS,
     [(ACCT, '{"id":"1"}', 65537)]),  # where: the greatest (offset, partition), here the snapshot row's
    (HELD, [(ACCT, '{"id":1,"bal":"5"}', "", 200, 1)], {}, []),
], ids=["update", "key-updated", "no-key-duplicates", "composite", "untouched", "duplicate-insert", "replayed",
        "composite-duplicate", "snapshot-and-change", "no-table-with-a-key"])
def test_primary_key_held_at_most_once(spark, published, staged, keys, failing):
    """Per table with a primary key, the keys the batch touches are held at most once AS OF the new upper over the
    published history and the batch; a table without one may hold a row twice; a failure names table, key and
    where the batch last changed it."""
    schema = "table string, row string, partition string, offset long, diff long"
    report = check_primary_keys(spark.createDataFrame(published, schema), spark.createDataFrame(staged, schema), keys)
    result, = report.results
    assert result.name == "reclocked.primary_key_unique" and result.success == (not failing), report.summary()
    if failing:
        assert result.unexpected_count == len(failing)
        assert [(r["table"], r["key"], r["offset"]) for r in result.sample] == failing, result.sample


@pytest.mark.slow
def test_primary_keys_not_recorded_fail(spark):
    frame = spark.createDataFrame(HELD, "table string, row string, partition string, offset long, diff long")
    report = check_primary_keys(frame, frame, None)
    assert report.failed == ["reclocked.primary_key_unique"] and "stage it again" in report.summary()


def test_checks_run_through_the_sources_checkpoints(tmp_path, monkeypatch):
    """A source's context is made from the project's suites; each kind runs through its checkpoint, whose results go
    to GX's validation results store and whose Data Docs site is rebuilt after every run (the last KEEP_RUNS kept)."""
    import json

    from reclock import gx_context

    monkeypatch.setattr(gx_context, "KEEP_RUNS", 2)
    root = tmp_path / "orders" / "gx"
    assert gx_context.root_of(str(tmp_path / "orders"), "orders") == str(root)
    context = gx_context.Context(str(root), "orders")
    assert sorted(p.name for p in (root / "expectations").glob("*.json")) == [
        f"{kind}.json" for kind in gx_context.suite_names()]
    assert {"remap", "reclocked", "reclocked_keys", "dead_letter", "history", "primary_key"} <= set(
        gx_context.suite_names())

    good = check_remap(remap_frame(), gx=context)
    bad = check_remap(remap_frame(extra=[(1, 20, -1)]), gx=context)
    assert good.success and bad.failed == ["remap.monotone"]
    assert json.loads((root / "checkpoints" / "orders.remap.json").read_text())["validation_definitions"][0][
        "name"] == "orders.remap"
    stored = sorted((root / "uncommitted" / "validations" / "remap" / "__none__").glob("*/*.json"))
    assert [json.loads(p.read_text())["success"] for p in stored] == [True, False]  # GX's own record of each run
    index = (root / "uncommitted" / "data_docs" / "local_site" / "index.html").read_text()
    assert "remap" in index and (root / "uncommitted" / "data_docs" / "local_site" / bad.docs[0]).is_file()

    check_remap(remap_frame(), gx=context)
    runs = sorted((root / "uncommitted" / "validations" / "remap" / "__none__").iterdir())
    assert len(runs) == 2 and runs[0].name == stored[1].parent.name  # the oldest result is gone
    assert not (root / "uncommitted" / "data_docs" / "local_site" / good.docs[0]).exists()


def test_docs_once_builds_the_site_once_for_a_steps_runs(tmp_path):
    """Inside ``docs_once`` (a check step) the runs' pages and the index are built once, when the block ends, and
    then hold every run of it, a failed one too; outside it each run builds its own."""
    from reclock import gx_context

    root = tmp_path / "gx"
    site = root / "uncommitted" / "data_docs" / "local_site"
    context = gx_context.Context(str(root), "orders")
    builds = []
    build = context.gx.build_data_docs
    context.gx.build_data_docs = lambda **kw: builds.append(kw["resource_identifiers"]) or build(**kw)
    with context.docs_once():
        good = check_remap(remap_frame(), gx=context)
        bad = check_remap(remap_frame(extra=[(1, 20, -1)]), gx=context)
        assert builds == [] and not (site / "index.html").exists()
    assert len(builds) == 1 and good.success and not bad.success
    assert len(good.docs) == len(bad.docs) == 1 and all((site / page).is_file() for page in good.docs + bad.docs)
    check_remap(remap_frame(), gx=context)
    assert len(builds) == 2


def test_a_long_lived_context_checks_after_another_process_checked_the_source(tmp_path):
    """Two processes check one source (a step in a process of its own beside one that keeps its context, e.g.
    ``dags test`` or a notebook): the other's run saves the suites and definitions anew, and this context's next
    run still checks, against the suite as stored (found by the SIGKILL fault test, whose rounds do just that)."""
    from reclock import gx_context

    root = tmp_path / "gx"
    kept = gx_context.Context(str(root), "orders")
    assert check_remap(remap_frame(), gx=kept).success
    assert check_remap(remap_frame(), gx=gx_context.Context(str(root), "orders")).success  # another process
    assert check_remap(remap_frame(), gx=kept).success
    assert check_remap(remap_frame(extra=[(1, 20, -1)]), gx=kept).failed == ["remap.monotone"]


def _check_rounds(root: str, rounds: int) -> list:
    """A process checking one source ``rounds`` times, half with its context kept, half each with a fresh one (a
    process of its own per run): whether each run passed, or what it raised."""
    from reclock import gx_context

    kept, outcomes = gx_context.Context(root, "orders"), []
    for i in range(rounds):
        try:
            outcomes.append(check_remap(remap_frame(), gx=kept if i % 2 else gx_context.Context(root, "orders"))
                            .success)
        except Exception as e:  # noqa: BLE001 - reported, not raised: the test names it
            outcomes.append(repr(e)[:300])
    return outcomes


def test_two_processes_check_one_source_at_once(tmp_path):
    """Racing runs of one source (a scheduled run beside a manual one) check at once: each run checks, none meets a
    GX store error (a definition another process is rewriting), and the stored definitions are written once."""
    import multiprocessing

    from reclock import gx_context

    root = str(tmp_path / "gx")
    with multiprocessing.get_context("spawn").Pool(2) as pool:  # their first runs make the source's context
        outcomes = pool.starmap(_check_rounds, [(root, 4), (root, 4)])
    assert outcomes == [[True] * 4] * 2
    saved = {p: p.stat().st_mtime_ns for p in (tmp_path / "gx").glob("*/orders.remap.json")}
    assert check_remap(remap_frame(), gx=gx_context.Context(root, "orders")).success
    assert len(saved) == 2 and {p: p.stat().st_mtime_ns for p in saved} == saved  # used as stored


def test_a_half_written_context_is_made_again(tmp_path, caplog):
    """GX writes its files in place: a check killed meanwhile must not wedge the source's checks."""
    from reclock import gx_context

    root = tmp_path / "gx"
    assert check_remap(remap_frame(), gx=gx_context.Context(str(root), "orders")).success
    (root / "great_expectations.yml").write_text("fluent_datasources:\n  reclock_pandas: [")
    (root / "checkpoints" / "orders.remap.json").write_text('{"name": "orders.re')
    with caplog.at_level("WARNING", logger="reclock"):
        assert check_remap(remap_frame(), gx=gx_context.Context(str(root), "orders")).success
    assert "config is made again" in caplog.text and "checkpoint orders.remap unreadable" in caplog.text
    assert check_remap(remap_frame(extra=[(1, 20, -1)]), gx=gx_context.Context(str(root), "orders")).failed == [
        "remap.monotone"]


@pytest.mark.slow
def test_an_idle_run_passes_its_checks_without_validating(spark, tmp_path, monkeypatch):
    """A run with no new records, after a check that passed on the same remap, records its check as passed without
    validating (no GX context opened); publish goes on from that record.  A remap the last check did not pass on, a
    window with records, or a failed last check is validated in full."""
    from conftest import write_sources_config

    from reclock import check_log, pipeline, validator
    from reclock.runtime import Runtime

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.log").write_bytes(b"one\ntwo\n")
    config = write_sources_config(tmp_path, ("web", "files", {"url": str(logs)}), retention_ms=10**9)  # no compaction
    runtime = Runtime.of(config, spark)
    pipeline.run_once("web", runtime, now=1_000)  # validated: records
    opened = []
    monkeypatch.setattr(validator, "open_context", lambda *a: opened.append(a) or pytest.fail("GX context opened"))
    done = pipeline.run_once("web", runtime, now=2_000)  # idle: nothing validated
    assert "nothing to validate" in done["check"]["reclocked"] and "unchanged since" in done["check"]["remap"]
    with runtime.source("web", connect=False) as ctx:
        last = check_log.read(ctx.tables.uri)
        assert last["success"] and last["window"] == [1_001, 2_000] and ctx.tables.reclocked_upper() == 2_001
    assert pipeline.check("web", runtime)["remap"].startswith("remap")  # nothing pending: the same
    monkeypatch.undo()

    (logs / "a.log").write_bytes(b"one\ntwo\nthree\n")
    with pytest.raises(pytest.fail.Exception, match="GX context opened"):  # records: validated
        monkeypatch.setattr(validator, "open_context", lambda *a: pytest.fail("GX context opened"))
        pipeline.run_once("web", runtime, now=3_000)
    monkeypatch.undo()
    pipeline.run_once("web", runtime, now=3_000, steps=("check", "publish"))
    with runtime.source("web", connect=False) as ctx:  # a failed last check: the idle run validates again
        check_log.write(ctx.tables.uri, {**check_log.read(ctx.tables.uri), "success": False})
    calls = []
    real = validator.open_context
    monkeypatch.setattr(validator, "open_context", lambda *a: calls.append(a) or real(*a))
    pipeline.run_once("web", runtime, now=4_000)
    assert len(calls) == 1
    pipeline.run_once("web", runtime, now=5_000)  # and then, passed on this remap, it need not
    assert len(calls) == 1
