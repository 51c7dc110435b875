"""Named points of a run that another module may observe: after each step of :func:`reclock.pipeline.run_once`
(``after-<step>``), and around each Delta commit (``<commit>``, all delta-rs's: ``tick``, ``publish`` and
``compact`` (``since``) by their app transactions; ``compact-remap``, ``prune-landing`` and each rewrite's by
name; any other commit by its app transaction, e.g. ``reclock.landing``).

Inert by default: no observer, nothing happens.  An observer (:func:`observe`) is what test and development tools
install, e.g. the crash points of the fault tests (``devtools/crash_points.py``): its ``reached(point)`` is called
at a step's point, and its ``commit(name, table_uri)`` context manager is entered around a commit.  The product
never installs one.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import ContextManager, Iterator, Protocol


class Observer(Protocol):
    def reached(self, point: str) -> None: ...

    def commit(self, name: str, table_uri: str) -> ContextManager[None]: ...


_observers: list[Observer] = []


def observe(observer: Observer) -> None:
    """Install ``observer`` in this process, for good."""
    _observers.append(observer)


def reached(point: str) -> None:
    """Tell every observer that this process reached ``point``."""
    for observer in list(_observers):
        observer.reached(point)


@contextmanager
def commit(name: str, table_uri: str) -> Iterator[None]:
    """Around the Delta commit ``name`` to ``table_uri``: inside every observer's ``commit`` context."""
    with ExitStack() as stack:
        for observer in list(_observers):
            stack.enter_context(observer.commit(name, table_uri))
        yield
