"""The sources file as pydantic v2 models: :class:`SparkSettings`, one :class:`SourceConfig` subclass per registered
kind (``kind`` is the discriminator; its ``options`` a model made from the kind's constructor,
:func:`sources_file_model`), :class:`TransactionsConfig`, and :class:`Config`, the loaded file every step asks.  A
field's problem is raised as one ``reclock`` error whose message says what is wrong (:func:`_problems`), which
:mod:`reclock.config.problems` places in the file.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import date, datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, ValidationError,
                      WithJsonSchema, WrapValidator, create_model, model_validator)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from ..sources import ON_BAD_RECORD, SourceError, SourceKind, dead_letter_problem, source_kind, source_kinds, source_options

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


@lru_cache(maxsize=1024)  # a sources file repeats a few schedules over many sources
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


def entry_tag(entry: Any) -> str | None:
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
    entry = Annotated[Union[tuple(entries)], Discriminator(entry_tag)]
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
