"""Shared fixtures. Other test modules may add fixtures here."""
from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="session")
def kafka_broker():
    """Bootstrap string ``host:port`` of a local noida-db Kafka broker, one per test session."""
    from reclock.broker import LocalBroker

    with LocalBroker() as broker:
        yield broker.bootstrap


@pytest.fixture(scope="session")
def spark():
    """A local[2] Spark session whose Python workers run this interpreter (so they import reclock)."""
    # Spark's Python workers default to `python3` on PATH, which is not the venv.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from reclock.spark_session import get_spark

    session = get_spark("local[2]", app_name="reclock-tests")
    yield session
    session.stop()
