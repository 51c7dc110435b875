"""The ``pg_cluster`` fixture: a private Postgres cluster for the session (``devtools.pg_cluster``)."""
from __future__ import annotations

import uuid
from contextlib import contextmanager

import pytest

from devtools.pg_cluster import PgCluster, pg_bin_dir

__all__ = ["PgCluster", "fresh_database", "pg_bin_dir", "pg_cluster"]


@pytest.fixture(scope="session")
def pg_cluster():
    """A running private cluster for the whole session (skips when Postgres is not installed)."""
    if pg_bin_dir() is None:
        pytest.skip("PostgreSQL server binaries not installed")
    with PgCluster() as cluster:
        yield cluster


@contextmanager
def fresh_database(cluster, *statements: str):
    """A new database of ``cluster`` with ``statements`` run in it; its DSN.  Afterwards the database and its
    replication slots are dropped."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(cluster.dsn(), autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    with psycopg.connect(cluster.dsn(name), autocommit=True) as c:
        for statement in statements:
            c.execute(statement)
    try:
        yield cluster.dsn(name)
    finally:
        with psycopg.connect(cluster.dsn(), autocommit=True) as c:
            for (slot,) in c.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s",
                                     (name,)).fetchall():
                c.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            c.execute(f"DROP DATABASE {name} WITH (FORCE)")
