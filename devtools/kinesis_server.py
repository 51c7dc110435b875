"""A local Kinesis-compatible server (kinesis-mock, the engine LocalStack runs) for tests and the demo.

``make setup`` installs it with npm from ``devtools/kinesis/package.json`` and its lock
(``npm ci``: the npm package ``kinesis-local``, one self-contained ``main.js`` for Node.js).
:class:`KinesisServer` starts ``node main.js`` from the package's folder (it reads the TLS
certificate ``server.json`` from its working directory) on a free plain-HTTP port, waits until it
answers ``ListStreams`` and stops it by its PID::

    with KinesisServer() as server:
        client = server.client()          # boto3, dummy credentials, endpoint_url=server.endpoint
        create_stream(client, "orders", shards=4)
        put(client, "orders", [b"a", b"b"], shard="shardId-000000000000")

Set ``RECLOCK_KINESIS_SERVER`` to another folder holding kinesis-local's ``main.js``.
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterable

from devtools.kafka_broker import free_port, run_until_interrupted, stop_process

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "devtools" / "kinesis" / "node_modules" / "kinesis-local"
#: Dummy credentials: the server accepts any (an access key id of 12 digits selects an account).
CREDENTIALS = {"aws_access_key_id": "reclock", "aws_secret_access_key": "reclock"}
REGION = "us-east-1"


class KinesisServerError(RuntimeError):
    """The server did not start, or a stream operation did not complete."""


def package_dir() -> Path:
    """The folder of kinesis-local's ``main.js``: ``$RECLOCK_KINESIS_SERVER`` or the one ``make setup`` installs."""
    path = Path(os.environ.get("RECLOCK_KINESIS_SERVER", PACKAGE))
    if not (path / "main.js").exists():
        raise KinesisServerError(f"no kinesis-local main.js in {path}: run `make setup` (npm ci in devtools/kinesis)")
    return path


class KinesisServer:
    """One ``node main.js`` process serving the Kinesis API over plain HTTP on ``host:port``."""

    def __init__(self, port: int | None = None, host: str = "127.0.0.1", startup_timeout: float = 60.0,
                 log_level: str = "WARN") -> None:
        self.host, self.port, self.startup_timeout, self.log_level = host, port, startup_timeout, log_level
        self._proc: subprocess.Popen | None = None
        self._log_dir: Path | None = None

    @property
    def endpoint(self) -> str:
        if self.port is None:
            raise KinesisServerError("server not started")
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def options(self) -> dict:
        """The ``kinesis`` source options that reach this server (add ``stream``)."""
        return {"endpoint_url": self.endpoint, "region": REGION, **CREDENTIALS}

    def client(self):
        return client(self.endpoint)

    def start(self) -> "KinesisServer":
        if self.running():
            return self
        package = package_dir()
        node = shutil.which("node")
        if node is None:
            raise KinesisServerError("Node.js (`node`) is not installed: run `make setup`")
        self._log_dir = Path(tempfile.mkdtemp(prefix="reclock-kinesis-"))
        port = self.port if self.port is not None else free_port(self.host)
        env = {**os.environ, "KINESIS_MOCK_PLAIN_PORT": str(port), "KINESIS_MOCK_TLS_PORT": str(free_port(self.host)),
               "LOG_LEVEL": self.log_level, "SHOULD_PERSIST_DATA": "false", "AWS_REGION": REGION,
               **{f"{op}_DURATION": "100ms" for op in ("CREATE_STREAM", "DELETE_STREAM", "MERGE_SHARDS",
                                                       "SPLIT_SHARD", "UPDATE_SHARD_COUNT")}}
        with open(self._log_dir / "server.log", "ab") as out:
            self._proc = subprocess.Popen([node, "main.js"], cwd=str(package), env=env, stdin=subprocess.DEVNULL,
                                          stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.port = port
        atexit.register(self.stop)
        deadline = time.monotonic() + self.startup_timeout
        while not self._answers():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise KinesisServerError(f"kinesis-local did not serve on port {port} within "
                                         f"{self.startup_timeout:.0f}s; log tail:\n{tail}")
            time.sleep(0.3)
        log.info("kinesis-local (pid %s) serving on %s", self._proc.pid, self.endpoint)
        return self

    def _answers(self) -> bool:
        try:
            self.client().list_streams(Limit=1)
            return True
        except Exception:
            return False

    def log_tail(self, lines: int = 30) -> str:
        path = None if self._log_dir is None else self._log_dir / "server.log"
        if path is None or not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) or "(empty log)"

    def stop(self) -> None:
        """Stop the server by its PID (SIGTERM, SIGKILL if it lingers); its streams are gone with it."""
        if self._proc is not None:
            stop_process(self._proc, "kinesis-local", timeout=1.0)  # nothing persisted: no shutdown to wait for
            self._proc = None
        if self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None
        try:
            atexit.unregister(self.stop)
        except Exception:  # pragma: no cover
            pass

    def __enter__(self) -> "KinesisServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --- stream helpers -----------------------------------------------------------------------------


def client(endpoint: str):
    """A boto3 Kinesis client for ``endpoint`` with dummy credentials (few retries: a local server)."""
    import boto3
    from botocore.config import Config

    return boto3.client("kinesis", endpoint_url=endpoint, region_name=REGION,
                        config=Config(retries={"max_attempts": 3}, connect_timeout=3, read_timeout=10), **CREDENTIALS)


def wait_active(kinesis, stream: str, timeout: float = 30.0) -> None:
    """Wait until ``stream`` is ACTIVE (after a create, split or merge)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            status = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamStatus"]
        except kinesis.exceptions.ResourceNotFoundException:
            status = "MISSING"
        if status == "ACTIVE":
            return
        if time.monotonic() > deadline:
            raise KinesisServerError(f"stream {stream!r} is {status}, not ACTIVE, after {timeout:.0f}s")
        time.sleep(0.05)


def create_stream(kinesis, stream: str, shards: int = 1) -> None:
    kinesis.create_stream(StreamName=stream, ShardCount=shards)
    wait_active(kinesis, stream)


def delete_stream(kinesis, stream: str, timeout: float = 30.0) -> None:
    """Delete ``stream`` and wait until it is gone."""
    kinesis.delete_stream(StreamName=stream)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            kinesis.describe_stream_summary(StreamName=stream)
        except kinesis.exceptions.ResourceNotFoundException:
            return
        time.sleep(0.05)
    raise KinesisServerError(f"stream {stream!r} still exists {timeout:.0f}s after its deletion")


def shards(kinesis, stream: str) -> list[dict]:
    """Every shard ListShards returns for ``stream`` (open and closed)."""
    out, kwargs = [], {"StreamName": stream}
    while True:
        page = kinesis.list_shards(**kwargs)
        out += page["Shards"]
        if not page.get("NextToken"):
            return out
        kwargs = {"NextToken": page["NextToken"]}


def open_shards(kinesis, stream: str) -> list[str]:
    """The ids of the open shards (no ending sequence number), in id order."""
    return sorted(s["ShardId"] for s in shards(kinesis, stream)
                  if "EndingSequenceNumber" not in s["SequenceNumberRange"])


def put(kinesis, stream: str, records: Iterable[bytes], shard: str, keys: Iterable[str] | None = None) -> list[str]:
    """Put ``records`` into ``shard`` (an explicit hash key inside its range), up to 500 per PutRecords call,
    with partition keys ``keys`` (default ``"p"``); their sequence numbers, in order."""
    key = next(s for s in shards(kinesis, stream) if s["ShardId"] == shard)["HashKeyRange"]["StartingHashKey"]
    records, out = list(records), []
    keys = list(keys) if keys is not None else ["p"] * len(records)
    for i in range(0, len(records), 500):
        entries = [{"Data": data, "PartitionKey": partition_key, "ExplicitHashKey": key}
                   for data, partition_key in zip(records[i:i + 500], keys[i:i + 500])]
        response = kinesis.put_records(StreamName=stream, Records=entries)
        for entry in response["Records"]:
            if entry.get("ShardId") != shard:
                raise KinesisServerError(f"a record for {shard} was not put there: {entry}")
            out.append(entry["SequenceNumber"])
    return out


def split(kinesis, stream: str, shard: str) -> None:
    """Split ``shard`` in two halves of its hash key range; wait until the children are open."""
    keys = next(s for s in shards(kinesis, stream) if s["ShardId"] == shard)["HashKeyRange"]
    middle = (int(keys["StartingHashKey"]) + int(keys["EndingHashKey"])) // 2 + 1
    kinesis.split_shard(StreamName=stream, ShardToSplit=shard, NewStartingHashKey=str(middle))
    wait_active(kinesis, stream)


def merge(kinesis, stream: str, shard: str, adjacent: str) -> None:
    """Merge two adjacent shards; wait until the child is open."""
    kinesis.merge_shards(StreamName=stream, ShardToMerge=shard, AdjacentShardToMerge=adjacent)
    wait_active(kinesis, stream)


def main(argv: list[str] | None = None) -> int:
    """``python -m devtools.kinesis_server [--port P]``: run a Kinesis-compatible server until Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m devtools.kinesis_server", description=main.__doc__)
    parser.add_argument("--port", type=int, default=None, help="plain HTTP port (default: a free one)")
    args = parser.parse_args(argv)
    with KinesisServer(port=args.port) as server:
        print(f"Kinesis endpoint: {server.endpoint} (pid {server.pid}, region {REGION}, any credentials); "
              "Ctrl-C stops", flush=True)
        run_until_interrupted(server.running)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
