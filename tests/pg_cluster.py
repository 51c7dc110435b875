"""The ``pg_cluster`` fixture: a private Postgres cluster for the session (``devtools.pg_cluster``)."""
from __future__ import annotations

import pytest

from devtools.pg_cluster import PgCluster, pg_bin_dir

__all__ = ["PgCluster", "pg_bin_dir", "pg_cluster"]


@pytest.fixture(scope="session")
def pg_cluster():
    """A running private cluster for the whole session (skips when Postgres is not installed)."""
    if pg_bin_dir() is None:
        pytest.skip("PostgreSQL server binaries not installed")
    with PgCluster() as cluster:
        yield cluster
