"""Materialize CDC v2 (seed 004): a change stream robust to duplication and reordering.

:class:`Updates` carries distinct ``(data, time, diff)`` triples; :class:`Progress`
says the times beyond ``lower`` and not beyond ``upper`` hold exactly ``counts``
distinct updates (absent times: none).  Times are non-negative ints, or tuples of
them in the product order.  :func:`encode` writes a history as messages;
:class:`Decoder` reads any duplication and shuffle of them back, emitting each
update once, in time order, with the frontier it completes, and keeps only what
is not yet complete.  :func:`to_json` / :func:`from_json` are the wire form.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Union

from .frontier import Antichain, time_le


class CdcV2Error(ValueError):
    """A malformed message, or a stream that contradicts itself."""


def _seq(x: Any, what: str) -> tuple:
    if not isinstance(x, (tuple, list)):
        raise CdcV2Error(f"{what} must be a tuple or list, got {type(x).__name__}: {x!r}")
    return tuple(x)


def _int(x: Any, what: str, zero_ok: bool = True) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < 0 or (x == 0 and not zero_ok):
        raise CdcV2Error(f"{what} must be a {'non-negative' if zero_ok else 'positive'} int, got {x!r}")
    return x


def _time(t: Any) -> Any:
    """A non-negative int, or a non-empty tuple of them (lists accepted)."""
    if isinstance(t, (tuple, list)) and t:
        return tuple(_int(x, "time coordinate") for x in t)
    return _int(t, "time")


def _shape(t: Any) -> int:
    return len(t) if isinstance(t, tuple) else 0


def _same_shape(times: Iterable[Any], what: str) -> None:
    shapes = {_shape(t) for t in times}
    if len(shapes) > 1:
        raise CdcV2Error(f"{what} mixes times of different shapes (0 = int, n = n-tuple): {sorted(shapes)}")


def _update(u: Any, zero_ok: bool = False) -> tuple:
    if not isinstance(u, (tuple, list)) or len(u) != 3:
        raise CdcV2Error(f"an update must be (data, time, diff), got {u!r}")
    data, time, diff = u
    try:
        hash(data)
    except TypeError:
        raise CdcV2Error(f"update data must be hashable, got {data!r}") from None
    if isinstance(diff, bool) or not isinstance(diff, int) or (diff == 0 and not zero_ok):
        raise CdcV2Error(f"update diff must be a non-zero int, got {diff!r}")
    return (data, _time(time), diff)


def _antichain(times: Any, what: str) -> tuple:
    ts = [_time(t) for t in _seq(times, what)]
    _same_shape(ts, what)
    if len(Antichain.of(ts).elements) != len(ts):
        raise CdcV2Error(f"{what} must be an antichain (no repeated or comparable times): {ts}")
    return tuple(sorted(ts))


@dataclass(frozen=True)
class Updates:
    """A batch of update statements: ``data`` changes by ``diff`` (non-zero) at ``time``."""

    updates: tuple = ()

    def __post_init__(self) -> None:
        ups = tuple(_update(u) for u in _seq(self.updates, "updates"))
        _same_shape((u[1] for u in ups), "updates")
        object.__setattr__(self, "updates", ups)


@dataclass(frozen=True)
class Progress:
    """Times beyond ``lower`` and not beyond ``upper`` hold exactly ``counts`` distinct updates."""

    lower: tuple
    upper: tuple
    counts: tuple = ()

    def __post_init__(self) -> None:
        lower, upper = _antichain(self.lower, "lower"), _antichain(self.upper, "upper")
        counts: dict = {}
        for c in _seq(self.counts, "counts"):
            if not isinstance(c, (tuple, list)) or len(c) != 2 or _time(c[0]) in counts:
                raise CdcV2Error(f"a count must be (time, count), one per time, got {c!r}")
            counts[_time(c[0])] = _int(c[1], "count")
        _same_shape(lower + upper + tuple(counts), "progress")
        lo, up = Antichain.of(lower), Antichain.of(upper)
        if not lo.less_equal(up):
            raise CdcV2Error(f"upper {upper} is not beyond lower {lower}")
        for t in counts:
            if not lo.beyond(t) or up.beyond(t):
                raise CdcV2Error(f"count at time {t} lies outside the interval [{lower}, {upper})")
        for name, value in (("lower", lower), ("upper", upper), ("counts", tuple(sorted((t, n) for t, n in counts.items() if n)))):
            object.__setattr__(self, name, value)


Message = Union[Updates, Progress]


def encode(history: Iterable, upper: tuple, lower: tuple | None = None,
           batch_size: int = 1024) -> list[Message]:
    """Messages for ``history`` over the times beyond ``lower`` and not beyond ``upper``.

    The history is consolidated (diffs summed per ``(data, time)``, zeros dropped).
    ``lower`` defaults to the least time, ``0`` or ``(0, ..., 0)``; an empty ``upper``
    finishes the stream.  ``Updates`` hold at most ``batch_size`` updates; each
    ``Progress`` covers whole times, about ``batch_size`` updates' worth.  A sink
    can encode one interval ``[lower, upper)`` after another.
    """
    _int(batch_size, "batch_size", zero_ok=False)
    ups, acc, by_time = _antichain(upper, "upper"), {}, {}
    for d, t, r in (_update(u, zero_ok=True) for u in _seq(list(history), "history")):
        acc[(d, t)] = acc.get((d, t), 0) + r
    for (d, t), r in acc.items():
        if r:
            by_time.setdefault(t, []).append((d, t, r))
    if lower is None:
        first = next(iter(list(by_time) + list(ups)), 0)
        lower = (tuple(0 for _ in first) if isinstance(first, tuple) else 0,)
    lows = _antichain(lower, "lower")
    _same_shape(list(by_time) + list(ups) + list(lows), "history, lower and upper")
    lo, up = Antichain.of(lows), Antichain.of(ups)
    if not lo.less_equal(up):
        raise CdcV2Error(f"upper {ups} is not beyond lower {lows}")
    chunks, size = [[]], 0
    for t in sorted(by_time):  # lexicographic order extends the product order
        if not lo.beyond(t) or up.beyond(t):
            raise CdcV2Error(f"history time {t} lies outside the interval [{lows}, {ups})")
        if size >= batch_size:
            chunks.append([])
            size = 0
        chunks[-1].append(t)
        size += len(by_time[t])
    # The edge before a chunk: minimal elements of upper and of its and later times (monotone).
    edges, suffix = [ups], list(ups)
    for chunk in reversed(chunks[1:]):
        for t in reversed(chunk):
            suffix = [t] + [e for e in suffix if not time_le(t, e)]
        edges.append(tuple(sorted(suffix)))
    edges = [lows] + edges[::-1]
    out: list[Message] = []
    for chunk, start, end in zip(chunks, edges, edges[1:]):
        batch = [u for t in chunk for u in sorted(by_time[t], key=repr)]
        out += [Updates(tuple(batch[j:j + batch_size])) for j in range(0, len(batch), batch_size)]
        if chunk or start != end:
            out.append(Progress(start, end, tuple((t, len(by_time[t])) for t in chunk)))
    return out


class Decoder:
    """Push-based recovery of a history from a duplicated, reordered CDC v2 stream.

    ``initial`` is the frontier already recovered: ``(0,)`` for int times,
    ``((0, 0),)`` for pairs, or a later frontier to resume a reader.
    """

    def __init__(self, initial: tuple = (0,)) -> None:
        self._reported = self._progress = Antichain.of(_antichain(initial, "initial"))
        self._shape = next((_shape(t) for t in self._reported.elements), None)
        self._updates: dict[Any, set] = {}  # time -> distinct updates received, beyond the frontier
        self._outstanding: dict[Any, int] = {}  # time -> announced minus received (non-zero only)
        self._queue: list[Progress] = []  # progress statements whose lower is not yet covered
        self._dirty = False
        self._failed: str | None = None

    @property
    def frontier(self) -> Antichain:
        """All updates at times not beyond this frontier have been emitted."""
        return self._reported

    @property
    def pending(self) -> int:
        """Items held in memory: retained updates, outstanding counts, queued progress statements."""
        return sum(map(len, self._updates.values())) + len(self._outstanding) + len(self._queue)

    def push(self, message: Message) -> list[tuple[list, Antichain]]:
        """Take one message; return ``[(updates, frontier)]`` when the frontier advances, else ``[]``."""
        if self._failed:
            raise CdcV2Error(f"decoder stopped after an inconsistent stream: {self._failed}")
        if not isinstance(message, (Updates, Progress)):
            raise CdcV2Error(f"not a CDC v2 message: {message!r}")
        times = [u[1] for u in message.updates] if isinstance(message, Updates) else \
            [*message.lower, *message.upper, *(t for t, _ in message.counts)]
        if self._shape is not None and {_shape(t) for t in times} - {self._shape}:
            raise CdcV2Error(f"times {times} do not have the decoder's shape {self._shape} (0 = int)")
        if isinstance(message, Updates):
            for u in message.updates:
                if self._reported.beyond(u[1]) and u not in self._updates.get(u[1], ()):
                    self._updates.setdefault(u[1], set()).add(u)
                    self._bump(u[1], -1)
                    self._check(u[1])
        else:
            self._queue.append(message)
            self._drain()
        return self._advance()

    def _bump(self, time: Any, delta: int) -> None:
        n = self._outstanding.get(time, 0) + delta
        if n:
            self._outstanding[time] = n
        else:
            self._outstanding.pop(time, None)
            self._dirty = True

    def _check(self, time: Any) -> None:
        """Once a time's count is known, more distinct updates than it is a contradiction."""
        if self._outstanding.get(time, 0) < 0 and not self._progress.beyond(time):
            self._failed = f"more distinct updates at time {time} than its progress count"
            raise CdcV2Error(self._failed)

    def _drain(self) -> None:
        """Apply queued progress statements whose lower the progress frontier covers."""
        before, ready = self._progress, lambda p: Antichain.of(p.lower).less_equal(self._progress)
        while (i := next((i for i, p in enumerate(self._queue) if ready(p)), None)) is not None:
            p = self._queue.pop(i)
            for t, n in p.counts:
                if self._progress.beyond(t):  # counts not beyond it were applied already
                    self._bump(t, n)
            self._progress = self._progress.join(Antichain.of(p.upper))
        if self._progress != before:
            self._dirty = True
            for t in list(self._outstanding):
                self._check(t)

    def _advance(self) -> list[tuple[list, Antichain]]:
        """Emit retained updates at times the new frontier completes, and forget them."""
        if not self._dirty:
            return []
        self._dirty = False
        new = self._progress.meet(Antichain.of(self._outstanding))  # outstanding holds non-zero only
        if new == self._reported:
            return []
        self._reported = new
        done = sorted(t for t in self._updates if not new.beyond(t))
        return [([u for t in done for u in sorted(self._updates.pop(t), key=repr)], new)]


def decode(messages: Iterable[Message], initial: tuple = (0,)) -> Iterator[tuple[list, Antichain]]:
    """Feed ``messages`` through a :class:`Decoder`, yielding each ``(updates, frontier)``."""
    decoder = Decoder(initial)
    for message in messages:
        yield from decoder.push(message)


def to_json(message: Message) -> str:
    """One message as compact JSON: ``{"updates": [[data, time, diff], ...]}`` or
    ``{"progress": {"lower": [...], "upper": [...], "counts": [[time, n], ...]}}``."""
    if isinstance(message, Updates):
        obj: dict = {"updates": message.updates}
    elif isinstance(message, Progress):
        obj = {"progress": {"lower": message.lower, "upper": message.upper, "counts": message.counts}}
    else:
        raise CdcV2Error(f"not a CDC v2 message: {message!r}")
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise CdcV2Error(f"message is not JSON-serialisable: {e}") from None


def _freeze(x: Any) -> Any:
    return tuple(_freeze(y) for y in x) if isinstance(x, list) else x


def from_json(text: str | bytes) -> Message:
    """Parse :func:`to_json` output; JSON arrays become tuples (times and data alike)."""
    try:
        obj = json.loads(text)
    except (TypeError, ValueError) as e:
        raise CdcV2Error(f"invalid JSON: {e}") from None
    if isinstance(obj, dict) and set(obj) == {"updates"}:
        return Updates(_freeze(obj["updates"]))
    if isinstance(obj, dict) and set(obj) == {"progress"} and isinstance(obj["progress"], dict) \
            and set(obj["progress"]) == {"lower", "upper", "counts"}:
        p = obj["progress"]
        return Progress(_freeze(p["lower"]), _freeze(p["upper"]), _freeze(p["counts"]))
    raise CdcV2Error(f'expected {{"updates": ...}} or {{"progress": {{"lower", "upper", "counts"}}}}, got {text[:200]!r}')
