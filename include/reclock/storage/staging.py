"""Staged batches: Spark writes a batch of reclocked rows as Parquet under
``<source>/reclocked/staged/upto=<t>/<attempt>/`` (a fresh attempt directory per :meth:`StagingTables.stage`,
``_SUCCESS`` marks a complete one), inside the reclocked table's directory but not in its Delta log, so no reader
sees it.  Once checked, :meth:`StagingTables.publish_staged` adds the files of the attempt the check read
(:meth:`StagingTables.attempt_name`; by default the latest complete one) to the table as they are, in one
idempotent delta-rs commit (``add`` actions with statistics from the files' footers, and the
app transaction ``reclock.reclocked`` = ``t``), and removes the rest: the batch is written once, by Spark.
Attempts never published are removed by the publish; after a crash in between, VACUUM removes their data files.

What the checks need to know of a batch from the upstream (a Postgres source's primary keys) is written first, as
the attempt's ``_batch.json``, and so are the batch's records that could not be decoded (``_dead_letter/``, a
source with ``on_bad_record: dead_letter``), so ``_SUCCESS`` covers them too.  The dead letters are published by
the same publish, just before the records, into ``<source>/dead_letter`` (app ``reclock.dead_letter`` = the
batch's last IntoTime; only rows after the app's version, one delta-rs commit), so none is added twice.
"""
from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from typing import Iterator

import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from . import commits
from .commits import DEAD_LETTER_APP, RECLOCKED_APP, app_version
from .files import add_action, drop_leftovers, footer, footer_rows, parquet_files, parquet_stats
from .layout import (STAGED, STAGED_DEAD_LETTERS, STAGED_METADATA, SUCCESS, ConcurrentWriteError, Kind,
                     WarehouseError, attempt_dir, same_columns, schema_diff, upto_dir)
from .side_files import write_json
from .tables import Tables

log = logging.getLogger("reclock")

#: Rows of a staged file read at once by :meth:`StagingTables.staged_batches`.
BATCH_ROWS = 1 << 20
#: The commits a publish tries (:meth:`StagingTables.publish_staged`), each after reading the table again.
PUBLISH_TRIES = 3


class StagingTables(Tables):
    """The staged batches of a source's tables, and their publish."""

    #: While :meth:`pinned`: per ``upto``, what :meth:`_attempts` found first (or the error it raised).
    _pinned: dict[int, tuple[list[str], str] | WarehouseError] | None = None

    @contextmanager
    def pinned(self) -> Iterator[None]:
        """Within it, every read of a window's staged batch is of the attempt the first one found (or finds none,
        as the first found none): a step decides on one attempt and reads that one.

        Racing runs of one source stage a window's attempts while a check reads them, and which attempt is the
        latest complete one changes meanwhile: a check that found none complete (or a fresh one), then read one
        another run had staged from before a publish, checked records already published against the window that
        is left, and failed (seen in ``make soak --part runs``, 2026-11-30)."""
        outer, self._pinned = self._pinned, {} if self._pinned is None else self._pinned
        try:
            yield
        finally:
            self._pinned = outer

    def staging_dir(self, upto: int) -> str:
        """A fresh attempt directory (Spark URI) for the staged rows of the bindings up to IntoTime ``upto``.

        Write it with Spark's default committer (``_SUCCESS`` marks a complete attempt).
        """
        return self._spark_path(attempt_dir(upto_dir(upto)))

    def stage(self, df, upto: int, dead_letters=None, metadata: dict | None = None) -> int:
        """Write a Spark DataFrame of reclocked rows up to ``upto`` as a fresh staged attempt; rows staged.

        ``dead_letters``: a Spark DataFrame of the batch's records that could not be decoded (columns of
        :func:`~reclock.storage.layout.dead_letter_schema`), written first, under the attempt's ``_dead_letter/``,
        so that the attempt's ``_SUCCESS`` marks both complete.  ``metadata``: what the checks need to know of the
        batch from the upstream (JSON-able; :meth:`staged_metadata`), written first too, as the attempt's
        ``_batch.json``.  0 and nothing written when ``upto`` is already published.
        """
        if self.reclocked_upper() > upto:
            return 0
        attempt = attempt_dir(upto_dir(upto))
        writer = df.select(*self.schemas["reclocked"].names).write
        if metadata is not None:
            write_json(f"{self.uri}/{attempt}", STAGED_METADATA, metadata, self.storage_options)
            writer = writer.mode("append")  # into the attempt directory created for it
        if dead_letters is not None:
            self._typed(dead_letters, "dead_letter").write.parquet(self._spark_path(f"{attempt}/{STAGED_DEAD_LETTERS}"))
            writer = writer.mode("append")  # into the attempt directory the dead letters created
        writer.parquet(self._spark_path(attempt))
        return self.staged_rows(upto)

    def stage_empty(self, upto: int, metadata: dict | None = None) -> int:
        """Stage a batch without rows for the window up to ``upto`` (its bindings bound nothing to read: idle
        ticks), without Spark: a fresh attempt holding its ``metadata`` (as :meth:`stage`) and ``_SUCCESS``, no
        data file (a publish of it commits the app transaction alone); 0."""
        if self.reclocked_upper() > upto:
            return 0
        attempt, fs = attempt_dir(upto_dir(upto)), self._fs()
        fs.create_dir(attempt)
        if metadata is not None:
            write_json(f"{self.uri}/{attempt}", STAGED_METADATA, metadata, self.storage_options)
        with fs.open_output_stream(f"{attempt}/{SUCCESS}"):
            pass
        return 0

    def _typed(self, df, kind: Kind):
        """``df``'s columns of table ``kind``, cast to its types."""
        return df.select(*[df[f.name].cast(f.dataType).alias(f.name) for f in self.spark_schema(kind)])

    def staged_dead_letters(self, upto: int):
        """The dead letters of the latest complete staged attempt for ``upto`` as a pandas DataFrame; None when it
        has none staged (a source with ``on_bad_record: fail``), or nothing is staged (published meanwhile)."""
        fs = self._fs()
        try:
            _, attempt = self._attempts(fs, upto)
        except WarehouseError:
            return None
        files = self._staged_dead_letter_files(fs, attempt)
        if files is None:
            return None
        return pads.dataset([i.path for i in files], schema=self.schemas["dead_letter"], filesystem=fs,
                            format="parquet").to_table().to_pandas()

    def read_staged_dead_letters_spark(self, upto: int, spark=None):
        """The dead letters of the latest complete staged attempt for ``upto`` as a Spark DataFrame (read with
        ``spark``, default the tables' session); None when it has none staged (``on_bad_record: fail``)."""
        fs = self._fs()
        _, attempt = self._attempts(fs, upto)
        if self._staged_dead_letter_files(fs, attempt) is None:
            return None
        return ((spark or self.spark).read.schema(self.spark_schema("dead_letter"))
                .parquet(self._spark_path(f"{attempt}/{STAGED_DEAD_LETTERS}")))

    def staged_metadata(self, upto: int) -> dict | None:
        """The ``metadata`` staged with the latest complete attempt for ``upto`` (:meth:`stage`); None when it has
        none."""
        fs = self._fs()
        _, attempt = self._attempts(fs, upto)
        try:
            with fs.open_input_stream(f"{attempt}/{STAGED_METADATA}") as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return None

    def _staged_dead_letter_files(self, fs: pafs.FileSystem, attempt: str) -> list[pafs.FileInfo] | None:
        directory = f"{attempt}/{STAGED_DEAD_LETTERS}"
        return parquet_files(fs, directory) if fs.get_file_info(directory).type == pafs.FileType.Directory else None

    def read_staged(self, upto: int):
        """The latest complete staged attempt for ``upto`` as a pandas DataFrame (for checks before publishing)."""
        fs = self._fs()
        _, attempt = self._attempts(fs, upto)
        paths = [i.path for i in parquet_files(fs, attempt)]
        schema = self.schemas["reclocked"]
        return pads.dataset(paths, schema=schema, filesystem=fs, format="parquet").to_table().to_pandas()

    def staged_rows(self, upto: int) -> int:
        """The rows of the latest complete staged attempt for ``upto``, from its files' footers (no Spark job)."""
        fs = self._fs()
        _, attempt = self._attempts(fs, upto)
        return footer_rows(fs, parquet_files(fs, attempt))

    def staged_batches(self, upto: int, columns: list[str]) -> list:
        """The latest complete staged attempt for ``upto``, read with Arrow (no Spark): per data file, an iterator of
        its record batches of ``columns``, in the file's order (:func:`reclock.batch_summary.summarize`)."""
        fs = self._fs()
        _, attempt = self._attempts(fs, upto)

        def batches(path: str):
            with fs.open_input_file(path) as f:
                yield from pq.ParquetFile(f).iter_batches(columns=columns, batch_size=BATCH_ROWS)
        return [batches(i.path) for i in parquet_files(fs, attempt)]

    def staged_dead_letter_rows(self, upto: int) -> int | None:
        """The dead letters of the latest complete staged attempt for ``upto``, from their files' footers; None when
        it has none staged (``on_bad_record: fail``)."""
        fs = self._fs()
        _, attempt = self._attempts(fs, upto)
        files = self._staged_dead_letter_files(fs, attempt)
        return None if files is None else footer_rows(fs, files)

    def read_staged_spark(self, upto: int, spark=None):
        """The latest complete staged attempt for ``upto`` as a Spark DataFrame (read with ``spark``, default the
        tables' session)."""
        _, attempt = self._attempts(self._fs(), upto)
        return (spark or self.spark).read.schema(self.spark_schema("reclocked")).parquet(self._spark_path(attempt))

    def staged_uptos(self) -> list[int]:
        """The ``upto`` of every window with a complete staged attempt, ascending (published ones too, until
        their staging is cleared)."""
        fs = self._fs()
        parent = f"reclocked/{STAGED}"
        uptos = []
        for info in fs.get_file_info(pafs.FileSelector(parent, allow_not_found=True)):
            name = info.base_name
            if info.type == pafs.FileType.Directory and name.startswith("upto=") and name[5:].lstrip("-").isdigit():
                try:
                    self._attempts(fs, int(name[5:]))
                except WarehouseError:  # no complete attempt
                    continue
                uptos.append(int(name[5:]))
        return sorted(uptos)

    def _attempts(self, fs: pafs.FileSystem, upto: int) -> tuple[list[str], str]:
        """Every staged attempt directory for ``upto``, and the latest complete one (while :meth:`pinned`, those
        its first call found)."""
        if self._pinned is not None and upto in self._pinned:
            if isinstance(found := self._pinned[upto], WarehouseError):
                raise found
            return found
        try:
            found = self._latest_attempts(fs, upto)
        except WarehouseError as e:
            found = e
        if self._pinned is not None:
            self._pinned[upto] = found
        if isinstance(found, WarehouseError):
            raise found
        return found

    def attempt_name(self, upto: int) -> str:
        """The name of the staged attempt for ``upto`` that reads of it read: the latest complete one (while
        :meth:`pinned`, the one the first read found).  A check records it; the publish publishes that one."""
        _, attempt = self._attempts(self._fs(), upto)
        return attempt.rsplit("/", 1)[-1]

    @staticmethod
    def _attempt_dirs(fs: pafs.FileSystem, upto: int) -> list[str]:
        return sorted(i.path for i in fs.get_file_info(pafs.FileSelector(upto_dir(upto), allow_not_found=True))
                      if i.type == pafs.FileType.Directory)

    def _latest_attempts(self, fs: pafs.FileSystem, upto: int) -> tuple[list[str], str]:
        attempts = self._attempt_dirs(fs, upto)
        complete = [a for a in attempts if fs.get_file_info(f"{a}/{SUCCESS}").type == pafs.FileType.File]
        if not complete:
            raise WarehouseError(f"no complete staged attempt (with {SUCCESS}) under {self.uri}/{upto_dir(upto)}")
        return attempts, complete[-1]

    def publish_staged(self, upto: int, attempt: str | None = None) -> bool:
        """Add the staged attempt ``attempt`` (a name of :meth:`attempt_name`: the one the check passed on; None: the
        latest complete one) for ``upto`` to the reclocked table in one idempotent commit, its files as they are (not
        copied); False if already published.  An ``attempt`` that is not complete (gone: removed by hand or by
        VACUUM) is a :class:`~reclock.storage.layout.WarehouseError`, and nothing is published.

        The files are checked first, from their footers: the table's columns, IntoTimes in
        ``(published, upto]``.  The commit carries the app transaction ``reclock.reclocked`` = ``upto``: when a
        racing publish committed one since this one read the table, Delta refuses it
        (:class:`~reclock.storage.layout.ConcurrentWriteError`, nothing written), so no window is added twice.  A
        commit refused while no publish landed (a compaction's rewrite removed files of the version it read: delta-rs
        refuses that too) is tried again from reading the table, :data:`PUBLISH_TRIES` times in all.  A
        batch without rows commits the app transaction alone.  Other attempts for ``upto`` (never published) are
        deleted, and the published one keeps only its data files (a failure there, after the commit, is logged:
        VACUUM removes what is left).
        """
        for _ in range(PUBLISH_TRIES - 1):
            if (done := self._publish_staged(upto, attempt, again=True)) is not None:
                return done
        return self._publish_staged(upto, attempt, again=False)

    def _publish_staged(self, upto: int, attempt: str | None, again: bool) -> bool | None:
        """One try of :meth:`publish_staged`; None when ``again`` and a rewrite refused its commit."""
        dt = self._table_or_none("reclocked")
        published = -1 if dt is None else app_version(dt, RECLOCKED_APP, -1)
        if published >= upto:
            return False
        remap_upper = self.remap_upper()
        if upto >= remap_upper:
            raise WarehouseError(f"cannot publish up to {upto}: remap upper is {remap_upper}")
        if dt is None:
            raise WarehouseError(f"{self.table_uri('reclocked')}: no reclocked table to publish into")
        fs = self._fs()
        if attempt is None:
            attempts, attempt = self._attempts(fs, upto)
        else:
            attempts, attempt = self._attempt_dirs(fs, upto), f"{upto_dir(upto)}/{attempt}"
            if fs.get_file_info(f"{attempt}/{SUCCESS}").type != pafs.FileType.File:
                raise WarehouseError(f"{self.uri}: the staged attempt {attempt} that passed its checks is no longer "
                                     f"complete (no {SUCCESS}); nothing published: stage and check IntoTimes up to "
                                     f"{upto} again")
        staged = [(info, self._check_staged(fs, info, published + 1, upto)) for info in parquet_files(fs, attempt)]
        staged = [(info, stats) for info, stats in staged if stats["numRecords"]]  # not a file without rows
        self._publish_dead_letters(fs, attempt, upto)
        try:
            commits.commit_added(dt, [add_action(info, stats, "reclocked") for info, stats in staged], RECLOCKED_APP,
                                 upto)
        except ConcurrentWriteError as e:
            if not again or app_version(self.table("reclocked"), RECLOCKED_APP, -1) != published:
                raise  # out of tries, or a racing publish committed: as it is
            log.info("%s: publishing IntoTimes up to %d raced a rewrite of the table (%s); trying again", self.uri,
                     upto, e)
            return None
        try:  # published: what is left to remove never fails the publish (VACUUM removes it otherwise)
            for other in attempts:  # never published
                if other != attempt:
                    fs.delete_dir(other)
            if staged:
                drop_leftovers(fs, attempt, [info.base_name for info, _ in staged])
            else:
                fs.delete_dir(upto_dir(upto))
        except OSError as e:  # e.g. a racing stage writing an attempt of this window meanwhile
            log.warning("%s: published IntoTimes up to %d; removing the other staged attempts failed (%s): VACUUM "
                        "removes them", self.uri, upto, e)
        return True

    def _publish_dead_letters(self, fs: pafs.FileSystem, attempt: str, upto: int) -> None:
        """Append the dead letters staged in ``attempt`` (if it has them) to the dead-letter table, creating it,
        with app ``reclock.dead_letter`` = ``upto``: only rows with an IntoTime after the app's version (those
        before are in already), in one delta-rs commit refused when another carrying the app landed since this one
        read the table, so none is added twice.  Dead letters are few: read and written with pyarrow, no JVM.
        Staged files without rows (most batches have no bad record) commit nothing: a later batch's dead letters all
        lie after the app's version anyway."""
        files = self._staged_dead_letter_files(fs, attempt)
        if files is None:
            return
        self._create_table_if_absent("dead_letter")
        if not footer_rows(fs, files):
            return
        dt = self.table("dead_letter")
        done = app_version(dt, DEAD_LETTER_APP, -1)
        if done >= upto:
            return
        schema = self.schemas["dead_letter"]
        rows = pads.dataset([i.path for i in files], schema=schema, filesystem=fs, format="parquet").to_table(
            filter=pads.field("into_time") > done)
        self._commit_rows(dt, "dead_letter", rows, DEAD_LETTER_APP, upto)

    def _check_staged(self, fs: pafs.FileSystem, info: pafs.FileInfo, lower: int, upto: int) -> dict:
        """A staged file's schema matches and its IntoTimes lie in [lower, upto] (from its footer); its Delta
        statistics (:func:`~reclock.storage.files.parquet_stats`)."""
        meta = footer(fs, info.path)
        found, expected = meta.schema.to_arrow_schema(), self.schemas["reclocked"]
        if not same_columns(found, expected):
            raise WarehouseError(f"staged file {info.path} does not match the reclocked table: "
                                 f"{schema_diff(found, expected)}")
        stats = parquet_stats(meta)
        lo, hi = stats["minValues"].get("into_time", lower), stats["maxValues"].get("into_time", upto)
        if lo < lower or hi > upto:
            raise WarehouseError(f"staged file {info.path} has IntoTimes [{lo}, {hi}] outside [{lower}, {upto}]")
        return stats

