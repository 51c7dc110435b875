"""PostgreSQL logical replication as a reclock :class:`~reclock.sources.base.Source`.

Gauge: partition ``""`` whose offset is the *commit LSN* of a change's transaction, the
start of its commit record, as an int.  All changes of a transaction share one offset and
offset order is commit order (seed 001).

Initial snapshot (``snapshot=True``, the default): what the tables held when the source started
is part of its history.  :meth:`PostgresSource.export_snapshot` creates the slot on a replication
connection with ``SNAPSHOT 'export'``: Postgres returns the slot's consistent point ``C`` and a
snapshot that sees exactly the transactions committed before ``C``, while the slot decodes exactly
those with commit LSN ``>= C``.  So ``snapshot at C + changes from C`` is the tables' history, with
nothing missed or seen twice.  Each table's snapshot is its own partition ``"<schema.table>@<C>"``
(:func:`snapshot_partition`) whose offset is the row's ``ctid`` as ``block << 16 | line``, upper
``blocks << 16`` (every row visible to the snapshot lies in a block that existed when it was taken).
Spark copies ctid ranges in parallel, each task importing the exported snapshot (``SET TRANSACTION
SNAPSHOT``), while the exporting connection stays open; the rows are landed in the warehouse (the
pipeline does that) and read from there afterwards, since the snapshot dies with its connection.
Snapshot rows are ``op = "snapshot"``, ``+1``, in the same row text as the changes (each column's
output function text, as pgoutput sends it), so a later update or delete retracts them exactly.
With ``snapshot=False`` the source carries only the changes after its slot was created.

Rows and columns (:mod:`reclock.pg_types`): ``row`` is the JSON of the row's non-NULL columns, and
``columns`` the table's columns ``[[name, type OID, typmod], ...]`` for that record: pgoutput's Relation
message (sent before a relation's first change in each decoding, and again after its schema changed), or
the catalog under the snapshot.  Every connection pins the settings the output text depends on
(:data:`reclock.sources.pgoutput.SESSION`).  An update's unchanged TOASTed column (pgoutput ``'u'``) takes the old row's value:
with ``REPLICA IDENTITY FULL`` Postgres logs the old row with its TOASTed values inline.

Decoding uses the built-in ``pgoutput`` plugin through the SQL slot functions (:mod:`reclock.sources.pgoutput`).

* ``read`` peeks (never consumes) the slot up to ``end`` and keeps the transactions with
  ``start <= commit_lsn < end``, in commit order.  Inserts are ``+1`` of the new row, deletes
  ``-1`` of the old row, updates both; old rows need ``REPLICA IDENTITY FULL`` (set on the
  tables when this source creates the publication from ``tables``), else reads fail loudly.
  A TRUNCATE yields one marker per table (``op = "truncate"``, no row, diff 0) that staging
  replaces by the retraction of every row the table held then (:mod:`reclock.truncate`).
* ``commit`` advances the slot (``pg_replication_slot_advance``) so Postgres may recycle WAL;
  ``committed`` is the slot's ``confirmed_flush_lsn``; reading below it is an error.
* ``upper`` is argued in :meth:`PostgresSource.upper`.
"""
from __future__ import annotations

import logging
import re
import time
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Sequence

import pyarrow as pa

from ..engine import Frontier, Partition
from ..pg_types import columns_json, row_json
from .base import SourceError
from .pg_snapshot import TID_SHIFT, ExportedSnapshot, parse_snapshot_partition, snapshot_partition, tid
from .pgoutput import OutputText, decode, int_to_lsn, lsn_to_int, session

try:
    import psycopg
    from psycopg import errors, sql
except ImportError:  # pragma: no cover - reported when a source is built
    psycopg = None

log = logging.getLogger("reclock")
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class PostgresSource:
    """Changes of the tables in ``publication`` (default: the slot's name), read through ``slot``.

    ``tables`` (``"name"`` or ``"schema.name"``) creates the publication if it is missing and
    sets ``REPLICA IDENTITY FULL`` on them.  ``create_slot`` allows creating a missing ``pgoutput``
    slot; an existing one is reused, so a new source on the same slot resumes from its commit.
    With ``snapshot=True`` the slot is created only by :meth:`export_snapshot` (the pipeline's first
    tick), together with the tables' initial snapshot; until then the source is not started.
    ``exported`` (:attr:`ExportedSnapshot.spec`) lets a Spark task read the snapshot's partitions.
    """

    partition_type = pa.string()
    data_schema = pa.schema([
        pa.field("table", pa.string()),        # "schema.table"
        pa.field("op", pa.string()),           # insert / update / delete / snapshot
        pa.field("row", pa.string()),          # JSON object of the row's non-NULL columns
        pa.field("columns", pa.string()),      # the table's columns: [[name, type OID, typmod], ...]
        pa.field("xid", pa.int64()),
        pa.field("seq", pa.int32()),           # index of the change within its transaction
        pa.field("commit_time", pa.timestamp("us", tz="UTC")),
    ])
    #: A change's contents (AS OF views): the row of the table; the other columns describe the change.
    content_columns = ("table", "row")
    #: One Spark read task: 256 heap blocks (2 MB) of a snapshot partition, or 16 MB of WAL (each task
    #: decodes the slot from its committed position, so fewer, larger change ranges cost less).
    max_task_offsets = 256 << TID_SHIFT
    #: Yields TRUNCATE markers (reclock.truncate): what reads them must expand them.
    truncates = True
    #: The first tick lands the initial snapshot (the ``snapshot`` option; reclock.sources.base.Snapshotting).
    snapshot = True
    #: The data column holding each record's table columns: staging refuses a change it cannot follow and
    #: every publish types the rows into a typed table per table (reclock.typed_tables).
    table_columns = "columns"

    def __init__(self, dsn: str, slot: str, publication: str | None = None, tables: Sequence[str] = (),
                 create_slot: bool = True, busy_timeout_s: float = 10.0, snapshot: bool = True,
                 exported: dict | None = None) -> None:
        if psycopg is None:
            raise SourceError("the postgres source needs psycopg 3: pip install 'psycopg[binary]'")
        self.slot, self.publication = slot, publication or slot
        for what, name in (("slot", self.slot), ("publication", self.publication)):
            if not isinstance(name, str) or not _NAME.match(name):
                raise SourceError(f"{what} name must match {_NAME.pattern}, got {name!r}")
        self.busy_timeout_s, self._dsn, self._conn = busy_timeout_s, dsn, None
        self.snapshot, self.create_slot, self._exported = bool(snapshot), bool(create_slot), exported
        self._connection()
        try:
            if tables:
                self._ensure_publication(list(tables))
            if not self._sql("SELECT 1 FROM pg_publication WHERE pubname = %s", (self.publication,)):
                raise SourceError(f"publication {self.publication!r} does not exist; pass tables=[...] to create it")
            self._ensure_slot(create_slot and not self.snapshot)
            self._upper = self._confirmed() if self.started() else 0
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"postgres slot {self.slot!r} (publication {self.publication!r})"

    def _connection(self) -> "psycopg.Connection":
        if self._conn is None or self._conn.closed:
            try:
                self._conn = session(psycopg.connect(self._dsn, autocommit=True))
            except psycopg.Error as e:
                raise SourceError(f"cannot connect to postgres: {e}") from e
        return self._conn

    # --- setup ---

    def _ensure_publication(self, tables: list[str]) -> None:
        idents = [sql.Identifier(*t.split(".", 1)) for t in tables]
        for ident in idents:  # ALTER locks the table: only when needed
            name = ident.as_string(self._connection())
            if self._sql("SELECT relreplident FROM pg_class WHERE oid = %s::regclass", (name,))[0][0] != "f":
                self._sql(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(ident))
        if not self._sql("SELECT 1 FROM pg_publication WHERE pubname = %s", (self.publication,)):
            try:
                self._sql(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                    sql.Identifier(self.publication), sql.SQL(", ").join(idents)), retry=False)
            except SourceError as e:
                if not isinstance(e.__cause__, errors.DuplicateObject):  # created concurrently: fine
                    raise

    def _ensure_slot(self, create: bool) -> None:
        rows = self._sql("SELECT plugin, database = current_database() FROM pg_replication_slots"
                         " WHERE slot_name = %s", (self.slot,))
        if rows:
            plugin, same_db = rows[0]
            if plugin != "pgoutput" or not same_db:
                raise SourceError(f"slot {self.slot!r} must be a pgoutput logical slot of this database, "
                                  f"it uses {plugin!r}" + ("" if same_db else " in another database"))
        elif self.snapshot and self.create_slot:
            return  # created with the initial snapshot by export_snapshot()
        elif not create:
            raise SourceError(f"replication slot {self.slot!r} does not exist (create_slot=False)")
        else:
            try:  # waits for transactions running now to finish (the slot's consistent point)
                self._sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (self.slot,), retry=False)
            except SourceError as e:
                if not isinstance(e.__cause__, errors.DuplicateObject):
                    raise

    def _sql(self, query: Any, params: Sequence[Any] = (), retry: bool = True) -> list[tuple]:
        """Run ``query``; Postgres errors become :class:`SourceError`, a busy slot is retried."""
        deadline = time.monotonic() + self.busy_timeout_s
        while True:
            try:
                cur = self._connection().execute(query, params)
                return cur.fetchall() if cur.description else []
            except errors.ObjectInUse as e:  # slot active in another session (a concurrent read)
                if not retry or time.monotonic() > deadline:
                    raise SourceError(f"replication slot {self.slot!r} stays busy: {e}") from e
                time.sleep(0.05)
            except errors.UndefinedObject as e:
                if "replication slot" in str(e):
                    raise self._dropped() from e
                raise SourceError(f"postgres: {e}") from e
            except psycopg.Error as e:
                raise SourceError(f"postgres: {e}") from e

    def started(self) -> bool:
        """Whether the slot exists (with ``snapshot=True``: whether export_snapshot has created it)."""
        return bool(self._sql("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (self.slot,)))

    def drop_slot(self) -> None:
        """Drop the slot (e.g. one whose snapshot never landed); SourceError while another process takes a
        snapshot with it, or while it is in use."""
        with self._snapshot_lock():
            if self.started():
                self._sql("SELECT pg_drop_replication_slot(%s)", (self.slot,))
        self._upper = 0

    def begin_new_epoch(self, name: str, bound: int, start: int, landed: Iterable[str], drop_slot: bool) -> int | None:
        """Make way for source ``name``'s new epoch from a fresh snapshot (:func:`reclock.epochs.new_epoch`),
        given the LSN remap bound (``bound``), the changes' start (``start``) and the landed partitions.

        Returns the consistent point of a snapshot that already landed but whose epoch was not recorded (a new
        epoch killed after its landing: record it, take no other), or None with no slot left (export a new
        one).  A slot that still exists is dropped only with ``drop_slot`` (its unpublished changes are
        replaced by the snapshot) or when remap never bound it (its consistent point lies beyond ``bound``: a
        new epoch killed before its snapshot landed); otherwise refused (:class:`SourceError`), writing nothing.
        """
        if not self.started():
            return None
        confirmed = self.committed()[""]
        if any(self.snapshot_lsn(p) == confirmed > start for p in landed):
            log.warning("%s (%r): the snapshot at %s landed but its epoch was not recorded (a new epoch killed): "
                        "recording it", name, self, confirmed)
            return confirmed
        if confirmed <= bound and not drop_slot:
            raise SourceError(f"{name} ({self!r}): no new epoch begun, nothing written: its replication slot still "
                              "exists. A new epoch replaces it and publishes what the tables hold now as corrections; "
                              f"changes bound but not published are not read one by one: `reclock new-epoch {name} "
                              "--drop-slot` to go on")
        log.warning("%s (%r): dropping replication slot %r (confirmed at %s) for a new epoch", name, self, self.slot,
                    confirmed)
        self.drop_slot()
        return None

    @contextmanager
    def _snapshot_lock(self) -> Iterator[None]:
        """A session advisory lock on the slot's name, held while its snapshot is taken (or it is dropped);
        Postgres releases it when the holder's connection ends, a killed process's too."""
        key = f"reclock.snapshot.{self.slot}"
        if not self._sql("SELECT pg_try_advisory_lock(hashtext(%s))", (key,))[0][0]:
            raise SourceError(f"{self!r}: another process is taking the initial snapshot with this slot")
        try:
            yield
        finally:
            self._sql("SELECT pg_advisory_unlock(hashtext(%s))", (key,))

    @contextmanager
    def export_snapshot(self) -> Iterator[ExportedSnapshot]:
        """Create the slot with an exported snapshot of the publication's tables; the snapshot lives
        until the block ends (its replication connection stays open and idle meanwhile).

        The block copies the snapshot's partitions, with this source rebuilt as
        ``PostgresSource(..., exported=snapshot.spec)`` wherever it reads them.
        """
        if not self.create_slot:
            raise SourceError(f"replication slot {self.slot!r} does not exist (create_slot=False)")
        with self._snapshot_lock():
            yield from self._export()

    def _export(self) -> Iterator[ExportedSnapshot]:
        try:
            conn = psycopg.connect(self._dsn, replication="database", autocommit=True)
        except psycopg.Error as e:
            raise SourceError(f"cannot open a replication connection to postgres: {e}") from e
        try:
            result = conn.pgconn.exec_(
                f"CREATE_REPLICATION_SLOT {self.slot} LOGICAL pgoutput (SNAPSHOT 'export')".encode())
            if result.status != psycopg.pq.ExecStatus.TUPLES_OK:
                raise SourceError(f"creating replication slot {self.slot!r} with a snapshot failed: "
                                  f"{result.error_message.decode(errors='replace').strip()}")
            lsn, name = lsn_to_int(result.get_value(0, 1).decode()), result.get_value(0, 2).decode()
            with self._snapshot_transaction(name) as cur:
                blocks = cur.execute(
                    "SELECT format('%%s.%%s', schemaname, tablename),"
                    " pg_relation_size(format('%%I.%%I', schemaname, tablename)::regclass) / current_setting('block_size')::int"
                    " FROM pg_publication_tables WHERE pubname = %s ORDER BY 1", (self.publication,)).fetchall()
            self._upper = lsn
            yield ExportedSnapshot(name, lsn, {snapshot_partition(t, lsn): n << TID_SHIFT for t, n in blocks if n},
                                   tuple(t for t, _ in blocks))
        finally:
            conn.close()

    @contextmanager
    def _snapshot_transaction(self, name: str) -> Iterator["psycopg.Cursor"]:
        """A cursor in a read-only transaction that sees the exported snapshot ``name``."""
        try:
            with session(psycopg.connect(self._dsn)) as conn:
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(name)))
                yield conn.cursor()
                conn.rollback()
        except psycopg.Error as e:
            raise SourceError(f"postgres: reading the snapshot {name!r} of slot {self.slot!r}: {e}") from e

    def _exported_table(self, partition: str) -> tuple[str, str, str]:
        """``(table, schema, name)`` of a snapshot partition of the exported snapshot this source reads."""
        table, lsn = parse_snapshot_partition(partition)
        if not self._exported or self._exported.get("consistent_lsn") != lsn:
            raise SourceError(f"{partition}: the snapshot of {table} at {int_to_lsn(lsn)} is read from "
                              "where the pipeline landed it; its exported snapshot is gone")
        schema, _, name = table.partition(".")
        return table, schema, name

    @staticmethod
    def _snapshot_columns(cur: "psycopg.Cursor", schema: str, name: str) -> list[tuple]:
        return cur.execute(
            "SELECT attname, atttypid::int, atttypmod FROM pg_attribute WHERE attrelid = %s::regclass"
            " AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
            (sql.Identifier(schema, name).as_string(cur.connection),)).fetchall()

    def resync_markers(self, snapshot: ExportedSnapshot) -> list[tuple[str, dict[str, Any], int, int]]:
        """``(partition, data, offset 0, diff 0)``: a resync marker (:mod:`reclock.truncate`) for every table of
        ``snapshot`` (:meth:`ExportedSnapshot.every_table`), with its columns under the snapshot; staging replaces
        it by what the table's rows changed since the published history."""
        markers = []
        with self._snapshot_transaction(snapshot.name) as cur:
            for partition in snapshot.every_table():
                table, _ = parse_snapshot_partition(partition)
                schema, _, name = table.partition(".")
                described = columns_json(self._snapshot_columns(cur, schema, name))
                markers.append((partition, {"table": table, "op": "resync", "row": None, "columns": described,
                                            "xid": None, "seq": 0, "commit_time": None}, 0, 0))
        return markers

    @staticmethod
    def snapshot_lsn(partition: str) -> int | None:
        """The LSN a snapshot partition was taken at (its slot's consistent point); None for the changes' ``""``."""
        parsed = parse_snapshot_partition(partition)
        return parsed[1] if parsed else None

    def _read_snapshot(self, partition: str, start: int, end: int) -> Iterator[tuple[dict[str, Any], int, int]]:
        """The rows of a snapshot partition with ``start <= ctid offset < end``, in ctid order."""
        table, schema, name = self._exported_table(partition)
        with self._snapshot_transaction(self._exported["name"]) as cur:
            columns = self._snapshot_columns(cur, schema, name)
            names, oids, described = [c[0] for c in columns], [c[1] for c in columns], columns_json(columns)
            for oid in set(oids):  # each column as its output function's text, as pgoutput sends it
                cur.adapters.register_loader(oid, OutputText)
            cur.execute(sql.SQL("SELECT ctid::text, {} FROM {} WHERE ctid >= %s::tid AND ctid < %s::tid").format(
                sql.SQL(", ").join(map(sql.Identifier, names)), sql.Identifier(schema, name)),
                (tid(start), tid(end)))
            while batch := cur.fetchmany(2000):
                for ctid, *values in batch:
                    block, _, line = ctid[1:-1].partition(",")
                    yield ({"table": table, "op": "snapshot", "row": row_json(names, oids, values),
                            "columns": described, "xid": None, "seq": 0, "commit_time": None},
                           int(block) << TID_SHIFT | int(line), +1)

    def filled_columns(self, table: str, columns: Sequence[str]) -> list[str]:
        """Of ``columns`` of ``table`` (``schema.name``), those added with a default that filled the rows already
        there: Postgres keeps that value in the catalog (``atthasmissing``) and writes no change of the rows.
        (A volatile default rewrites the table instead, also without changes: not seen here.)"""
        schema, _, name = table.partition(".")
        rows = self._sql("SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = ANY(%s)"
                         " AND atthasmissing AND NOT attisdropped ORDER BY attnum",
                         (sql.Identifier(schema, name).as_string(self._connection()), list(columns)))
        return [r[0] for r in rows]

    def primary_keys(self, tables: Sequence[str] | None = None) -> dict[str, list[str]]:
        """``{"schema.name": [column, ...]}``: the primary key columns, in key order, of ``tables`` (default: the
        publication's tables), from the catalog (``pg_index.indisprimary``); tables without one are left out.

        Not from the WAL: with ``REPLICA IDENTITY FULL`` pgoutput's Relation message flags every column as key."""
        published = tables is None
        rows = self._sql(
            "SELECT format('%%s.%%s', n.nspname, c.relname), array_agg(a.attname::text ORDER BY k.ord)"
            " FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
            " CROSS JOIN unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)"
            " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum"
            " WHERE i.indisprimary AND (CASE WHEN %s THEN EXISTS (SELECT 1 FROM pg_publication_tables p"
            " WHERE p.pubname = %s AND p.schemaname = n.nspname AND p.tablename = c.relname)"
            " ELSE format('%%s.%%s', n.nspname, c.relname) = ANY(%s) END)"
            " GROUP BY 1 ORDER BY 1", (published, self.publication, [] if published else list(tables)))
        return {table: list(columns) for table, columns in rows}

    def _dropped(self) -> SourceError:
        if self.snapshot and not self._upper:  # this process never saw the slot
            return SourceError(f"replication slot {self.slot!r} does not exist: either {self!r} has not started (its "
                               "first tick creates the slot with the tables' initial snapshot) or the slot was dropped "
                               "(its changes are lost upstream: `reclock new-epoch <source>` starts the source over "
                               "from a fresh snapshot; docs: sources/postgres.md, A lost replication slot)")
        return SourceError(f"replication slot {self.slot!r} no longer exists (dropped?): its changes are lost "
                           "upstream; `reclock new-epoch <source>` starts the source over from a fresh snapshot, "
                           "publishing what the tables changed meanwhile (docs: sources/postgres.md, A lost replication slot)")

    def _confirmed(self) -> int:
        rows = self._sql("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                         (self.slot,))
        if not rows:
            raise self._dropped()
        return lsn_to_int(rows[0][0])

    # --- Source protocol ---

    def upper(self) -> Frontier:
        """Every transaction with commit LSN below the result is committed, durable and readable.

        One query samples the WAL insert position ``I`` and the flush position ``F``.  ``I`` is a
        record boundary: WAL space is reserved in order, so every record reserved before the
        sample ends at or below ``I`` and every later one, in particular the commit record of
        any transaction still open (e.g. in ``BEGIN; INSERT ...``), starts at or above ``I``.
        Hence no transaction can later commit with commit LSN ``< I``.  Once ``F >= I`` every
        record below ``I`` is on disk: each commit below ``I`` is durable, decoding reads it,
        and a crash cannot reuse its LSNs.  So the result is ``I`` (never below the previous
        result or the slot's committed position).

        A raw flush LSN would not do: it may fall inside a record whose tail is not yet on
        disk.  Commits flush the WAL before them, but WAL written after the last commit
        (an open transaction's rows, page pruning, even catalog reads of decoding) may stay
        unflushed for minutes.  When ``F < I`` this method therefore flushes it with a tiny
        transaction: a transactional ``pg_logical_emit_message`` (ignored by pgoutput without
        ``messages``) committed with ``synchronous_commit = local``, whose commit flushes all WAL
        before it.  (A transaction that only takes an xid is committed asynchronously.)  That
        costs an xid and ~100 bytes of WAL, and only when there is unflushed WAL.
        """
        insert, flush, confirmed = self._sql(
            "SELECT pg_current_wal_insert_lsn()::text, pg_current_wal_flush_lsn()::text,"
            " (SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s)", (self.slot,))[0]
        if confirmed is None:
            raise self._dropped()
        insert, flush = lsn_to_int(insert), lsn_to_int(flush)
        if flush < insert:
            with self._connection().transaction():
                self._sql("SET LOCAL synchronous_commit = local")
                self._sql("SELECT pg_logical_emit_message(true, 'reclock.flush', '')")
            flush = lsn_to_int(self._sql("SELECT pg_current_wal_flush_lsn()::text")[0][0])
        if flush >= insert:
            self._upper = max(self._upper, insert)
        self._upper = max(self._upper, lsn_to_int(confirmed))
        return Frontier.of({"": self._upper})

    def read(self, partition: Partition, start: int, end: int) -> Iterator[tuple[dict[str, Any], int, int]]:
        """The changes of transactions with ``start <= commit_lsn < end``, in commit order.

        Peeks the slot (it is not consumed) with ``upto_lsn = end``: decoding stops after the
        first record ending at or beyond ``end``, so every commit record starting below ``end``
        is decoded; the few beyond are filtered out.  The slot's confirmed position is checked
        *after* the peek (it only grows): if it is still ``<= start`` no transaction in range
        was skipped by the slot.
        """
        if start >= end:
            return iter(())
        if parse_snapshot_partition(partition):
            return self._read_snapshot(partition, start, end)
        if partition != "":
            raise SourceError(f"postgres has the changes' partition '' and snapshot partitions, not {partition!r}")
        if end > self._upper and end > self.upper()[""]:
            raise SourceError(f"read of [{start}, {end}) goes beyond the upper {self._upper}")
        rows = self._sql(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(%s::name, %s::pg_lsn, NULL,"
            " 'proto_version', '1', 'publication_names', %s::text)", (self.slot, int_to_lsn(end), self.publication))
        confirmed = self._confirmed()
        if start < confirmed:
            raise SourceError(f"data already released upstream: read of [{start}, {end}) starts below the "
                              f"slot's committed position {confirmed} ({int_to_lsn(confirmed)})")
        return decode((bytes(r[0]) for r in rows), start, end)

    def commit(self, frontier: Frontier) -> None:
        """Advance the slot to ``frontier``: transactions with commit LSN below it are released.

        Snapshot partitions are held where the pipeline landed them, not upstream: nothing to commit.
        """
        other = [p for p in frontier.partitions if p != "" and not parse_snapshot_partition(p)]
        if other:
            raise SourceError(f"postgres has the changes' partition '' and snapshot partitions, frontier names {other}")
        target = frontier[""]
        if target <= self._confirmed():
            return
        if target > self._upper and target > self.upper()[""]:
            raise SourceError(f"cannot commit {target} beyond the upper {self._upper}")
        self._sql("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (self.slot, int_to_lsn(target)))

    def committed(self) -> Frontier:
        return Frontier.of({"": self._confirmed()})

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def __enter__(self) -> "PostgresSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:  # picklable for Spark tasks: reconnects on first use
        return {**self.__dict__, "_conn": None}

