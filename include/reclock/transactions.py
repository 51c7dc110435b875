"""Debezium transactions over two reclocked Kafka sources, durably (seed 000's addendum, seed 001).

``publish_transactions(name, data_source, tx_source)`` reads the reclocked tables of
a Debezium data topic and its transaction-metadata topic (two ordinary configured
sources, already reclocked by the pipeline) and keeps two Delta tables under the
warehouse root, with :mod:`reclock.engine.transactions` doing the work:

* ``<name>_txn_output`` - ``data columns, partition, offset, tx_id, into_time, diff``:
  the data events of each transaction at the IntoTime it became publishable (it and
  every earlier transaction complete).  App transaction ``reclock.txn_output`` =
  last processed IntoTime.
* ``<name>_txn_temp`` - ``kind, tx_id, data columns, partition, offset, into_time, diff``:
  TEMP as an update collection (``+1`` when a record enters TEMP, ``-1`` when it is
  published; ``kind`` is ``data``, ``tx`` or ``published`` (an id, kept forever so a
  reused id is caught).  Its contents as of any IntoTime ``t`` are the rows at or
  before ``t`` summed (:meth:`TxnTables.read_temp`).  App transaction
  ``reclock.txn_temp`` = last processed IntoTime.

One call processes every IntoTime up to the least of the two sources' reclocked
uppers, as two commits: output first, then TEMP.  A crash between them leaves the
output ahead; the rerun recomputes from TEMP (deterministically the same rows) and
appends only the output beyond what is there.  Rows are the raw Kafka columns, so
the data format is only read here (:func:`parse_data`, :func:`parse_tx`):

* data topic value: a Debezium envelope (optionally wrapped as ``{"schema", "payload"}``
  by the JSON converter) with ``transaction: {"id", "total_order", "data_collection_order"}``;
  its collection is ``transaction.data_collection`` when present, else built from
  ``source`` as Debezium names it in ``data_collections``.  Tombstones (null value)
  are skipped; a change event without ``transaction`` is an error.
* transaction topic value: ``{"status": "BEGIN"|"END", "id", "event_count",
  "data_collections": [{"data_collection", "event_count"}]}``, one partition.

The data sources must not be compacted past the last processed IntoTime (their
reclocked IntoTimes would be coarsened under already-processed ones): that is refused.
"""
from __future__ import annotations

import json
import logging
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from .config import NAME_RE
from .engine.transactions import (
    END, DataEvent, PublishedId, PublishedTx, TempRecord, TransactionError, TxEvent, TxState,
    batches, fold_with_updates,
)
from .runtime import Runtime, Where
from .storage import (
    RECLOCKED_APP, TXN_OUTPUT_APP, TXN_TEMP_APP, Warehouse, WarehouseError, append_rows, app_version, arrow_schema,
    create_table, read_rows, same_columns, schema_diff,
)

log = logging.getLogger("reclock")

OUTPUT_APP, TEMP_APP = TXN_OUTPUT_APP, TXN_TEMP_APP
KIND_DATA, KIND_TX, KIND_PUBLISHED = "data", "tx", "published"


# --- Debezium records -------------------------------------------------------------------------------


def _envelope(row: dict, what: str) -> dict | None:
    value = row.get("value")
    if value is None:
        return None
    try:
        obj = json.loads(value)
    except (TypeError, ValueError) as e:
        raise TransactionError(f"{what} at {_at(row)}: value is not JSON: {e}") from None
    if isinstance(obj, dict) and set(obj) == {"schema", "payload"}:
        obj = obj["payload"]  # JsonConverter with schemas.enable=true
    if obj is not None and not isinstance(obj, dict):
        raise TransactionError(f"{what} at {_at(row)}: value must be a JSON object, got {type(obj).__name__}")
    return obj


def collection_of(envelope: dict) -> str | None:
    """The data collection of a change event, spelled as Debezium's END ``data_collections`` spells it."""
    tx = envelope.get("transaction") or {}
    if tx.get("data_collection"):
        return str(tx["data_collection"])
    source = envelope.get("source") or {}
    connector = source.get("connector")
    if connector == "postgresql":
        parts = [source.get("schema"), source.get("table")]
    elif connector == "mysql":
        parts = [source.get("db"), source.get("table")]
    elif connector == "mongodb":
        parts = [source.get("rs"), source.get("db"), source.get("collection")]
    else:  # sqlserver, db2, oracle, ...: database.schema.table
        parts = [source.get("db"), source.get("schema"), source.get("table") or source.get("collection")]
    parts = [str(p) for p in parts if p not in (None, "")]
    return ".".join(parts) if parts else None


def parse_data(row: dict, data_columns: list[str]) -> DataEvent | None:
    """A reclocked data-topic row as a :class:`DataEvent` (``None`` for a tombstone)."""
    envelope = _envelope(row, "data record")
    if envelope is None:
        return None
    tx = envelope.get("transaction")
    if not isinstance(tx, dict) or tx.get("id") in (None, ""):
        raise TransactionError(f"data record at {_at(row)} has no transaction id (enable Debezium's "
                               f"provide.transaction.metadata)")
    collection = collection_of(envelope)
    if collection is None:
        raise TransactionError(f"data record at {_at(row)}: cannot tell its data collection from "
                               f"transaction.data_collection or source")
    return DataEvent(str(tx["id"]), collection, row["partition"], row["offset"], _payload(row, data_columns))


def parse_tx(row: dict, data_columns: list[str]) -> TxEvent:
    """A reclocked transaction-topic row as a :class:`TxEvent`."""
    obj = _envelope(row, "transaction record")
    if obj is None:
        raise TransactionError(f"transaction record at {_at(row)} has no value")
    status, tx_id = obj.get("status"), obj.get("id")
    count = collections = None
    if status == END:
        count = _int(obj.get("event_count"))
        listed = obj.get("data_collections")
        if listed is not None:
            if not isinstance(listed, list) or not all(isinstance(c, dict) for c in listed):
                raise TransactionError(f"transaction record at {_at(row)}: data_collections must be a list of "
                                       f"objects, got {listed!r}")
            collections = tuple((str(c.get("data_collection")), _int(c.get("event_count")))
                                for c in listed)
    return TxEvent(status, str(tx_id) if tx_id is not None else tx_id, row["partition"], row["offset"],
                   count, collections, _payload(row, data_columns))


def _int(value: Any) -> Any:
    """Debezium JSON may spell numbers as strings; anything else is left for the engine to refuse."""
    return int(value) if isinstance(value, str) and value.strip().lstrip("-").isdigit() else value


def _payload(row: dict, data_columns: list[str]) -> tuple:
    return tuple(row[c] for c in data_columns)


def _at(row: dict) -> str:
    return f"partition {row.get('partition')} offset {row.get('offset')}"


# --- tables -----------------------------------------------------------------------------------------


class TxnTables:
    """The ``<name>_txn_output`` and ``<name>_txn_temp`` Delta tables (written and read with deltalake; ``spark``
    given: a step that writes, which creates what is missing)."""

    def __init__(self, warehouse: Warehouse, name: str, partition_type: pa.DataType, data_schema: pa.Schema,
                 spark=None):
        if not NAME_RE.match(name):
            raise ValueError(f"transaction output name must match [a-z][a-z0-9_]*, got {name!r}")
        self.name = name
        self.spark = spark
        self.storage_options = warehouse.storage_options
        self.data_columns = list(data_schema.names)
        self.uris = {kind: warehouse.txn_table_uri(name, kind) for kind in ("output", "temp")}
        located = [pa.field("partition", partition_type), pa.field("offset", pa.int64())]
        times = [pa.field("into_time", pa.int64()), pa.field("diff", pa.int64())]
        self.schemas = {
            "output": pa.schema(list(data_schema) + located + [pa.field("tx_id", pa.string())] + times),
            "temp": pa.schema([pa.field("kind", pa.string()), pa.field("tx_id", pa.string())]
                              + list(data_schema) + located + times),
        }
        for kind, uri in self.uris.items():
            if spark is not None:  # a step that writes: it creates what is missing
                create_table(uri, self.schemas[kind], f"{name}_txn_{kind}", self.storage_options)
            dt = self.table(kind)
            if not same_columns(arrow_schema(dt), self.schemas[kind]):
                raise WarehouseError(f"{uri} exists with another schema: "
                                     f"{schema_diff(arrow_schema(dt), self.schemas[kind])}")

    def table(self, kind: str) -> DeltaTable:
        return DeltaTable(self.uris[kind], storage_options=self.storage_options)

    def output_version(self) -> int:
        """Last IntoTime whose output is stored (-1: none)."""
        return app_version(self.table("output"), OUTPUT_APP, -1)

    def temp_version(self) -> int:
        """Last IntoTime whose TEMP state is stored (-1: none)."""
        return app_version(self.table("temp"), TEMP_APP, -1)

    def read_output(self, as_of: int | None = None) -> list[dict]:
        """Output rows (at or before ``as_of``), in publication order."""
        flt = None if as_of is None else pc.field("into_time") <= as_of
        rows = read_rows(self.table("output"), self.schemas["output"], flt).to_pylist()
        return sorted(rows, key=lambda r: (r["into_time"], r["partition"], r["offset"]))

    def read_temp(self, as_of: int | None = None) -> TxState:
        """The TEMP state as of IntoTime ``as_of`` (default: the last processed one)."""
        flt = None if as_of is None else pc.field("into_time") <= as_of
        rows = read_rows(self.table("temp"), self.schemas["temp"], flt).to_pylist()
        return TxState.from_updates((self._record(r), r["into_time"], r["diff"]) for r in rows)

    def _record(self, row: dict) -> TempRecord:
        if row["kind"] == KIND_PUBLISHED:
            return PublishedId(row["tx_id"])
        record = (parse_data(row, self.data_columns) if row["kind"] == KIND_DATA
                  else parse_tx(row, self.data_columns))
        if record is None or record.tx_id != row["tx_id"]:
            raise WarehouseError(f"{self.uris['temp']}: stored {row['kind']} row at {_at(row)} does not parse "
                                 f"back to transaction {row['tx_id']!r}")
        return record

    def temp_row(self, record: TempRecord, into_time: int, diff: int) -> dict:
        row = {"kind": KIND_PUBLISHED, "tx_id": record.tx_id, "into_time": into_time, "diff": diff}
        if not isinstance(record, PublishedId):
            row.update(zip(self.data_columns, record.payload), kind=KIND_DATA if isinstance(record, DataEvent)
                       else KIND_TX, partition=record.partition, offset=record.offset)
        return row

    def output_rows(self, published: list[PublishedTx]) -> list[dict]:
        return [{**dict(zip(self.data_columns, e.payload)), "partition": e.partition, "offset": e.offset,
                 "tx_id": p.tx_id, "into_time": p.into_time, "diff": 1}
                for p in published for e in p.events]

    def append(self, kind: str, rows: list[dict], app_id: str, version: int) -> None:
        append_rows(self.table(kind), pa.Table.from_pylist(rows, schema=self.schemas[kind]), app_id, version)


# --- the step ---------------------------------------------------------------------------------------


def publish_transactions(name: str, data_source: str, tx_source: str, runtime: Where = None,
                         spark=None) -> dict:
    """Process every IntoTime up to the least reclocked upper of both sources; idempotent, restartable."""
    runtime = Runtime.of(runtime, spark)
    with runtime.source(data_source, connect=False, create=True) as data_ctx, \
            runtime.source(tx_source, connect=False, create=True) as tx_ctx:
        data_tables, tx_tables = data_ctx.tables, tx_ctx.tables
        data_schema = data_tables.schemas["reclocked"]
        if data_schema != tx_tables.schemas["reclocked"]:
            raise WarehouseError(f"{data_source} and {tx_source} must have the same reclocked schema "
                                 f"(two Kafka sources): {schema_diff(tx_tables.schemas['reclocked'], data_schema)}")
        if "value" not in data_tables.data_columns:
            raise WarehouseError(f"{data_source}: Debezium records need a 'value' column")
        partition_type = data_schema.field("partition").type
        txn = TxnTables(runtime.warehouse, name, partition_type,
                        pa.schema([data_schema.field(c) for c in data_tables.data_columns]), data_ctx.spark)
        temp_v, out_v = txn.temp_version(), txn.output_version()
        if out_v < temp_v:
            raise WarehouseError(f"{name}: TEMP is at {temp_v} but the output only at {out_v}; "
                                 f"the output is always written first")
        data_dt, tx_dt = data_tables.table("reclocked"), tx_tables.table("reclocked")
        upto = min(app_version(data_dt, RECLOCKED_APP, -1), app_version(tx_dt, RECLOCKED_APP, -1))
        result = {"name": name, "from": temp_v + 1, "upto": max(upto, temp_v), "published_transactions": 0,
                  "published_rows": 0}
        if upto <= temp_v:
            return {**result, "pending": txn.read_temp().pending()}
        if upto < out_v:
            raise WarehouseError(f"{name}: output is at {out_v} but the sources are reclocked only up to {upto}")
        window = (pc.field("into_time") > temp_v) & (pc.field("into_time") <= upto)
        data_rows = read_rows(data_dt, data_schema, window).to_pylist()
        tx_rows = read_rows(tx_dt, data_schema, window).to_pylist()
        for source, tables in ((data_source, data_tables), (tx_source, tx_tables)):
            since = tables.since()  # recorded before any compaction rewrites rows, so read after them
            if since > temp_v and (temp_v >= 0 or out_v >= 0):
                raise WarehouseError(f"{name}: {source} is compacted to {since}, beyond the last processed "
                                     f"IntoTime {temp_v}; its reclocked IntoTimes can no longer be told apart")

        columns = txn.data_columns
        for row in data_rows + tx_rows:
            if row["diff"] != 1:
                raise TransactionError(f"reclocked row at {_at(row)} has diff {row['diff']}; expected 1 per record")
        data = [(r["into_time"], e) for r in data_rows if (e := parse_data(r, columns)) is not None]
        txs = [(r["into_time"], parse_tx(r, columns)) for r in tx_rows]
        state = txn.read_temp()
        partitions = {t.partition for _, t in txs} | {t.partition for t in state.txs}
        if len(partitions) > 1:
            raise TransactionError(f"{tx_source}: the transaction topic must have one partition, "
                                   f"found records in {sorted(partitions)}")
        published, updates, after = fold_with_updates(batches(data, txs), state)

        new_output = [p for p in published if p.into_time > out_v]
        if out_v < upto:
            txn.append("output", txn.output_rows(new_output), OUTPUT_APP, upto)
        txn.append("temp", [txn.temp_row(r, t, diff) for r, t, diff in updates], TEMP_APP, upto)
        log.info("%s: IntoTimes %d..%d publish %d transactions; %d pending", name, temp_v + 1, upto,
                 len(published), len(after.pending()))
        return {**result, "published_transactions": len(new_output),
                "published_rows": sum(len(p.events) for p in new_output), "pending": after.pending()}
