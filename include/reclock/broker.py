"""A local Kafka-protocol broker (noida-db) for tests and the demo, plus small topic/produce helpers.

noida-db ships as one binary inside its PyPI wheel (``<site-packages>/noida_db/noida-db``).
:class:`LocalBroker` starts it on a free port with a fresh data directory, waits until it
answers Kafka metadata requests, and stops it with SIGINT (its Ctrl-C path, which saves data)::

    with LocalBroker() as broker:
        create_topic(broker.bootstrap, "orders", partitions=2)
        produce(broker.bootstrap, "orders", [("k", "v")], partition=0)

What noida-db 0.2.3 supports (checked against confluent-kafka 2.16.1): partitions, explicit
offset fetch, consumer-group offset commits, CreatePartitions, DeleteRecords (moves the log
start offset), ListOffsets honouring ``isolation.level`` (the last stable offset under
``read_committed``) and transactions (commit and abort, with control markers taking offsets).

Set ``RECLOCK_NOIDA_BIN`` to use another binary.
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterable, Union

log = logging.getLogger(__name__)

Bytesish = Union[str, bytes, None]
#: A record to produce: ``value``, ``(key, value)`` or ``(key, value, partition)``.
Record = Union[Bytesish, tuple]


class BrokerError(RuntimeError):
    """The local broker could not be started, or a helper call to it failed."""


def noida_binary() -> Path:
    """Path of the noida-db binary: ``$RECLOCK_NOIDA_BIN`` or the one inside the installed wheel."""
    override = os.environ.get("RECLOCK_NOIDA_BIN")
    if override:
        path = Path(override)
    else:
        try:
            import noida_db
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise BrokerError("noida-db is not installed (pip install noida-db) and RECLOCK_NOIDA_BIN is unset") from e
        path = Path(noida_db.__file__).resolve().parent / "noida-db"
    if not path.is_file():
        raise BrokerError(f"noida-db binary not found at {path}")
    if not os.access(path, os.X_OK):
        try:
            path.chmod(path.stat().st_mode | 0o111)
        except OSError as e:
            raise BrokerError(f"noida-db binary at {path} is not executable") from e
    return path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _quiet_logger() -> logging.Logger:
    # librdkafka logs go to Python logging instead of stderr.
    return logging.getLogger("reclock.librdkafka")


class LocalBroker:
    """One noida-db process serving only Kafka on ``host:port``.

    ``data_dir=None`` makes a fresh temporary directory, removed on :meth:`stop`
    (unless ``keep_data``); a given ``data_dir`` is kept.  ``port=None`` picks a free port.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        startup_timeout: float = 30.0,
        keep_data: bool = False,
    ) -> None:
        self.host = host
        self.port = port
        self.startup_timeout = startup_timeout
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
        binary = noida_binary()
        if self._given_data_dir is not None:
            self._given_data_dir.mkdir(parents=True, exist_ok=True)
            self.data_dir = self._given_data_dir
        else:
            self.data_dir = Path(tempfile.mkdtemp(prefix="reclock-noida-"))
        self.log_path = self.data_dir / "noida.log"
        attempts = 1 if self.port is not None else 3  # a picked free port can be taken meanwhile
        last_error: BrokerError | None = None
        for _ in range(attempts):
            port = self.port if self.port is not None else free_port(self.host)
            try:
                self._launch(binary, port)
                self.port = port
                atexit.register(self.stop)
                return self
            except BrokerError as e:
                last_error = e
        self._cleanup_dir()
        assert last_error is not None
        raise last_error

    def _launch(self, binary: Path, port: int) -> None:
        assert self.data_dir is not None and self.log_path is not None
        cmd = [str(binary), "start", "--data-dir", str(self.data_dir), "--host", self.host,
               "--only", "kafka", "--kafka-port", str(port)]
        self._log_file = open(self.log_path, "ab")
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log_file,
                                      stderr=subprocess.STDOUT, cwd=str(self.data_dir))
        deadline = time.monotonic() + self.startup_timeout
        bootstrap = f"{self.host}:{port}"
        while True:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._reap()
                raise BrokerError(f"noida-db exited with code {code} while starting on {bootstrap}; "
                                  f"command: {' '.join(cmd)}\nlog tail:\n{self.log_tail()}")
            if _accepts_kafka(bootstrap, timeout=1.0):
                log.info("noida-db (pid %s) serving Kafka on %s, data in %s", self._proc.pid, bootstrap, self.data_dir)
                return
            if time.monotonic() > deadline:
                self._terminate()
                raise BrokerError(f"noida-db did not accept Kafka connections on {bootstrap} within "
                                  f"{self.startup_timeout:.0f}s; command: {' '.join(cmd)}\nlog tail:\n{self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, lines: int = 30) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:]) or "(empty log)"

    def stop(self, timeout: float = 10.0) -> None:
        """SIGINT the broker (its clean shutdown), escalate to SIGTERM/SIGKILL if it lingers."""
        if self._proc is not None:
            self._terminate(timeout)
        self._cleanup_dir()
        try:
            atexit.unregister(self.stop)
        except Exception:  # pragma: no cover
            pass

    def _terminate(self, timeout: float = 10.0) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            for sig, wait in ((signal.SIGINT, timeout), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                try:
                    proc.send_signal(sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    log.warning("noida-db (pid %s) still running after %s", proc.pid, sig.name)
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


def add_partitions(bootstrap: str, topic: str, total: int, timeout: float = 10.0) -> None:
    """Grow ``topic`` to ``total`` partitions (Kafka CreatePartitions)."""
    from confluent_kafka.admin import NewPartitions

    admin = _admin(bootstrap)
    futures = admin.create_partitions([NewPartitions(topic, total)], operation_timeout=timeout,
                                      request_timeout=timeout)
    _wait(futures, "create partitions of", timeout)


def delete_records(bootstrap: str, topic: str, partition: int, before: int, timeout: float = 10.0) -> None:
    """Release offsets ``< before`` of a partition (Kafka DeleteRecords: the log start offset moves)."""
    from confluent_kafka import TopicPartition

    admin = _admin(bootstrap)
    futures = admin.delete_records([TopicPartition(topic, partition, before)], request_timeout=timeout)
    _wait(futures, "delete records of", timeout)


def _normalize(record: Record, partition: int | None) -> tuple[Bytesish, Bytesish, int | None]:
    if isinstance(record, tuple):
        if len(record) == 2:
            return record[0], record[1], partition
        if len(record) == 3:
            return record[0], record[1], record[2]
        raise BrokerError(f"record must be value, (key, value) or (key, value, partition), got {record!r}")
    return None, record, partition


def _produce_all(producer, topic: str, records: Iterable[Record], partition: int | None) -> None:
    errors: list[str] = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(f"partition {msg.partition()}: {err}")

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


def produce(bootstrap: str, topic: str, records: Iterable[Record], partition: int | None = None) -> None:
    """Produce records (``value``, ``(key, value)`` or ``(key, value, partition)``; str or bytes)
    non-transactionally and wait until all are acknowledged.  ``partition`` is the default partition."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "logger": _quiet_logger(), "linger.ms": 0,
                         "enable.idempotence": False})
    _produce_all(producer, topic, records, partition)


class Transaction:
    """An open Kafka transaction: :meth:`produce` into it, then :meth:`commit` or :meth:`abort`."""

    def __init__(self, bootstrap: str, topic: str, transactional_id: str | None = None, timeout: float = 10.0):
        from confluent_kafka import Producer

        self.topic = topic
        self.timeout = timeout
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
        _produce_all(self._producer, self.topic, records, partition)

    def commit(self) -> None:
        self._producer.commit_transaction(self.timeout)
        self.done = True

    def abort(self) -> None:
        self._producer.abort_transaction(self.timeout)
        self.done = True

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
    """``python -m reclock.broker [--port P] [--data-dir D]``: run a broker until Ctrl-C (for the demo)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m reclock.broker", description=main.__doc__)
    parser.add_argument("--port", type=int, default=None, help="Kafka port (default: a free one)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--data-dir", default=None, help="keep data here (default: a temporary dir, removed)")
    args = parser.parse_args(argv)
    with LocalBroker(data_dir=args.data_dir, port=args.port, host=args.host) as broker:
        print(f"Kafka bootstrap: {broker.bootstrap} (noida-db pid {broker.pid}, data {broker.data_dir}); Ctrl-C stops",
              flush=True)
        try:
            while broker.running():
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
