"""Upstream sources and a factory that builds one from a plain JSON-able spec.

A spec is ``{"kind": <registered kind>, **constructor kwargs}``, e.g.
``{"kind": "kafka", "bootstrap_servers": "127.0.0.1:9092", "topic": "t", "group_id": "g"}``.
Specs travel to Spark workers as JSON, so a worker can rebuild the source it reads from.
Register more kinds with :func:`register_source`; the constructor is imported lazily.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping

from .base import Source, SourceError

SourceFactory = Callable[..., Source]

# kind -> "module:attribute" (imported on first use) or a callable
_REGISTRY: dict[str, str | SourceFactory] = {
    "kafka": "reclock.sources.kafka:KafkaSource",
    "files": "reclock.sources.files:FileSource",
    "postgres": "reclock.sources.postgres:PostgresSource",
}


def register_source(kind: str, factory: str | SourceFactory) -> None:
    """Register ``kind`` as a callable or a ``"module:attribute"`` path taking the spec's kwargs.

    Prefer the path form for sources read by Spark: workers import it, a callable registered
    only in the driver process is unknown there.
    """
    _REGISTRY[kind] = factory


def source_kinds() -> list[str]:
    return sorted(_REGISTRY)


def _resolve(kind: str) -> SourceFactory:
    factory = _REGISTRY.get(kind)
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


def build_source(spec: Mapping[str, Any]) -> Source:
    """Build a source from ``{"kind": ..., **kwargs}``."""
    if not isinstance(spec, Mapping) or "kind" not in spec:
        raise SourceError(f"a source spec is a mapping with a 'kind', got {spec!r}")
    kwargs = dict(spec)
    kind = kwargs.pop("kind")
    factory = _resolve(kind)
    try:
        return factory(**kwargs)
    except TypeError as e:
        raise SourceError(f"bad arguments for source kind {kind!r}: {e}") from e


__all__ = ["Source", "SourceError", "build_source", "register_source", "source_kinds"]
