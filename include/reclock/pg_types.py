"""Postgres columns as Spark columns: the row JSON a Postgres source stores, and a table's typed columns.

**Stored row** (:mod:`reclock.sources.postgres`, changes and snapshot alike): a JSON object of the row's
*non-NULL* columns (a NULL is a missing key, so a row read before and after ``ADD COLUMN c`` is the
same text), each value :func:`json_value` of its text as the type's output function prints it under
``DateStyle ISO``, ``TimeZone UTC``, ``bytea_output hex`` (pinned on every connection of the source):

* ``int2/int4/int8/oid``, ``bool``, finite ``float4/float8``: JSON numbers and booleans; ``json/jsonb``:
  the JSON value itself; arrays of the types of ``ELEMENTS``: JSON lists of their elements so converted
  (``null`` for a NULL element, nested lists for a multi-dimensional array);
* everything else, ``numeric`` included (exactly): the output text.

Each record also carries its table's columns ``[[name, type OID, typmod], ...]`` (JSON, in the
table's order) as Postgres described them for that change: pgoutput's Relation message, or the
catalog at the snapshot.  Those are what the typed tables are built from.

**Typed columns** (:func:`typed_columns`; the typed tables of :mod:`reclock.typed_tables` are made of them): for
each ``(name, oid, typmod)`` of a table's columns a column ``name`` of Spark type ``spark_type(oid, typmod)`` whose
value is ``parse(oid, typmod)(row[name])``, a missing key being NULL:

=========================================  ==========================  ===========================================
Postgres (OID)                             Spark                       parse of the text ``v``
=========================================  ==========================  ===========================================
int2 (21), int4 (23), int8 (20), oid (26)  smallint, int, bigint       ``CAST(v AS type)``
numeric(p, s) (1700), ``p <= 38``          ``decimal(p, s)``           ``CAST``; ``NaN`` -> NULL
numeric unbounded or ``p > 38``            string                      ``v`` (exact; cast it in SQL as needed)
bool (16)                                  boolean                     ``CAST``
float4 (700), float8 (701)                 float, double               ``CAST`` (``NaN``, ``Infinity`` kept)
date (1082)                                date                        ``CAST``; ``infinity``, BC -> NULL
timestamp (1114)                           timestamp_ntz               ``CAST``; ``infinity``, BC -> NULL
timestamptz (1184)                         timestamp                   ``CAST`` (UTC offset in ``v``); as above
bytea (17)                                 binary                      ``unhex(v without its \\x)``
json (114), jsonb (3802)                   string                      the JSON text
text, varchar, bpchar, name, uuid, other   string                      ``v``
array of a type of ``ELEMENTS``            ``array<element type>``     each element so parsed; multi-dim -> NULL
=========================================  ==========================  ===========================================

**Schema changes** (:func:`column_changes`), between a table's columns before and after a change: a
column added is followed (earlier rows read NULL for it), unless its default filled the rows already
there (the source's ``filled_columns``: no change in the WAL says so); a column dropped, or retyped
(another type OID, or another typmod except for varchar, whose text a length change cannot alter)
cannot be followed: rows stored before would no longer be retracted exactly.
"""
from __future__ import annotations

import json
import math
from typing import Any, Iterable, NamedTuple, Sequence

BOOL, INT2, INT4, INT8, OID, FLOAT4, FLOAT8, NUMERIC = 16, 21, 23, 20, 26, 700, 701, 1700
BYTEA, JSON, JSONB, DATE, TIMESTAMP, TIMESTAMPTZ, VARCHAR = 17, 114, 3802, 1082, 1114, 1184, 1043

#: Scalar types: OID -> (Spark type, how the text parses); every other OID is a string.
SCALARS: dict[int, tuple[str, str]] = {
    INT2: ("smallint", "cast"), INT4: ("int", "cast"), INT8: ("bigint", "cast"), OID: ("bigint", "cast"),
    BOOL: ("boolean", "cast"), FLOAT4: ("float", "cast"), FLOAT8: ("double", "cast"),
    NUMERIC: ("decimal", "decimal"), DATE: ("date", "time"), TIMESTAMP: ("timestamp_ntz", "time"),
    TIMESTAMPTZ: ("timestamp", "time"), BYTEA: ("binary", "hex"), JSON: ("string", "text"),
    JSONB: ("string", "text"),
}
#: Array types -> element type (``pg_type.typelem``) of the built-in types typed columns parse.
ELEMENTS: dict[int, int] = {
    1005: INT2, 1007: INT4, 1016: INT8, 1028: OID, 1000: BOOL, 1021: FLOAT4, 1022: FLOAT8, 1231: NUMERIC,
    1182: DATE, 1115: TIMESTAMP, 1185: TIMESTAMPTZ, 1001: BYTEA, 199: JSON, 3807: JSONB,
    1009: 25, 1015: VARCHAR, 1014: 1042, 1003: 19, 2951: 2950,
}
_NATIVE_INTS, _NATIVE_FLOATS = {INT2, INT4, INT8, OID}, {FLOAT4, FLOAT8}
_NO_VALUE = ("infinity", "-infinity", "NaN")  # texts Spark has no value for: NULL (see the table)
MAX_DECIMAL_PRECISION = 38


class Column(NamedTuple):
    name: str
    oid: int
    typmod: int


def columns_json(columns: Iterable[Sequence[Any]]) -> str:
    """A table's columns as stored with each record: ``[[name, oid, typmod], ...]``."""
    return json.dumps([list(c) for c in columns], separators=(",", ":"), ensure_ascii=False)


def parse_columns(text: str) -> list[Column]:
    return [Column(*c) for c in json.loads(text)]


# --- the stored row ---


def json_value(text: str | None, oid: int) -> Any:
    """A column's output text as the stored row holds it (module doc)."""
    if text is None:
        return None
    if oid == BOOL:
        return text == "t"
    if oid in _NATIVE_INTS:
        return int(text)
    if oid in _NATIVE_FLOATS:
        value = float(text)
        return value if math.isfinite(value) else text
    if oid in (JSON, JSONB):
        return json.loads(text)
    if oid in ELEMENTS:
        return _convert(parse_array(text), ELEMENTS[oid])
    return text


def _convert(items: list, oid: int) -> list:
    return [_convert(i, oid) if isinstance(i, list) else json_value(i, oid) for i in items]


def row_json(names: Sequence[str], oids: Sequence[int], values: Sequence[str | None]) -> str:
    """The stored row: the non-NULL columns, each as :func:`json_value`."""
    return json.dumps({n: json_value(v, o) for n, o, v in zip(names, oids, values) if v is not None},
                      separators=(",", ":"), ensure_ascii=False)


def parse_array(text: str) -> list:
    """An array's output text (``{1,NULL,"a b"}``, ``{{1,2},{3,4}}``, ``[0:1]={1,2}``) as nested lists of
    element texts, None for NULL (the array input syntax, with ``,`` as delimiter: every type of ``ELEMENTS``)."""
    if text.startswith("["):  # explicit dimensions: [lower:upper]=...
        text = text[text.index("=") + 1:]
    out, pos = _parse_level(text, 0)
    if pos != len(text):
        raise ValueError(f"trailing text in array {text!r}")
    return out


def _parse_level(text: str, pos: int) -> tuple[list, int]:
    if text[pos] != "{":
        raise ValueError(f"array {text!r}: expected '{{' at {pos}")
    pos += 1
    items: list = []
    if text[pos] == "}":
        return items, pos + 1
    while True:
        if text[pos] == "{":
            item, pos = _parse_level(text, pos)
        elif text[pos] == '"':
            chars, pos = [], pos + 1
            while text[pos] != '"':
                if text[pos] == "\\":
                    pos += 1
                chars.append(text[pos])
                pos += 1
            item, pos = "".join(chars), pos + 1
        else:
            end = pos
            while text[end] not in ",}":
                end += 1
            item = text[pos:end].strip()
            item, pos = (None if item.upper() == "NULL" else item), end
        items.append(item)
        if text[pos] == "}":
            return items, pos + 1
        if text[pos] != ",":
            raise ValueError(f"array {text!r}: expected ',' or '}}' at {pos}")
        pos += 1


# --- typed columns ---


def _decimal(typmod: int) -> tuple[int, int] | None:
    """``(precision, scale)`` of a numeric typmod, None when unbounded or beyond Spark's decimals."""
    if typmod < 4:
        return None
    precision, scale = ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF
    return (precision, scale) if precision <= MAX_DECIMAL_PRECISION and scale <= precision else None


def spark_type(oid: int, typmod: int = -1) -> str:
    """The Spark SQL type of a column (module doc's table)."""
    if oid in ELEMENTS:
        return f"array<{spark_type(ELEMENTS[oid], typmod)}>"
    kind = SCALARS.get(oid)
    if kind is None:
        return "string"
    if kind[1] == "decimal":
        decimal = _decimal(typmod)
        return f"decimal({decimal[0]},{decimal[1]})" if decimal else "string"
    return kind[0]


def parse(value, oid: int, typmod: int = -1):
    """The Spark Column of ``value`` (a string Column: the stored value's JSON text) as ``spark_type``."""
    from pyspark.sql import functions as F

    target = spark_type(oid, typmod)
    if oid in ELEMENTS:
        elements = F.from_json(value, "array<string>")
        parsed = F.transform(elements, lambda e: parse(e, ELEMENTS[oid], typmod))
        return F.when(value.startswith("[["), F.lit(None).cast(target)).otherwise(parsed)
    how = SCALARS.get(oid, ("string", "text"))[1]
    if target == "string":
        return value
    if how == "hex":
        return F.unhex(F.substring(value, 3, 1 << 30))
    cast = value.cast(target)
    if how == "decimal":
        return F.when(value == "NaN", F.lit(None).cast(target)).otherwise(cast)
    if how == "time":
        return F.when(value.isin(*_NO_VALUE) | value.endswith(" BC"), F.lit(None).cast(target)).otherwise(cast)
    return cast


def typed_columns(row, columns: Sequence[Column]) -> list:
    """Spark Columns of a table's typed columns from ``row`` (a string Column of stored rows), named as the table's."""
    from pyspark.sql import functions as F

    fields = F.from_json(row, ", ".join(f"`{c.name.replace('`', '``')}` string" for c in columns))
    return [parse(fields[c.name], c.oid, c.typmod).alias(c.name) for c in columns]


def view_name(source: str, table: str) -> str:
    """The typed view of ``table`` (``schema.name``) of source ``source``: ``<source>_<name>``, or
    ``<source>_<schema>_<name>`` outside the ``public`` schema."""
    schema, _, name = table.partition(".")
    return f"{source}_{name}" if schema == "public" else f"{source}_{schema}_{name}"


# --- schema changes ---


def column_changes(before: Sequence[Column], after: Sequence[Column]) -> tuple[list[str], list[str]]:
    """``(columns added, problems)`` from a table's columns ``before`` to ``after`` (module doc)."""
    old = {c.name: c for c in before}
    new = {c.name: c for c in after}
    problems = []
    for name, was in old.items():
        now = new.get(name)
        if now is None:
            problems.append(f"column {name!r} was dropped")
        elif now.oid != was.oid or (now.typmod != was.typmod and now.oid != VARCHAR):
            problems.append(f"column {name!r} was retyped (type OID {was.oid} typmod {was.typmod} -> "
                            f"OID {now.oid} typmod {now.typmod})")
    return [c.name for c in after if c.name not in old], problems


def schema_changes(history: Iterable[tuple[str, str, str]]) -> tuple[list[tuple[str, str, str]], list[str]]:
    """``(columns added as (table, column, where), the changes that cannot be followed)`` in ``history``:
    ``(table, where, columns text)`` in stream order, each table's latest published columns first
    (:func:`column_history`)."""
    last: dict[str, list[Column]] = {}
    added, problems = [], []
    for table, where, text in history:
        columns = parse_columns(text)
        if table in last:
            new, found = column_changes(last[table], columns)
            added += [(table, c, where) for c in new]
            problems += [f"{table}: {p} at {where}" for p in found]
        last[table] = columns
    return added, problems


def column_history(batch, before, where, column: str = "columns") -> list[tuple[str, str, str]]:
    """For :func:`schema_changes`: each table's latest columns in ``before`` (published records), then each
    distinct columns of ``batch`` at its first record, in stream order (IntoTime; in one, snapshot partitions
    first, then commit LSN and ``seq``); ``where`` is a Spark Column naming a record's position (e.g. its commit
    LSN)."""
    from pyspark.sql import functions as F

    position = F.struct(F.col("into_time"), (F.col("partition") == "").alias("change"), F.col("offset"),
                        F.col("seq"), where.alias("where"))
    known = F.col(column).isNotNull()
    latest = (before.where(known).groupBy("table").agg(F.max_by(column, position).alias(column),
                                                       F.max(position).alias("at")).collect())
    first = batch.where(known).groupBy("table", column).agg(F.min(position).alias("at")).collect()
    return ([(r["table"], r["at"]["where"], r[column]) for r in latest]
            + [(r["table"], r["at"]["where"], r[column])
               for r in sorted(first, key=lambda r: (r["at"]["into_time"], r["at"]["change"], r["at"]["offset"],
                                                     r["at"]["seq"] or 0))])
