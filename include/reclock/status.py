"""Where each source stands: since, uppers, bound and upstream frontiers, lag; every source, always.

Read as the progress page reads it (:func:`reclock.progress.collect_sources`): the warehouse side
without contacting the upstream and without creating anything, every upstream concurrently within
a few seconds (:data:`reclock.progress.UPSTREAM_DEADLINE_S`) and with its client's own logs kept
off the terminal.  An upstream that cannot be reached does not stop the others: its row keeps its
warehouse frontiers and says ``"lag_offsets": "unreachable since <ISO time this call failed to
reach it>"`` with one line of reason in ``upstream_error``, and the upstream frontier the last tick measured in
``last_measured_upstream``.  A source never ticked has no tables
yet: ``since`` and the uppers are null.  Only a sources file that does not load is an error.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from .progress import collect_sources
from .runtime import Runtime, Where

FIELDS = ("source", "since", "remap_upper", "reclocked_upper", "bound_frontier", "upstream_frontier", "lag_offsets")


def status(runtime: Where = None) -> list[dict]:
    """One row per configured source."""
    return [status_row(progress) for progress in collect_sources(Runtime.of(runtime).config)]


def status_row(progress: dict[str, Any]) -> dict[str, Any]:
    """The status of one source from its :func:`reclock.progress.source_progress` row."""
    row = {key: progress[key] for key in FIELDS}
    if progress["upstream_error"]:
        since = datetime.fromtimestamp(progress["upstream_unreachable_since"] / 1000, timezone.utc)
        row.update(lag_offsets=f"unreachable since {since.isoformat(timespec='seconds')}", upstream_frontier=None,
                   upstream_error=progress["upstream_error"].removeprefix("upstream unreachable: "))
        if progress.get("upstream_measured_by") is not None:  # what the last tick measured, for reference
            at = datetime.fromtimestamp(progress["upstream_measured_at"] / 1000, timezone.utc)
            row["last_measured_upstream"] = {"frontier": progress["upstream_frontier"], "by": progress[
                "upstream_measured_by"], "at": at.isoformat(timespec="seconds")}
    if progress.get("partition_names"):  # files: the file holding each identity (its last known name)
        row["partition_names"] = progress["partition_names"]
    if progress.get("lag_ms") is not None:  # Kinesis: how far behind the stream's tip its last read was
        at = datetime.fromtimestamp(progress["lag_ms_measured_at"] / 1000, timezone.utc)
        row.update(lag_ms=progress["lag_ms"], lag_ms_by_partition=progress["lag_ms_by_partition"],
                   lag_ms_measured_at=at.isoformat(timespec="seconds"))
    if progress["error"]:
        row["error"] = progress["error"]
    return row
