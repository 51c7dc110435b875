"""What a check reports (:class:`CheckReport`: one :class:`CheckResult` per expectation), and running a check kind's
GX suite on a frame through a source's checkpoint (:func:`run_suite`, :func:`report_of`): a check of an aggregate names the
records its failing rows stand for, the others GX's own count and up to :data:`SAMPLE` failing rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

SAMPLE = 5  # offending rows named per failed check


class ChecksFailed(RuntimeError):
    """At least one check failed; the message is the report's summary."""


@dataclass(frozen=True)
class CheckResult:
    name: str
    expectation: str
    success: bool
    description: str
    unexpected_count: int | None = None
    sample: list = field(default_factory=list)
    error: str | None = None
    #: What a table-level expectation measured (e.g. a row count), when it reports one.
    observed: Any = None

    def line(self) -> str:
        status = "PASS" if self.success else "FAIL"
        text = f"{status} {self.name}: {self.description}"
        if self.observed is not None:
            text += f": {self.observed}"
        if not self.success:
            text += f" ({self.error})" if self.error else f" ({self.unexpected_count} bad, e.g. {self.sample})"
        return text


@dataclass(frozen=True)
class CheckReport:
    subject: str
    rows: int
    results: tuple[CheckResult, ...]
    #: The run's Data Docs pages (relative to the source's Data Docs site; :mod:`reclock.gx_context`).
    docs: tuple[str, ...] = ()

    @property
    def success(self) -> bool:
        return all(r.success for r in self.results)

    @property
    def failed(self) -> list[str]:
        return [r.name for r in self.results if not r.success]

    def summary(self) -> str:
        passed = sum(r.success for r in self.results)
        head = f"{self.subject}: {passed}/{len(self.results)} checks passed on {self.rows} rows"
        return "\n".join([head] + ["  " + r.line() for r in self.results])

    def raise_for_failure(self) -> None:
        if not self.success:
            raise ChecksFailed(self.summary())

    def as_dict(self) -> dict[str, Any]:
        """Small and JSON-able, for XCom."""
        return {"subject": self.subject, "rows": self.rows, "success": self.success, "failed": self.failed}


#: A check of an aggregate: from the checked frame, the number of records its failing rows stand for and a sample.
Named = Callable[[pd.DataFrame], tuple[int, list]]


@dataclass(frozen=True)
class _Ran:
    run: Any  # reclock.gx_context.Run
    named: Mapping[str, Named]
    frame: Any
    params: Mapping[str, Any]


def run_suite(gx, kind: str, frame, index: list[str], params: Mapping[str, Any],
         named: Mapping[str, Named] | None = None) -> _Ran:
    """Validate ``frame`` with suite ``kind`` through the source's checkpoint (``gx``: the source's context)."""
    context = gx if gx is not None else scratch_context()
    return _Ran(context.run(kind, frame, params, index), named or {}, frame, params)


def report_of(subject: str, rows: int, runs: Sequence[_Ran]) -> CheckReport:
    """The checks of ``runs``, in their suites' order.  A check of an aggregate (``named``) counts and names the
    records its failing rows stand for; the others report GX's own count and up to 5 failing rows."""
    results = []
    for ran in runs:
        for r in ran.run.results:  # reclock.gx_context.Outcome
            meta = r.meta
            name = meta.get("check", r.type)
            error = _error(r.exception_info)
            count = r.result.get("unexpected_count")
            sample = r.result.get("partial_unexpected_index_list") or r.result.get("partial_unexpected_list") or []
            if name in ran.named and not r.success and error is None:
                count, sample = ran.named[name](ran.frame)
            results.append(CheckResult(
                name=name, expectation=r.type, success=r.success,
                description=meta.get("description", "").format(**ran.params), unexpected_count=count,
                sample=plain(sample), error=error, observed=plain(r.result.get("observed_value"))))
    return CheckReport(subject, rows, tuple(results), tuple(ran.run.page for ran in runs if ran.run.page))


def _error(info: dict) -> str | None:
    """The exception message(s) GX caught: ``exception_info`` is flat, or keyed by metric when a metric failed."""
    infos = [info] if "raised_exception" in info else list(info.values())
    return "; ".join(i["exception_message"] for i in infos
                     if isinstance(i, dict) and i.get("raised_exception") and i.get("exception_message")) or None


def plain(value):
    """GX samples as plain Python (numpy scalars to ints/floats, pandas NA to None)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return None
    return value.item() if hasattr(value, "item") else value


@lru_cache(maxsize=None)
def scratch_context():
    """A GX context for checks run outside a source (tests, a notebook): source ``scratch`` in a temporary
    folder, removed at exit."""
    import atexit
    import shutil
    import tempfile

    from .gx_context import Context

    root = tempfile.mkdtemp(prefix="reclock-gx-")
    atexit.register(shutil.rmtree, root, True)
    return Context(root, "scratch")
