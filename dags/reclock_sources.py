"""The Airflow DAGs of the reclock config (``$RECLOCK_CONFIG`` or ``include/sources.yaml``).

``reclock_<name>``: tick >> reclock (spark-submit spark_jobs/reclock_job.py) >> check >> publish
>> resume >> compact.  A config error is raised at import, so it shows in the DAG import errors.
A task process builds only the DAG of its task (Airflow's ``get_parsing_context``), the whole file parse all of
them.

With a long-lived Spark (the config's ``spark.remote``, a Spark Connect server: docs/operations/spark.md) no
task starts a JVM: ``reclock`` (and a backfill's ``replay``) is a Python task like the others, running
``reclock.pipeline.stage`` in the task's process as a Spark Connect client of the server, and every other
Spark step (tick, check, publish, compact) opens a Connect session too.  Without it, ``reclock`` is a
spark-submit (to any master: a cluster too) and the other steps start a local session each.

``reclock_backfill_<name>``: ``airflow backfill create --dag-id reclock_backfill_<name> --from-date
... --to-date ...`` replays, per backfill run, the IntoTime window of the run's data interval
``[data_interval_start, data_interval_end)`` (ms) from remap and the upstream and verifies it against
the published rows (``reclock.backfill``; param ``backfill_mode`` "verify", or "repair" to rewrite a
window that differs).  It is a DAG of its own because Airflow only backfills DAGs with a periodic
timetable (a source's DAG may be manual-only) and a backfill run must not tick or publish.  Its
hourly ``CronDataIntervalTimetable`` gives one-hour windows (a cron *trigger* timetable, Airflow 3's
default for cron strings, would give empty ones).  Airflow starts backfill runs only for unpaused
DAGs, and an unpaused periodic DAG also gets scheduled runs: those (and manual runs) replay
nothing, a short circuit skips them.  A backfill of ``reclock_<name>`` (possible when the source has a
schedule) fails at its tick, pointing here: it would tick now instead of replaying its interval.

``reclock_txn_<name>`` (one per ``transactions`` entry): publishes the complete Debezium transactions of
two reclocked Kafka sources (``reclock.transactions``).

Assets: each source DAG's ``publish`` task updates the Asset of the source's reclocked table
(:func:`reclocked_asset`: the table's URI, name ``reclock_<name>_reclocked``), its event's extra saying
``{"source", "reclocked_upper", "published"}`` (every IntoTime below ``reclocked_upper`` is published).
A transactions DAG with ``schedule: assets`` (the default) runs when both its sources' Assets were
updated since its last run, and processes the IntoTimes both have published.

Every task has an ``execution_timeout`` and retries as :data:`reclock.orchestration.TASK_POLICY` says; tasks
that start Spark run in the pool ``reclock_spark`` (create it: ``airflow pools set reclock_spark <slots>
"reclock Spark work"``; the demo's and the tests' Airflow homes have it).  Parsing this file has no side
effect.

The Spark task uses the connection ``reclock_spark``.  Unless the environment already defines
``AIRFLOW_CONN_RECLOCK_SPARK`` itself, the task defines it when it runs, from the config's ``spark.master``
(``{"conn_type": "spark", "host": "<master>"}``: the provider takes a spark-type host with no port
as the whole master URL, so ``local[2]``, ``yarn``, ``spark://h:7077`` and ``k8s://https://h`` all work).
For ``local``/``spark://`` masters spark-submit and the job's Python are this venv's; for remote
workers set ``spark.pyspark.python`` in the config's ``spark.conf``, and for yarn/k8s have
``spark-submit`` on PATH (or SPARK_HOME set) where the task runs.
"""
from __future__ import annotations

import functools
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Asset, CronDataIntervalTimetable, Param, get_parsing_context, task
from airflow.sdk.exceptions import AirflowFailException

from reclock.config import ASSETS, Config, ConfigError, SourceConfig, TransactionsConfig, load_config
from reclock.orchestration import reclocked_asset, task_policy, xcom_safe
from reclock.spark.session import session_conf

REPO = Path(__file__).resolve().parents[1]
SPARK_JOB = REPO / "spark_jobs" / "reclock_job.py"
SPARK_CONN_ID = "reclock_spark"
_CONN_VAR = f"AIRFLOW_CONN_{SPARK_CONN_ID.upper()}"
_MANAGED = "reclock-managed"  # marks a connection this file defined, so a new master replaces it
BACKFILL_SCHEDULE = "0 * * * *"  # one backfill run replays one hour of IntoTime
BACKFILL_TIMETABLE = CronDataIntervalTimetable(BACKFILL_SCHEDULE, timezone="UTC")  # one for every backfill DAG
BACKFILL_START = datetime(1970, 1, 1, tzinfo=timezone.utc)  # IntoTimes of any date can be backfilled


def define_spark_connection(master: str) -> None:
    """Point ``reclock_spark`` at ``master`` unless the deployment defined the connection itself."""
    current = os.environ.get(_CONN_VAR)
    if current is None or _MANAGED in current:
        os.environ[_CONN_VAR] = json.dumps({"conn_type": "spark", "host": master, "extra": {_MANAGED: True}})


class ReclockSparkSubmitOperator(SparkSubmitOperator):
    """spark-submit through the connection ``reclock_spark``, defined from the config's Spark master when the task
    runs (:func:`define_spark_connection`), not when the DAG file is parsed."""

    def __init__(self, *, master: str, reclock_source: SourceConfig | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.reclock_master = master
        self.reclock_source = reclock_source  # as parsed with this file

    def define_connection(self) -> None:
        define_spark_connection(self.reclock_master)

    def pass_upstream_connection(self) -> None:
        """The source's Airflow connection, read here in the task, reaches the spark-submit as Airflow's
        ``AIRFLOW_CONN_<ID>`` variable (the job resolves it through the same Connection API)."""
        if self.reclock_source:
            from reclock.connections import environment

            if env := environment(self.reclock_source):
                self.env_vars = {**(self.env_vars or {}), **env}

    def execute(self, context):
        self.define_connection()
        self.pass_upstream_connection()
        return super().execute(context)


def spark_submit_args(config: Config, source: SourceConfig) -> dict:
    """SparkSubmitOperator arguments: this venv's spark-submit and Python for local/standalone masters.

    ``conf`` starts from :func:`reclock.spark.session.session_conf`: its jars (delta-spark, spark-sql-kafka;
    on the driver's classpath for a local master, ``spark.jars`` for another) must reach spark-submit, since a
    session built inside the job comes too late to load jars; the sources file's ``spark_conf`` overrides it.
    """
    bin_dir = Path(sys.executable).parent  # the venv's bin, not resolved through the python symlink
    same_python = config.spark_master.startswith(("local", "spark://"))
    return {
        "master": config.spark_master,
        "reclock_source": source,
        "application": str(SPARK_JOB),
        "application_args": ["--config", str(config.path), "--source", source.name],
        "conn_id": SPARK_CONN_ID,
        "name": f"reclock-{source.name}",
        "spark_binary": str(bin_dir / "spark-submit") if (bin_dir / "spark-submit").exists() else "spark-submit",
        # pip's spark-submit finds SPARK_HOME by running $PYSPARK_PYTHON (default: python3 on PATH).
        "env_vars": {"PYSPARK_PYTHON": sys.executable} if same_python else None,
        "conf": {**_session_conf(config.warehouse.startswith("s3"), config.spark_master),
                 **({"spark.pyspark.python": sys.executable} if same_python else {}), **config.spark_conf},
    }


@functools.lru_cache(maxsize=None)  # the same for every source of a sources file (it lists the jars' folders)
def _session_conf(s3: bool, master: str) -> dict:
    return session_conf(s3=s3, master=master)


def task_args(step: str) -> dict:
    """A ``@task``'s arguments: the step's :func:`reclock.orchestration.task_policy`, and one XCom, its result (not
    one more per key of the dict it returns, which Airflow would infer from ``-> dict``: a request each)."""
    return {**task_policy(step), "multiple_outputs": False}


def run_type(dag_run) -> str:
    """``"backfill"``, ``"scheduled"``, ``"manual"``, ... of a task's DAG run."""
    return str(getattr(dag_run.run_type, "value", dag_run.run_type))


SECRET_WORDS = ("dsn", "password", "secret", "token", "key", "storage_options", "config")


def shown_options(options: dict) -> dict:
    """Source options for the DAG's description, with anything that may hold a credential masked."""
    return {k: "***" if any(w in k.lower() for w in SECRET_WORDS) else v for k, v in options.items()}


#: The timetable Airflow made of a schedule string for the first DAG that has it, per start date's timezone.
_TIMETABLES: dict[tuple[str, str], object] = {}


def reclock_dag(dag_id: str, schedule, start_date, doc_md: str, tags: tuple[str, ...] = (), **kwargs) -> DAG:
    """A reclock DAG: one run at a time, no catch-up (every step works from durable state, not dates).

    The DAGs of one schedule string (and timezone) share the timetable Airflow made of it for the first of them
    (a timetable is a value: Airflow would make an equal one per DAG, which costs a sources file of 1,000
    sources a tenth of its parse)."""
    key = (schedule, repr(getattr(start_date, "tzinfo", None))) if isinstance(schedule, str) else None
    dag = DAG(dag_id=dag_id, schedule=_TIMETABLES.get(key, schedule), start_date=start_date, catchup=False,
              max_active_runs=1, tags=["reclock", *tags], doc_md=doc_md, **kwargs)
    if key is not None:
        _TIMETABLES.setdefault(key, dag.timetable)
    return dag


def publish_task(name: str, config: Config, asset: Asset):
    """``publish``, updating the source's Asset with the new IntoTime upper in the event's extra."""
    @task(task_id="publish", outlets=[asset], **task_args("publish"))
    def publish(outlet_events=None) -> dict:
        from reclock import pipeline
        result = pipeline.publish(name, runtime(config))
        outlet_events[asset].extra = {"source": name, "reclocked_upper": result["reclocked_upper"],
                                      "published": bool(result["published"])}
        return xcom_safe(result)
    return publish()


def runtime(config: Config):
    """A task's runtime (:mod:`reclock.runtime`), over the config this file was parsed with in the task's process:
    the sources file is parsed once per task."""
    from reclock.runtime import Runtime

    return Runtime(config)


def pipeline_task(step: str, name: str, config: Config):
    """A task running ``reclock.pipeline.<step>`` for source ``name`` (imported when it runs, not at parse)."""
    @task(task_id=step, **task_args(step))
    def run() -> dict:
        from reclock import pipeline
        return xcom_safe(getattr(pipeline, step)(name, runtime(config)))
    return run()


def check_task(name: str, config: Config):
    """``check``: a failed check is an answer and fails the task at once (``AirflowFailException``: no retry); any
    other error of the step (a Spark Connect server restarting, the warehouse unreachable) is retried."""
    @task(task_id="check", **task_args("check"))
    def check() -> dict:
        from reclock import pipeline
        from reclock.check_report import ChecksFailed
        try:
            return xcom_safe(pipeline.check(name, runtime(config)))
        except ChecksFailed as e:
            raise AirflowFailException(str(e)) from e
    return check()


def stage_task(config: Config, source: SourceConfig):
    """The ``reclock`` task: over the Spark Connect server (``spark.remote``) in the task's process, else a
    spark-submit."""
    name = source.name
    if not config.spark_remote:
        return ReclockSparkSubmitOperator(task_id="reclock", **spark_submit_args(config, source),
                                          **task_policy("reclock"))

    @task(task_id="reclock", **task_args("reclock"))
    def reclock() -> dict:
        from reclock import pipeline
        return _reported(pipeline.stage(name, runtime(config)))
    return reclock()


def _reported(result: dict) -> dict:
    """A Spark step's result, printed to the task's log as the JSON line its spark-submit job prints
    (spark_jobs/reclock_job.py), so a log reads the same over Spark Connect; returned for XCom."""
    print(json.dumps(result))
    return xcom_safe(result)


def replay_task(config: Config, source: SourceConfig):
    """The backfill's ``replay`` of its data interval: over the Spark Connect server, else spark-submit."""
    name = source.name
    if not config.spark_remote:
        args = spark_submit_args(config, source)
        args["application_args"] += ["--replay-interval", _ms("data_interval_start"), _ms("data_interval_end"),
                                     "--mode", "{{ params.backfill_mode }}"]
        return ReclockSparkSubmitOperator(task_id="replay", **{**args, "name": f"reclock-backfill-{name}"},
                                          **task_policy("replay"))

    @task(task_id="replay", **task_args("replay"))
    def replay(data_interval_start=None, data_interval_end=None, params=None) -> dict:
        from reclock import backfill
        start, end = backfill.window_of_interval(round(data_interval_start.timestamp() * 1000),
                                                 round(data_interval_end.timestamp() * 1000))
        return _reported(backfill.replay(name, runtime(config), start, end, mode=params["backfill_mode"]))
    return replay()


def build_dag(config: Config, source: SourceConfig) -> DAG:
    name, config_path = source.name, str(config.path)
    with reclock_dag(
        source_dag_id(name), source.schedule, source.start_date,
        doc_md=(f"### Reclock `{name}` ({source.kind})\n\n"
                f"Reclocks `{name}` onto IntoTime and publishes the Delta tables `{name}/remap` and "
                f"`{name}/reclocked` under `{config.warehouse}`.\n\n"
                f"* options: `{json.dumps(shown_options(source.options), sort_keys=True)}`\n"
                f"{f'* Airflow connection: `{source.connection}`' + chr(10) if source.connection else ''}"
                f"* schedule: `{source.schedule}`, IntoTime retention: {source.retention_ms} ms\n"
                + (f"* Spark Connect server: `{config.spark_remote}`" if config.spark_remote else
                   f"* Spark master: `{config.spark_master}`") + f", config: `{config_path}`\n\n"
                "tick (bind the source frontier) >> reclock (Spark stages the new records) >> check "
                "(Great Expectations) >> publish >> resume (commit offsets upstream) >> compact"),
    ) as dag:
        @task(**task_args("tick"))
        def tick(dag_run=None) -> dict:
            if run_type(dag_run) == "backfill":  # only possible with a schedule; it would tick now
                raise AirflowFailException(f"a backfill of reclock_{name} would tick now, not replay its interval: "
                                           f"backfill reclock_backfill_{name} to replay published IntoTimes")
            from reclock import pipeline
            return xcom_safe(pipeline.tick(name, runtime(config)))

        previous = tick() >> stage_task(config, source)
        previous = previous >> check_task(name, config)
        previous = previous >> publish_task(name, config, reclocked_asset(config, name))
        for step in ("resume", "compact"):
            previous = previous >> pipeline_task(step, name, config)
    return dag


def _ms(field: str) -> str:
    return f"{{{{ ({field}.timestamp() * 1000) | round | int }}}}"


def build_backfill_dag(config: Config, source: SourceConfig) -> DAG:
    """``reclock_backfill_<name>``: backfill runs replay their data interval's IntoTimes (see the module doc)."""
    name = source.name
    with reclock_dag(
        backfill_dag_id(name), BACKFILL_TIMETABLE, BACKFILL_START,
        tags=("backfill",),
        params={"backfill_mode": Param("verify", enum=["verify", "repair"],
                                       description="verify: compare the replay with the published rows; "
                                                   "repair: also rewrite the window's rows if they differ")},
        doc_md=(f"### Backfill `{name}`\n\n"
                f"`airflow backfill create --dag-id reclock_backfill_{name} --from-date ... --to-date ...`: "
                "each backfill run replays the IntoTimes of its data interval (one hour) from remap and the "
                "upstream and compares them with the published rows (`--dag-run-conf "
                "'{\"backfill_mode\": \"repair\"}'` rewrites a window that differs). Windows before the "
                "compaction frontier, not yet published, or needing records upstream already released are "
                "refused. Scheduled and manual runs replay nothing."),
    ) as dag:
        @task.short_circuit(**task_args("backfill_run"))
        def backfill_run(dag_run=None) -> bool:
            if run_type(dag_run) != "backfill":
                print(f"a {run_type(dag_run)} run: only backfill runs replay a window")
            return run_type(dag_run) == "backfill"

        backfill_run() >> replay_task(config, source)
    return dag


def build_transactions_dag(config: Config, txn: TransactionsConfig) -> DAG:
    """``reclock_txn_<name>``: publish the complete Debezium transactions of two reclocked Kafka sources."""
    schedule = ([reclocked_asset(config, txn.data_source), reclocked_asset(config, txn.tx_source)]
                if txn.schedule == ASSETS else txn.schedule)
    with reclock_dag(
        transactions_dag_id(txn.name), schedule, txn.start_date,
        doc_md=(f"### Debezium transactions `{txn.name}`\n\nData source `{txn.data_source}`, transaction "
                f"source `{txn.tx_source}`; writes `{txn.name}_txn_output` and `{txn.name}_txn_temp` under "
                f"`{config.warehouse}`. A transaction is published once complete and after every earlier one. "
                "Each run processes every IntoTime both sources have published."),
    ) as dag:
        @task(**task_args("publish_transactions"))
        def publish_transactions() -> dict:
            from reclock.transactions import publish_transactions
            return publish_transactions(txn.name, txn.data_source, txn.tx_source, runtime(config))

        publish_transactions()
    return dag


def source_dag_id(name: str) -> str:
    return f"reclock_{name}"


def backfill_dag_id(name: str) -> str:
    return f"reclock_backfill_{name}"


def transactions_dag_id(name: str) -> str:
    return f"reclock_txn_{name}"


#: Each DAG builder with the id of the DAG it builds for an entry's name.
DAG_IDS = {"build_dag": source_dag_id, "build_backfill_dag": backfill_dag_id,
           "build_transactions_dag": transactions_dag_id}


def build_all(config: Config, only: str | None = None) -> dict[str, DAG]:
    """Every DAG of ``config``; ``only``: just the DAG with that id (none when no entry has it), for a task
    process, which Airflow tells the DAG it runs (``get_parsing_context``): it builds no other."""
    builders = [(f"source {source.name}", source.schedule, (build_dag, build_backfill_dag), source)
                for source in config.sources.values()]
    builders += [(f"transactions {txn.name}", txn.schedule, (build_transactions_dag,), txn)
                 for txn in config.transactions.values()]
    dags, validated = {}, set()
    for label, schedule, build_fns, entry in builders:
        try:
            for build in build_fns:
                if only is not None and DAG_IDS[build.__name__](entry.name) != only:
                    continue
                built = build(config, entry)
                if built.dag_id in dags:  # e.g. sources "backfill_x" and "x"
                    raise ValueError(f"DAG id {built.dag_id} is already another source's DAG; rename a source")
                if id(built.timetable) not in validated:  # DAGs share their schedule's timetable (reclock_dag)
                    built.validate()  # Airflow would only check the schedule later, without naming the entry
                    validated.add(id(built.timetable))
                dags[built.dag_id] = built
        except Exception as e:  # e.g. an invalid cron string: say which entry and file
            raise ConfigError(f"{config.path}: {label}: cannot build its DAG (schedule {schedule!r}): {e}") from e
    return dags


globals().update(build_all(load_config(), only=get_parsing_context().dag_id))
