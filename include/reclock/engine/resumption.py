"""Bounded input reliance (seed 003): where a restart resumes and what upstream may forget."""
from __future__ import annotations

from .frontier import Frontier
from .remap import Remap, RemapError


def timestamp_resumption_frontier(*uppers: int) -> int:
    """The IntoTime a restart resumes at: the meet (minimum) of the uppers of remap and reclocked."""
    if not uppers:
        raise ValueError("need at least one upper")
    return min(uppers)


def offset_resumption_frontier(remap: Remap, resume_at: int) -> Frontier:
    """The source frontier already durable at IntoTime ``resume_at``: safe to commit upstream.

    It is ``remap[resume_at - 1]``; before any binding it is the empty frontier (nothing done).
    """
    if resume_at <= 0 or not remap.bindings or resume_at <= remap.bindings[0].into_time:
        return Frontier()
    if resume_at - 1 < remap.since:
        raise RemapError(f"resumption at {resume_at} is behind since {remap.since}: compaction overtook durability")
    return remap.at(min(resume_at - 1, remap.upper - 1))
