"""A local S3-compatible server (moto's, in server mode) on a free port, with one bucket: what the S3 tests and the
production-shaped soak put the warehouse on.  Its conditional ``PutObject`` (``If-None-Match``) is what delta-rs
commits with.

    with MotoServer("reclock-test") as s3:
        s3.endpoint        # http://127.0.0.1:<port>; any key and secret are accepted
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request

from devtools.kafka_broker import free_port

KEY, SECRET, REGION = "testing", "testing", "us-east-1"


class MotoServer:
    def __init__(self, bucket: str, startup_timeout: float = 30.0) -> None:
        self.bucket, self.startup_timeout = bucket, startup_timeout
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen | None = None

    def start(self) -> "MotoServer":
        server = shutil.which("moto_server", path=os.path.dirname(sys.executable))
        cmd = [server] if server else [sys.executable, "-m", "moto.server"]
        self._proc = subprocess.Popen(cmd + ["-H", "127.0.0.1", "-p", str(self.port)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + self.startup_timeout
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto server did not start on {self.endpoint}")
                time.sleep(0.1)
        request = urllib.request.Request(f"{self.endpoint}/{self.bucket}", method="PUT")
        urllib.request.urlopen(request, timeout=10).close()  # moto accepts unsigned requests
        return self

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def fsspec_options(self) -> dict:
        return fsspec_options(self.endpoint)

    def delta_options(self) -> dict:
        return delta_options(self.endpoint)

    def s3a_conf(self) -> dict:
        return s3a_conf(self.endpoint)

    def __enter__(self) -> "MotoServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def fsspec_options(endpoint: str) -> dict:
    """s3fs options for the server at ``endpoint`` (a files source's ``storage_options``)."""
    return {"key": KEY, "secret": SECRET, "endpoint_url": endpoint, "client_kwargs": {"region_name": REGION}}


def delta_options(endpoint: str) -> dict:
    """deltalake options for the server at ``endpoint``, spelled like docker/sources.yaml's for MinIO."""
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_REGION": REGION, "AWS_ALLOW_HTTP": "true", "AWS_CONDITIONAL_PUT": "etag"}


def s3a_conf(endpoint: str) -> dict:
    """Spark's ``spark.hadoop.fs.s3a.*`` settings for the server at ``endpoint``."""
    return {f"spark.hadoop.fs.s3a.{k}": v for k, v in {
        "endpoint": endpoint, "access.key": KEY, "secret.key": SECRET, "endpoint.region": REGION,
        "path.style.access": "true", "connection.ssl.enabled": "false"}.items()}
