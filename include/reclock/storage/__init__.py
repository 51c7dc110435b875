"""The Delta tables of each source (``<root>/<name>/remap``, ``reclocked``, ``landing``, ``dead_letter``), and the
commit protocol every commit to them follows.

**The protocol.**  Progress lives in Delta *app transactions* (``txnAppId``/``txnVersion``, Delta's idempotent
writes), committed atomically with the rows they describe:

* remap, app ``reclock.remap``: version = remap upper - 1 (the last tick);
* remap, app ``reclock.since``: version = the compaction frontier ``since``;
* reclocked, app ``reclock.reclocked``: version = the last published IntoTime;
* dead_letter, app ``reclock.dead_letter``: version = the last published IntoTime whose dead letters are in;
* landing, app ``reclock.landing``: version = the number of landings;
* reclocked, app ``reclock.typed``: the typed frontier; each typed table, app ``reclock.typed``: version = the last
  IntoTime whose rows it holds (:mod:`reclock.storage.typed`).

Every commit, its writer (:mod:`reclock.storage.commits` holds each mechanism), and why two racing writers (a
schedule and a manual run, two workers, a retried task beside a slow one) cannot both win:

==========================  ===========  ====================  ==================================================
commit                      table        writer                a racing writer loses because
==========================  ===========  ====================  ==================================================
creation                    each         delta-rs              version 0 is claimed with put-if-absent and never
                                                               retried at another version: one creation wins, the
                                                               others find its table and check its schema
tick (its rows, upstream)   remap        delta-rs              the stored ``reclock.remap`` is checked after the
                                                               read, and Delta's conflict check refuses a commit
                                                               when one carrying the same app landed since
upstream record             remap        delta-rs              never retried: any commit since the read refuses it
(and retired partitions)                                       (properties never overwrite a record not read)
publish (Spark's files)     reclocked    delta-rs              as a tick's, with ``reclock.reclocked``
dead letters of a publish   dead_letter  delta-rs (pyarrow)    as a tick's, with ``reclock.dead_letter``; only rows
                                                               after the app's version are added
landing                     landing      delta-rs (files by    as a tick's, with ``reclock.landing``; a landing
                                         Spark or pyarrow)     committed before the read is seen in what is landed
``since``                   remap        delta-rs              as a tick's, with ``reclock.since`` (only grows)
compaction of remap         remap        delta-rs (pyarrow,    never retried: any commit since the read refuses it;
                                         ``predicate``)        rows keep their sums, the next compaction finishes
compaction of reclocked     reclocked    delta-rs (files by    removes the files holding rows at or before
                                         Spark)                ``since``, adds their rows rewritten; goes on over
                                                               a racing commit only if the files holding such
                                                               rows are still the ones it read
prune of the landing        landing      delta-rs (removes     removes only files whose every record lies below
                                         only)                 ``remap[since]``; goes on over a racing landing
                                                               (it only adds), refused by a racing prune
backfill repair             reclocked    delta-rs (files by    as a compaction rewrite, of the window's rows
                                         Spark)
typed rows                  typed table  delta-rs (files by    as a tick's, with ``reclock.typed`` (and an added
                                         Spark)                column first; a rewrite whole is one overwrite)
typed frontier              reclocked    delta-rs              as a tick's, with ``reclock.typed``
compaction, backfill        typed table  delta-rs (files by    as a compaction rewrite of reclocked
repair of typed rows                     Spark)
transactions step           txn tables   delta-rs (pyarrow)    as a tick's, with ``reclock.txn_output``/``_temp``
AS OF result at ``t``       its target   delta-rs (files by    as a compaction rewrite, of the rows ``as_of = t``
                                         Spark)                (:meth:`Warehouse.replace_rows`)
OPTIMIZE                    each         delta-rs              changes no row; a commit that removed one of its
                                                               files refuses it
VACUUM                      each         delta-rs (full)       deletes only files no version within the retention
                                                               reads
==========================  ===========  ====================  ==================================================

A write whose app version is not above the stored one commits nothing, so a step rerun after a crash commits
nothing twice; a conflict is :class:`ConcurrentWriteError` naming the table and what was not written.  delta-rs
also refuses an append after a commit that removed files of the version it read (a rewrite that changed data: a
compaction's fold, a delete), though the append touches none of them: a tick retries, a publish reads the table and
commits again when no publish landed meanwhile, a compaction leaves the rest to the next one.  A table
another Delta writer changed beyond what reclock reads and writes is refused when opened
(:mod:`reclock.storage.table_protocol`).  Each commit is observed as :mod:`reclock.points`'s commit of its name (the
crash points of the fault tests).  Every commit is delta-rs's, which claims a version with put-if-absent on a local
disk and on S3 (atomic across processes and machines) and alone writes checkpoints; Spark only writes data files
before a commit (a crash in between leaves them to VACUUM).

**The modules.**  :mod:`~reclock.storage.layout` (where things lie, schemas, errors), :mod:`~.commits` (every
commit), :mod:`~.files` (Parquet footers and Delta statistics, no JVM), :mod:`~.tables` (opening, creating,
reading, the tick), :mod:`~.upstream`, :mod:`~.landing`, :mod:`~.staging` (staged batches and their publish),
:mod:`~.compaction`, :mod:`~.typed` (the typed tables of a Postgres source), :mod:`~.rewrites` (rows in a range of a column replaced: Spark writes, delta-rs commits),
:mod:`~.side_files` (JSON documents beside the tables), :mod:`~.frames` (Spark frames of Arrow
rows).  Reads that need no JVM use delta-rs (versions, app transactions, remap, file statistics); everything else
reads through Spark, AS OF reads at a pinned table version (``versionAsOf``).
"""
from __future__ import annotations

import os

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from deltalake.fs import DeltaStorageHandler

from .. import offsets
from . import rewrites
from .commits import (DEAD_LETTER_APP, LANDING_APP, RECLOCKED_APP, REMAP_APP, SINCE_APP, TXN_OUTPUT_APP, TXN_TEMP_APP,
                      append_rows, app_version, create_table)
from .compaction import VACUUM_RETENTION_HOURS, CompactingTables, vacuum_due
from .files import STATS_STRING_CHARS, read_rows
from .frames import spark_frame
from .landing import LandingTables
from .layout import (KINDS, SUCCESS, ConcurrentWriteError, Kind, WarehouseError, arrow_schema, dead_letter_schema,
                     reclocked_schema, remap_schema, same_columns, schema_diff, spark_uri)
from .staging import StagingTables
from .typed import TypedTables
from .upstream import UpstreamRecord, UpstreamTables

__all__ = [
    "DEAD_LETTER_APP", "KINDS", "LANDING_APP", "RECLOCKED_APP", "REMAP_APP", "SINCE_APP", "STATS_STRING_CHARS",
    "SUCCESS", "TXN_OUTPUT_APP", "TXN_TEMP_APP", "VACUUM_RETENTION_HOURS", "ConcurrentWriteError", "Kind",
    "SourceTables", "UpstreamRecord", "Warehouse", "WarehouseError", "append_rows", "app_version", "arrow_schema",
    "create_table", "dead_letter_schema", "read_rows", "reclocked_schema",
    "remap_schema", "same_columns", "schema_diff", "spark_frame", "vacuum_due",
]


class SourceTables(StagingTables, LandingTables, UpstreamTables, CompactingTables, TypedTables):
    """The Delta tables of one source: remap and reclocked, the landing and dead letters, the typed tables (see the
    modules)."""


class Warehouse:
    """A root URI (local path, or e.g. ``s3://bucket/prefix`` with deltalake ``storage_options``)."""

    def __init__(self, root: str, storage_options: dict | None = None):
        self.root = root.rstrip("/") if "://" in root else os.path.abspath(root)
        self.storage_options = storage_options

    def source_uri(self, name: str) -> str:
        """Where source ``name``'s tables (and its last check record) live."""
        return f"{self.root}/{name}"

    def spark_uri(self, name: str) -> str:
        """``name``'s place in the warehouse as Spark spells it (``s3a://`` for S3)."""
        return spark_uri(self.source_uri(name))

    def source(self, name: str, partition_type: pa.DataType, data_schema: pa.Schema,
               offset_type: pa.DataType = offsets.INT64, spark=None, create: bool | None = None) -> SourceTables:
        """The tables of source ``name`` (``spark``: see :class:`SourceTables`); ``create`` (default: whether a
        ``spark`` is given): created when missing, the schemas of those that exist checked."""
        tables = SourceTables(self.source_uri(name), partition_type, data_schema, self.storage_options,
                              offset_type=offset_type, spark=spark)
        if create if create is not None else spark is not None:
            tables.create_if_absent()
        else:
            tables.check_schemas()
        return tables

    def replace_rows(self, name: str, df, column: str, value: int) -> None:
        """Replace the rows of the Delta table ``<root>/<name>`` whose integer ``column`` is ``value`` by the Spark
        DataFrame ``df``'s (each must have that value: the job fails otherwise), the others kept, in one delta-rs
        commit (:func:`reclock.storage.rewrites.rewrite`); the table is created with ``df``'s columns when missing
        (:class:`WarehouseError` when it exists with others).  A racing writer of the same rows:
        :class:`ConcurrentWriteError`, nothing replaced."""
        from pyarrow.fs import PyFileSystem
        from pyspark.sql.pandas.types import to_arrow_schema

        uri, schema = f"{self.root}/{name}", to_arrow_schema(df.schema)
        if not DeltaTable.is_deltatable(uri, self.storage_options):
            create_table(uri, schema, name, self.storage_options)
        dt = DeltaTable(uri, storage_options=self.storage_options)
        if not same_columns(arrow_schema(dt), schema):
            raise WarehouseError(f"{uri} exists with other columns than {name}'s rows: "
                                 f"{schema_diff(schema, arrow_schema(dt))}")
        rows = rewrites.checked(df, column, value, value, uri)
        rewrites.rewrite(df.sparkSession, dt, PyFileSystem(DeltaStorageHandler(self.root, self.storage_options)),
                         name, spark_uri(self.root), df.schema, column, value, value, lambda _: rows, "as-of",
                         f"{uri}: another writer replaced its rows with {column} = {value} meanwhile; nothing written",
                         {"operation": f"reclock replace {column} = {value}"})

    def txn_table_uri(self, name: str, kind: str) -> str:
        """Where the ``output`` or ``temp`` table of transactions step ``name`` lives."""
        return f"{self.root}/{name}_txn_{kind}"

    def txn_processed_upto(self, name: str) -> int:
        """Last IntoTime transactions step ``name`` has processed (-1: none): its sources may compact up to it."""
        try:
            dt = DeltaTable(self.txn_table_uri(name, "temp"), storage_options=self.storage_options)
        except TableNotFoundError:
            return -1
        return app_version(dt, TXN_TEMP_APP, -1)
