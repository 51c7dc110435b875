"""Great Expectations checks on what reclock publishes: the ``remap`` table and a staged reclocked batch
(and the batch's dead letters, for a source with ``on_bad_record: dead_letter``; and for sources whose records
are diffs, the consolidated history).

Each check kind is one GX suite of the project (``include/reclock/gx/expectations/<kind>.json``), run through its
checkpoint in the source's GX file Data Context (:mod:`reclock.gx_context`), whose Data Docs show every run.
What GX validates is small:

* ``remap``: the stored remap rows (pandas; remap is small), with derived columns (net increments, binding
  gaps, the excess over the upstream's recorded upper) so that every law is a plain column expectation;
* ``reclocked`` / ``dead_letter``: the staged batch is never collected.  Spark reads its ``partition, offset,
  into_time, diff`` columns and aggregates them per ``(partition, into_time)`` (a few rows: partitions x
  bindings) with, per law, the number of records that break it and the least such offset.  The per-record law
  of IntoTime is the engine's: with ``Remap.into_time_of`` monotone in the offset, the offsets that reclock
  to binding ``t`` in partition ``p`` are one range ``[lo, hi)`` (``lo`` unbounded for ``p``'s first
  binding), so with the engine's small tables of ranges and of the frontier joined in (broadcast)::

      beyond(r)       = offset unreadable or null  or  p unknown  or  offset >= frontier[p]
                        (<=>  into_time_of(p, offset) is None)
      not_covering(r) = not beyond(r) and into_time is not null and offset not in [lo, hi) of (p, into_time)
                        (<=>  into_time_of(p, offset) not in (None, into_time))

  exactly the expectations the records had before (``tests/test_checks.py`` checks the equivalence on random
  batches).  Offsets stored as strings (:mod:`reclock.offsets`) compare as strings, which is their numeric
  order once they are valid encodings (an invalid one is ``beyond``, as the engine cannot read it);
* ``reclocked_keys``: the batch's ``(partition, offset)`` counted in Spark, per partition the records whose
  key is not unique (sources with one record per offset);
* ``history`` / ``primary_key``: what the batch touches, consolidated in Spark over the published history and
  the batch (per content, or per table and primary key: its multiplicity and where the batch last changed it),
  then counted per ``partition``: the contents and the offending ones (multiplicity below 0; above 1).  GX
  validates those few rows; the offending contents themselves are read only when the check fails, to name them.

A failed check names the records that break it: up to 5 ``(partition, offset, into_time)`` in its sample.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import pandas as pd

from . import offsets
from .check_report import SAMPLE, CheckReport, CheckResult, ChecksFailed, Named, plain, report_of, run_suite
from .engine import Frontier, Remap

# --- the checks ------------------------------------------------------------------------------


def check_remap(remap_rows: pd.DataFrame, since: int = 0, upstreams: Mapping[int, Frontier] | None = None,
                *, gx=None) -> CheckReport:
    """Check stored remap rows ``(partition, into_time, increment)``; ``since`` is the compaction frontier
    (rows at or before it count as one binding at ``since``, as compaction folds them).

    ``upstreams``: the upstream's upper each tick recorded with its binding (``{into_time: frontier}``);
    a partition's bound offset (the sum of its increments up to a binding) must not exceed it, which an
    increment counted twice (racing ticks) or a frontier beyond the upstream would break.

    ``gx``: the source's GX context (:func:`reclock.gx_context.open_context`); default :func:`reclock.check_report.scratch_context`.
    """
    df = remap_rows[["partition", "into_time", "increment"]].copy()
    # Rows at or before since are read at since, as compaction folds them (it records since first, then
    # rewrites remap): a compaction killed in between leaves them so, and the next one finishes it.
    # Negative times stay as they are (none is valid).
    folded = df["into_time"].between(0, since, inclusive="left")
    df["into_time"] = df["into_time"].mask(folded, since)
    if not pd.api.types.is_integer_dtype(df["increment"]):  # big increments (reclock.offsets): exact Python ints
        df["increment"] = pd.Series([None if v is None else offsets.from_storage(v) for v in df["increment"]],
                                    index=df.index, dtype=object)
    # Rows at one time may repeat a partition (they sum), so the laws apply to the consolidated rows.
    df["net_increment"] = _int64_or_sign(
        df.groupby(["partition", "into_time"], dropna=False)["increment"].transform("sum"))
    df["binding_increment"] = _int64_or_sign(df.groupby("into_time")["increment"].transform("sum"))
    times = pd.Series(sorted(df["into_time"].dropna().unique()), dtype="float64")
    gaps = times.diff().fillna(times - (since - 1)) if len(times) else times
    df["binding_gap"] = df["into_time"].map(dict(zip(times, gaps)))
    df["upstream_excess"] = _int64_or_sign(_upstream_excess(df, upstreams or {}))
    run = run_suite(gx, "remap", df, ["partition", "into_time"], {"since": since})
    return report_of(f"remap ({len(times)} bindings)", len(df), [run])


def remap_digest(remap_rows: pd.DataFrame, since: int, upstreams: Mapping[int, Frontier] | None) -> str:
    """What :func:`check_remap` decides on, as one sha256: the stored rows (as a multiset), ``since``, the upstream
    uppers recorded at the rows' IntoTimes (as folded at ``since``: the only ones it reads; an idle tick records
    one at a time without rows) and the project's remap suite.  Equal digests get equal outcomes, so a remap whose
    check passed need not be validated again while its digest stays (an idle source's runs:
    :func:`reclock.pipeline.check`)."""
    import hashlib
    import importlib.resources
    import json

    digest = hashlib.sha256((importlib.resources.files("reclock") / "gx" / "expectations" / "remap.json").read_bytes())
    rows = sorted(map(repr, remap_rows[["partition", "into_time", "increment"]].itertuples(index=False, name=None)))
    times = remap_rows["into_time"].mask(remap_rows["into_time"].between(0, since, inclusive="left"), since)
    read = {int(t) for t in times.dropna()}
    ups = sorted((repr(t), json.dumps(f.as_json(), sort_keys=True)) for t, f in (upstreams or {}).items() if t in read)
    digest.update(json.dumps([since, rows, ups]).encode())
    return digest.hexdigest()


def _upstream_excess(df: pd.DataFrame, upstreams: Mapping[int, Frontier]) -> pd.Series:
    """Per row: the partition's bound offset at the row's binding minus the upstream's upper recorded then
    (None where no upper was recorded); exact Python ints, so big offsets compare exactly."""
    bound: dict = {}
    excess: dict[int, int | None] = {}
    for t, group in df.dropna(subset=["partition", "into_time"]).sort_values("into_time").groupby("into_time",
                                                                                                   sort=True):
        for p, increment in zip(group["partition"], group["increment"]):
            bound[p] = bound.get(p, 0) + (0 if pd.isna(increment) else int(increment))
        upstream = upstreams.get(int(t))
        for index, p in zip(group.index, group["partition"]):
            excess[index] = None if upstream is None else bound[p] - upstream[p]
    return pd.Series([excess.get(i) for i in df.index], index=df.index, dtype=object)


def _int64_or_sign(sums: pd.Series) -> pd.Series:
    """``sums`` as int64 when every value fits, else their signs (what the ``>= 0`` / ``> 0`` checks test)."""
    if sums.dtype != object:
        return sums
    values = [None if v is None or v is pd.NA else int(v) for v in sums]
    if all(v is None or abs(v) <= offsets.INT64_MAX for v in values):
        return pd.Series(values, index=sums.index, dtype="Int64")
    return pd.Series([None if v is None else (v > 0) - (v < 0) for v in values], index=sums.index, dtype="Int64")


def check_reclocked(batch, remap: Remap, start: int | None = None, *, offsets_unique: bool = True,
                    gx=None, empty: bool = False, summary=None) -> CheckReport:
    """Check a staged reclocked batch (a Spark DataFrame with partition, offset, into_time, diff, or a function
    making it), aggregated in Spark (module docstring): nothing of the batch is collected but a few rows per
    (partition, binding).

    ``start``: first IntoTime of the pending window: every record must lie in ``[start, remap.upper)`` (nothing
    already published is staged again); None: below ``remap.upper`` only.
    ``offsets_unique``: one record per offset (Kafka), so ``(partition, offset)`` is a key.
    ``empty``: the batch is known to have no rows (its files' footers say so): its aggregates are the empty frames of
    their schemas, with no Spark job (a tick with no new records).
    ``summary``: the batch's :class:`reclock.batch_summary.Summary`; when it proves the per-record laws, the
    frames are made from it and the batch is not read in Spark (a function ``batch`` is not called).
    """
    proved = summary is not None and summary.proved(remap, offsets_unique)
    if proved:
        frame = summary.binding_frame()
    else:
        from pyspark.sql import functions as F

        batch = batch() if callable(batch) else batch
        zero = F.coalesce(F.col("diff") == 0, F.lit(False))
        frame = _small_frame(_by_binding(batch, remap, {
            "zero_diffs": F.sum(zero.cast("long")), "first_zero_diff": F.min(F.when(zero, F.col("offset")))}), empty)
    params = _window(remap, start)
    runs = [run_suite(gx, "reclocked", frame, ["partition", "into_time"], params, {
        "reclocked.stamped": _unstamped,
        "reclocked.first_covering_binding": _counted("not_covering", "first_not_covering"),
        "reclocked.within_frontier": _counted("beyond", "first_beyond"),
        "reclocked.diff_non_zero": _counted("zero_diffs", "first_zero_diff"),
        "reclocked.in_window": _outside(params)})]
    if offsets_unique:
        keys = summary.duplicate_frame() if proved else _duplicate_frame(batch, empty)
        runs.append(run_suite(gx, "reclocked_keys", keys, ["partition"], params, {
            "reclocked.offsets_unique": _duplicate_keys(batch, keys)}))
    return report_of("reclocked batch", _records(frame), runs)


def check_dead_letters(dead_letters, batch, remap: Remap, start: int, *, gx=None) -> CheckReport:
    """Check and count the dead letters of a staged batch (Spark DataFrames: ``partition, offset, into_time,
    error``... and the reclocked batch): the records of the pending window ``[start, remap.upper)`` that could
    not be decoded, aggregated in Spark like the batch (:func:`check_reclocked`).

    They are reported, not refused (``dead_letter.count``, whose observed value is their number, never fails):
    the source chose to go on past them.  What must hold is that they are bound like every record (the first
    binding covering their offset, in the window), say why, and are not in the reclocked ``batch`` as well.
    """
    from pyspark.sql import functions as F

    keys = ["partition", "offset"]
    # The batch's keys that are dead letters too: a semi join against the (few) dead letters' keys.
    both = batch.select(*keys).join(F.broadcast(dead_letters.select(*keys)), keys, "left_semi").distinct()
    marked = dead_letters.join(both.withColumn("_in_batch", F.lit(True)), keys, "left")
    errorless, in_batch = F.col("error").isNull(), F.coalesce(F.col("_in_batch"), F.lit(False))
    frame = _small_frame(_by_binding(marked, remap, {
        "errorless": F.sum(errorless.cast("long")), "first_errorless": F.min(F.when(errorless, F.col("offset"))),
        "in_batch": F.sum(in_batch.cast("long")), "first_in_batch": F.min(F.when(in_batch, F.col("offset")))}))
    params = _window(remap, start)
    run = run_suite(gx, "dead_letter", frame, ["partition", "into_time"], params, {
        "dead_letter.first_covering_binding": _counted("not_covering", "first_not_covering"),
        "dead_letter.in_window": _outside(params),
        "dead_letter.has_error": _counted("errorless", "first_errorless"),
        "dead_letter.not_in_batch": _counted("in_batch", "first_in_batch")})
    upto = remap.upper - 1
    return report_of(f"dead letters of IntoTimes {start}..{upto}", _records(frame), [run])


def check_consolidated(published, staged, content: list[str], label=None, *, gx=None) -> CheckReport:
    """Check that publishing ``staged`` keeps every record's consolidated multiplicity AS OF the new upper at least 0.

    For sources whose records are diffs (Postgres changes: ``-1`` of an old row, ``+1`` of a new one), a
    retraction of a row the history never held (a table's rows from before the source started, changes
    missed or seen twice) makes the multiplicity negative: nothing is published then.  Only the contents
    (``content`` columns) the batch touches are consolidated, over the published Spark DataFrame
    ``published`` and the batch, all in Spark; a failure names the contents and where the batch changed
    them (``partition``, ``offset``, and ``label``: a Column spelling the offset as the source does, e.g. a
    Postgres LSN).
    """
    from pyspark.sql import functions as F

    consolidated, index = _consolidated(published, staged, content, label)
    return _check_offending(gx, "history", "reclocked history", "reclocked.consolidates", consolidated, index,
                            F.col("multiplicity") < 0)


PRIMARY_KEY_UNIQUE = "reclocked.primary_key_unique"


def check_primary_keys(published, staged, primary_keys: Mapping[str, Sequence[str]] | None,
                       label=None, *, gx=None) -> CheckReport:
    """Check that publishing ``staged`` leaves at most one live row per primary key AS OF the new upper.

    ``primary_keys``: ``{table: [column, ...]}`` of the tables with a primary key (a Postgres source's
    ``primary_keys``, recorded when the batch was staged; None when none was recorded: the check fails, the
    batch must be staged again).  Per table with one, ``key`` is the JSON object of the row's key columns
    (from the ``row`` JSON) and, for the keys the batch touches only, over ``published`` and the batch::

        multiplicity(table, key) = sum(diff)  <=  1

    A key held twice (a duplicate insert, changes replayed twice) fails, naming the table, the key and where
    the batch last changed it (``partition``, ``offset``, ``label``), as :func:`check_consolidated` does.
    """
    subject = "reclocked history per primary key"
    description = "every primary key is held by at most one row AS OF the new upper (tables with a primary key)"
    if primary_keys is None:
        return CheckReport(subject, 0, (CheckResult(
            PRIMARY_KEY_UNIQUE, "expect_column_values_to_be_between", False, description,
            error="no primary keys were recorded with the staged batch: stage it again"),))
    from pyspark.sql import functions as F

    consolidated, index = _consolidated(_with_primary_key(published, primary_keys),
                                        _with_primary_key(staged, primary_keys), ["table", "key"], label)
    return _check_offending(gx, "primary_key", subject, PRIMARY_KEY_UNIQUE, consolidated, index,
                            F.col("multiplicity") > 1)


def _check_offending(gx, kind: str, subject: str, check: str, consolidated, index: list[str], offends) -> CheckReport:
    """Suite ``kind`` on ``consolidated`` (Spark: a row per content) counted per ``partition`` in one aggregate:
    ``contents`` and ``offending`` (the rows where ``offends``); a failure names up to :data:`SAMPLE` offending
    rows (``index`` columns and ``multiplicity``), read from ``consolidated`` only then."""
    from pyspark.sql import functions as F

    frame = _small_frame(consolidated.groupBy("partition").agg(
        F.count(F.lit(1)).alias("contents"), F.sum(offends.cast("long")).alias("offending")))

    def named(counted: pd.DataFrame) -> tuple[int, list]:
        rows = consolidated.where(offends).orderBy(*index).limit(SAMPLE).collect()
        return int(counted["offending"].sum()), [{c: r[c] for c in [*index, "multiplicity"]} for r in rows]

    run = run_suite(gx, kind, frame, ["partition"], {}, {check: named})
    return report_of(subject, int(frame["contents"].sum()) if len(frame) else 0, [run])


def _with_primary_key(df, primary_keys: Mapping[str, Sequence[str]]):
    """The rows of ``df`` (``table``, ``row`` JSON) whose table has a primary key, with ``key``: the JSON object of
    the row's key columns, in key order (``{"id":"1"}``; values as text)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import MapType, StringType

    values = F.from_json("row", MapType(StringType(), StringType()))
    key = F.lit(None).cast("string")
    for table, names in primary_keys.items():
        key = F.when(F.col("table") == table, F.to_json(F.struct(*[values[n].alias(n) for n in names]))).otherwise(key)
    return df.where(F.col("table").isin(list(primary_keys)) & F.col("row").isNotNull()).withColumn("key", key)


def _consolidated(published, staged, content: list[str], label=None):
    """Per ``content`` the batch ``staged`` touches: its ``multiplicity`` (sum of ``diff`` over ``published`` and
    ``staged``) and where the batch last changed it (``partition``, ``offset``, ``at`` = ``label`` when given);
    and the columns that identify a row in a report."""
    from pyspark.sql import functions as F

    at = [F.max(F.struct("offset", "partition")).alias("_at")]
    touched = staged.groupBy(*content).agg(*at)
    history = published.select(*content, "diff").unionByName(staged.select(*content, "diff"))
    consolidated = (history.join(touched.select(*content), content, "left_semi").groupBy(*content)
                    .agg(F.sum("diff").alias("multiplicity")).join(touched, content)
                    .select(*content, "multiplicity", F.col("_at.partition").alias("partition"),
                            F.col("_at.offset").alias("offset")))
    if label is not None:
        consolidated = consolidated.withColumn("at", label)
    return consolidated, [*content, "partition", "offset"] + (["at"] if label is not None else [])


# --- the batch, aggregated in Spark per (partition, binding) -----------------------------------

def _by_binding(df, remap: Remap, extra: Mapping[str, Any]):
    """``df`` (Spark: ``partition, offset, into_time``...) aggregated per ``(partition, into_time)``: ``records``,
    ``min_offset``, ``max_offset``, ``beyond`` and ``not_covering`` (the per-record law, module docstring) with the
    least offending offset of each (``first_beyond``, ``first_not_covering``), and the ``extra`` aggregates."""
    from pyspark.sql import functions as F

    ranges, frontier = _engine_tables(df, remap)
    o, t = F.col("offset"), F.col("into_time")
    joined = (df.join(F.broadcast(frontier), df["partition"] == frontier["_fp"], "left")
              .join(F.broadcast(ranges), (df["partition"] == ranges["_rp"]) & (t == ranges["_rt"]), "left"))
    readable = o.isNotNull() & (_encoded(o) if _big(df) else F.lit(True))
    beyond = F.coalesce(~readable | F.col("_upper").isNull() | (o >= F.col("_upper")), F.lit(True))
    covered = F.coalesce(F.col("_hi").isNotNull() & (F.col("_lo").isNull() | (o >= F.col("_lo")))
                         & (o < F.col("_hi")), F.lit(False))
    not_covering = ~beyond & t.isNotNull() & ~covered
    return joined.groupBy("partition", "into_time").agg(
        F.count(F.lit(1)).alias("records"), F.min(o).alias("min_offset"), F.max(o).alias("max_offset"),
        F.sum(beyond.cast("long")).alias("beyond"), F.min(F.when(beyond, o)).alias("first_beyond"),
        F.sum(not_covering.cast("long")).alias("not_covering"),
        F.min(F.when(not_covering, o)).alias("first_not_covering"),
        *[column.alias(name) for name, column in extra.items()])


def _engine_tables(df, remap: Remap):
    """The engine's small tables, as Spark DataFrames typed like ``df``'s partition and offset columns:
    ``(_rp, _rt, _lo, _hi)``, the offsets ``[_lo, _hi)`` that reclock to binding ``_rt`` in partition ``_rp``
    (``_lo`` null for the partition's first binding: every offset below ``_hi``), and ``(_fp, _upper)``, the frontier."""
    from pyspark.sql.types import LongType, StructField, StructType

    partition, offset = df.schema["partition"].dataType, df.schema["offset"].dataType
    store = offsets.encode if _big(df) else int
    rows, seen = [], set()
    for r in remap.ranges(remap.since):
        rows.append((r.partition, r.into_time, None if r.partition not in seen else store(r.start), store(r.end)))
        seen.add(r.partition)
    spark = df.sparkSession
    ranges = spark.createDataFrame(rows, StructType([
        StructField("_rp", partition), StructField("_rt", LongType()), StructField("_lo", offset),
        StructField("_hi", offset)]))
    frontier = spark.createDataFrame([(p, store(u)) for p, u in remap.frontier], StructType([
        StructField("_fp", partition), StructField("_upper", offset)]))
    return ranges, frontier


def _big(df) -> bool:
    return df.schema["offset"].dataType.typeName() == "string"


def _encoded(o):
    """A stored big offset that :func:`reclock.offsets.decode` reads: ``"<3-digit length>:<digits>"``, canonical."""
    from pyspark.sql import functions as F

    return o.rlike(r"^[0-9]{3}:(0|[1-9][0-9]*)$") & (F.length(o) - 4 == F.substring(o, 1, 3).cast("int"))


def _duplicate_frame(batch, empty: bool = False) -> pd.DataFrame:
    """:func:`_duplicates` of ``batch`` as pandas.  Offsets stored as int64 are first counted with Spark's bitmaps
    (:func:`_distinct_excess`, no shuffle of the records): when no partition holds more records than distinct
    offsets, each has 0 duplicated records, and the exact count (a GROUP BY of every key) runs only otherwise."""
    if not empty and not _big(batch):
        excess = _small_frame(_distinct_excess(batch))
        if not (excess["excess"] > 0).any():
            return excess.rename(columns={"excess": "duplicated_records"})
    return _small_frame(_duplicates(batch), empty)


def _distinct_excess(batch):
    """Per partition of ``batch`` (int64 offsets): ``excess``, its records minus its distinct offsets (0: every
    ``(partition, offset)`` is unique).  A record with a null offset counts as a record, never as an offset.

    Spark's bitmaps count the distinct offsets: an offset is bit ``bitmap_bit_position`` of bucket
    ``bitmap_bucket_number`` (32,768 offsets a bucket: one to one over int64), and each task aggregates its records
    into a bitmap per ``(partition, bucket)`` before anything is shuffled (10M records: 1.7 s against 8.0 s for
    the GROUP BY of every key, here)."""
    from pyspark.sql import functions as F

    o = F.col("offset")
    per_bucket = batch.where(F.col("partition").isNotNull() | o.isNotNull()).groupBy(
        "partition", F.bitmap_bucket_number(o).alias("_bucket")).agg(
        F.count(F.lit(1)).alias("_records"),
        F.coalesce(F.bitmap_count(F.bitmap_construct_agg(F.bitmap_bit_position(o))), F.lit(0)).alias("_distinct"))
    return per_bucket.groupBy("partition").agg((F.sum("_records") - F.sum("_distinct")).alias("excess"))


def _duplicates(batch):
    """Per partition of ``batch``: ``duplicated_records`` (records whose ``(partition, offset)`` is not unique)."""
    from pyspark.sql import functions as F

    counts = batch.where(F.col("partition").isNotNull() | F.col("offset").isNotNull()).groupBy(
        "partition", "offset").agg(F.count(F.lit(1)).alias("n"))
    return counts.groupBy("partition").agg(
        F.sum(F.when(F.col("n") > 1, F.col("n")).otherwise(0)).alias("duplicated_records"))


def _window(remap: Remap, start: int | None) -> dict[str, Any]:
    """The suites' window parameters: IntoTimes strictly between ``published_upto`` and ``remap_upper``."""
    return {"published_upto": None if start is None else start - 1, "remap_upper": remap.upper,
            "start": start, "upto": remap.upper - 1}


def _small_frame(df, empty: bool = False) -> pd.DataFrame:
    """A small Spark DataFrame (an aggregate) as pandas, integers as nullable Int64 (Python ints in samples);
    ``empty``: known to have no rows, not collected."""
    names = df.columns
    frame = pd.DataFrame.from_records([] if empty else [tuple(r) for r in df.collect()], columns=names)
    for f in df.schema.fields:
        if f.dataType.typeName() in ("long", "integer", "short", "byte"):
            frame[f.name] = frame[f.name].astype("Int64")
    return frame


def _records(frame: pd.DataFrame) -> int:
    return int(frame["records"].sum()) if len(frame) else 0


# How a failed aggregate check counts its records and names them: frame -> (bad records, sample rows).


def _sample(rows: pd.DataFrame, offset: str) -> list[dict]:
    return [{"partition": plain(r["partition"]), "offset": plain(r[offset]), "into_time": plain(r["into_time"])}
            for _, r in rows.head(SAMPLE).iterrows()]


def _counted(count: str, first: str) -> Named:
    def named(frame: pd.DataFrame) -> tuple[int, list]:
        bad = frame[frame[count] > 0]
        return int(bad[count].sum()), _sample(bad, first)
    return named


def _unstamped(frame: pd.DataFrame) -> tuple[int, list]:
    bad = frame[frame["into_time"].isna()]
    return int(bad["records"].sum()), _sample(bad, "min_offset")


def _outside(params: Mapping[str, Any]) -> Named:
    after, before = params["published_upto"], params["remap_upper"]

    def named(frame: pd.DataFrame) -> tuple[int, list]:
        t = frame["into_time"]
        bad = frame[t.notna() & ((t >= before) | (t <= after if after is not None else False))]
        return int(bad["records"].sum()), _sample(bad, "min_offset")
    return named


def _duplicate_keys(batch, keys: pd.DataFrame) -> Named:
    def named(frame: pd.DataFrame) -> tuple[int, list]:
        from pyspark.sql import functions as F

        df = batch() if callable(batch) else batch
        counts = df.groupBy("partition", "offset").agg(F.count(F.lit(1)).alias("records"))
        sample = [{"partition": r["partition"], "offset": r["offset"], "records": r["records"]}
                  for r in counts.where(F.col("records") > 1).orderBy("partition", "offset").limit(SAMPLE).collect()]
        return int(frame["duplicated_records"].sum()), sample  # the sample is only asked for on a failure
    return named


__all__ = ["PRIMARY_KEY_UNIQUE", "CheckReport", "CheckResult", "ChecksFailed", "check_consolidated", "check_dead_letters",
           "check_primary_keys", "check_reclocked", "check_remap", "remap_digest"]
