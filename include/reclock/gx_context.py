"""reclock's Great Expectations Data Context: suites in the repository, stores and Data Docs per source.

The project (``reclock/gx/``, package data) holds ``great_expectations.yml`` and one suite per check kind
(``expectations/<kind>.json``: remap, reclocked, reclocked_keys, dead_letter, history, primary_key), whose
run-time values (the pending window's bounds) are GX suite parameters (``{"$PARAMETER": "remap_upper"}``) given
with each run.  The repository is never written by a run: each source has its own runtime context root::

    root(source) = <warehouse>/<source>/gx          a local warehouse (beside the source's tables)
                 = $RECLOCK_GX_HOME/<source>        otherwise (default <tmp>/reclock-gx/<source>: GX's
                                                    stores are local files)

which :func:`open_context` makes a GX *file* Data Context: ``great_expectations.yml`` copied once from the
project, each suite copied from it again whenever the repository's changed (the repository stays their source
of truth), and per check kind a validation definition and a checkpoint named ``<source>.<kind>`` (saved once,
and again only when stale) on a whole dataframe batch (pandas: every check validates a small frame of aggregates).  A run stores its validation
result in GX's validation results store (``uncommitted/validations/``), and the Data Docs site
(``uncommitted/data_docs/local_site/index.html``) gets the run's page and a new index: after each run, or once
for all the runs of a block :meth:`Context.docs_once` (a check step's runs: GX renders the index, compiling its
templates, once per build, ~0.5 s).  The stores keep the last :data:`KEEP_RUNS` results per suite (older ones,
and their pages, are removed).

A context is per source, so two sources checked at once never write one ``great_expectations.yml``.  Two
processes may check one source at once (a scheduled run beside a manual one): GX writes its stores in place,
so whoever makes the context, runs a checkpoint or builds the Data Docs holds the context's lock (``.lock`` at
its root, an ``fcntl`` lock: a context root is a local directory) and they take turns; a reader of the Data Docs
waits for it (:func:`settled`).  They use the stored
definitions and write them only when missing or stale, and a process that keeps its context (its checkpoints
are cached) makes them again when GX finds what it holds stale (a suite saved by the other meanwhile).  GX writes
its files in place: a run killed meanwhile may leave one half written, so an unreadable config or checkpoint
is made again from the project (the results and Data Docs are only GX's record; reclock's is
:mod:`reclock.check_log`).
GX takes seconds to import (this module imports it only where it is used): a check step's process gets its
context through the validator (:mod:`reclock.validator`), which holds GX imported, and opens one itself only
when no validator serves.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.resources
import json
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

PROJECT = importlib.resources.files("reclock") / "gx"  # package data: the suites and the context's template
CONFIG = "great_expectations.yml"
SUITES = "expectations"
SITE = "local_site"
DOCS = f"uncommitted/data_docs/{SITE}"
VALIDATIONS = "uncommitted/validations"
KEEP_RUNS = 50  # validation results (and their Data Docs pages) kept per suite
DATASOURCES = {"pandas": "reclock_pandas", "spark": "reclock_spark"}
LOCK = ".lock"  # at a context's root: held by whoever makes, runs or renders the context (:func:`_exclusive`)
INSTALLED = "suites-installed.json"  # at a context's root: the hash of the project's suite each suite was copied from
FRESHNESS_RETRIES = 3  # loads of a checkpoint that another process saved anew meanwhile, before a run gives up

log = logging.getLogger("reclock")


def root_of(source_uri: str, source: str) -> str:
    """The runtime context root of ``source`` whose tables live at ``source_uri`` (module docstring)."""
    if "://" not in source_uri or source_uri.startswith("file://"):
        return os.path.join(source_uri.removeprefix("file://"), "gx")
    home = os.environ.get("RECLOCK_GX_HOME") or os.path.join(tempfile.gettempdir(), "reclock-gx")
    return os.path.join(home, source)


def suite_names() -> list[str]:
    return sorted(p.name.removesuffix(".json") for p in _suites())


@dataclass(frozen=True)
class Outcome:
    """One expectation's result as plain data (GX's ``ExpectationValidationResult`` read once), the same whether
    this process ran it or the validator did (:mod:`reclock.validator`)."""

    type: str  # the expectation's type, e.g. expect_column_values_to_be_between
    meta: dict  # its meta in the suite: check (reclock's name for it), description
    success: bool
    result: dict  # GX's result: unexpected_count, partial_unexpected_(index_)list, observed_value, ...
    exception_info: dict  # what GX caught, flat or keyed by metric


@dataclass(frozen=True)
class Run:
    """One checkpoint run: its expectations' outcomes, and its Data Docs page (a path under the site)."""

    success: bool
    results: list[Outcome]  # in the suite's order
    page: str | None  # relative to the Data Docs site root, e.g. validations/reclocked/.../x.html


class Context:
    """The GX file Data Context of one source (see the module docstring)."""

    def __init__(self, root: str, source: str):
        import great_expectations as gx

        self.root, self.source = os.path.abspath(root), source
        with _exclusive(self.root):
            _install(self.root)
            try:
                self.gx = gx.get_context(mode="file", context_root_dir=self.root)
            except Exception as e:  # noqa: BLE001 - e.g. a config half written by a killed run
                log.warning("%s: GX context %s unreadable (%s); its config is made again from the project", source,
                            self.root, e)
                _replace(os.path.join(self.root, CONFIG), (PROJECT / CONFIG).read_bytes())  # data sources are added again
                self.gx = gx.get_context(mode="file", context_root_dir=self.root)
        self._checkpoints: dict[str, Any] = {}
        self._pending_docs: list | None = None  # inside docs_once: the resources whose pages are still to build

    @property
    def docs_dir(self) -> str:
        """The Data Docs site's folder (``index.html`` is the site's home page)."""
        return os.path.join(self.root, DOCS)

    @property
    def docs_index(self) -> str:
        return os.path.join(self.docs_dir, "index.html")

    @contextlib.contextmanager
    def held(self):
        """This context's lock, held over the block (module docstring)."""
        with _exclusive(self.root):
            yield

    def checkpoint(self, kind: str, engine: str, index: Sequence[str], stored: bool = True):
        """The checkpoint ``<source>.<kind>``: its suite ``kind`` on a whole-dataframe batch of ``engine``
        (pandas or spark), reporting failures by the ``index`` columns.  The stored one when it is so
        (``stored``), else made and saved (it is missing, unreadable, or stale: another suite, batch or format)."""
        if kind in self._checkpoints:
            return self._checkpoints[kind]
        try:
            checkpoint = self._checkpoint(kind, engine, index, stored)
        except Exception:  # noqa: BLE001 - e.g. GX refuses to add what another process added meanwhile
            try:
                checkpoint = self._checkpoint(kind, engine, index, stored=True)
            except Exception as e:  # noqa: BLE001 - e.g. a definition half written by a killed run: made again
                log.warning("%s: GX checkpoint %s.%s unreadable (%s); made again", self.source, self.source, kind,
                            e)
                for store in ("checkpoints", "validation_definitions"):
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(os.path.join(self.root, store, f"{self.source}.{kind}.json"))
                checkpoint = self._checkpoint(kind, engine, index, stored=False)
        self._checkpoints[kind] = checkpoint
        return checkpoint

    def _checkpoint(self, kind: str, engine: str, index: Sequence[str], stored: bool):
        import great_expectations as gx

        name = f"{self.source}.{kind}"
        suite = self.gx.suites.get(kind)
        result_format = {"result_format": "SUMMARY", "partial_unexpected_count": 5,
                         "unexpected_index_column_names": list(index)}
        if stored and os.path.exists(os.path.join(self.root, "checkpoints", f"{name}.json")):
            checkpoint = self.gx.checkpoints.get(name)
            definition, = checkpoint.validation_definitions
            if (checkpoint.result_format == result_format and definition.suite.id == suite.id
                    and definition.data.data_asset.name == kind
                    and definition.data.data_asset.datasource.name == DATASOURCES[engine]):
                return checkpoint  # as another process saved it: nothing to write
        batch = _batch_definition(self.gx, engine, kind)
        definition = self.gx.validation_definitions.add_or_update(
            gx.ValidationDefinition(name=name, data=batch, suite=suite))
        return self.gx.checkpoints.add_or_update(gx.Checkpoint(
            name=name, validation_definitions=[definition], result_format=result_format, actions=[]))

    def run(self, kind: str, frame, params: Mapping[str, Any], index: Sequence[str]) -> Run:
        """Validate ``frame`` (pandas; a Spark DataFrame runs on GX's Spark engine) against suite ``kind`` with
        ``params``."""
        import pandas as pd

        engine = "pandas" if isinstance(frame, pd.DataFrame) else "spark"
        with _exclusive(self.root):
            return self._run(kind, engine, frame, params, index)

    def _run(self, kind: str, engine: str, frame, params: Mapping[str, Any], index: Sequence[str]) -> Run:
        from great_expectations.exceptions.resource_freshness import ResourceFreshnessAggregateError

        _prune(self.root, kind, KEEP_RUNS - 1)  # before the run: the index it builds lists what is kept
        for attempt in range(FRESHNESS_RETRIES + 1):
            try:
                result = self.checkpoint(kind, engine, index).run(batch_parameters={"dataframe": frame},
                                                                  expectation_parameters=dict(params))
                break
            except ResourceFreshnessAggregateError:
                # Another process saved the suite or the definitions anew since this one loaded them
                # (module docstring): make them again from what is stored now.
                if attempt == FRESHNESS_RETRIES:
                    raise
                self._checkpoints.pop(kind, None)
                self.checkpoint(kind, engine, index, stored=False)
        (identifier, validation), = result.run_results.items()
        self._docs([identifier, _suite_identifier(kind)])
        order = {e.meta.get("check"): i for i, e in enumerate(self.gx.suites.get(kind).expectations)}
        results = sorted(validation.results, key=lambda r: order.get((r.expectation_config.meta or {}).get("check"), 0))
        return Run(bool(validation.success), [
            Outcome(r.expectation_config.type, dict(r.expectation_config.meta or {}), bool(r.success),
                    dict(r.result or {}), dict(r.exception_info or {})) for r in results], self._page(identifier))

    @contextlib.contextmanager
    def docs_once(self):
        """Build the Data Docs of every run inside the block once, when it ends (even when a run failed)."""
        outer, self._pending_docs = self._pending_docs, []
        try:
            yield self
        finally:
            pending, self._pending_docs = self._pending_docs, outer
            if outer is not None:
                outer.extend(pending)
            elif pending:
                self._build(pending)

    def _docs(self, resources: list) -> None:
        if self._pending_docs is None:
            self._build(resources)
        else:
            self._pending_docs.extend(resources)

    def _build(self, resources: list) -> None:
        """The pages of ``resources`` (validation results, suites) and the site's index."""
        with _exclusive(self.root):
            self.gx.build_data_docs(site_names=[SITE], resource_identifiers=resources, build_index=True)

    def _page(self, identifier) -> str | None:
        # The page may be built later (docs_once): its path, whether it exists yet or not.
        for site in self.gx.get_docs_sites_urls(resource_identifier=identifier, site_names=[SITE],
                                                only_if_exists=False):
            url = site.get("site_url") or ""
            path = url.removeprefix("file://")
            if path.startswith(self.docs_dir):
                return os.path.relpath(path, self.docs_dir)
        return None


def open_context(source_uri: str, source: str) -> Context:
    """The GX context of ``source`` (whose tables are at ``source_uri``), one per process and source."""
    return _open(root_of(source_uri, source), source)


@lru_cache(maxsize=None)
def _open(root: str, source: str) -> Context:
    return Context(root, source)


_LOCKS: dict[str, threading.RLock] = {}  # per context root: this process's threads take turns
_HELD: dict[str, tuple[int, int]] = {}  # per context root this process holds: (lock file descriptor, depth)


@contextlib.contextmanager
def _exclusive(root: str):
    """Hold the lock of the context at ``root`` (reentrant): against this process's other threads, and against
    other processes by ``fcntl.flock`` on ``<root>/.lock`` (a context root is a local directory)."""
    with _LOCKS.setdefault(root, threading.RLock()):
        fd, depth = _HELD.get(root, (-1, 0))
        if depth == 0:
            os.makedirs(root, exist_ok=True)
            fd = os.open(os.path.join(root, LOCK), os.O_CREAT | os.O_RDWR, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
        _HELD[root] = (fd, depth + 1)
        try:
            yield
        finally:
            if depth == 0:
                del _HELD[root]
                os.close(fd)  # releases the flock
            else:
                _HELD[root] = (fd, depth)


def settled(root: str, timeout: float = 30.0) -> None:
    """Wait until no process holds the lock of the context at ``root`` (at most ``timeout`` seconds): a Data
    Docs build in flight has ended (the validator builds a check's pages after its step returned:
    :mod:`reclock.validator`).  Does not import GX, nor make the root."""
    import time

    try:
        fd = os.open(os.path.join(root, LOCK), os.O_RDONLY)
    except FileNotFoundError:  # never opened: nothing in flight
        return
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return
                time.sleep(0.02)
    finally:
        os.close(fd)  # releases the shared lock


def _install(root: str) -> None:
    """Make ``root`` a context from the project: its config once (GX adds the data sources to it), a suite when
    it is missing or changed in the repository since it was copied (:data:`INSTALLED` holds the hash of what
    was copied; GX saves a copied suite with ids of its own, which stay while the repository's is the same)."""
    os.makedirs(os.path.join(root, SUITES), exist_ok=True)
    if not os.path.exists(os.path.join(root, CONFIG)):
        _replace(os.path.join(root, CONFIG), (PROJECT / CONFIG).read_bytes())
    marker = os.path.join(root, INSTALLED)
    try:
        installed = json.loads(Path(marker).read_text())
    except (OSError, ValueError):  # none yet, or half written: every suite is copied again
        installed = {}
    hashes = {suite.name: hashlib.sha256(suite.read_bytes()).hexdigest()
              for suite in _suites()}
    changed = False
    for name, digest in hashes.items():
        target = os.path.join(root, SUITES, name)
        if not os.path.exists(target) or installed.get(name) != digest:
            _replace(target, (PROJECT / SUITES / name).read_bytes())
            changed = True
    if changed:
        _replace(marker, json.dumps(hashes, indent=1, sort_keys=True).encode())


def _suites() -> list:
    """The project's suites (package data: one ``expectations/<kind>.json`` per check kind)."""
    return [p for p in (PROJECT / SUITES).iterdir() if p.name.endswith(".json")]


def _replace(path: str, content: bytes) -> None:
    """Write ``path`` whole or not at all (readers in other processes never see it half written)."""
    temporary = f"{path}.{os.getpid()}.tmp"
    Path(temporary).write_bytes(content)
    os.replace(temporary, path)


def _suite_identifier(kind: str):
    from great_expectations.data_context.types.resource_identifiers import ExpectationSuiteIdentifier

    return ExpectationSuiteIdentifier(name=kind)


def _batch_definition(context, engine: str, kind: str):
    """The whole-dataframe batch definition of asset ``kind`` in the context's ``engine`` data source."""
    name = DATASOURCES[engine]
    try:
        source = context.data_sources.get(name)
    except KeyError:
        source = context.data_sources.add_spark(name) if engine == "spark" else context.data_sources.add_pandas(name)
    try:
        asset = source.get_asset(kind)
    except LookupError:
        asset = source.add_dataframe_asset(kind)
    try:
        return asset.get_batch_definition("whole")
    except KeyError:
        return asset.add_batch_definition_whole_dataframe("whole")


def _prune(root: str, suite: str, keep: int) -> None:
    """Keep the last ``keep`` validation results of ``suite`` (and their Data Docs pages)."""
    for base in (os.path.join(root, VALIDATIONS, suite, "__none__"),
                 os.path.join(root, DOCS, "validations", suite, "__none__")):
        try:
            runs = sorted(os.listdir(base))  # run names are UTC timestamps: sorted by time
        except FileNotFoundError:
            continue
        for old in runs[:len(runs) - keep]:
            shutil.rmtree(os.path.join(base, old), ignore_errors=True)
