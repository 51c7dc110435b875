"""A recorded stream, replayed from JSON lines, as a reclock source (Kinesis, PubNub or any gauge).

There is no live Kinesis or PubNub upstream here; this source replays what one delivered, so
their gauges run through the whole pipeline.  ``url`` is one JSON-lines file, or a directory
whose files matching ``pattern`` are read in key order as one stream (any fsspec URL, as in
:mod:`reclock.sources.files`; ``storage_options`` go to the filesystem).  One record a line::

    {"partition": "shardId-000000000000",
     "offset": "49590338271490256608559692538361571095921575989136588898", "data": {...}}

``gauge`` says what partition and offset are:

* ``"kinesis"``: partition = shard id (string), offset = sequence number (a decimal string or
  int, up to 129 digits: stored as a big offset, :data:`reclock.offsets.BIG`);
* ``"pubnub"``: partition = region (int, u32), offset = timetoken (int or decimal string, int64);
* ``"generic"``: ``partition_type`` ``"string"`` (default) or ``"int64"``, ``offset_type``
  ``"int64"`` (default) or ``"big"``.

Offsets strictly increase within a partition (a repeat or a decrease is a :class:`SourceError`),
and a partition's upper is its last offset + 1; a partition first seen later (a Kinesis
reshard) is at 0 before, as every frontier has it.  Records are ``{"data": <the data value as
canonical JSON>}``.  Only complete lines (ending in ``\\n``) count, so a recording may grow
while it is replayed; one that shrinks or is rewritten below the upper already seen raises.
Commits go to a small JSON file (``_reclock_committed.json`` in the directory, or
``<file>._reclock_committed.json``); the recording itself is never deleted.
"""
from __future__ import annotations

import bisect
import fnmatch
import json
import posixpath
import re
from typing import Any, Iterator, Mapping

import pyarrow as pa

from .. import offsets
from ..engine import Frontier, Partition
from .base import COMMITTED_NAME, SourceError, check_range, read_committed, write_committed

GAUGES = ("kinesis", "pubnub", "generic")
U32_MAX = 2 ** 32 - 1
_DECIMAL = re.compile(r"0|[1-9][0-9]*", re.ASCII)


class RecordedSource:
    data_schema = pa.schema([pa.field("data", pa.string())])
    max_task_offsets = None  # sparse gauges: one read task per partition and window

    def __init__(self, url: str, gauge: str = "generic", pattern: str = "*.jsonl",
                 storage_options: Mapping[str, Any] | None = None, committed_path: str | None = None,
                 partition_type: str = "string", offset_type: str = "int64") -> None:
        """``partition_type`` / ``offset_type`` apply to ``gauge="generic"`` only."""
        from fsspec.core import url_to_fs

        if gauge not in GAUGES:
            raise SourceError(f"unknown recorded gauge {gauge!r}; known: {', '.join(GAUGES)}")
        if gauge == "generic" and (partition_type not in ("string", "int64") or offset_type not in ("int64", "big")):
            raise SourceError(f"generic gauge: partition_type is 'string' or 'int64' (got {partition_type!r}), "
                              f"offset_type is 'int64' or 'big' (got {offset_type!r})")
        self.url, self.gauge, self.pattern = url, gauge, pattern
        self.storage_options = dict(storage_options or {})
        if gauge == "kinesis":
            partition_type, offset_type = "string", "big"
        elif gauge == "pubnub":
            partition_type, offset_type = "int64", "int64"
        self.partition_type = pa.string() if partition_type == "string" else pa.int64()
        self.offset_type = offsets.BIG if offset_type == "big" else offsets.INT64
        self.fs, root = url_to_fs(url, **self.storage_options)
        self.root = root.rstrip("/")
        single = self.fs.isfile(self.root)
        self.committed_path = (self.fs._strip_protocol(committed_path) if committed_path
                               else self.root + "." + COMMITTED_NAME if single
                               else posixpath.join(self.root, COMMITTED_NAME))
        self._listed: tuple = ()  # ((path, size), ...) the cache below was parsed from
        self._records: dict[Partition, tuple[list[int], list[str]]] = {}
        self._upper = Frontier()  # the greatest upper seen: a recording must not go backwards

    def __repr__(self) -> str:
        return f"RecordedSource({self.url!r}, gauge={self.gauge!r})"

    # --- the recording ------------------------------------------------------------------

    def _listing(self) -> tuple[tuple[str, int], ...]:
        """``(path, size)`` of every recorded file, in replay order."""
        self.fs.invalidate_cache(self.root)
        try:
            if self.fs.isfile(self.root):
                return ((self.root, int(self.fs.size(self.root))),)
            found = self.fs.find(self.root, detail=True)
        except FileNotFoundError:
            return ()
        out = []
        for path, info in sorted(found.items()):
            key = path[len(self.root):].lstrip("/")
            name = posixpath.basename(key)
            if (info.get("type") == "file" and path != self.committed_path and not name.startswith(("_", "."))
                    and fnmatch.fnmatchcase(key, self.pattern)):
                out.append((path, int(info["size"])))
        return tuple(out)

    def _load(self) -> dict[Partition, tuple[list[int], list[str]]]:
        """Per partition: its offsets (strictly increasing) and the records' data, re-parsed when files change."""
        listed = self._listing()
        if listed == self._listed:
            return self._records
        records: dict[Partition, tuple[list[int], list[str]]] = {}
        for path, size in listed:
            text = self.fs.cat_file(path, start=0, end=size) if size else b""
            complete = text[:text.rfind(b"\n") + 1]  # a partly written last line counts once complete
            for number, line in enumerate(complete.split(b"\n")[:-1], 1):
                if not line.strip():
                    continue
                partition, offset, data = self._parse(line, f"{path}:{number}")
                offs, datas = records.setdefault(partition, ([], []))
                if offs and offset <= offs[-1]:
                    raise SourceError(f"{path}:{number}: offset {offset} of partition {partition!r} does not "
                                      f"increase (previous {offs[-1]}); offsets must strictly increase per partition")
                offs.append(offset)
                datas.append(data)
        upper = Frontier.of({p: offs[-1] + 1 for p, (offs, _) in records.items()})
        if not self._upper.less_equal(upper):
            raise SourceError(f"{self.url}: the recording went backwards (upper {upper}, before {self._upper}): "
                              f"recordings must only grow")
        self._listed, self._records, self._upper = listed, records, upper
        return records

    def _parse(self, line: bytes, where: str) -> tuple[Partition, int, str]:
        try:
            record = json.loads(line)
        except ValueError as e:
            raise SourceError(f"{where}: not a JSON record: {e}") from None
        if not isinstance(record, dict) or not {"partition", "offset", "data"} <= set(record):
            raise SourceError(f"{where}: a record is {{\"partition\", \"offset\", \"data\"}}, got {line[:200]!r}")
        partition = self._partition(record["partition"], where)
        offset = self._offset(record["offset"], where)
        return partition, offset, json.dumps(record["data"], sort_keys=True, separators=(",", ":"))

    def _partition(self, value: Any, where: str) -> Partition:
        if self.partition_type == pa.string():
            if isinstance(value, str) and value:
                return value
            raise SourceError(f"{where}: a {self.gauge} partition (shard id) is a non-empty string, got {value!r}")
        top = U32_MAX if self.gauge == "pubnub" else offsets.INT64_MAX
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= top:
            return value
        raise SourceError(f"{where}: a {self.gauge} partition (region) is an int in [0, {top}], got {value!r}")

    def _offset(self, value: Any, where: str) -> int:
        if isinstance(value, str) and _DECIMAL.fullmatch(value):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SourceError(f"{where}: an offset is an int >= 0 or its decimal string, got {value!r}")
        try:
            offsets.to_storage(value + 1, self.offset_type)  # the upper must be storable too
        except offsets.OffsetError as e:
            raise SourceError(f"{where}: {e}") from None
        return value

    # --- the Source protocol ------------------------------------------------------------

    def upper(self) -> Frontier:
        """Per partition: its last recorded offset + 1."""
        self._load()
        return self._upper

    def read(self, partition: Partition, start: int, end: int) -> Iterator[tuple[dict[str, Any], int, int]]:
        """Yield ``({"data": ...}, offset, +1)`` for every record of ``partition`` with ``start <= offset < end``."""
        check_range(start, end)
        records = self._load()
        if end > self._upper[partition]:
            raise SourceError(f"{self.url}: range [{start}, {end}) of partition {partition!r} is beyond the "
                              f"recorded upper {self._upper[partition]}")
        offs, datas = records.get(partition, ([], []))
        lo, hi = bisect.bisect_left(offs, start), bisect.bisect_left(offs, end)
        return iter([({"data": datas[i]}, offs[i], 1) for i in range(lo, hi)])

    def committed(self) -> Frontier:
        """The frontier recorded by :meth:`commit` (empty before the first commit)."""
        return read_committed(self.fs, self.committed_path)

    def released(self) -> Frontier:
        """Nothing: the recording keeps every record."""
        return Frontier()

    def commit(self, frontier: Frontier) -> None:
        """Record ``frontier`` (joined with the last commit: commits never go backwards)."""
        merged, current = self.committed().join(frontier), self.upper()
        if not merged.less_equal(current):
            raise SourceError(f"cannot commit {frontier}: beyond the recorded upper {current}")
        # [partition, upper] pairs: JSON object keys would turn int regions into strings.
        write_committed(self.fs, self.committed_path, [[p, u] for p, u in merged])

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> "RecordedSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
