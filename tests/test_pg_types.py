"""The Postgres type mapping (reclock.pg_types): stored row JSON, Spark types, parsing, schema changes."""
from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest

from reclock.pg_types import (Column, column_changes, columns_json, json_value, parse_array,
                              row_json, schema_changes, spark_type, typed_columns, view_name)


def numeric(p: int, s: int) -> int:
    return ((p << 16) | s) + 4


@pytest.mark.parametrize("oid, typmod, expected", [
    (21, -1, "smallint"), (23, -1, "int"), (20, -1, "bigint"), (26, -1, "bigint"),
    (1700, numeric(12, 2), "decimal(12,2)"), (1700, numeric(38, 0), "decimal(38,0)"),
    (1700, -1, "string"), (1700, numeric(39, 2), "string"),
    (16, -1, "boolean"), (700, -1, "float"), (701, -1, "double"),
    (25, -1, "string"), (1043, 24, "string"), (1042, 5, "string"), (2950, -1, "string"),
    (1082, -1, "date"), (1114, -1, "timestamp_ntz"), (1184, -1, "timestamp"),
    (114, -1, "string"), (3802, -1, "string"), (17, -1, "binary"),
    (1007, -1, "array<int>"), (1231, numeric(5, 1), "array<decimal(5,1)>"), (1009, -1, "array<string>"),
    (1185, -1, "array<timestamp>"), (1001, -1, "array<binary>"),
    (600, -1, "string"), (16390, -1, "string"),  # point; a user type
])
def test_spark_type(oid, typmod, expected):
    assert spark_type(oid, typmod) == expected


@pytest.mark.parametrize("text, expected", [
    ("{}", []),
    ("{1,2,3}", ["1", "2", "3"]),
    ("{a1,NULL}", ["a1", None]),
    ('{"NULL",null}', ["NULL", None]),
    ('{"a b","c,d","e\\"f","g\\\\h",""}', ["a b", "c,d", 'e"f', "g\\h", ""]),
    ("{{1,2},{3,4}}", [["1", "2"], ["3", "4"]]),
    ("[0:1]={7,8}", ["7", "8"]),
    ('{"\\\\x01ff"}', ["\\x01ff"]),
    ('{"2026-01-01 00:00:00+00"}', ["2026-01-01 00:00:00+00"]),
])
def test_parse_array(text, expected):
    assert parse_array(text) == expected


@pytest.mark.parametrize("text, oid, expected", [
    ("42", 23, 42), ("-7", 21, -7), ("9223372036854775807", 20, 9223372036854775807),
    ("t", 16, True), ("f", 16, False),
    ("1.5", 701, 1.5), ("NaN", 701, "NaN"), ("-Infinity", 700, "-Infinity"),
    ("123456789012345678901234567890.5", 1700, "123456789012345678901234567890.5"),
    ('{"k": [1, 2]}', 3802, {"k": [1, 2]}), ('"s"', 114, "s"),
    ("{1,NULL,3}", 1007, [1, None, 3]), ("{t,f}", 1000, [True, False]), ("{{1},{2}}", 1007, [[1], [2]]),
    ('{"{\\"a\\": 1}"}', 3807, [{"a": 1}]),
    ("2026-01-01 00:00:00+00", 1184, "2026-01-01 00:00:00+00"), ("\\x01ff", 17, "\\x01ff"),
    ("(1,2)", 600, "(1,2)"), (None, 23, None),
])
def test_json_value(text, oid, expected):
    assert json_value(text, oid) == expected


def test_row_json_leaves_nulls_out():
    """A NULL is a missing key: a row stored before ``ADD COLUMN c`` is the text of the same row after it."""
    before = row_json(["id", "v"], [23, 25], ["1", "a"])
    assert before == '{"id":1,"v":"a"}'
    assert row_json(["id", "v", "c"], [23, 25, 23], ["1", "a", None]) == before


C = Column


@pytest.mark.parametrize("before, after, added, problems", [
    ([C("id", 23, -1)], [C("id", 23, -1)], [], []),
    ([C("id", 23, -1)], [C("id", 23, -1), C("c", 25, -1)], ["c"], []),
    ([C("id", 23, -1), C("c", 25, -1)], [C("id", 23, -1)], [], ["column 'c' was dropped"]),
    ([C("id", 23, -1)], [C("id", 20, -1)], [], ["column 'id' was retyped (type OID 23 typmod -1 -> OID 20 typmod -1)"]),
    ([C("n", 1700, numeric(10, 2))], [C("n", 1700, numeric(12, 2))], [],
     [f"column 'n' was retyped (type OID 1700 typmod {numeric(10, 2)} -> OID 1700 typmod {numeric(12, 2)})"]),
    ([C("s", 1043, 14)], [C("s", 1043, 24)], [], []),  # varchar(10) -> varchar(20): the text cannot change
    ([C("a", 23, -1), C("b", 23, -1)], [C("a", 23, -1), C("b2", 23, -1)], ["b2"], ["column 'b' was dropped"]),
])
def test_column_changes(before, after, added, problems):
    assert column_changes(before, after) == (added, problems)


def test_schema_changes():
    one, two = columns_json([("id", 23, -1)]), columns_json([("id", 23, -1), ("c", 25, -1)])
    assert schema_changes([("public.t", "commit LSN 0/1", one), ("public.t", "commit LSN 0/2", two),
                           ("public.u", "commit LSN 0/2", two)]) == ([("public.t", "c", "commit LSN 0/2")], [])
    assert schema_changes([("public.t", "commit LSN 0/1", two), ("public.u", "commit LSN 0/1", one),
                           ("public.t", "commit LSN 0/3", one)]) == \
        ([], ["public.t: column 'c' was dropped at commit LSN 0/3"])
    assert view_name("bank", "public.acct") == "bank_acct" and view_name("bank", "s1.acct") == "bank_s1_acct"


# (name, oid, typmod, Postgres output text or None for NULL, the typed view's value)
TYPED = [
    ("i2", 21, -1, "-3", -3),
    ("i4", 23, -1, "2147483647", 2147483647),
    ("i8", 20, -1, "-9223372036854775808", -9223372036854775808),
    ("bal", 1700, numeric(12, 2), "1234567890.25", Decimal("1234567890.25")),
    ("nan", 1700, numeric(12, 2), "NaN", None),
    ("free", 1700, -1, "123456789012345678901234567890.000000001", "123456789012345678901234567890.000000001"),
    ("ok", 16, -1, "t", True),
    ("f4", 700, -1, "1.5", 1.5),
    ("f8", 701, -1, "0.1", 0.1),
    ("f8inf", 701, -1, "-Infinity", float("-inf")),
    ("day", 1082, -1, "2026-11-25", dt.date(2026, 11, 25)),
    ("dayinf", 1082, -1, "infinity", None),
    ("daybc", 1082, -1, "0044-03-15 BC", None),
    ("local", 1114, -1, "2026-11-25 12:30:00.123456", dt.datetime(2026, 11, 25, 12, 30, 0, 123456)),
    ("at", 1184, -1, "2026-11-25 12:30:00+00", dt.datetime(2026, 11, 25, 12, 30)),
    ("doc", 3802, -1, '{"a": [1, 2.5, "x"], "b": null}', '{"a":[1,2.5,"x"],"b":null}'),
    ("raw", 17, -1, "\\x00ff10", bytes([0, 255, 16])),
    ("name", 25, -1, "héllo \"q\"", "héllo \"q\""),
    ("note", 1043, 24, None, None),
    ("tags", 1009, -1, '{a,NULL,"b c"}', ["a", None, "b c"]),
    ("nums", 1007, -1, "{1,2,NULL}", [1, 2, None]),
    ("grid", 1007, -1, "{{1,2},{3,4}}", None),
    ("amounts", 1231, numeric(5, 1), "{1.5,NaN}", [Decimal("1.5"), None]),
    ("times", 1185, -1, '{"2026-01-01 00:00:00+00"}', [dt.datetime(2026, 1, 1)]),
    ("blobs", 1001, -1, '{"\\\\x0102"}', [b"\x01\x02"]),
    ("pt", 600, -1, "(1,2)", "(1,2)"),
]


def test_typed_columns_parse_every_type(spark):
    names, oids, texts = [t[0] for t in TYPED], [t[1] for t in TYPED], [t[3] for t in TYPED]
    row = row_json(names, oids, texts)
    columns = [C(n, o, m) for n, o, m, _, _ in TYPED]
    df = spark.createDataFrame([(row,), ('{"i4":1}',)], "row string")  # and a row without most keys: NULLs
    from pyspark.sql import functions as F

    typed = df.select(*typed_columns(F.col("row"), columns))
    assert [(f.name, f.dataType.simpleString()) for f in typed.schema.fields] == \
        [(n, spark_type(o, m)) for n, o, m, _, _ in TYPED]
    full, sparse = typed.collect()
    assert {n: full[n] for n in names} == {n: v for n, _, _, _, v in TYPED}
    assert sparse["i4"] == 1 and all(sparse[n] is None for n in names if n != "i4")
    assert json.loads(full["doc"]) == {"a": [1, 2.5, "x"], "b": None}


# (existing typed columns, the column lists of the rows added, the typed columns, rewrite) (reclock.typed_tables)
INT, INT8_, TEXT_, VC10, VC20 = (23, -1), (20, -1), (25, -1), (1043, 14), (1043, 24)
NUM102, NUM122 = (1700, numeric(10, 2)), (1700, numeric(12, 2))
RESOLVED = [
    ([], [[("id", *INT), ("v", *TEXT_)]], [("id", *INT), ("v", *TEXT_)], False),
    ([("id", *INT)], [[("id", *INT)], [("id", *INT), ("w", *NUM102)]], [("id", *INT), ("w", *NUM102)], False),
    ([("id", *INT), ("v", *VC10)], [[("id", *INT), ("v", *VC20)]], [("id", *INT), ("v", *VC10)], False),  # strings
    ([("id", *INT)], [[("id", *INT8_)]], [("id", *TEXT_)], True),  # retyped in a new epoch: text, rewritten
    ([("id", *INT), ("w", *NUM102)], [[("id", *INT), ("w", *NUM122)]], [("id", *INT), ("w", *TEXT_)], True),
    ([], [[("id", *INT)], [("id", *INT8_)]], [("id", *TEXT_)], False),  # new: nothing to rewrite
    ([("id", *INT), ("gone", *INT)], [[("id", *INT)]], [("id", *INT), ("gone", *INT)], False),  # a drop: kept
]


@pytest.mark.parametrize("existing, found, expected, rewrite", RESOLVED)
def test_typed_columns_resolve(existing, found, expected, rewrite):
    from reclock.typed_tables import resolve

    columns, again = resolve("public.t", [Column(*c) for c in existing], [[Column(*c) for c in f] for f in found])
    assert (columns, again) == ([Column(*c) for c in expected], rewrite)


def test_a_column_named_as_a_typed_tables_own_is_refused():
    from reclock.storage import WarehouseError
    from reclock.typed_tables import resolve

    with pytest.raises(WarehouseError, match=r"public.t: column '_diff' has the name of a typed table's own column"):
        resolve("public.t", [], [[Column("_diff", 23, -1)]])
