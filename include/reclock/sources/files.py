"""A directory of append-only text files (JSON lines or plain lines) as a reclock source.

Any fsspec URL works through one code path: a local directory, ``file://``, ``memory://``,
``s3://bucket/prefix`` (``storage_options`` go to the filesystem).  Gauge (seed 001's S3
source): ``(object key, byte offset)``; the key is the path relative to the directory, the
offset is where a line starts.  A key's upper is the byte just past its last *complete*
line (ending in ``\\n``): a partially written last line counts once its newline arrives.
Records are ``{"line": <decoded line without its "\\n">}``; JSON stays a raw string.

Files must only grow: a file that shrinks, disappears before being committed, or grows
with the bytes just before its known upper changed raises :class:`SourceError`.  Commits go to a small JSON file
(``_reclock_committed.json`` in the directory by default); with ``delete_committed`` the
objects wholly below the committed frontier are deleted, and reads there fail.
"""
from __future__ import annotations

import fnmatch
import posixpath
from typing import Any, Iterator, Mapping

import pyarrow as pa

from ..engine import Frontier, Partition
from .base import COMMITTED_NAME, SourceError, check_range, read_committed, write_committed

_SCAN = 64 * 1024  # backward scan step when looking for the last newline
_BLOCK = 1 << 20  # forward read step
_TAIL = 64  # bytes before a key's upper remembered to detect rewrites


class FileSource:
    partition_type = pa.string()
    data_schema = pa.schema([pa.field("line", pa.string())])

    def __init__(self, url: str, pattern: str = "*", encoding: str = "utf-8",
                 storage_options: Mapping[str, Any] | None = None, committed_path: str | None = None,
                 delete_committed: bool = False) -> None:
        """``pattern`` is an fnmatch pattern on keys; ``committed_path`` a path on the same filesystem."""
        from fsspec.core import url_to_fs

        try:
            if "\n".encode(encoding) != b"\n":
                raise SourceError(f"encoding {encoding!r} does not write newline as the byte 0x0a")
        except LookupError as e:
            raise SourceError(f"unknown encoding {encoding!r}") from e
        self.url, self.pattern, self.encoding = url, pattern, encoding
        self.storage_options, self.delete_committed = dict(storage_options or {}), bool(delete_committed)
        self.fs, root = url_to_fs(url, **self.storage_options)
        self.root = root.rstrip("/")
        self.committed_path = (self.fs._strip_protocol(committed_path) if committed_path
                               else posixpath.join(self.root, COMMITTED_NAME))
        self._seen: dict[str, tuple[int, int, bytes]] = {}  # key -> (size, upper, tail bytes)

    def __repr__(self) -> str:
        return f"FileSource({self.url!r}, pattern={self.pattern!r})"

    def _path(self, key: str) -> str:
        return posixpath.join(self.root, key)

    def _where(self, key: str, offset: int | None = None) -> str:
        return f"{self.url} key {key!r}" + ("" if offset is None else f" byte offset {offset}")

    def _listing(self) -> dict[str, int]:
        """``{key: size}`` of every matching object, fresh from the filesystem."""
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
                out[key] = int(info["size"])
        return out

    def upper(self) -> Frontier:
        """Per key: the byte offset just past its last complete line."""
        committed, listing = self.committed(), self._listing()
        uppers = {}
        for key, size in listing.items():
            if size < committed[key] or key in self._seen and size < self._seen[key][0]:
                known = max(committed[key], self._seen.get(key, (0,))[0])
                raise SourceError(f"{self._where(key)} shrank from {known} to {size} bytes; files must only grow")
            uppers[key] = self._scan(key, size)
        for key, (_, upper, _) in list(self._seen.items()):
            if key not in listing:
                if upper > committed[key]:
                    raise SourceError(f"{self._where(key)} disappeared with lines [{committed[key]}, {upper}) "
                                      f"not yet committed")
                del self._seen[key]
        return Frontier.of(uppers).join(committed)  # released keys stay at their committed upper

    def _scan(self, key: str, size: int) -> int:
        size0, lo, tail = self._seen.get(key, (0, 0, b""))
        if size == size0 and key in self._seen:
            return lo
        path, base, buf, upper = self._path(key), size, b"", lo
        floor = lo - len(tail)  # also read the remembered tail when it is close
        while base > floor:  # the last newline at or after lo - 1, reading backwards
            nb = max(floor, base - _SCAN)
            buf, base = self.fs.cat_file(path, start=nb, end=base) + buf, nb
            i = buf.rfind(b"\n", max(0, lo - 1 - base))
            if i >= 0:
                upper = base + i + 1
                break
        if tail and self._bytes(path, lo - len(tail), lo, base, buf) != tail:
            raise SourceError(f"{self._where(key)} was rewritten: bytes before offset {lo} changed")
        self._seen[key] = (size, upper, self._bytes(path, max(0, upper - _TAIL), upper, base, buf))
        return upper

    def _bytes(self, path: str, start: int, end: int, base: int, buf: bytes) -> bytes:
        """Bytes ``[start, end)``, from ``buf`` (which holds ``[base, ...)``) when it covers them."""
        if start >= base and end <= base + len(buf):
            return buf[start - base:end - base]
        return self.fs.cat_file(path, start=start, end=end) if end > start else b""

    def read(self, partition: Partition, start: int, end: int) -> Iterator[tuple[dict[str, Any], int, int]]:
        """Yield ``({"line": ...}, offset, +1)`` for every line starting in ``[start, end)``."""
        if not isinstance(partition, str) or not partition:
            raise SourceError(f"a files partition is a non-empty key string, got {partition!r}")
        check_range(start, end, "offset")
        return self._read(partition, start, end)

    def _read(self, key: str, start: int, end: int) -> Iterator[tuple[dict[str, Any], int, int]]:
        if start >= end:
            return
        try:
            f = self.fs.open(self._path(key), "rb")
        except FileNotFoundError:
            if start < (released := self.committed()[key]):
                raise SourceError(f"{self._where(key, start)}: already released upstream "
                                  f"(committed up to {released}, object deleted)") from None
            raise SourceError(f"{self._where(key)} does not exist") from None
        with f:
            if start:
                f.seek(start - 1)
                if f.read(1) != b"\n":
                    raise SourceError(f"{self._where(key, start)} is not the start of a line")
            buf, k, at = b"", 0, start  # buf[k:] is unconsumed and starts at byte offset `at`
            while at < end:
                j = buf.find(b"\n", k)
                if j < 0:
                    want = end - at - (len(buf) - k)
                    chunk = f.read(min(want, _BLOCK) if want > 0 else _SCAN)
                    if not chunk:
                        raise SourceError(f"{self._where(key)}: no complete line at {at} (file ends at "
                                          f"{at + len(buf) - k}); range [{start}, {end}) is beyond the upper "
                                          f"or the file shrank")
                    buf, k = buf[k:] + chunk, 0
                    continue
                try:
                    line = buf[k:j].decode(self.encoding)
                except UnicodeDecodeError as e:
                    raise SourceError(f"{self._where(key, at)}: line is not valid {self.encoding}: {e}") from e
                yield {"line": line}, at, 1
                at, k = at + j + 1 - k, j + 1

    def committed(self) -> Frontier:
        """The frontier recorded by :meth:`commit` (empty before the first commit)."""
        return read_committed(self.fs, self.committed_path)

    def released(self) -> Frontier:
        """The committed frontier when committed objects are deleted, else nothing (every line stays readable)."""
        return self.committed() if self.delete_committed else Frontier()

    def commit(self, frontier: Frontier) -> None:
        """Record ``frontier`` (joined with the last commit: commits never go backwards)."""
        merged, current = self.committed().join(frontier), self.upper()
        if not merged.less_equal(current) or not all(isinstance(p, str) for p in frontier.partitions):
            raise SourceError(f"cannot commit {frontier}: keys must be strings, uppers within {current}")
        write_committed(self.fs, self.committed_path, merged.as_dict())
        if self.delete_committed:
            for key, size in self._listing().items():
                if 0 < size <= merged[key]:
                    self.fs.rm_file(self._path(key))

    def close(self) -> None:
        """Nothing to release (fsspec filesystems hold no per-source connections)."""

    def __enter__(self) -> "FileSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
