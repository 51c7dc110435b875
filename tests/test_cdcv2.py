"""CDC v2 (seed 004): encode, then duplicate and shuffle, then decode back exactly."""
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from reclock.engine.cdcv2 import (
    CdcV2Error, Decoder, Progress, Updates, decode, encode, from_json, to_json,
)
from reclock.engine.frontier import Antichain

SETTINGS = settings(max_examples=200, deadline=None)
DATA = st.one_of(st.integers(0, 4), st.sampled_from(["a", "b", "c"]), st.tuples(st.integers(0, 2), st.text("xy", max_size=2)))


def consolidate(updates):
    acc = Counter()
    for d, t, r in updates:
        acc[(d, t)] += r
    return {k: v for k, v in acc.items() if v}


@st.composite
def int_case(draw):
    upper = draw(st.one_of(st.just(()), st.integers(0, 16).map(lambda u: (u,))))
    hist = draw(st.lists(st.tuples(DATA, st.integers(0, 10), st.integers(-2, 2)), min_size=4, max_size=40))
    return [u for u in hist if not upper or u[1] < upper[0]], upper, (0,)


@st.composite
def pair_case(draw):
    coord = st.integers(0, 4)
    upper = tuple(Antichain.of(draw(st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6)), max_size=3))))
    hist = draw(st.lists(st.tuples(DATA, st.tuples(coord, coord), st.integers(-2, 2)), min_size=4, max_size=40))
    return [u for u in hist if not Antichain.of(upper).beyond(u[1])], upper, ((0, 0),)


@st.composite
def mangled(draw, case):
    """A case, its encoding, and a shuffled stream where every message appears at least once."""
    hist, upper, initial = draw(case)
    msgs = encode(hist, upper, lower=initial, batch_size=draw(st.integers(1, 5)))
    extra = draw(st.lists(st.sampled_from(msgs), max_size=len(msgs))) if msgs else []
    stream = draw(st.permutations(msgs + extra))
    return hist, upper, initial, msgs, stream


def run(stream, initial):
    """Decode, checking the invariants after every message; return emitted updates and the decoder."""
    dec, emitted, frontier = Decoder(initial), [], Antichain.of(initial)
    for msg in stream:
        for batch, new in dec.push(msg):
            assert frontier.less_equal(new) and new != frontier  # frontiers only advance
            for _, t, _ in batch:
                assert frontier.beyond(t) and not new.beyond(t)
            assert [u[1] for u in batch] == sorted(u[1] for u in batch)  # time order
            emitted += batch
            frontier = new
        assert dec.frontier == frontier
    assert len(emitted) == len(set(emitted))  # no update emitted twice
    return emitted, dec


@pytest.mark.parametrize("case", [int_case(), pair_case()], ids=["int", "pair"])
def test_mangled_stream_decodes_exactly(case):
    @SETTINGS
    @given(mangled(case), st.booleans())
    def check(m, via_json):
        hist, upper, initial, _, stream = m
        if via_json:
            stream = [from_json(to_json(msg)) for msg in stream]
        emitted, dec = run(stream, initial)
        assert consolidate(emitted) == consolidate(hist)
        assert dec.frontier == Antichain.of(upper)
        assert dec.pending == 0

    check()


@pytest.mark.parametrize("case", [int_case(), pair_case()], ids=["int", "pair"])
def test_partial_stream_emits_exactly_what_is_complete(case):
    @SETTINGS
    @given(mangled(case), st.data())
    def check(m, data):
        hist, upper, initial, _, stream = m
        kept = [msg for msg in stream if data.draw(st.booleans())]
        emitted, dec = run(kept, initial)
        done = {k: v for k, v in consolidate(hist).items() if not dec.frontier.beyond(k[1])}
        assert consolidate(emitted) == done
        # memory: only updates beyond the frontier are retained
        assert all(dec.frontier.beyond(t) for t in dec._updates)

    check()


def test_seed_example():
    hist = [("record0", 0, 1), ("record1", 0, 1), ("record2", 0, 1),
            ("record1", 1, -1), ("record4", 1, 1), ("record0", 2, -1), ("record4", 2, -1)]
    stream = [Updates((u,)) for u in hist] + [
        Progress((0,), (1,), ((0, 3),)), Progress((1,), (2,), ((1, 2),)),
        Progress((2,), (3,), ((2, 2),)), Progress((3,), (4,))]
    dec, out = Decoder(), []
    for msg in reversed(stream + stream[::2]):
        out += dec.push(msg)
    assert [b for b, _ in out] == [hist]  # one batch, in time order
    assert out[0][1] == Antichain.of([4]) and dec.pending == 0
    # in order, each finish statement releases its time
    out = list(decode([stream[0], stream[1], stream[2], stream[7], stream[3], stream[4], stream[8]]))
    assert [(len(b), tuple(f)) for b, f in out] == [(3, (1,)), (2, (2,))]
    assert list(decode(encode(hist, (3,)))) and encode(hist, (3,)) == encode(reversed(hist), (3,))


def test_pending_counts_retained_updates_until_complete():
    dec = Decoder()
    assert dec.push(Updates((("a", 5, 1), ("b", 5, 1), ("a", 5, 1)))) == []
    assert dec.pending == 2 + 1  # two retained updates, one outstanding count
    assert dec.push(Progress((3,), (6,), ((5, 2),))) == []  # queued: lower not covered yet
    assert dec.pending == 4
    out = dec.push(Progress((0,), (3,)))
    assert out == [([("a", 5, 1), ("b", 5, 1)], Antichain.of([6]))] and dec.pending == 0
    assert dec.push(Updates((("a", 5, 1),))) == [] and dec.pending == 0  # late duplicate dropped


def test_incremental_sink_and_resumed_reader():
    h1, h2 = [("x", 1, 1), ("y", 4, 1)], [("x", 7, -1)]
    msgs = encode(h1, (5,)) + encode(h2, (10,), lower=(5,))
    assert consolidate(u for b, _ in decode(msgs[::-1]) for u in b) == consolidate(h1 + h2)
    assert [b for b, _ in decode(msgs, initial=(5,))] == [[("x", 7, -1)]]
    assert list(decode(encode([], (3,)))) == [([], Antichain.of([3]))]


def test_pair_times_partial_order():
    # (0,1) and (1,0) are incomparable: completing one does not wait on the other
    dec = Decoder(((0, 0),))
    dec.push(Updates((("a", (0, 1), 1), ("b", (1, 0), 1))))
    out = dec.push(Progress(((0, 0),), ((0, 2), (1, 0)), (((0, 1), 1),)))
    assert out == [([("a", (0, 1), 1)], Antichain.of([(0, 2), (1, 0)]))]
    out = dec.push(Progress(((0, 2), (1, 0)), (), (((1, 0), 1),)))
    assert out == [([("b", (1, 0), 1)], Antichain())] and dec.pending == 0


@pytest.mark.parametrize("make", [
    lambda: Updates("abc"), lambda: Updates([(1, 2)]), lambda: Updates([("a", 1.5, 1)]),
    lambda: Updates([("a", True, 1)]), lambda: Updates([("a", -1, 1)]), lambda: Updates([("a", 1, 0)]), lambda: Updates([("a", 1, True)]),
    lambda: Updates([(["unhashable"], 1, 1)]), lambda: Updates([("a", 1, 1), ("b", (1, 2), 1)]),
    lambda: Progress((3,), (2,)), lambda: Progress((0,), (5,), ((1, -1),)),
    lambda: Progress((0,), (5,), ((7, 1),)), lambda: Progress((0,), (5,), ((1, 1), (1, 2))), lambda: Progress((0,), (5,), ((1, 0), (1, 2))),
    lambda: Progress((0, 1), (5,)), lambda: Progress(((0, 0),), ((1, 1), (2, 2))),
    lambda: Progress((0,), ((1, 1),)), lambda: Progress(0, (1,)), lambda: Progress((0,), (1,), ((0,),)),
    lambda: Decoder().push(("a", 1, 1)), lambda: Decoder().push(Updates((("a", (1, 1), 1),))),
    lambda: encode([("a", 5, 1)], (3,)), lambda: encode([("a", 1, 1)], (3,), lower=(2,)),
    lambda: encode([], (3,), batch_size=0), lambda: to_json(Updates(((frozenset(), 1, 1),))),
    lambda: from_json("{"), lambda: from_json('{"updates": [["a", 1.0, 1]]}'),
    lambda: from_json('{"nope": []}'), lambda: from_json('{"updates": [[{"k": 1}, 1, 1]]}'),
    lambda: from_json('{"progress": {"lower": [0], "upper": [1]}}'),
])
def test_malformed_input_is_rejected(make):
    with pytest.raises(CdcV2Error):
        make()


@pytest.mark.parametrize("order", [0, 1])
def test_more_updates_than_count_is_an_error(order):
    msgs = [Progress((0,), (2,), ((1, 1),)), Updates((("a", 1, 1), ("b", 1, 1)))]
    dec = Decoder()
    with pytest.raises(CdcV2Error, match="more distinct updates"):
        for m in msgs[order:] + msgs[:order]:
            dec.push(m)
    with pytest.raises(CdcV2Error, match="stopped"):
        dec.push(Progress((2,), (3,)))
    with pytest.raises(CdcV2Error, match="more distinct updates"):  # a time with no count holds none
        list(decode([Updates((("a", 0, 1),)), Progress((0,), (2,))]))
    # once a time is complete its updates are forgotten: a late stray cannot be told from a duplicate
    assert list(decode([Progress((0,), (2,)), Updates((("a", 0, 1),))])) == [([], Antichain.of([2]))]


def test_json_round_trip():
    for msg in [Updates((("a", 1, 1), (("t", 2), 3, -2), (None, 0, 1))),
                Progress(((0, 0),), ((1, 2), (3, 0)), (((0, 1), 4),)), Progress((2,), ())]:
        assert from_json(to_json(msg)) == msg and hash(from_json(to_json(msg).encode())) == hash(msg)
    assert to_json(Progress([1], [3], [[2, 5]])) == '{"progress":{"lower":[1],"upper":[3],"counts":[[2,5]]}}'
