"""No secret of a source in any log line or error message reclock writes.

A secret is what a source's options carry to authenticate: the password of a Postgres ``dsn`` (libpq key/value or
URI), and every option or client property whose name says ``password``, ``secret`` or ``token`` (Kafka's
``sasl.password`` and ``ssl.key.password``, Kinesis's ``aws_secret_access_key``, an Airflow connection's password
once it is a ``dsn``), at any depth of the options.  :func:`remember_options` learns them when a source is built
(:func:`reclock.sources.build_source`: in the driver and in every Spark task), and from then on:

* every log record this process creates has each secret replaced by ``***``, in its message with its arguments
  and in its exception's text (the messages of the exception and its causes are masked in place, for formatters
  that render it themselves, as structlog's in Airflow's task logs do): a log record factory, so it holds for every
  logger (reclock's; py4j's at DEBUG, which logs each command it sends the JVM, Spark options included; Airflow's)
  and whatever handler writes it;
* :func:`redact` does the same for text written without logging (``reclock: error: ...``).

A value shorter than :data:`MIN_CHARS` is not treated as a secret (masking it would mask every word it occurs in).
"""
from __future__ import annotations

import logging
import re
import threading
import traceback
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "***"
MIN_CHARS = 4
#: Option and property names whose values are secrets (lowercase substrings).
SECRET_NAMES = ("password", "secret", "token")

_secrets: frozenset[str] = frozenset()
_lock = threading.Lock()
_installed = False
_DSN_PASSWORD = re.compile(r"""password\s*=\s*('(?:[^'\\]|\\.)*'|[^\s']+)""")


def secrets_of(options: Mapping[str, Any]) -> set[str]:
    """The secrets in a source's options (nested mappings included)."""
    found: set[str] = set()
    for key, value in options.items():
        name = str(key).lower()
        if isinstance(value, Mapping):
            found |= secrets_of(value)
        elif isinstance(value, str):
            if name == "dsn":
                found |= _dsn_passwords(value)
            elif any(word in name for word in SECRET_NAMES):
                found.add(value)
    return {s for s in found if len(s) >= MIN_CHARS}


def _dsn_passwords(dsn: str) -> set[str]:
    """The password of a libpq connection string, as given and as libpq reads it (quoted, escaped, in a URI)."""
    found = set()
    for match in _DSN_PASSWORD.finditer(dsn):
        raw = match.group(1)
        found.add(raw)
        if raw.startswith("'"):
            found.add(re.sub(r"\\(.)", r"\1", raw[1:-1]))
    try:
        from psycopg.conninfo import conninfo_to_dict

        if password := conninfo_to_dict(dsn).get("password"):
            found.add(str(password))
    except Exception:  # noqa: BLE001 - not a connection string psycopg reads: the pattern's findings stand
        pass
    return found


def remember_options(options: Mapping[str, Any]) -> None:
    """Learn the secrets of a source's ``options`` (:func:`secrets_of`)."""
    remember(secrets_of(options))


def remember(values: Iterable[str]) -> None:
    """Treat each of ``values`` (of at least :data:`MIN_CHARS`) as a secret in this process from now on."""
    global _secrets
    new = {v for v in values if isinstance(v, str) and len(v) >= MIN_CHARS}
    if new <= _secrets:
        return
    with _lock:
        _secrets = _secrets | new
        _install()


def redact(text: str) -> str:
    """``text`` with every remembered secret replaced by :data:`MASK` (longest first)."""
    for secret in sorted(_secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def _install() -> None:
    """Wrap the process's log record factory (once): each record is scrubbed as it is created."""
    global _installed
    if _installed:
        return
    made = logging.getLogRecordFactory()

    def factory(*args, **kwargs) -> logging.LogRecord:
        record = made(*args, **kwargs)
        _scrub(record)
        return record

    logging.setLogRecordFactory(factory)
    _installed = True


def _scrub(record: logging.LogRecord) -> None:
    if not _secrets:
        return
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a record whose arguments do not format: logging reports it itself
        return
    if (clean := redact(message)) != message:
        record.msg, record.args = clean, ()
    if record.exc_info and record.exc_info[1] is not None:
        _scrub_exception(record.exc_info[1])
        text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        if (clean := redact(text)) != text:
            record.exc_text = clean  # what a Formatter writes for the exception when it is set
    if record.stack_info and (clean := redact(record.stack_info)) != record.stack_info:
        record.stack_info = clean


def _scrub_exception(error: BaseException) -> None:
    """Mask the secrets in the messages (string ``args``) of a logged exception and of those it was raised from or
    during, in place: formatters that render an exception themselves (structlog's, which Airflow's task logs use)
    read them, not the record's ``exc_text``."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        args = tuple(redact(a) if isinstance(a, str) else a for a in error.args)
        if args != error.args:
            try:
                error.args = args
            except (AttributeError, TypeError):  # an exception type whose args cannot be set: exc_text still is
                pass
        error = error.__cause__ or error.__context__
