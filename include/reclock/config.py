"""The sources file: where the warehouse is, which Spark master to use, and which sources to reclock.

``load_config(path)`` reads YAML (default: ``$RECLOCK_CONFIG`` or ``include/sources.yaml``),
expands ``${VAR}`` / ``${VAR:-default}`` in string values, applies the
``RECLOCK_WAREHOUSE``, ``RECLOCK_SPARK_MASTER`` and ``RECLOCK_SPARK_REMOTE`` overrides and validates the whole file
before anything runs: every problem is one line ``<file>: <field>: <what is wrong>`` (the field
names the entry, e.g. ``sources[0] (orders).options.topic``), and :class:`ConfigError` carries
them all (``.problems``), not just the first.

A relative ``warehouse`` in the file is resolved against the parent of the
file's directory (the repo root for ``include/sources.yaml``); a relative
``RECLOCK_WAREHOUSE`` against the working directory.  URIs (``s3://...``) are
kept as they are; a local warehouse must not be an existing file.

What is checked, besides the keys each mapping may have:

* ``kind`` and its options come from the source registry (:func:`reclock.sources.register_source`
  adds a kind): the required options must be given, and every option must be a parameter of the
  kind's constructor (:func:`reclock.sources.source_options`), so a misspelt ``startng_offsets``
  is refused.  Client properties go through the kind's own option for them (Kafka: ``config``,
  a mapping of librdkafka properties).  An option annotated ``str``, ``int``, ``float``, ``bool``,
  ``None``, a mapping or a sequence (or a union of those) must have such a value; a number
  must be ``>= 0``, a duration in seconds (``*_s``) ``> 0``.
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
"""
from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from .sources import ON_BAD_RECORD, SourceError, dead_letter_problem, source_kind, source_kinds, source_options

DEFAULT_PATH = Path(__file__).resolve().parents[1] / "sources.yaml"
DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000
HOUR_MS = 3600 * 1000
#: A ``transactions`` schedule: run when every one of its sources has published (their Airflow Assets).
ASSETS = "assets"
#: Airflow's schedule presets (``airflow.sdk.definitions.dag``: @once, @continuous; its CRON_PRESETS: the others).
SCHEDULE_PRESETS = ("@once", "@continuous", "@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly")
NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")

_TOP_KEYS = {"warehouse", "storage_options", "spark", "sources", "transactions"}
_SPARK_KEYS = {"master", "conf", "remote"}
_SOURCE_KEYS = {"name", "kind", "schedule", "start_date", "retention_ms", "vacuum_retention_hours", "force_vacuum",
                "on_bad_record", "options"}
_TRANSACTIONS_KEYS = {"name", "data_source", "tx_source", "schedule", "start_date"}


class ConfigError(ValueError):
    """The sources file is missing, unreadable or invalid; one line per problem, each naming the file and field."""

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = problems or [message]


@dataclass(frozen=True)
class SourceConfig:
    name: str
    kind: str
    schedule: str | None = None
    start_date: datetime | None = None
    retention_ms: int = DEFAULT_RETENTION_MS
    options: dict[str, Any] = field(default_factory=dict)
    #: How long VACUUM keeps files compaction replaced (default: the AS OF window, ``retention_ms``).
    vacuum_retention_hours: float = DEFAULT_RETENTION_MS / HOUR_MS
    #: What staging does with a record it cannot decode: ``fail`` or ``dead_letter`` (:data:`ON_BAD_RECORD`).
    on_bad_record: str = "fail"

    @property
    def offsets_unique(self) -> bool:
        return source_kind(self.kind).offsets_unique


@dataclass(frozen=True)
class TransactionsConfig:
    """Debezium-style transactions over two configured Kafka sources (``reclock.transactions``)."""

    name: str
    data_source: str
    tx_source: str
    schedule: str | None = None  # or ASSETS: when both sources have published
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
    """Validation helpers that prefix every problem with the file and the field.

    ``fail`` makes the error that stops checking a value; ``attempt`` turns it into a noted
    problem so that checking goes on, and ``load_config`` raises them all together.
    """

    def __init__(self, path: Path):
        self.path = path
        self.problems: list[str] = []

    def fail(self, where: str, message: str) -> ConfigError:
        return ConfigError(f"{self.path}: {where}: {message}")

    def note(self, where: str, message: str) -> None:
        self.problems.append(str(self.fail(where, message)))

    def attempt(self, check, *args, default: Any = None) -> Any:
        """``check(*args)``, or ``default`` with its :class:`ConfigError` noted as a problem."""
        try:
            return check(*args)
        except ConfigError as e:
            self.problems.append(str(e))
            return default

    def mapping(self, value: Any, where: str, allowed: set[str] | None = None) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(where, f"must be a mapping, got {type(value).__name__}")
        if allowed is not None and (unknown := sorted(map(str, set(value) - allowed))):
            self.note(where, f"unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})")
        return value

    def string(self, value: Any, where: str, optional: bool = False) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.fail(where, f"must be a non-empty string, got {value!r}")
        return value

    def expand(self, value: Any, where: str) -> Any:
        """Expand ``${VAR}`` and ``${VAR:-default}`` in every string inside ``value`` (an unset
        variable without a default is a problem, and stays unexpanded)."""
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
                self.note(where, f"environment variable {var} is not set (use ${{{var}:-default}})")
                return m.group(0)
            return default

        return _VAR_RE.sub(sub, value)


def _parse(r: _Reader, raw: Any) -> Config:
    top = r.mapping(r.expand(raw, ""), "top level", _TOP_KEYS)
    spark = r.attempt(r.mapping, top.get("spark"), "spark", _SPARK_KEYS, default={})
    overridden = os.environ.get("RECLOCK_WAREHOUSE")
    warehouse = overridden or r.attempt(r.string, top.get("warehouse"), "warehouse")
    base = Path.cwd() if overridden else r.path.parent.parent
    if warehouse is not None and "://" not in warehouse:
        warehouse = str((base / warehouse).resolve())
        if Path(warehouse).exists() and not Path(warehouse).is_dir():
            r.note("warehouse", f"{warehouse} is a file, not a directory")
    entries = top.get("sources")
    if not isinstance(entries, list) or not entries:
        r.note("sources", "must be a non-empty list of sources")
        entries = []
    sources = _named_entries(r, entries, "sources", "source", _parse_source)
    transactions = _named_entries(r, top.get("transactions") or [], "transactions", "transactions",
                                  lambda r, entry, where: _parse_transactions(r, entry, where, sources))
    config = Config(
        warehouse=warehouse,
        storage_options=_strings(r.attempt(r.mapping, top.get("storage_options"), "storage_options", default={})),
        spark_master=os.environ.get("RECLOCK_SPARK_MASTER")
        or r.attempt(r.string, spark.get("master", "local[2]"), "spark.master"),
        spark_conf=_strings(r.attempt(r.mapping, spark.get("conf"), "spark.conf", default={})),
        sources=sources,
        path=r.path,
        transactions=transactions,
        spark_remote=_spark_remote(r, spark),
    )
    if r.problems:
        raise ConfigError("\n".join(r.problems), r.problems)
    return config


def _spark_remote(r: _Reader, spark: dict) -> str | None:
    """``spark.remote`` (``$RECLOCK_SPARK_REMOTE`` wins; an empty one means none): a Spark Connect URL."""
    remote = os.environ.get("RECLOCK_SPARK_REMOTE")
    if remote is None and spark.get("remote") is not None:
        remote = r.attempt(r.string, spark.get("remote"), "spark.remote")
    if remote and not remote.startswith("sc://"):
        r.note("spark.remote", f"a Spark Connect URL is sc://host:port, got {remote!r}")
    return remote or None


def _named_entries(r: _Reader, entries: list, key: str, what: str, parse) -> dict:
    """``{name: parse(r, entry, where)}`` of a list of named entries; duplicate names are refused.

    An entry that cannot be read at all (not a mapping, a bad name) is noted and left out."""
    if not isinstance(entries, list):
        r.note(key, f"must be a list, got {type(entries).__name__}")
        return {}
    parsed: dict = {}
    for i, entry in enumerate(entries):
        item = r.attempt(parse, r, entry, f"{key}[{i}]")
        if item is None:
            continue
        if item.name in parsed:
            r.note(f"{key}[{i}].name", f"duplicate {what} name {item.name!r}")
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
            r.note(f"{where}.{key}", f"must name a configured source, got {entry.get(key)!r}")
        elif source.kind != "kafka":
            r.note(f"{where}.{key}", f"must be a kafka source, {source.name} is {source.kind}")
    schedule = entry.get("schedule", ASSETS)
    return TransactionsConfig(name, entry.get("data_source"), entry.get("tx_source"),
                              ASSETS if schedule == ASSETS else r.attempt(_schedule, r, schedule, f"{where}.schedule"),
                              r.attempt(_start_date, r, entry.get("start_date"), f"{where}.start_date"))


def _parse_source(r: _Reader, entry: Any, where: str) -> SourceConfig:
    entry = r.mapping(entry, where, _SOURCE_KEYS)
    name = _name(r, entry, where)
    where = f"{where} ({name})"
    kind = entry.get("kind")
    if source_kind(kind) is None:
        r.note(f"{where}.kind", f"unknown kind {kind!r} (known: {', '.join(source_kinds())})")
    options = r.attempt(r.mapping, entry.get("options"), f"{where}.options", default={})
    if source_kind(kind) is not None:
        r.attempt(_check_options, r, kind, options, f"{where}.options")
    retention = entry.get("retention_ms", DEFAULT_RETENTION_MS)
    if isinstance(retention, bool) or not isinstance(retention, int) or retention <= 0:
        r.note(f"{where}.retention_ms", f"must be a positive integer (ms), got {retention!r}")
        retention = DEFAULT_RETENTION_MS
    return SourceConfig(
        name=name,
        kind=kind,
        schedule=r.attempt(_schedule, r, entry.get("schedule"), f"{where}.schedule"),
        start_date=r.attempt(_start_date, r, entry.get("start_date"), f"{where}.start_date"),
        retention_ms=retention,
        options=dict(options),
        vacuum_retention_hours=r.attempt(_vacuum_retention_hours, r, entry, retention, where, default=0.0),
        on_bad_record=r.attempt(_on_bad_record, r, entry.get("on_bad_record", "fail"), kind, options,
                                f"{where}.on_bad_record", default="fail"),
    )


def _check_options(r: _Reader, kind: str, options: dict, where: str) -> None:
    """Note every missing required option, unknown option and option of the wrong type or range."""
    if missing := [o for o in source_kind(kind).required_options if options.get(o) in (None, "")]:
        r.note(where, f"missing required option(s) for kind {kind}: {', '.join(missing)}")
    try:
        known = source_options(kind)
    except SourceError as e:
        raise r.fail(where, f"cannot read the options of kind {kind}: {e}") from None
    if known is None:  # the kind takes any keyword
        return
    if unknown := [str(o) for o in options if o not in known]:
        r.note(where, f"unknown option(s) for kind {kind}: {', '.join(_suggest(o, known) for o in unknown)} "
                      f"(allowed: {', '.join(known)})")
    for option, value in options.items():
        if option in known and (problem := option_problem(option, value, known[option].annotation)):
            r.note(f"{where}.{option}", problem)


def _suggest(option: str, known) -> str:
    """``option``, with the closest known name when there is one: ``startng_offsets (did you mean starting_offsets?)``."""
    close = difflib.get_close_matches(option, list(known), n=1)
    return f"{option} (did you mean {close[0]}?)" if close else option


_ANNOTATED_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "None": (type(None),),
    "dict": (dict,), "Mapping": (dict,), "list": (list,), "Sequence": (list,),
}


def option_problem(name: str, value: Any, annotation: Any) -> str | None:
    """Why ``value`` cannot be option ``name`` annotated ``annotation`` (a string, as under
    ``from __future__ import annotations``), or None; None as well for annotations it cannot read.

    The value must be of one of the annotated types (a YAML mapping for ``Mapping``, a list
    for ``Sequence``; booleans are not numbers); a number must be >= 0, and > 0 for ``*_s``."""
    if not isinstance(annotation, str):
        annotation = getattr(annotation, "__name__", "")
    allowed: tuple[type, ...] = ()
    for token in annotation.split("|"):
        types = _ANNOTATED_TYPES.get(token.strip().split("[")[0])
        if types is None:
            return None
        allowed += types
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        return f"must be {annotation}, got {value!r}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if name.endswith("_s") and not value > 0:
            return f"must be > 0 (seconds), got {value!r}"
        if value < 0:
            return f"must be >= 0, got {value!r}"
    return None


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


def _schedule(r: _Reader, value: Any, where: str) -> str | None:
    if value is None or value == "None":  # Airflow's schedule=None: manual runs only
        return None
    schedule = r.string(value, where)
    if problem := schedule_problem(schedule):
        raise r.fail(where, problem)
    return schedule


def vacuum_retention_problem(hours: Any, retention_ms: int, force: bool) -> str | None:
    """Why VACUUM may not keep files ``hours`` hours for an AS OF window of ``retention_ms``, or None."""
    if isinstance(hours, bool) or not isinstance(hours, (int, float)) or hours < 0:
        return f"must be a number of hours >= 0, got {hours!r}"
    if round(hours * HOUR_MS) < retention_ms and not force:  # in whole ms, as retention_ms: hours = ms / HOUR_MS rounds
        return (f"{hours} h is below the AS OF window (retention_ms {retention_ms} = {retention_ms / HOUR_MS:g} h): "
                f"a read of a table version that compaction replaced would lose its files; "
                f"set force_vacuum: true to vacuum sooner anyway")
    return None


def _vacuum_retention_hours(r: _Reader, entry: dict, retention_ms: int, where: str) -> float:
    hours, force = entry.get("vacuum_retention_hours", retention_ms / HOUR_MS), entry.get("force_vacuum", False)
    if not isinstance(force, bool):
        raise r.fail(f"{where}.force_vacuum", f"must be true or false, got {force!r}")
    if problem := vacuum_retention_problem(hours, retention_ms, force):
        raise r.fail(f"{where}.vacuum_retention_hours", problem)
    return float(hours)


def _on_bad_record(r: _Reader, value: Any, kind: str, options: dict, where: str) -> str:
    if value not in ON_BAD_RECORD:
        raise r.fail(where, f"must be one of {', '.join(ON_BAD_RECORD)}, got {value!r}")
    if value == "dead_letter" and source_kind(kind) is not None and (problem := dead_letter_problem(kind, options)):
        raise r.fail(where, f"dead_letter: {problem}")
    return value


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
