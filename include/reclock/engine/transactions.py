"""Transactions over two reclocked inputs: data and transaction metadata (seed 000's addendum, seed 001).

Debezium writes change events to data topics and, with transaction metadata on, a
``BEGIN`` and an ``END`` record per transaction to a single-partition transaction
topic; ``END`` carries ``event_count`` and the per-collection counts
``data_collections``.  Both topics are reclocked as ordinary sources, so every
record arrives stamped with an IntoTime.  This module turns the two reclocked
streams into seed 000's *order-respecting* pair of collections:

* **output**: the data events of transaction ``T`` at the first IntoTime at which
  ``T`` and every transaction before it (order of ``BEGIN`` in the transaction
  topic, i.e. by ``(partition, offset)``) are complete: ``END`` seen and exactly
  ``event_count`` data events seen (seed 001: "maintain the order of transactions
  as determined by the transactional metadata topic");
* **TEMP** (:class:`TxState`): every data and transaction record seen so far that
  is not in the output, plus the ids of published transactions (so that a reused
  id or a late extra event is an error rather than a silent new transaction).

:func:`step` is the whole algorithm: a deterministic function of the state as of
the previous IntoTime and the records that arrived at this one.  Hence the summary
property of seed 000: restarting from the TEMP state at any IntoTime ``t`` with
the inputs beyond ``remap[t]`` yields the same future output as never stopping.
A transaction's publish time is ``max`` over it and its predecessors of the
IntoTime of their last record, whatever the batching (see :func:`publish_times`).

TEMP as a collection varying with IntoTime is :func:`temp_updates`: at each
IntoTime, ``+1`` for records entering TEMP and ``-1`` for records published;
:meth:`TxState.from_updates` rebuilds the state as of any IntoTime.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Hashable, Iterable, Mapping, NamedTuple, Union

from .frontier import Partition

BEGIN, END = "BEGIN", "END"


class TransactionError(ValueError):
    """Transaction metadata or data that cannot be put in order; nothing is changed."""


class DataEvent(NamedTuple):
    """A data record at ``(partition, offset)`` of the data topic, in transaction ``tx_id``."""

    tx_id: str
    collection: str
    partition: Partition
    offset: int
    payload: Hashable = None  # the record itself, opaque here

    @property
    def position(self) -> tuple[Partition, int]:
        return (self.partition, self.offset)


class TxEvent(NamedTuple):
    """A ``BEGIN`` or ``END`` record at ``(partition, offset)`` of the transaction topic."""

    status: str
    tx_id: str
    partition: Partition
    offset: int
    event_count: int | None = None  # END only
    data_collections: tuple[tuple[str, int], ...] | None = None  # END only: ((collection, count), ...)
    payload: Hashable = None

    @property
    def position(self) -> tuple[Partition, int]:
        return (self.partition, self.offset)


class PublishedId(NamedTuple):
    """TEMP bookkeeping: transaction ``tx_id`` has been published (its id may not come again)."""

    tx_id: str


TempRecord = Union[DataEvent, TxEvent, PublishedId]


class PublishedTx(NamedTuple):
    """Transaction ``tx_id`` published at ``into_time`` with its data events (in data-topic position order)."""

    into_time: int
    tx_id: str
    events: tuple[DataEvent, ...]


@dataclass(frozen=True)
class TxState:
    """The TEMP state: unpublished data and transaction records, and the ids already published."""

    data: frozenset[DataEvent] = field(default_factory=frozenset)
    txs: frozenset[TxEvent] = field(default_factory=frozenset)
    published: frozenset[str] = field(default_factory=frozenset)

    def records(self) -> frozenset[TempRecord]:
        """TEMP as a set of records (what :func:`temp_updates` and the durable table hold)."""
        return self.data | self.txs | frozenset(PublishedId(i) for i in self.published)

    @classmethod
    def from_records(cls, records: Iterable[TempRecord]) -> "TxState":
        data, txs, published = set(), set(), set()
        for r in records:
            if isinstance(r, DataEvent):
                data.add(r)
            elif isinstance(r, TxEvent):
                txs.add(r)
            elif isinstance(r, PublishedId):
                published.add(r.tx_id)
            else:
                raise TypeError(f"not a TEMP record: {r!r}")
        return cls(frozenset(data), frozenset(txs), frozenset(published))

    @classmethod
    def from_updates(cls, updates: Iterable[tuple[TempRecord, int, int]], as_of: int | None = None) -> "TxState":
        """The state as of IntoTime ``as_of`` (default: all) from ``(record, into_time, diff)`` updates."""
        total: Counter = Counter()
        for record, into_time, diff in updates:
            if as_of is None or into_time <= as_of:
                total[record] += diff
        bad = {r: n for r, n in total.items() if n not in (0, 1)}
        if bad:
            raise TransactionError(f"TEMP updates do not consolidate to a set: {_sample(bad)}")
        return cls.from_records(r for r, n in total.items() if n == 1)

    def pending(self) -> list[str]:
        """Ids of begun, unpublished transactions, in transaction order."""
        return [t.tx_id for t in sorted((t for t in self.txs if t.status == BEGIN), key=_position)]


EMPTY = TxState()


def step(state: TxState, new_data: Iterable[DataEvent], new_tx: Iterable[TxEvent],
         into_time: int) -> tuple[list[PublishedTx], TxState]:
    """Add the records that arrived at ``into_time``; publish every transaction now complete in order.

    Returns the transactions published at ``into_time`` (in transaction order) and the TEMP
    state as of ``into_time``.  :class:`TransactionError` for malformed metadata: END
    without BEGIN, more events than ``event_count`` (in total or per collection, or after
    the transaction was published), a reused transaction id, a record seen twice.
    """
    new_data, new_tx = list(new_data), sorted(new_tx, key=_position)
    for tx in new_tx:
        _check_tx_fields(tx)
    _check_unique("data event", state.data, new_data)
    _check_unique("transaction record", state.txs, new_tx)

    begins: dict[str, TxEvent] = {}
    ends: dict[str, TxEvent] = {}
    for tx in sorted(state.txs, key=_position):
        (begins if tx.status == BEGIN else ends)[tx.tx_id] = tx
    for tx in new_tx:
        where = f"{tx.status} of transaction {tx.tx_id!r} at {_at(tx)}"
        if tx.tx_id in state.published:
            raise TransactionError(f"transaction id reused: {where}, but {tx.tx_id!r} was already published")
        if tx.status == BEGIN:
            if tx.tx_id in begins:
                raise TransactionError(f"transaction id reused: {where}, but it already began at "
                                       f"{_at(begins[tx.tx_id])}")
            begins[tx.tx_id] = tx
        else:
            begin = begins.get(tx.tx_id)
            if begin is None or _position(begin) > _position(tx):
                raise TransactionError(f"END without BEGIN: {where}")
            if tx.tx_id in ends:
                raise TransactionError(f"transaction id reused: {where}, but it already ended at "
                                       f"{_at(ends[tx.tx_id])}")
            ends[tx.tx_id] = tx
    for d in new_data:
        if d.tx_id in state.published:
            raise TransactionError(f"more events than event_count: data event at {_at(d)} belongs to "
                                   f"transaction {d.tx_id!r}, already published complete")

    data = state.data | frozenset(new_data)
    per_tx: dict[str, Counter] = defaultdict(Counter)
    events_of: dict[str, list[DataEvent]] = defaultdict(list)
    for d in data:
        per_tx[d.tx_id][d.collection] += 1
        events_of[d.tx_id].append(d)
    for tx_id, end in ends.items():
        _check_counts(end, per_tx.get(tx_id, Counter()))

    published, done = [], set()
    for begin in sorted(begins.values(), key=_position):
        end = ends.get(begin.tx_id)
        if end is None or sum(per_tx.get(begin.tx_id, Counter()).values()) != end.event_count:
            break  # incomplete: it and everything after it wait
        done.add(begin.tx_id)
        published.append(PublishedTx(into_time, begin.tx_id, tuple(sorted(events_of[begin.tx_id], key=_position))))
    after = TxState(frozenset(d for d in data if d.tx_id not in done),
                    frozenset(t for t in list(begins.values()) + list(ends.values()) if t.tx_id not in done),
                    state.published | done)
    return published, after


Batch = tuple[int, Iterable[DataEvent], Iterable[TxEvent]]


def fold(batches: Iterable[Batch], state: TxState = EMPTY) -> tuple[list[PublishedTx], TxState]:
    """:func:`step` over ``(into_time, new_data, new_tx)`` batches in strictly increasing IntoTime."""
    out: list[PublishedTx] = []
    previous = None
    for into_time, new_data, new_tx in batches:
        if previous is not None and into_time <= previous:
            raise TransactionError(f"IntoTimes must strictly increase: {into_time} after {previous}")
        published, state = step(state, new_data, new_tx, into_time)
        out += published
        previous = into_time
    return out, state


def fold_with_updates(batches: Iterable[Batch], state: TxState = EMPTY
                      ) -> tuple[list[PublishedTx], list[tuple[TempRecord, int, int]], TxState]:
    """:func:`fold` that also returns TEMP's ``(record, into_time, diff)`` updates at each IntoTime."""
    out: list[PublishedTx] = []
    updates: list[tuple[TempRecord, int, int]] = []
    for batch in batches:
        published, after = fold([batch], state)
        out += published
        updates += temp_updates(state, after, batch[0])
        state = after
    return out, updates, state


def temp_updates(before: TxState, after: TxState, into_time: int) -> list[tuple[TempRecord, int, int]]:
    """TEMP's change at ``into_time``: ``(record, into_time, +1)`` entering, ``-1`` leaving; sorted."""
    old, new = before.records(), after.records()
    return sorted([(r, into_time, 1) for r in new - old] + [(r, into_time, -1) for r in old - new], key=_record_key)


def batches(data: Iterable[tuple[int, DataEvent]], txs: Iterable[tuple[int, TxEvent]]) -> list[Batch]:
    """Group IntoTime-stamped records into :func:`fold` batches, one per IntoTime with records."""
    by_time: dict[int, tuple[list, list]] = defaultdict(lambda: ([], []))
    for into_time, d in data:
        by_time[into_time][0].append(d)
    for into_time, t in txs:
        by_time[into_time][1].append(t)
    return [(t, *by_time[t]) for t in sorted(by_time)]


def publish_times(data: Iterable[tuple[int, DataEvent]], txs: Iterable[tuple[int, TxEvent]]) -> dict[str, int]:
    """The closed form of the output for well-formed input: transaction id -> publish IntoTime.

    A transaction is ready at the IntoTime of the last of its records (BEGIN, END, data);
    it is published at the greatest ready time of it and all transactions before it,
    provided all of them are complete.  (A reference for tests; :func:`step` is the algorithm.)
    """
    data, txs = list(data), list(txs)
    ready: dict[str, int] = {}
    complete: dict[str, bool] = {}
    counts = Counter(d.tx_id for _, d in data)
    for t, tx in txs:
        ready[tx.tx_id] = max(ready.get(tx.tx_id, t), t)
        if tx.status == END:
            complete[tx.tx_id] = counts[tx.tx_id] == tx.event_count
    for t, d in data:
        if d.tx_id in ready:
            ready[d.tx_id] = max(ready[d.tx_id], t)
    out, latest = {}, None
    for _, begin in sorted(((t, tx) for t, tx in txs if tx.status == BEGIN), key=lambda p: _position(p[1])):
        if not complete.get(begin.tx_id):
            break
        latest = ready[begin.tx_id] if latest is None else max(latest, ready[begin.tx_id])
        out[begin.tx_id] = latest
    return out


# --- checks -------------------------------------------------------------------------------------


def _check_tx_fields(tx: TxEvent) -> None:
    where = f"transaction record at {_at(tx)}"
    if tx.status not in (BEGIN, END):
        raise TransactionError(f"{where}: status must be BEGIN or END, got {tx.status!r}")
    if not isinstance(tx.tx_id, str) or not tx.tx_id:
        raise TransactionError(f"{where}: transaction id must be a non-empty string, got {tx.tx_id!r}")
    if tx.status == BEGIN:
        return
    count = tx.event_count
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise TransactionError(f"END of {tx.tx_id!r} at {_at(tx)}: event_count must be a non-negative int, "
                               f"got {count!r}")
    if tx.data_collections is None:
        return
    names = [c for c, _ in tx.data_collections]
    if len(set(names)) != len(names):
        raise TransactionError(f"END of {tx.tx_id!r} at {_at(tx)}: data_collections repeats a collection: {names}")
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for _, n in tx.data_collections):
        raise TransactionError(f"END of {tx.tx_id!r} at {_at(tx)}: data_collections counts must be "
                               f"non-negative ints: {tx.data_collections}")
    if sum(n for _, n in tx.data_collections) != count:
        raise TransactionError(f"END of {tx.tx_id!r} at {_at(tx)}: data_collections counts "
                               f"{dict(tx.data_collections)} do not add up to event_count {count}")


def _check_counts(end: TxEvent, seen: Mapping[str, int]) -> None:
    total = sum(seen.values())
    if total > end.event_count:
        raise TransactionError(f"more events than event_count: transaction {end.tx_id!r} has event_count "
                               f"{end.event_count} but {total} data events were seen")
    if end.data_collections is None:
        return
    expected = dict(end.data_collections)
    for collection, n in seen.items():
        if n > expected.get(collection, 0):
            raise TransactionError(
                f"more events than event_count: transaction {end.tx_id!r} has {n} data events of collection "
                f"{collection!r} but its END counts {expected.get(collection, 0)} (data_collections {expected})")


def _check_unique(what: str, old: Iterable, new: list) -> None:
    seen = {_position(r) for r in old}
    for r in new:
        if _position(r) in seen:
            raise TransactionError(f"{what} at {_at(r)} seen twice")
        seen.add(_position(r))


def _position(r) -> tuple:
    return (r.partition, r.offset)


def _at(r) -> str:
    return f"partition {r.partition} offset {r.offset}"


def _record_key(update: tuple[TempRecord, int, int]) -> tuple:
    record, _, diff = update
    return (type(record).__name__, record.tx_id, getattr(record, "partition", 0),
            getattr(record, "offset", 0), diff)


def _sample(bad: Mapping) -> str:
    items = list(bad.items())
    return ", ".join(f"{r!r}: {n}" for r, n in items[:3]) + (f" (+{len(items) - 3} more)" if len(items) > 3 else "")
