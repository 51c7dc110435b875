"""The check step's two paths (:func:`reclock.pipeline.check` chooses): an idle run's record, made without validating
(:func:`idle_check`), and the checks of a staged batch (:func:`check_batch`).

An idle run needs no validation when the remap is the one the last check passed on (equal
:func:`reclock.checks.remap_digest`: equal outcomes) and its window holds no record and no dead letter: every
expectation is per row, and there is none, so each would pass again.
"""
from __future__ import annotations

import logging

from . import offsets
from .engine import Remap
from .runtime import SourceContext
from .sources.base import PrimaryKeys, offers
from .storage import WarehouseError

log = logging.getLogger("reclock")


def idle_check(name: str, ctx: SourceContext, remap: Remap, window: tuple[int, int] | None,
                digest: str) -> dict | None:
    """The check of an idle source's run, recorded without validating (module docstring); None when it must
    validate: the last check failed or saw another remap, or the window has records or dead letters (or is not
    staged, or a source with primary keys staged it without them: the full check says so)."""
    from . import check_log
    from .check_report import CheckReport, CheckResult

    last = check_log.read(ctx.tables.uri, ctx.tables.storage_options) or {}
    if not (last.get("success") and last.get("remap_digest") == digest and "remap" in last.get("reports", {})):
        return None
    if window is not None:
        try:
            if ctx.tables.staged_rows(window[1]) or ctx.tables.staged_dead_letter_rows(window[1]):
                return None
            if offers(ctx.source, PrimaryKeys) and (ctx.tables.staged_metadata(window[1]) or {}).get(
                    "primary_keys") is None:
                return None
        except WarehouseError:
            return None
    passed = last["reports"]["remap"]
    results = {"remap": CheckReport(f"{passed['subject']}, unchanged since the check at {last['checked_at']}",
                                    passed["rows"], tuple(CheckResult(**r) for r in passed["results"]))}
    if window is not None:
        results["reclocked"] = CheckReport(f"reclocked batch of IntoTimes {window[0]}..{window[1]}: no records and no "
                                           "dead letters, nothing to validate", 0, ())
    upper = remap.upper if window is None else remap.until(window[1] + 1).upper  # as the full check records it
    check_log.record(ctx.tables, name, results, window, upper, docs=last.get("data_docs"), remap_digest=digest,
                     attempt=window and ctx.tables.attempt_name(window[1]))
    log.info("%s: checks passed without validating: remap unchanged since the check at %d, %s", name,
             last["checked_at"], "nothing pending" if window is None else f"IntoTimes {window[0]}..{window[1]} empty")
    return {k: v.summary() for k, v in results.items()}


def stale_stage(name: str, ctx: SourceContext, window: tuple[int, int] | None, step: str) -> dict | None:
    """What ``step`` (check or publish) returns, having done nothing, when the staged batch of ``window`` began
    before the window does (its attempt records the start it was staged from); None otherwise.

    Two runs of one source (a schedule beside a manual run): one stages from ``start``, the other publishes the
    window it checked, a prefix of that, meanwhile.  The batch then holds records already published: nothing of it
    may be checked against the window that is left (its ``in_window`` check would fail on them) or published.  The
    step ends saying so; the next run stages the window that is left."""
    if window is None:
        return None
    try:
        began = (ctx.tables.staged_metadata(window[1]) or {}).get("start")
    except WarehouseError:  # no complete attempt: the step says so
        return None
    if began is None or began >= window[0]:
        return None
    log.warning("%s: another run published IntoTimes up to %d after this batch of IntoTimes %d..%d was staged; this "
                "%s did nothing more (the next run stages IntoTimes %d..%d)", name, window[0] - 1, began, window[1],
                step, window[0], window[1])
    return {"published_by_another_run": True, "stale_batch": [began, window[1]]}


def failed_by_another_run(name: str, ctx: SourceContext, window: tuple[int, int], results: dict) -> bool:
    """Whether the batch of ``window`` failed its checks (``results``: by kind) because another run published
    part of the window while they ran; logged when so.

    Two runs of one source may stage one window (a schedule beside a manual run); the later attempt is the one
    published, by whichever run publishes first.  A check running meanwhile reads the published history with
    this batch's rows already in it, and the batch again: every key it touches seems held twice (the history and
    primary-key checks fail), though nothing was published twice.  When any of the window is published (its
    reclocked upper is past the window's start, which it was not when the check began: :func:`stale_stage`), the
    failure is that race: the batch was checked by the run that published it, and what is left of the window is
    staged and checked again by the next run.  A failed remap check, and failed results while nothing of the
    window is published, are this check's own."""
    if all(report.success for kind, report in results.items() if kind != "remap"):
        return False
    if (upper := ctx.tables.reclocked_upper()) <= window[0]:
        return False
    failed = sorted(kind for kind, report in results.items() if kind != "remap" and not report.success)
    log.warning("%s: another run published IntoTimes up to %d while this check of IntoTimes %d..%d ran; its %s "
                "checks failed on the rows published meanwhile, read twice; this check did nothing more", name,
                upper - 1, window[0], window[1], ", ".join(failed))
    return True


def check_batch(ctx: SourceContext, remap: Remap, window: tuple[int, int], gx) -> dict:
    """The checks of the staged batch of ``window``: summarized with Arrow first (:mod:`reclock.batch_summary`),
    read in Spark (DataFrames of the staged Parquet files) only by the checks the summary does not settle."""
    from .batch_summary import COLUMNS, summarize
    from .checks import check_consolidated, check_dead_letters, check_primary_keys, check_reclocked

    start, upto = window
    read: list = []

    def batch():  # the staged batch in Spark, read once, by the first check that needs it
        if not read:
            read.append(ctx.tables.read_staged_spark(upto))
        return read[0]

    summary = summarize(ctx.tables.staged_batches(upto, COLUMNS)) if ctx.tables.offset_type == offsets.INT64 else None
    results = {"reclocked": check_reclocked(batch, remap, start, offsets_unique=ctx.config.offsets_unique, gx=gx,
                                            empty=ctx.tables.staged_rows(upto) == 0, summary=summary)}
    if (dead_letters := ctx.tables.read_staged_dead_letters_spark(upto)) is not None:
        results["dead_letter"] = check_dead_letters(dead_letters, batch(), remap, start, gx=gx)
    if not ctx.config.offsets_unique:  # records are diffs
        from .spark.labels import offset_label

        published = ctx.tables.read_reclocked_spark()  # opens Spark first: a Column needs a session (with Spark
        label = offset_label(ctx.config.kind)  # Connect, pyspark's functions are Connect's once one is open)
        results["history"] = check_consolidated(
            published, batch(), list(getattr(ctx.source, "content_columns", None) or ctx.tables.data_columns),
            label, gx=gx)
        if offers(ctx.source, PrimaryKeys):
            keys = (ctx.tables.staged_metadata(upto) or {}).get("primary_keys")
            results["primary_key"] = check_primary_keys(published, batch(), keys, label, gx=gx)
    return results
