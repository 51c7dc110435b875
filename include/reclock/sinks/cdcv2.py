"""Write a source's reclocked collection as a CDC v2 stream (seed 004) to Kafka or files.

Updates are ``(datum, into_time, diff)``; the datum is a JSON array of the row's data columns,
then ``partition`` and ``offset`` (the reclocked table's column order; values must be JSON
scalars or lists, e.g. strings and ints as Kafka, files and Postgres give).  A run reads one
snapshot of the reclocked table and writes the interval ``[sink upper, reclocked upper)``:
its updates first, then the Progress statements covering it (:func:`~reclock.engine.cdcv2.encode`).

The sink's upper is read back from the transport itself: the frontier of the contiguous
Progress statements it holds.  Progress is written only once its updates are durable, so a
run that failed part-way writes its interval again (duplicates are harmless in CDC v2) and a
run with nothing newly published writes nothing.  Reading the upper back scans the transport.

Transports (as :func:`reclock.sources.cdcv2.parse_transport`): ``kafka://host:port/topic``
(the topic must exist; the producer picks partitions), or a directory URL, where each run
writes one file ``<lower, 20 digits>.jsonl`` under a ``.tmp`` name and renames it, so a
reader of ``*.jsonl`` never sees a partial file.  Read it back with ``kind: cdcv2``.
"""
from __future__ import annotations

import logging
import posixpath
from typing import Any, Mapping

import pyarrow.compute as pc

from ..engine.cdcv2 import Progress, encode, from_json, to_json
from ..sources.base import Source
from ..sources.cdcv2 import FINISHED, open_transport, transport_texts
from ..sources.files import FileSource
from ..runtime import Runtime, Where
from ..storage import RECLOCKED_APP, SourceTables, app_version


class SinkError(RuntimeError):
    """The sink cannot write the reclocked collection exactly (compacted away, wrong target, transport failure)."""


def written_upper(transport: Source) -> int:
    """The sink upper held by ``transport``: every time below it is written (``FINISHED``: all)."""
    spans = []
    for text in transport_texts(transport):
        if text.startswith('{"updates"'):
            continue  # only progress statements matter here
        message = from_json(text)
        if isinstance(message, Progress) and message.lower:
            if not all(isinstance(t, int) for t in message.lower + message.upper):
                raise SinkError(f"{transport!r} holds non-int CDC v2 times: {message}")
            spans.append((min(message.lower), min(message.upper, default=FINISHED)))
    upper = 0
    for lo, hi in sorted(spans):  # join the statements that connect to [0, upper)
        if lo <= upper:
            upper = max(upper, hi)
    return upper


def _freeze(x: Any) -> Any:
    return tuple(_freeze(y) for y in x) if isinstance(x, list) else x


def _history(tables: SourceTables, lower: int) -> tuple[list, int]:
    """``(updates, upper)`` of one reclocked snapshot: rows with ``lower <= into_time < upper``."""
    dt = tables.table("reclocked")
    upper = app_version(dt, RECLOCKED_APP, -1) + 1  # of this very snapshot
    columns = tables.data_columns + ["partition", "offset"]
    rows = dt.to_pyarrow_dataset().to_table(
        columns=columns + ["into_time", "diff"],
        filter=(pc.field("into_time") >= lower) & (pc.field("into_time") < upper)).to_pylist()
    return [(tuple(_freeze(r[c]) for c in columns), r["into_time"], r["diff"]) for r in rows], upper


def _write(transport: Source, lower: int, texts: list[str]) -> None:
    """Updates before progress: progress is written only after its updates are durable."""
    if isinstance(transport, FileSource):
        fs, path = transport.fs, posixpath.join(transport.root, f"{lower:020d}.jsonl")
        fs.makedirs(transport.root, exist_ok=True)
        fs.pipe_file(path + ".tmp", "".join(t + "\n" for t in texts).encode())
        fs.mv(path + ".tmp", path)
        return
    from confluent_kafka import KafkaException, Producer

    errors: list[str] = []

    def delivered(err, _msg) -> None:
        if err is not None:
            errors.append(str(err))

    producer = Producer({"bootstrap.servers": transport.bootstrap_servers, "linger.ms": 5,
                         "logger": logging.getLogger("reclock.librdkafka"), **transport.config})
    try:
        for batch in ([t for t in texts if not t.startswith('{"progress"')],
                      [t for t in texts if t.startswith('{"progress"')]):
            for text in batch:
                producer.produce(transport.topic, text.encode(), on_delivery=delivered)
                producer.poll(0)
            if producer.flush(transport.timeout_s * 3) or errors:
                raise SinkError(f"writing to Kafka topic {transport.topic!r} failed: {errors[:3] or 'timed out'}")
    except (KafkaException, BufferError) as e:
        raise SinkError(f"writing to Kafka topic {transport.topic!r} failed: {e}") from e


def write_cdcv2(tables: SourceTables, to: str | Mapping[str, Any], batch_size: int = 256,
                storage_options: Mapping[str, Any] | None = None) -> dict:
    """Write what ``tables`` published beyond the sink's upper to the transport ``to``; idempotent."""
    transport = open_transport(to, storage_options=storage_options)
    try:
        lower, before = written_upper(transport), tables.since()
        history, upper = _history(tables, lower)
        since = max(before, tables.since())  # compaction may race with the read
        if upper < lower:
            raise SinkError(f"the sink is written up to {lower}, beyond the reclocked upper {upper}: another table?")
        if 0 < since >= lower and upper > lower:
            raise SinkError(f"the reclocked table is compacted to {since}, at or beyond the sink upper {lower}: "
                            f"times in [{lower}, {since}] can no longer be written exactly")
        if upper == lower:
            return {"lower": lower, "upper": upper, "updates": 0, "messages": 0, "written": False}
        messages = encode(history, (upper,), (lower,), batch_size)
        _write(transport, lower, [to_json(m) for m in messages])
        return {"lower": lower, "upper": upper, "updates": len(history), "messages": len(messages), "written": True}
    finally:
        transport.close()


def sink_cdcv2(name: str, to: str | Mapping[str, Any], runtime: Where = None, **kwargs: Any) -> dict:
    """:func:`write_cdcv2` for the configured source ``name``."""
    with Runtime.of(runtime).source(name) as ctx:
        return write_cdcv2(ctx.tables, to, **kwargs)
