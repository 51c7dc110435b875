"""Throwaway Airflow environments for tests: a temp AIRFLOW_HOME, an initialised SQLite DB, subprocess runs.

Airflow reads ``AIRFLOW_HOME`` / ``AIRFLOW__*`` once, when it is first imported, and
configures logging globally, so tests run Airflow in a subprocess with the
environment built here rather than importing it into the pytest process.

Parsing DAGs (``DagBag``) needs no database.  Running a DAG does: ``dag.test()``
needs a migrated metadata DB (``airflow db migrate`` takes ~3 s on SQLite with
Airflow 3.3) and ``AIRFLOW__CORE__DAGS_FOLDER`` pointing at ``dags/``.  End to end::

    from airflow_env import airflow_db_template, prepare_home, run_dag_test  # the fixture too

    def test_orders_end_to_end(tmp_path, airflow_db_template):        # DB migrated once per session
        env = prepare_home(tmp_path / "airflow", config=config_path, db_template=airflow_db_template)
        result = run_dag_test("reclock_orders", env)                  # dag.test() in a subprocess
        assert result["state"] == "success", result["output"]

``dag.test()`` runs every task in that one process (no scheduler or executor),
including the SparkSubmitOperator's spark-submit; it returns the DagRun.  The
``setup`` / ``adjust`` code hooks of :func:`run_dag_test` can replace modules
before parsing or change the parsed ``dag`` before the run.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest


from devtools import airflow_home
from devtools.airflow_home import DAGS_FOLDER, PYTHON, REPO, http_ok, run, stop_group  # noqa: F401  (re-exported)

_MARK = "RECLOCK_AIRFLOW_RESULT "


def airflow_env(home: Path, config: Path | None = None, dags_folder: Path = DAGS_FOLDER) -> dict[str, str]:
    """Environment for an Airflow process rooted at ``home``; this folder is importable in it."""
    return airflow_home.airflow_env(home, config, dags_folder, extra_pythonpath=Path(__file__).parent)


def migrated_db(home: Path) -> Path:
    """Run ``airflow db migrate`` in ``home`` and return the SQLite file (a template to copy)."""
    return airflow_home.migrate(home, airflow_env(home))


@pytest.fixture(scope="session")
def airflow_db_template(tmp_path_factory) -> Path:
    """A migrated metadata DB made once per test session; :func:`prepare_home` copies it."""
    return migrated_db(tmp_path_factory.mktemp("airflow-db"))


def prepare_home(home: Path, config: Path | None = None, db_template: Path | None = None,
                 dags_folder: Path = DAGS_FOLDER) -> dict[str, str]:
    """Create ``home`` with a metadata DB (a copy of ``db_template``, else freshly migrated); return its env."""
    home.mkdir(parents=True, exist_ok=True)
    if db_template is not None:
        shutil.copyfile(db_template, home / "airflow.db")
    else:
        migrated_db(home)
    return airflow_env(home, config, dags_folder)


def run_python(code: str, env: dict[str, str], timeout: float = 600) -> dict:
    """Run ``code`` in a fresh interpreter; it calls ``emit(obj)`` to hand back one JSON-able result."""
    prelude = f"import json\ndef emit(obj):\n    print({_MARK!r} + json.dumps(obj, default=str), flush=True)\n"
    output = run([PYTHON, "-c", prelude + code], env, timeout)
    lines = [line[len(_MARK):] for line in output.splitlines() if line.startswith(_MARK)]
    if not lines:
        raise AssertionError(f"no result from the subprocess:\n{output[-5000:]}")
    return {**json.loads(lines[-1]), "output": output}


def run_dag_test(dag_id: str, env: dict[str, str], setup: str = "", adjust: str = "",
                 timeout: float = 900) -> dict:
    """``dag.test()`` in a subprocess: ``{"state", "tasks": {task_id: state}, "output"}``."""
    code = f"""{setup}
from airflow.models import DagBag
bag = DagBag(dag_folder={str(env["AIRFLOW__CORE__DAGS_FOLDER"])!r})
assert not bag.import_errors, bag.import_errors
dag = bag.dags[{dag_id!r}]
{adjust}
dag_run = dag.test()
emit({{"state": str(dag_run.state), "tasks": {{ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}}}})
"""
    return run_python(code, env, timeout)


