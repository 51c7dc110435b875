"""The last check report of each source, kept as JSON next to its tables.

``pipeline.check`` records every run here (success or failure) before it raises, so
the progress view can show the last results without Airflow's XComs.  The record lives
at ``<warehouse>/<source>/last_check.json``, beside the ``remap`` and ``reclocked``
Delta tables: a side file (:mod:`reclock.storage.side_files`), replaced whole by each check.

It is reclock's own small record of pass/fail per window (what ``publish`` requires); the full results are
in the source's Great Expectations stores, and ``data_docs`` is the folder of its Data Docs site
(:mod:`reclock.gx_context`), ``docs`` the run's pages in it.  A record::

    {"version": 1, "source": "orders", "checked_at": <ms>, "success": false,
     "window": [start, upto] | null, "remap_upper": <ms>, "data_docs": "<folder>" | null,
     "remap_digest": "<sha256>" | null,     (the remap rows the remap check passed on: reclock.checks.remap_digest)
     "attempt": "<name>" | null,            (the window's staged attempt the checks read: the one publish publishes)
     "reports": {"remap": {"subject", "rows", "success", "failed", "summary", "docs": ["validations/...html"],
                           "results": [{"name", "success", "description", ...}]},
                 "reclocked": {...}}}
"""
from __future__ import annotations

import logging
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Mapping, Protocol

from .clock import now_ms
from .storage.side_files import read_json, write_json

if TYPE_CHECKING:
    from .check_report import CheckReport


class Located(Protocol):
    """Where a source's tables live (:class:`reclock.storage.SourceTables` is one)."""

    uri: str
    storage_options: Mapping[str, str] | None

FILE_NAME = "last_check.json"
VERSION = 1

log = logging.getLogger("reclock")


def entry(source: str, reports: Mapping[str, "CheckReport"], window: tuple[int, int] | None = None,
          remap_upper: int | None = None, checked_at: int | None = None, docs: str | None = None,
          remap_digest: str | None = None, attempt: str | None = None) -> dict[str, Any]:
    """The JSON-able record of one check run (``docs``: the folder of the source's Data Docs site;
    ``remap_digest``: that of the remap the run's remap check passed on, else None; ``attempt``: the name of the
    window's staged attempt the checks read, :meth:`reclock.storage.staging.StagingTables.attempt_name`)."""
    return {
        "version": VERSION,
        "source": source,
        "checked_at": checked_at if checked_at is not None else now_ms(),
        "success": all(r.success for r in reports.values()),
        "window": list(window) if window is not None else None,
        "remap_upper": remap_upper,
        "data_docs": docs,
        "remap_digest": remap_digest if reports.get("remap") is not None and reports["remap"].success else None,
        "attempt": attempt,
        "reports": {kind: {**report.as_dict(), "summary": report.summary(), "docs": list(report.docs),
                           "results": [asdict(r) for r in report.results]}
                    for kind, report in reports.items()},
    }


def write(uri: str, record: Mapping[str, Any], storage_options: Mapping[str, str] | None = None) -> str:
    """Store ``record`` as ``<uri>/last_check.json`` (replacing the previous one); the path written."""
    return write_json(uri, FILE_NAME, record, storage_options)


def read(uri: str, storage_options: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The last record under ``uri``, or None when the source was never checked."""
    return read_json(uri, FILE_NAME, storage_options)


def record(tables: Located, name: str, reports: Mapping[str, "CheckReport"],
           window: tuple[int, int] | None = None, remap_upper: int | None = None,
           docs: str | None = None, remap_digest: str | None = None,
           attempt: str | None = None) -> dict[str, Any] | None:
    """Record a check run of source ``name`` next to its tables; None (and a warning) when it cannot be stored.

    A storage error here must not hide the check's own outcome, so it is logged, not raised.
    """
    result = entry(name, reports, window, remap_upper, docs=docs, remap_digest=remap_digest, attempt=attempt)
    try:
        write(tables.uri, result, tables.storage_options)
    except (OSError, ValueError) as e:
        log.warning("%s: could not record the check results under %s: %s", name, tables.uri, e)
        return None
    return result
