"""The sources file: where the warehouse is, which Spark master to use, and which sources to reclock.

The file is a pydantic v2 model (:func:`sources_file_model`): :class:`SparkSettings`, one
:class:`SourceConfig` subclass per registered kind (``kind`` is the discriminator; its ``options``
are a model made from the kind's constructor) and :class:`TransactionsConfig` entries.  Its JSON
schema (:func:`config_schema`, ``reclock config-schema``) is committed as ``docs/sources.schema.json``
for editors.

``load_config(path)`` reads YAML (default: ``$RECLOCK_CONFIG`` or ``include/sources.yaml``),
expands ``${VAR}`` / ``${VAR:-default}`` in string values, applies the
``RECLOCK_WAREHOUSE``, ``RECLOCK_SPARK_MASTER`` and ``RECLOCK_SPARK_REMOTE`` overrides and validates the whole file
before anything runs: every problem is one line ``<file>: <field>: <what is wrong>`` (the field
names the entry, e.g. ``sources[0] (orders).options.topic``), and :class:`ConfigError` carries
them all (``.problems``), not just the first, in the order of the file.  An entry whose name is
wrong reports only that.

A relative ``warehouse`` in the file is resolved against the parent of the
file's directory (the repo root for ``include/sources.yaml``); a relative
``RECLOCK_WAREHOUSE`` against the working directory.  URIs (``s3://...``) are
kept as they are; a local warehouse must not be an existing file.

What is checked, besides the keys each mapping may have:

* ``kind`` and its options come from the source registry (:func:`reclock.sources.register_source`
  adds a kind): the required options must be given (non-empty), and every option must be a parameter
  of the kind's constructor (:func:`reclock.sources.source_options`), so a misspelt ``startng_offsets``
  is refused.  Client properties go through the kind's own option for them (Kafka: ``config``,
  a mapping of librdkafka properties).  An option annotated ``str``, ``int``, ``float``, ``bool``,
  ``None``, a mapping or a sequence (or a union of those) must have such a value (booleans are not
  numbers); a number must be ``>= 0``, a duration in seconds (``*_s``) ``> 0``.
* ``schedule``: null (or ``"None"``: manual runs only), an Airflow preset (:data:`SCHEDULE_PRESETS`)
  or a cron expression that croniter accepts, as Airflow's cron timetables require.  A ``transactions``
  entry may also say ``assets`` (its default): it runs when both its sources have published (Airflow Assets).
* ``retention_ms`` (the AS OF window compaction keeps, default 7 days) is an integer ``> 0``.
* ``vacuum_retention_hours`` (how long VACUUM keeps files that compaction replaced; default the
  AS OF window) may not be below the AS OF window unless ``force_vacuum: true``: a query or a
  backfill reading a table version that compaction then replaced must still find its files.
* ``on_bad_record`` (what staging does with a record it cannot decode): ``fail`` (the default: the step
  fails naming source, partition and offset) or ``dead_letter`` (the record goes to the source's
  dead-letter table and staging goes on), which the kind must support (:func:`reclock.sources.dead_letter_problem`).
* names match ``[a-z][a-z0-9_]*`` and are unique; a ``transactions`` entry names two configured Kafka sources.
* ``connection``: an Airflow connection id, for a kind with a ``connection_type`` (kafka, postgres), instead
  of (not together with) the options it gives (``bootstrap_servers``, ``dsn``); :mod:`reclock.connections`
  reads it when a step runs, loading the file does not.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .models import (ASSETS, DEFAULT_RETENTION_MS, HOUR_MS, NAME_RE, SCHEDULE_PRESETS, Config, ConfigError,
                     SourceConfig, SourcesFile, SparkSettings, TransactionsConfig, config_schema, config_schema_text,
                     schedule_problem, sources_file_model, vacuum_retention_problem)
from .problems import explain, order, walk

#: The demo's sources file, beside the package in a checkout (``include/sources.yaml``); an installed reclock has
#: none, and is given its file (``--config``, ``$RECLOCK_CONFIG``).
DEFAULT_PATH = Path(__file__).resolve().parents[2] / "sources.yaml"
_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def config_path(path: str | os.PathLike | None = None) -> Path:
    """The file to read: ``path``, else ``$RECLOCK_CONFIG``, else ``include/sources.yaml`` of a checkout."""
    given = path or os.environ.get("RECLOCK_CONFIG")
    if not given and not DEFAULT_PATH.exists():
        raise ConfigError("no sources file: give one with --config or $RECLOCK_CONFIG (an installed reclock has no "
                          "default file)")
    return Path(given or DEFAULT_PATH).resolve()


#: libyaml's safe loader where PyYAML was built with it (10x faster than the pure-Python one: a file of 1,000
#: sources is read by every task process), else the same rules in Python.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_config(path: str | os.PathLike | None = None) -> Config:
    """Read, expand and validate the sources file."""
    path = config_path(path)
    try:
        raw = yaml.load(path.read_text(), Loader=_LOADER)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from None
    expansion: list[str] = []
    raw = _expand(raw, "", expansion)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level: must be a mapping, got {type(raw).__name__}")
    warehouse_env, master_env = os.environ.get("RECLOCK_WAREHOUSE"), os.environ.get("RECLOCK_SPARK_MASTER")
    raw = {**raw, **({"warehouse": warehouse_env} if warehouse_env else {})}
    if master_env and isinstance(raw.get("spark") or {}, dict):
        raw["spark"] = {**(raw.get("spark") or {}), "master": master_env}
    remote_env = os.environ.get("RECLOCK_SPARK_REMOTE")
    if remote_env is not None and isinstance(raw.get("spark") or {}, dict):  # set but empty: no server
        raw["spark"] = {**(raw.get("spark") or {}), "remote": remote_env or None}
    problems: list[tuple[tuple, str, str]] = []
    try:
        kinds = [entry.get("kind") for entry in raw.get("sources") or [] if isinstance(entry, dict)]
        parsed = sources_file_model(k for k in kinds if isinstance(k, str)).model_validate(raw)
    except ValidationError as e:
        parsed = None
        problems = explain(e, raw)
    warehouse = raw.get("warehouse")
    if isinstance(warehouse, str) and warehouse.strip() and "://" not in warehouse:
        warehouse = str(((Path.cwd() if warehouse_env else path.parent.parent) / warehouse).resolve())
        if Path(warehouse).exists() and not Path(warehouse).is_dir():
            problems.append((walk(("warehouse",), raw)[1], "warehouse", f"{warehouse} is a file, not a directory"))
    lines = [f"{path}: {where}" for where in expansion] + [f"{path}: {where}: {message}"
                                                            for _, where, message in sorted(problems, key=order)]
    if lines:
        raise ConfigError("\n".join(lines), lines)
    return Config(warehouse=warehouse, storage_options=_strings(parsed.storage_options),
                  spark_master=parsed.spark.master, spark_conf=_strings(parsed.spark.conf),
                  sources={s.name: s for s in parsed.sources}, path=path,
                  transactions={t.name: t for t in parsed.transactions}, spark_remote=parsed.spark.remote)


def _expand(value: Any, where: str, problems: list[str]) -> Any:
    """Expand ``${VAR}`` and ``${VAR:-default}`` in every string inside ``value`` (an unset
    variable without a default is a problem ``<where>: ...``, and stays unexpanded)."""
    if isinstance(value, dict):
        return {k: _expand(v, f"{where}.{k}" if where else str(k), problems) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{where}[{i}]", problems) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        var, default = m.group(1), m.group(2)
        if var in os.environ:
            return os.environ[var]
        if default is None:
            problems.append(f"{where}: environment variable {var} is not set (use ${{{var}:-default}})")
            return m.group(0)
        return default

    return _VAR_RE.sub(sub, value)



def _strings(mapping: dict) -> dict[str, str]:
    """Spark conf and deltalake storage options take strings; YAML booleans become ``true``/``false``."""
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in mapping.items()}


__all__ = ["ASSETS", "DEFAULT_PATH", "DEFAULT_RETENTION_MS", "HOUR_MS", "NAME_RE", "SCHEDULE_PRESETS", "Config",
           "ConfigError", "SourceConfig", "SourcesFile", "SparkSettings", "TransactionsConfig", "config_path",
           "config_schema", "config_schema_text", "load_config", "schedule_problem", "sources_file_model",
           "vacuum_retention_problem"]
