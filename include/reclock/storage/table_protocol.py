"""The Delta protocol of a reclock table: what reclock reads and writes, and what another Delta writer may change.

reclock reads its tables with delta-rs (versions, remap, the progress page, DuckDB queries) and with Spark, and
commits to them with delta-rs (ticks, publishes: ``add`` actions of files written elsewhere) and with delta-spark.
It creates every table with the basic protocol (reader version 1, writer version 2, no table features).  Other
Delta users may read the tables as they like (Spark SQL, time travel, ``DESCRIBE HISTORY``, other engines) and
maintain them (OPTIMIZE, VACUUM); they may also change a table's protocol or properties, and then the law is:

* A table reclock can still read and write correctly goes on as before.  That is reader version 1 (or 3 with no
  reader feature) and writer version 2 to 4, or 7 with only the writer features of :data:`WRITABLE_FEATURES`:
  invariants, append-only, change data feed (appends carry their rows in ``add`` actions, which change-data
  readers take as inserts; Spark's rewrites write their change files), check constraints and generated columns
  while the table defines none.
* Any other table stops the step that opens it, before it writes anything, with one error naming the table and
  what it needs (:func:`protocol_problems`): deletion vectors (delta-rs's readers refuse them), column mapping
  (files reclock writes or adds carry the logical column names), identity columns, row tracking, domain
  metadata, v2 checkpoints, type widening and every feature this list does not know; a check constraint (files
  added by delta-rs are not checked against it); ``delta.appendOnly = true`` (compaction removes files).

Undoing the change (dropping the constraint, unsetting the property, dropping the feature where Delta lets the
protocol return within the law) lets the source go on.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

#: Writer features of a table-features protocol (writer version 7) that reclock's writers keep correct.
WRITABLE_FEATURES = frozenset({"appendOnly", "invariants", "changeDataFeed", "checkConstraints", "generatedColumns"})
#: The legacy writer versions whose implied features reclock's writers keep correct (3 adds check constraints,
#: 4 change data feed and generated columns; 5 is column mapping, 6 identity columns).
WRITABLE_LEGACY_WRITERS = frozenset({1, 2, 3, 4})
#: What the legacy versions reclock cannot use need, for the error.
_LEGACY_NEEDS = {2: "columnMapping (reader version 2)", 5: "columnMapping (writer version 5)",
                 6: "identityColumns (writer version 6)"}


class Protocol(NamedTuple):
    """A table's protocol as deltalake's ``DeltaTable.protocol()`` gives it."""

    min_reader_version: int
    min_writer_version: int
    writer_features: Sequence[str] | None = None
    reader_features: Sequence[str] | None = None


def protocol_problems(protocol: Protocol, configuration: Mapping[str, str | None] | None = None,
                      allowed: frozenset[str] = frozenset()) -> list[str]:
    """What in a table's ``protocol`` and table properties ``configuration`` reclock cannot read or write: []
    when the table is reclock's to go on with (the module's law); ``allowed``: features the table may have besides
    (a typed table's: :data:`reclock.storage.typed.TYPED_FEATURES`)."""
    problems: list[str] = []
    reader, writer = protocol.min_reader_version, protocol.min_writer_version
    if reader == 3:
        problems += [f"reader feature {f}" for f in sorted(set(protocol.reader_features or ()) - allowed)]
    elif reader != 1:
        problems.append(f"reader version {reader}" + (f": {_LEGACY_NEEDS[reader]}" if reader in _LEGACY_NEEDS else ""))
    if writer == 7:
        problems += [f"writer feature {f}" for f in sorted(set(protocol.writer_features or ()) - WRITABLE_FEATURES - allowed
                                                           - {f for f in protocol.reader_features or ()})]
    elif writer not in WRITABLE_LEGACY_WRITERS:
        problems.append(f"writer version {writer}" + (f": {_LEGACY_NEEDS[writer]}" if writer in _LEGACY_NEEDS else ""))
    conf = configuration or {}
    problems += [f"check constraint {k.removeprefix('delta.constraints.')} ({v})" for k, v in sorted(conf.items())
                 if k.startswith("delta.constraints.")]
    if str(conf.get("delta.appendOnly", "false")).lower() == "true":
        problems.append("delta.appendOnly = true (compaction removes files)")
    return problems
