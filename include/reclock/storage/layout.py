"""Where a source's tables and files lie, what their rows look like, and what storage raises.

A source ``<name>`` keeps, under the warehouse root, ``<name>/remap``, ``<name>/reclocked``, ``<name>/landing`` and
``<name>/dead_letter`` (Delta tables named ``<name>_<kind>``), a Postgres source's typed tables
``<name>/typed/<schema.table>`` (:mod:`reclock.storage.typed`), its staged batches under
``<name>/reclocked/staged/upto=<t>/<attempt>/`` (inside the reclocked table's directory, outside its Delta log, so no
reader sees them), and side files beside them (:mod:`reclock.storage.side_files`).  A transactions step ``<name>``
keeps ``<name>_txn_output`` and ``<name>_txn_temp`` (:meth:`reclock.storage.Warehouse.txn_table_uri`).  Spark
spells an S3 location ``s3a://``.
"""
from __future__ import annotations

import time
import uuid
from typing import Literal

import pyarrow as pa
from deltalake import DeltaTable

from .. import offsets

Kind = Literal["remap", "reclocked", "landing", "dead_letter"]
KINDS: tuple[Kind, ...] = ("remap", "reclocked")  # created with the source; "landing" when first landed

STAGED = "staged"
SUCCESS = "_SUCCESS"  # marks a complete staged attempt (Spark's default committer writes it last)
STAGED_DEAD_LETTERS = "_dead_letter"  # under a staged attempt: the batch's dead letters
STAGED_METADATA = "_batch.json"  # under a staged attempt: what the checks need of the batch (SourceTables.stage)
UPSTREAM_SAMPLE = "upstream_sample.json"  # the last upstream upper the tick measured (SourceTables.upstream_sample)
VACUUMED = "vacuumed.json"  # when compaction last vacuumed each table (SourceTables.vacuumed; vacuum_due)


class WarehouseError(RuntimeError):
    """Stored state or staged files that reclock cannot accept; nothing was committed."""


class ConcurrentWriteError(WarehouseError):
    """Another writer committed to the table since this step read it; this step committed nothing."""


def remap_schema(partition_type: pa.DataType, offset_type: pa.DataType = offsets.INT64) -> pa.Schema:
    """``increment`` is stored like the source's offsets (:mod:`reclock.offsets`): int64 or big."""
    return pa.schema([("partition", partition_type), ("into_time", pa.int64()), ("increment", offset_type)])


def reclocked_schema(partition_type: pa.DataType, data_schema: pa.Schema,
                     offset_type: pa.DataType = offsets.INT64) -> pa.Schema:
    return pa.schema(list(data_schema) + [
        pa.field("partition", partition_type), pa.field("offset", offset_type),
        pa.field("into_time", pa.int64()), pa.field("diff", pa.int64())])


def dead_letter_schema(partition_type: pa.DataType, offset_type: pa.DataType = offsets.INT64) -> pa.Schema:
    """A record that could not be decoded: its source (name), coordinates, raw key and value bytes, and why."""
    return pa.schema([pa.field("source", pa.string()), pa.field("partition", partition_type),
                      pa.field("offset", offset_type), pa.field("into_time", pa.int64()),
                      pa.field("key", pa.binary()), pa.field("value", pa.binary()), pa.field("error", pa.string())])


def arrow_schema(dt: DeltaTable) -> pa.Schema:
    return pa.schema(dt.schema().to_arrow())


def same_columns(found: pa.Schema, expected: pa.Schema) -> bool:
    """Same column names and types (any order, nullability ignored: Spark writes all columns nullable)."""
    return {f.name: f.type for f in found} == {f.name: f.type for f in expected}


def schema_diff(found: pa.Schema, expected: pa.Schema) -> str:
    have, want = {f.name: f.type for f in found}, {f.name: f.type for f in expected}
    parts = [f"missing {sorted(set(want) - set(have))}" if set(want) - set(have) else "",
             f"unexpected {sorted(set(have) - set(want))}" if set(have) - set(want) else "",
             ", ".join(f"{n}: {have[n]} (expected {want[n]})" for n in want if n in have and have[n] != want[n])]
    return "; ".join(p for p in parts if p)


def spark_uri(uri: str) -> str:
    """Spark's (Hadoop S3A) spelling of an object-store URI."""
    return "s3a://" + uri[len("s3://"):] if uri.startswith("s3://") else uri


def delta_path(uri: str) -> str:
    """The SQL name of the Delta table at ``uri``: ``delta.`<uri as Spark spells it>```."""
    return "delta.`" + spark_uri(uri).replace("`", "``") + "`"


def upto_dir(upto: int) -> str:
    """The staged attempts of the window up to IntoTime ``upto``, relative to the source."""
    return f"reclocked/{STAGED}/upto={upto}"


def attempt_dir(parent: str) -> str:
    """A new, unique directory under ``parent`` for one Spark write (ordered by creation time)."""
    return f"{parent}/{time.time_ns() // 1_000_000:013d}-{uuid.uuid4().hex[:8]}"

