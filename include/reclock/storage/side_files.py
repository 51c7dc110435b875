"""Side files: small JSON documents a source keeps beside its Delta tables (outside them, so vacuum never
touches them), on the warehouse's own storage: a local path, or an object store URI through
``pyarrow.fs.FileSystem.from_uri`` (S3 credentials and endpoint from the warehouse's deltalake
``storage_options`` when given, else from the usual AWS environment).

Law: a reader sees a whole document or none, never half of one.  A local write goes to a temporary name and is
renamed over the document; an object store's PUT replaces the object whole.  The last writer wins: a side file
holds what is safe to lose to a racing writer (a last check record, a sample, a vacuum time), never a commit.
"""
from __future__ import annotations

import json
import os
import uuid
from typing import Any, Mapping

import pyarrow.fs as pafs


def write_json(uri: str, name: str, record: Mapping[str, Any], storage_options: Mapping[str, str] | None = None) -> str:
    """Store ``record`` as JSON in ``<uri>/<name>``, replacing it whole (a reader never sees half of it); the path."""
    fs, base = filesystem(uri, storage_options)
    path = f"{base}/{name}"
    data = json.dumps(record, sort_keys=True, default=str).encode()
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(base, recursive=True)
        tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
        with fs.open_output_stream(tmp) as f:
            f.write(data)
        fs.move(tmp, path)  # atomic rename: a reader never sees half a record
    else:
        with fs.open_output_stream(path) as f:  # one PUT on object stores
            f.write(data)
    return path


def read_json(uri: str, name: str, storage_options: Mapping[str, str] | None = None) -> Any:
    """The JSON document ``<uri>/<name>``, or None when there is none (ValueError when it is not JSON)."""
    fs, base = filesystem(uri, storage_options)
    try:
        with fs.open_input_stream(f"{base}/{name}") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    return json.loads(data)


def filesystem(uri: str, storage_options: Mapping[str, str] | None) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem for ``uri`` and the path of ``uri`` on it."""
    if "://" not in uri or uri.startswith("file://"):
        path = uri[len("file://"):] if uri.startswith("file://") else uri
        return pafs.LocalFileSystem(), os.path.abspath(path).rstrip("/") or "/"
    if uri.startswith(("s3://", "s3a://")) and storage_options:
        return _s3(storage_options), uri.split("://", 1)[1].rstrip("/")
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path.rstrip("/")


def _s3(options: Mapping[str, str]) -> pafs.S3FileSystem:
    """pyarrow's S3 filesystem from deltalake (object_store) storage options."""
    o = {k.upper(): v for k, v in options.items()}
    endpoint = o.get("AWS_ENDPOINT_URL") or o.get("AWS_ENDPOINT")
    kwargs: dict[str, Any] = {
        "access_key": o.get("AWS_ACCESS_KEY_ID"), "secret_key": o.get("AWS_SECRET_ACCESS_KEY"),
        "session_token": o.get("AWS_SESSION_TOKEN"), "region": o.get("AWS_REGION") or o.get("AWS_DEFAULT_REGION"),
    }
    if endpoint:
        scheme, _, host = endpoint.partition("://") if "://" in endpoint else ("https", "", endpoint)
        kwargs.update(endpoint_override=host, scheme=scheme)
    if str(o.get("AWS_ALLOW_HTTP", "")).lower() == "true":
        kwargs["scheme"] = "http"
    return pafs.S3FileSystem(**{k: v for k, v in kwargs.items() if v is not None})
