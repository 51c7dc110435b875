"""Kafka as a reclock :class:`~reclock.sources.base.Source` (confluent-kafka / librdkafka).

Gauge: ``(partition: int32, offset)``.  ``upper()`` is, per partition, the offset ListOffsets
returns for "latest" under the consumer's ``isolation.level``: the high watermark under
``read_uncommitted``, the *last stable offset* (first offset of the oldest open transaction)
under ``read_committed``.  Every offset below it is final: either a record that will never
change, a transaction control marker, or (read_committed) a record of an aborted transaction,
so reads of ranges below the upper are exact and repeatable.

Reads assign the partition at an explicit offset (no group subscription, no rebalances) and
stop as soon as the consumer position reaches ``end``; offsets that carry no visible record
(control markers, aborted records) are simply absent from the output.

Commits write the consumer group's committed offsets, which in Kafka mean "next offset to
read" - the same meaning as a frontier's upper.

Spark reads ranges of a Kafka source through Spark's own Kafka source (:mod:`reclock.spark.kafka`); this module
checks them against the log start offsets and the upper first (:meth:`KafkaSource.check_readable_rows`) and
says which encodings Spark decodes exactly (:data:`SPARK_CHARSETS`).  It imports no pyspark.
"""
from __future__ import annotations

import codecs
import logging
import time
from typing import Any, Iterable, Iterator, Mapping, Sequence

from ..engine import Frontier, Partition
from .base import SourceError, arrow, check_range

log = logging.getLogger(__name__)
#: The logger librdkafka's own logs go to (connection retries and the like).
CLIENT_LOGGER = "reclock.librdkafka"

_ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
_OFFSET_INVALID = -1001
_STARTING = ("earliest", "latest")
#: Errors of a partition whose leader is being elected (KafkaError.NOT_LEADER_FOR_PARTITION, LEADER_NOT_AVAILABLE):
#: asked again. The client does not mark them retriable on watermark requests.
_LEADER_MOVING = (6, 5)


class KafkaSource:
    partition_type = arrow(lambda pa: pa.int32())
    data_schema = arrow(lambda pa: pa.schema([
        pa.field("key", pa.string()),
        pa.field("value", pa.string()),
        pa.field("timestamp_ms", pa.int64()),
    ]))

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        group_id: str,
        isolation_level: str = "read_committed",
        encoding: str = "utf-8",
        timeout_s: float = 10.0,
        config: Mapping[str, Any] | None = None,
        starting_offsets: str | int = "earliest",
    ) -> None:
        """``timeout_s`` bounds every broker call (and a read that stops making progress);
        ``config`` adds librdkafka properties (security, client.id, ...); ``starting_offsets`` is where
        the source's history begins (:meth:`starting_frontier`): ``earliest``, ``latest`` or a timestamp (ms)."""
        if not bootstrap_servers or not isinstance(bootstrap_servers, str):
            raise SourceError(f"bootstrap_servers must be a non-empty string, got {bootstrap_servers!r}")
        if not topic or not isinstance(topic, str):
            raise SourceError(f"topic must be a non-empty string, got {topic!r}")
        if not group_id or not isinstance(group_id, str):
            raise SourceError(f"group_id must be a non-empty string, got {group_id!r}")
        if isolation_level not in _ISOLATION_LEVELS:
            raise SourceError(f"isolation_level must be one of {_ISOLATION_LEVELS}, got {isolation_level!r}")
        try:
            "".encode(encoding)
        except LookupError as e:
            raise SourceError(f"unknown encoding {encoding!r}") from e
        if timeout_s <= 0:
            raise SourceError(f"timeout_s must be positive, got {timeout_s!r}")
        if starting_offsets not in _STARTING and (isinstance(starting_offsets, bool)
                                                  or not isinstance(starting_offsets, int) or starting_offsets < 0):
            raise SourceError(f"topic {topic!r}: starting_offsets must be one of {_STARTING} or a timestamp in ms "
                              f"since the epoch, got {starting_offsets!r}")
        self.starting_offsets = starting_offsets
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.group_id = group_id
        self.isolation_level = isolation_level
        self.encoding = encoding
        self.timeout_s = float(timeout_s)
        self.config = dict(config or {})
        self._consumer = None  # metadata, a partition's watermarks, commits
        self._admin = None  # every partition's offsets in one request
        self._reader = None  # assign/seek reads
        self._reading = False
        # Fail fast on bad librdkafka properties (no connection is made yet).
        self._client()

    def __repr__(self) -> str:
        return (f"KafkaSource({self.bootstrap_servers!r}, topic={self.topic!r}, group_id={self.group_id!r}, "
                f"isolation_level={self.isolation_level!r})")

    # --- clients --------------------------------------------------------------------------

    def _new_consumer(self, **extra: Any):
        from confluent_kafka import Consumer, KafkaException

        ms = int(self.timeout_s * 1000)
        conf = {
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": self.group_id,
            "isolation.level": self.isolation_level,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "socket.timeout.ms": min(max(ms, 10), 300_000),
            "logger": logging.getLogger(CLIENT_LOGGER),
            **self.config,
            **extra,
        }
        try:
            return Consumer(conf)
        except (KafkaException, ValueError, TypeError) as e:
            raise SourceError(f"bad Kafka configuration for topic {self.topic!r}: {e}") from e

    def _client(self):
        if self._consumer is None:
            self._consumer = self._new_consumer()
        return self._consumer

    def _admin_client(self):
        if self._admin is None:
            from confluent_kafka import KafkaException
            from confluent_kafka.admin import AdminClient

            try:
                self._admin = AdminClient({"bootstrap.servers": self.bootstrap_servers,
                                           "logger": logging.getLogger(CLIENT_LOGGER), **self.config})
            except (KafkaException, ValueError, TypeError) as e:
                raise SourceError(f"bad Kafka configuration for topic {self.topic!r}: {e}") from e
        return self._admin

    def _fail(self, what: str, error: Exception) -> SourceError:
        return SourceError(f"Kafka {self.bootstrap_servers} topic {self.topic!r}: {what}: {error}")

    # --- gauge ----------------------------------------------------------------------------

    def partitions(self) -> list[int]:
        """The topic's partitions, freshly from the broker (partitions added later show up)."""
        from confluent_kafka import KafkaException

        try:
            metadata = self._admin_client().list_topics(self.topic, timeout=self.timeout_s)  # the client that asks
            # for offsets (:meth:`_offsets`): it learns of partitions added since from this answer
        except KafkaException as e:
            raise self._fail("metadata request failed (broker unreachable?)", e) from e
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None:
            raise self._fail("topic not available", topic.error if topic else "missing from metadata")
        return sorted(topic.partitions)

    def _watermarks(self, consumer, partition: int) -> tuple[int, int]:
        """``(log start offset, upper)`` of ``partition``; a retriable error (a leader moving, as after a
        topic's creation or a broker restart) is asked again until ``timeout_s`` has passed."""
        from confluent_kafka import KafkaException, TopicPartition

        deadline, pause = time.monotonic() + self.timeout_s, 0.05
        while True:
            try:
                return consumer.get_watermark_offsets(TopicPartition(self.topic, partition), timeout=self.timeout_s)
            except KafkaException as e:
                code = e.args[0].code() if e.args and hasattr(e.args[0], "code") else None
                if code not in _LEADER_MOVING or time.monotonic() + pause > deadline:
                    raise self._fail(f"watermark request for partition {partition} failed", e) from e
                time.sleep(pause)
                pause = min(pause * 2, 1.0)

    def _offsets(self, partitions: Iterable[int], earliest: bool) -> dict[int, int]:
        """Per partition of ``partitions``: its log start offset (``earliest``) or its upper (as :meth:`upper`), all
        asked at once (Kafka's ListOffsets, a request per broker; a watermark request per partition cost a tick of 64
        partitions 32 ms, 0.7 ms so).  Partitions whose leader is moving are asked again until ``timeout_s``."""
        from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        spec = OffsetSpec.earliest() if earliest else OffsetSpec.latest()
        level = (IsolationLevel.READ_COMMITTED if self.isolation_level == "read_committed"
                 else IsolationLevel.READ_UNCOMMITTED)
        wanted, found = sorted(set(partitions)), {}
        deadline, pause = time.monotonic() + self.timeout_s, 0.05
        while wanted:
            futures = self._admin_client().list_offsets({TopicPartition(self.topic, p): spec for p in wanted},
                                                        isolation_level=level, request_timeout=self.timeout_s)
            wanted = []
            for tp, future in futures.items():
                try:
                    found[tp.partition] = future.result().offset
                except KafkaException as e:
                    code = e.args[0].code() if e.args and hasattr(e.args[0], "code") else None
                    if code not in _LEADER_MOVING or time.monotonic() + pause > deadline:
                        raise self._fail(f"watermark request for partition {tp.partition} failed", e) from e
                    wanted.append(tp.partition)
            if wanted:
                time.sleep(pause)
                pause = min(pause * 2, 1.0)
        return found

    def upper(self) -> Frontier:
        """Per partition: high watermark (read_uncommitted) or last stable offset (read_committed)."""
        return Frontier.of(self._offsets(self.partitions(), earliest=False))

    def low_watermarks(self) -> Frontier:
        """Per partition: the log start offset (offsets below it were released upstream)."""
        return Frontier.of(self._offsets(self.partitions(), earliest=True))

    def released(self) -> Frontier:
        """What Kafka no longer holds: the log start offsets (a group commit releases nothing;
        retention and DeleteRecords do). Backfills may read anything above it again."""
        return self.low_watermarks()

    def starting_frontier(self) -> Frontier:
        """Where the source's history begins (read at its first tick, then recorded with remap), as Spark's
        Kafka source names it: ``earliest`` = the log start offsets now, ``latest`` = the upper now, a
        timestamp = per partition the first offset whose record timestamp is at or after it (the upper
        when there is none).  Never a consumer group's commits: the group may belong to another application."""
        if self.starting_offsets == "earliest":
            return self.low_watermarks()
        upper = self.upper()
        if self.starting_offsets == "latest":
            return upper
        from confluent_kafka import KafkaException, TopicPartition

        wanted = [TopicPartition(self.topic, p, self.starting_offsets) for p in self.partitions()]
        try:
            found = self._client().offsets_for_times(wanted, timeout=self.timeout_s)
        except KafkaException as e:
            raise self._fail(f"offsets for timestamp {self.starting_offsets} failed", e) from e
        return Frontier.of({tp.partition: upper[tp.partition] if tp.offset < 0 else min(tp.offset, upper[tp.partition])
                            for tp in found})

    def identity(self) -> dict[str, str]:
        """What makes this topic this topic: its name and topic ID (KIP-516; a topic deleted and recreated
        under the same name gets a new ID)."""
        from confluent_kafka import KafkaException, TopicCollection
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers,
                             "logger": logging.getLogger(CLIENT_LOGGER), **self.config})
        try:
            description = admin.describe_topics(TopicCollection([self.topic]),
                                                request_timeout=self.timeout_s)[self.topic].result()
        except KafkaException as e:
            raise self._fail("describe topic failed", e) from e
        return {"kafka.topic": self.topic, "kafka.topic_id": str(description.topic_id)}

    # --- reads ----------------------------------------------------------------------------

    def read(self, partition: Partition, start: int, end: int) -> Iterator[tuple[dict[str, Any], int, int]]:
        """Yield ``(data, offset, +1)`` for every visible record with ``start <= offset < end``."""
        partition, start, end = check_partition_range(partition, start, end)
        return self._read(partition, start, end)

    def _read(self, partition: int, start: int, end: int) -> Iterator[tuple[dict[str, Any], int, int]]:
        if start >= end:
            return
        # One reused reader; a read started while another is still being iterated gets its own.
        own = self._reading
        consumer = self._new_consumer(**{"enable.partition.eof": True}) if own else self._reader_consumer()
        if not own:
            self._reading = True
        try:
            yield from self._read_with(consumer, partition, start, end)
        finally:
            if own:
                consumer.close()
            else:
                self._reading = False
                try:
                    consumer.unassign()
                except Exception:  # pragma: no cover - best effort
                    self._reader = None

    def _check_readable(self, partition: int, start: int, end: int, low: int, high: int) -> None:
        """Refuse ``[start, end)`` unless it lies within ``[low, high)``: the log start offset (below
        it, records were released) and the upper (above it, records are not final yet)."""
        where = f"topic {self.topic!r} partition {partition}"
        if low > start:
            raise SourceError(f"{where}: offsets [{start}, {low}) were released upstream "
                              f"(log start offset {low} > requested start {start})")
        if high < end:
            raise SourceError(f"{where}: range [{start}, {end}) reaches beyond the partition's upper {high} "
                              f"({self.isolation_level})")

    def _reader_consumer(self):
        if self._reader is None:
            self._reader = self._new_consumer(**{"enable.partition.eof": True})
        return self._reader

    def _read_with(self, consumer, partition: int, start: int, end: int):
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        where = f"topic {self.topic!r} partition {partition}"
        self._check_readable(partition, start, end, *self._watermarks(consumer, partition))
        tp = TopicPartition(self.topic, partition, start)
        try:
            consumer.assign([tp])
        except KafkaException as e:
            raise self._fail(f"cannot assign {where}", e) from e

        position = start
        progress_deadline = time.monotonic() + self.timeout_s
        while position < end:
            msg = consumer.poll(min(0.5, self.timeout_s))
            if msg is None:
                position = max(position, self._position(consumer, partition))
                if position >= end:
                    break
                if time.monotonic() > progress_deadline:
                    raise SourceError(f"{where}: no progress reading [{start}, {end}) for {self.timeout_s}s "
                                      f"(stuck at offset {position})")
                continue
            err = msg.error()
            if err is not None:
                code = err.code()
                if code == KafkaError._PARTITION_EOF:
                    if msg.partition() != partition:
                        continue
                    position = max(position, msg.offset())
                    if position >= end:
                        break
                    _, high = self._watermarks(consumer, partition)
                    if high < end:  # cannot happen for ranges below an upper the broker gave us
                        raise SourceError(f"{where}: partition ends at {high} before the range end {end}")
                    continue
                if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                    low, _ = self._watermarks(consumer, partition)
                    raise SourceError(f"{where}: offset {position} is no longer available upstream "
                                      f"(log start offset now {low}): {err.str()}")
                if err.fatal() or not err.retriable() and code not in (KafkaError._TRANSPORT,
                                                                      KafkaError._ALL_BROKERS_DOWN):
                    raise SourceError(f"{where}: read failed at offset {position}: {err.str()}")
                log.warning("%s: transient error at offset %s: %s", where, position, err.str())
                if time.monotonic() > progress_deadline:
                    raise SourceError(f"{where}: read failed at offset {position}: {err.str()}")
                continue
            if msg.partition() != partition:  # pragma: no cover - only one partition is assigned
                continue
            offset = msg.offset()
            if offset >= end:
                break
            position = offset + 1
            progress_deadline = time.monotonic() + self.timeout_s
            if offset < start:  # pragma: no cover - the broker may return a batch from before start
                continue
            yield self._decode(msg, partition, offset), offset, 1

    def _position(self, consumer, partition: int) -> int:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            (tp,) = consumer.position([TopicPartition(self.topic, partition)])
        except KafkaException:
            return -1
        return tp.offset if tp.offset >= 0 else -1

    def _decode(self, msg, partition: int, offset: int) -> dict[str, Any]:
        try:
            key = msg.key()
            value = msg.value()
            key = None if key is None else key.decode(self.encoding)
            value = None if value is None else value.decode(self.encoding)
        except UnicodeDecodeError as e:
            raise SourceError(f"topic {self.topic!r} partition {partition} offset {offset}: record is not "
                              f"valid {self.encoding}: {e}") from e
        ts_type, ts = msg.timestamp()
        from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

        return {"key": key, "value": value, "timestamp_ms": None if ts_type == TIMESTAMP_NOT_AVAILABLE else ts}

    @staticmethod
    def dead_letter_problem(options: Mapping[str, Any]) -> str | None:
        """Why a source built from ``options`` cannot dead-letter records (``on_bad_record: dead_letter``), or
        None: only the Spark read (:func:`reclock.spark.kafka.spark_read`) goes on past a record it cannot decode, and it reads
        the encodings that Spark decodes exactly (:data:`SPARK_CHARSETS`)."""
        encoding = options.get("encoding", "utf-8")
        try:
            if codecs.lookup(encoding).name in SPARK_CHARSETS:
                return None
        except (LookupError, TypeError):
            return None  # the source refuses the encoding itself
        return (f"encoding {encoding!r} is read record by record in Python, which stops at a record it cannot "
                f"decode; dead letters need utf-8, latin-1 or ascii")

    def check_readable_rows(self, rows: Sequence[tuple[int, int, int, int]]) -> None:
        """Each ``(partition, start, end, into_time)`` row's partition exists and its offsets lie between
        the log start offset and the upper (asked for every partition at once)."""
        known = self.partitions()
        for partition, start, end, into_time in rows:
            if partition not in known:
                raise SourceError(f"topic {self.topic!r} has no partition {partition} (partitions {known}); "
                                  f"cannot read offsets [{start}, {end}) of IntoTime {into_time}")
        needed = {row[0] for row in rows}
        low, high = self._offsets(needed, earliest=True), self._offsets(needed, earliest=False)
        for partition, start, end, _ in rows:
            self._check_readable(partition, start, end, low[partition], high[partition])

    # --- upstream commit ------------------------------------------------------------------

    def commit(self, frontier: Frontier) -> None:
        """Commit the group's offsets to the frontier's uppers (only the partitions it lists)."""
        from confluent_kafka import KafkaException, TopicPartition

        offsets = []
        for p, upper in frontier:
            p, _, _ = check_partition_range(p, upper, upper)
            offsets.append(TopicPartition(self.topic, p, upper))
        if not offsets:
            return
        try:
            results = self._client().commit(offsets=offsets, asynchronous=False)
        except KafkaException as e:
            raise self._fail(f"commit of group {self.group_id!r} failed", e) from e
        bad = [f"{tp.partition}: {tp.error}" for tp in results or () if tp.error is not None]
        if bad:
            raise self._fail(f"commit of group {self.group_id!r} failed for partitions", "; ".join(bad))

    def committed(self) -> Frontier:
        """The group's committed offsets as a frontier (partitions never committed are at 0)."""
        from confluent_kafka import KafkaException, TopicPartition

        tps = [TopicPartition(self.topic, p) for p in self.partitions()]
        try:
            results = self._client().committed(tps, timeout=self.timeout_s)
        except KafkaException as e:
            raise self._fail(f"fetching committed offsets of group {self.group_id!r} failed", e) from e
        uppers = {}
        for tp in results:
            if tp.error is not None:
                raise self._fail(f"committed offset of partition {tp.partition}", tp.error)
            if tp.offset >= 0:
                uppers[tp.partition] = tp.offset
        return Frontier.of(uppers)

    def close(self) -> None:
        self._admin = None  # an AdminClient has no close: dropping it destroys it
        for attr in ("_reader", "_consumer"):
            consumer = getattr(self, attr)
            setattr(self, attr, None)
            if consumer is not None:
                try:
                    consumer.close()
                except Exception:  # pragma: no cover - closing twice / broker gone
                    pass

    def __enter__(self) -> "KafkaSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # Built lazily from plain settings, so a KafkaSource pickles (no live clients travel).
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_consumer=None, _reader=None, _admin=None, _reading=False)
        return state


def check_partition_range(partition: Partition, start: int, end: int) -> tuple[int, int, int]:
    """``(partition, start, end)`` when the partition is an int32 >= 0 and ``0 <= start <= end``, else a
    :class:`SourceError`."""
    if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < 2**31:
        raise SourceError(f"Kafka partition must be an int32 >= 0, got {partition!r}")
    check_range(start, end, "offset")
    return partition, start, end


#: Python codec name -> the Java charset Spark decodes it with, byte for byte the same.  Others
#: (e.g. "utf-16", whose byte order without a BOM differs between Python and Java) have no Spark
#: read: :func:`reclock.spark.kafka.spark_read` returns None for them.
SPARK_CHARSETS = {"utf-8": "UTF-8", "iso8859-1": "ISO-8859-1", "ascii": "US-ASCII"}
