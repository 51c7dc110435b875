"""The Great Expectations validator (reclock.validator): a check served by it answers as this process's own context
does, the step's process never imports GX, a validator gone is survived, one serves per address and none
outlives its idle time."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from reclock import gx_context, validator
from reclock.checks import check_remap

GOOD = [(0, 10, 3), (1, 10, 2), (0, 20, 1)]
UPSTREAMS = {10: {0: 3, 1: 2}, 20: {0: 4, 1: 2}}


def remap(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["partition", "into_time", "increment"])


@pytest.fixture
def folder(monkeypatch):
    """A validator folder of the test's own (short: a socket's path has at most 107 bytes); its validators stopped
    at the end."""
    path = tempfile.mkdtemp(prefix="rv-")
    monkeypatch.setenv("RECLOCK_VALIDATOR_DIR", path)
    monkeypatch.delenv("RECLOCK_VALIDATOR", raising=False)
    yield path
    for pid in validator.stop(path):
        assert not _alive(pid), f"validator {pid} still runs"
    shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    return validator._running(pid)


def _serving(folder: str) -> int:
    """The pid of the validator serving in ``folder``, the only one."""
    pid, = validator.serving(folder)
    assert _alive(pid) and pid != os.getpid() and validator.serving() == [pid]
    return pid


CASES = [  # (what, remap rows, the checks that fail)
    ("good remap", GOOD, []),
    ("an increment counted twice: beyond the upstream", GOOD + [(0, 20, 1)], ["remap.within_upstream"]),
    ("a partition's upper moves back", [(0, 10, 3), (0, 20, -2)], ["remap.monotone", "remap.bindings_move"]),
    ("a binding that does not move", [(0, 10, 3), (0, 20, 0)], ["remap.bindings_move"]),
    ("a binding before since", [(0, 10, 3), (0, -5, 1)], ["remap.times_increasing", "remap.within_upstream"]),
    ("a null partition", [(None, 10, 3)], ["remap.partition_not_null"]),
    ("a null IntoTime", [(0, 10, 3), (1, None, 2)], ["remap.into_time_not_null"]),
]


def test_a_check_served_by_the_validator_answers_as_this_process_does(folder, tmp_path, monkeypatch):
    """Each case checked through the validator and through this process's own context: the same outcomes, counts
    and samples; the runs' Data Docs built once for the block, in the source's context root."""
    from reclock.engine import Frontier

    upstreams = {t: Frontier(u) for t, u in UPSTREAMS.items()}
    local = gx_context.Context(str(tmp_path / "local" / "gx"), "orders")
    monkeypatch.setattr(gx_context, "Context", lambda *a: pytest.fail(f"a context opened in this process: {a}"))
    remote = validator.open_context(str(tmp_path / "remote"), "orders")
    assert isinstance(remote, validator.Remote) and _serving(folder)
    with remote.docs_once():
        for what, rows, failing in CASES:
            served = check_remap(remap(rows), since=0, upstreams=upstreams, gx=remote)
            here = check_remap(remap(rows), since=0, upstreams=upstreams, gx=local)
            assert served.failed == failing, (what, served.summary())
            assert served.results == here.results and served.rows == here.rows, what
            assert len(served.docs) == 1, what
        assert not os.path.exists(remote.docs_index)  # built when the block ends
    gx_context.settled(remote.root)  # after the block's answer: a reader waits for the context's lock
    assert os.path.exists(remote.docs_index) and remote.docs_dir == str(tmp_path / "remote" / "gx" / gx_context.DOCS)
    assert all(os.path.exists(os.path.join(remote.docs_dir, page)) for page in served.docs)
    with pytest.raises(Exception, match="ExpectationSuite with name nope was not found"):  # GX's own error
        remote.run("nope", remap(GOOD), {}, ["partition"])


def test_the_data_docs_are_built_after_the_answer_and_never_fail_the_check(folder, tmp_path):
    """A step's block of runs ends with the answer; its Data Docs are built after it, under the context's lock
    (a reader waits for them), and a build that fails is the validator log's, not the check's."""
    remote = validator.open_context(str(tmp_path), "orders")
    index = Path(remote.docs_index)
    index.mkdir(parents=True)  # a folder where the site's index goes: GX cannot write it
    with remote.docs_once():
        bad = check_remap(remap([(0, 10, 3), (0, 20, -2)]), gx=remote)
    assert bad.failed == ["remap.monotone", "remap.bindings_move"]  # the check's outcome, answered
    gx_context.settled(remote.root)
    log = Path(f"{validator.address()}.log").read_text()
    assert "orders: building the Data Docs failed" in log, log
    index.rmdir()
    with remote.docs_once():
        assert check_remap(remap(GOOD), gx=remote).success
    gx_context.settled(remote.root)
    assert os.path.isfile(remote.docs_index)


def test_the_step_never_imports_great_expectations(folder, tmp_path):
    """A process that checks through the validator (started by it) gets the failure named, and has not imported
    Great Expectations."""
    script = textwrap.dedent(f"""
        import sys, pandas as pd
        from reclock import validator
        from reclock.checks import check_remap
        context = validator.open_context({str(tmp_path)!r}, "orders")
        report = check_remap(pd.DataFrame([(0, 10, 3), (0, 20, -2)], columns=["partition", "into_time", "increment"]),
                             gx=context)
        print(type(context).__name__, report.failed, "great_expectations" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.split("\n")[-2] == "Remote ['remap.monotone', 'remap.bindings_move'] False", out.stderr
    _serving(folder)


def test_a_validator_gone_is_survived(folder, tmp_path, monkeypatch, caplog):
    """The validator killed (SIGKILL, with the child serving the step) between two runs: the next run is
    validated in the step's own process, with the same outcome; a validator that does not answer in time, or
    ``RECLOCK_VALIDATOR=off``: the step's own context from the start."""
    remote = validator.open_context(str(tmp_path), "orders")
    assert check_remap(remap(GOOD), gx=remote).success
    os.killpg(_serving(folder), signal.SIGKILL)  # its own session: the validator and the child serving this step
    with remote.docs_once():
        bad = check_remap(remap([(0, 10, 3), (0, 20, -2)]), gx=remote)
    assert bad.failed == ["remap.monotone", "remap.bindings_move"]
    assert "the Great Expectations validator went away" in caplog.text
    assert os.path.exists(remote.docs_index)

    monkeypatch.setattr(validator, "STARTUP", 0.0)  # the killed one's socket is left; a new one takes a while
    caplog.clear()
    assert isinstance(validator.open_context(str(tmp_path), "orders"), gx_context.Context)
    assert "orders: no Great Expectations validator" in caplog.text
    monkeypatch.setenv("RECLOCK_VALIDATOR", "off")
    assert isinstance(validator.open_context(str(tmp_path), "orders"), gx_context.Context)


def test_one_validator_per_address_and_none_outlives_its_idle_time(folder):
    """Two validators started at once on one address: one serves, the other exits at once; with nobody connecting
    it exits after its idle time, removing its socket and freeing its lock."""
    path = validator.address()
    env = {**os.environ, "RECLOCK_VALIDATOR_IDLE": "2", "PYTHONPATH": os.pathsep.join(
        [str(Path(validator.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    started = [subprocess.Popen([sys.executable, "-m", "reclock.validator", path], env=env) for _ in range(2)]
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        assert time.monotonic() < deadline and all(p.poll() in (None, 0) for p in started)
        time.sleep(0.05)
    assert sorted(p.poll() is None for p in started) == [False, True]  # the other exited, 0
    serving, = (p for p in started if p.poll() is None)
    assert serving.wait(timeout=60) == 0
    assert not os.path.exists(path) and validator.stop(folder) == []


def test_a_validator_stopped_while_it_serves_frees_its_address(folder, tmp_path):
    """Stopped while a child of it serves a step (whose connection stays open for the whole check step), the
    validator frees its address at once: the next step gets a new one, and the step served before goes on."""
    first = validator.open_context(str(tmp_path / "a"), "orders")
    assert check_remap(remap(GOOD), gx=first).success
    old, = validator.stop(folder)
    assert validator.serving(folder) == []
    second = validator.open_context(str(tmp_path / "b"), "orders")
    assert isinstance(second, validator.Remote) and _serving(folder) != old
    assert check_remap(remap(GOOD), gx=second).success
    assert check_remap(remap(GOOD), gx=first).success and first._local is None  # its child still serves it
    first.close()
