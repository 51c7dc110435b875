"""Where a problem of the sources file lies, said as the file says it: pydantic's errors become lines
``<field>: <what is wrong>`` (:func:`explain`), the field naming the entry (``sources[0] (orders).options.topic``),
missing and unknown keys of a mapping one line each (with the closest allowed name), in the order of the file
(:func:`order`); an entry whose name is wrong reports only that.
"""
from __future__ import annotations

import difflib
from typing import Any

from pydantic import ValidationError

from ..sources import source_kind, source_kinds, source_options
from .models import NAME_RE, SourceConfig, SourcesFile, SparkSettings, TransactionsConfig, entry_tag

_ABSENT = object()


def walk(loc: tuple, raw: Any) -> tuple[tuple, tuple]:
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
        elif isinstance(node, dict) and isinstance(key, str) and key == entry_tag(node) and keys[-1:] != ["options"]:
            continue  # the discriminator's tag: sources[i].<kind>.field
        elif (node is _ABSENT or node is None or isinstance(node, dict)) and isinstance(key, str):
            positions.append(len(node) if isinstance(node, dict) else 0)
            node = _ABSENT
        else:
            break  # inside a value: union members, mapping keys
        keys.append(key)
    return tuple(keys), tuple(positions)


def field_of(keys: tuple, raw: Any) -> str:
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


def order(problem: tuple) -> tuple:
    positions, where, message = problem
    return positions, _ORDER_OF.get(message.split(" ", 1)[0], 2)


def explain(error: ValidationError, raw: dict) -> list[tuple[tuple, str, str]]:
    """pydantic's errors as ``(positions, where, message)``; missing and unknown keys of a mapping are one
    problem each; an entry with a wrong name is reported by its name only."""
    plain: list[tuple[tuple, tuple, str]] = []
    missing: dict[tuple, list[tuple[str, tuple]]] = {}
    unknown: dict[tuple, list[tuple[str, tuple]]] = {}
    for err in error.errors():
        keys, positions = walk(err["loc"], raw)
        kind, value = err["type"], err.get("input")
        if kind == "reclock":
            for at, message in err["ctx"]["problems"]:
                plain.append(walk(tuple(err["loc"]) + tuple(at), raw) + (message,))
        elif kind in ("missing", "extra_forbidden") and keys:
            (missing if kind == "missing" else unknown).setdefault(keys[:-1], []).append((str(keys[-1]), positions))
        elif kind in ("union_tag_invalid", "union_tag_not_found", "union_tag_invalid_callable") and isinstance(value, dict):
            plain.append(walk(tuple(err["loc"]) + ("kind",), raw)
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
    return [(positions, field_of(keys, raw), message) for keys, positions, message in plain
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
