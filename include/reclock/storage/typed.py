"""The typed tables of a source whose records carry their table's columns (Postgres): one Delta table per
upstream table, ``<source>/typed/<schema.table>``, derived from the published reclocked rows
(:mod:`reclock.typed_tables` states what they hold and when they are written); here, where they lie and how they
are committed.

Each typed table carries the app transaction ``reclock.typed`` = the last IntoTime whose rows of its upstream
table it holds, and the reclocked table carries ``reclock.typed`` = the *typed frontier*: every typed table holds
every published row of its upstream table up to it.  A typing commits each typed table first (Spark writes the
files, one delta-rs commit adds them: :func:`~reclock.storage.commits.commit_added`, refused when a commit carrying
the app landed since the table was read), then the frontier (:meth:`TypedTables.mark_typed`), so a typing killed
in between leaves tables ahead of the frontier, which the next typing reads from their own app versions.  A
column added upstream is added to the typed table (delta-rs ``ADD COLUMNS``) just before the rows that need it;
a typed table whose columns' types changed (a column retyped in a new epoch) is rewritten whole, its rows and
its own app version in one overwrite commit.  Each column keeps its Postgres type in its field metadata (``reclock.oid``,
``reclock.typmod``).  The protocol of a typed table may have the ``timestampNtz`` feature (a ``timestamp``
column; delta-rs enables it when creating the table).
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from . import commits
from .commits import app_version
from .files import add_action, drop_leftovers, footer, parquet_files, parquet_stats
from .layout import STAGED, ConcurrentWriteError, WarehouseError, arrow_schema, attempt_dir, spark_uri
from .table_protocol import Protocol, protocol_problems
from .tables import Tables

TYPED = "typed"  # the typed tables' directory under the source
TYPED_APP = "reclock.typed"
#: The table features a typed table may have beyond a reclock table's (module doc).
TYPED_FEATURES = frozenset({"timestampNtz"})
OID_KEY, TYPMOD_KEY = "reclock.oid", "reclock.typmod"  # a typed column's Postgres type, in its field metadata


class TypedTables(Tables):
    """The typed tables of a source's tables (module doc)."""

    def typed_dir(self, table: str) -> str:
        """The typed table of upstream table ``table`` (``schema.name``), relative to the source."""
        if not table or "/" in table or table.startswith((".", "_")):
            raise WarehouseError(f"{self.uri}: {table!r} cannot name a typed table")
        return f"{TYPED}/{table}"

    def typed_uri(self, table: str) -> str:
        return f"{self.uri}/{self.typed_dir(table)}"

    def typed_frontier(self) -> int:
        """The last IntoTime every typed table holds (-1: none; module doc)."""
        return self._app_version("reclocked", TYPED_APP, -1)

    def mark_typed(self, upto: int) -> bool:
        """Record the typed frontier ``upto`` on the reclocked table (an app transaction alone, one delta-rs
        commit); False when it is there already.  A racing mark: :class:`ConcurrentWriteError`."""
        dt = self.table("reclocked")
        if app_version(dt, TYPED_APP, -1) >= upto:
            return False
        commits.commit_added(dt, [], TYPED_APP, upto)
        return True

    def typed_table(self, table: str, version: int | None = None) -> DeltaTable | None:
        """The typed table of ``table`` (None: none yet), refused as :meth:`table` refuses one another writer changed
        beyond reclock's protocol (but for :data:`TYPED_FEATURES`)."""
        uri = self.typed_uri(table)
        try:
            dt = DeltaTable(uri, version=version, storage_options=self.storage_options)
        except TableNotFoundError:
            return None
        if version is None and (problems := protocol_problems(Protocol(*dt.protocol()), dt.metadata().configuration,
                                                              TYPED_FEATURES)):
            raise WarehouseError(f"{uri} (typed table of {table}): another Delta writer gave it {', '.join(problems)}, "
                                 "which reclock cannot read or write; nothing written (docs: storage.md, Other Delta "
                                 "users)")
        return dt

    def typed_tables(self) -> list[str]:
        """The upstream tables that have a typed table."""
        return sorted(i.base_name for i in self._fs().get_file_info(pafs.FileSelector(TYPED, allow_not_found=True))
                      if i.type == pafs.FileType.Directory
                      and DeltaTable.is_deltatable(self.typed_uri(i.base_name), self.storage_options))

    def typed_version(self, table: str) -> int:
        """The last IntoTime the typed table of ``table`` holds (-1: none)."""
        dt = self.typed_table(table)
        return -1 if dt is None else app_version(dt, TYPED_APP, -1)

    def commit_typed(self, table: str, read: int, rows, schema: pa.Schema, upto: int, rebuild: bool = False) -> int:
        """Add ``rows`` (a Spark DataFrame with ``schema``'s columns) to the typed table of ``table`` with its app
        transaction ``reclock.typed`` = ``upto``, the table having been read at app version ``read`` (-1: none, or
        no table yet): created with ``schema`` when missing, ``schema``'s columns it lacks added first; ``rebuild``:
        the rows replace the table's, and ``schema`` its columns, in one overwrite.  The rows written.  A typing
        that committed since ``read``: :class:`ConcurrentWriteError`, nothing added (files left to VACUUM)."""
        uri, fs = self.typed_uri(table), self._fs()
        directory = attempt_dir(f"{self.typed_dir(table)}/{STAGED}")
        rows.select(*schema.names).write.parquet(self._spark_path(directory))
        added = [(info, stats) for info in parquet_files(fs, directory)
                 if (stats := parquet_stats(footer(fs, info.path)))["numRecords"]]
        actions = [add_action(info, stats, self.typed_dir(table)) for info, stats in added]
        name = f"{self.uri.rsplit('/', 1)[-1]}_typed_{table}"
        dt = self.typed_table(table)
        if dt is None:
            commits.create_table(uri, schema, name, self.storage_options)
            dt = self.typed_table(table)
        raced = ConcurrentWriteError(f"{uri}: another typing committed to the typed table of {table} meanwhile "
                                     f"(read at {read}, now at {app_version(dt, TYPED_APP, -1)}); nothing added")
        if app_version(dt, TYPED_APP, -1) != read:
            raise raced
        if rebuild:
            commits.overwrite_added(dt, actions, schema, TYPED_APP, upto)
        else:
            if self._add_columns(dt, schema):
                dt.update_incremental()
                if app_version(dt, TYPED_APP, -1) != read:
                    raise raced
            commits.commit_added(dt, actions, TYPED_APP, upto)
        drop_leftovers(fs, directory, [info.base_name for info, _ in added])
        return sum(stats["numRecords"] for _, stats in added)

    @staticmethod
    def _add_columns(dt: DeltaTable, schema: pa.Schema) -> bool:
        """Add ``schema``'s columns the table ``dt`` was read at lacks (one delta-rs commit); whether it lacked any."""
        have = set(arrow_schema(dt).names)
        if missing := [f for f in schema if f.name not in have]:
            commits.add_columns(dt, missing)
        return bool(missing)

    def add_typed_columns(self, table: str, schema: pa.Schema) -> None:
        """Add ``schema``'s columns the typed table of ``table`` lacks."""
        self._add_columns(self.typed_table(table), schema)

    def typed_schema(self, table: str) -> pa.Schema | None:
        dt = self.typed_table(table)
        return None if dt is None else arrow_schema(dt)  # with the field metadata: the Postgres types

    def vacuum_typed(self, table: str, retention_hours: float) -> None:
        """VACUUM the typed table of ``table`` (:func:`~reclock.storage.commits.vacuum`)."""
        commits.vacuum(self.typed_table(table), retention_hours)

    def rewrite_typed(self, table: str, low: int | None, high: int, replace, point: str, raced: str,
                      metadata: dict, time_column: str) -> bool:
        """:func:`reclock.storage.rewrites.rewrite` of the typed table of ``table``'s rows with ``low <= time_column
        <= high``."""
        from ..spark.session import spark_schema
        from . import rewrites

        dt = self.typed_table(table)
        if dt is None:
            return False
        return rewrites.rewrite(self.spark, dt, self._fs(), self.typed_dir(table), spark_uri(self.uri),
                                spark_schema(arrow_schema(dt)), time_column, low, high, replace, point, raced,
                                metadata)
