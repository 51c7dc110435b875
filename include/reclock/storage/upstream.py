"""What a source's storage keeps of its upstream: the record in remap's table properties (where its history
begins, the upstream's identity, accepted gaps, epochs), set in one delta-rs commit that never writes over a
record it did not read, and the last upstream upper a step measured (a side file, safe to lose)."""
from __future__ import annotations

import json
from typing import NamedTuple

from ..engine import Frontier
from . import commits
from .layout import UPSTREAM_SAMPLE
from .side_files import write_json
from .tables import RETIRED_PROPERTY, Tables, retired_of

START_PROPERTY, IDENTITY_PROPERTY, GAPS_PROPERTY = "reclock.start", "reclock.identity", "reclock.gaps"
EPOCHS_PROPERTY = "reclock.epochs"


class UpstreamRecord(NamedTuple):
    """Recorded with remap (table properties) at a source's first tick: where its history begins, the
    upstream's identity (:mod:`reclock.engine.upstream`), the gaps a user accepted (records lost upstream),
    and the epochs begun on replaced upstreams (``reclock new-epoch``), each a dict with ``began_at`` (its
    first IntoTime), ``base`` (its offset base, ``[[partition, offset]]``), its ``identity`` and ``start``,
    what it ``replaced`` (the previous identity and start) and when it was ``recorded_at``.
    ``start`` and ``identity`` are the current epoch's.  ``retired``: the partitions compaction retired, at their
    bound offsets (:mod:`reclock.engine.upstream`, "Retirement")."""

    start: Frontier
    identity: dict | None
    gaps: list = []
    epochs: list = []
    retired: Frontier = Frontier()

    @property
    def base(self) -> Frontier:
        """The current epoch's offset base (empty before any new epoch): gauge offset = base + upstream offset."""
        return Frontier.of([tuple(pair) for pair in self.epochs[-1]["base"]]) if self.epochs else Frontier()

    @property
    def began_at(self) -> int:
        """The current epoch's first IntoTime (0 before any new epoch)."""
        return self.epochs[-1]["began_at"] if self.epochs else 0


class UpstreamTables(Tables):
    """The upstream record and sample of a source's tables."""

    def upstream_record(self) -> UpstreamRecord | None:
        """What the remap table's properties record of the upstream since the first tick (None: not yet)."""
        dt = self._table_or_none("remap")
        conf = {} if dt is None else dt.metadata().configuration
        if START_PROPERTY not in conf:
            return None
        return UpstreamRecord(Frontier.of([tuple(pair) for pair in json.loads(conf[START_PROPERTY])]),
                              json.loads(conf.get(IDENTITY_PROPERTY, "null")), json.loads(conf.get(GAPS_PROPERTY, "[]")),
                              json.loads(conf.get(EPOCHS_PROPERTY, "[]")), retired_of(dt))

    def record_upstream(self, record: UpstreamRecord) -> None:
        """Record the start frontier, the upstream's identity, the gaps and the epochs in the remap table's
        properties, in one delta-rs commit (no JVM).  Any commit landing while it is prepared (a racing tick, a
        racing ``accept-lost`` or new epoch) refuses it, never retried over it, so a record is never written over
        one it did not read: :class:`~reclock.storage.layout.ConcurrentWriteError`, nothing recorded."""
        values = {START_PROPERTY: json.dumps([list(pair) for pair in record.start]),
                  IDENTITY_PROPERTY: json.dumps(record.identity, sort_keys=True),
                  GAPS_PROPERTY: json.dumps(record.gaps, sort_keys=True),
                  EPOCHS_PROPERTY: json.dumps(record.epochs, sort_keys=True)}
        if record.retired.partitions:
            values[RETIRED_PROPERTY] = json.dumps([list(pair) for pair in record.retired])
        commits.set_properties(self.table("remap"), values, "the upstream record (table properties)")

    def record_upstream_sample(self, upper: Frontier, bound: Frontier, step: str, at: int,
                               names: dict[str, str] | None = None) -> None:
        """Keep the upstream's upper as ``step`` measured it at ``at`` (ms), with what remap had bound then, as
        ``<source>/upstream_sample.json`` (replaced each time): the last known upstream lag, which the progress page
        shows without asking the upstream (:meth:`upstream_sample`).  ``names``: the partitions' names now (a
        files source's file names); a bound partition that has none now keeps its last known one."""
        doc = {"measured_at": at, "step": step, "upper": [list(u) for u in upper], "bound": [list(b) for b in bound]}
        if names is not None:
            known = (self._read_json(UPSTREAM_SAMPLE) or {}).get("names") or {}
            doc["names"] = {**{p: n for p, n in known.items() if p in set(bound.partitions) | set(upper.partitions)},
                            **names}
        write_json(self.uri, UPSTREAM_SAMPLE, doc, self.storage_options)

    def upstream_sample(self) -> dict | None:
        """The last :meth:`record_upstream_sample`: ``{"measured_at", "step", "upper", "bound"}`` (frontiers, and
        ``names`` when the source names its partitions), or None before any."""
        doc = self._read_json(UPSTREAM_SAMPLE)
        if doc is None:
            return None
        return {**doc, "upper": Frontier.of([tuple(u) for u in doc["upper"]]),
                "bound": Frontier.of([tuple(b) for b in doc["bound"]])}
