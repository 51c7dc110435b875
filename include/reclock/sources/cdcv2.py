"""A CDC v2 message stream (seed 004) as a reclock source whose records carry their own times.

The *transport* holds one JSON message (:func:`~reclock.engine.cdcv2.to_json`) per Kafka
record or per line of a file; messages may be duplicated and reordered, also across
Kafka partitions or files.  It is given as a URL, ``kafka://host:port/topic`` or any fsspec
directory URL (``file:///dir``, ``s3://bucket/prefix``, a plain path; files matching
``pattern``, ``*.jsonl`` by default), or as a source spec ``{"kind": "kafka" | "files", ...}``.

Gauge: one partition ``""`` whose offset is the explicit CDC time (non-negative ints).
``upper()`` is the decoder's frontier after every message currently in the transport:
``{"": t}`` for the antichain ``{t}``; a finished stream (empty antichain) is
``{"": FINISHED}`` (the largest int64, above every storable time).  Records are
``{"data": <datum as JSON>}`` with the update's diff.

The decoder forgets completed updates, so :meth:`CdcV2Source.read` re-decodes the transport
from its beginning until the range is complete, keeping ``start <= time < end``: each read
costs a scan of the transport prefix that completes ``end`` (a Spark stage pays it once per
range).  For the same reason nothing is ever released upstream: :meth:`CdcV2Source.commit`
records nothing and :meth:`CdcV2Source.committed` is empty.
"""
from __future__ import annotations

import json
from typing import Any, Iterator, Mapping
from urllib.parse import urlparse

from ..engine import Frontier, Partition
from ..engine.cdcv2 import CdcV2Error, Decoder, Message, from_json
from .base import Source, SourceError, arrow, check_range

FINISHED = 2**63 - 1
FILE_PATTERN = "*.jsonl"


def parse_transport(transport: str | Mapping[str, Any], pattern: str = FILE_PATTERN,
                    group_id: str = "reclock-cdcv2", storage_options: Mapping[str, Any] | None = None,
                    timeout_s: float = 10.0) -> dict:
    """The source spec of a transport URL (a mapping is taken as a spec already)."""
    if isinstance(transport, Mapping):
        return dict(transport)
    if not isinstance(transport, str) or not transport:
        raise SourceError(f"transport must be a URL or a source spec, got {transport!r}")
    if transport.startswith("kafka://"):
        url = urlparse(transport)
        topic = url.path.strip("/")
        if not url.netloc or not topic or "/" in topic:
            raise SourceError(f"a Kafka transport is kafka://host:port/topic, got {transport!r}")
        return {"kind": "kafka", "bootstrap_servers": url.netloc, "topic": topic, "group_id": group_id,
                "timeout_s": timeout_s}
    # files keyed by name: the sink writes each file once, whole, and duplicated messages may repeat first lines
    return {"kind": "files", "url": transport, "pattern": pattern, "storage_options": dict(storage_options or {}),
            "identity": "name"}


def open_transport(transport: str | Mapping[str, Any], **kwargs: Any) -> Source:
    """The Kafka or files source that carries the messages (see :func:`parse_transport`)."""
    from . import build_source

    return build_source(parse_transport(transport, **kwargs))


def transport_texts(transport: Source, since: Frontier = Frontier(),
                    upper: Frontier | None = None) -> Iterator[str]:
    """Every non-blank message text in ``[since, upper)`` of each transport partition, partition by partition."""
    field = "value" if "value" in transport.data_schema.names else "line"
    upper = transport.upper() if upper is None else upper
    for partition, end in upper:
        for data, offset, _ in transport.read(partition, since[partition], end):
            text = data.get(field)
            if text is None:
                raise SourceError(f"{transport!r} partition {partition!r} offset {offset}: empty message")
            if text.strip():
                yield text


class CdcV2Source:
    """Reads a CDC v2 stream from a Kafka topic or files; see the module docstring."""

    partition_type = arrow(lambda pa: pa.string())
    data_schema = arrow(lambda pa: pa.schema([pa.field("data", pa.string())]))

    def __init__(self, transport: str | Mapping[str, Any], pattern: str = FILE_PATTERN,
                 group_id: str = "reclock-cdcv2", storage_options: Mapping[str, Any] | None = None,
                 timeout_s: float = 10.0) -> None:
        """``group_id`` only names the Kafka consumer (nothing is committed)."""
        self.spec = parse_transport(transport, pattern, group_id, storage_options, timeout_s)
        self.transport = open_transport(self.spec)
        self._decoder, self._read_upto = Decoder(), Frontier()  # upper(): incremental decoding

    def __repr__(self) -> str:
        return f"CdcV2Source({self.transport!r})"

    def _messages(self, since: Frontier = Frontier(), upper: Frontier | None = None) -> Iterator[Message]:
        for text in transport_texts(self.transport, since, upper):
            try:
                yield from_json(text)
            except CdcV2Error as e:
                raise SourceError(f"{self!r}: not a CDC v2 message: {e}") from e

    def _push(self, decoder: Decoder, message: Message) -> list:
        try:
            return decoder.push(message)
        except CdcV2Error as e:
            raise SourceError(f"{self!r}: inconsistent CDC v2 stream: {e}") from e

    @staticmethod
    def _offset(decoder: Decoder) -> int:
        elements = list(decoder.frontier)
        if len(elements) > 1 or elements and not isinstance(elements[0], int):
            raise SourceError(f"CDC v2 times must be ints, got frontier {elements}")
        return elements[0] if elements else FINISHED

    def upper(self) -> Frontier:
        """``{"": t}``: every update at a time below ``t`` is decoded (``FINISHED``: all of them)."""
        upto = self.transport.upper()
        if not self._read_upto.less_equal(upto):
            raise SourceError(f"{self!r}: the transport went backwards from {self._read_upto} to {upto}")
        for message in self._messages(self._read_upto, upto):
            self._push(self._decoder, message)  # completed updates are dropped here; read() re-decodes
        self._read_upto = upto
        return Frontier.of({"": self._offset(self._decoder)})

    def read(self, partition: Partition, start: int, end: int) -> Iterator[tuple[dict[str, Any], int, int]]:
        """Yield ``({"data": json}, time, diff)`` for every update with ``start <= time < end``, by time."""
        if partition != "":
            raise SourceError(f"a CDC v2 source has the single partition '', got {partition!r}")
        check_range(start, end, "time")
        return self._read(start, end)

    def _read(self, start: int, end: int) -> Iterator[tuple[dict[str, Any], int, int]]:
        if start >= end:
            return
        decoder = Decoder()
        for message in self._messages():
            for updates, _ in self._push(decoder, message):
                for datum, time, diff in updates:
                    if start <= time < end:
                        yield {"data": json.dumps(datum, separators=(",", ":"))}, time, diff
            if self._offset(decoder) >= end:
                return
        raise SourceError(f"{self!r}: range [{start}, {end}) is beyond the decoded upper {self._offset(decoder)}")

    def commit(self, frontier: Frontier) -> None:
        """Nothing is released: reads re-decode the transport from its beginning."""

    def committed(self) -> Frontier:
        return Frontier()

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> "CdcV2Source":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
