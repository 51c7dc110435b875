"""Laws of the pure engine: frontiers, remap, reclocked, compaction, resumption."""
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from reclock.engine import (
    Frontier, FrontierError, Range, Remap, RemapError, as_of, compact_updates, offset_resumption_frontier,
    reclock, timestamp_resumption_frontier, upstream,
)

PM = 3_600_000  # one hour in ms; 1pm..4pm as IntoTimes
ONE, TWO, THREE = 13 * PM, 14 * PM, 15 * PM


# --- seed 002: two partitions, partially ordered times -------------------------------------------

SEED_002_DATA = [("a", 0, 0), ("b", 0, 1), ("c", 0, 2), ("d", 0, 3),
                 ("e", 1, 0), ("f", 1, 1), ("g", 1, 2), ("h", 1, 3)]


def seed_002_remap() -> Remap:
    return (Remap()
            .mint(ONE, Frontier.of({0: 0, 1: 0}))
            .mint(TWO, Frontier.of({0: 3, 1: 1}))
            .mint(THREE, Frontier.of({0: 4, 1: 3})))


def test_seed_002_two_partition_example():
    reclocked = reclock([(d, p, o, 1) for d, p, o in SEED_002_DATA], seed_002_remap())
    assert set(as_of(reclocked, ONE)) == set()
    assert set(as_of(reclocked, TWO)) == {"a", "b", "c", "e"}
    assert set(as_of(reclocked, THREE)) - set(as_of(reclocked, TWO)) == {"d", "f", "g"}
    assert "h" not in {r.data for r in reclocked}


def test_seed_001_increments_are_the_stored_form():
    remap = Remap().mint(1649686076392, Frontier.of({1: 43, 2: 41})).mint(1649686079487, Frontier.of({1: 46, 2: 45}))
    assert sorted(remap.increments()) == sorted([
        (1, 1649686076392, 43), (2, 1649686076392, 41), (1, 1649686079487, 3), (2, 1649686079487, 4)])
    # seed 001 "offsets 0-42 inclusive" is upper 43: offset 42 is in, 43 is not
    assert remap.into_time_of(1, 42) == 1649686076392
    assert remap.into_time_of(1, 43) == 1649686079487
    assert remap.into_time_of(1, 46) is None


def test_progress_relation_rows():
    rows = seed_002_remap().progress()
    assert (TWO, 0, 3) in rows and (THREE, 1, 3) in rows and len(rows) == 4


# --- clear errors, nothing changed --------------------------------------------------------------

def test_mint_refuses_non_increasing_time_and_backwards_frontier():
    remap = seed_002_remap()
    with pytest.raises(RemapError, match="strictly increase"):
        remap.mint(THREE, Frontier.of({0: 5, 1: 5}))
    with pytest.raises(RemapError, match="not monotone"):
        remap.mint(THREE + 1, Frontier.of({0: 3, 1: 9}))
    assert remap == seed_002_remap()


@pytest.mark.parametrize("wall_clock, upper, binds_at", [
    (5_000, 4_001, 5_000),  # the clock is ahead: bind at the clock
    (4_001, 4_001, 4_001),  # exactly at the upper
    (3_000, 4_001, 4_001),  # stepped back (NTP, a skewed worker): bind at the upper, never before it
    (0, 0, 0),  # an empty remap
])
def test_binding_time_is_the_later_of_clock_and_upper(wall_clock, upper, binds_at):
    remap = Remap(upper=upper)
    assert remap.binding_time(wall_clock) == binds_at
    assert remap.mint(remap.binding_time(wall_clock), Frontier.of({0: 1})).upper == binds_at + 1


def test_frontier_rejects_bad_values():
    with pytest.raises(FrontierError):
        Frontier.of({0: -1})
    with pytest.raises(FrontierError):
        Frontier.of({0: "3"})


def test_queries_outside_the_readable_window_are_refused():
    remap = seed_002_remap().compact(TWO)
    with pytest.raises(RemapError, match="compacted"):
        remap.at(ONE)
    with pytest.raises(RemapError, match="not complete"):
        remap.at(remap.upper)
    assert remap.at(TWO) == Frontier.of({0: 3, 1: 1})


def test_new_partition_keeps_monotonicity():
    remap = Remap().mint(1, Frontier.of({0: 5})).mint(2, Frontier.of({0: 5, 7: 2}))
    assert remap.bindings[0].frontier.less_equal(remap.bindings[1].frontier)
    assert remap.into_time_of(7, 0) == 2


def test_idle_tick_advances_upper_without_a_row():
    remap = seed_002_remap()
    idle = remap.mint(THREE + 10, remap.frontier)
    assert idle.upper == THREE + 11 and idle.bindings == remap.bindings
    assert Remap.from_increments(idle.increments(), idle.since, idle.upper) == idle


# --- properties --------------------------------------------------------------------------------

partitions = st.sampled_from([0, 1, 2, "k"])


@st.composite
def remaps(draw, max_ticks=8):
    """A remap grown by random ticks: time gaps, per-partition growth, partitions appearing late."""
    remap, time = Remap(), draw(st.integers(0, 10))
    for _ in range(draw(st.integers(0, max_ticks))):
        time += draw(st.integers(1, 5))
        grow = draw(st.dictionaries(partitions, st.integers(0, 4), max_size=3))
        remap = remap.mint(time, remap.frontier.advanced_by(grow))
    return remap


@st.composite
def remap_and_updates(draw):
    remap = draw(remaps())
    updates = draw(st.lists(st.tuples(st.sampled_from("xyz"), partitions, st.integers(0, 20), st.sampled_from([1, -1, 2])),
                            max_size=40))
    return remap, updates


@given(remaps())
def test_remap_is_monotone(remap):
    for before, after in zip(remap.bindings, remap.bindings[1:]):
        assert before.into_time < after.into_time
        assert before.frontier.less_equal(after.frontier)


@given(remaps(), st.data())
def test_a_remap_until_an_upper_is_the_prefix_later_ticks_extend(remap, data):
    """``until(u)`` is the remap as it stood at upper ``u``: it reads as ``remap`` below ``u``, and minting the
    later bindings onto it gives ``remap`` back (a window checked against it stays exact while ticks go on)."""
    upper = data.draw(st.integers(remap.since, remap.upper))
    earlier = remap.until(upper)
    assert earlier.upper == upper and earlier.since == remap.since
    for t in range(remap.since, upper):
        assert earlier.at(t) == remap.at(t)
    for binding in remap.bindings[len(earlier.bindings):]:
        earlier = earlier.mint(*binding)
    assert earlier.bindings == remap.bindings
    with pytest.raises(RemapError, match="no remap had upper"):
        remap.until(remap.upper + 1)


@given(remaps())
def test_increments_round_trip_is_deterministic_replay(remap):
    assert Remap.from_increments(remap.increments(), remap.since, remap.upper) == remap
    assert Remap.from_increments(list(reversed(remap.increments())), remap.since, remap.upper) == remap


@given(remap_and_updates())
def test_every_record_lands_at_its_first_covering_binding(case):
    remap, updates = case
    for data, p, o, t, _ in reclock(updates, remap):
        assert remap.at(t).covers(p, o)
        earlier = [b for b in remap.bindings if b.into_time < t]
        assert not earlier or not earlier[-1].frontier.covers(p, o)
    for data, p, o, diff in updates:
        if not remap.frontier.covers(p, o):
            assert remap.into_time_of(p, o) is None


@given(remap_and_updates())
def test_reclock_is_monotone_in_offsets(case):
    remap, updates = case
    stamped = reclock(updates, remap)
    for a in stamped:
        for b in stamped:
            if a.partition == b.partition and a.offset <= b.offset:
                assert a.into_time <= b.into_time


@given(remap_and_updates(), st.integers(0, 60))
def test_compaction_commutes_with_reclocking(case, since):
    remap, updates = case
    since = min(since, remap.upper - 1) if remap.upper > 0 else 0
    compacted = remap.compact(since)
    assert compact_updates(reclock(updates, compacted), since) == compact_updates(reclock(updates, remap), since)
    for t in range(max(since, compacted.since), remap.upper):
        assert compacted.at(t) == remap.at(t)


@given(remap_and_updates())
def test_ranges_partition_exactly_the_covered_offsets(case):
    remap, _ = case
    seen = Counter()
    for into_time, p, start, end in remap.ranges():
        assert start < end
        for o in range(start, end):
            seen[(p, o)] += 1
            assert remap.into_time_of(p, o) == into_time
    assert seen == Counter({(p, o): 1 for p, u in remap.frontier for o in range(u)})


@given(remaps(), st.data())
def test_ranges_from_a_time_resume_where_earlier_ones_stop(remap, data):
    if not remap.bindings:
        return
    cut = data.draw(st.sampled_from([b.into_time for b in remap.bindings]))
    before = [r for r in remap.ranges() if r.into_time < cut]
    assert before + remap.ranges(cut) == remap.ranges()


@given(remaps(), st.data())
def test_reclock_frontier_inverts_at(remap, data):
    for binding in remap.bindings:
        assert remap.reclock_frontier(binding.frontier) > binding.into_time
    assert remap.reclock_frontier(remap.frontier) == remap.upper
    assert remap.reclock_frontier(Frontier()) == (remap.bindings[0].into_time if remap.bindings else remap.upper)


@given(remaps(), st.integers(0, 80), st.integers(0, 80))
def test_offset_resumption_frontier_is_what_is_durable(remap, remap_upper_cut, reclocked_upper):
    resume = timestamp_resumption_frontier(remap.upper, reclocked_upper)
    offsets = offset_resumption_frontier(remap, resume)
    assert offsets.less_equal(remap.frontier)
    # every record below the offset frontier is reclocked strictly before the resumption time
    for p, upper in offsets:
        for o in range(upper):
            assert remap.into_time_of(p, o) < resume


@settings(max_examples=50)
@given(remap_and_updates(), st.integers(0, 60), st.integers(0, 60))
def test_compactions_compose(case, s1, s2):
    remap, updates = case
    if remap.upper == 0:
        return
    s1, s2 = sorted((min(s1, remap.upper - 1), min(s2, remap.upper - 1)))
    assert remap.compact(s1).compact(s2) == remap.compact(s2)



# --- the upstream against what remap bound (engine/upstream.py) ---------------------------------

@pytest.mark.parametrize("bound, start, upper, released, recorded, identity, problems", [
    ({0: 5}, {}, {0: 7}, {0: 2}, {"id": "a"}, {"id": "a"}, []),  # the same stream, moved on
    ({}, {0: 50}, {0: 60}, {0: 50}, {"id": "a"}, {"id": "a"}, []),  # the first tick of a log starting at 50
    ({0: 60}, {0: 50}, {0: 60}, {0: 55}, None, None, []),  # retention inside what is bound: staging's matter
    ({0: 5}, {}, {0: 7}, {}, {"id": "a"}, {"id": "b"}, ["id was 'a' when remap's epoch began, now 'b'"]),
    ({0: 5}, {}, {0: 7}, {}, {"id": "a"}, None, []),  # nothing to compare with
    ({0: 5}, {}, {0: 4}, {}, None, None, ["partition 0: upstream upper 4 is below the bound offset 5"]),
    ({0: 5, 1: 3}, {}, {0: 7}, {}, None, None,
     ["partition 1: upstream upper 0 is below the bound offset 3 (the partition no longer exists)"]),
    ({0: 5}, {}, {0: 9}, {0: 7}, None, None,
     ["partition 0: offsets [5, 7) were released upstream before they were read"]),
    ({}, {0: 3}, {0: 9}, {0: 7}, None, None,
     ["partition 0: offsets [3, 7) were released upstream before they were read"]),
])
def test_tick_problems(bound, start, upper, released, recorded, identity, problems):
    assert upstream.tick_problems(Frontier.of(bound), Frontier.of(start), Frontier.of(upper),
                                  Frontier.of(released), recorded, identity) == problems


@pytest.mark.parametrize("start, ranges, clipped", [
    ({}, [(1, 0, 0, 5)], [(1, 0, 0, 5)]),
    ({0: 3}, [(1, 0, 0, 5), (2, 0, 5, 8)], [(1, 0, 3, 5), (2, 0, 5, 8)]),
    ({0: 5}, [(1, 0, 0, 5), (2, 1, 0, 2)], [(2, 1, 0, 2)]),  # a range wholly below the start is dropped
    ({0: 9}, [(1, 0, 0, 5), (2, 0, 5, 8)], []),
])
def test_clip_ranges(start, ranges, clipped):
    assert upstream.clip_ranges([Range(*r) for r in ranges], Frontier.of(start)) == [Range(*r) for r in clipped]


def test_past_gaps_moves_the_start_past_lost_offsets():
    lost = upstream.lost_ranges(Frontier.of({0: 5, 1: 9}), Frontier.of({1: 2}), Frontier.of({0: 8, 1: 4, 2: 3}))
    assert lost == [Range(-1, 0, 5, 8), Range(-1, 2, 0, 3)]
    start = upstream.past_gaps(Frontier.of({1: 2}), lost)
    assert start == Frontier.of({0: 8, 1: 2, 2: 3})
    assert upstream.lost_ranges(Frontier.of({0: 5, 1: 9}), start, Frontier.of({0: 8, 1: 4, 2: 3})) == []


# --- epochs: a replaced upstream's offsets shifted by the offset base (engine/upstream.py) --------

@pytest.mark.parametrize("upstream_upper, base, gauge, committed", [
    ({0: 7}, {}, {0: 7}, {0: 7}),  # no epoch: the upstream's own offsets
    ({0: 20}, {0: 30}, {0: 50}, {0: 20}),  # g = b + u, and back
    ({}, {0: 30}, {0: 30}, {}),  # an empty new topic stands at the base; nothing to commit upstream
    ({0: 5}, {0: 30, 1: 3}, {0: 35, 1: 3}, {0: 5}),  # a partition the new topic lacks stays at its base
    ({0: 5, 2: 4}, {0: 30}, {0: 35, 2: 4}, {0: 5, 2: 4}),  # a partition new in it starts at 0
])
def test_epoch_frontiers(upstream_upper, base, gauge, committed):
    assert upstream.to_gauge(Frontier.of(upstream_upper), Frontier.of(base)) == Frontier.of(gauge)
    assert upstream.to_upstream(Frontier.of(gauge), Frontier.of(base)) == Frontier.of(committed)


def test_to_upstream_commits_nothing_of_an_earlier_epoch():
    assert upstream.to_upstream(Frontier.of({0: 12, 1: 9}), Frontier.of({0: 30, 1: 3})) == Frontier.of({1: 6})


@pytest.mark.parametrize("base, ranges, read, problems", [
    ({}, [(1, 0, 0, 5)], [(1, 0, 0, 5)], []),
    ({0: 30}, [(5, 0, 30, 42), (6, 0, 42, 50)], [(5, 0, 0, 12), (6, 0, 12, 20)], []),
    ({0: 30, 1: 3}, [(5, 1, 3, 4)], [(5, 1, 0, 1)], []),
    ({0: 30}, [(2, 0, 25, 35)], None,
     ["partition 0: offsets [25, 35) (IntoTime 2) are below the epoch's offset base 30: an earlier upstream's "
      "records, not the current one's"]),
    ({0: 30}, [(2, 0, 20, 20), (3, 0, 30, 30)], [], []),  # empty ranges read nothing
])
def test_ranges_read_from_the_current_upstream(base, ranges, read, problems):
    gauge = [Range(*r) for r in ranges]
    assert upstream.earlier_epoch_problems(gauge, Frontier.of(base)) == problems
    if read is not None:
        assert upstream.upstream_ranges(gauge, Frontier.of(base)) == [Range(*r) for r in read]


@pytest.mark.parametrize("bound, upper, released, same, lost_below", [
    ({0: 30}, {0: 35}, {0: 10}, True, {0: 10}),  # the same stream: what it released
    ({0: 30, 1: 5}, {0: 2}, {}, False, {0: 30, 1: 5}),  # replaced: none of what was bound
    ({0: 30, 1: 5}, {0: 40, 1: 2}, {0: 10}, True, {0: 10, 1: 5}),  # partition 1 ends below what was bound
])
def test_released_by(bound, upper, released, same, lost_below):
    assert upstream.released_by(Frontier.of(bound), Frontier.of(upper), Frontier.of(released), same) == \
        Frontier.of(lost_below)


@pytest.mark.parametrize("at_since, bound, committed, held, retired", [
    ({"a": 10, "b": 4}, {"a": 10, "b": 4}, {"a": 10, "b": 4}, {"b"}, {"a": 10}),  # a ended and is gone; b held
    ({"a": 10}, {"a": 12}, {"a": 12}, set(), {}),  # a moved after since: its last records are not folded yet
    ({"a": 10}, {"a": 10}, {"a": 7}, set(), {}),  # not committed whole: bound records not yet published
    ({"a": 10}, {"a": 10}, {"a": 10}, {"a"}, {}),  # still held (a file read whole and kept): live
    ({}, {"a": 3}, {"a": 3}, set(), {}),  # bound after since only
])
def test_retirable(at_since, bound, committed, held, retired):
    assert upstream.retirable(Frontier.of(at_since), Frontier.of(bound), Frontier.of(committed), held) == \
        Frontier.of(retired)


@pytest.mark.parametrize("upper, retired, seen, problems", [
    ({"a": 10, "b": 4}, {"a": 10}, {"b": 4}, []),  # a retired file back unchanged: hidden
    ({"a": 6, "b": 4}, {"a": 10}, {"b": 4}, []),  # a shorter copy of it: hidden
    ({"a": 12}, {"a": 10}, None, ["partition 'a' was retired at offset 10 (read whole, gone upstream, compacted) and "
                                  "is back with records up to 12"]),
    ({"b": 4}, {}, {"b": 4}, []),
])
def test_a_retired_partition_is_hidden_upstream(upper, retired, seen, problems):
    assert upstream.back_problems(Frontier.of(upper), Frontier.of(retired)) == problems
    if seen is not None:
        assert upstream.live(Frontier.of(upper), Frontier.of(retired)) == Frontier.of(seen)


@pytest.mark.parametrize("recorded, identity, bound, upper, problems", [
    ({"id": "a"}, {"id": "b"}, {0: 30}, {0: 40}, ["id was 'a' when remap's epoch began, now 'b'"]),
    ({"id": "a"}, {"id": "a"}, {0: 30}, {0: 3}, []),  # the same topic, truncated: not another stream
    (None, None, {0: 30}, {0: 3}, ["partition 0: upstream upper 3 is below the bound offset 30"]),
    (None, None, {0: 30}, {0: 31}, []),
])
def test_replacement_problems(recorded, identity, bound, upper, problems):
    assert upstream.replacement_problems(recorded, identity, Frontier.of(bound), Frontier.of(upper)) == problems


@pytest.mark.parametrize("unpublished, start, problems", [
    ([], {}, []),
    ([(2, 0, 30, 35)], {0: 35}, []),  # accepted as lost: the start moved past them
    ([(2, 0, 30, 35), (3, 1, 0, 2)], {0: 35}, ["partition 1: offsets [0, 2) bound at IntoTime 3 are not published"]),
])
def test_new_epoch_problems(unpublished, start, problems):
    assert upstream.new_epoch_problems([Range(*r) for r in unpublished], Frontier.of(start)) == problems


@pytest.mark.parametrize("start, since, began_at, replays", [
    (0, 0, 0, True),  # no epoch: anything from since
    (2_000, 0, 2_000, True),
    (1_999, 0, 2_000, False),  # an earlier epoch's window
    (3_000, 3_000, 2_000, False),  # the binding at since folds every epoch
    (3_001, 3_000, 2_000, True),
])
def test_replay_problem(start, since, began_at, replays):
    assert (upstream.replay_problem(start, since, began_at) is None) == replays
