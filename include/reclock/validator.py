"""The validator: a long-lived process that holds Great Expectations imported, so that a check step's process
does not import it (4-5 s of every check task under a scheduler, where each task is a process of its own).

The contract:

* **Same answers.**  A check step that validates opens its source's GX context through :func:`open_context`.
  With a validator, each of the step's connections is served by a child the validator forks for it: the child
  opens the source's :class:`reclock.gx_context.Context` and runs the step's checkpoints and its Data Docs
  build in it, as the step's own process would; a run comes back as :class:`reclock.gx_context.Run`, plain data,
  the same either way.  The Data Docs of a step's ``docs_once`` block are built after the step has its answer
  (off the check's path), under the context's lock taken before it: a reader that waits for the lock
  (:func:`reclock.gx_context.settled`, as the progress page does) finds a returned check's pages.  The validator
  itself never opens a context: every connection starts from GX as imported.
  What a check decides never depends on where it ran; a run's error comes back as that error, raised in the step.
* **One per installation.**  Its address is a Unix socket ``<dir>/gx-<key>.sock``: ``dir`` is
  ``$RECLOCK_VALIDATOR_DIR`` or ``<tmp>/reclock-<uid>`` (mode 0700), ``key`` a digest of the Python
  interpreter, reclock's and GX's versions and the code the child runs (:func:`address`), so a validator
  always runs the code the step would.  Only the socket's owner is served (the peer's uid is checked).  A
  validator holds ``<socket>.lock`` (``flock``; its pid inside) from before it imports GX until it has
  removed its socket: a second one started meanwhile exits at once.
* **Started on demand, gone when idle.**  A step that finds none starts one (its own session, detached,
  output to ``<socket>.log``) and waits for its socket, up to :data:`STARTUP` seconds.  It exits after
  ``$RECLOCK_VALIDATOR_IDLE`` seconds (default :data:`IDLE`) with no connection and none being served: the
  first check after that pays the import again.
* **Never needed.**  A step that cannot reach a validator (none answers in time, or the connection breaks
  before a run's result comes) validates in its own process from there on.  ``RECLOCK_VALIDATOR=off``: every
  step validates in its own process.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import hashlib
import importlib.resources
import logging
import os
import pickle
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import tempfile
import threading
import time
from functools import lru_cache
from typing import Any, Mapping, Sequence

from . import gx_context

IDLE = 600.0  # seconds a validator waits for a connection before it exits
STARTUP = 60.0  # seconds a step waits for a validator it started to answer
HEADER = struct.Struct("!Q")  # a message: its length, then the pickle

log = logging.getLogger("reclock")


def enabled() -> bool:
    return os.environ.get("RECLOCK_VALIDATOR", "on").strip().lower() not in ("off", "0", "false", "no")


def address() -> str:
    """This installation's validator socket (module docstring)."""
    folder = os.environ.get("RECLOCK_VALIDATOR_DIR") or os.path.join(tempfile.gettempdir(), f"reclock-{os.getuid()}")
    return os.path.join(folder, f"gx-{_key()}.sock")


@lru_cache(maxsize=None)
def _key() -> str:
    """A digest of what a validator runs: the interpreter, reclock's and GX's versions, the code a child runs and
    the project's suites."""
    from importlib.metadata import PackageNotFoundError, version

    digest = hashlib.sha256(os.path.realpath(sys.executable).encode())
    for package in ("great_expectations", "reclock"):
        with contextlib.suppress(PackageNotFoundError):
            digest.update(f"{package}={version(package)}".encode())
    code = importlib.resources.files("reclock")
    for name in ("validator.py", "gx_context.py"):
        digest.update((code / name).read_bytes())
    for item in sorted((code / "gx" / gx_context.SUITES).iterdir(), key=lambda p: p.name):
        digest.update(item.name.encode() + item.read_bytes())
    digest.update((code / "gx" / gx_context.CONFIG).read_bytes())
    return digest.hexdigest()[:16]


def open_context(source_uri: str, source: str):
    """The GX context of ``source`` (whose tables are at ``source_uri``) for a check step: served by the validator
    when there is one or one can be started, else this process's own (:func:`reclock.gx_context.open_context`)."""
    root = gx_context.root_of(source_uri, source)
    if enabled():
        try:
            return Remote(_connect(), root, source)
        except (OSError, _Broken) as e:
            log.warning("%s: no Great Expectations validator (%s); validating in this process", source, e)
    return gx_context.open_context(source_uri, source)


def serving(folder: str | None = None) -> list[int]:
    """The pids of the validators serving in ``folder`` (default: this installation's address only): those
    holding their lock."""
    locks = [f"{address()}.lock"] if folder is None else sorted(
        glob.glob(os.path.join(glob.escape(folder), "gx-*.sock.lock")))
    pids = []
    for lock in locks:
        try:
            fd = os.open(lock, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: nobody serves there
        except BlockingIOError:
            with contextlib.suppress(ValueError):
                pids.append(int(os.pread(fd, 32, 0) or b""))
        finally:
            os.close(fd)
    return pids


def stop(folder: str | None = None, wait: float = 10.0) -> list[int]:
    """Stop (SIGTERM) the validators :func:`serving` in ``folder`` and wait up to ``wait`` seconds for them to
    end; their pids."""
    stopped = []
    for pid in serving(folder):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            stopped.append(pid)
    deadline = time.monotonic() + wait
    while any(map(_running, stopped)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return stopped


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1][:1] != "Z"
    except (FileNotFoundError, IndexError):
        return False


# --- the step's side ---------------------------------------------------------------------------


class _Broken(Exception):
    """The connection to the validator broke (it exited, or was killed) before an answer came."""


class Remote:
    """A source's GX context served by the validator over one connection: what :class:`reclock.gx_context.Context`
    offers a check step (``run``, ``docs_once``, ``docs_dir``, ``docs_index``).  From the first broken
    connection on, this process's own context serves.  Threads of the step take turns (a run at a time)."""

    def __init__(self, connection: socket.socket, root: str, source: str):
        self.root, self.source = os.path.abspath(root), source
        self._connection: socket.socket | None = connection
        self._local = None
        self._turns = threading.RLock()
        self._ask("open", self.root, source)

    @property
    def docs_dir(self) -> str:
        return os.path.join(self.root, gx_context.DOCS)

    @property
    def docs_index(self) -> str:
        return os.path.join(self.docs_dir, "index.html")

    def run(self, kind: str, frame, params: Mapping[str, Any], index: Sequence[str]) -> gx_context.Run:
        with self._turns:
            if self._connection is not None:
                try:
                    return self._ask("run", kind, frame, dict(params), list(index))
                except _Broken as e:
                    self._fall_back(e)
            return self._local.run(kind, frame, params, index)

    @contextlib.contextmanager
    def docs_once(self):
        """Data Docs of the block's runs built once, at its end (:meth:`reclock.gx_context.Context.docs_once`)."""
        if self._connection is not None:
            try:
                self._ask("docs_once")
            except _Broken as e:
                self._fall_back(e)
        if self._connection is None:
            with self._local.docs_once():
                yield self
            return
        try:
            yield self
        finally:
            if self._connection is not None:
                try:
                    self._ask("docs_built")
                except _Broken as e:  # the block's runs served before are the validator's record only
                    self._fall_back(e)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _ask(self, *request):
        with self._turns:
            return self._asked(request)

    def _asked(self, request: tuple):
        try:
            _send(self._connection, request)
            answer = _receive(self._connection)
        except OSError as e:
            raise _Broken(str(e)) from e
        if answer is None:
            raise _Broken("the validator closed the connection")
        status, value = answer
        if status == "error":
            raise value
        return value

    def _fall_back(self, why: Exception) -> None:
        log.warning("%s: the Great Expectations validator went away (%s); validating in this process", self.source,
                    why)
        self.close()
        self._local = gx_context.Context(self.root, self.source)

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()


def _connect() -> socket.socket:
    """A connection to this installation's validator, started when none answers (module docstring)."""
    path = address()
    with contextlib.suppress(OSError):
        return _dial(path)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    env = dict(os.environ)
    home = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the folder reclock is imported from
    env["PYTHONPATH"] = os.pathsep.join(p for p in (home, env.get("PYTHONPATH")) if p)
    with open(f"{path}.log", "ab") as output:
        started = subprocess.Popen([sys.executable, "-m", "reclock.validator", path], env=env, cwd="/",
                                   stdin=subprocess.DEVNULL, stdout=output, stderr=output, start_new_session=True)
    deadline = time.monotonic() + STARTUP
    while True:
        try:
            return _dial(path)
        except OSError as e:
            if time.monotonic() > deadline or started.poll() not in (None, 0):
                raise OSError(f"the validator started at {path} did not answer (exit {started.poll()}, see "
                              f"{path}.log): {e}") from e
        time.sleep(0.05)


def _dial(path: str) -> socket.socket:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
    except OSError:
        connection.close()
        raise
    return connection


def _send(connection: socket.socket, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    connection.sendall(HEADER.pack(len(data)) + data)


def _receive(connection: socket.socket):
    """The next message; None when the other side closed the connection."""
    head = _exactly(connection, HEADER.size)
    if head is None:
        return None
    body = _exactly(connection, HEADER.unpack(head)[0])
    if body is None:
        raise OSError(errno.EPIPE, "the connection closed inside a message")
    return pickle.loads(body)


def _exactly(connection: socket.socket, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = connection.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# --- the validator's side ----------------------------------------------------------------------


class _Served(socketserver.BaseRequestHandler):
    """One step's connection, in a child of the validator: its context, its runs, its Data Docs."""

    def handle(self) -> None:
        # A child holds none of the validator's own: its lock (or a validator stopped while this child serves a
        # long check would keep the address from the next one) and its listening socket.
        os.close(self.server.lock)
        self.server.socket.close()
        uid = struct.unpack("3i", self.request.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))[1]
        if uid != os.getuid():
            return
        context, docs = None, contextlib.ExitStack()
        with docs:
            while (request := _receive(self.request)) is not None:
                op, *args = request
                try:
                    if op == "open":
                        context, value = gx_context.Context(*args), None
                    elif op == "run":
                        value = context.run(*args)
                    elif op == "docs_once":
                        docs.enter_context(context.docs_once())
                        value = None
                    elif op == "docs_built":
                        _answer_then_build(self.request, context, docs)
                        continue
                    else:
                        raise ValueError(f"the validator has no request {op!r}")
                    answer = ("ok", value)
                except Exception as e:  # noqa: BLE001 - the step raises it
                    answer = ("error", _portable(e))
                _send(self.request, answer)


def _answer_then_build(connection: socket.socket, context, docs: contextlib.ExitStack) -> None:
    """End a step's ``docs_once`` block: answer first, then build the block's Data Docs (off the check's path),
    holding the context's lock from before the answer, so that a reader waiting for it
    (:func:`reclock.gx_context.settled`) after the step's check returned finds its pages.  A failed build is the
    validator's log's (the pages are GX's record only; the check's outcome was answered)."""
    with context.held():
        _send(connection, ("ok", None))
        try:
            docs.close()  # builds them
        except Exception as e:  # noqa: BLE001 - never the check's
            log.warning("%s: building the Data Docs failed: %s: %s", context.source, type(e).__name__, e)


def _portable(error: Exception) -> Exception:
    """``error`` as it can travel back to the step: itself when it pickles, else a RuntimeError saying it."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - GX's errors need not pickle
        return RuntimeError(f"{type(error).__module__}.{type(error).__qualname__}: {error}")


class _Server(socketserver.ForkingMixIn, socketserver.UnixStreamServer):
    block_on_close = False

    def process_request(self, request, client_address):
        self.last = time.monotonic()
        super().process_request(request, client_address)


def serve(path: str, idle: float) -> int:
    """Serve at ``path`` until ``idle`` seconds pass with no connection (module docstring); 0 at once when another
    validator holds the address."""
    lock = os.open(f"{path}.lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0
    os.ftruncate(lock, 0)
    os.write(lock, str(os.getpid()).encode())
    with contextlib.suppress(OSError):
        os.ftruncate(sys.stderr.fileno(), 0)  # the log (appended to) holds this validator's life only
    import great_expectations  # noqa: F401 - what the validator is for: imported once, before serving

    with contextlib.suppress(FileNotFoundError):
        os.remove(path)  # a validator's that was killed
    server = _Server(path, _Served)
    server.lock = lock
    os.chmod(path, 0o600)
    server.timeout, server.last = min(idle, 1.0), time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log.info("the Great Expectations validator serves at %s (pid %d)", path, os.getpid())
    try:
        while True:
            server.collect_children()
            if server.active_children:
                server.last = time.monotonic()  # serving is not idle
            elif time.monotonic() - server.last >= idle:
                break
            server.handle_request()
    finally:
        os.remove(path)
        server.server_close()
        os.close(lock)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(process)d %(name)s %(message)s")
    log.setLevel(logging.INFO)
    sys.exit(serve(sys.argv[1], float(os.environ.get("RECLOCK_VALIDATOR_IDLE") or IDLE)))
