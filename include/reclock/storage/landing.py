"""``<source>/landing``: records a source could not serve again later, landed once in the warehouse (a Postgres
source's initial snapshot, read under a snapshot that dies with its connection; a Kinesis stream's records, landed
at every tick).  Each landing is one delta-rs commit of the files written for it first (by Spark, or pyarrow), with
app ``reclock.landing`` = the number of landings and ``userMetadata`` recording the landed partitions' uppers after
it (and the source's state); from then on staging and backfills read those partitions' offset ranges from here
(:meth:`LandingTables.read_landed`), not upstream.  A landing committed by another writer after this one read the
table makes Delta refuse this one (:class:`~reclock.storage.layout.ConcurrentWriteError`, nothing landed), and one
committed before is seen by the check of what is landed already: no record is landed twice.

The landing stays bounded: compaction to ``since`` prunes it (:meth:`LandingTables.prune_landed`) below
``remap[since]``, the frontier of the binding ``since`` folds.  Law: staging reads only bindings after the published
upper, which is beyond ``since``, and a backfill reads from ``remap[start - 1]``, so every read but a backfill's
replay of the folded binding itself lies at or beyond ``remap[since]``; that replay is refused once the records it
needs were pruned (:meth:`LandingTables.pruned` joins the source's released frontier), never answered from a
partial landing.  A prune removes whole files (each holds one landing's records) whose every record lies below that
frontier, in one delta-rs commit of removes recording the frontier (``userMetadata`` ``pruned``).
"""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from .. import offsets
from ..engine import Frontier
from . import commits
from .commits import LANDING_APP, app_version
from .files import files_with_rows
from .layout import ConcurrentWriteError, WarehouseError, attempt_dir
from .tables import Tables


class LandingTables(Tables):
    """The landing table of a source's tables."""

    def land(self, df, uppers: Frontier) -> None:
        """Append ``df``'s records of the partitions of ``uppers`` (offsets below them) in one commit that
        records ``uppers``; those partitions are then read from here (:meth:`read_landed`).  Spark writes the
        records as Parquet into a fresh directory of the landing table (not in its log), and one delta-rs commit
        adds them (:meth:`_commit_files`)."""
        dt, version = self._landing_table()  # read first: a landing after it is either seen below or refused
        again = sorted(set(uppers.partitions) & set(self.landed().partitions), key=str)
        if again:
            raise WarehouseError(f"{self.uri}: partitions {again} are landed already")
        from pyspark.sql import functions as F

        directory = attempt_dir("landing/landed")
        (df.withColumn("into_time", F.lit(0).cast("long")).select(*self.schemas["landing"].names)
         .write.parquet(self._spark_path(directory)))
        self._commit_files(dt, "landing", directory, LANDING_APP, version, self._landed_metadata(uppers, {}))

    def land_more(self, rows: list[dict], before: Frontier, after: Frontier, state: dict) -> None:
        """Append ``rows`` (the data columns, ``partition`` and ``offset`` as an int) taken after ``before``, the
        landed uppers they were read from, in one commit recording ``after`` and the source's ``state``
        (:meth:`landing_state`): a source whose landing grows at every tick.  Compare-and-append: when the
        landed uppers are no longer ``before`` (another tick landed meanwhile) :class:`ConcurrentWriteError` and
        nothing landed, so no record is landed twice.  Every row lies in ``[before, after)`` of its partition.
        Written with pyarrow and committed by delta-rs: no JVM."""
        dt, version = self._landing_table()
        if (now := self.landed()) != before:
            raise ConcurrentWriteError(f"{self.uri}: landed uppers are {now}, not {before} as read: another tick "
                                       "landed meanwhile; nothing landed")
        outside = [(r["partition"], r["offset"]) for r in rows
                   if not before[r["partition"]] <= r["offset"] < after[r["partition"]]]
        if outside or not before.less_equal(after):
            raise WarehouseError(f"{self.uri}: landing {before} -> {after} with records outside it: {outside[:3]}")
        try:
            table = pa.Table.from_pylist(
                [{**r, "offset": offsets.to_storage(r["offset"], self.offset_type), "into_time": 0, "diff": 1}
                 for r in rows], schema=self.schemas["landing"])
        except offsets.OffsetError as e:
            raise WarehouseError(f"{self.uri}: cannot land records: {e}") from e
        self._commit_rows(dt, "landing", table, LANDING_APP, version, self._landed_metadata(after, {"state": state}))

    def _landing_table(self):
        """The landing table (created when missing) as read now, and the version of the next landing (app
        ``reclock.landing`` = the number of landings).  A landing commits with the app transaction: another landing
        committed since this read makes Delta refuse it (:class:`ConcurrentWriteError`, nothing landed)."""
        self._create_table_if_absent("landing")
        dt = self.table("landing")
        return dt, app_version(dt, LANDING_APP, 0) + 1

    @staticmethod
    def _landed_metadata(uppers: Frontier, fields: dict) -> dict:
        """A landing commit's ``userMetadata``: the landed partitions' uppers after it, and ``fields``."""
        return {**fields, "landed": [list(u) for u in uppers]}

    def _landings(self, field: str, read):
        """``read(value)`` of ``field`` in each landing commit's ``userMetadata``, newest first; commits without
        a readable one (the table's creation) are passed over."""
        dt = self._table_or_none("landing")
        for commit in [] if dt is None else sorted(dt.history(), key=lambda c: c.get("version", -1), reverse=True):
            try:
                yield read(json.loads(commit.get("userMetadata") or "{}")[field])
            except (ValueError, KeyError, TypeError):
                continue

    def landing_state(self) -> dict:
        """The source state recorded with the latest landing that has one (``{}`` before any)."""
        return next(self._landings("state", dict), {})

    def landed(self) -> Frontier:
        """The uppers of every landed partition (empty when nothing was landed)."""
        out = Frontier()
        for uppers in self._landings("landed", lambda u: Frontier.of([tuple(p) for p in u])):
            out = out.join(uppers)
        return out

    def read_landed(self, ranges, spark=None):
        """Spark DataFrame of the landed records in ``ranges`` (``(into_time, partition, start, end)`` of landed
        partitions), each stamped with its range's IntoTime; the columns of the reclocked table."""
        from pyspark.sql import functions as F

        df = self.read_spark("landing", spark=spark).drop("into_time")
        into_time, wanted = F.lit(None).cast("long"), F.lit(False)
        for t, partition, start, end in ranges:
            if start >= end:
                continue
            low, high = (F.lit(offsets.to_storage(o, self.offset_type)) for o in (start, end))
            inside = (F.col("partition") == F.lit(partition)) & (F.col("offset") >= low) & (F.col("offset") < high)
            into_time, wanted = F.when(inside, F.lit(t)).otherwise(into_time), wanted | inside
        return df.where(wanted).withColumn("into_time", into_time).select(*self.schemas["reclocked"].names)

    def pruned(self) -> Frontier:
        """Below it, per partition, the landing may no longer hold records: what compaction pruned (empty before)."""
        out = Frontier()
        for below in self._landings("pruned", lambda u: Frontier.of([tuple(p) for p in u])):
            out = out.join(below)
        return out

    def prune_landed(self, below: Frontier) -> int:
        """Remove the landing's files whose every record lies below ``below`` in its partition (compaction: the
        law in the module docstring), in one delta-rs commit of removes whose ``userMetadata`` records ``below``
        (:meth:`pruned`); the number of files removed (0: nothing to do, nothing committed).  A racing landing
        adds files this leaves alone; a racing prune or OPTIMIZE of the same files refuses it
        (:func:`~reclock.storage.commits.replace_files`: :class:`ConcurrentWriteError`, nothing removed)."""
        dt = self._table_or_none("landing")
        if dt is None or not below.partitions:
            return 0
        removed = self._files_below(dt, below)
        if not removed:
            return 0
        commits.replace_files(dt, removed, [], lambda latest: [path for path, _ in self._files_below(latest, below)],
                              "prune-landing", f"{self.uri}: another writer removed landing files meanwhile; nothing "
                              "pruned (the next compaction does it)",
                              {"pruned": [list(u) for u in below.join(self.pruned())]})
        return len(removed)

    def _files_below(self, dt, below: Frontier) -> list[tuple[str, int]]:
        """``(path, size)`` of the snapshot's landing files whose every record lies below ``below``, read from each
        file's ``partition`` and ``offset`` columns (offsets compare as stored: strings preserve their order)."""
        files, fs, out = files_with_rows(dt), self._fs(), []
        bounds = {p: offsets.to_storage(u, self.offset_type) for p, u in below}
        for path, size in zip(files["path"].to_pylist(), files["size_bytes"].to_pylist()):
            rows = pq.read_table(f"landing/{path}", columns=["partition", "offset"], filesystem=fs)
            highest = rows.group_by("partition").aggregate([("offset", "max")])
            if all(p in bounds and top < bounds[p] for p, top in
                   zip(highest["partition"].to_pylist(), highest["offset_max"].to_pylist())):
                out.append((path, size))
        return out
