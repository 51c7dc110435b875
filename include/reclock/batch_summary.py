"""A staged batch summarized from its Parquet files with Arrow, without Spark, and what the summary proves of the
per-record laws the batch checks validate (:mod:`reclock.checks`), so that a batch that keeps them is checked
without reading it in Spark.

The summary holds, per group ``g = (partition p, into_time t)`` of the batch's records: ``records(g)``,
``min(g)``, ``max(g)`` (of its offsets) and ``zero_diffs(g)``; whether every partition and offset is non-null
(*complete*); and whether the offsets are *proved unique* per partition.  Offsets are int64 (a source storing
big offsets as strings is not summarized).  With the engine's ranges ``[lo, hi)`` of binding ``t`` in ``p``
(``lo`` unbounded for ``p``'s first one) and its frontier ``upper[p]`` (the checks' module docstring), every
offset of ``g`` lying in ``[min(g), max(g)]``::

    no record of g is beyond       <=  complete  and  p in upper  and  max(g) < upper[p]
    no record of g is not covering <=  t is null  or  ((p, t) has a range and lo <= min(g) and max(g) < hi)
    no diff of g is zero           <=  zero_diffs(g) = 0
    offsets unique per partition   <=  complete, each file's offsets of a partition strictly increase in the
                                       file's order, and a partition's [first, last] intervals of the files are
                                       pairwise disjoint

When they hold for every group (the last only for a source with one record per offset: :meth:`Summary.proved`),
the frames the checks validate are exactly those the Spark aggregates make: every count of an offending record
0, every least offender null.  When one does not, the summary decides nothing: the checks count and name the
records in Spark.  A staging task writes its records in the order it read them, offsets increasing per
partition, so a healthy batch is proved (tests/test_checks.py: a table of cases, random batches against the
per-record law, the frames against Spark's; tests/test_pipeline.py: a Kafka batch staged by Spark).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .engine import Remap

#: The staged columns a summary reads.
COLUMNS = ["partition", "offset", "into_time", "diff"]
_GROUP = ["partition", "into_time"]
_AGGREGATES = [([], "count_all"), ("offset", "min"), ("offset", "max"), ("_zero", "sum")]
_NAMES = ["records", "min_offset", "max_offset", "zero_diffs"]


@dataclass(frozen=True)
class Summary:
    """A staged batch's groups (pandas: ``partition, into_time, records, min_offset, max_offset, zero_diffs``),
    whether it is complete and whether its offsets are proved unique per partition (module docstring)."""

    groups: pd.DataFrame
    complete: bool
    unique: bool
    integer_partitions: bool

    def proved(self, remap: Remap, offsets_unique: bool = True) -> bool:
        """Whether no record of the batch is beyond ``remap``'s frontier or off its covering binding, no diff is
        zero, and (``offsets_unique``: a source with one record per offset) its offsets are proved unique per
        partition: the law of the module docstring."""
        if not self.complete or (offsets_unique and not self.unique):
            return False
        upper = dict(remap.frontier)
        ranges, seen = {}, set()
        for r in remap.ranges(remap.since):
            ranges[(r.partition, r.into_time)] = (r.start if r.partition in seen else None, r.end)
            seen.add(r.partition)
        for g in self.groups.itertuples(index=False):
            if g.zero_diffs or g.partition not in upper or g.max_offset >= upper[g.partition]:
                return False
            if not pd.isna(g.into_time):
                lo, hi = ranges.get((g.partition, int(g.into_time)), (0, 0))
                if not ((lo is None or g.min_offset >= lo) and g.max_offset < hi):
                    return False
        return True

    def binding_frame(self) -> pd.DataFrame:
        """The per ``(partition, into_time)`` frame of :func:`reclock.checks.check_reclocked` for a batch the summary
        :meth:`proved`: the records and offsets of each group, no offender."""
        frame = self.groups[["partition", "into_time", "records", "min_offset", "max_offset"]].copy()
        none = pd.array([None] * len(frame), dtype="Int64")
        for name in ("beyond", "not_covering", "zero_diffs"):
            frame[name] = pd.array([0] * len(frame), dtype="Int64")
            frame[f"first_{name[:-1] if name == 'zero_diffs' else name}"] = none
        return frame[["partition", "into_time", "records", "min_offset", "max_offset", "beyond", "first_beyond",
                      "not_covering", "first_not_covering", "zero_diffs", "first_zero_diff"]]

    def duplicate_frame(self) -> pd.DataFrame:
        """The per-partition frame of the offsets' uniqueness check for a batch the summary :meth:`proved`: no
        duplicated record."""
        partitions = sorted(set(self.groups["partition"]))
        return pd.DataFrame({"partition": pd.array(partitions, dtype="Int64" if self.integer_partitions else object),
                             "duplicated_records": pd.array([0] * len(partitions), dtype="Int64")})


def summarize(files: Iterable[Iterable[pa.RecordBatch]]) -> Summary:
    """The summary of a batch given as its files, each as its record batches (``COLUMNS``, in the file's order).

    Files are read and summarized in threads, one per core (Arrow's reads and aggregates release the GIL): each
    file's part of the law is its own, and merging the parts does not depend on their order."""
    files = list(files)
    with ThreadPoolExecutor(max(1, min(len(files), os.cpu_count() or 1))) as pool:
        parts = list(pool.map(_summarize_file, files))
    partials = [partial for part in parts for partial in part.partials]
    types = [part.partition_type for part in parts if part.partition_type is not None]
    if not types:
        groups = pd.DataFrame({name: pd.array([], dtype="Int64") for name in [*_GROUP, *_NAMES]})
        return Summary(groups, True, True, True)
    complete = all(part.complete for part in parts)
    unique = complete and all(part.unique for part in parts)
    intervals: dict = {}  # partition -> [[first, last] per file]
    for part in parts:
        for p, span in part.spans.items():
            intervals.setdefault(p, []).append(span)
    merged = pa.concat_tables(partials, promote_options="default").group_by(  # files may differ in nullability
        _GROUP, use_threads=False).aggregate([
        ("count_all", "sum"), ("offset_min", "min"), ("offset_max", "max"), ("_zero_sum", "sum")])
    groups = pd.DataFrame({name: merged[name].to_pandas() for name in _GROUP} | {
        name: merged[column].to_pandas() for name, column in zip(_NAMES, [
            "count_all_sum", "offset_min_min", "offset_max_max", "_zero_sum_sum"])})
    integer = pa.types.is_integer(types[-1])
    for name in ([*_GROUP, *_NAMES] if integer else ["into_time", *_NAMES]):
        groups[name] = groups[name].astype("Int64")
    return Summary(groups, complete, unique and all(_disjoint(spans) for spans in intervals.values()), integer)


@dataclass
class _FilePart:
    """One file's part of a summary: its groups' partial aggregates, whether it is complete, whether its offsets
    strictly increase per partition in its order, and each partition's ``(first, last)`` offsets in it."""

    partials: list
    complete: bool
    unique: bool
    spans: dict
    partition_type: pa.DataType | None


def _summarize_file(batches: Iterable[pa.RecordBatch]) -> _FilePart:
    part = _FilePart([], True, True, {}, None)
    for batch in batches:
        table = pa.Table.from_batches([batch]).select(COLUMNS)
        part.partition_type = table.schema.field("partition").type
        zero = pc.fill_null(pc.equal(table["diff"], 0), False).cast(pa.int64())
        part.partials.append(table.append_column("_zero", zero).group_by(_GROUP, use_threads=False)
                             .aggregate(_AGGREGATES))
        part.complete = part.complete and not (table["partition"].null_count or table["offset"].null_count)
        part.unique = part.unique and part.complete and _increasing(table, part.spans)
    return part


def _increasing(table: pa.Table, last: dict) -> bool:
    """Whether ``table``'s offsets (none null) strictly increase per partition (in its order, after ``last``: each
    partition's ``[first, last]`` offsets so far in the file, updated)."""
    partitions, offsets = table["partition"], table["offset"]
    if not len(table):
        return True
    o = offsets.to_numpy()
    bounds = pc.min_max(partitions)
    if bounds["min"] == bounds["max"]:  # one partition (a staging task reads one): no sort
        segments = [(bounds["min"].as_py(), o)]
    else:
        codes = pc.dictionary_encode(partitions.combine_chunks())
        order = np.argsort(codes.indices.to_numpy(), kind="stable")  # keeps each partition's own order
        keys, starts = np.unique(codes.indices.to_numpy()[order], return_index=True)
        ordered = o[order]
        segments = [(codes.dictionary[int(k)].as_py(), ordered[s:e])
                    for k, s, e in zip(keys, starts, [*starts[1:], len(ordered)])]
    for p, values in segments:
        if not np.all(values[1:] > values[:-1]):
            return False
        if p in last:
            if values[0] <= last[p][1]:
                return False
            last[p] = (last[p][0], int(values[-1]))
        else:
            last[p] = (int(values[0]), int(values[-1]))
    return True


def _disjoint(spans: list[tuple[int, int]]) -> bool:
    spans = sorted(spans)
    return all(b[0] > a[1] for a, b in zip(spans, spans[1:]))
