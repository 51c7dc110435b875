"""Airflow's own cost of a reclock DAG run, for the benchmark (``bench/reclock_bench.py``, section airflow).

``reclock_floor``: the tasks of a ``reclock_<name>`` DAG, in the same order (``RECLOCK_FLOOR_TASKS``: their
task ids, comma-separated, read by the benchmark from that DAG's run), each doing nothing.  Under
``airflow dags test`` in the same Airflow home, its time is what Airflow spends on such a run before reclock
does anything: the CLI, the DAG run, and per task the in-process execution API, state and XCom.
"""
from __future__ import annotations

import os
from datetime import datetime, timezone

from airflow.sdk import DAG, task

TASKS = [t for t in os.environ.get("RECLOCK_FLOOR_TASKS", "").split(",") if t]


def nothing() -> None:
    return None


with DAG("reclock_floor", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=timezone.utc), catchup=False,
         max_active_runs=1, tags=["reclock-bench"]) as dag:
    previous = None
    for task_id in TASKS:
        current = task(task_id=task_id)(nothing)()
        if previous is not None:
            previous >> current
        previous = current
