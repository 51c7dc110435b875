"""A private, throwaway PostgreSQL cluster (own data dir, socket dir and port, wal_level=logical).

Used by the tests and the demo; never touches a server already running on the machine.
As root, the server runs as the ``postgres`` OS user (initdb refuses root).
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from devtools.kafka_broker import free_port

CONFIG = """
listen_addresses = ''
unix_socket_directories = '{sock}'
port = {port}
wal_level = logical
max_replication_slots = 40
max_wal_senders = 40
fsync = off
full_page_writes = off
shared_buffers = 32MB
max_connections = 100
"""


def pg_bin_dir() -> Path | None:
    """Directory holding initdb/pg_ctl/postgres, or None."""
    found = shutil.which("pg_ctl")
    candidates = ([str(Path(found).resolve().parent)] if found else []) + sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for d in candidates:
        if all((Path(d) / b).exists() for b in ("initdb", "pg_ctl", "postgres")):
            return Path(d)
    return None


class PgCluster:
    """``with PgCluster() as c: psycopg.connect(c.dsn())``."""

    def __init__(self) -> None:
        self.bin = pg_bin_dir()
        if self.bin is None:
            raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl) not found")
        self.root = Path(tempfile.mkdtemp(prefix="reclock-pg-"))
        self.data, self.sock, self.port = self.root / "data", self.root / "sock", free_port()
        self._user = "postgres" if os.geteuid() == 0 else None

    def _run(self, *args: str) -> None:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if self._user:
            cmd = ["runuser", "-u", self._user, "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def start(self) -> "PgCluster":
        self.sock.mkdir()
        if self._user:
            pw = pwd.getpwnam(self._user)
            for p in (self.root, self.sock):
                os.chown(p, pw.pw_uid, pw.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        with open(self.data / "postgresql.conf", "a") as f:
            f.write(CONFIG.format(sock=self.sock, port=self.port))
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60", "start")
        return self

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host={self.sock} port={self.port} user=postgres dbname={dbname}"

    def __enter__(self) -> "PgCluster":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
