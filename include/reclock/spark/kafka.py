"""Kafka ranges read by Spark's own Kafka source (spark-sql-kafka, the Java client) instead of record by record.

Law (:mod:`reclock.spark.rows`): :func:`spark_read` yields the rows of reading each range with
:meth:`reclock.sources.kafka.KafkaSource.read` and stamping it with the range's IntoTime.  It reads each
partition's ``[min start, max end)`` of the ranges in one batch read and stamps IntoTime by a broadcast join with
the ranges; records there that no range covers are dropped.  A batch whose ranges cover every span at one IntoTime
(:func:`one_into_time`) is stamped with it, without the join.  The driver checks the ranges against the log
start offsets and the upper first (:meth:`~reclock.sources.kafka.KafkaSource.check_readable_rows`); offsets
missing below the log start after that check fail the task (``failOnDataLoss``), never return fewer records.
"""
from __future__ import annotations

import codecs
import hashlib
import hmac
import json
import logging
from typing import Any, Iterable, Mapping, Sequence

from ..sources.base import SourceError
from ..sources.kafka import SPARK_CHARSETS, KafkaSource, check_partition_range
from .rows import BAD_RECORD_COLUMNS, normalize_ranges, output_arrow_schema, source_error
from .session import spark_schema

log = logging.getLogger(__name__)


def spark_read(source: KafkaSource, spark, ranges: Iterable[Sequence[Any]], on_bad_record: str = "fail"):
    """Spark DataFrame of every visible record of ``ranges`` (``[into_time, partition, start, end]``) of Kafka
    ``source``, read by Spark's Kafka source; None when the source's ``encoding`` has no exact Spark decoding
    (the caller then reads record by record with ``source.read``).

    The rows are those of reading each range with ``source.read`` and stamping it with the range's
    IntoTime: ``key``, ``value``, ``timestamp_ms`` (null when Kafka has none), ``partition`` (int),
    ``offset`` (long), ``into_time``, ``diff`` (always 1).  Spark reads each partition's
    ``[min start, max end)`` once; records there that no range covers are dropped.  Small partitions are
    read together, several by one task (:func:`read_tasks`).  Ranges must not
    overlap and must lie between the log start offset and the upper (checked here, before Spark
    runs).  Nothing to read: an empty DataFrame, without contacting Kafka.  Spark declares
    ``offset`` nullable (its Kafka source does so for every column); it is never null.

    ``on_bad_record``: ``fail`` (a key or value not valid in the source's ``encoding`` fails the Spark job,
    naming topic, partition and offset), or ``dead_letter``: every record is kept, with the
    columns :data:`reclock.spark.rows.BAD_RECORD_COLUMNS` added: null for a record that decodes;
    for one that does not, why (one line) and its raw key and value bytes, its data columns null.
    """
    from pyspark.sql import functions as F

    charset = SPARK_CHARSETS.get(codecs.lookup(source.encoding).name)
    if charset is None:
        return None
    rows = spark_range_rows(source.topic, normalize_ranges(ranges))
    dead_letter = on_bad_record == "dead_letter"
    if not rows:
        empty = spark.createDataFrame([], spark_schema(output_arrow_schema(source)))
        if dead_letter:
            error, raw_key, raw_value = BAD_RECORD_COLUMNS
            empty = empty.select("*", F.lit(None).cast("string").alias(error),
                                 F.lit(None).cast("binary").alias(raw_key), F.lit(None).cast("binary").alias(raw_value))
        return empty
    source.check_readable_rows(rows)
    spans = partition_spans(rows)
    records = spark.read.format("kafka").options(**spark_options(source, spans)).load()
    on = ((F.col("partition") == F.col("_r_partition")) & (F.col("offset") >= F.col("_r_start"))
          & (F.col("offset") < F.col("_r_end")))
    (key, key_valid), (value, value_valid) = (_spark_text(c, charset) for c in ("key", "value"))
    if dead_letter:
        undecodable = F.concat_ws(", ", F.when(~key_valid, F.lit("key")), F.when(~value_valid, F.lit("value")))
        good = key_valid & value_valid
        error, raw_key, raw_value = BAD_RECORD_COLUMNS
        data = [F.when(good, key).alias("key"), F.when(good, value).alias("value")]
        bad = [F.when(~good, _bad_record_message(source, undecodable)).alias(error),
               F.when(~good, F.col("key")).alias(raw_key), F.when(~good, F.col("value")).alias(raw_value)]
    else:
        data = [F.when(key_valid, key).otherwise(_bad_record_error(source, "key")).alias("key"),
                F.when(value_valid, value).otherwise(_bad_record_error(source, "value")).alias("value")]
        bad = []
    tasks, natural = read_tasks(spans)
    if tasks < natural:  # many small partitions: a few tasks read them in turn, each writing one staged file
        records = records.coalesce(tasks)
    if (into_time := one_into_time(rows)) is not None:  # every record read is covered, all at one IntoTime
        stamped, into = records, F.lit(into_time).cast("long")
    else:
        stamped, into = records.join(F.broadcast(spark.createDataFrame(rows, _RANGE_ROWS_SCHEMA)), on), F.col(
            "_r_into_time")
    return stamped.select(
        *data,
        # timestampType -1: the record has no timestamp (read() gives None too).
        F.when(F.col("timestampType") >= 0, F.unix_millis("timestamp")).alias("timestamp_ms"),
        F.col("partition"),
        F.col("offset"),
        into.alias("into_time"),
        F.lit(1).cast("long").alias("diff"),
        *bad,
    )


def spark_options(source: KafkaSource, spans: Mapping[int, tuple[int, int]]) -> dict[str, str]:
    """Options of Spark's batch Kafka source reading offsets ``[start, end)`` of each partition in ``spans``.

    Spark's reads use a consumer group of their own (:func:`reader_group`) and never commit: the source's
    ``group_id`` is not passed, its committed offsets are untouched.  ``timeout_s`` bounds each poll
    (``kafkaConsumer.pollTimeoutMs``: a poll returning nothing fails the task), and a partition's
    span is cut into tasks of at most :data:`SPARK_MAX_TASK_OFFSETS` offsets.  ``config`` is translated by
    :func:`spark_client_options`.

    The reads' consumer group is :func:`reader_group`'s: one per set of client options, never committed to.

    ``kafka.fetch.max.wait.ms`` is :data:`SPARK_FETCH_MAX_WAIT_MS` unless ``config`` sets ``fetch.wait.max.ms``:
    a task's span usually ends at the log end (a tick binds the high watermark), where the Java consumer's
    fetch waits that long for records that are not coming, once per partition (Kafka's default, 500 ms, cost every
    task about half a second; 10 ms still cost a read of 1M records over 64 partitions 0.2 s: ``bench/README.md``).
    """
    partitions = sorted(spans)
    client = {
        "kafka.fetch.max.wait.ms": str(SPARK_FETCH_MAX_WAIT_MS),
        **spark_client_options(source.config),
        "kafka.bootstrap.servers": source.bootstrap_servers,
        "kafka.isolation.level": source.isolation_level,
    }
    return {
        **client,
        **reader_group(client, read_key() if _CREDENTIALS in client else None),
        "assign": json.dumps({source.topic: partitions}),
        "startingOffsets": json.dumps({source.topic: {str(p): spans[p][0] for p in partitions}}),
        "endingOffsets": json.dumps({source.topic: {str(p): spans[p][1] for p in partitions}}),
        # Spark skips offsets that carry no visible record (transaction markers always, aborted
        # records under read_committed) whatever this flag says, as long as they are at or above
        # the log start offset (KafkaDataConsumer.fetchRecord): transactional topics do not need
        # "false".  The flag only decides what happens to offsets *missing* below the log start
        # (retention or DeleteRecords after the driver checked the ranges, a recreated topic):
        # "true" fails the task, like read(), instead of silently returning fewer records.
        "failOnDataLoss": "true",
        "kafkaConsumer.pollTimeoutMs": str(int(source.timeout_s * 1000)),
        "maxRecordsPerPartition": str(SPARK_MAX_TASK_OFFSETS),
        "includeHeaders": "false",
    }


def reader_group(client: Mapping[str, str], key: bytes | None = None) -> dict[str, str]:
    """``{"kafka.group.id": group}`` for Spark's reads with Kafka options ``client``: ``reclock-read-`` and a digest
    of the options, so a read's consumers serve the next read with the same options.

    Spark's executors pool their consumers by (group, partition) (``spark.kafka.consumer.cache.*``), and its
    default group is new for every read: a tick's consumers were never used again, and the next tick made a
    consumer, a connection and a fetch session for each partition (1M records over 64 partitions staged in
    2.71 s that way, 2.25 s by the consumers a read before left; over 8 partitions 1.79 s and 1.74 s: medians
    of 4, Spark Connect on 2 cores, 2026-11-30).  Spark refuses one (group, partition) with two sets of options
    in one JVM, and the digest differs with any option.  Consumers of the group only assign and seek: it never
    joins, commits or holds offsets.

    Options carrying credentials (``sasl.jaas.config``): the group is written in the Spark server's log, where a
    plain digest of a password could be tested against guesses, so their digest is keyed (HMAC-SHA256) with
    ``key`` (:func:`read_key`); without one, ``{}``: Spark's group per read, whose idle consumers and kept options
    pile up in a long-lived server (``docs/sources/kafka.md``).
    """
    payload = json.dumps(sorted(client.items())).encode()
    if _CREDENTIALS in client:
        if key is None:
            return {}
        return {"kafka.group.id": f"reclock-read-{hmac.new(key, payload, hashlib.sha256).hexdigest()[:24]}"}
    return {"kafka.group.id": f"reclock-read-{hashlib.sha256(payload).hexdigest()[:24]}"}


def read_key() -> bytes | None:
    """The key of :func:`reader_group`'s digests for options carrying credentials: the file :data:`READ_KEY_FILE`
    under ``$XDG_STATE_HOME`` (default ``~/.local/state``), made on first use (32 random bytes as hex, readable by
    its owner only; made aside and linked into place, so a process racing another reads a whole key); None when
    it can be neither read nor made: the reads then take Spark's group per read.  Each host (each user's state
    directory) keeps its own key, so the reads of a source from one host share a group."""
    import os
    import secrets
    from pathlib import Path

    path = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / READ_KEY_FILE
    try:
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            aside = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
            fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                with os.fdopen(fd, "w") as out:
                    out.write(secrets.token_hex(32))
                os.link(aside, path)
            except FileExistsError:
                pass  # another process made it first: its key is the one
            finally:
                aside.unlink(missing_ok=True)
        return path.read_text().strip().encode() or None
    except OSError as e:
        log.warning("no key for Spark's consumer groups of sources with credentials (%s): their reads take a "
                    "group each", e)
        return None


#: The option that carries a source's credentials to Spark's Kafka source (:func:`spark_client_options`).
_CREDENTIALS = "kafka.sasl.jaas.config"
#: :func:`read_key`'s file, under the state directory.
READ_KEY_FILE = "reclock/read-key"


def _spark_text(name: str, charset: str):
    """``(text, valid)``: column ``name`` (binary) decoded with ``charset``, and whether its bytes are valid
    in it (null bytes are: null text)."""
    from pyspark.sql import functions as F

    raw = F.col(name)
    if charset == "ISO-8859-1":  # every byte string is valid
        return F.decode(raw, charset), F.lit(True)
    text = raw.cast("string")  # UTF-8, of which ASCII is a subset
    valid = F.is_valid_utf8(text)
    if charset == "US-ASCII":
        valid = valid & F.hex(raw).rlike("^([0-7][0-9A-F])*$")
    return text, raw.isNull() | valid


def _bad_record_message(source: KafkaSource, undecodable):
    """One line naming topic, partition and offset of a record whose ``undecodable`` columns (a string
    column: ``key``, ``value`` or both) are not valid :attr:`encoding`."""
    from pyspark.sql import functions as F

    return F.concat(F.lit(f"topic {source.topic!r} partition "), F.col("partition").cast("string"),
                    F.lit(" offset "), F.col("offset").cast("string"),
                    F.lit(f": record is not valid {source.encoding} (undecodable "), undecodable, F.lit(")"))


def _bad_record_error(source: KafkaSource, name: str):
    """A string column failing the Spark job with a :class:`SourceError` message naming topic, partition,
    offset and the undecodable column ``name``."""
    from pyspark.sql import functions as F

    return source_error(_bad_record_message(source, F.lit(name))).cast("string")


_RANGE_ROWS_SCHEMA = ("_r_partition int not null, _r_start long not null, _r_end long not null, "
                      "_r_into_time long not null")


def spark_range_rows(topic: str, ranges: Iterable[Sequence[Any]]) -> list[tuple[int, int, int, int]]:
    """``(partition, start, end, into_time)`` of each non-empty range ``(into_time, partition, start, end)``,
    sorted; :class:`SourceError` for a partition that is not an int32 >= 0 or for overlapping ranges
    (an offset gets at most one IntoTime)."""
    rows = []
    for into_time, partition, start, end in ranges:
        partition, start, end = check_partition_range(partition, start, end)
        if start < end:
            rows.append((partition, start, end, into_time))
    rows.sort()
    for (p, s, e, t), (q, s2, e2, t2) in zip(rows, rows[1:]):
        if p == q and s2 < e:
            raise SourceError(f"topic {topic!r} partition {p}: ranges [{s}, {e}) (IntoTime {t}) and "
                              f"[{s2}, {e2}) (IntoTime {t2}) overlap")
    return rows


def one_into_time(rows: Sequence[tuple[int, int, int, int]]) -> int | None:
    """The IntoTime of every offset in each partition's span (:func:`partition_spans`) of the sorted, non-empty
    ``(partition, start, end, into_time)`` rows, when they all share one and a partition's rows leave no gap
    between them (a batch of one binding, the usual one); None otherwise.  Reading the spans then stamps that
    IntoTime on every record, with no join against the ranges."""
    if not rows or len({r[3] for r in rows}) != 1:
        return None
    for (p, _, end, _), (q, start, _, _) in zip(rows, rows[1:]):
        if p == q and start != end:
            return None
    return rows[0][3]


def partition_spans(rows: Iterable[tuple[int, int, int, int]]) -> dict[int, tuple[int, int]]:
    """Per partition, ``(least start, greatest end)`` of the ``(partition, start, end, into_time)`` rows."""
    spans: dict[int, tuple[int, int]] = {}
    for partition, start, end, _ in rows:
        lo, hi = spans.get(partition, (start, end))
        spans[partition] = (min(lo, start), max(hi, end))
    return spans


#: The fewest offsets a read task of Spark's Kafka source is given when partitions are small (:func:`read_tasks`).
MIN_TASK_OFFSETS = 125_000
#: The most partitions (or pieces of one) a read task reads in turn: each holds its Kafka consumer to the task's end.
MAX_TASK_PARTITIONS = 16


def read_tasks(spans: Mapping[int, tuple[int, int]], max_offsets: int | None = None,
               min_offsets: int | None = None, max_partitions: int | None = None) -> tuple[int, int]:
    """``(tasks, natural)``: the read tasks a Spark read of ``spans`` (partition -> ``[start, end)``) runs in, and
    the ones Spark's Kafka source makes of them (one per partition, split at ``max_offsets``, default
    :data:`SPARK_MAX_TASK_OFFSETS`; ``min_offsets`` and ``max_partitions`` default
    :data:`MIN_TASK_OFFSETS` and :data:`MAX_TASK_PARTITIONS`)::

        natural = sum over p of ceil((end_p - start_p) / max_offsets)
        tasks   = min(natural, max(1, ceil(sum over p of (end_p - start_p) / min_offsets),
                                      ceil(natural / max_partitions)))

    A task costs Spark's scheduling, a consumer's fetches up to the log end and a staged file (~30 ms over the
    records it reads), and each partition a consumer of its own: 1M records over 64 partitions took Spark's own
    read 1.72 s against 0.95 s over 8 (writing nothing), and staged in 2.58 s in 20 tasks (at least 50K offsets
    each), 2.16 s in 8 (125K), 2.11 s in 4 (250K), against 1.55 s over 8 partitions in 8 tasks (medians of 3, Spark
    Connect on 2 cores, 2026-11-30); 100K records over 8 partitions staged as fast in 1 task as in 2.  Fewer tasks
    than ``natural`` means partitions coalesced: each task reads several in turn, at most ``max_partitions`` (Spark
    releases a task's consumers when it ends, so a task of a thousand small partitions would hold a thousand
    consumers).  A wide read is never split further than Spark splits it.
    """
    import math

    if max_offsets is None:
        max_offsets = SPARK_MAX_TASK_OFFSETS
    min_offsets = MIN_TASK_OFFSETS if min_offsets is None else min_offsets
    max_partitions = MAX_TASK_PARTITIONS if max_partitions is None else max_partitions
    sizes = [end - start for start, end in spans.values() if end > start]
    natural = sum(math.ceil(size / max_offsets) for size in sizes)
    return min(natural, max(1, math.ceil(sum(sizes) / min_offsets), math.ceil(natural / max_partitions))), natural


#: The most offsets of one partition a task of Spark's Kafka source reads (``maxRecordsPerPartition``): wide enough
#: that a tick's partition is one task, so a task is a consumer reading on to the log end, narrow enough that a
#: backfill of a few partitions keeps every core busy.  10M records over 8 partitions, read and staged (medians of
#: 4, alternating, each after a full collection, Spark Connect on 2 cores, 2026-11-30): 10.60 s in 24 tasks of at
#: most 500,000 offsets, 9.58 s in 8; Spark's own copy of them 10.96 s.
SPARK_MAX_TASK_OFFSETS = 2_000_000
#: Spark's reads' ``fetch.max.wait.ms`` (:func:`spark_options`); a source's ``fetch.wait.max.ms`` wins.
SPARK_FETCH_MAX_WAIT_MS = 3
#: librdkafka properties that mean the same to the Java client of Spark's Kafka source.
SPARK_SAME_PROPERTIES = frozenset({
    "client.id", "client.rack", "security.protocol", "sasl.mechanism", "sasl.kerberos.service.name",
    "fetch.min.bytes", "fetch.max.bytes", "max.partition.fetch.bytes", "reconnect.backoff.ms",
    "reconnect.backoff.max.ms", "retry.backoff.ms", "metadata.max.age.ms", "connections.max.idle.ms",
    "socket.connection.setup.timeout.ms",
})
#: librdkafka name -> Java client name, same meaning.
SPARK_RENAMED_PROPERTIES = {"sasl.mechanisms": "sasl.mechanism", "fetch.wait.max.ms": "fetch.max.wait.ms"}
#: Prefixes of settings that decide whether (and as whom) a client may connect: one that cannot be
#: translated is an error rather than dropped, so Spark never connects differently from ``read``.
_SECURITY_PREFIXES = ("security.", "ssl.", "sasl.", "enable.ssl.", "enable.sasl.")
_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def spark_client_options(config: Mapping[str, Any]) -> dict[str, str]:
    """The ``kafka.<key>`` options of Spark's Kafka source for a source's librdkafka ``config``.

    Passed on: :data:`SPARK_SAME_PROPERTIES` as they are, :data:`SPARK_RENAMED_PROPERTIES` under
    their Java names, ``ssl.endpoint.identification.algorithm`` (``none`` becomes ``""``),
    ``ssl.ca.location`` as a PEM trust store, and ``sasl.username``/``sasl.password`` (mechanism
    PLAIN or SCRAM-SHA-256/512) as ``sasl.jaas.config``.  Any other security setting (``security.*``,
    ``ssl.*``, ``sasl.*``) is a :class:`SourceError`.  The rest is librdkafka tuning, logging or
    consumer-group behaviour that Spark's reads do not use (they assign partitions, seek and never
    commit) and is left out.
    """
    out: dict[str, str] = {}
    mechanism = str(config.get("sasl.mechanism", config.get("sasl.mechanisms", "GSSAPI"))).upper()
    for key, value in config.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if key in SPARK_SAME_PROPERTIES:
            out[f"kafka.{key}"] = text
        elif key in SPARK_RENAMED_PROPERTIES:
            out[f"kafka.{SPARK_RENAMED_PROPERTIES[key]}"] = text
        elif key == "ssl.endpoint.identification.algorithm":
            out["kafka.ssl.endpoint.identification.algorithm"] = "" if text.lower() == "none" else text
        elif key == "ssl.ca.location":
            out.update({"kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": text})
        elif key in ("sasl.username", "sasl.password"):
            if mechanism not in _JAAS_MODULES:
                raise SourceError(f"Kafka config {key!r} with sasl.mechanism {mechanism!r} has no equivalent "
                                  f"for Spark's Kafka source (PLAIN and SCRAM-SHA-256/512 do)")
        elif key.startswith(_SECURITY_PREFIXES):
            raise SourceError(f"Kafka config {key!r} cannot be passed to Spark's Kafka source (Java client); "
                              f"translated are {sorted(SPARK_SAME_PROPERTIES | set(SPARK_RENAMED_PROPERTIES))}, "
                              f"ssl.endpoint.identification.algorithm, ssl.ca.location, sasl.username/password")
    if "sasl.username" in config or "sasl.password" in config:
        user, password = (_jaas_quote(config.get(k, "")) for k in ("sasl.username", "sasl.password"))
        out["kafka.sasl.jaas.config"] = f'{_JAAS_MODULES[mechanism]} required username={user} password={password};'
    return out


def _jaas_quote(value: Any) -> str:
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
