"""The steps of one source's pipeline: tick -> stage (Spark) -> check -> publish -> resume -> compact.

Each step reloads durable state from the warehouse, so any step can be killed and
re-run: ticks and publishes are single idempotent Delta commits, staging
overwrites its own directory, and resumption/compaction only move forward.
Every function returns a small JSON-able dict (Airflow puts it in XCom).
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from . import points
from .clock import now_ms
from .engine import Frontier, Remap, offset_resumption_frontier, timestamp_resumption_frontier
from .compact_step import prune_landing, retire
from .engine.upstream import (clip_ranges, identity_problems, lost_problems, tick_problems, to_upstream)
from .runtime import Runtime, SourceContext, Where
from .sources.base import (LandsTicks, NamedPartitions, PrimaryKeys, Snapshotting, SourceError, TableColumns,
                           Truncating, identity_of, offers, released_frontier, starting_frontier)
from .storage import ConcurrentWriteError, SourceTables, UpstreamRecord
from .typed_tables import compact_typed, since_bound, type_published

log = logging.getLogger("reclock")


TICK_ATTEMPTS = 3  # a tick that lost a race to another tick of its source reads again this many times


def tick(name: str, runtime: Where = None, now: int | None = None, spark=None) -> dict:
    """Bind the source's current upper frontier to IntoTime ``now`` (ms; default the wall clock) in ``remap``.

    A tick racing another tick of the source (a scheduled and a manual run, the CLI) commits only if remap
    is still as it read it (:meth:`SourceTables.append_binding`); the loser reads again and retries.
    """
    with Runtime.of(runtime, spark).source(name, create=True) as ctx:
        for attempt in range(1, TICK_ATTEMPTS + 1):
            try:
                return _tick_once(name, ctx, now)
            except ConcurrentWriteError as e:
                if attempt == TICK_ATTEMPTS:
                    raise
                log.warning("%s: tick lost a race (%s); reading remap again (attempt %d of %d)",
                            name, e, attempt + 1, TICK_ATTEMPTS)


def _tick_once(name: str, ctx: SourceContext, now: int | None) -> dict:
    remap = ctx.tables.read_remap()
    landed = _land_initial_snapshot(name, ctx, remap)
    record = upstream_record_of(name, ctx, remap)
    ctx.base, ctx.retired = record.base, record.retired  # the upstream as of the record this tick checks
    landed = _land_tick(name, ctx, remap, record, landed)
    frontier = ctx.source.upper().join(landed)  # landed partitions are held here, whatever upstream does
    problems = tick_problems(remap.frontier, record.start, frontier, released_frontier(ctx.source),
                             record.identity, identity_of(ctx.source))
    if problems:
        raise SourceError(f"{name} ({ctx.source!r}): the upstream is not the stream remap has bound: "
                          + "; ".join(problems) + f"; nothing written. {UPSTREAM_HELP}")
    if now is None:  # the wall clock may step back: bind at the remap upper then
        wall_clock = now_ms()
        now = remap.binding_time(wall_clock)
        if now > wall_clock:
            log.warning("%s: the wall clock %d is behind the remap upper %d (a clock stepped back, or a skewed "
                        "worker): binding at %d", name, wall_clock, remap.upper, now)
    after = remap.mint(now, frontier)  # RemapError: an explicit time went backwards; nothing written
    if ctx.tables.upstream_record() != record:  # e.g. a new epoch began since: read it again (a commit of it
        # landing while this one runs is a Delta conflict, ConcurrentWriteError too)
        raise ConcurrentWriteError(f"{name}: remap's upstream record changed since the tick read it; nothing written")
    written = ctx.tables.append_binding(remap, after, upstream=frontier)
    _sample_upstream(name, ctx, frontier, remap.frontier, "tick")
    moved = sum(frontier.increments_from(remap.frontier).values())
    log.info("%s: tick at %d binds %s (+%d offsets)%s", name, now, frontier, moved,
             f"; files: {ctx.source.partition_names()}" if offers(ctx.source, NamedPartitions) else "")
    return {"into_time": now, "frontier": frontier.as_json(), "new_offsets": moved, "written": written}


def _sample_upstream(name: str, ctx: SourceContext, upper: Frontier, bound: Frontier, step: str) -> None:
    """Keep the upstream's upper as ``step`` just measured it, with what was bound then (the last known lag)."""
    from . import clock  # the wall clock itself: a tick's IntoTime may come from elsewhere (and tests patch now_ms)

    names = ctx.source.partition_names() if offers(ctx.source, NamedPartitions) else None
    try:
        ctx.tables.record_upstream_sample(upper, bound, step, clock.now_ms(), names)
    except OSError as e:  # the progress page's cache only: never fails the step
        log.warning("%s: could not keep the upstream sample: %s", name, e)


def _land_initial_snapshot(name: str, ctx: SourceContext, remap: Remap) -> Frontier:
    """Before a source's first binding, land the records it can serve only now (a Postgres source's initial
    snapshot: ``source.export_snapshot()``) in the warehouse; the uppers of every landed partition.

    A source whose first tick was killed while copying has a slot but nothing landed and nothing bound:
    its slot is dropped and the snapshot taken again.  The export (and the source's snapshot lock) stays
    open until the landing commits, so a racing first tick cannot drop the slot under it: it fails.
    """
    landed = ctx.tables.landed()
    if not offers(ctx.source, Snapshotting) or not ctx.source.snapshot or landed.partitions or remap.upper > 0:
        return landed
    if ctx.source.started():
        log.warning("%s: %r has a slot but its initial snapshot never landed (a first tick killed while copying): "
                    "dropping the slot and taking the snapshot again", name, ctx.source)
        ctx.source.drop_slot()
    from .spark.source import read_ranges_python

    with ctx.source.export_snapshot() as snapshot:
        ranges = [(0, partition, 0, upper) for partition, upper in snapshot.uppers.items()]
        log.info("%s: landing the initial snapshot of %r at its consistent point: %s", name, ctx.source,
                 ", ".join(f"{p} ({u >> 16} blocks)" for p, u in snapshot.uppers.items()) or "no rows")
        ctx.tables.land(read_ranges_python(ctx.spark, {**ctx.spec, "exported": snapshot.spec}, ranges),
                        Frontier.of(snapshot.uppers))
    return ctx.tables.landed()


def _land_tick(name: str, ctx: SourceContext, remap: Remap, record: UpstreamRecord, landed: Frontier) -> Frontier:
    """For a source that lands what each tick reads (``source.lands_ticks``, Kinesis: no high watermark to
    sample): take its new records (``source.take``) and land them in one idempotent commit with the state the
    source keeps between ticks; the uppers of every landed partition.  A replaced upstream is refused first,
    so nothing of it is landed."""
    if not offers(ctx.source, LandsTicks):
        return landed
    if other := identity_problems(record.identity, identity_of(ctx.source)):
        raise SourceError(f"{name} ({ctx.source!r}): the upstream is not the stream remap has bound: "
                          + "; ".join(other) + f"; nothing landed or written. {UPSTREAM_HELP}")
    state = ctx.tables.landing_state()
    taken = ctx.source.take(landed, remap.frontier, state)
    if taken.uppers != landed or taken.state != state:
        rows = [{**data, "partition": partition, "offset": offset} for partition, offset, data in taken.records]
        ctx.tables.land_more(rows, landed, taken.uppers, taken.state)
        log.info("%s: landed %d records of %r, up to %s", name, len(rows), ctx.source, taken.uppers)
    return ctx.tables.landed()


def read_bound(ctx: SourceContext, ranges, spark=None):
    """Spark DataFrame of the records in bound ``ranges``: landed partitions from the warehouse
    (:meth:`SourceTables.read_landed`), the others from the upstream (:func:`reclock.spark.source.read_ranges`);
    a source's TRUNCATE markers become retractions of what the table held (:mod:`reclock.truncate`); a source
    with ``table_columns`` has its tables' column changes checked (:func:`_check_table_columns`).

    A source with ``on_bad_record: dead_letter`` is read so: records that cannot be decoded are in the frame
    with :data:`reclock.spark.rows.BAD_RECORD_COLUMNS` set (:func:`reclock.spark.source.split_bad_records`)."""
    from .spark.source import read_ranges

    spark = spark or ctx.spark
    landed = set(ctx.tables.landed().partitions)
    here = [r for r in ranges if r[1] in landed]
    upstream = [r for r in ranges if r[1] not in landed]
    df = (read_ranges(spark, ctx.spec, upstream, ctx.base, ctx.config.on_bad_record) if upstream or not here
          else None)
    if here:
        df = ctx.tables.read_landed(here, spark) if df is None else \
            df.unionByName(ctx.tables.read_landed(here, spark))
    truncates = offers(ctx.source, Truncating)
    column = ctx.source.table_columns if offers(ctx.source, TableColumns) else None
    if not ranges or not (truncates or column):
        return df
    before = ctx.tables.read_reclocked_spark(spark).where(f"into_time < {int(min(r[0] for r in ranges))}")
    resynced = []
    if truncates:  # TRUNCATE and resync markers: what the table's rows changed
        from .truncate import expand_truncates, resynced_tables

        df = df.localCheckpoint(eager=True)
        resynced = resynced_tables(df)
        df = expand_truncates(df, before, ctx.source.snapshot_lsn)
    if column:  # a table's columns changed: follow an added column, refuse what cannot be followed (a table
        # started over from a new epoch's snapshot has no earlier columns to follow)
        from pyspark.sql import functions as F

        _check_table_columns(ctx, df, before.where(~F.col("table").isin(*resynced)) if resynced else before, column)
    return df


def _check_table_columns(ctx: SourceContext, batch, before, column: str) -> None:
    """Refuse a batch in which a table's columns changed in a way its stored rows cannot follow (a column
    dropped or retyped: :func:`reclock.pg_types.column_changes`; or added with a default that filled the rows
    already there, as the source's ``filled_columns`` says), naming the source, table, column and where."""
    from pyspark.sql import functions as F

    from .pg_types import column_history, schema_changes
    from .spark.labels import offset_label

    where = F.when(F.col("partition") != "", F.concat(F.lit("the initial snapshot "), F.col("partition"))) \
        .otherwise(offset_label(ctx.config.kind))
    added, problems = schema_changes(column_history(batch, before, where, column))
    for table, name, at in added:
        if ctx.source.filled_columns(table, [name]):
            problems.append(f"{table}: column {name!r} was added at {at} with a default that filled the rows already "
                            "there (Postgres wrote no change of them)")
    if problems:
        raise SourceError(f"{ctx.config.name} ({ctx.source!r}): {'; '.join(problems)}: the stored rows cannot follow "
                          "this (a row stored before would no longer be retracted exactly, or would lack the value), so "
                          "the source stops here; nothing staged. "
                          f"{SCHEMA_HELP}")


SCHEMA_HELP = ("To go on, start the tables over from a fresh snapshot: `reclock new-epoch <source> --drop-slot` "
               "replaces the slot and publishes what the tables hold now as corrections at the next IntoTime, AS OF "
               "earlier times unchanged (docs: sources/postgres.md, Schema changes).")


UPSTREAM_HELP = ("If the upstream was recreated (another identity, offsets from 0 again), `reclock new-epoch <source>` "
                 "starts the source over on it as a new epoch, keeping what was published (or configure it as a new "
                 "source: a new name starts a new remap); if records were lost upstream, `reclock accept-lost "
                 "<source>` records the gap and goes on without them (docs: upstream-changes.md).")


def upstream_record_of(name: str, ctx: SourceContext, remap: Remap) -> UpstreamRecord:
    """The start frontier and upstream identity recorded with remap; recorded now at the first tick."""
    record = ctx.tables.upstream_record()
    if record is None:
        # The first tick, or a remap from before reclock recorded them (its history began at offset 0).
        record = UpstreamRecord(Frontier() if remap.bindings else starting_frontier(ctx.source),
                                identity_of(ctx.source))
        ctx.tables.record_upstream(record)
        log.info("%s: history begins at %s (upstream %s)", name, record.start, record.identity)
    return record


def published_frontier(remap: Remap, tables: SourceTables) -> Frontier:
    """What the published reclocked table covers: ``remap[reclocked upper - 1]`` (nothing before the first window)."""
    start = tables.reclocked_upper()
    return remap.at(start - 1) if start > remap.since and start > 0 else Frontier()


def pending(remap: Remap, tables: SourceTables) -> tuple[int, int] | None:
    """IntoTimes ``[start, upto]`` bound in remap but not yet published, or None."""
    start, upto = tables.reclocked_upper(), remap.upper - 1
    return (start, upto) if upto >= start else None


def staged_window(remap: Remap, tables: SourceTables) -> tuple[int, int] | None:
    """The window a check step checks: the :func:`pending` one, or when it has no staged batch (a tick bound more
    since the stage), the pending window's longest prefix ``[start, u]`` that has one (checked against
    ``remap.until(u + 1)``: bindings below an upper never change).  So a stage, check and publish go through
    while ticks race them, instead of each tick sending the batch back to its stage.  None: nothing pending."""
    window = pending(remap, tables)
    if window is None:
        return None
    start, upto = window
    staged = [u for u in tables.staged_uptos() if start <= u <= upto]
    return (start, staged[-1]) if staged and staged[-1] != upto else window


class Raced:
    """Whether another run published the window while a step worked on it (:func:`published_meanwhile`)."""

    def __init__(self) -> None:
        self.by_another_run = False


@contextmanager
def published_meanwhile(name: str, ctx: SourceContext, upto: int, step: str) -> Iterator[Raced]:
    """The part of ``step`` that writes, reads or publishes the staged attempts of the window up to ``upto``.

    Two runs of one source (a schedule beside a manual run) may work on one window.  The one that publishes it
    first removes every staged attempt it did not publish, the other run's too, while that run writes or reads
    it; and of two publishes of the window, Delta's conflict check refuses the second.  Whatever error that
    gives the step (a vanished file in Spark or in a footer read, :class:`ConcurrentWriteError`) once the window
    is published, the step has nothing left to do: the error is logged, the block ends, and the yielded
    :class:`Raced` says ``by_another_run`` (the step returns saying so: the window is published, checked by the
    run that published it).  An error while the window is still unpublished, and a :class:`SourceError`, pass as
    they are."""
    raced = Raced()
    try:
        yield raced
    except SourceError:
        raise
    except Exception as e:
        if ctx.tables.reclocked_upper() <= upto:
            raise
        log.warning("%s: another run published IntoTimes up to %d while this %s ran (here: %s: %s); this %s did "
                    "nothing more", name, upto, step, type(e).__name__, (str(e).splitlines() or [""])[0], step)
        raced.by_another_run = True


def stage(name: str, runtime: Where = None, spark=None) -> dict:
    """Spark step: read every pending binding's offset ranges and stage them as Parquet files.

    A record that cannot be decoded fails the step, naming source, partition and offset; with
    ``on_bad_record: dead_letter`` it is staged apart, for the dead-letter table (``dead_letters``: how many).
    A source with ``primary_keys`` (Postgres) has its tables' primary keys staged with the batch, for the checks.
    """
    with Runtime.of(runtime, spark).source(name, create=True) as ctx:
        remap = ctx.tables.read_remap()
        window = pending(remap, ctx.tables)
        if window is None:
            return {"staged_rows": 0, "upto": remap.upper - 1}
        start, upto = window
        record = ctx.tables.upstream_record() or UpstreamRecord(Frontier(), None)
        begins, ctx.base, ctx.retired = record.start, record.base, record.retired
        if lost := lost_problems(published_frontier(remap, ctx.tables), begins, released_frontier(ctx.source)):
            raise SourceError(f"{name}: bindings {start}..{upto} need records the upstream no longer holds (retention "
                              "overtook them before they were published): " + "; ".join(lost)
                              + f"; nothing staged. {UPSTREAM_HELP}")
        ranges = clip_ranges(remap.ranges(start), begins)
        if ranges and (other := identity_problems(record.identity, identity_of(ctx.source))):
            raise SourceError(f"{name}: bindings {start}..{upto} need records of the upstream they were bound from, "
                              "which was replaced: " + "; ".join(other) + f"; nothing staged. {UPSTREAM_HELP}")
        log.info("%s: staging %d ranges for IntoTimes %d..%d", name, len(ranges), start, upto)
        keys = ctx.upstream.primary_keys if offers(ctx.upstream, PrimaryKeys) else None  # for the checks, which
        metadata = {"start": start, **({"primary_keys": keys()} if keys else {})}  # (check_step.stale_stage)
        if not ranges:  # do not contact the upstream; and with nothing to read (idle ticks), no Spark job
            with published_meanwhile(name, ctx, upto, "stage") as raced:
                ctx.tables.stage_empty(upto, metadata)
            return ({"staged_rows": 0, "start": start, "upto": upto, "published_by_another_run": True}
                    if raced.by_another_run else {"staged_rows": 0, "start": start, "upto": upto, "ranges": 0})
        from .spark.source import split_bad_records, worker_source_error

        df = read_bound(ctx, ranges)
        records, dead_letters = split_bad_records(df, name, ctx.config.on_bad_record)
        if dead_letters is not None:  # both read the batch: once from the upstream
            df.persist()
        try:
            with published_meanwhile(name, ctx, upto, "stage") as raced:
                rows = ctx.tables.stage(records, upto, dead_letters, metadata)
        except Exception as e:  # a Spark job failure: surface the source's own message
            if (message := worker_source_error(e)) is None:
                raise
            raise SourceError(f"{name}: staging IntoTimes {start}..{upto} failed: {message}") from e
        finally:  # (unpersisting a frame never persisted is a Spark Connect round trip all the same)
            if dead_letters is not None:
                df.unpersist()
        if raced.by_another_run:
            return {"staged_rows": 0, "start": start, "upto": upto, "published_by_another_run": True}
        result = {"staged_rows": rows, "start": start, "upto": upto, "ranges": len(ranges)}
        if dead_letters is not None and (staged := ctx.tables.staged_dead_letters(upto)) is not None:
            result["dead_letters"] = len(staged)
            if len(staged):
                log.warning("%s: %d records of IntoTimes %d..%d could not be decoded; staged for %s_dead_letter, "
                            "e.g. %s", name, len(staged), start, upto, name, staged["error"].iloc[0])
        return result


def check(name: str, runtime: Where = None, spark=None) -> dict:
    """Great Expectations checks on remap and the staged batch (and its dead letters, reported: a source with
    ``on_bad_record: dead_letter`` goes on past them); raises ChecksFailed.

    Each kind runs through its checkpoint in the source's GX context (:mod:`reclock.gx_context`), served by the
    validator (:mod:`reclock.validator`: this process never imports GX while one serves), which keeps the results
    and builds the Data Docs of the step's runs once, after it; remap is validated beside the batch's summary.  The
    batch is summarized, never collected (:func:`reclock.check_step.check_batch`); a source whose records are diffs
    (Postgres, CDC v2) also has its consolidated history checked in Spark, one with ``primary_keys`` (Postgres) its
    primary keys too, as staged with the batch (:func:`reclock.checks.check_primary_keys`).

    An idle source's run validates nothing and does not import GX (:func:`reclock.check_step.idle_check`): when
    the remap is the one the last check passed on (:func:`reclock.checks.remap_digest`) and the window holds no
    record and no dead letter, every expectation would pass again (each is per row, and there is none), so the
    run is recorded as passed, reusing that remap report.
    """
    from . import check_log
    from .check_step import check_batch, failed_by_another_run, idle_check, stale_stage
    from .checks import check_remap, remap_digest
    from .validator import open_context  # GX takes seconds to import: the validator has it imported

    runtime = Runtime.of(runtime, spark)
    with runtime.source(name, connect=False) as ctx, ctx.tables.pinned():  # one attempt read throughout
        remap = ctx.tables.read_remap()
        remap_rows, upstreams = ctx.tables.remap_frame(), ctx.tables.recorded_upstreams()
        window = staged_window(remap, ctx.tables)
        if (stale := stale_stage(name, ctx, window, "check")) is not None:
            return stale
        digest = remap_digest(remap_rows, remap.since, upstreams)
        if (idle := idle_check(name, ctx, remap, window, digest)) is not None:
            return idle
        gx = open_context(ctx.tables.uri, name)
        with gx.docs_once(), ThreadPoolExecutor(1, thread_name_prefix=f"{name}-remap-check") as beside:
            remap_report, results, raced = beside.submit(check_remap, remap_rows, since=remap.since,
                                                         upstreams=upstreams, gx=gx), {}, Raced()
            if window is not None:
                remap = remap.until(window[1] + 1)  # the remap the batch was staged from
                with published_meanwhile(name, ctx, window[1], "check") as raced:
                    results.update(check_batch(ctx, remap, window, gx))
                    raced.by_another_run = failed_by_another_run(name, ctx, window, results)
                if raced.by_another_run:  # its batch was checked by the run that published it
                    results, window = {}, None
            results, read = {"remap": remap_report.result(), **results}, window and ctx.tables.attempt_name(window[1])
    check_log.record(ctx.tables, name, results, window, remap.upper, docs=gx.docs_dir,
                     remap_digest=digest, attempt=read)  # durable before raising; publish publishes `read`
    log.info("%s: checks %s; Great Expectations Data Docs: %s", name,
             "passed" if all(r.success for r in results.values()) else "FAILED",
             ", ".join(os.path.join(gx.docs_dir, page) for r in results.values() for page in r.docs)
             or gx.docs_index)
    for report in results.values():
        report.raise_for_failure()
    summaries = {k: v.summary() for k, v in results.items()}
    return {**summaries, "published_by_another_run": True} if raced.by_another_run else summaries


def publish(name: str, runtime: Where = None, spark=None) -> dict:
    """Commit the staged attempt the check read into the reclocked table (one idempotent Delta commit), then type
    what is published into the typed tables (a Postgres source: :func:`reclock.typed_tables.type_published`).

    Only a batch whose checks passed is published: the last check record (:mod:`reclock.check_log`) must be
    a success for this very window, else :class:`reclock.checks.ChecksFailed` and nothing is published.  The
    window is the pending one, or the prefix of it that the last check checked (:func:`staged_window`).
    """
    with Runtime.of(runtime, spark).source(name, connect=False, create=True) as ctx, ctx.tables.pinned():
        done = _publish(name, ctx)
        try:
            typed = type_published(name, ctx)
        except ConcurrentWriteError as e:  # another run types the same rows: it, or the next publish, goes on
            log.warning("%s: typing what is published lost a race (%s); the next publish types the rest", name, e)
            typed = {"raced": str(e)}
        return {**done, **({"typed": typed} if typed else {})}


def _publish(name: str, ctx: SourceContext) -> dict:
    from . import check_log
    from .checks import ChecksFailed

    remap = ctx.tables.read_remap()
    window = pending(remap, ctx.tables)
    if window is None:
        return {"published": False, "reclocked_upper": ctx.tables.reclocked_upper()}
    checked = check_log.read(ctx.tables.uri, ctx.tables.storage_options) or {}
    if (checked.get("window") or [None])[0] == window[0] and window[0] <= checked["window"][1] < window[1]:
        window = tuple(checked["window"])  # a prefix of the pending window, checked (staged_window)
    if not (checked.get("success") and checked.get("window") == list(window)):
        from .check_step import stale_stage

        if (stale := stale_stage(name, ctx, staged_window(remap, ctx.tables), "publish")) is not None:
            return {"published": False, "reclocked_upper": ctx.tables.reclocked_upper(), **stale}
        raise ChecksFailed(f"{name}: IntoTimes {window[0]}..{window[1]} are not published: their staged batch has "
                           + ("not passed its checks" if checked.get("window") == list(window) else "not been checked")
                           + " (run `reclock check` after staging; docs: checks.md)")
    with published_meanwhile(name, ctx, window[1], "publish") as raced:
        published = ctx.tables.publish_staged(window[1], checked.get("attempt"))  # the attempt checked
    if raced.by_another_run:
        return {"published": False, "reclocked_upper": ctx.tables.reclocked_upper(), "published_by_another_run": True}
    return {"published": published, "reclocked_upper": ctx.tables.reclocked_upper()}


def resume(name: str, runtime: Where = None) -> dict:
    """Commit the offset resumption frontier upstream (bounded input reliance, seed 003)."""
    with Runtime.of(runtime).source(name) as ctx:
        remap = ctx.tables.read_remap()
        resume_at = timestamp_resumption_frontier(remap.upper, ctx.tables.reclocked_upper())
        offsets = offset_resumption_frontier(remap, resume_at)
        committed = ctx.source.committed()
        if not committed.less_equal(offsets):
            offsets = offsets.join(committed)  # never move an upstream commit backwards
        ctx.source.commit(offsets)  # after a new epoch: the upstream's own offsets, offsets - base
        return {"resume_at": resume_at, "offsets": offsets.as_json(),
                "upstream_offsets": to_upstream(offsets, ctx.base).as_json()}


def compact(name: str, runtime: Where = None, now: int | None = None, spark=None) -> dict:
    """Advance ``since`` to keep at least ``retention_ms`` of history, never past what is durable; VACUUM
    keeps the replaced files ``vacuum_retention_hours`` (reads of older versions in flight still find them)."""
    runtime = Runtime.of(runtime, spark)
    with runtime.source(name, connect=False) as ctx:
        remap = ctx.tables.read_remap()
        resume_at = timestamp_resumption_frontier(remap.upper, ctx.tables.reclocked_upper())
        since = min(resume_at - 1, (now if now is not None else now_ms()) - ctx.config.retention_ms)
        since = min([since] + _consumers_progress(name, runtime) + [b for b in [since_bound(ctx)] if b is not None])
        current = ctx.tables.since()
        # Compaction rewrites the history before since: do it when since moved by a quarter of
        # the retention, not on every tick, so its cost stays proportional to the data.
        if since <= current or (current and since - current < ctx.config.retention_ms // 4):
            return {"since": current, "compacted": False}
    with runtime.source(name, connect=False, create=True) as ctx:
        try:
            ctx.tables.compact(since, retention_hours=ctx.config.vacuum_retention_hours,
                               offsets_unique=ctx.config.offsets_unique)
        except ConcurrentWriteError as e:  # a racing tick or compaction: nothing lost, the next run compacts
            log.warning("%s: compaction to %d lost a race (%s); the next compaction goes on", name, since, e)
            return {"since": ctx.tables.since(), "compacted": False, "raced": str(e)}
        pruned, typed = prune_landing(name, ctx), compact_typed(name, ctx, since)
    return {"since": since, "compacted": True, "landing_files_pruned": pruned, "retired": retire(name, runtime),
            **({"typed_folded": typed} if typed else {})}


def _consumers_progress(name: str, runtime: Runtime) -> list[int]:
    """Last IntoTime processed by each transactions step reading ``name``: compaction must wait for them."""
    return [runtime.warehouse.txn_processed_upto(t.name) for t in runtime.config.transactions.values()
            if name in (t.data_source, t.tx_source)]


#: The steps of a run, in order (the DAG's, and ``reclock run``'s).
STEPS = ("tick", "stage", "check", "publish", "resume", "compact")


def run_once(name: str, runtime: Where = None, spark=None, now: int | None = None,
             steps: tuple[str, ...] = STEPS) -> dict:
    """Every step in order, in this process (what the DAG does, without Airflow); ``steps``: only those (in
    :data:`STEPS`' order), e.g. the steps before the one a test runs in a process of its own."""
    unknown = set(steps) - set(STEPS)
    if unknown:
        raise ValueError(f"{name}: no such step {sorted(unknown)} (the steps: {', '.join(STEPS)})")
    runtime = Runtime.of(runtime, spark)
    calls = {"tick": lambda: tick(name, runtime, now), "stage": lambda: stage(name, runtime),
             "check": lambda: check(name, runtime), "publish": lambda: publish(name, runtime),
             "resume": lambda: resume(name, runtime), "compact": lambda: compact(name, runtime, now)}
    done = {}
    for step in (s for s in STEPS if s in steps):
        done[step] = calls[step]()
        points.reached(f"after-{step}")  # observable (reclock.points): the fault tests crash here
    return done
