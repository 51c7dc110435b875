"""Great Expectations checks: good data passes, and each deliberately broken case fails its own check."""
from __future__ import annotations

import pandas as pd
import pytest

from reclock.checks import ChecksFailed, check_dead_letters, check_primary_keys, check_reclocked, check_remap
from reclock.engine import Frontier, Remap, Update, reclock

REMAP = (Remap()
         .mint(10, Frontier.of({0: 3, 1: 2}))
         .mint(20, Frontier.of({0: 5, 1: 2}))
         .mint(30, Frontier.of({0: 5, 1: 4})))
UPDATES = [Update(f"r{p}-{o}", p, o, 1) for p, n in ((0, 5), (1, 4)) for o in range(n)]


def remap_frame(remap: Remap = REMAP, extra: list[tuple] = ()) -> pd.DataFrame:
    return pd.DataFrame(list(remap.increments()) + list(extra), columns=["partition", "into_time", "increment"])


def batch_frame(rows=None, extra: list[tuple] = ()) -> pd.DataFrame:
    rows = reclock(UPDATES, REMAP) if rows is None else rows
    return pd.DataFrame(list(rows) + list(extra), columns=["data", "partition", "offset", "into_time", "diff"])


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


def test_good_batch_passes():
    report = check_reclocked(batch_frame(), REMAP, start=10)
    assert report.success, report.summary()
    assert report.rows == len(UPDATES)
    assert report.as_dict() == {"subject": "reclocked batch", "rows": 9, "success": True, "failed": []}


def _changed(offset_in_p0: int, **fields) -> list:
    """The good batch with the record at ``(0, offset_in_p0)`` changed."""
    return [r._replace(**fields) if (r.partition, r.offset) == (0, offset_in_p0) else r
            for r in reclock(UPDATES, REMAP)]


@pytest.mark.parametrize("frame, start, failing", [
    (batch_frame(_changed(0, into_time=20)), None, "reclocked.first_covering_binding"),   # a later binding
    (batch_frame(_changed(4, into_time=10)), None, "reclocked.first_covering_binding"),   # an earlier one
    (batch_frame(extra=[("late", 1, 4, 30, 1)]), None, "reclocked.within_frontier"),
    (batch_frame(_changed(1, diff=0)), None, "reclocked.diff_non_zero"),
    (batch_frame(extra=[("again", 1, 3, 30, 1)]), None, "reclocked.offsets_unique"),
    (batch_frame(_changed(0, into_time=None)), None, "reclocked.stamped"),
    (batch_frame(), 20, "reclocked.in_window"),                               # records of binding 10 restaged
], ids=["later-binding", "earlier-binding", "beyond-frontier", "zero-diff", "duplicate-offset", "null-into_time",
        "outside-window"])
def test_broken_batch_fails_its_check(frame, start, failing):
    report = check_reclocked(frame, REMAP, start)
    assert report.failed == [failing], report.summary()
    with pytest.raises(ChecksFailed, match=f"FAIL {failing}"):
        report.raise_for_failure()


def test_missing_column_fails_with_the_error():
    report = check_reclocked(batch_frame().drop(columns="diff"), REMAP)
    assert report.failed == ["reclocked.diff_non_zero"]
    assert 'The column "diff" in BatchData does not exist' in report.summary()


def test_empty_window_holds_no_records():
    assert check_reclocked(batch_frame().iloc[:0], REMAP, start=REMAP.upper).success
    assert check_reclocked(batch_frame(), REMAP, start=REMAP.upper).failed == ["reclocked.in_window"]


def test_duplicate_offsets_allowed_when_not_unique():
    frame = batch_frame(extra=[("retraction", 1, 3, 30, -1)])
    assert check_reclocked(frame, REMAP, offsets_unique=False).success


@pytest.mark.slow
def test_spark_batch(spark):
    schema = "data string, partition int, offset long, into_time long, diff long"
    good = spark.createDataFrame(list(reclock(UPDATES, REMAP)), schema)
    report = check_reclocked(good, REMAP, start=10)
    assert report.success and report.rows == len(UPDATES), report.summary()

    broken = spark.createDataFrame(_changed(0, into_time=20) + [("late", 1, 4, 30, 1), ("gone", 0, 1, 10, 0)], schema)
    report = check_reclocked(broken, REMAP)
    assert report.failed == ["reclocked.first_covering_binding", "reclocked.within_frontier",
                             "reclocked.diff_non_zero", "reclocked.offsets_unique"], report.summary()


def dead_letter_frame(rows) -> pd.DataFrame:
    return pd.DataFrame([("s", p, o, t, b"k", b"\xff", error) for p, o, t, error in rows],
                        columns=["source", "partition", "offset", "into_time", "key", "value", "error"])


GOOD_DEAD = [(0, 3, 20, "topic 't' partition 0 offset 3: record is not valid utf-8 (undecodable value)"),
             (1, 2, 30, "topic 't' partition 1 offset 2: record is not valid utf-8 (undecodable key)")]


@pytest.mark.parametrize("dead, failing", [
    (GOOD_DEAD, []),
    ([], []),  # none: reported as 0
    (GOOD_DEAD + [(0, 2, 20, "x")], ["dead_letter.first_covering_binding"]),  # offset 2 was bound at 10
    ([(0, 0, 10, "x")], ["dead_letter.in_window"]),  # before the window
    ([(1, 2, 30, None)], ["dead_letter.has_error"]),
    ([(0, 4, 20, "x")], ["dead_letter.not_in_batch"]),  # (0, 4) is in the batch too: counted twice
], ids=["good", "none", "wrong-binding", "out-of-window", "no-error", "also-in-batch"])
def test_dead_letters_are_counted_and_checked(dead, failing):
    """The count is reported (observed) and never fails; a dead letter must be bound like every record, in the
    window, say why, and not be in the batch as well."""
    dead_offsets = {(p, o) for p, o, _, _ in GOOD_DEAD}
    batch = batch_frame([r for r in reclock(UPDATES, REMAP) if r[3] > 10 and (r[1], r[2]) not in dead_offsets])
    report = check_dead_letters(dead_letter_frame(dead), batch, REMAP, 11)
    assert report.failed == failing, report.summary()
    count = next(r for r in report.results if r.name == "dead_letter.count")
    assert count.success and count.observed == len(dead) and report.rows == len(dead)
    assert "PASS dead_letter.count: records of the batch that could not be decoded" in report.summary()


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
