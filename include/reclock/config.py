"""The sources file: where the warehouse is, which Spark master to use, and which sources to reclock.

``load_config(path)`` reads YAML (default: ``$RECLOCK_CONFIG`` or ``include/sources.yaml``),
expands ``${VAR}`` / ``${VAR:-default}`` in string values, applies the
``RECLOCK_WAREHOUSE`` and ``RECLOCK_SPARK_MASTER`` overrides and validates
everything, raising :class:`ConfigError` naming the file and the field.

A relative ``warehouse`` in the file is resolved against the parent of the
file's directory (the repo root for ``include/sources.yaml``); a relative
``RECLOCK_WAREHOUSE`` against the working directory.  URIs (``s3://...``) are
kept as they are.  The valid kinds, their required options and whether their offsets are
unique come from the source registry: :func:`reclock.sources.register_source` adds a kind.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from .sources import source_kind, source_kinds

DEFAULT_PATH = Path(__file__).resolve().parents[1] / "sources.yaml"
DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000
NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")

_TOP_KEYS = {"warehouse", "storage_options", "spark", "sources", "transactions"}
_SPARK_KEYS = {"master", "conf"}
_SOURCE_KEYS = {"name", "kind", "schedule", "start_date", "retention_ms", "options"}
_TRANSACTIONS_KEYS = {"name", "data_source", "tx_source", "schedule", "start_date"}


class ConfigError(ValueError):
    """The sources file is missing, unreadable or invalid; the message names the file and field."""


@dataclass(frozen=True)
class SourceConfig:
    name: str
    kind: str
    schedule: str | None = None
    start_date: datetime | None = None
    retention_ms: int = DEFAULT_RETENTION_MS
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def offsets_unique(self) -> bool:
        return source_kind(self.kind).offsets_unique


@dataclass(frozen=True)
class TransactionsConfig:
    """Debezium-style transactions over two configured Kafka sources (``reclock.transactions``)."""

    name: str
    data_source: str
    tx_source: str
    schedule: str | None = None
    start_date: datetime | None = None


@dataclass(frozen=True)
class Config:
    warehouse: str
    storage_options: dict[str, str]
    spark_master: str
    spark_conf: dict[str, str]
    sources: dict[str, SourceConfig]
    path: Path
    transactions: dict[str, TransactionsConfig] = field(default_factory=dict)

    def source(self, name: str) -> SourceConfig:
        return self._named(self.sources, name, "source named")

    def transaction(self, name: str) -> TransactionsConfig:
        return self._named(self.transactions, name, "transactions entry named")

    def _named(self, entries: dict, name: str, what: str):
        try:
            return entries[name]
        except KeyError:
            known = ", ".join(entries) or "none"
            raise ConfigError(f"{self.path}: no {what} {name!r} (known: {known})") from None


def config_path(path: str | os.PathLike | None = None) -> Path:
    """The file to read: ``path``, else ``$RECLOCK_CONFIG``, else ``include/sources.yaml``."""
    return Path(path or os.environ.get("RECLOCK_CONFIG") or DEFAULT_PATH).resolve()


def load_config(path: str | os.PathLike | None = None) -> Config:
    """Read, expand and validate the sources file."""
    path = config_path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from None
    return _parse(_Reader(path), raw)


class _Reader:
    """Validation helpers that prefix every error with the file and the field."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, where: str, message: str) -> ConfigError:
        return ConfigError(f"{self.path}: {where}: {message}")

    def mapping(self, value: Any, where: str, allowed: set[str] | None = None) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(where, f"must be a mapping, got {type(value).__name__}")
        if allowed is not None and (unknown := sorted(map(str, set(value) - allowed))):
            raise self.fail(where, f"unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})")
        return value

    def string(self, value: Any, where: str, optional: bool = False) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.fail(where, f"must be a non-empty string, got {value!r}")
        return value

    def expand(self, value: Any, where: str) -> Any:
        """Expand ``${VAR}`` and ``${VAR:-default}`` in every string inside ``value``."""
        if isinstance(value, dict):
            return {k: self.expand(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [self.expand(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if not isinstance(value, str):
            return value

        def sub(m: re.Match) -> str:
            var, default = m.group(1), m.group(2)
            if var in os.environ:
                return os.environ[var]
            if default is None:
                raise self.fail(where, f"environment variable {var} is not set (use ${{{var}:-default}})")
            return default

        return _VAR_RE.sub(sub, value)


def _parse(r: _Reader, raw: Any) -> Config:
    top = r.mapping(r.expand(raw, ""), "top level", _TOP_KEYS)
    spark = r.mapping(top.get("spark"), "spark", _SPARK_KEYS)
    warehouse = os.environ.get("RECLOCK_WAREHOUSE") or r.string(top.get("warehouse"), "warehouse")
    base = Path.cwd() if os.environ.get("RECLOCK_WAREHOUSE") else r.path.parent.parent
    entries = top.get("sources")
    if not isinstance(entries, list) or not entries:
        raise r.fail("sources", "must be a non-empty list of sources")
    sources = _named_entries(r, entries, "sources", "source", _parse_source)
    transactions = _named_entries(r, top.get("transactions") or [], "transactions", "transactions",
                                  lambda r, entry, where: _parse_transactions(r, entry, where, sources))
    return Config(
        warehouse=warehouse if "://" in warehouse else str((base / warehouse).resolve()),
        storage_options=_strings(r.mapping(top.get("storage_options"), "storage_options")),
        spark_master=os.environ.get("RECLOCK_SPARK_MASTER")
        or r.string(spark.get("master", "local[2]"), "spark.master"),
        spark_conf=_strings(r.mapping(spark.get("conf"), "spark.conf")),
        sources=sources,
        path=r.path,
        transactions=transactions,
    )


def _named_entries(r: _Reader, entries: list, key: str, what: str, parse) -> dict:
    """``{name: parse(r, entry, where)}`` of a list of named entries; duplicate names are refused."""
    if not isinstance(entries, list):
        raise r.fail(key, f"must be a list, got {type(entries).__name__}")
    parsed: dict = {}
    for i, entry in enumerate(entries):
        item = parse(r, entry, f"{key}[{i}]")
        if item.name in parsed:
            raise r.fail(f"{key}[{i}].name", f"duplicate {what} name {item.name!r}")
        parsed[item.name] = item
    return parsed


def _name(r: _Reader, entry: dict, where: str) -> str:
    name = entry.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise r.fail(f"{where}.name", f"must match [a-z][a-z0-9_]*, got {name!r}")
    return name


def _parse_transactions(r: _Reader, entry: Any, where: str, sources: dict[str, SourceConfig]) -> TransactionsConfig:
    entry = r.mapping(entry, where, _TRANSACTIONS_KEYS)
    name = _name(r, entry, where)
    where = f"{where} ({name})"
    for key in ("data_source", "tx_source"):
        source = sources.get(entry.get(key))
        if source is None:
            raise r.fail(f"{where}.{key}", f"must name a configured source, got {entry.get(key)!r}")
        if source.kind != "kafka":
            raise r.fail(f"{where}.{key}", f"must be a kafka source, {source.name} is {source.kind}")
    return TransactionsConfig(name, entry["data_source"], entry["tx_source"],
                              r.string(entry.get("schedule"), f"{where}.schedule", optional=True),
                              _start_date(r, entry.get("start_date"), f"{where}.start_date"))


def _parse_source(r: _Reader, entry: Any, where: str) -> SourceConfig:
    entry = r.mapping(entry, where, _SOURCE_KEYS)
    name = _name(r, entry, where)
    where = f"{where} ({name})"
    kind = entry.get("kind")
    if source_kind(kind) is None:
        raise r.fail(f"{where}.kind", f"unknown kind {kind!r} (known: {', '.join(source_kinds())})")
    options = r.mapping(entry.get("options"), f"{where}.options")
    if missing := [o for o in source_kind(kind).required_options if options.get(o) in (None, "")]:
        raise r.fail(f"{where}.options", f"missing required option(s) for kind {kind}: {', '.join(missing)}")
    retention = entry.get("retention_ms", DEFAULT_RETENTION_MS)
    if isinstance(retention, bool) or not isinstance(retention, int) or retention < 0:
        raise r.fail(f"{where}.retention_ms", f"must be a non-negative integer (ms), got {retention!r}")
    return SourceConfig(
        name=name,
        kind=kind,
        schedule=r.string(entry.get("schedule"), f"{where}.schedule", optional=True),
        start_date=_start_date(r, entry.get("start_date"), f"{where}.start_date"),
        retention_ms=retention,
        options=dict(options),
    )


def _start_date(r: _Reader, value: Any, where: str) -> datetime | None:
    """A date, datetime or ISO string as a timezone-aware (UTC unless given) datetime."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise r.fail(where, f"must be an ISO date or datetime, got {value!r}") from None
    if isinstance(value, date) and not isinstance(value, datetime):
        value = datetime(value.year, value.month, value.day)
    if not isinstance(value, datetime):
        raise r.fail(where, f"must be an ISO date or datetime, got {value!r}")
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def _strings(mapping: dict) -> dict[str, str]:
    """Spark conf and deltalake storage options take strings; YAML booleans become ``true``/``false``."""
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in mapping.items()}
