"""A live Amazon Kinesis data stream (or a Kinesis-compatible server) as a reclock source, with boto3.

Gauge: partition = shard id, offset = sequence number (decimal, 56 digits in practice: a big offset,
:data:`reclock.offsets.BIG`, as recorded Kinesis streams store it).  A shard's upper is its last
landed sequence number + 1.

**How a tick learns the upper: it lands what it reads.**  Kinesis has no high-watermark call (no
"last sequence number of shard s"), and GetRecords reads through an iterator, not by offset range, so
:meth:`KinesisSource.upper` cannot be sampled and an offset range cannot be re-read cheaply later.  So
each tick *takes* the new records (:meth:`KinesisSource.take`) and the pipeline lands them in the
source's landing Delta table in one idempotent commit (:meth:`reclock.storage.SourceTables.land_more`),
then binds what has landed.  Per shard the tick reads from its landed upper
(``AFTER_SEQUENCE_NUMBER`` of the last landed record; ``TRIM_HORIZON`` for a shard never read), until
GetRecords says ``MillisBehindLatest == 0`` with no more records (caught up), the shard ends (closed),
or the tick's budget is spent: ``max_records`` records and ``max_seconds`` of reading over all shards
(what is left waits for the next tick).  Staging and backfills read the landed records from the
warehouse by offset range, exactly and repeatably, whatever the stream has expired since.

**Resharding.**  A split closes its parent and opens two children (``ParentShardId``), a merge closes
two parents and opens one child (``ParentShardId``, ``AdjacentParentShardId``).  A closed shard is
*complete* once read to its end (GetRecords returns no ``NextShardIterator``); its upper is then
``max(EndingSequenceNumber, last landed) + 1`` and the landing records it as complete.  Kinesis's own
rule is that a child's records come after all of its parents'; here a child is read only once every
parent it has is complete *and bound* (remap's frontier has reached the parent's complete upper), so
each child record is bound at a later IntoTime than every parent record: parent-before-child holds in
every AS OF view (:func:`readable_shards`).  A parent the stream no longer lists (expired) and that was
never read does not hold a child back: the history begins after it.

**Refused, nothing landed.**  A stream deleted and recreated (another ``StreamCreationTimestamp``: the
upstream's :meth:`identity`, recorded with remap at the first tick) or a deleted stream.  Records that
may have expired before they were landed: a shard last read to its end at ``T`` holds every record not
yet landed only while ``now < T + RetentionPeriodHours``; past that, records may be gone (Kinesis trims
by age), and the tick refuses naming the shard and the last landed sequence number (:func:`expiry_problems`),
unless the shard still holds the last record landed from it: Kinesis trims a shard's oldest records first, so a
shard holding that record holds every record after it, and nothing was lost (an idle stream whose records
Kinesis has not trimmed yet).  A shard that no longer holds it may have lost records after it, or none (nothing
arrived): Kinesis tells the two apart in no way (sequence numbers are not dense, and a trimmed shard looks the
same), so it is refused.

**Resumption.**  There is no consumer group upstream: :meth:`commit` writes the offset resumption
frontier to a small JSON file in the source's state folder (``state_url``; the pipeline gives it
``<warehouse>/<source>/state``), joined with the last one (never backwards).  Where a tick continues
reading is the landed frontier (>= every commit): a tick killed after its landing committed continues
after what landed; one killed before lands the same records again at the next tick.
"""
from __future__ import annotations

import posixpath
import time
from typing import Any, Iterable, Iterator, Mapping, NamedTuple

import pyarrow as pa

from .. import offsets
from ..clock import now_ms
from ..engine import Frontier, Partition
from .base import COMMITTED_NAME, SourceError, check_range, read_committed, write_committed

#: Records GetRecords returns at most per call (the API's limit).
GET_RECORDS_LIMIT = 10_000


class Shard(NamedTuple):
    """What ListShards says of a shard: its parents and, once closed, its ending sequence number."""

    id: str
    parents: tuple[str, ...]
    ending: int | None  # None: open


class Taken(NamedTuple):
    """What one tick took from the stream: its records, the landed frontier after them, and the source state
    to record with them (complete shards, when each shard was last read to its end)."""

    records: list[tuple[str, int, dict[str, Any]]]  # (shard, sequence number, data)
    uppers: Frontier
    state: dict


def readable_shards(shards: Iterable[Shard], bound: Frontier, complete: Mapping[str, int]) -> list[str]:
    """The shards a tick may read, in shard id order: not complete, and every parent the stream still lists
    is complete and bound (``bound[parent] >= complete[parent]``); Kinesis's parent-before-child rule.

    A parent the stream no longer lists (expired) holds no child back: nothing of it can be read.
    """
    listed = {s.id for s in shards}
    out = []
    for shard in sorted(shards, key=lambda s: s.id):
        if shard.id in complete:
            continue
        if all(p not in listed or (p in complete and bound[p] >= complete[p]) for p in shard.parents):
            out.append(shard.id)
    return out


def expiry_problems(shards: Iterable[str], landed: Frontier, read_to: Mapping[str, int], now: int,
                    retention_ms: int) -> list[str]:
    """Shards whose records not yet landed may have expired: last read to their end at ``T`` with
    ``now >= T + retention``.  A shard never read to its end has nothing landed to be behind of."""
    return [f"shard {s}: records after sequence number {landed[s] - 1} may have expired (last read to the end at "
            f"{read_to[s]} ms, the stream keeps records {retention_ms // 3_600_000} h)"
            for s in shards if s in read_to and now >= read_to[s] + retention_ms]


class KinesisSource:
    """Stream ``stream`` read with boto3 (``endpoint_url`` for a Kinesis-compatible server, ``region`` and
    credentials, else boto3's defaults); ``max_records`` / ``max_seconds`` bound what one tick takes."""

    partition_type = pa.string()
    offset_type = offsets.BIG
    data_schema = pa.schema([pa.field("partition_key", pa.string()), pa.field("data", pa.binary()),
                             pa.field("arrival_ms", pa.int64())])
    #: A record's contents (AS OF views); its arrival time describes the delivery.
    content_columns = ("partition_key", "data")
    max_task_offsets = None  # sequence numbers are sparse: one read task per shard and window
    #: Ticks land what they read (:meth:`take`): the pipeline reads bound ranges from the landing table.
    lands_ticks = True

    def __init__(self, stream: str, endpoint_url: str | None = None, region: str | None = None,
                 aws_access_key_id: str | None = None, aws_secret_access_key: str | None = None,
                 state_url: str | None = None, storage_options: Mapping[str, Any] | None = None,
                 max_records: int = 50_000, max_seconds: float = 10.0, timeout_s: float = 10.0) -> None:
        import boto3
        from botocore.config import Config

        if not isinstance(stream, str) or not stream:
            raise SourceError(f"kinesis: stream is a non-empty name, got {stream!r}")
        if max_records < 1 or max_seconds <= 0:
            raise SourceError(f"kinesis stream {stream!r}: max_records >= 1 and max_seconds > 0, got "
                              f"{max_records!r}, {max_seconds!r}")
        self.stream, self.endpoint_url = stream, endpoint_url
        self.max_records, self.max_seconds = int(max_records), float(max_seconds)
        self.state_url, self.storage_options = state_url, dict(storage_options or {})
        self._client = boto3.client(
            "kinesis", endpoint_url=endpoint_url, region_name=region, aws_access_key_id=aws_access_key_id,
            aws_secret_access_key=aws_secret_access_key,
            config=Config(retries={"max_attempts": 3}, connect_timeout=timeout_s, read_timeout=timeout_s))
        self._summary: dict | None = None

    def __repr__(self) -> str:
        return f"kinesis stream {self.stream!r}" + (f" at {self.endpoint_url}" if self.endpoint_url else "")

    # --- talking to Kinesis --------------------------------------------------------------------

    def _call(self, operation: str, **kwargs) -> dict:
        """One API call; errors become :class:`SourceError` naming the stream (a missing stream: deleted?)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self._client, operation)(**kwargs)
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code == "ResourceNotFoundException" and operation in ("describe_stream_summary", "list_shards"):
                raise SourceError(f"{self!r} does not exist (deleted?): {e}") from e
            raise SourceError(f"{self!r}: {operation} failed: {e}") from e
        except BotoCoreError as e:
            raise SourceError(f"{self!r} is unreachable: {operation}: {e}") from e

    def summary(self) -> dict:
        """DescribeStreamSummary of the stream (cached for the source's life)."""
        if self._summary is None:
            self._summary = self._call("describe_stream_summary", StreamName=self.stream)["StreamDescriptionSummary"]
        return self._summary

    def shards(self) -> list[Shard]:
        """Every shard the stream lists, open and closed."""
        out, kwargs = [], {"StreamName": self.stream}
        while True:
            page = self._call("list_shards", **kwargs)
            for s in page["Shards"]:
                ending = s["SequenceNumberRange"].get("EndingSequenceNumber")
                parents = tuple(p for p in (s.get("ParentShardId"), s.get("AdjacentParentShardId")) if p)
                out.append(Shard(s["ShardId"], parents, None if ending is None else int(ending)))
            if not page.get("NextToken"):
                return out
            kwargs = {"NextToken": page["NextToken"]}

    def _iterator(self, shard: str, after: int) -> str:
        """An iterator just after sequence number ``after`` (-1: from the oldest record the shard holds)."""
        kwargs = ({"ShardIteratorType": "TRIM_HORIZON"} if after < 0 else
                  {"ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "StartingSequenceNumber": str(after)})
        return self._call("get_shard_iterator", StreamName=self.stream, ShardId=shard, **kwargs)["ShardIterator"]

    def _holds(self, shard: str, seq: int) -> bool:
        """Whether ``shard`` still holds the record with sequence number ``seq`` (-1: none asked, False): then it
        holds every record after it too (Kinesis trims a shard's oldest records first), and nothing after it
        expired (module doc).  A record trimmed, or an iterator that does not start at it: False."""
        if seq < 0:
            return False
        try:
            iterator = self._call("get_shard_iterator", StreamName=self.stream, ShardId=shard,
                                  ShardIteratorType="AT_SEQUENCE_NUMBER", StartingSequenceNumber=str(seq))
            page = self._call("get_records", ShardIterator=iterator["ShardIterator"], Limit=1)
        except SourceError:
            return False
        return bool(page["Records"]) and int(page["Records"][0]["SequenceNumber"]) == seq

    @staticmethod
    def _record(record: dict) -> dict[str, Any]:
        arrival = record.get("ApproximateArrivalTimestamp")
        return {"partition_key": record.get("PartitionKey"), "data": bytes(record["Data"]),
                "arrival_ms": None if arrival is None else int(arrival.timestamp() * 1000)}

    # --- the tick: take what is new -----------------------------------------------------------

    def take(self, landed: Frontier, bound: Frontier, state: Mapping[str, Any]) -> Taken:
        """Read the records after ``landed`` of the shards :func:`readable_shards` allows, within the tick's
        budget; ``state`` is what the last landing recorded (``{"complete": {shard: upper}, "read_to":
        {shard: ms}, "behind": {shard: [MillisBehindLatest, ms]}}``: the shard's lag at its last read and when
        it was read).  Refuses (:class:`SourceError`, nothing taken) when records may have expired."""
        complete = dict(state.get("complete", {}))
        read_to = dict(state.get("read_to", {}))
        behind = {k: v for k, v in dict(state.get("behind", {})).items() if k not in complete}
        shards = self.shards()
        readable = readable_shards(shards, bound, complete)
        retention_ms = int(self.summary()["RetentionPeriodHours"]) * 3_600_000
        listed = {s.id for s in shards}
        gone = [p for p, u in landed if p not in listed and p not in complete]
        problems = [f"shard {p}: expired before it was read to its end (last landed sequence number {u - 1})"
                    for p, u in sorted(landed) if p in gone]
        now = now_ms()
        late = [s for s in readable if expiry_problems([s], landed, read_to, now, retention_ms)]
        problems += expiry_problems([s for s in late if not self._holds(s, landed[s] - 1)], landed, read_to, now,
                                    retention_ms)
        if problems:
            raise SourceError(f"{self!r}: records may have expired before they were landed: " + "; ".join(problems)
                              + " (Kinesis trims records older than the stream's retention); nothing landed")
        endings = {s.id: s.ending for s in shards}
        records: list[tuple[str, int, dict[str, Any]]] = []
        uppers = dict(landed.as_dict())
        deadline = time.monotonic() + self.max_seconds
        for shard in readable:
            if len(records) >= self.max_records or time.monotonic() >= deadline:
                break
            last = uppers.get(shard, 0) - 1
            iterator = self._iterator(shard, last)
            while iterator is not None:
                asked = now_ms()
                page = self._call("get_records", ShardIterator=iterator,
                                  Limit=min(GET_RECORDS_LIMIT, self.max_records - len(records)))
                for record in page["Records"]:
                    seq = int(record["SequenceNumber"])
                    if seq <= last:
                        raise SourceError(f"{self!r}: shard {shard} returned sequence number {seq} after {last}")
                    records.append((shard, seq, self._record(record)))
                    last = seq
                if last >= 0:
                    uppers[shard] = last + 1
                behind[shard] = [int(page.get("MillisBehindLatest", 0)), asked]
                iterator = page.get("NextShardIterator")
                if iterator is None:  # a closed shard read to its end: complete
                    uppers[shard] = max(last, endings.get(shard) or 0) + 1
                    complete[shard] = uppers[shard]
                    behind.pop(shard, None)
                elif not page["Records"] and page.get("MillisBehindLatest", 0) == 0:
                    read_to[shard] = asked  # caught up: every record that arrived before `asked` is read
                    break
                if len(records) >= self.max_records or time.monotonic() >= deadline:
                    break
        return Taken(records, Frontier.of(uppers), {"complete": complete, "read_to": read_to, "behind": behind})

    # --- the Source protocol ------------------------------------------------------------------

    def upper(self) -> Frontier:
        """Nothing beyond what ticks landed: Kinesis has no high watermark (the pipeline binds the landed
        frontier).  Asks for the stream's summary, so an unreachable or deleted stream fails here."""
        self._summary = None
        self.summary()
        return Frontier()

    def read(self, partition: Partition, start: int, end: int) -> Iterator[tuple[dict[str, Any], int, int]]:
        """The records of shard ``partition`` with ``start <= sequence number < end`` still held upstream (the
        pipeline reads bound ranges from the landing table instead)."""
        check_range(start, end)
        if start >= end:
            return iter(())
        return self._read(partition, start, end)

    def _read(self, shard: str, start: int, end: int) -> Iterator[tuple[dict[str, Any], int, int]]:
        iterator = self._iterator(shard, -1)
        while iterator is not None:
            page = self._call("get_records", ShardIterator=iterator, Limit=GET_RECORDS_LIMIT)
            for record in page["Records"]:
                seq = int(record["SequenceNumber"])
                if seq >= end:
                    return
                if seq >= start:
                    yield self._record(record), seq, 1
            if not page["Records"] and page.get("MillisBehindLatest", 0) == 0:
                return
            iterator = page.get("NextShardIterator")

    def identity(self) -> dict[str, str]:
        """The stream's ARN and creation time: a stream deleted and recreated under its name has another."""
        summary = self.summary()
        return {"stream_arn": summary["StreamARN"], "created": summary["StreamCreationTimestamp"].isoformat()}

    def starting_frontier(self) -> Frontier:
        """Every record the stream holds at the first tick (``TRIM_HORIZON``)."""
        return Frontier()

    def released(self) -> Frontier:
        """Nothing the pipeline needs: bound records are landed (expiry is refused when a tick takes)."""
        return Frontier()

    def _committed_path(self) -> tuple[Any, str]:
        from fsspec.core import url_to_fs

        if not self.state_url:
            raise SourceError(f"{self!r}: no state_url to keep its resumption frontier in")
        fs, root = url_to_fs(self.state_url, **self.storage_options)
        return fs, posixpath.join(root.rstrip("/"), COMMITTED_NAME)

    def committed(self) -> Frontier:
        """The resumption frontier last committed (empty before any, or without a state folder)."""
        if not self.state_url:
            return Frontier()
        return read_committed(*self._committed_path())

    def commit(self, frontier: Frontier) -> None:
        """Record the offset resumption frontier in the state folder, joined with the last (never backwards)."""
        fs, path = self._committed_path()
        merged = read_committed(fs, path).join(frontier)
        write_committed(fs, path, merged.as_dict(), stream=self.stream)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "KinesisSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
