"""Upstream sources and a factory that builds one from a plain JSON-able spec.

A spec is ``{"kind": <registered kind>, **constructor kwargs}``, e.g.
``{"kind": "kafka", "bootstrap_servers": "127.0.0.1:9092", "topic": "t", "group_id": "g"}``.
Specs travel to Spark workers as JSON, so a worker can rebuild the source it reads from.
Register more kinds with :func:`register_source`; the constructor is imported lazily.
This registry is also what the sources file accepts (:mod:`reclock.config` validates ``kind``,
the required options and, from the constructor's signature (:func:`source_options`), every
option's name and type against it), so a kind is known to both or to neither.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..secrets import remember_options
from .base import ON_BAD_RECORD, Source, SourceError

SourceFactory = Callable[..., Source]


@dataclass(frozen=True)
class SourceKind:
    """A registered kind: how to build it, and what the sources file must say about it."""

    name: str
    #: ``"module:attribute"`` (imported on first use) or a callable taking the spec's kwargs.
    factory: str | SourceFactory
    #: Options the sources file must give (non-empty) for this kind.
    required_options: tuple[str, ...] = ()
    #: Whether each offset carries exactly one record (Kafka, files yes; Postgres no: all changes
    #: of a transaction share its commit LSN).
    offsets_unique: bool = True
    #: The Airflow connection type a source entry may name instead of ``connection_options``
    #: (:mod:`reclock.connections` resolves it when a step runs), or None.
    connection_type: str | None = None
    #: The options (address, credentials) an Airflow connection of ``connection_type`` gives.
    connection_options: tuple[str, ...] = ()


_REGISTRY: dict[str, SourceKind] = {}


def register_source(kind: str, factory: str | SourceFactory, required_options: tuple[str, ...] = (),
                    offsets_unique: bool = True, connection_type: str | None = None,
                    connection_options: tuple[str, ...] = ()) -> SourceKind:
    """Register ``kind`` as a callable or a ``"module:attribute"`` path taking the spec's kwargs.

    Prefer the path form for sources read by Spark: workers import it, a callable registered
    only in the driver process is unknown there.  ``required_options`` and ``offsets_unique``
    are what the sources file's validation and the checks know about the kind; ``connection_type`` and
    ``connection_options``: an entry may name an Airflow connection of that type instead of those options.
    """
    _REGISTRY[kind] = SourceKind(kind, factory, tuple(required_options), bool(offsets_unique), connection_type,
                                 tuple(connection_options))
    return _REGISTRY[kind]


register_source("kafka", "reclock.sources.kafka:KafkaSource", ("bootstrap_servers", "topic", "group_id"),
                connection_type="kafka", connection_options=("bootstrap_servers",))
register_source("files", "reclock.sources.files:FileSource", ("url",))
register_source("postgres", "reclock.sources.postgres:PostgresSource", ("dsn", "slot"), offsets_unique=False,
                connection_type="postgres", connection_options=("dsn",))
register_source("cdcv2", "reclock.sources.cdcv2:CdcV2Source", ("transport",), offsets_unique=False)  # offset = CDC time
register_source("kinesis", "reclock.sources.kinesis:KinesisSource", ("stream",))  # landed by each tick
register_source("recorded", "reclock.sources.recorded:RecordedSource", ("url",))  # Kinesis / PubNub replays


def source_kinds() -> list[str]:
    return sorted(_REGISTRY)


def source_kind(kind: Any) -> SourceKind | None:
    """The registered kind named ``kind``, or None."""
    return _REGISTRY.get(kind) if isinstance(kind, str) else None


def source_class(kind: str) -> type | None:
    """The kind's class when it declares ``partition_type`` and ``data_schema`` itself, else None.

    Enough to find a source's warehouse tables without building it (and connecting upstream).
    """
    factory = _resolve(kind)
    declares = isinstance(factory, type) and all(hasattr(factory, a) for a in ("partition_type", "data_schema"))
    return factory if declares else None


def _resolve(kind: str) -> SourceFactory:
    registered = source_kind(kind)
    factory = registered.factory if registered else None
    if factory is None:
        if ":" in kind:  # an unregistered "module:attribute" works too
            factory = kind
        else:
            raise SourceError(f"unknown source kind {kind!r}; known: {', '.join(source_kinds())}")
    if isinstance(factory, str):
        module, _, attr = factory.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise SourceError(f"cannot import source kind {kind!r} from {module}:{attr}: {e}") from e
    return factory


def source_options(kind: str) -> dict[str, inspect.Parameter] | None:
    """The options ``kind`` takes: its constructor's keyword parameters by name (their annotations and
    defaults too), read from its signature; None when it takes any keyword (``**kwargs``)."""
    parameters = inspect.signature(_resolve(kind)).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return {p.name: p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def dead_letter_problem(kind: str, options: Mapping[str, Any]) -> str | None:
    """Why a source of ``kind`` built from ``options`` cannot dead-letter the records it cannot decode
    (``on_bad_record: dead_letter``), or None.  A kind can when its class says so with a static
    ``dead_letter_problem(options)`` (Kafka: its Spark read goes on past such a record; files: its ``read``
    yields a :class:`~reclock.sources.base.BadRecord` for it)."""
    check = getattr(_resolve(kind), "dead_letter_problem", None)
    if check is None:
        return f"kind {kind} stops at a record it cannot decode; only kafka and files can dead-letter records"
    return check(options)


def build_source(spec: Mapping[str, Any]) -> Source:
    """Build a source from ``{"kind": ..., **kwargs}``; its secrets are remembered first (:mod:`reclock.secrets`)."""
    if isinstance(spec, Mapping):
        remember_options(spec)  # before anything can log or raise them
    if not isinstance(spec, Mapping) or "kind" not in spec:
        raise SourceError(f"a source spec is a mapping with a 'kind', got {spec!r}")
    kwargs = dict(spec)
    kind = kwargs.pop("kind")
    factory = _resolve(kind)
    try:
        return factory(**kwargs)
    except TypeError as e:
        raise SourceError(f"bad arguments for source kind {kind!r}: {e}") from e


__all__ = ["ON_BAD_RECORD", "Source", "SourceError", "SourceKind", "build_source", "dead_letter_problem",
           "register_source", "source_class", "source_kind",
           "source_kinds", "source_options"]
