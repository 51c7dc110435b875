"""What the progress view and ``reclock status`` show, gathered from the warehouse and the upstreams (read-only).

:func:`collect` returns one JSON-able dict per configured source: ``since``, the remap
and reclocked uppers, the bound frontier and its history (``Remap.progress()``), the
upstream frontier and the lags (in offsets; for a source that lands what it reads, Kinesis, also in time:
``lag_ms``, each shard's ``MillisBehindLatest`` at its last read), the names of its partitions where the source
has them (``partition_names``: a files source's file names), the last check record (:mod:`reclock.check_log`), and
the number of records in the source's dead-letter table (``dead_letters``: None while it has none).

It never creates tables and never lets one source spoil the others: the warehouse side is
read without connecting to the upstream (so an unreachable upstream still shows its bound
history), and each failure is kept as an error string on its source (``error``,
``upstream_error``, ``last_check_error``).

Without asking the upstreams (``upstream=False``, the progress page), the upstream upper is the last one the
tick measured, before binding it (:meth:`SourceTables.upstream_sample`), with when and by which step
(``upstream_measured_at``, ``upstream_measured_by``); the lag is what that upper is ahead of the bound frontier
now.  An upstream that is asked answers for itself (``upstream_measured_by`` None);
when it cannot be reached, the last measured upper stays with the error.

One upstream that cannot be reached hides nothing else.  Upstreams are asked concurrently, each
with its own deadline (:func:`probe_upper`): the source is built with its client timeout
(``timeout_s``, when its kind has one) at most :data:`UPSTREAM_TIMEOUT_S`, and an answer that
has not come within :data:`UPSTREAM_DEADLINE_S` is given up.  Meanwhile the client's own logs
(librdkafka's connection retries) are kept off the handlers; the last one is added to the
reason.  A failed source gets ``upstream_error`` (``upstream unreachable: <reason>``, one line)
and ``upstream_unreachable_since``, the time this call failed to reach it (ms).
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from . import check_log
from .config import Config, ConfigError, load_config
from .connections import resolved_options
from .engine import Frontier
from .engine.upstream import to_gauge
from .sources import SourceError, build_source, source_options
from .sources.kafka import CLIENT_LOGGER
from .clock import now_ms
from .storage import SourceTables, Warehouse

#: The client timeout (``timeout_s``) an upstream is asked with, at most (seconds).
UPSTREAM_TIMEOUT_S = 3.0
#: How long an upstream's upper is waited for, at most (seconds): the client timeout and a margin.
UPSTREAM_DEADLINE_S = 2 * UPSTREAM_TIMEOUT_S


def collect(config_path: str | None = None, now: int | None = None, upstream: bool = True) -> dict[str, Any]:
    """``{"generated_at", "config", "warehouse", "error", "sources": [...]}`` for every configured source."""
    now = now if now is not None else now_ms()
    try:
        config = load_config(config_path)
    except ConfigError as e:
        return {"generated_at": now, "config": None, "warehouse": None, "error": str(e), "sources": []}
    return {"generated_at": now, "config": str(config.path), "warehouse": config.warehouse, "error": None,
            "sources": collect_sources(config, upstream)}


def collect_sources(config: Config, upstream: bool = True) -> list[dict[str, Any]]:
    """:func:`source_progress` of every configured source, concurrently, in the config's order."""
    names = list(config.sources)
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(names))), thread_name_prefix="reclock-progress") as pool:
        return list(pool.map(lambda n: source_progress(config, n, upstream), names))


def source_progress(config: Config, name: str, upstream: bool = True) -> dict[str, Any]:
    """Everything the view shows about one source; failures become error strings, never exceptions."""
    source_config = config.source(name)
    uri = Warehouse(config.warehouse).source_uri(name)
    row: dict[str, Any] = {
        "source": name, "kind": source_config.kind, "uri": uri, "error": None, "tables": False,
        "since": None, "remap_upper": None, "reclocked_upper": None, "bound_frontier": {}, "progress": [],
        "upstream_frontier": None, "upstream_error": None, "upstream_unreachable_since": None,
        "lag_offsets": None, "lag_by_partition": {}, "upstream_measured_at": None, "upstream_measured_by": None,
        "publish_lag_ms": None, "last_check": None, "last_check_error": None,
        "on_bad_record": source_config.on_bad_record, "dead_letters": None,
        "lag_ms": None, "lag_ms_by_partition": {}, "lag_ms_measured_at": None, "partition_names": {},
    }
    bound = base = Frontier()
    sample = None
    try:
        tables = read_only_tables(uri, config.storage_options)
        if tables is not None:
            sample = tables.upstream_sample()
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
                publish_lag_ms=max(0, remap.upper - max(reclocked_upper, first)),
                dead_letters=tables.dead_letter_count())
            if behind := tables.landing_state().get("behind"):  # a source that lands what it reads (Kinesis)
                lags = {shard: ms for shard, (ms, _) in behind.items()}
                row.update(lag_ms=max(lags.values()), lag_ms_by_partition=lags,
                           lag_ms_measured_at=max(at for _, at in behind.values()))
    except Exception as e:  # noqa: BLE001 - shown on the page for this source only
        row["error"] = f"cannot read the warehouse tables at {uri}: {_describe(e)}"
    try:
        row["last_check"] = check_log.read(uri, config.storage_options)
    except Exception as e:  # noqa: BLE001
        row["last_check_error"] = f"cannot read {uri}/{check_log.FILE_NAME}: {_describe(e)}"
    if sample is not None:  # the last upper a step measured; a live answer below replaces it
        _lag(row, sample["upper"], bound, sample["measured_at"], sample["step"])
        row["partition_names"] = sample.get("names") or {}  # a files source's file names, as the tick saw them
    if upstream:
        try:
            options = resolved_options(source_config)  # its Airflow connection, if it names one
            _lag(row, to_gauge(probe_upper(source_config.kind, options), base), bound, now_ms(), None)
        except Exception as e:  # noqa: BLE001
            reason = str(e) if isinstance(e, UpstreamUnreachable) else _describe(e)
            row.update(upstream_error=f"upstream unreachable: {reason}", upstream_unreachable_since=now_ms())
    return row


def _lag(row: dict[str, Any], upper: Frontier, bound: Frontier, at: int, step: str | None) -> None:
    """The upstream upper measured at ``at`` (by pipeline step ``step``; None: asked now) and what it is ahead of
    the bound frontier now."""
    lag = upper.ahead_of(bound)
    row.update(upstream_frontier=upper.as_json(), lag_offsets=sum(lag.values()),
               lag_by_partition={str(p): n for p, n in lag.items()}, upstream_measured_at=at,
               upstream_measured_by=step)


class UpstreamUnreachable(SourceError):
    """:func:`probe_upper` got no upper; the message is the reason, on one line."""


class _Probing(threading.local):
    logs: list[str] | None = None  # set in a probe's thread: its client's logs go here, not to the handlers


_probing = _Probing()


class _KeepProbeLogsAside(logging.Filter):
    """Drops the client log records of probe threads, keeping the last one's message for the reason."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _probing.logs is None:
            return True
        _probing.logs[:] = [record.getMessage()]
        return False


logging.getLogger(CLIENT_LOGGER).addFilter(_KeepProbeLogsAside())


def probe_options(kind: str, options: dict[str, Any], timeout_s: float = UPSTREAM_TIMEOUT_S) -> dict[str, Any]:
    """``options`` with the kind's client timeout (``timeout_s``, when it has one) at most ``timeout_s``."""
    known = source_options(kind)
    if known is None or "timeout_s" not in known:
        return dict(options)
    configured = options.get("timeout_s", known["timeout_s"].default)
    return {**options, "timeout_s": min(configured, timeout_s)}


def probe_upper(kind: str, options: dict[str, Any], timeout_s: float = UPSTREAM_TIMEOUT_S,
                deadline_s: float = UPSTREAM_DEADLINE_S) -> Frontier:
    """The upstream's upper frontier, asked in a thread of its own with its client timeout at most ``timeout_s``;
    :class:`UpstreamUnreachable` when it fails or has not answered within ``deadline_s`` (the thread is left
    to its client timeout).  The client's own logs in that thread stay off the handlers; the last one ends the
    error's message."""
    outcome: dict[str, Any] = {}
    logs: list[str] = []

    def ask() -> None:
        _probing.logs = logs
        try:
            source = build_source({"kind": kind, **probe_options(kind, options, timeout_s)})
            try:
                outcome["upper"] = source.upper()
            finally:
                source.close()
        except Exception as e:  # noqa: BLE001 - reported by the caller's thread
            outcome["error"] = e

    thread = threading.Thread(target=ask, name="reclock-upstream-probe", daemon=True)
    thread.start()
    thread.join(deadline_s)
    if "upper" in outcome:
        return outcome["upper"]
    reason = _describe(outcome["error"]) if "error" in outcome else f"no answer within {deadline_s:g} s"
    raise UpstreamUnreachable(reason + (f" (last client log: {' '.join(logs[-1].split())})" if logs else ""))


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
    """``Type: message`` on one line."""
    text = " ".join(str(e).split()) or repr(e)
    return f"{type(e).__name__}: {text}"


def data_docs_file(source: str, page: str, config_path: str | None = None) -> str | None:
    """The file of ``page`` in configured ``source``'s Great Expectations Data Docs site (None when there is no such
    source or file, or ``page`` leaves the site), once a build of its pages in flight has ended."""
    import os

    from .gx_context import DOCS, root_of, settled

    config = load_config(config_path)
    if source not in config.sources:
        return None
    root = root_of(Warehouse(config.warehouse).source_uri(source), source)
    settled(root)  # a build of the last check's pages in flight (reclock.validator) ends first
    site = os.path.realpath(os.path.join(root, DOCS))
    path = os.path.realpath(os.path.join(site, page or "index.html"))
    return path if path.startswith(site + os.sep) and os.path.isfile(path) else None
