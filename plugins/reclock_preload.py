"""Airflow plugin: reclock's task modules imported by the scheduler before its LocalExecutor forks the workers.

With the LocalExecutor, the scheduler forks its worker processes when it starts and each worker forks a process
per task, which then imports what its step needs (pandas, pyarrow, delta-rs, Spark Connect's client: about
0.3 s, most of a small step's task).  This plugin's listener imports them in the scheduler first
(:func:`reclock.orchestration.preload_task_modules`), so every task process starts with them.  Any other process
(the API server, the dag processor, a triggerer, a Celery worker, a task process) imports nothing more.
"""
from __future__ import annotations

import logging
import sys

from airflow.listeners import hookimpl
from airflow.plugins_manager import AirflowPlugin

log = logging.getLogger("reclock")


def forks_task_processes() -> bool:
    """Whether this process is ``airflow scheduler`` with the LocalExecutor (whose workers it forks)."""
    from airflow.configuration import conf

    return sys.argv[1:2] == ["scheduler"] and "LocalExecutor" in conf.get("core", "executor")


class Preload:
    @hookimpl
    def on_starting(self, component) -> None:  # the scheduler's job, before its executor starts
        if forks_task_processes():
            from reclock.orchestration import preload_task_modules

            log.info("reclock: task modules imported for the LocalExecutor's task processes in %.2fs",
                     preload_task_modules())


class ReclockPreloadPlugin(AirflowPlugin):
    name = "reclock_preload"
    listeners = [Preload()]
