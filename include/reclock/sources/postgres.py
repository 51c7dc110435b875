"""PostgreSQL logical replication as a reclock :class:`~reclock.sources.base.Source`.

Gauge: one partition ``""`` whose offset is the *commit LSN* of a change's transaction, the
start of its commit record, as an int.  All changes of a transaction share one offset and
offset order is commit order (seed 001).  Rows that existed before the slot was created are
not emitted (no initial snapshot): the source carries the changes after the slot's start.

Decoding uses the built-in ``pgoutput`` plugin through the SQL slot functions (psycopg 3, no
replication connection, no server extension).  pgoutput is chosen over wal2json/test_decoding
because its Begin message carries exactly the commit LSN (the others expose only the end of
the commit record), and the commit LSN is what the slot compares with ``confirmed_flush_lsn``
when skipping confirmed transactions: advancing the slot to ``F`` releases exactly the
offsets ``< F``.

* ``read`` peeks (never consumes) the slot up to ``end`` and keeps the transactions with
  ``start <= commit_lsn < end``, in commit order.  Inserts are ``+1`` of the new row, deletes
  ``-1`` of the old row, updates both; old rows need ``REPLICA IDENTITY FULL`` (set on the
  tables when this source creates the publication from ``tables``), else reads fail loudly.
  A TRUNCATE in range fails loudly too: it has no row-level diffs.
* ``commit`` advances the slot (``pg_replication_slot_advance``) so Postgres may recycle WAL;
  ``committed`` is the slot's ``confirmed_flush_lsn``; reading below it is an error.
* ``upper`` is argued in :meth:`PostgresSource.upper`.
"""
from __future__ import annotations

import json
import math
import re
import struct
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Iterator, Sequence

import pyarrow as pa

from ..engine import Frontier, Partition
from .base import SourceError

try:
    import psycopg
    from psycopg import errors, sql
except ImportError:  # pragma: no cover - reported when a source is built
    psycopg = None

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)
_UNCHANGED = object()  # pgoutput 'u': an unchanged TOASTed value, not sent again
_INTS, _FLOATS, _JSONS = {20, 21, 23, 26}, {700, 701}, {114, 3802}


def lsn_to_int(lsn: str) -> int:
    """``'16/B374D848'`` -> int."""
    high, _, low = lsn.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def int_to_lsn(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


class PostgresSource:
    """Changes of the tables in ``publication`` (default: the slot's name), read through ``slot``.

    ``tables`` (``"name"`` or ``"schema.name"``) creates the publication if it is missing and
    sets ``REPLICA IDENTITY FULL`` on them.  ``create_slot`` creates a missing ``pgoutput`` slot;
    an existing one is reused, so a new source on the same slot resumes from its commit.
    """

    partition_type = pa.string()
    data_schema = pa.schema([
        pa.field("table", pa.string()),        # "schema.table"
        pa.field("op", pa.string()),           # insert / update / delete
        pa.field("row", pa.string()),          # JSON object of the row's columns
        pa.field("xid", pa.int64()),
        pa.field("seq", pa.int32()),           # index of the change within its transaction
        pa.field("commit_time", pa.timestamp("us", tz="UTC")),
    ])
    #: A change's contents (AS OF views): the row of the table; the other columns describe the change.
    content_columns = ("table", "row")

    def __init__(self, dsn: str, slot: str, publication: str | None = None, tables: Sequence[str] = (),
                 create_slot: bool = True, busy_timeout_s: float = 10.0) -> None:
        if psycopg is None:
            raise SourceError("the postgres source needs psycopg 3: pip install 'psycopg[binary]'")
        self.slot, self.publication = slot, publication or slot
        for what, name in (("slot", self.slot), ("publication", self.publication)):
            if not isinstance(name, str) or not _NAME.match(name):
                raise SourceError(f"{what} name must match {_NAME.pattern}, got {name!r}")
        self.busy_timeout_s, self._dsn, self._conn = busy_timeout_s, dsn, None
        self._connection()
        try:
            if tables:
                self._ensure_publication(list(tables))
            if not self._sql("SELECT 1 FROM pg_publication WHERE pubname = %s", (self.publication,)):
                raise SourceError(f"publication {self.publication!r} does not exist; pass tables=[...] to create it")
            self._ensure_slot(create_slot)
            self._upper = self._confirmed()
        except BaseException:
            self.close()
            raise

    def _connection(self) -> "psycopg.Connection":
        if self._conn is None or self._conn.closed:
            try:
                self._conn = psycopg.connect(self._dsn, autocommit=True)
            except psycopg.Error as e:
                raise SourceError(f"cannot connect to postgres: {e}") from e
        return self._conn

    # --- setup ---

    def _ensure_publication(self, tables: list[str]) -> None:
        idents = [sql.Identifier(*t.split(".", 1)) for t in tables]
        for ident in idents:  # ALTER locks the table: only when needed
            name = ident.as_string(self._connection())
            if self._sql("SELECT relreplident FROM pg_class WHERE oid = %s::regclass", (name,))[0][0] != "f":
                self._sql(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(ident))
        if not self._sql("SELECT 1 FROM pg_publication WHERE pubname = %s", (self.publication,)):
            try:
                self._sql(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                    sql.Identifier(self.publication), sql.SQL(", ").join(idents)), retry=False)
            except SourceError as e:
                if not isinstance(e.__cause__, errors.DuplicateObject):  # created concurrently: fine
                    raise

    def _ensure_slot(self, create: bool) -> None:
        rows = self._sql("SELECT plugin, database = current_database() FROM pg_replication_slots"
                         " WHERE slot_name = %s", (self.slot,))
        if rows:
            plugin, same_db = rows[0]
            if plugin != "pgoutput" or not same_db:
                raise SourceError(f"slot {self.slot!r} must be a pgoutput logical slot of this database, "
                                  f"it uses {plugin!r}" + ("" if same_db else " in another database"))
        elif not create:
            raise SourceError(f"replication slot {self.slot!r} does not exist (create_slot=False)")
        else:
            try:  # waits for transactions running now to finish (the slot's consistent point)
                self._sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (self.slot,), retry=False)
            except SourceError as e:
                if not isinstance(e.__cause__, errors.DuplicateObject):
                    raise

    def _sql(self, query: Any, params: Sequence[Any] = (), retry: bool = True) -> list[tuple]:
        """Run ``query``; Postgres errors become :class:`SourceError`, a busy slot is retried."""
        deadline = time.monotonic() + self.busy_timeout_s
        while True:
            try:
                cur = self._connection().execute(query, params)
                return cur.fetchall() if cur.description else []
            except errors.ObjectInUse as e:  # slot active in another session (a concurrent read)
                if not retry or time.monotonic() > deadline:
                    raise SourceError(f"replication slot {self.slot!r} stays busy: {e}") from e
                time.sleep(0.05)
            except errors.UndefinedObject as e:
                if "replication slot" in str(e):
                    raise self._dropped() from e
                raise SourceError(f"postgres: {e}") from e
            except psycopg.Error as e:
                raise SourceError(f"postgres: {e}") from e

    def _dropped(self) -> SourceError:
        return SourceError(f"replication slot {self.slot!r} no longer exists (dropped?): its changes are lost "
                           "upstream; recreate the source from a fresh snapshot")

    def _confirmed(self) -> int:
        rows = self._sql("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                         (self.slot,))
        if not rows:
            raise self._dropped()
        return lsn_to_int(rows[0][0])

    # --- Source protocol ---

    def upper(self) -> Frontier:
        """Every transaction with commit LSN below the result is committed, durable and readable.

        One query samples the WAL insert position ``I`` and the flush position ``F``.  ``I`` is a
        record boundary: WAL space is reserved in order, so every record reserved before the
        sample ends at or below ``I`` and every later one, in particular the commit record of
        any transaction still open (e.g. in ``BEGIN; INSERT ...``), starts at or above ``I``.
        Hence no transaction can later commit with commit LSN ``< I``.  Once ``F >= I`` every
        record below ``I`` is on disk: each commit below ``I`` is durable, decoding reads it,
        and a crash cannot reuse its LSNs.  So the result is ``I`` (never below the previous
        result or the slot's committed position).

        A raw flush LSN would not do: it may fall inside a record whose tail is not yet on
        disk.  Commits flush the WAL before them, but WAL written after the last commit
        (an open transaction's rows, page pruning, even catalog reads of decoding) may stay
        unflushed for minutes.  When ``F < I`` this method therefore flushes it with a tiny
        transaction: a transactional ``pg_logical_emit_message`` (ignored by pgoutput without
        ``messages``) committed with ``synchronous_commit = local``, whose commit flushes all WAL
        before it.  (A transaction that only takes an xid is committed asynchronously.)  That
        costs an xid and ~100 bytes of WAL, and only when there is unflushed WAL.
        """
        insert, flush, confirmed = self._sql(
            "SELECT pg_current_wal_insert_lsn()::text, pg_current_wal_flush_lsn()::text,"
            " (SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s)", (self.slot,))[0]
        if confirmed is None:
            raise self._dropped()
        insert, flush = lsn_to_int(insert), lsn_to_int(flush)
        if flush < insert:
            with self._connection().transaction():
                self._sql("SET LOCAL synchronous_commit = local")
                self._sql("SELECT pg_logical_emit_message(true, 'reclock.flush', '')")
            flush = lsn_to_int(self._sql("SELECT pg_current_wal_flush_lsn()::text")[0][0])
        if flush >= insert:
            self._upper = max(self._upper, insert)
        self._upper = max(self._upper, lsn_to_int(confirmed))
        return Frontier.of({"": self._upper})

    def read(self, partition: Partition, start: int, end: int) -> Iterator[tuple[dict[str, Any], int, int]]:
        """The changes of transactions with ``start <= commit_lsn < end``, in commit order.

        Peeks the slot (it is not consumed) with ``upto_lsn = end``: decoding stops after the
        first record ending at or beyond ``end``, so every commit record starting below ``end``
        is decoded; the few beyond are filtered out.  The slot's confirmed position is checked
        *after* the peek (it only grows): if it is still ``<= start`` no transaction in range
        was skipped by the slot.
        """
        if partition != "":
            raise SourceError(f"postgres has the single partition '', not {partition!r}")
        if start >= end:
            return iter(())
        if end > self._upper and end > self.upper()[""]:
            raise SourceError(f"read of [{start}, {end}) goes beyond the upper {self._upper}")
        rows = self._sql(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(%s::name, %s::pg_lsn, NULL,"
            " 'proto_version', '1', 'publication_names', %s::text)", (self.slot, int_to_lsn(end), self.publication))
        confirmed = self._confirmed()
        if start < confirmed:
            raise SourceError(f"data already released upstream: read of [{start}, {end}) starts below the "
                              f"slot's committed position {confirmed} ({int_to_lsn(confirmed)})")
        return _decode((bytes(r[0]) for r in rows), start, end)

    def commit(self, frontier: Frontier) -> None:
        """Advance the slot to ``frontier``: transactions with commit LSN below it are released."""
        other = [p for p in frontier.partitions if p != ""]
        if other:
            raise SourceError(f"postgres has the single partition '', frontier names {other}")
        target = frontier[""]
        if target <= self._confirmed():
            return
        if target > self._upper and target > self.upper()[""]:
            raise SourceError(f"cannot commit {target} beyond the upper {self._upper}")
        self._sql("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (self.slot, int_to_lsn(target)))

    def committed(self) -> Frontier:
        return Frontier.of({"": self._confirmed()})

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def __enter__(self) -> "PostgresSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:  # picklable for Spark tasks: reconnects on first use
        return {**self.__dict__, "_conn": None}


# --- pgoutput (protocol version 1) decoding ---


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def unpack(self, fmt: str) -> Any:
        values = struct.unpack_from("!" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("!" + fmt)
        return values[0] if len(values) == 1 else values

    def byte(self) -> str:
        self.pos += 1
        return chr(self.data[self.pos - 1])

    def string(self) -> str:
        end = self.data.index(b"\0", self.pos)
        text, self.pos = self.data[self.pos:end].decode(), end + 1
        return text

    def tuple(self) -> list[Any]:
        values = []
        for _ in range(self.unpack("h")):
            kind = self.byte()
            if kind == "n":
                values.append(None)
            elif kind == "u":
                values.append(_UNCHANGED)
            else:  # 't' (text; 'b' binary is never requested)
                length = self.unpack("i")
                values.append(self.data[self.pos:self.pos + length].decode())
                self.pos += length
        return values


def _value(text: Any, oid: int) -> Any:
    """A column's text form as JSON: ints, floats, bools and json natively, everything else text."""
    if text is None:
        return None
    if oid == 16:
        return text == "t"
    if oid in _INTS:
        return int(text)
    if oid in _FLOATS:
        value = float(text)
        return value if math.isfinite(value) else text
    if oid in _JSONS:
        return json.loads(text)
    return text  # numeric stays text to keep its precision


def _row(names: list[str], oids: list[int], values: list[Any]) -> str:
    return json.dumps({n: _value(v, o) for n, o, v in zip(names, oids, values)}, separators=(",", ":"),
                      ensure_ascii=False)


def _decode(messages: Iterable[bytes], start: int, end: int) -> Iterator[tuple[dict[str, Any], int, int]]:
    relations: dict[int, tuple[str, str, list[str], list[int]]] = {}  # relid -> (name, identity, cols, oids)
    txn: dict[str, Any] | None = None
    lsn = seq = 0
    for message in messages:
        r = _Reader(message)
        kind = r.byte()
        if kind == "B":
            lsn, micros, xid = r.unpack("QqI")
            seq = 0
            txn = None
            if start <= lsn < end:
                txn = {"xid": xid, "commit_time": _PG_EPOCH + timedelta(microseconds=micros)}
        elif kind == "R":  # relation description, sent before a relation's first change
            relid, namespace, name, identity = r.unpack("I"), r.string(), r.string(), r.byte()
            cols = []
            for _ in range(r.unpack("h")):
                r.byte()
                cols.append((r.string(), r.unpack("Ii")[0]))
            relations[relid] = (f"{namespace}.{name}", identity, [c[0] for c in cols], [c[1] for c in cols])
        elif kind in "IUD" and txn is not None:
            table, identity, names, oids = relations[r.unpack("I")]
            marker, old, new = r.byte(), None, None
            if marker in "KO":
                old = r.tuple()
                marker = r.byte() if kind == "U" else ""
            if marker == "N":
                new = r.tuple()
            op = {"I": "insert", "U": "update", "D": "delete"}[kind]
            if kind != "I" and (old is None or identity != "f"):
                raise SourceError(f"{op} in {table} at commit LSN {int_to_lsn(lsn)} lacks the old row: "
                                  f"set ALTER TABLE {table} REPLICA IDENTITY FULL (before the change)")
            base = {"table": table, "op": op, "seq": seq, **txn}
            if old is not None:
                yield {**base, "row": _row(names, oids, old)}, lsn, -1
            if new is not None:
                new = [o if v is _UNCHANGED else v for v, o in zip(new, old or [None] * len(new))]
                yield {**base, "row": _row(names, oids, new)}, lsn, +1
            seq += 1
        elif kind == "T" and txn is not None:
            raise SourceError(f"TRUNCATE at commit LSN {int_to_lsn(lsn)} cannot be expressed as row diffs; "
                              "re-create the source from a snapshot")
        # 'C' commit, 'O' origin, 'Y' type, 'M' message: nothing to emit
