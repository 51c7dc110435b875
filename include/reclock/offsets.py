"""How offsets (and remap increments) are stored: int64, or an order-preserving string for big gauges.

The engine's offsets are Python ints of any size.  Most gauges fit int64 (Kafka offsets,
byte offsets, LSNs, PubNub timetokens), and a source stores them as ``int64`` unless it
declares ``offset_type = pa.string()`` (:data:`BIG`).  Kinesis sequence numbers are
decimal strings of up to 129 digits in the API (real ones have about 56): they overflow
int64 and Delta's decimal (precision <= 38), which is seed 001's open question.

A big offset is stored as its decimal digits behind a fixed-width length prefix::

    encode(42)  == "002:42"
    encode(49590338271490256608559692538361571095921575989136588898)
                == "056:49590338271490256608559692538361571095921575989136588898"

Byte-wise (lexicographic) order of encoded values is numeric order: the three-digit,
zero-padded length compares first (a longer canonical decimal is larger), then numbers of
one length compare digit by digit.  So Spark's string comparison, ``ORDER BY``, Parquet
min/max statistics and Delta data skipping all see offsets in gauge order, and
``offset < p.offset`` against the ``<source>_progress`` view means what it says.  The
digits after ``:`` are the sequence number verbatim (``substring(offset, 5)`` in SQL).

Why not a fixed-width zero-padded decimal (130 characters)?  It orders the same way, but
every stored offset would be 130 bytes (a Kinesis one ~60 here, an increment often ~30),
and it caps the digits at the width chosen; the prefix admits up to 999 digits.  Encoding
is canonical (no leading zeros, no sign), so equal offsets are equal strings and
``GROUP BY offset`` consolidates correctly; :func:`decode` rejects anything else.
"""
from __future__ import annotations

import re
from typing import Any, Iterable

import pyarrow as pa

INT64 = pa.int64()
#: The storage type of offsets that may exceed int64 (length-prefixed decimal strings).
BIG = pa.string()
TYPES = (INT64, BIG)
INT64_MAX = 2 ** 63 - 1
_WIDTH = 3  # digits of the length prefix
MAX_DIGITS = 10 ** _WIDTH - 1
_ENCODED = re.compile(r"(\d{3}):(0|[1-9]\d*)", re.ASCII)


class OffsetError(ValueError):
    """An offset that cannot be stored in the declared type, or a stored value that is not an offset."""


def offset_type_of(source: Any) -> pa.DataType:
    """The storage type a source (instance or class) declares as ``offset_type``; int64 by default."""
    return check_type(getattr(source, "offset_type", None), f"{source!r} declares offset_type")


def check_type(offset_type: pa.DataType | None, what: str = "offset_type") -> pa.DataType:
    """``offset_type`` when supported (None: int64); :class:`OffsetError` otherwise."""
    if offset_type is None:
        return INT64
    if not isinstance(offset_type, pa.DataType) or offset_type not in TYPES:
        raise OffsetError(f"{what} {offset_type}; supported: int64, or string (big offsets)")
    return offset_type


def is_big(offset_type: pa.DataType) -> bool:
    return offset_type == BIG


def encode(value: int) -> str:
    """The order-preserving string of a non-negative int: ``"<3-digit length>:<decimal digits>"``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise OffsetError(f"an offset must be an int >= 0, got {value!r}")
    digits = str(value)
    if len(digits) > MAX_DIGITS:
        raise OffsetError(f"offset has {len(digits)} digits; at most {MAX_DIGITS} can be stored")
    return f"{len(digits):0{_WIDTH}d}:{digits}"


def decode(text: str) -> int:
    """Inverse of :func:`encode`; :class:`OffsetError` unless ``text`` is exactly an encoded offset."""
    if not isinstance(text, str):
        raise OffsetError(f"an encoded offset is a string, got {text!r}")
    found = _ENCODED.fullmatch(text)
    if found is None or int(found.group(1)) != len(found.group(2)):
        raise OffsetError(f"not an encoded offset (\"<3-digit length>:<digits>\"): {text!r}")
    return int(found.group(2))


def to_storage(value: int, offset_type: pa.DataType = INT64) -> int | str:
    """``value`` as stored in a column of ``offset_type``; :class:`OffsetError` when it does not fit."""
    if is_big(offset_type):
        return encode(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise OffsetError(f"an offset must be an int, got {value!r}")
    if not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise OffsetError(f"offset {value} does not fit int64; the source must declare offset_type = pa.string()")
    return value


def from_storage(value: Any) -> int:
    """A stored offset (int64, numpy int or encoded string) as a Python int."""
    if isinstance(value, str):
        return decode(value)
    if isinstance(value, bool) or value is None:
        raise OffsetError(f"not a stored offset: {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError) as e:
        raise OffsetError(f"not a stored offset: {value!r}") from e


def to_arrow(values: Iterable[int], offset_type: pa.DataType = INT64) -> pa.Array:
    """An Arrow array of ``offset_type`` holding ``values`` (Python ints)."""
    return pa.array([to_storage(v, offset_type) for v in values], type=offset_type)


def from_arrow(array: pa.Array | pa.ChunkedArray) -> list[int]:
    """Python ints of an int64 or encoded-string Arrow array (no nulls)."""
    if array.null_count:
        raise OffsetError(f"{array.null_count} null offset(s)")
    values = array.to_pylist()
    return [decode(v) for v in values] if pa.types.is_string(array.type) else values


def sql_type(offset_type: pa.DataType) -> str:
    """The Spark SQL type name of an offset column of ``offset_type``."""
    return "string" if is_big(offset_type) else "long"
