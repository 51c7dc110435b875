"""What the Airflow DAG files share: how each task runs, and the Asset of a source's reclocked table.

Task policy (:data:`TASK_POLICY`): every task has an ``execution_timeout``; the steps that talk to an
upstream, to Spark or commit to Delta retry with exponential backoff (a broker, database or Spark Connect server
restarting, a lost commit race: ``RETRY_DELAY * RETRY_BACKOFF**n``, at most ``MAX_RETRY_DELAY``); a failed check
or a refused replay is an answer, not a fault, and is not retried (the check task retries the other errors of
its step, and fails at once on :class:`reclock.check_report.ChecksFailed`).  Tasks that start Spark run in the pool :data:`SPARK_POOL`.

XCom (:func:`xcom_safe`): what a task returns is stored by Airflow's task runner as msgpack, whose ints are
64 bits; a step's result with wider ints (Kinesis sequence numbers, and the offsets a tick moved) returns them as
decimal strings, or the task fails after its step has done its work.

Task modules (:func:`preload_task_modules`): what a task process imports to run its step, imported once by the
process that forks the task processes (the scheduler, with the LocalExecutor: ``plugins/reclock_preload.py``).

Asset (:func:`reclocked_asset`): the location of a source's reclocked table (``file://`` for a local
warehouse), named ``reclock_<name>_reclocked``.  A source DAG's ``publish`` updates it with
``{"source", "reclocked_upper", "published"}`` in the event's extra; DAGs that read several sources AS OF
one IntoTime are scheduled on their Assets (all of them).
"""
from __future__ import annotations

from datetime import timedelta

from .config import Config

SPARK_POOL = "reclock_spark"
#: task_id -> (retries, execution_timeout, starts Spark)
TASK_POLICY = {
    "tick": (3, timedelta(hours=2), True),  # a Postgres source's first tick copies its tables
    "reclock": (2, timedelta(hours=6), True),
    "check": (2, timedelta(hours=1), True),  # ChecksFailed: failed at once (dags/reclock_sources.py)
    "publish": (2, timedelta(hours=1), True),
    "resume": (3, timedelta(minutes=15), False),
    "compact": (1, timedelta(hours=2), True),
    "backfill_run": (0, timedelta(minutes=5), False),
    "replay": (0, timedelta(hours=6), True),  # its refusals (window compacted, released) are answers
    "publish_transactions": (2, timedelta(hours=2), True),
    "publish_as_of": (2, timedelta(hours=1), True),
}
def xcom_safe(value):
    """``value`` with every int outside ``[-2**63, 2**63)`` as its decimal string, in nested dicts and lists (tuples
    become lists): what Airflow's task runner can store as a task's XCom."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if -2**63 <= value < 2**63 else str(value)
    if isinstance(value, dict):
        return {k: xcom_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [xcom_safe(v) for v in value]
    return value


#: What a task process imports to run its step: the steps (pandas, pyarrow, delta-rs) and Spark Connect's client.
TASK_MODULES = ("reclock.pipeline", "reclock.check_report", "reclock.spark.session", "pyspark.sql.connect.session")


def preload_task_modules(modules=TASK_MODULES) -> float:
    """Import ``modules`` into this process; the seconds it took.

    A forked process starts with what its parent imported.  The LocalExecutor's workers are forked from the
    scheduler when it starts, and each task process from a worker: imported in the scheduler first, the task
    modules are imported once, not by every task process (about 0.3 s of each task's own time; most of it for a
    small step).  Importing them reads no config, opens no connection and starts no Python thread; the
    native threads it starts (OpenBLAS's, jemalloc's) are made for fork."""
    import importlib
    import time

    began = time.perf_counter()
    for module in modules:
        importlib.import_module(module)
    return time.perf_counter() - began


RETRY_DELAY, RETRY_BACKOFF, MAX_RETRY_DELAY = timedelta(seconds=30), 2.0, timedelta(minutes=10)


def task_policy(task_id: str) -> dict:
    """The operator arguments of :data:`TASK_POLICY` for ``task_id``."""
    retries, timeout, spark = TASK_POLICY[task_id]
    return {"retries": retries, "retry_delay": RETRY_DELAY, "retry_exponential_backoff": RETRY_BACKOFF,
            "max_retry_delay": MAX_RETRY_DELAY, "execution_timeout": timeout,
            **({"pool": SPARK_POOL} if spark else {})}


def reclocked_asset(config: Config, name: str):
    """The Asset of source ``name``'s reclocked table."""
    from airflow.sdk import Asset

    # config.warehouse is resolved already (an absolute path or a URI): Warehouse(...).source_uri(name) without
    # importing the warehouse module (pyarrow.dataset, pandas) when a DAG file is parsed
    uri = f"{config.warehouse.rstrip('/')}/{name}/reclocked"
    return Asset(uri=uri if "://" in uri else f"file://{uri}", name=f"reclock_{name}_reclocked", group="reclock")
