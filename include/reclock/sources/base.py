"""What every upstream source offers reclock: its upper frontier, exact reads by offset range, upstream commit."""
from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Protocol

if TYPE_CHECKING:  # annotations only: the sources file's validation (every DAG parse) imports this module
    import pyarrow as pa

from ..engine import Frontier, FrontierError, Partition


class SourceError(RuntimeError):
    """The upstream is unreachable, went backwards, or returned something reclock cannot accept."""


#: What a source does with a record it cannot decode (``on_bad_record`` of the sources file): stop (the
#: step fails naming source, partition and offset), or put it in its dead-letter table and go on.
ON_BAD_RECORD = ("fail", "dead_letter")


@dataclass(frozen=True)
class BadRecord:
    """A record a source could not decode, yielded by ``read(..., on_bad_record="dead_letter")`` in place of
    its data: its raw bytes and why (one line naming the source, partition and offset)."""

    raw: bytes
    error: str


def reads_bad_records(source: "Source") -> bool:
    """Whether ``source.read`` takes ``on_bad_record="dead_letter"`` (its class sets ``reads_bad_records``)."""
    return bool(getattr(source, "reads_bad_records", False))


def check_range(start: int, end: int, unit: str = "offset") -> None:
    """Refuse a read range that is not ints with ``0 <= start <= end``."""
    for name, value in (("start", start), ("end", end)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SourceError(f"{name} {unit} must be an int >= 0, got {value!r}")
    if end < start:
        raise SourceError(f"range end {end} is before start {start}")


def arrow(make) -> "_ArrowAttribute":
    """A source class's attribute of pyarrow types (``partition_type``, ``data_schema``), made on first use by
    ``make(pyarrow)`` and then stored on the class: reading a source class's options (the sources file's
    validation, every DAG parse) does not import pyarrow."""
    return _ArrowAttribute(make)


class _ArrowAttribute:
    def __init__(self, make) -> None:
        self._make = make

    def __set_name__(self, owner, name: str) -> None:
        self._name = name

    def __get__(self, instance, owner):
        import pyarrow

        value = self._make(pyarrow)
        setattr(owner, self._name, value)
        return value


class Source(Protocol):
    #: Arrow type of the partition key (int32 for Kafka, string for files/shards/Postgres).
    partition_type: pa.DataType
    #: The data columns a record carries (without partition, offset, into_time, diff).
    data_schema: pa.Schema
    # Optional ``offset_type``: how offsets and remap increments are stored, ``pa.int64()`` (the
    # default) or ``pa.string()`` for gauges beyond int64 (Kinesis sequence numbers), encoded
    # order-preservingly by :mod:`reclock.offsets`. Reads and frontiers always use Python ints.
    # Optional ``max_task_offsets``: the widest offset span one Spark read task covers (default
    # :data:`reclock.spark.rows.MAX_TASK_OFFSETS`); None for sparse gauges (sequence numbers,
    # timetokens), whose spans say nothing about how many records they hold.
    # Optional ``content_columns``: the data columns that make up a record's contents in AS OF
    # views (default: all); the others describe the change (e.g. Postgres op, xid, commit_time).

    def upper(self) -> Frontier:
        """The source's current upper frontier: every record below it is complete and readable."""

    def read(self, partition: Partition, start: int, end: int) -> Iterator[tuple[dict[str, Any], int, int]]:
        """Yield ``(data, offset, diff)`` for every record of ``partition`` with ``start <= offset < end``.

        Must be exact and repeatable: the same range always yields the same records.  A record the source
        cannot decode raises a :class:`SourceError` naming partition and offset.
        """

    # Optional ``reads_bad_records = True``: ``read`` also takes ``on_bad_record`` (:data:`ON_BAD_RECORD`);
    # with ``"dead_letter"`` it yields ``(BadRecord(raw, error), offset, diff)`` for a record it cannot
    # decode, with the error it would raise, and reads on (the files source).  Such a source can have
    # ``on_bad_record: dead_letter`` through the Python data source (:mod:`reclock.spark.source`).

    def commit(self, frontier: Frontier) -> None:
        """Tell upstream everything below ``frontier`` is durable here (offset resumption frontier)."""

    def committed(self) -> Frontier:
        """The frontier last committed upstream (what it may already have released)."""

    # Optional ``released() -> Frontier``: below it upstream no longer holds the records, when the
    # source can tell more precisely than ``committed()`` (Kafka keeps records after a group commit
    # until retention or DeleteRecords removes them). Ticks, staging and backfills refuse to go on
    # when records they need lie below it; without it they use ``committed()``.
    # Optional ``starting_frontier() -> Frontier``: where the source's history begins, read at its
    # first tick and recorded with remap (Kafka: ``starting_offsets``); default ``committed()`` (a
    # Postgres slot's consistent point, a files source's commit file).
    # Optional ``identity() -> dict[str, str]``: what makes the upstream this upstream (Kafka: the
    # topic ID), recorded with remap; a tick refuses an upstream whose identity changed.

    def close(self) -> None:
        """Release connections."""


# --- capabilities: what some sources offer beyond :class:`Source` -------------------------------------------------
#
# A step asks ``offers(source, Capability)`` (the adapter, or its class for a source opened without connecting) and
# then uses the capability's members; a source kind offers one by defining every member the protocol names.


class Snapshotting(Protocol):
    """A source that serves its first records only once, at its first tick (a Postgres source's initial snapshot,
    read under a snapshot that dies with its connection): the first tick lands them in the warehouse."""

    #: Whether this source takes the initial snapshot (an option of the source).
    snapshot: bool

    def export_snapshot(self):
        """A context manager of the exported snapshot: ``.uppers`` (partition -> upper) and ``.spec`` (how Spark
        workers read under it); the snapshot stays valid until it exits."""

    def started(self) -> bool:
        """Whether the source's position upstream exists (the slot)."""

    def drop_slot(self) -> None:
        """Remove the source's position upstream (a first tick killed while copying left it)."""

    def begin_new_epoch(self, name: str, bound: int, start: int, landed, drop_slot: bool) -> int | None:
        """Make way for a new epoch from a fresh snapshot: the consistent point of one that landed unrecorded, or
        None with no position left upstream (export a new snapshot); SourceError to refuse it."""


class LandsTicks(Protocol):
    """A source with no high watermark to sample (Kinesis): each tick takes what it can read and lands it; bound
    ranges are then read from the landing table."""

    lands_ticks: bool

    def take(self, landed: Frontier, bound: Frontier, state: dict):
        """The records after ``landed`` (``.records``, ``.uppers``, ``.state``), given the source's ``state``."""


class Truncating(Protocol):
    """A source whose records include TRUNCATE markers (:mod:`reclock.truncate`): reads expand them into the
    retractions of what the table held."""

    truncates: bool

    def snapshot_lsn(self, partition: str) -> int | None:
        """The LSN a snapshot partition was taken at (None for a change partition)."""


class TableColumns(Protocol):
    """A source whose records carry each table's columns (Postgres): staging refuses a change of them that the
    stored rows cannot follow, and every publish types its rows into a typed Delta table per table, read by AS OF
    queries as a typed view (:mod:`reclock.typed_tables`)."""

    #: The data column holding a record's table columns.
    table_columns: str

    def filled_columns(self, table: str, columns) -> list[str]:
        """Of ``columns`` of ``table``, those added with a default that filled the rows already there."""


class NamedPartitions(Protocol):
    """A source whose partitions are identities a person does not read (files: content fingerprints): each has a
    name, the file holding it, shown beside it in logs, ``reclock status`` and the progress page."""

    def partition_names(self) -> dict[str, str]:
        """``{partition: name}`` as of the last ``upper()`` (no new look upstream)."""


class Retiring(Protocol):
    """A source whose partitions end (files: a file rotated away and deleted holds nothing more): compaction retires
    a partition read whole and held by nothing upstream (:mod:`reclock.engine.upstream`, "Retirement")."""

    def held_partitions(self) -> set | None:
        """The partitions upstream holds now (a fresh look); None: this source retires nothing."""


class PrimaryKeys(Protocol):
    """A source that knows its tables' primary keys (staged with a batch, for the checks)."""

    def primary_keys(self, tables=None) -> dict[str, list[str]]:
        """``{"schema.name": [column, ...]}`` of the source's tables that have one."""


def offers(source: Any, capability: type) -> bool:
    """Whether ``source`` (an adapter, or its class) has every member of the ``capability`` protocol."""
    members = set(getattr(capability, "__annotations__", {})) | {
        name for name, value in vars(capability).items() if callable(value) and not name.startswith("_")}
    return all(hasattr(source, member) for member in members)


def _optional(source: Source, method: str, fallback):
    """``source.<method>()`` when the source has that optional method, else ``fallback()``."""
    call = getattr(source, method, None)
    return call() if callable(call) else fallback()


def released_frontier(source: Source) -> Frontier:
    """Below it upstream no longer holds records: ``source.released()``, else ``source.committed()``."""
    return _optional(source, "released", source.committed)


def starting_frontier(source: Source) -> Frontier:
    """Where the source's history begins: ``source.starting_frontier()``, else ``source.committed()``."""
    return _optional(source, "starting_frontier", source.committed)


def identity_of(source: Source) -> dict[str, str] | None:
    """The upstream's identity (``source.identity()``), None when the source has no such notion."""
    return _optional(source, "identity", lambda: None)


COMMITTED_NAME = "_reclock_committed.json"


def read_commit_doc(fs, path: str) -> dict:
    """The whole JSON document of the commit file at ``path`` (``{}`` before any commit)."""
    try:
        doc = json.loads(fs.cat_file(path))
    except FileNotFoundError:
        return {}
    except ValueError as e:
        raise SourceError(f"unreadable commit file {path}: {e}") from e
    if not isinstance(doc, dict):
        raise SourceError(f"unreadable commit file {path}: not a JSON object")
    return doc


def committed_of(doc: dict, path: str) -> Frontier:
    """The frontier of a commit document (:func:`read_commit_doc`); empty for ``{}``."""
    try:
        return Frontier.of(doc["committed"]) if doc else Frontier()  # {key: upper} or [[partition, upper]]
    except (KeyError, TypeError, AttributeError, FrontierError) as e:
        raise SourceError(f"unreadable commit file {path}: {e}") from e


def read_committed(fs, path: str) -> Frontier:
    """The frontier a file-backed source committed to ``path`` on fsspec filesystem ``fs`` (empty before any)."""
    return committed_of(read_commit_doc(fs, path), path)


def write_committed(fs, path: str, committed: dict | list, version: int = 1, **fields: Any) -> None:
    """Replace the commit file at ``path`` with ``committed`` (``{key: upper}``, or ``[[partition, upper]]``
    where partitions are not strings) and any other JSON ``fields``: written aside, then renamed (one PUT on
    object stores)."""
    tmp = path + ".tmp"
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    fs.pipe_file(tmp, json.dumps({**fields, "version": version, "committed": committed}, sort_keys=True).encode())
    fs.mv(tmp, path)
