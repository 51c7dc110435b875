"""A local Apache Kafka broker (KRaft, no ZooKeeper) for tests, the demo and the benchmark, plus topic helpers.

The broker runs from the jars ``make setup`` copies with Maven (``jvm/kafka-broker/pom.xml`` into
``var/jars/kafka-broker``, apart from Spark's jars). :class:`LocalBroker` writes a one-node
``server.properties`` (broker and controller in one process) into a fresh log directory, formats the
storage (``kafka.tools.StorageTool format``), starts ``kafka.Kafka`` on a free port, waits until it
answers metadata requests and stops it by its PID (SIGTERM: Kafka's controlled shutdown)::

    with LocalBroker() as broker:
        create_topic(broker.bootstrap, "orders", partitions=2)
        produce(broker.bootstrap, "orders", [("k", "v")], partition=0)

Set ``RECLOCK_KAFKA_JARS`` to run the broker from another folder of jars.
"""
from __future__ import annotations

import atexit
import base64
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable, Iterable, Union

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
JARS = REPO / "var" / "jars" / "kafka-broker"

Bytesish = Union[str, bytes, None]
#: A record to produce: ``value``, ``(key, value)`` or ``(key, value, partition)``.
Record = Union[Bytesish, tuple]

SERVER_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@{host}:{controller_port}
listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}
advertised.listeners=PLAINTEXT://{host}:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={log_dir}
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
log.segment.bytes=268435456
"""

LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.out.ref = out
logger.kafka.name = kafka
logger.kafka.level = {level}
logger.state.name = state.change.logger
logger.state.level = WARN
"""


_STACK_FRAME = re.compile(r"^\s+(at |\.\.\. \d+ more)")


class BrokerError(RuntimeError):
    """The broker did not start, or an admin/produce request failed."""


def kafka_jars() -> Path:
    """The folder of the broker's jars: ``$RECLOCK_KAFKA_JARS`` or ``var/jars/kafka-broker``."""
    path = Path(os.environ.get("RECLOCK_KAFKA_JARS", JARS))
    if not any(path.glob("kafka_2.13-*.jar")):
        raise BrokerError(f"no Kafka broker jars in {path}: run `make setup` (Maven copies them from "
                          "jvm/kafka-broker/pom.xml)")
    return path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _quiet_logger() -> logging.Logger:
    # librdkafka logs go to Python logging instead of stderr.
    return logging.getLogger("reclock.librdkafka")


def cluster_id(draw: Callable[[], bytes] = lambda: uuid.uuid4().bytes) -> str:
    """A Kafka cluster id: 16 random bytes (``draw``), URL-safe base64 without padding, drawn again while it has a
    ``-``, as Kafka's own ``Uuid.randomUuid`` does: ``kafka-storage format -t -x...`` takes an id that starts with
    one for an option and fails (one broker start in 64 did)."""
    while "-" in (text := base64.urlsafe_b64encode(draw()).decode().rstrip("=")):
        pass
    return text


class LocalBroker:
    """One Apache Kafka process (KRaft broker and controller) serving on ``host:port``.

    ``data_dir=None`` makes a fresh temporary directory, removed on :meth:`stop` (unless
    ``keep_data``); a given ``data_dir`` is kept (and reused if it was formatted before).
    ``port=None`` picks a free port.
    """

    def __init__(self, data_dir: str | os.PathLike | None = None, port: int | None = None,
                 host: str = "127.0.0.1", startup_timeout: float = 90.0, keep_data: bool = False,
                 heap: str = "1g", log_level: str = "WARN") -> None:
        self.host = host
        self.port = port
        self.startup_timeout = startup_timeout
        self.heap = heap
        self.log_level = log_level
        self._given_data_dir = Path(data_dir) if data_dir is not None else None
        self.keep_data = keep_data or data_dir is not None
        self.data_dir: Path | None = None
        self.log_path: Path | None = None
        self._proc: subprocess.Popen | None = None
        self._log_file = None

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise BrokerError("broker not started")
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> "LocalBroker":
        if self.running():
            return self
        jars = kafka_jars()
        if self._given_data_dir is not None:
            self._given_data_dir.mkdir(parents=True, exist_ok=True)
            self.data_dir = self._given_data_dir
        else:
            self.data_dir = Path(tempfile.mkdtemp(prefix="reclock-kafka-"))
        self.log_path = self.data_dir / "kafka.log"
        attempts = 1 if self.port is not None else 3  # a picked free port can be taken meanwhile
        last_error: BrokerError | None = None
        for _ in range(attempts):
            port = self.port if self.port is not None else free_port(self.host)
            try:
                self._launch(jars, port)
                self.port = port
                atexit.register(self.stop)
                return self
            except BrokerError as e:
                last_error = e
        self._cleanup_dir()
        assert last_error is not None
        raise last_error

    def _java(self, jars: Path, main: str, *args: str, heap: str = "256m") -> list[str]:
        java = shutil.which("java") or "java"
        return [java, f"-Xmx{heap}", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
                "-cp", f"{jars}/*", main, *args]

    def _configure(self, jars: Path, port: int) -> Path:
        """Write server.properties (and log4j2.properties); format the storage once."""
        assert self.data_dir is not None
        log_dir = self.data_dir / "logs"
        props = self.data_dir / "server.properties"
        props.write_text(SERVER_PROPERTIES.format(host=self.host, port=port, controller_port=free_port(self.host),
                                                  log_dir=log_dir))
        (self.data_dir / "log4j2.properties").write_text(LOG4J2.format(level=self.log_level))
        if not (log_dir / "meta.properties").exists():
            fmt = subprocess.run(self._java(jars, "kafka.tools.StorageTool", "format", "-t", cluster_id(),
                                            "-c", str(props), "--ignore-formatted"),
                                 stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
            if fmt.returncode:
                raise BrokerError(f"formatting Kafka storage in {log_dir} failed ({fmt.returncode}):\n"
                                  f"{(fmt.stdout + fmt.stderr)[-3000:]}")
        return props

    def _launch(self, jars: Path, port: int) -> None:
        assert self.data_dir is not None and self.log_path is not None
        props = self._configure(jars, port)
        cmd = self._java(jars, "kafka.Kafka", str(props), heap=self.heap)
        self._log_file = open(self.log_path, "ab")
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log_file,
                                      stderr=subprocess.STDOUT, cwd=str(self.data_dir), start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout
        bootstrap = f"{self.host}:{port}"
        while True:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._reap()
                raise BrokerError(f"Kafka exited with code {code} while starting on {bootstrap}; "
                                  f"command: {' '.join(cmd)}\nlog tail:\n{self.log_tail()}")
            if _accepts_kafka(bootstrap, timeout=1.0):
                log.info("Kafka (pid %s) serving on %s, data in %s", self._proc.pid, bootstrap, self.data_dir)
                return
            if time.monotonic() > deadline:
                self._terminate()
                raise BrokerError(f"Kafka did not accept connections on {bootstrap} within "
                                  f"{self.startup_timeout:.0f}s; command: {' '.join(cmd)}\nlog tail:\n{self.log_tail()}")
            time.sleep(0.3)

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the broker's log, without Java stack frames (``at ...``,
        ``... N more``), which would otherwise crowd out the messages that say what went wrong."""
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        text = [line for line in self.log_path.read_text(errors="replace").splitlines()
                if not _STACK_FRAME.match(line)]
        return "\n".join(text[-lines:]) or "(empty log)"

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the broker (controlled shutdown), SIGKILL if it lingers; remove a temporary data dir."""
        if self._proc is not None:
            self._terminate(timeout)
        self._cleanup_dir()
        try:
            atexit.unregister(self.stop)
        except Exception:  # pragma: no cover
            pass

    def _terminate(self, timeout: float = 20.0) -> None:
        if self._proc is not None:
            stop_process(self._proc, "Kafka", timeout)
        self._reap()

    def _reap(self) -> None:
        if self._proc is not None:
            try:
                self._proc.wait(1)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass
        self._proc = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def _cleanup_dir(self) -> None:
        if self.data_dir is not None and not self.keep_data:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None

    def __enter__(self) -> "LocalBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid} {self.bootstrap}" if self.running() else "stopped"
        return f"LocalBroker({state}, data_dir={self.data_dir})"


def stop_process(proc: subprocess.Popen, what: str, timeout: float = 20.0) -> None:
    """Stop a server started here by its PID: SIGTERM, then SIGKILL if it is still running after ``timeout``."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            log.warning("%s (pid %s) still running after %s", what, proc.pid, sig.name)


def _accepts_kafka(bootstrap: str, timeout: float) -> bool:
    host, _, port = bootstrap.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError:
        return False
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": _quiet_logger()})
    try:
        admin.list_topics(timeout=timeout)
        return True
    except KafkaException:
        return False


# --- topic and produce helpers --------------------------------------------------------------


def _admin(bootstrap: str):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap, "logger": _quiet_logger()})


def _wait(futures: dict, what: str, timeout: float) -> None:
    for key, future in futures.items():
        try:
            future.result(timeout)
        except Exception as e:
            raise BrokerError(f"{what} {key}: {e}") from e


def create_topic(bootstrap: str, topic: str, partitions: int = 1, timeout: float = 10.0) -> None:
    from confluent_kafka.admin import NewTopic

    admin = _admin(bootstrap)  # keep a reference: a destroyed client fails its futures
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1)], operation_timeout=timeout,
        request_timeout=timeout)
    _wait(futures, "create topic", timeout)
    _wait_for_leaders(admin, bootstrap, topic, partitions, timeout)


def _wait_for_leaders(admin, bootstrap: str, topic: str, partitions: int, timeout: float) -> None:
    """Until each of ``topic``'s first ``partitions`` partitions has a leader in the metadata and that broker
    answers as its leader (a created topic's partitions answer NOT_LEADER_OR_FOLLOWER until then).

    The metadata names a leader before the broker has taken the partition up: a ListOffsets (a watermark request)
    is what must succeed.  An idempotent producer writing in between had its batches refused, then resent them
    out of sequence until its delivery timeout (seen with 64 partitions in the bench: OUT_OF_ORDER_SEQUENCE_NUMBER
    for 120 s, then "Expiring 1 record(s)")."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    deadline = time.monotonic() + timeout
    while True:
        described = admin.list_topics(topic, timeout=timeout).topics.get(topic)
        leaders = {p: m.leader for p, m in (described.partitions if described and not described.error else {}).items()}
        if all(leaders.get(p, -1) >= 0 for p in range(partitions)):
            break
        if time.monotonic() > deadline:
            raise BrokerError(f"topic {topic}: partitions without a leader after {timeout:.0f}s: {leaders}")
        time.sleep(0.1)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reclock-devtools", "logger": _quiet_logger()})
    try:
        for partition in range(partitions):
            while True:
                try:
                    consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)
                    break
                except KafkaException as e:
                    if time.monotonic() > deadline:
                        raise BrokerError(f"topic {topic} partition {partition}: its leader does not answer after "
                                          f"{timeout:.0f}s: {e}") from e
                    time.sleep(0.05)
    finally:
        consumer.close()


def add_partitions(bootstrap: str, topic: str, total: int, timeout: float = 10.0) -> None:
    """Grow ``topic`` to ``total`` partitions (Kafka CreatePartitions)."""
    from confluent_kafka.admin import NewPartitions

    admin = _admin(bootstrap)
    futures = admin.create_partitions([NewPartitions(topic, total)], operation_timeout=timeout,
                                      request_timeout=timeout)
    _wait(futures, "create partitions of", timeout)
    _wait_for_leaders(admin, bootstrap, topic, total, timeout)


def recreate_topic(bootstrap: str, topic: str, partitions: int = 1, timeout: float = 30.0) -> None:
    """Delete ``topic`` and create it again under the same name (a new topic ID, offsets from 0)."""
    admin = _admin(bootstrap)
    _wait(admin.delete_topics([topic], operation_timeout=timeout, request_timeout=timeout), "delete topic", timeout)
    deadline = time.monotonic() + timeout
    while True:  # deletion completes asynchronously: creating too early fails
        try:
            return create_topic(bootstrap, topic, partitions, timeout)
        except BrokerError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def delete_records(bootstrap: str, topic: str, partition: int, before: int, timeout: float = 10.0) -> None:
    """Release offsets ``< before`` of a partition (Kafka DeleteRecords: the log start offset moves)."""
    from confluent_kafka import TopicPartition

    admin = _admin(bootstrap)
    futures = admin.delete_records([TopicPartition(topic, partition, before)], request_timeout=timeout)
    _wait(futures, "delete records of", timeout)


def last_stable_offsets(bootstrap: str, topic: str, partitions: Iterable[int], timeout: float = 10.0) -> dict[int, int]:
    """Per partition, ListOffsets "latest" under read_committed: the last stable offset."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    admin = _admin(bootstrap)
    futures = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest() for p in partitions},
                                 isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=timeout)
    out = {}
    for tp, future in futures.items():
        try:
            out[tp.partition] = future.result(timeout).offset
        except Exception as e:
            raise BrokerError(f"list offsets of {topic} partition {tp.partition}: {e}") from e
    return out


def _normalize(record: Record, partition: int | None) -> tuple[Bytesish, Bytesish, int | None]:
    if isinstance(record, tuple):
        if len(record) == 2:
            return record[0], record[1], partition
        if len(record) == 3:
            return record[0], record[1], record[2]
        raise BrokerError(f"record must be value, (key, value) or (key, value, partition), got {record!r}")
    return None, record, partition


def _produce_all(producer, topic: str, records: Iterable[Record], partition: int | None) -> dict[int, int]:
    """Produce and flush; return the first offset written to each partition."""
    errors: list[str] = []
    first: dict[int, int] = {}

    def on_delivery(err, msg):
        if err is not None:
            errors.append(f"partition {msg.partition()}: {err}")
        else:
            first[msg.partition()] = min(msg.offset(), first.get(msg.partition(), msg.offset()))

    for record in records:
        key, value, part = _normalize(record, partition)
        kwargs = {"key": key, "value": value, "on_delivery": on_delivery}
        if part is not None:
            kwargs["partition"] = part
        producer.produce(topic, **kwargs)
        producer.poll(0)
    remaining = producer.flush(30)
    if remaining:
        raise BrokerError(f"{remaining} records to {topic} not delivered within 30s")
    if errors:
        raise BrokerError(f"produce to {topic} failed: {'; '.join(errors[:5])}")
    return first


def produce(bootstrap: str, topic: str, records: Iterable[Record], partition: int | None = None) -> None:
    """Produce records (``value``, ``(key, value)`` or ``(key, value, partition)``; str or bytes)
    non-transactionally and wait until all are acknowledged.  ``partition`` is the default partition."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "logger": _quiet_logger(), "linger.ms": 0,
                         "enable.idempotence": False})
    _produce_all(producer, topic, records, partition)


class Transaction:
    """An open Kafka transaction: :meth:`produce` into it, then :meth:`commit` or :meth:`abort`.

    :meth:`commit` and :meth:`abort` return once the transaction is complete in the log, i.e. its
    control markers are written: Kafka answers EndTxn as soon as the coordinator logged the
    decision and writes the markers afterwards, so without waiting the last stable offset may
    still sit on the transaction, and records produced next may land before its markers.
    """

    def __init__(self, bootstrap: str, topic: str, transactional_id: str | None = None, timeout: float = 10.0):
        from confluent_kafka import Producer

        self.bootstrap = bootstrap
        self.topic = topic
        self.timeout = timeout
        self._first: dict[int, int] = {}  # partition -> first offset this transaction wrote
        self._producer = Producer({"bootstrap.servers": bootstrap, "logger": _quiet_logger(), "linger.ms": 0,
                                   "transactional.id": transactional_id or f"reclock-{uuid.uuid4().hex}"})
        try:
            self._producer.init_transactions(timeout)
            self._producer.begin_transaction()
        except Exception as e:
            raise BrokerError(f"cannot open a transaction on {bootstrap}: {e}") from e
        self.done = False

    def produce(self, records: Iterable[Record], partition: int | None = None) -> None:
        """Produce into the transaction and flush (the records are written but not yet committed)."""
        for p, offset in _produce_all(self._producer, self.topic, records, partition).items():
            self._first[p] = min(offset, self._first.get(p, offset))

    def commit(self) -> None:
        self._producer.commit_transaction(self.timeout)
        self.done = True
        self._wait_for_markers()

    def abort(self) -> None:
        self._producer.abort_transaction(self.timeout)
        self.done = True
        self._wait_for_markers()

    def _wait_for_markers(self) -> None:
        """Wait until no partition's last stable offset is this transaction's first offset there.

        The LSO is the first offset of the oldest open transaction: equal to ours, ours is still
        open in the log; below it, an older transaction holds it (ours is invisible behind it);
        above it, our markers are written.
        """
        pending = dict(self._first)
        deadline = time.monotonic() + self.timeout
        while pending:
            lso = last_stable_offsets(self.bootstrap, self.topic, pending, self.timeout)
            pending = {p: first for p, first in pending.items() if lso[p] == first}
            if not pending:
                return
            if time.monotonic() > deadline:
                raise BrokerError(f"transaction markers on {self.topic} partitions {sorted(pending)} not written "
                                  f"within {self.timeout}s (last stable offsets {lso})")
            time.sleep(0.02)

    def __enter__(self) -> "Transaction":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if not self.done:
            self.abort() if exc_type else self.commit()


def produce_transaction(bootstrap: str, topic: str, records: Iterable[Record], partition: int | None = None,
                        commit: bool = True) -> None:
    """Produce records in one transaction, then commit it (``commit=False``: abort it)."""
    txn = Transaction(bootstrap, topic)
    txn.produce(records, partition)
    txn.commit() if commit else txn.abort()


def main(argv: list[str] | None = None) -> int:
    """``python -m devtools.kafka_broker [--port P] [--data-dir D]``: run a broker until Ctrl-C (for the demo)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m devtools.kafka_broker", description=main.__doc__)
    parser.add_argument("--port", type=int, default=None, help="Kafka port (default: a free one)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--data-dir", default=None, help="keep data here (default: a temporary dir, removed)")
    args = parser.parse_args(argv)
    with LocalBroker(data_dir=args.data_dir, port=args.port, host=args.host) as broker:
        print(f"Kafka bootstrap: {broker.bootstrap} (Kafka pid {broker.pid}, data {broker.data_dir}); Ctrl-C stops",
              flush=True)
        run_until_interrupted(broker.running)
    return 0


def run_until_interrupted(running) -> None:
    """Wait while ``running()`` is true, until Ctrl-C: the ``python -m devtools...`` commands' foreground."""
    try:
        while running():
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    raise SystemExit(main())
