"""Great Expectations checks on what reclock publishes: the ``remap`` table and a staged reclocked batch
(and the batch's dead letters, for a source with ``on_bad_record: dead_letter``).

Each check is one GX expectation on one data frame, run in an ephemeral GX
context: the remap rows through a pandas data source, the reclocked batch
through a Spark data source when it is a Spark DataFrame (GX 1.24 works with
pyspark 4.1) and through the pandas one when it is a pandas DataFrame.  Derived
columns (net increments, binding gaps, the engine's expected IntoTime) are
added first so that every law is a plain column expectation.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Mapping, Sequence

import pandas as pd

from . import offsets
from .engine import Frontier, Remap

EXPECTED = "expected_into_time"


class ChecksFailed(RuntimeError):
    """At least one check failed; the message is the report's summary."""


@dataclass(frozen=True)
class CheckResult:
    name: str
    expectation: str
    success: bool
    description: str
    unexpected_count: int | None = None
    sample: list = field(default_factory=list)
    error: str | None = None
    #: What a table-level expectation measured (e.g. a row count), when it reports one.
    observed: Any = None

    def line(self) -> str:
        status = "PASS" if self.success else "FAIL"
        text = f"{status} {self.name}: {self.description}"
        if self.observed is not None:
            text += f": {self.observed}"
        if not self.success:
            text += f" ({self.error})" if self.error else f" ({self.unexpected_count} bad, e.g. {self.sample})"
        return text


@dataclass(frozen=True)
class CheckReport:
    subject: str
    rows: int
    results: tuple[CheckResult, ...]

    @property
    def success(self) -> bool:
        return all(r.success for r in self.results)

    @property
    def failed(self) -> list[str]:
        return [r.name for r in self.results if not r.success]

    def summary(self) -> str:
        passed = sum(r.success for r in self.results)
        head = f"{self.subject}: {passed}/{len(self.results)} checks passed on {self.rows} rows"
        return "\n".join([head] + ["  " + r.line() for r in self.results])

    def raise_for_failure(self) -> None:
        if not self.success:
            raise ChecksFailed(self.summary())

    def as_dict(self) -> dict[str, Any]:
        """Small and JSON-able, for XCom."""
        return {"subject": self.subject, "rows": self.rows, "success": self.success, "failed": self.failed}


# --- the checks ------------------------------------------------------------------------------


def check_remap(remap_rows: pd.DataFrame, since: int = 0, upstreams: Mapping[int, Frontier] | None = None
                ) -> CheckReport:
    """Check stored remap rows ``(partition, into_time, increment)``; ``since`` is the compaction frontier
    (rows at or before it count as one binding at ``since``, as compaction folds them).

    ``upstreams``: the upstream's upper each tick recorded with its binding (``{into_time: frontier}``);
    a partition's bound offset (the sum of its increments up to a binding) must not exceed it, which an
    increment counted twice (racing ticks) or a frontier beyond the upstream would break.
    """
    import great_expectations.expectations as gxe

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
    return _validate(f"remap ({len(times)} bindings)", df, ["partition", "into_time"], {
        "remap.partition_not_null": (gxe.ExpectColumnValuesToNotBeNull(column="partition"),
                                     "no null partition"),
        "remap.into_time_not_null": (gxe.ExpectColumnValuesToNotBeNull(column="into_time"),
                                     "no null into_time"),
        "remap.monotone": (gxe.ExpectColumnValuesToBeBetween(column="net_increment", min_value=0),
                           "increments >= 0 per (partition, into_time): every partition's upper only grows"),
        "remap.times_increasing": (gxe.ExpectColumnValuesToBeBetween(column="binding_gap", min_value=0,
                                                                     strict_min=True),
                                   f"binding IntoTimes strictly increase, from since={since}"),
        "remap.bindings_move": (gxe.ExpectColumnValuesToBeBetween(column="binding_increment", min_value=0,
                                                                  strict_min=True),
                                "every binding moves the frontier"),
        "remap.within_upstream": (gxe.ExpectColumnValuesToBeBetween(column="upstream_excess", max_value=0),
                                  "no bound offset beyond the upstream's upper recorded at its tick "
                                  "(nothing counted twice)"),
    })


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


def check_reclocked(batch, remap: Remap, start: int | None = None, *, offsets_unique: bool = True) -> CheckReport:
    """Check a staged reclocked batch (pandas or Spark DataFrame with partition, offset, into_time, diff).

    ``start``: first IntoTime of the pending window; when given, every record must lie in
    ``[start, remap.upper)`` (nothing already published is staged again).
    ``offsets_unique``: one record per offset (Kafka), so ``(partition, offset)`` is a key.
    """
    import great_expectations.expectations as gxe

    checks = {
        "reclocked.stamped": (gxe.ExpectColumnValuesToNotBeNull(column="into_time"), "every record has an IntoTime"),
        "reclocked.first_covering_binding": (
            gxe.ExpectColumnPairValuesToBeEqual(column_A="into_time", column_B=EXPECTED,
                                                ignore_row_if="either_value_is_missing"),
            "into_time is the first binding covering (partition, offset)"),
        "reclocked.within_frontier": (gxe.ExpectColumnValuesToNotBeNull(column=EXPECTED),
                                      "no record beyond the remap frontier"),
        "reclocked.diff_non_zero": (gxe.ExpectColumnValuesToNotBeInSet(column="diff", value_set=[0]),
                                    "diff is non-zero"),
    }
    if start is not None:
        upto = remap.upper - 1
        checks["reclocked.in_window"] = (
            gxe.ExpectColumnValuesToBeBetween(column="into_time", min_value=start, max_value=upto)
            if upto >= start else gxe.ExpectTableRowCountToEqual(value=0),  # an empty window holds nothing
            f"into_time in the pending window [{start}, {upto}]")
    if offsets_unique:
        checks["reclocked.offsets_unique"] = (
            gxe.ExpectCompoundColumnsToBeUnique(column_list=["partition", "offset"]),
            "no duplicate (partition, offset)")
    return _validate("reclocked batch", with_expected_into_time(batch, remap), ["partition", "offset"], checks)


def check_dead_letters(dead_letters: pd.DataFrame, batch: pd.DataFrame, remap: Remap, start: int) -> CheckReport:
    """Check and count the dead letters of a staged batch (``partition, offset, into_time, error``...): the
    records of the pending window ``[start, remap.upper)`` that could not be decoded.

    They are reported, not refused (``dead_letter.count``, whose observed value is their number, never fails):
    the source chose to go on past them.  What must hold is that they are bound like every record (the first
    binding covering their offset, in the window), say why, and are not in the reclocked ``batch`` as well.
    """
    import great_expectations.expectations as gxe

    staged = set(zip(batch["partition"].tolist(), batch["offset"].tolist()))
    df = with_expected_into_time(dead_letters.drop(columns=["key", "value"]), remap)
    df["in_batch"] = pd.array([(p, o) in staged for p, o in zip(df["partition"].tolist(), df["offset"].tolist())],
                              dtype="Int64")
    upto = remap.upper - 1
    return _validate(f"dead letters of IntoTimes {start}..{upto}", df, ["partition", "offset"], {
        "dead_letter.count": (gxe.ExpectTableRowCountToBeBetween(min_value=0),
                              "records of the batch that could not be decoded, in the dead-letter table instead "
                              "(on_bad_record: dead_letter; reported, never refused)"),
        "dead_letter.first_covering_binding": (
            gxe.ExpectColumnPairValuesToBeEqual(column_A="into_time", column_B=EXPECTED,
                                                ignore_row_if="either_value_is_missing"),
            "bound like every record: into_time is the first binding covering (partition, offset)"),
        "dead_letter.in_window": (gxe.ExpectColumnValuesToBeBetween(column="into_time", min_value=start,
                                                                    max_value=max(start, upto)),
                                  f"into_time in the pending window [{start}, {upto}]"),
        "dead_letter.has_error": (gxe.ExpectColumnValuesToNotBeNull(column="error"), "every dead letter says why"),
        "dead_letter.not_in_batch": (gxe.ExpectColumnValuesToNotBeInSet(column="in_batch", value_set=[1]),
                                     "no dead-lettered offset is in the reclocked batch too (nothing counted twice)"),
    })


def check_consolidated(published, staged, content: list[str], label=None) -> CheckReport:
    """Check that publishing ``staged`` keeps every record's consolidated multiplicity AS OF the new upper at least 0.

    For sources whose records are diffs (Postgres changes: ``-1`` of an old row, ``+1`` of a new one), a
    retraction of a row the history never held (a table's rows from before the source started, changes
    missed or seen twice) makes the multiplicity negative: nothing is published then.  Only the contents
    (``content`` columns) the batch touches are consolidated, over the published Spark DataFrame
    ``published`` and the batch, all in Spark; a failure names the contents and where the batch changed
    them (``partition``, ``offset``, and ``label``: a Column spelling the offset as the source does, e.g. a
    Postgres LSN).
    """
    import great_expectations.expectations as gxe

    consolidated, index = _consolidated(published, staged, content, label)
    return _validate("reclocked history", consolidated, index, {
        "reclocked.consolidates": (gxe.ExpectColumnValuesToBeBetween(column="multiplicity", min_value=0),
                                   "every record's multiplicity AS OF the new upper is >= 0 (no retraction of "
                                   "a record the history does not hold)")})


PRIMARY_KEY_UNIQUE = "reclocked.primary_key_unique"


def check_primary_keys(published, staged, primary_keys: Mapping[str, Sequence[str]] | None,
                       label=None) -> CheckReport:
    """Check that publishing ``staged`` leaves at most one live row per primary key AS OF the new upper.

    ``primary_keys``: ``{table: [column, ...]}`` of the tables with a primary key (a Postgres source's
    ``primary_keys``, recorded when the batch was staged; None when none was recorded: the check fails, the
    batch must be staged again).  Per table with one, ``key`` is the JSON object of the row's key columns
    (from the ``row`` JSON) and, for the keys the batch touches only, over ``published`` and the batch::

        multiplicity(table, key) = sum(diff)  <=  1

    A key held twice (a duplicate insert, changes replayed twice) fails, naming the table, the key and where
    the batch last changed it (``partition``, ``offset``, ``label``), as :func:`check_consolidated` does.
    """
    import great_expectations.expectations as gxe

    subject = "reclocked history per primary key"
    description = "every primary key is held by at most one row AS OF the new upper (tables with a primary key)"
    if primary_keys is None:
        return CheckReport(subject, 0, (CheckResult(
            PRIMARY_KEY_UNIQUE, "expect_column_values_to_be_between", False, description,
            error="no primary keys were recorded with the staged batch: stage it again"),))
    consolidated, index = _consolidated(_with_primary_key(published, primary_keys),
                                        _with_primary_key(staged, primary_keys), ["table", "key"], label)
    return _validate(subject, consolidated, index, {
        PRIMARY_KEY_UNIQUE: (gxe.ExpectColumnValuesToBeBetween(column="multiplicity", max_value=1), description)})


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


def with_expected_into_time(batch, remap: Remap):
    """``batch`` plus the engine's ``remap.into_time_of(partition, offset)`` (null when beyond the frontier)."""
    if isinstance(batch, pd.DataFrame):
        return _add_expected(batch, remap)
    from pyspark.sql.types import LongType, StructField, StructType

    schema = StructType(batch.schema.fields + [StructField(EXPECTED, LongType(), True)])
    return batch.mapInPandas(lambda frames: (_add_expected(f, remap) for f in frames), schema)


def _add_expected(df: pd.DataFrame, remap: Remap) -> pd.DataFrame:
    expected = [_into_time_of(remap, p, o) for p, o in zip(df["partition"].tolist(), df["offset"].tolist())]
    return df.assign(**{EXPECTED: pd.array(expected, dtype="Int64")})


def _into_time_of(remap: Remap, partition, stored) -> int | None:
    """The engine's IntoTime of a stored offset (int64, or a big one encoded as a string); None if unreadable."""
    try:
        return remap.into_time_of(partition, offsets.from_storage(stored))
    except offsets.OffsetError:
        return None  # fails reclocked.within_frontier, naming the row


# --- running them in GX ----------------------------------------------------------------------


def _validate(subject: str, df, index: list[str], checks: dict[str, tuple[Any, str]]) -> CheckReport:
    """Run ``{name: (expectation, description)}`` on ``df`` (pandas or Spark) as one suite.

    Failures are reported with up to 5 bad rows, identified by the ``index`` columns.
    """
    import great_expectations as gx

    for name, (expectation, _) in checks.items():
        expectation.meta = {"check": name}
    suite = gx.ExpectationSuite(name=subject, expectations=[e for e, _ in checks.values()])
    spark = not isinstance(df, pd.DataFrame)
    batch = _batch_definition("spark" if spark else "pandas").get_batch(batch_parameters={"dataframe": df})
    result_format = {"result_format": "SUMMARY", "partial_unexpected_count": 5, "unexpected_index_column_names": index}
    validation = batch.validate(suite, result_format=result_format)
    if spark:
        df.unpersist()  # GX caches the batch while computing its metrics
    outcome = {r.expectation_config.meta["check"]: r for r in validation.results}
    results = []
    for name, (_, description) in checks.items():
        r = outcome[name]
        sample = r.result.get("partial_unexpected_index_list") or r.result.get("partial_unexpected_list") or []
        results.append(CheckResult(
            name=name, expectation=r.expectation_config.type, success=bool(r.success),
            description=description, unexpected_count=r.result.get("unexpected_count"),
            sample=_plain(sample), error=_error(r.exception_info), observed=_plain(r.result.get("observed_value"))))
    rows = max((r.result.get("element_count") or 0 for r in outcome.values()), default=0)
    return CheckReport(subject, rows, tuple(results))


def _error(info: dict) -> str | None:
    """The exception message(s) GX caught: ``exception_info`` is flat, or keyed by metric when a metric failed."""
    infos = [info] if "raised_exception" in info else list(info.values())
    return "; ".join(i["exception_message"] for i in infos
                     if isinstance(i, dict) and i.get("raised_exception") and i.get("exception_message")) or None


def _plain(value):
    """GX samples as plain Python (numpy scalars to ints/floats, pandas NA to None)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return None
    return value.item() if hasattr(value, "item") else value


@lru_cache(maxsize=None)
def _batch_definition(kind: str):
    """One whole-dataframe batch definition per data source kind, in one ephemeral GX context."""
    context = _context()
    source = context.data_sources.add_spark(kind) if kind == "spark" else context.data_sources.add_pandas(kind)
    return source.add_dataframe_asset("batch").add_batch_definition_whole_dataframe("whole")


@lru_cache(maxsize=None)
def _context():
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.enable_analytics(False)
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    return context
