"""What the progress view shows, gathered from the warehouse and the upstreams (read-only).

:func:`collect` returns one JSON-able dict per configured source: ``since``, the remap
and reclocked uppers, the bound frontier and its history (``Remap.progress()``), the
upstream frontier and the lags, and the last check record (:mod:`reclock.check_log`).

Unlike :func:`reclock.status.status` it never creates tables and never lets one source
spoil the others: the warehouse side is read without connecting to the upstream (so an
unreachable upstream still shows its bound history), and each failure is kept as an
error string on its source (``error``, ``upstream_error``, ``last_check_error``).
Upstreams are asked concurrently, so one that times out delays the page only once.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from . import check_log
from .config import Config, ConfigError, load_config
from .engine import Frontier
from .engine.upstream import to_gauge
from .sources import build_source
from .clock import now_ms
from .warehouse import SourceTables, Warehouse


def collect(config_path: str | None = None, now: int | None = None, upstream: bool = True) -> dict[str, Any]:
    """``{"generated_at", "config", "warehouse", "error", "sources": [...]}`` for every configured source."""
    now = now if now is not None else now_ms()
    try:
        config = load_config(config_path)
    except ConfigError as e:
        return {"generated_at": now, "config": None, "warehouse": None, "error": str(e), "sources": []}
    names = list(config.sources)
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(names))), thread_name_prefix="reclock-progress") as pool:
        sources = list(pool.map(lambda n: source_progress(config, n, upstream), names))
    return {"generated_at": now, "config": str(config.path), "warehouse": config.warehouse, "error": None,
            "sources": sources}


def source_progress(config: Config, name: str, upstream: bool = True) -> dict[str, Any]:
    """Everything the view shows about one source; failures become error strings, never exceptions."""
    source_config = config.source(name)
    uri = Warehouse(config.warehouse).source_uri(name)
    row: dict[str, Any] = {
        "source": name, "kind": source_config.kind, "uri": uri, "error": None, "tables": False,
        "since": None, "remap_upper": None, "reclocked_upper": None, "bound_frontier": {}, "progress": [],
        "upstream_frontier": None, "upstream_error": None, "lag_offsets": None, "lag_by_partition": {},
        "publish_lag_ms": None, "last_check": None, "last_check_error": None,
    }
    bound = base = Frontier()
    try:
        tables = read_only_tables(uri, config.storage_options)
        if tables is not None:
            remap = tables.read_remap()
            bound = remap.frontier
            record = tables.upstream_record()
            base = record.base if record else base  # the upstream's offsets in the gauge (after a new epoch)
            reclocked_upper = tables.reclocked_upper()
            first = remap.bindings[0].into_time if remap.bindings else remap.upper
            row.update(
                tables=True, since=remap.since, remap_upper=remap.upper, reclocked_upper=reclocked_upper,
                bound_frontier=bound.as_json(),
                progress=[[r.into_time, r.partition, r.offset] for r in remap.progress()],
                publish_lag_ms=max(0, remap.upper - max(reclocked_upper, first)))
    except Exception as e:  # noqa: BLE001 - shown on the page for this source only
        row["error"] = f"cannot read the warehouse tables at {uri}: {_describe(e)}"
    try:
        row["last_check"] = check_log.read(uri, config.storage_options)
    except Exception as e:  # noqa: BLE001
        row["last_check_error"] = f"cannot read {uri}/{check_log.FILE_NAME}: {_describe(e)}"
    if upstream:
        try:
            source = build_source({"kind": source_config.kind, **source_config.options})
            try:
                upper = to_gauge(source.upper(), base)
            finally:
                source.close()
            lag = upper.ahead_of(bound)
            row.update(upstream_frontier=upper.as_json(), lag_offsets=sum(lag.values()),
                       lag_by_partition={str(p): n for p, n in lag.items()})
        except Exception as e:  # noqa: BLE001
            row["upstream_error"] = f"upstream unreachable: {_describe(e)}"
    return row


def read_only_tables(uri: str, storage_options: dict | None = None) -> SourceTables | None:
    """The source's tables for reading (partition and offset types from the stored remap), None before the first tick.

    Never creates anything, and needs no connection to the upstream.
    """
    if not DeltaTable.is_deltatable(f"{uri}/remap", storage_options):
        return None
    schema = pa.schema(DeltaTable(f"{uri}/remap", storage_options=storage_options).schema().to_arrow())
    return SourceTables(uri, schema.field("partition").type, pa.schema([]), storage_options,
                        offset_type=schema.field("increment").type)


def _describe(e: BaseException) -> str:
    text = str(e).strip() or repr(e)
    return f"{type(e).__name__}: {text}"
