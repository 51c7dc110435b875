"""pgoutput, Postgres's built-in logical decoding output plugin (protocol version 1), read through the SQL slot
functions: its messages decoded into reclock records (:func:`decode`), an LSN as an int and back, and the session
settings every connection pins (:data:`SESSION`), since the output text of dates, times and bytea depends on them.

Through the SQL slot functions: psycopg 3, no replication connection, no server extension.  pgoutput is chosen over
wal2json/test_decoding because its Begin message carries exactly the commit LSN (the others expose only the end of
the commit record), and the commit LSN is what the slot compares with ``confirmed_flush_lsn`` when skipping
confirmed transactions: advancing the slot to ``F`` releases exactly the offsets ``< F``.

A change's record is ``{"table", "op", "row", "columns", "seq", "xid", "commit_time"}`` at offset = its
transaction's commit LSN: an insert ``+1`` of the new row, a delete ``-1`` of the old, an update both; a truncate
a marker per table (``op = "truncate"``, diff 0).  Only transactions whose commit LSN lies in ``[start, end)`` are
decoded.  An update or delete without the old row (a table not ``REPLICA IDENTITY FULL``) is a
:class:`~reclock.sources.base.SourceError`: its retraction could not be exact.  An update's unchanged TOASTed
column (``'u'``) takes the old row's value, which ``REPLICA IDENTITY FULL`` logs inline.
"""
from __future__ import annotations

import struct
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Iterator

from ..pg_types import columns_json, row_json
from .base import SourceError

try:
    import psycopg
    from psycopg import adapt
except ImportError:  # pragma: no cover - reported when a source is built
    psycopg = None

_PG_EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)
_UNCHANGED = object()  # pgoutput 'u': an unchanged TOASTed value, not sent again
#: Session settings of every connection: the output text of dates, times and bytea depends on them, and a
#: stored row must be the same text whichever connection decoded or copied it (reclock.pg_types).
SESSION = (("DateStyle", "ISO, MDY"), ("TimeZone", "UTC"), ("IntervalStyle", "postgres"),
           ("bytea_output", "hex"), ("extra_float_digits", "1"))


def lsn_to_int(lsn: str) -> int:
    """``'16/B374D848'`` -> int."""
    high, _, low = lsn.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def int_to_lsn(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


class OutputText(adapt.Loader if psycopg else object):
    """Loads a column as the text of its type's output function (no parsing)."""

    def load(self, data) -> str:
        return bytes(data).decode()


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


def session(conn: "psycopg.Connection") -> "psycopg.Connection":
    """``conn`` with the :data:`SESSION` settings (the row text depends on them)."""
    conn.execute("SELECT " + ", ".join(["set_config(%s, %s, false)"] * len(SESSION)), [v for kv in SESSION for v in kv])
    if not conn.autocommit:
        conn.commit()
    return conn


def decode(messages: Iterable[bytes], start: int, end: int) -> Iterator[tuple[dict[str, Any], int, int]]:
    relations: dict[int, tuple[str, str, list[str], list[int], str]] = {}  # relid -> (name, identity, names, oids,
    # columns JSON)
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
                cols.append((r.string(), *r.unpack("Ii")))
            relations[relid] = (f"{namespace}.{name}", identity, [c[0] for c in cols], [c[1] for c in cols],
                                columns_json(cols))
        elif kind in "IUD" and txn is not None:
            table, identity, names, oids, described = relations[r.unpack("I")]
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
            base = {"table": table, "op": op, "columns": described, "seq": seq, **txn}
            if old is not None:
                yield {**base, "row": row_json(names, oids, old)}, lsn, -1
            if new is not None:  # an unchanged TOASTed value: the old row's (REPLICA IDENTITY FULL logs it inline)
                new = [o if v is _UNCHANGED else v for v, o in zip(new, old or [None] * len(new))]
                yield {**base, "row": row_json(names, oids, new)}, lsn, +1
            seq += 1
        elif kind == "T" and txn is not None:  # a marker per table: reclock.truncate retracts what it held
            count, _options = r.unpack("i"), r.byte()
            for relid in [r.unpack("I") for _ in range(count)]:
                yield {"table": relations[relid][0], "op": "truncate", "row": None, "columns": relations[relid][4],
                       "seq": seq, **txn}, lsn, 0
                seq += 1
        # 'C' commit, 'O' origin, 'Y' type, 'M' message: nothing to emit
