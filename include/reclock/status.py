"""Where each source stands: since, uppers, bound and upstream frontiers, lag."""
from __future__ import annotations

from . import pipeline
from .config import load_config


def status(config_path: str | None = None) -> list[dict]:
    """One row per configured source."""
    rows = []
    for name in load_config(config_path).sources:
        with pipeline.open_source(name, config_path) as ctx:
            remap = ctx.tables.read_remap()
            upstream = ctx.source.upper()
            rows.append({"source": name, "since": ctx.tables.since(), "remap_upper": remap.upper,
                         "reclocked_upper": ctx.tables.reclocked_upper(),
                         "bound_frontier": remap.frontier.as_json(), "upstream_frontier": upstream.as_json(),
                         "lag_offsets": sum(upstream.ahead_of(remap.frontier).values())})
    return rows
