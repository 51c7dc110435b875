"""``<source>/landing``: records a source could not serve again later, landed once in the warehouse (a Postgres
source's initial snapshot, read under a snapshot that dies with its connection; a Kinesis stream's records, landed
at every tick).  Each landing is one commit (app ``reclock.landing`` = the number of landings) whose
``userMetadata`` records the landed partitions' uppers after it (and the source's state); from then on staging and
backfills read those partitions' offset ranges from here (:meth:`LandingTables.read_landed`), not upstream.  A
landing that another landed meanwhile is refused (:class:`~reclock.storage.layout.ConcurrentWriteError`), so no
record is landed twice.
"""
from __future__ import annotations

import json

import pyarrow as pa

from .. import offsets
from ..engine import Frontier
from .commits import LANDING_APP, append
from .layout import ConcurrentWriteError, WarehouseError
from .tables import Tables


class LandingTables(Tables):
    """The landing table of a source's tables."""

    def land(self, df, uppers: Frontier) -> None:
        """Append ``df``'s records of the partitions of ``uppers`` (offsets below them) in one commit that
        records ``uppers``; those partitions are then read from here (:meth:`read_landed`)."""
        again = sorted(set(uppers.partitions) & set(self.landed().partitions), key=str)
        if again:
            raise WarehouseError(f"{self.uri}: partitions {again} are landed already")
        from pyspark.sql import functions as F

        self._land(df.withColumn("into_time", F.lit(0).cast("long")), uppers, {})

    def _land(self, df, uppers: Frontier, fields: dict) -> None:
        """One landing commit (app ``reclock.landing`` = the number of landings) recording ``uppers`` (the
        landed partitions' uppers after it) and ``fields`` in its ``userMetadata``; Delta skips it when another
        landing took the version: :class:`ConcurrentWriteError` then."""
        self._create_table_if_absent("landing")
        version = self._app_version("landing", LANDING_APP, 0) + 1
        append(df, self.table_uri("landing"), self.schemas["landing"].names, LANDING_APP, version,
               {**fields, "landed": [list(u) for u in uppers]})
        if self._app_version("landing", LANDING_APP, 0) < version or not uppers.less_equal(self.landed()):
            raise ConcurrentWriteError(f"{self.uri}: another writer landed records at the same time; nothing landed")

    def land_more(self, rows: list[dict], before: Frontier, after: Frontier, state: dict) -> None:
        """Append ``rows`` (the data columns, ``partition`` and ``offset`` as an int) taken after ``before``, the
        landed uppers they were read from, in one commit recording ``after`` and the source's ``state``
        (:meth:`landing_state`): a source whose landing grows at every tick.  Compare-and-append: when the
        landed uppers are no longer ``before`` (another tick landed meanwhile) :class:`ConcurrentWriteError` and
        nothing landed, so no record is landed twice.  Every row lies in ``[before, after)`` of its partition."""
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
        self._land(self._frame("landing", table), after, {"state": state})

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
