"""Backfill and replay: rebuild a window of published IntoTimes from ``remap`` and the upstream.

``replay(name, config_path, start, end, spark, mode)`` takes the bindings with
``start <= into_time <= end`` (both inclusive, milliseconds), reads their offset ranges
(``remap.ranges`` restricted to the window) from the upstream again through Spark, and
compares the result with the published reclocked rows of the window:

* ``mode="verify"`` returns a report when both are identical and raises
  :class:`BackfillError`, listing a few differing rows, when they are not;
* ``mode="repair"`` replaces the window's published rows by the replayed ones in one Delta
  commit (:meth:`~reclock.storage.SourceTables.replace_reclocked`) when they differ, then
  verifies again.  The app transactions (``reclocked_upper``) are left as they were.

Identical means the same multiset of rows: every column, including ``diff``, compared by a
content digest that ignores row order and file layout (see :func:`digest`).  The replay is
deterministic because ``remap`` fixes which offsets each binding covers and sources read
ranges exactly and repeatably.

Which windows can be replayed (anything else is refused with :class:`BackfillError`,
naming the source and the window, before anything is read or written):

* **published**: ``end`` below the reclocked upper (the last published IntoTime + 1);
* **not compacted away**: ``start >= since``.  Compaction folded every binding at or before
  ``since`` into one binding at ``since`` and moved those rows to ``since`` (consolidated).
  A window starting exactly at ``since`` replays that folded binding: every offset from the
  source's recorded start frontier (:mod:`reclock.engine.upstream`) up to ``remap[since]``, stamped ``since`` and consolidated the way
  compaction does; so it needs upstream to still hold everything from offset 0.  Published
  rows still below ``since`` (a compaction interrupted before it consolidated the reclocked
  table) are read as if at ``since``, as compaction will leave them;
* **not retired**: a window starting at ``since`` is refused once compaction retired a partition (a file read
  whole and deleted, :mod:`reclock.engine.upstream`): the folded binding holds its records, which cannot be read
  again;
* **still held upstream**: the window reads, per partition, from the frontier of the binding
  before it (``remap[start - 1]``).  If upstream already released records at or beyond that
  point in a partition the window reads, it is refused.  What is released is the source's
  ``released()`` when it has one (Kafka: log start offsets, since a group commit deletes
  nothing; files: the committed frontier only with ``delete_committed``), else its
  ``committed()`` (a Postgres slot's confirmed LSN); for landed partitions, also what compaction pruned from
  the landing (:mod:`reclock.storage.landing`: below ``remap[since]``).
* **from the upstream they were bound from**: none while the upstream's identity differs from the
  recorded one (a recreated topic's records at those offsets are other records); after ``reclock
  new-epoch``, only windows of the current epoch (:func:`reclock.engine.upstream.replay_problem`).

Limits: a compaction that advances ``since`` while a replay runs makes it fail (retry it);
run repairs while the source's DAG is not compacting (a compaction committed between the last
check and the repair's commit leaves rows below the new ``since``, which the next compaction folds).  Sources
whose remap predates the recorded start frontier replay their first window from offset 0.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
from dataclasses import dataclass

from .engine import Frontier, Range, Remap
from .engine.upstream import clip_ranges, identity_problems, replay_problem
from .pipeline import read_bound
from .runtime import Runtime, SourceContext, Where
from .sources.base import identity_of, released_frontier
from .typed_tables import retype_window
from .storage import RECLOCKED_APP, UpstreamRecord, app_version

log = logging.getLogger("reclock")

MODES = ("verify", "repair")
EXAMPLES = 5  # differing rows listed in an error
_DIGEST_VERSION = "reclock-window-digest-v1"


class BackfillError(RuntimeError):
    """A window that cannot be replayed, or whose published rows differ from the replay."""


@dataclass(frozen=True)
class Window:
    """A checked window: its bindings' ranges and the published snapshot it is compared with."""

    name: str
    start: int
    end: int
    since: int
    published_upper: int  # reclocked upper of ``version``
    version: int  # the reclocked table version compared with
    ranges: list[Range]

    @property
    def label(self) -> str:
        return f"{self.name}: IntoTimes [{self.start}, {self.end}]"

    @property
    def bounds(self) -> tuple[int | None, int]:
        """The published rows of the window, ``low <= into_time <= high`` (``low`` None: no lower bound; at
        ``since``: also rows a compaction has yet to move there)."""
        return (self.start if self.start > self.since else None), self.end


def plan(ctx: SourceContext, name: str, start: int, end: int) -> Window:
    """Check the window against since, the published upper and upstream retention; nothing is read yet.

    Its ranges start at the source's recorded start frontier (what lies below is not part of its history)."""
    if isinstance(start, bool) or isinstance(end, bool) or not isinstance(start, int) or not isinstance(end, int):
        raise BackfillError(f"{name}: window bounds must be int milliseconds, got {start!r}, {end!r}")
    where = f"{name}: cannot replay IntoTimes [{start}, {end}]"
    if start > end:
        raise BackfillError(f"{where}: start is after end")
    remap: Remap = ctx.tables.read_remap()
    version, published_upper = _pin(ctx, remap.since, where)
    if start < remap.since:
        raise BackfillError(f"{where}: IntoTimes before since = {remap.since} were compacted away (folded into "
                            f"the binding at {remap.since}); start the window at {remap.since} or later")
    if end >= published_upper:
        last = f"the last published IntoTime is {published_upper - 1}" if published_upper else "nothing is published"
        raise BackfillError(f"{where}: not published yet ({last}, reclocked upper {published_upper})")
    record = ctx.tables.upstream_record() or UpstreamRecord(Frontier(), None)  # history begins at its start
    if problem := replay_problem(start, remap.since, record.began_at):  # after a new epoch
        raise BackfillError(f"{where}: {problem}")
    if start <= remap.since and record.retired.partitions:
        raise BackfillError(f"{where}: the binding at since = {remap.since} folds the records of partitions retired "
                            f"since (read whole and gone upstream: {', '.join(map(str, record.retired.partitions[:5]))}"
                            f"{' ...' if len(record.retired.partitions) > 5 else ''}), which cannot be read again; "
                            f"start the window after {remap.since}")
    ctx.base, ctx.retired = record.base, record.retired
    ranges = clip_ranges([r for r in remap.ranges(start) if r.into_time <= end and r.start < r.end], record.start)
    if ranges and (other := identity_problems(record.identity, identity_of(ctx.source))):
        raise BackfillError(f"{where}: the upstream its records were bound from was replaced: {'; '.join(other)} "
                            "(reclock new-epoch starts the source over on the new one)")
    if ranges:
        pruned = ctx.tables.pruned()  # a landing pruned by compaction holds no record below it
        released = released_frontier(ctx.source).join(pruned)
        needed: dict = {}
        for r in ranges:
            needed[r.partition] = min(needed.get(r.partition, r.start), r.start)
        if any(released[p] > offset for p, offset in needed.items()):
            window_start = "the beginning of the source" if start <= remap.since else f"remap[{start - 1}]"
            raise BackfillError(
                f"{where}: upstream already released data the window needs: it reads from {Frontier.of(needed)} "
                f"({window_start}), but upstream released up to {released} (committed frontier "
                f"{ctx.source.committed()}" + (f"; the landing pruned below {pruned}" if pruned.partitions else "")
                + "); those records cannot be read again")
    return Window(name, start, end, remap.since, published_upper, version, ranges)


def _pin(ctx: SourceContext, since: int, where: str) -> tuple[int, int]:
    """The reclocked table's latest version and its reclocked upper, checked to predate any compaction past ``since``."""
    if ctx.tables.version("reclocked") < 0:
        raise BackfillError(f"{where}: not published yet (nothing is published)")
    table = ctx.tables.table("reclocked")
    version, published_upper = table.version(), app_version(table, RECLOCKED_APP, -1) + 1
    if ctx.tables.since() != since:  # the snapshot may already hold rows of a newer compaction
        raise BackfillError(f"{where}: a compaction advanced since from {since} meanwhile; retry")
    return version, published_upper


# --- Spark ------------------------------------------------------------------------------------


def canonical(df, window: Window, schema):
    """The window's rows in the table's types, rows at ``since`` consolidated (as compaction leaves them)."""
    from pyspark.sql import functions as F

    names = [f.name for f in schema.fields]
    df = df.select(*[F.col(f.name).cast(f.dataType).alias(f.name) for f in schema.fields])
    df = df.withColumn("into_time", F.greatest(F.col("into_time"), F.lit(window.since).cast("long")))
    df = df.where((F.col("into_time") >= window.start) & (F.col("into_time") <= window.end))
    if window.start > window.since:
        return df
    at_since = F.col("into_time") == window.since
    folded = (df.where(at_since).groupBy(*[n for n in names if n != "diff"])
              .agg(F.sum("diff").cast("long").alias("diff")).where(F.col("diff") != 0))
    return df.where(~at_since).unionByName(folded.select(*names))


def digest(df) -> tuple[int, str]:
    """``(rows, sha256 hex)`` of a multiset of rows, independent of row order, partitioning and files.

    Each row is serialised canonically (``to_json`` of the row in column order) and hashed with
    SHA-256; the four 64-bit lanes of the row hashes are summed (mod 2**64) over all rows in Spark,
    and the row count and the four sums are hashed again.  Equal multisets give equal digests; a
    missing, extra, duplicated or changed row changes it.
    """
    from pyspark.sql import functions as F

    row_hash = F.sha2(F.to_json(F.struct(*[F.col(c) for c in df.columns])), 256)
    lanes = [F.conv(F.substring(F.col("h"), 1 + 16 * i, 16), 16, 10).cast("decimal(20,0)").alias(f"l{i}")
             for i in range(4)]
    sums = [F.sum(f"l{i}") for i in range(4)]
    row = df.select(row_hash.alias("h")).select(*lanes).agg(F.count(F.lit(1)), *sums).first()
    count, lane_sums = int(row[0]), [int(v or 0) % 2**64 for v in row[1:]]
    text = f"{_DIGEST_VERSION}:{count}:" + ":".join(f"{s:016x}" for s in lane_sums)
    return count, hashlib.sha256(text.encode()).hexdigest()


def _examples(left, right, n: int = EXAMPLES) -> list[dict]:
    return [r.asDict() for r in left.exceptAll(right).limit(n).collect()]


def _replayed(spark, ctx: SourceContext, window: Window, schema):
    """The window's records read again (a dead-lettered record is not among them, as it is not published)."""
    from .spark.source import split_bad_records

    if not window.ranges:
        return spark.createDataFrame([], schema)
    return split_bad_records(read_bound(ctx, window.ranges, spark), ctx.config.name, ctx.config.on_bad_record)[0]


def _published(spark, ctx: SourceContext, window: Window):
    return ctx.tables.read_reclocked_spark(spark, window.version)


def _source_errors(window: Window, action):
    """Run a Spark action; a worker's SourceError (e.g. records released meanwhile) becomes a BackfillError."""
    from .spark.source import worker_source_error

    try:
        return action()
    except Exception as e:
        if (message := worker_source_error(e)) is None:
            raise
        raise BackfillError(f"{window.label}: reading the upstream failed: {message}") from e


# --- replay ------------------------------------------------------------------------------------


def replay(name: str, runtime: Where, start: int, end: int, spark=None, mode: str = "verify") -> dict:
    """Replay IntoTimes ``[start, end]`` (inclusive, ms) of source ``name``; see the module doc.

    Returns a JSON-able report; raises :class:`BackfillError` when the window cannot be replayed or
    (after a repair, too) its published rows differ from the replay.
    """
    if mode not in MODES:
        raise BackfillError(f"{name}: mode must be one of {MODES}, got {mode!r}")
    runtime = Runtime.of(runtime, spark)
    with runtime.source(name) as ctx:
        window = plan(ctx, name, start, end)
        spark = runtime.spark(f"reclock-backfill-{name}")
        schema = ctx.tables.spark_schema("reclocked")
        replayed = canonical(_replayed(spark, ctx, window, schema), window, schema).persist()
        try:
            replay_rows, replay_digest = _source_errors(window, lambda: digest(replayed))
            report = {"source": name, "window": [start, end], "mode": mode, "since": window.since,
                      "reclocked_upper": window.published_upper,
                      "bindings": len({r.into_time for r in window.ranges}), "ranges": len(window.ranges),
                      "replayed": {"rows": replay_rows, "digest": replay_digest}}
            published = canonical(_published(spark, ctx, window), window, schema)
            rows, published_digest = digest(published)
            report["published"] = {"rows": rows, "digest": published_digest, "version": window.version}
            report["repaired"] = False
            if published_digest != replay_digest and mode == "repair":
                _pin(ctx, window.since, window.label)  # no compaction since the plan (see the module doc)
                written = ctx.tables.replace_reclocked(replayed, *window.bounds)
                retype_window(ctx, *window.bounds)  # a Postgres source's typed tables: the window's rows too
                log.warning("%s: repaired the published rows (%d rows written)", window.label, written)
                version, upper = _pin(ctx, window.since, window.label)  # the repaired snapshot
                window = dataclasses.replace(window, version=version, published_upper=upper)
                published = canonical(_published(spark, ctx, window), window, schema)
                rows, published_digest = digest(published)
                report.update(repaired=True, reclocked_upper=window.published_upper,
                              published={"rows": rows, "digest": published_digest, "version": window.version,
                                         "before": report["published"]})
            report["equal"] = published_digest == replay_digest
            if not report["equal"]:
                missing = _source_errors(window, lambda: _examples(replayed, published))
                unexpected = _source_errors(window, lambda: _examples(published, replayed))
                raise BackfillError(
                    f"{window.label}: the published rows differ from the replay"
                    f"{' even after the repair' if report['repaired'] else ''}: published {rows} rows "
                    f"(digest {published_digest[:16]}), replayed {replay_rows} rows (digest "
                    f"{replay_digest[:16]}); replayed but not published (up to {EXAMPLES}): {missing}; "
                    f"published but not replayed (up to {EXAMPLES}): {unexpected}"
                    + ("" if mode == "repair" else "; run the backfill with mode 'repair' to rewrite the window"))
        finally:
            replayed.unpersist()
    log.info("%s: published rows equal the replay (%d rows, digest %s)", window.label, replay_rows,
             replay_digest[:16])
    return report


def window_of_interval(start_ms: int, end_ms: int) -> tuple[int, int]:
    """The inclusive IntoTime window of a half-open interval ``[start_ms, end_ms)`` (an Airflow data interval)."""
    if end_ms <= start_ms:
        raise BackfillError(f"the interval [{start_ms}, {end_ms}) is empty: backfill a DAG whose schedule "
                            "has data intervals (e.g. a CronDataIntervalTimetable)")
    return start_ms, end_ms - 1


__all__ = ["BackfillError", "MODES", "Window", "canonical", "digest", "plan", "replay",
           "window_of_interval"]
