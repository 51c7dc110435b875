"""A directory of append-only text files (JSON lines or plain lines) as a reclock source.

Any fsspec URL works through one code path: a local directory, ``file://``, ``memory://``,
``s3://bucket/prefix`` (``storage_options`` go to the filesystem).  Gauge (seed 001's S3
source): ``(file identity, byte offset)``; the offset is where a line starts.  A file's upper
is the byte just past its last *complete* line (ending in ``\\n``): a partially written last
line counts once its newline arrives.  Records are ``{"line": <decoded line without its
"\\n">}``; JSON stays a raw string.  Keys (paths relative to the directory) match ``pattern``.
A line not valid in ``encoding`` stops the read, or with ``on_bad_record: dead_letter`` is a dead letter
(:meth:`FileSource.read`).

**Identity** (``identity="fingerprint"``, the default).  A file is known by what it holds, not
by its name, as Vector's ``checksum`` fingerprint and Filebeat's ``fingerprint`` do::

    region(f)   = f[h : end of the n-th complete line at or after byte h]    h = ignored_header_bytes,
                                                                             n = fingerprint_lines (1)
    identity(f) = hex(sha256(region(f)))[:16]          the partition; undefined while region(f) is

The region is whole lines because, for an append-only file, bytes before a newline never change
and every file with something to read (a complete line) has one: a small file is read as soon
as its first line is complete, and a file without a complete line yet is held back, unbound and
without error (its upper would be 0 anyway).  A fixed byte count instead would hold back files
shorter than it.  Consequences, with ``A`` a file's identity:

- rename (``app.log`` -> ``app.log.1``, new ``app.log``): ``A`` is followed to ``app.log.1`` with
  its offsets, nothing re-read; the new ``app.log`` has new first bytes, a new partition from 0;
- copy-truncate (copy to ``app.log.1``, truncate ``app.log``, append): the copy holds ``A`` and
  continues from where ``A`` was; the truncated file is held back until its new first line is
  complete, then it is a new partition.  While the copy is in progress two files hold ``A``;
  they are *copies* when the shorter's last ``_TAIL`` bytes before its upper are the same in
  both, and ``A`` is read from the longer;
- two files with one fingerprint that are not copies (identical headers: CSV, banners) are
  refused with a :class:`SourceError` naming both; set ``fingerprint_lines`` (hash more lines)
  or ``ignored_header_bytes`` (skip the common header) so they differ.  Changing either changes
  every identity: the setting is part of :meth:`FileSource.identity`, which remap records at
  its first tick, and a tick refuses an upstream whose identity changed;
- a file replaced with different first bytes is a new identity; the old one has *disappeared*:
  "disappeared with lines [c, u) not yet committed" when it was not committed up to its upper
  (those bound lines can no longer be read exactly).  A fresh process does not remember uppers;
  there the tick's regression check (an identity's upper below its bound offset) and the
  stage's read refuse the same loss.  Committed up to its upper, on a local disk the new file is
  a new partition (rename rotation followed by deletion looks the same);
- on an object store (any filesystem but the local disk: ``s3://``, ``memory://``...), which
  has no rename and replaces whole objects, a key whose last known identity ``A`` (this
  process's last look, else the commit file's ``names``) is held by no object any more and
  which now holds another identity ``B`` was *overwritten*, and is refused: the new object does
  not extend what was read (that would keep ``A``'s first bytes), and lines it shares with
  ``A`` would be published twice, so which of them are new only its writer knows.  A key seen
  empty in between (a commit forgets identities held by no object: :meth:`FileSource.commit`),
  or emptied by ``delete_committed``, takes a new object as a new file.

Partitions are identities, so records carry no file name (a name column would break repeatable
reads after a rename).  :meth:`FileSource.names` maps each identity to the file holding it now;
the commit file also records ``names`` at each commit; every error names both.  With
``identity="name"`` the partition is the key itself (the behaviour before identities: rotation
is not followed), for transports whose files are never renamed, and for sources whose remap was
begun keyed by names.

**Retirement.**  An identity held by no file any more (rotated away and deleted) is retired by compaction
once read whole (:meth:`FileSource.held_partitions`; :mod:`reclock.engine.upstream`, "Retirement"): remap drops
its partition and the next :meth:`FileSource.commit` forgets it, so both track the live files.  With
``identity="name"`` nothing is retired.

Files must only grow: an identity whose file shrinks, disappears before being committed, or grows
with the bytes just before its known upper changed raises :class:`SourceError`.  Reads find
the file holding the identity now (it may have been renamed since the tick), so each read lists
the directory and fingerprints the files that are long enough, once per file version in a
process.  Commits go to a small JSON file (``_reclock_committed.json`` in the directory by
default) keyed by identity, with the fingerprint scheme; a commit file of another scheme (one
keyed by names, written before identities) is refused with what to do.  With
``delete_committed`` the files wholly below the committed frontier are deleted, and reads there
fail.
"""
from __future__ import annotations

import fnmatch
import hashlib
import posixpath
from typing import Any, Iterator, Mapping

from ..engine import Frontier, Partition
from .base import (COMMITTED_NAME, ON_BAD_RECORD, BadRecord, SourceError, arrow, check_range, committed_of,
                   read_commit_doc, write_committed)

_SCAN = 64 * 1024  # backward scan step when looking for the last newline
_BLOCK = 1 << 20  # forward read step
_TAIL = 64  # bytes before an upper compared to detect rewrites and to tell copies apart
_HEAD = 4096  # first read of a file's fingerprint region
_HEX = 16  # hex digits of sha256 in an identity (64 bits)
_STAMP = ("size", "ino", "mtime", "created", "ETag", "LastModified", "generation")  # a version of a file


def region_end(head: bytes, skip: int = 0, lines: int = 1) -> int | None:
    """End of the fingerprint region in ``head`` (a file's first bytes): just past the ``lines``-th
    newline at or after byte ``skip``; None while ``head`` holds fewer."""
    at = skip
    for _ in range(lines):
        i = head.find(b"\n", at)
        if i < 0:
            return None
        at = i + 1
    return at


def fingerprint(head: bytes, skip: int = 0, lines: int = 1) -> str | None:
    """The identity of a file starting with ``head`` (see the module docstring); None while undefined."""
    end = region_end(head, skip, lines)
    return None if end is None else hashlib.sha256(head[skip:end]).hexdigest()[:_HEX]


def by_preference(holders: Mapping[str, int], previous: str | None) -> list[str]:
    """Keys holding one identity, the one to read first: largest size, then the previous holder, then by name."""
    return sorted(holders, key=lambda k: (-holders[k], k != previous, k))


class FileSource:
    partition_type = arrow(lambda pa: pa.string())
    data_schema = arrow(lambda pa: pa.schema([pa.field("line", pa.string())]))
    reads_bad_records = True  # read(..., on_bad_record="dead_letter") yields a BadRecord for a line not in encoding
    #: One Spark read task per file and window: a task reads the lines that start in its byte range from a line
    #: start (:meth:`read`), and only a binding's bounds are known to be line starts, not a cut in between.
    max_task_offsets = None

    def __init__(self, url: str, pattern: str = "*", encoding: str = "utf-8",
                 storage_options: Mapping[str, Any] | None = None, committed_path: str | None = None,
                 delete_committed: bool = False, identity: str = "fingerprint", fingerprint_lines: int = 1,
                 ignored_header_bytes: int = 0) -> None:
        """``pattern`` is an fnmatch pattern on keys; ``committed_path`` a path on the same filesystem;
        ``identity``, ``fingerprint_lines`` and ``ignored_header_bytes``: see the module docstring."""
        from fsspec.core import url_to_fs

        try:
            if "\n".encode(encoding) != b"\n":
                raise SourceError(f"encoding {encoding!r} does not write newline as the byte 0x0a")
        except LookupError as e:
            raise SourceError(f"unknown encoding {encoding!r}") from e
        if identity not in ("fingerprint", "name"):
            raise SourceError(f"identity must be 'fingerprint' or 'name', got {identity!r}")
        for name, value, least in (("fingerprint_lines", fingerprint_lines, 1),
                                   ("ignored_header_bytes", ignored_header_bytes, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise SourceError(f"{name} must be an int >= {least}, got {value!r}")
        self.url, self.pattern, self.encoding = url, pattern, encoding
        self.storage_options, self.delete_committed = dict(storage_options or {}), bool(delete_committed)
        self.identity_mode, self.fingerprint_lines, self.ignored_header_bytes = (
            identity, fingerprint_lines, ignored_header_bytes)
        self.fs, root = url_to_fs(url, **self.storage_options)
        self.root = root.rstrip("/")
        protocols = {self.fs.protocol} if isinstance(self.fs.protocol, str) else set(self.fs.protocol)
        self.object_store = not protocols & {"file", "local"}  # no rename; an object is replaced whole
        self.committed_path = (self.fs._strip_protocol(committed_path) if committed_path
                               else posixpath.join(self.root, COMMITTED_NAME))
        self._seen: dict[str, tuple[int, int, bytes, str]] = {}  # identity -> (size, upper, tail bytes, key)
        self._ids: dict[str, tuple[tuple, str | None]] = {}  # key -> (version stamp, identity)
        self._copies: set[tuple] = set()  # (identity, stamp, stamp) of two holders found to be copies
        self._names: dict[str, str] = {}  # identity -> key holding it at the last upper()

    def __repr__(self) -> str:
        return f"FileSource({self.url!r}, pattern={self.pattern!r})"

    @property
    def scheme(self) -> str:
        """How partitions are derived from files: ``name``, or ``sha256:lines=<n>:skip=<h>``."""
        if self.identity_mode == "name":
            return "name"
        return f"sha256:lines={self.fingerprint_lines}:skip={self.ignored_header_bytes}"

    def identity(self) -> dict[str, str]:
        """Recorded with remap: a tick refuses to go on once the fingerprint scheme changed."""
        return {"file_identity": self.scheme}

    def _path(self, key: str) -> str:
        return posixpath.join(self.root, key)

    def _where(self, ident: str, key: str | None = None, offset: int | None = None) -> str:
        if self.identity_mode == "name":
            return f"{self.url} key {ident!r}" + ("" if offset is None else f" byte offset {offset}")
        where = f"{self.url} file {ident}" + ("" if key is None else f" (key {key!r})")
        return where + ("" if offset is None else f" byte offset {offset}")

    def _listing(self) -> dict[str, tuple]:
        """``{key: version stamp}`` of every matching object, fresh from the filesystem; size first."""
        self.fs.invalidate_cache(self.root)
        try:
            found = self.fs.find(self.root, detail=True)
        except FileNotFoundError:
            return {}
        out = {}
        for path, info in found.items():
            key = path[len(self.root):].lstrip("/")
            if (info.get("type") == "file" and path != self.committed_path and key != COMMITTED_NAME
                    and not key.endswith(COMMITTED_NAME + ".tmp") and fnmatch.fnmatchcase(key, self.pattern)):
                out[key] = (int(info["size"]),) + tuple(str(info.get(f)) for f in _STAMP[1:])
        return out

    def _identify(self, key: str, stamp: tuple) -> str | None:
        """The identity of the file at ``key`` (None while it has none), read once per file version."""
        if self.identity_mode == "name":
            return key
        cached = self._ids.get(key)
        if cached and cached[0] == stamp:
            return cached[1]
        size, path, head, ident = stamp[0], self._path(key), b"", None
        skip, lines = self.ignored_header_bytes, self.fingerprint_lines
        while len(head) < size and ident is None:
            want = _HEAD if not head else min(_BLOCK, max(len(head), _HEAD))
            head += self.fs.cat_file(path, start=len(head), end=min(size, len(head) + want))
            ident = fingerprint(head, skip, lines)
        self._ids[key] = (stamp, ident)
        return ident

    def _holders(self, listing: dict[str, tuple], least: int = 0) -> dict[str, dict[str, int]]:
        """``{identity: {key: size}}`` of the files at least ``least`` bytes long."""
        out: dict[str, dict[str, int]] = {}
        for key in sorted(listing):
            stamp = listing[key]
            if stamp[0] >= max(least, 1) and (ident := self._identify(key, stamp)) is not None:
                out.setdefault(ident, {})[key] = stamp[0]
        return out

    def _choose(self, ident: str, holders: dict[str, int], listing: dict[str, tuple]) -> str:
        """The key to read ``ident`` from; the others must be copies of it (else: a conflict)."""
        previous = self._seen.get(ident, (0, 0, b"", None))[3]
        order = by_preference(holders, previous)
        best = order[0]
        for other in order[1:]:
            seen = (ident, listing[best], listing[other])
            if seen in self._copies:
                continue
            upper = self._last_newline(other, holders[other], 0)
            lo = max(0, upper - _TAIL)
            if self.fs.cat_file(self._path(other), start=lo, end=upper) != self.fs.cat_file(
                    self._path(best), start=lo, end=upper):
                raise SourceError(
                    f"{self.url}: files {best!r} and {other!r} have the same fingerprint {ident} (their first "
                    f"{self.fingerprint_lines} line(s) after byte {self.ignored_header_bytes}) but different "
                    f"contents; set the files source's fingerprint_lines or ignored_header_bytes so that they "
                    f"differ (this changes every partition: a new source), or move one of them away")
            self._copies.add(seen)
        return best

    def _last_newline(self, key: str, size: int, lo: int) -> int:
        """Just past the last newline of ``key`` at or after byte ``lo - 1`` (``lo`` when there is none)."""
        return self._scan_back(self._path(key), size, lo, lo)[0]

    def _scan_back(self, path: str, size: int, lo: int, floor: int) -> tuple[int, int, bytes]:
        """``(upper, base, buf)``: the upper as in :meth:`_last_newline`, reading ``[base, size)`` into ``buf``
        backwards, never below ``floor``."""
        base, buf, upper = size, b"", lo
        while base > floor:
            nb = max(floor, base - _SCAN)
            buf, base = self.fs.cat_file(path, start=nb, end=base) + buf, nb
            i = buf.rfind(b"\n", max(0, lo - 1 - base))
            if i >= 0:
                upper = base + i + 1
                break
        return upper, base, buf

    def upper(self) -> Frontier:
        """Per identity: the byte offset just past its last complete line, in the file holding it now."""
        doc = self._commit_doc()
        committed, listing = committed_of(doc, self.committed_path), self._listing()
        uppers, names, seen = {}, {}, {}
        found = self._holders(listing)
        for ident, holders in found.items():
            key = self._choose(ident, holders, listing)
            size = holders[key]
            known = max(committed[ident], self._seen.get(ident, (0,))[0])
            if size < known:
                raise SourceError(f"{self._where(ident, key)} shrank from {known} to {size} bytes; files must "
                                  f"only grow")
            seen[ident] = self._scan(ident, key, size)
            uppers[ident], names[ident] = seen[ident][1], key
        for ident, (_, upper, _, key) in self._seen.items():
            if ident not in uppers and upper > committed[ident]:
                raise SourceError(f"{self._where(ident, key)} disappeared with lines [{committed[ident]}, "
                                  f"{upper}) not yet committed")
        if self.object_store and self.identity_mode == "fingerprint":
            self._refuse_overwritten(found, {**doc.get("names", {}), **{i: s[3] for i, s in self._seen.items()}},
                                     committed)
        self._seen, self._names = seen, names  # only once every check passed: a refused look changes nothing
        return Frontier.of(uppers).join(committed)  # released identities stay at their committed upper

    def _refuse_overwritten(self, found: Mapping[str, Mapping[str, int]], last: Mapping[str, str],
                            committed: Frontier) -> None:
        """An object store's key whose last known identity (``last``: identity -> key) is held by no object now, and
        which holds another identity, was overwritten: refused (module docstring)."""
        now = {key: ident for ident, holders in found.items() for key in holders}
        for old, key in sorted(last.items()):
            if old not in found and now.get(key, old) != old:
                raise SourceError(
                    f"{self._where(old, key)} was overwritten: the object now holds other first bytes (file "
                    f"{now[key]}) and no object holds file {old} (committed up to byte offset {committed[old]}). "
                    f"An object store replaces whole objects, so which of its lines are new cannot be told, and lines "
                    f"it shares with file {old} would be published twice; write new lines under new keys. To go on: "
                    f"if every line of {key!r} is new, move it to a new key (it is read as a new file); if it repeats "
                    f"lines already read, write only the new ones to a new key and delete {key!r}")

    def names(self) -> dict[str, str]:
        """``{identity: key}``: the file holding each partition now (a fresh :meth:`upper`)."""
        self.upper()
        return dict(self._names)

    def held_partitions(self) -> set[str] | None:
        """The identities some file holds now (a fresh :meth:`upper`): compaction retires the others once read whole
        (the :class:`~reclock.sources.base.Retiring` capability); None with ``identity="name"``, whose keys come
        back as other files."""
        if self.identity_mode == "name":
            return None
        self.upper()
        return set(self._names)

    def partition_names(self) -> dict[str, str]:
        """``{identity: key}`` as of the last :meth:`upper` (the :class:`~reclock.sources.base.NamedPartitions`
        capability: names for logs, status and the progress page)."""
        return dict(self._names)

    def _scan(self, ident: str, key: str, size: int) -> tuple[int, int, bytes, str]:
        """``ident``'s new ``(size, upper, tail bytes, key)``, refusing bytes changed before its known upper."""
        size0, lo, tail, key0 = self._seen.get(ident, (0, 0, b"", None))
        if size == size0 and key == key0:
            return self._seen[ident]
        path = self._path(key)
        upper, base, buf = self._scan_back(path, size, lo, lo - len(tail))  # also read the tail when close
        if tail and self._bytes(path, lo - len(tail), lo, base, buf) != tail:
            raise SourceError(f"{self._where(ident, key)} was rewritten: bytes before offset {lo} changed")
        return size, upper, self._bytes(path, max(0, upper - _TAIL), upper, base, buf), key

    def _bytes(self, path: str, start: int, end: int, base: int, buf: bytes) -> bytes:
        """Bytes ``[start, end)``, from ``buf`` (which holds ``[base, ...)``) when it covers them."""
        if start >= base and end <= base + len(buf):
            return buf[start - base:end - base]
        return self.fs.cat_file(path, start=start, end=end) if end > start else b""

    def read(self, partition: Partition, start: int, end: int,
             on_bad_record: str = "fail") -> Iterator[tuple[dict[str, Any] | BadRecord, int, int]]:
        """Yield ``({"line": ...}, offset, +1)`` for every line starting in ``[start, end)``.

        A line not valid in :attr:`encoding` raises a :class:`SourceError` naming the file (identity and
        key) and its byte offset; with ``on_bad_record="dead_letter"`` it is yielded as
        ``(BadRecord(its bytes without the newline, that error), offset, +1)`` and the read goes on."""
        if not isinstance(partition, str) or not partition:
            raise SourceError(f"a files partition is a non-empty identity string, got {partition!r}")
        check_range(start, end, "offset")
        if on_bad_record not in ON_BAD_RECORD:
            raise SourceError(f"on_bad_record must be one of {ON_BAD_RECORD}, got {on_bad_record!r}")
        return self._read(partition, start, end, on_bad_record == "dead_letter")

    @staticmethod
    def dead_letter_problem(options: Mapping[str, Any]) -> str | None:
        """None: :meth:`read` goes on past a line it cannot decode (``on_bad_record: dead_letter``)."""
        return None

    def _locate(self, ident: str, start: int, end: int) -> str:
        """The key holding ``ident`` now, with at least ``end`` bytes when one has (renamed since the tick, maybe)."""
        listing = self._listing()
        if self.identity_mode == "name":
            listing = {ident: listing[ident]} if ident in listing else {}
        for least in (end, 0):  # only files long enough can serve the range; else say why the read fails
            if holders := self._holders(listing, least=least).get(ident):
                return self._choose(ident, holders, listing)
        if start < (released := self.committed()[ident]):
            raise SourceError(f"{self._where(ident, offset=start)}: already released upstream (committed up to "
                              f"{released}, object deleted)")
        raise SourceError(f"{self._where(ident)} does not exist (no file holds it)")

    def _read(self, ident: str, start: int, end: int,
              dead_letter: bool = False) -> Iterator[tuple[dict[str, Any] | BadRecord, int, int]]:
        if start >= end:
            return
        key = self._locate(ident, start, end)
        try:
            f = self.fs.open(self._path(key), "rb")
        except FileNotFoundError:
            raise SourceError(f"{self._where(ident, key)} disappeared while being read") from None
        with f:
            if start:
                f.seek(start - 1)
                if f.read(1) != b"\n":
                    raise SourceError(f"{self._where(ident, key, start)} is not the start of a line")
            buf, k, at = b"", 0, start  # buf[k:] is unconsumed and starts at byte offset `at`
            while at < end:
                j = buf.find(b"\n", k)
                if j < 0:
                    want = end - at - (len(buf) - k)
                    chunk = f.read(min(want, _BLOCK) if want > 0 else _SCAN)
                    if not chunk:
                        raise SourceError(f"{self._where(ident, key)}: no complete line at {at} (file ends at "
                                          f"{at + len(buf) - k}); range [{start}, {end}) is beyond the upper "
                                          f"or the file shrank")
                    buf, k = buf[k:] + chunk, 0
                    continue
                try:
                    data: dict[str, Any] | BadRecord = {"line": buf[k:j].decode(self.encoding)}
                except UnicodeDecodeError as e:
                    error = f"{self._where(ident, key, at)}: line is not valid {self.encoding}: {e}"
                    if not dead_letter:
                        raise SourceError(error) from e
                    data = BadRecord(buf[k:j], error)
                yield data, at, 1
                at, k = at + j + 1 - k, j + 1

    def _commit_doc(self) -> dict:
        """The commit file's document, refused when another scheme (or the name-keyed format) wrote it."""
        doc = read_commit_doc(self.fs, self.committed_path)
        written = doc.get("file_identity", "name") if doc else self.scheme  # version 1 files are keyed by names
        if written != self.scheme:
            raise SourceError(
                f"commit file {self.committed_path} is keyed by {written!r} identities, this source by "
                f"{self.scheme!r}: "
                + ("it was written before files were known by fingerprint; keep reading this directory with "
                   "identity: name, or start a new source (its remap is keyed by names too) and remove the file"
                   if written == "name" else "set the files source's identity options back, or start a new source"))
        return doc

    def committed(self) -> Frontier:
        """The frontier recorded by :meth:`commit` (empty before the first commit)."""
        return committed_of(self._commit_doc(), self.committed_path)

    def released(self) -> Frontier:
        """The committed frontier when committed objects are deleted, else nothing (every line stays readable)."""
        return self.committed() if self.delete_committed else Frontier()

    def commit(self, frontier: Frontier) -> None:
        """Record ``frontier`` (joined with the last commit: commits never go backwards), forgetting the identities
        neither ``frontier`` nor any file holds: remap retired them (:meth:`held_partitions`)."""
        doc = self._commit_doc()
        current = self.upper()
        last = committed_of(doc, self.committed_path)
        merged = Frontier.of({p: o for p, o in last if frontier[p] or p in self._names}).join(frontier)
        if not merged.less_equal(current) or not all(isinstance(p, str) for p in frontier.partitions):
            raise SourceError(f"cannot commit {frontier}: partitions must be identity strings, uppers within "
                              f"{current}")
        doomed = {}  # with delete_committed: key -> identity of the objects wholly below the merged frontier
        if self.delete_committed:
            for ident, holders in self._holders(self._listing()).items():
                doomed.update({key: ident for key, size in holders.items() if size <= merged[ident]})
        if self.identity_mode == "name":
            write_committed(self.fs, self.committed_path, merged.as_dict())
        else:
            # the key of each identity an object holds now (and not deleted below): an identity held by no object
            # is forgotten, so its key may take a new object (current = upper() refused an overwrite already)
            names = {i: k for i, k in self._names.items() if k not in doomed}
            write_committed(self.fs, self.committed_path, merged.as_dict(), version=2, file_identity=self.scheme,
                            names=names)
        for key, ident in doomed.items():
            self.fs.rm_file(self._path(key))
            if self._seen.get(ident, (None,) * 4)[3] == key:
                del self._seen[ident]  # released and deleted here: its key may take a new object

    def close(self) -> None:
        """Nothing to release (fsspec filesystems hold no per-source connections)."""

    def __enter__(self) -> "FileSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
