"""Airflow connections for upstreams: a source entry's ``connection: <conn id>`` instead of its address options.

A kind with a ``connection_type`` (:class:`reclock.sources.SourceKind`) may name an Airflow connection of that
type instead of its ``connection_options``; the sources file then holds no address or credential.  The
connection is resolved here, and only here, when a step runs (:func:`resolved_options`, called by the
composition root :meth:`reclock.runtime.Runtime.source`), never when a DAG file is parsed: through the providers'
hooks and Airflow's Connection API.  In a task that is Airflow's connections (metadata DB, secrets backends);
anywhere, Airflow's own ``AIRFLOW_CONN_<CONN_ID>`` variables (JSON or URI), so the CLI takes conn ids too.

* ``kafka`` (conn type ``kafka``, apache-airflow-providers-apache-kafka): the extra is the librdkafka client
  config, as the provider's hooks read it.  Its ``bootstrap.servers`` is the source's ``bootstrap_servers``;
  the other properties (``security.protocol``, ``sasl.*``, ...) go under ``config``, where the file's own
  ``config`` properties win; ``group.id`` is left out (the source's ``group_id`` is its consumer group).
* ``postgres`` (conn type ``postgres``, apache-airflow-providers-postgres): host, port, login, password,
  schema (the database) and the extra's libpq parameters (``sslmode``, ...) make the source's ``dsn``, as
  ``PostgresHook.get_conn`` makes its connection arguments (the hook's own extra keys left out).

A Spark job launched by a task runs in a process of its own: :func:`environment` is the connection as the
``AIRFLOW_CONN_<CONN_ID>`` variable for its environment.  No message here shows a password: errors name the
source, the connection id and its type only.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from .sources import SourceError, source_kind

if TYPE_CHECKING:
    from .config import SourceConfig

#: conn type -> (the provider's hook, its package)
HOOKS = {
    "kafka": ("airflow.providers.apache.kafka.hooks.base:KafkaBaseHook", "apache-airflow-providers-apache-kafka"),
    "postgres": ("airflow.providers.postgres.hooks.postgres:PostgresHook", "apache-airflow-providers-postgres"),
}


def env_var(conn_id: str) -> str:
    """Airflow's environment variable of a connection: ``AIRFLOW_CONN_<CONN_ID>``."""
    return f"AIRFLOW_CONN_{re.sub(r'[^A-Za-z0-9_]', '_', conn_id).upper()}"


def _hook(conn_type: str, source: SourceConfig):
    import importlib

    path, package = HOOKS[conn_type]
    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise SourceError(f"source {source.name!r}: connection {source.connection!r} needs {package} "
                          f"(pip install {package}): {e}") from None


def connection(source: SourceConfig):
    """The Airflow connection ``source`` names, checked to be of its kind's connection type."""
    kind = source_kind(source.kind)
    if source.connection is None or kind is None or not kind.connection_type:
        raise SourceError(f"source {source.name!r} names no Airflow connection")
    hook = _hook(kind.connection_type, source)
    try:
        conn = hook.get_connection(source.connection)
    except Exception as e:  # noqa: BLE001 - AirflowNotFoundException; a secrets backend's own errors
        if type(e).__name__ == "AirflowNotFoundException":
            raise SourceError(f"source {source.name!r}: Airflow connection {source.connection!r} is not defined "
                              f"(add it in Airflow, Admin > Connections, of type {kind.connection_type!r}, or set "
                              f"{env_var(source.connection)})") from None
        raise SourceError(f"source {source.name!r}: cannot read Airflow connection {source.connection!r}: "
                          f"{type(e).__name__}") from None
    if conn.conn_type != kind.connection_type:
        raise SourceError(f"source {source.name!r}: Airflow connection {source.connection!r} is of type "
                          f"{conn.conn_type!r}; kind {source.kind} needs one of type {kind.connection_type!r}")
    return conn


def resolved_options(source: SourceConfig) -> dict[str, Any]:
    """The source's options with what its connection gives (holds the credentials: never log it)."""
    if source.connection is None:
        return dict(source.options)
    conn = connection(source)
    return {**source.options, **_RESOLVE[conn.conn_type](source, conn)}


def environment(source: SourceConfig) -> dict[str, str]:
    """``{AIRFLOW_CONN_<ID>: <the connection as JSON>}`` for a child process (a spark-submit), else ``{}``."""
    if source.connection is None:
        return {}
    return {env_var(source.connection): connection(source).as_json()}


def _kafka(source: SourceConfig, conn) -> dict[str, Any]:
    extra = dict(conn.extra_dejson)
    bootstrap = extra.pop("bootstrap.servers", None)
    if not isinstance(bootstrap, str) or not bootstrap.strip():
        raise SourceError(f"source {source.name!r}: Airflow connection {source.connection!r} has no "
                          f"'bootstrap.servers' in its extra (the Kafka client config, e.g. "
                          f'{{"bootstrap.servers": "host:9092"}})')
    extra.pop("group.id", None)  # the source's group_id is its consumer group
    return {"bootstrap_servers": bootstrap, "config": {**extra, **(source.options.get("config") or {})}}


def _postgres(source: SourceConfig, conn) -> dict[str, Any]:
    from psycopg.conninfo import make_conninfo

    ignored = getattr(_hook("postgres", source), "ignored_extra_options", set())  # the hook's own extra keys
    params = {"host": conn.host, "port": conn.port, "user": conn.login, "password": conn.password,
              "dbname": conn.schema, **{k: v for k, v in conn.extra_dejson.items() if k not in ignored}}
    try:
        return {"dsn": make_conninfo("", **{k: v for k, v in params.items() if v not in (None, "")})}
    except Exception as e:  # noqa: BLE001 - psycopg.ProgrammingError: a bad libpq parameter in the extra
        raise SourceError(f"source {source.name!r}: Airflow connection {source.connection!r} does not make a "
                          f"libpq connection string ({type(e).__name__}; check its extra's parameters: "
                          f"{', '.join(sorted(conn.extra_dejson))})") from None


_RESOLVE = {"kafka": _kafka, "postgres": _postgres}
