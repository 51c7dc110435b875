"""The last check report of each source, kept as JSON next to its tables.

``pipeline.check`` records every run here (success or failure) before it raises, so
the progress view can show the last results without Airflow's XComs.  The record lives
at ``<warehouse>/<source>/last_check.json``, beside the ``remap`` and ``reclocked``
Delta tables (outside both, so vacuum never touches it), on the warehouse's own
storage: a local path by default, or an object store URI through
``pyarrow.fs.FileSystem.from_uri`` (S3 credentials and endpoint from the warehouse's
deltalake ``storage_options`` when given, else from the usual AWS environment).

It is reclock's own small record of pass/fail per window (what ``publish`` requires); the full results are
in the source's Great Expectations stores, and ``data_docs`` is the folder of its Data Docs site
(:mod:`reclock.gx_context`), ``docs`` the run's pages in it.  A record::

    {"version": 1, "source": "orders", "checked_at": <ms>, "success": false,
     "window": [start, upto] | null, "remap_upper": <ms>, "data_docs": "<folder>" | null,
     "reports": {"remap": {"subject", "rows", "success", "failed", "summary", "docs": ["validations/...html"],
                           "results": [{"name", "success", "description", ...}]},
                 "reclocked": {...}}}
"""
from __future__ import annotations

import json
import logging
import os
import uuid
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Mapping

import pyarrow.fs as pafs

from .clock import now_ms

if TYPE_CHECKING:
    from .checks import CheckReport
    from .warehouse import SourceTables

FILE_NAME = "last_check.json"
VERSION = 1

log = logging.getLogger("reclock")


def entry(source: str, reports: Mapping[str, "CheckReport"], window: tuple[int, int] | None = None,
          remap_upper: int | None = None, checked_at: int | None = None, docs: str | None = None) -> dict[str, Any]:
    """The JSON-able record of one check run (``docs``: the folder of the source's Data Docs site)."""
    return {
        "version": VERSION,
        "source": source,
        "checked_at": checked_at if checked_at is not None else now_ms(),
        "success": all(r.success for r in reports.values()),
        "window": list(window) if window is not None else None,
        "remap_upper": remap_upper,
        "data_docs": docs,
        "reports": {kind: {**report.as_dict(), "summary": report.summary(), "docs": list(report.docs),
                           "results": [asdict(r) for r in report.results]}
                    for kind, report in reports.items()},
    }


def write(uri: str, record: Mapping[str, Any], storage_options: Mapping[str, str] | None = None) -> str:
    """Store ``record`` as ``<uri>/last_check.json`` (replacing the previous one); the path written."""
    return write_json(uri, FILE_NAME, record, storage_options)


def write_json(uri: str, name: str, record: Mapping[str, Any], storage_options: Mapping[str, str] | None = None) -> str:
    """Store ``record`` as JSON in ``<uri>/<name>``, replacing it whole (a reader never sees half of it); the path."""
    fs, base = filesystem(uri, storage_options)
    path = f"{base}/{name}"
    data = json.dumps(record, sort_keys=True, default=str).encode()
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(base, recursive=True)
        tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
        with fs.open_output_stream(tmp) as f:
            f.write(data)
        fs.move(tmp, path)  # atomic rename: a reader never sees half a record
    else:
        with fs.open_output_stream(path) as f:  # one PUT on object stores
            f.write(data)
    return path


def read(uri: str, storage_options: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The last record under ``uri``, or None when the source was never checked."""
    fs, base = filesystem(uri, storage_options)
    try:
        with fs.open_input_stream(f"{base}/{FILE_NAME}") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    return json.loads(data)


def record(tables: "SourceTables", name: str, reports: Mapping[str, "CheckReport"],
           window: tuple[int, int] | None = None, remap_upper: int | None = None,
           docs: str | None = None) -> dict[str, Any] | None:
    """Record a check run of source ``name`` next to its tables; None (and a warning) when it cannot be stored.

    A storage error here must not hide the check's own outcome, so it is logged, not raised.
    """
    result = entry(name, reports, window, remap_upper, docs=docs)
    try:
        write(tables.uri, result, tables.storage_options)
    except (OSError, ValueError) as e:
        log.warning("%s: could not record the check results under %s: %s", name, tables.uri, e)
        return None
    return result


def filesystem(uri: str, storage_options: Mapping[str, str] | None) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem for ``uri`` and the path of ``uri`` on it."""
    if "://" not in uri or uri.startswith("file://"):
        path = uri[len("file://"):] if uri.startswith("file://") else uri
        return pafs.LocalFileSystem(), os.path.abspath(path).rstrip("/") or "/"
    if uri.startswith(("s3://", "s3a://")) and storage_options:
        return _s3(storage_options), uri.split("://", 1)[1].rstrip("/")
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path.rstrip("/")


def _s3(options: Mapping[str, str]) -> pafs.S3FileSystem:
    """pyarrow's S3 filesystem from deltalake (object_store) storage options."""
    o = {k.upper(): v for k, v in options.items()}
    endpoint = o.get("AWS_ENDPOINT_URL") or o.get("AWS_ENDPOINT")
    kwargs: dict[str, Any] = {
        "access_key": o.get("AWS_ACCESS_KEY_ID"), "secret_key": o.get("AWS_SECRET_ACCESS_KEY"),
        "session_token": o.get("AWS_SESSION_TOKEN"), "region": o.get("AWS_REGION") or o.get("AWS_DEFAULT_REGION"),
    }
    if endpoint:
        scheme, _, host = endpoint.partition("://") if "://" in endpoint else ("https", "", endpoint)
        kwargs.update(endpoint_override=host, scheme=scheme)
    if str(o.get("AWS_ALLOW_HTTP", "")).lower() == "true":
        kwargs["scheme"] = "http"
    return pafs.S3FileSystem(**{k: v for k, v in kwargs.items() if v is not None})
