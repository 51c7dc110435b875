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

import difflib
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import date, datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, ValidationError,
                      WithJsonSchema, WrapValidator, create_model, model_validator)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from .sources import ON_BAD_RECORD, SourceError, SourceKind, dead_letter_problem, source_kind, source_kinds, source_options

#: The demo's sources file, beside the package in a checkout (``include/sources.yaml``); an installed reclock has
#: none, and is given its file (``--config``, ``$RECLOCK_CONFIG``).
DEFAULT_PATH = Path(__file__).resolve().parents[1] / "sources.yaml"
DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000
HOUR_MS = 3600 * 1000
#: A ``transactions`` schedule: run when every one of its sources has published (their Airflow Assets).
ASSETS = "assets"
#: Airflow's schedule presets (``airflow.sdk.definitions.dag``: @once, @continuous; its CRON_PRESETS: the others).
SCHEDULE_PRESETS = ("@once", "@continuous", "@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly")
NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(ValueError):
    """The sources file is missing, unreadable or invalid; one line per problem, each naming the file and field."""

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = problems or [message]


# --- how a field says what is wrong ------------------------------------------------------------------------------

def _problems(*problems: tuple[tuple, str]) -> PydanticCustomError:
    """A validation error of one or more problems, each ``(where below the failing value, message)``."""
    return PydanticCustomError("reclock", "{problem}", {"problem": "; ".join(m for _, m in problems),
                                                        "problems": list(problems)})


def _says(phrase: str, whole: bool = True) -> WrapValidator:
    """The value's own errors (``whole``: all its errors) become one: ``<phrase>, got <value>``."""
    def check(value, handler):
        try:
            return handler(value)
        except ValidationError as e:
            if whole or all(not err["loc"] for err in e.errors()):
                raise _problems(((), f"{phrase}, got {value!r}")) from None
            raise
    return WrapValidator(check)


def _none_as(empty) -> BeforeValidator:
    """YAML's empty value (``key:``) is the empty mapping or list."""
    return BeforeValidator(lambda value: type(empty)() if value is None else value)


def schedule_problem(schedule: str) -> str | None:
    """Why Airflow would refuse ``schedule`` (not null), or None: presets, else croniter's verdict."""
    if schedule in SCHEDULE_PRESETS:
        return None
    from croniter import croniter

    try:
        croniter(schedule)
    except ValueError as e:  # croniter's errors are ValueErrors
        return (f"not a cron expression ({e}) nor an Airflow preset ({', '.join(SCHEDULE_PRESETS)}) "
                f"nor null, got {schedule!r}")
    return None


def _schedule(value: Any) -> str | None:
    if value is None or value == "None":  # Airflow's schedule=None: manual runs only
        return None
    if not isinstance(value, str) or not value.strip():
        raise _problems(((), f"must be a non-empty string, got {value!r}"))
    if problem := schedule_problem(value):
        raise _problems(((), problem))
    return value


def _start_date(value: Any) -> datetime | None:
    """A date, datetime or ISO string as a timezone-aware (UTC unless given) datetime."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise _problems(((), f"must be an ISO date or datetime, got {value!r}")) from None
    if isinstance(value, date) and not isinstance(value, datetime):
        value = datetime(value.year, value.month, value.day)
    if not isinstance(value, datetime):
        raise _problems(((), f"must be an ISO date or datetime, got {value!r}"))
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def vacuum_retention_problem(hours: float, retention_ms: int, force: bool) -> str | None:
    """Why VACUUM may not keep files ``hours`` hours for an AS OF window of ``retention_ms``, or None."""
    if round(hours * HOUR_MS) < retention_ms and not force:  # in whole ms, as retention_ms: hours = ms / HOUR_MS rounds
        return (f"{hours:g} h is below the AS OF window (retention_ms {retention_ms} = {retention_ms / HOUR_MS:g} h): "
                f"a read of a table version that compaction replaced would lose its files; "
                f"set force_vacuum: true to vacuum sooner anyway")
    return None


_NonEmpty = Annotated[str, Field(pattern=r"\S"), _says("must be a non-empty string")]
_Name = Annotated[str, Field(pattern=NAME_RE.pattern, description="[a-z][a-z0-9_]*, unique"),
                  _says("must match [a-z][a-z0-9_]*")]
_Scalar = Annotated[Union[str, int, float, bool], _says("must be a string, number or boolean")]
_Schedule = Annotated[Union[str, None], BeforeValidator(_schedule), Field(
    description="null or \"None\" (manual runs only), an Airflow preset (" + ", ".join(SCHEDULE_PRESETS)
                + ") or a cron expression")]
_DATE_SCHEMA = {"anyOf": [{"type": "string", "format": "date"}, {"type": "string", "format": "date-time"},
                          {"type": "null"}], "description": "ISO date or datetime (UTC unless it says)"}
_StartDate = Annotated[Union[datetime, None], BeforeValidator(_start_date), WithJsonSchema(_DATE_SCHEMA)]


def _no_default(schema: dict) -> None:
    """A field the file must give (unless overridden): its schema says no default."""
    schema.pop("default", None)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# --- the models --------------------------------------------------------------------------------------------------

class SparkSettings(_Model):
    """``spark:``: the master and Spark conf of every step's session (``RECLOCK_SPARK_MASTER`` overrides the master)."""

    master: _NonEmpty = Field("local[2]", description="local[N], spark://host:7077, yarn, k8s://https://host:443")
    conf: Annotated[dict[str, _Scalar], _none_as({}), _says("must be a mapping", whole=False)] = {}
    remote: Annotated[str | None, Field(pattern=r"^sc://\S+$"),
                      _says("a Spark Connect URL is sc://host:port")] = Field(None, description=(
        "a long-lived Spark Connect server (sc://host:port) every step uses instead of a session of its own; "
        "RECLOCK_SPARK_REMOTE overrides it (empty: none)"))


class SourceConfig(_Model):
    """A ``sources`` entry; one subclass per kind (:func:`sources_file_model`) types its ``options``."""

    name: _Name
    kind: str
    schedule: _Schedule = None
    start_date: _StartDate = None
    retention_ms: Annotated[int, Field(gt=0, description="the AS OF window compaction keeps, in ms"),
                            _says("must be a positive integer (ms)")] = DEFAULT_RETENTION_MS
    #: How long VACUUM keeps files compaction replaced (default: the AS OF window, ``retention_ms``).
    vacuum_retention_hours: Annotated[float, Field(ge=0, description="how long VACUUM keeps files compaction "
                                                   "replaced (default: the AS OF window)"),
                                      _says("must be a number of hours >= 0")] = DEFAULT_RETENTION_MS / HOUR_MS
    force_vacuum: Annotated[bool, Field(description="allow vacuum_retention_hours below the AS OF window"),
                            _says("must be true or false")] = False
    #: What staging does with a record it cannot decode: ``fail`` or ``dead_letter`` (:data:`ON_BAD_RECORD`).
    on_bad_record: Annotated[Literal[ON_BAD_RECORD], _says(f"must be one of {', '.join(ON_BAD_RECORD)}")] = "fail"
    #: The kind's constructor keyword arguments, as given (validated by the kind's options model); without the
    #: ones a ``connection`` gives (:func:`reclock.connections.resolved_options` adds them when a step runs).
    options: dict[str, Any] = {}
    #: An Airflow connection id instead of the address options (kinds with a ``connection_type``).
    connection: SkipJsonSchema[Annotated[None, _says("only kinds with an Airflow connection type take a connection ("
                                                     + ", ".join(k for k in source_kinds()
                                                                 if source_kind(k).connection_type) + ")")]] = None

    @model_validator(mode="before")
    @classmethod
    def _vacuum_default(cls, data: Any) -> Any:
        retention = data.get("retention_ms", DEFAULT_RETENTION_MS) if isinstance(data, dict) else None
        if isinstance(retention, int) and not isinstance(retention, bool) and "vacuum_retention_hours" not in data:
            return {**data, "vacuum_retention_hours": retention / HOUR_MS}
        return data

    @model_validator(mode="after")
    def _together(self) -> SourceConfig:
        problems = []
        if problem := vacuum_retention_problem(self.vacuum_retention_hours, self.retention_ms, self.force_vacuum):
            problems.append((("vacuum_retention_hours",), problem))
        if self.on_bad_record == "dead_letter" and (problem := dead_letter_problem(self.kind, self.options)):
            problems.append((("on_bad_record",), f"dead_letter: {problem}"))
        if problems:
            raise _problems(*problems)
        return self

    @property
    def offsets_unique(self) -> bool:
        return source_kind(self.kind).offsets_unique

    def __reduce__(self):
        """Pickled as its kind and fields: the per-kind classes are made at run time (:func:`_source_model`)."""
        return _restore_source, (self.kind, dict(self))


def _restore_source(kind: str, fields: dict) -> SourceConfig:
    return _source_model(source_kind(kind), fields.get("connection") is not None).model_construct(**fields)


class TransactionsConfig(_Model):
    """Debezium-style transactions over two configured Kafka sources (``reclock.transactions``)."""

    name: _Name
    data_source: str = Field(description="the configured kafka source of the data topic")
    tx_source: str = Field(description="the configured kafka source of the transaction topic")
    schedule: Annotated[Union[str, None], BeforeValidator(lambda v: v if v == ASSETS else _schedule(v)), Field(
        description="assets (when both sources have published), null, an Airflow preset or a cron expression")
    ] = ASSETS
    start_date: _StartDate = None


class SourcesFile(_Model):
    """The sources file as written (a subclass per registry, :func:`sources_file_model`, types ``sources``)."""

    model_config = ConfigDict(title="reclock sources file")
    warehouse: _NonEmpty = Field(None, validate_default=True, json_schema_extra=_no_default, description=(
        "a local directory (relative: to the parent of the file's directory) or a URI such as s3://bucket/prefix; "
        "RECLOCK_WAREHOUSE overrides it"))
    storage_options: Annotated[dict[str, _Scalar], _none_as({}), _says("must be a mapping", whole=False),
                               Field(description="deltalake storage options (S3 endpoint, credentials)")] = {}
    spark: Annotated[SparkSettings, _none_as({})] = SparkSettings()
    sources: list[SourceConfig]
    transactions: Annotated[list[TransactionsConfig], _none_as([])] = []

    @model_validator(mode="after")
    def _names(self) -> SourcesFile:
        problems = _duplicates(self.sources, "sources", "source") + _duplicates(self.transactions, "transactions",
                                                                                 "transactions")
        by_name = {s.name: s for s in self.sources}
        for i, txn in enumerate(self.transactions):
            for key in ("data_source", "tx_source"):
                source = by_name.get(getattr(txn, key))
                if source is None:
                    problems.append((("transactions", i, key), f"must name a configured source, got "
                                                               f"{getattr(txn, key)!r}"))
                elif source.kind != "kafka":
                    problems.append((("transactions", i, key), f"must be a kafka source, {source.name} is "
                                                               f"{source.kind}"))
        if problems:
            raise _problems(*problems)
        return self


def _duplicates(entries: list, key: str, what: str) -> list[tuple[tuple, str]]:
    seen: set[str] = set()
    problems = []
    for i, entry in enumerate(entries):
        if entry.name in seen:
            problems.append(((key, i, "name"), f"duplicate {what} name {entry.name!r}"))
        seen.add(entry.name)
    return problems


class Config(BaseModel):
    """The loaded file: what every step asks (warehouse resolved, overrides applied, sources by name)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    warehouse: str
    storage_options: dict[str, str]
    spark_master: str
    spark_conf: dict[str, str]
    sources: dict[str, SourceConfig]
    path: Path
    transactions: dict[str, TransactionsConfig] = {}
    #: ``spark.remote``: a Spark Connect server (``sc://host:port``) every step uses instead of a session of its own
    spark_remote: str | None = None

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


# --- models of the registered kinds ------------------------------------------------------------------------------

_ANNOTATION_NAMES = {"str": str, "int": int, "float": float, "bool": bool, "None": None, "dict": dict, "list": list,
                     "Mapping": Mapping, "Sequence": Sequence, "Any": Any}


def _annotation_type(annotation: Any) -> Any:
    """The type an option annotation (a string under ``from __future__ import annotations``) names, else Any:
    only the names of :data:`_ANNOTATION_NAMES` are read, an option annotated otherwise is not checked."""
    if not isinstance(annotation, str):
        return annotation if annotation in _ANNOTATION_NAMES.values() and annotation is not None else Any
    try:
        return eval(annotation, {"__builtins__": {}}, dict(_ANNOTATION_NAMES))  # noqa: S307 - names above only
    except Exception:  # noqa: BLE001 - any other name: unchecked
        return Any


def _numeric(tp: Any) -> bool:
    return tp in (int, float) or any(_numeric(a) for a in getattr(tp, "__args__", ()) if a in (int, float))


def _option_range(name: str) -> WrapValidator:
    """Numbers are ``>= 0``; durations in seconds (``*_s``) ``> 0``; booleans are not numbers."""
    def check(value, handler):
        handler(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if name.endswith("_s") and not value > 0:
                raise _problems(((), f"must be > 0 (seconds), got {value!r}"))
            if value < 0:
                raise _problems(((), f"must be >= 0, got {value!r}"))
        return value
    return WrapValidator(check)


def _required(value):
    if value in (None, ""):
        raise PydanticCustomError("missing", "Field required")
    return value


def _json_default(value: Any) -> Any:
    try:
        json.dumps(value)
    except TypeError:
        return None
    return list(value) if isinstance(value, tuple) else value


def _options_model(kind: SourceKind, connection: bool = False) -> type[BaseModel]:
    """The options of ``kind``: its constructor's parameters, typed by their annotations; ``required_options``
    must be given and non-empty.  A kind taking ``**kwargs`` takes any option.  With a ``connection``, the
    options it gives (``connection_options``) are not the file's."""
    params = source_options(kind.name)
    fields: dict[str, Any] = {}
    for name, p in (params or {}).items():
        if connection and name in kind.connection_options:
            continue
        text = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
        tp = _annotation_type(p.annotation)
        metadata: list[Any] = [] if tp is Any else [_says(f"must be {text}")]
        extra = {}
        if _numeric(tp):
            metadata.append(_option_range(name))
            extra = {"exclusiveMinimum": 0} if name.endswith("_s") else {"minimum": 0}
        if name in kind.required_options:
            fields[name] = (Annotated[(tp, *metadata, BeforeValidator(_required))], Field(json_schema_extra=extra))
        else:
            default = None if p.default is p.empty else _json_default(p.default)
            fields[name] = (Annotated[(tp, *metadata)] if metadata else tp, Field(default, json_schema_extra=extra))
    for name in kind.required_options:
        if not (connection and name in kind.connection_options):
            fields.setdefault(name, (Annotated[Any, BeforeValidator(_required)], ...))
    suffix = "ConnectionOptions" if connection else "Options"
    model = create_model(f"{_camel(kind.name)}{suffix}", __config__=ConfigDict(
        extra="forbid" if params is not None else "allow", strict=True, frozen=True,
        title=f"options of kind {kind.name}" + (" with a connection" if connection else "")), **fields)
    return model


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", name))


def _as_given(value, handler):
    """The options as given (after ``${VAR}`` expansion), once their model accepts them."""
    handler(value)
    return dict(value)


@lru_cache(maxsize=64)
def _source_model(kind: SourceKind, connection: bool = False) -> type[SourceConfig]:
    """The entry of ``kind``; with ``connection``, the entry naming an Airflow connection instead of the
    connection's options (:data:`reclock.sources.SourceKind.connection_options`)."""
    try:
        options: Any = Annotated[_options_model(kind, connection), WrapValidator(_as_given), _none_as({})]
    except SourceError as e:
        problem = f"cannot read the options of kind {kind.name}: {e}"
        options = Annotated[dict[str, Any], BeforeValidator(lambda v: (_ for _ in ()).throw(_problems(((), problem))))]
    fields: dict[str, Any] = {}
    if connection:
        fields["connection"] = (Annotated[str, Field(pattern=r"\S", description=(
            f"an Airflow connection id of type {kind.connection_type}, instead of "
            f"{', '.join(kind.connection_options)}")), _says("must be a non-empty string (an Airflow connection id)")],
            ...)
    return create_model(f"{_camel(kind.name)}{'Connection' if connection else ''}Source", __base__=SourceConfig,
                        kind=(Literal[kind.name], ...),
                        options=(options, Field(default_factory=dict, validate_default=True)), **fields)


def _tag(entry: Any) -> str | None:
    """The entry's model: its kind, ``<kind>+connection`` when it names a connection and its kind takes one."""
    if isinstance(entry, SourceConfig):
        kind, connection = entry.kind, entry.connection
    elif isinstance(entry, dict):
        kind, connection = entry.get("kind"), entry.get("connection")
    else:
        return None
    registered = source_kind(kind)
    if registered is not None and registered.connection_type and connection is not None:
        return f"{kind}+connection"
    return None if kind is None else str(kind)


@lru_cache(maxsize=8)
def _file_model(kinds: tuple[SourceKind, ...]) -> type[SourcesFile]:
    entries = [Annotated[_source_model(kind, False), Tag(kind.name)] for kind in kinds]
    entries += [Annotated[_source_model(kind, True), Tag(f"{kind.name}+connection")] for kind in kinds
                if kind.connection_type]
    entry = Annotated[Union[tuple(entries)], Discriminator(_tag)]
    return create_model("SourcesFile", __base__=SourcesFile,
                        sources=(Annotated[list[entry], Field(min_length=1),
                                           _says("must be a non-empty list of sources", whole=False)], ...))


def sources_file_model(kinds: Iterable[str] | None = None) -> type[SourcesFile]:
    """The model of the sources file for the kinds registered now, or for those of ``kinds`` (the kinds a file
    uses: building a kind's model imports its module, and DAG files load the config); built once each."""
    wanted = None if kinds is None else set(kinds)
    known = [k for k in source_kinds() if wanted is None or k in wanted] or source_kinds()[:1]
    return _file_model(tuple(source_kind(k) for k in known))


def config_schema() -> dict:
    """The JSON schema of the sources file (``docs/sources.schema.json``, ``reclock config-schema``)."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **sources_file_model().model_json_schema()}


def config_schema_text() -> str:
    return json.dumps(config_schema(), indent=2) + "\n"


# --- loading -----------------------------------------------------------------------------------------------------

def config_path(path: str | os.PathLike | None = None) -> Path:
    """The file to read: ``path``, else ``$RECLOCK_CONFIG``, else ``include/sources.yaml`` of a checkout."""
    given = path or os.environ.get("RECLOCK_CONFIG")
    if not given and not DEFAULT_PATH.exists():
        raise ConfigError("no sources file: give one with --config or $RECLOCK_CONFIG (an installed reclock has no "
                          "default file)")
    return Path(given or DEFAULT_PATH).resolve()


def load_config(path: str | os.PathLike | None = None) -> Config:
    """Read, expand and validate the sources file."""
    path = config_path(path)
    try:
        raw = yaml.safe_load(path.read_text())
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
        problems = _explain(e, raw)
    warehouse = raw.get("warehouse")
    if isinstance(warehouse, str) and warehouse.strip() and "://" not in warehouse:
        warehouse = str(((Path.cwd() if warehouse_env else path.parent.parent) / warehouse).resolve())
        if Path(warehouse).exists() and not Path(warehouse).is_dir():
            problems.append((_walk(("warehouse",), raw)[1], "warehouse", f"{warehouse} is a file, not a directory"))
    lines = [f"{path}: {where}" for where in expansion] + [f"{path}: {where}: {message}"
                                                            for _, where, message in sorted(problems, key=_order)]
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


_ABSENT = object()


def _walk(loc: tuple, raw: Any) -> tuple[tuple, tuple]:
    """pydantic's error location as the file's keys, and their positions in the file (to sort problems as the
    file has them): the discriminator tag and union member names are left out, absent keys kept (last)."""
    node, keys, positions = raw, [], []
    for key in loc:
        if isinstance(node, dict) and key in node:
            positions.append(list(node).index(key))
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
            positions.append(key)
            node = node[key]
        elif isinstance(node, dict) and isinstance(key, str) and key == _tag(node) and keys[-1:] != ["options"]:
            continue  # the discriminator's tag: sources[i].<kind>.field
        elif (node is _ABSENT or node is None or isinstance(node, dict)) and isinstance(key, str):
            positions.append(len(node) if isinstance(node, dict) else 0)
            node = _ABSENT
        else:
            break  # inside a value: union members, mapping keys
        keys.append(key)
    return tuple(keys), tuple(positions)


def _where(keys: tuple, raw: Any) -> str:
    """``sources[0] (orders).options.topic``: the entry named when its name is right."""
    text = ""
    for i, key in enumerate(keys):
        text += f"[{key}]" if isinstance(key, int) else f".{key}" if text else str(key)
        if i == 1 and keys[0] in ("sources", "transactions"):
            name = _get(raw, keys[:2] + ("name",))
            if isinstance(name, str) and NAME_RE.match(name):
                text += f" ({name})"
    return text or "top level"


def _get(raw: Any, keys: tuple) -> Any:
    for key in keys:
        try:
            raw = raw[key]
        except (KeyError, IndexError, TypeError):
            return None
    return raw


_ORDER_OF = {"missing": 0, "unknown": 1}


def _order(problem: tuple) -> tuple:
    positions, where, message = problem
    return positions, _ORDER_OF.get(message.split(" ", 1)[0], 2)


def _explain(error: ValidationError, raw: dict) -> list[tuple[tuple, str, str]]:
    """pydantic's errors as ``(positions, where, message)``; missing and unknown keys of a mapping are one
    problem each; an entry with a wrong name is reported by its name only."""
    plain: list[tuple[tuple, tuple, str]] = []
    missing: dict[tuple, list[tuple[str, tuple]]] = {}
    unknown: dict[tuple, list[tuple[str, tuple]]] = {}
    for err in error.errors():
        keys, positions = _walk(err["loc"], raw)
        kind, value = err["type"], err.get("input")
        if kind == "reclock":
            for at, message in err["ctx"]["problems"]:
                plain.append(_walk(tuple(err["loc"]) + tuple(at), raw) + (message,))
        elif kind in ("missing", "extra_forbidden") and keys:
            (missing if kind == "missing" else unknown).setdefault(keys[:-1], []).append((str(keys[-1]), positions))
        elif kind in ("union_tag_invalid", "union_tag_not_found", "union_tag_invalid_callable") and isinstance(value, dict):
            plain.append(_walk(tuple(err["loc"]) + ("kind",), raw)
                         + (f"unknown kind {value.get('kind')!r} (known: {', '.join(source_kinds())})",))
        elif kind in ("dict_type", "model_type", "model_attributes_type", "union_tag_not_found"):
            plain.append((keys, positions, f"must be a mapping, got {type(value).__name__}"))
        elif kind == "list_type":
            plain.append((keys, positions, f"must be a list, got {type(value).__name__}"))
        else:
            plain.append((keys, positions, err["msg"]))
    for parent, names in missing.items():
        plain.append((parent, names[0][1][:-1], _missing(parent, [n for n, _ in names], raw)))
    for parent, names in unknown.items():
        plain += [(parent, names[0][1][:-1], line) for line in _unknown(parent, [n for n, _ in names], raw)]
    bad_names = {keys[:2] for keys, _, _ in plain if len(keys) == 3 and keys[2] == "name"}
    return [(positions, _where(keys, raw), message) for keys, positions, message in plain
            if not (keys[:2] in bad_names and keys[2:] != ("name",))]


def _missing(parent: tuple, names: list[str], raw: dict) -> str:
    if parent[-1:] == ("options",) and (kind := source_kind(_get(raw, parent[:2] + ("kind",)))):
        names = sorted(names, key=lambda n: (kind.required_options + (n,)).index(n))
        return f"missing required option(s) for kind {kind.name}: {', '.join(names)}"
    return f"missing required key(s) {', '.join(names)}"


def _unknown(parent: tuple, names: list[str], raw: dict) -> list[str]:
    if parent[-1:] == ("options",) and (kind := source_kind(_get(raw, parent[:2] + ("kind",)))):
        lines = []
        if (connection := _get(raw, parent[:2] + ("connection",))) is not None:
            if given := [n for n in names if n in kind.connection_options]:
                lines.append(f"{', '.join(given)} and connection {connection!r} are given together: the connection "
                             f"gives {', '.join(kind.connection_options)}; say one or the other")
            names = [n for n in names if n not in kind.connection_options]
        allowed = [o for o in source_options(kind.name) or () if connection is None or o not in kind.connection_options]
        if names:
            suggested = ", ".join(_suggest(n, allowed) for n in names)
            lines.append(f"unknown option(s) for kind {kind.name}: {suggested} (allowed: {', '.join(allowed)})")
        return lines
    model = {(): SourcesFile, ("spark",): SparkSettings}.get(parent) or (
        SourceConfig if parent[:1] == ("sources",) else TransactionsConfig)
    return [f"unknown key(s) {', '.join(sorted(names))} (allowed: {', '.join(sorted(model.model_fields))})"]


def _suggest(option: str, known) -> str:
    """``option``, with the closest known name when there is one: ``startng_offsets (did you mean starting_offsets?)``."""
    close = difflib.get_close_matches(option, list(known), n=1)
    return f"{option} (did you mean {close[0]}?)" if close else option


def _strings(mapping: dict) -> dict[str, str]:
    """Spark conf and deltalake storage options take strings; YAML booleans become ``true``/``false``."""
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in mapping.items()}


__all__ = ["ASSETS", "Config", "ConfigError", "SourceConfig", "SourcesFile", "SparkSettings", "TransactionsConfig",
           "config_path", "config_schema", "load_config", "schedule_problem", "sources_file_model",
           "vacuum_retention_problem"]
