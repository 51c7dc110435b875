"""Example: join reclocked sources AS OF one IntoTime, each time all of them have published.

``reclock_example_as_of_join`` is scheduled on the Assets of the sources it reads (their ``publish`` tasks
update them: :mod:`reclock.orchestration`), so it runs once every one of them has published since its last
run.  Its task runs :data:`SQL` AS OF the latest IntoTime all of them can answer
(:func:`reclock.query.publish_as_of`) and writes the rows, with ``as_of``, to the Delta table
``<warehouse>/<JOIN>``.  With the demo's config it joins each order with its user's clicks; copy this file
and change ``JOIN``, ``SOURCES`` and ``SQL`` for your own.  It is built only when the config has ``SOURCES``.
"""
from __future__ import annotations

from airflow.sdk import DAG, task

from reclock.config import ConfigError, load_config
from reclock.orchestration import reclocked_asset, task_policy

JOIN = "orders_with_clicks"
SOURCES = ["orders", "clicks"]
SQL = """
SELECT o.key AS user, o.value AS order_id, count(c.value) AS clicks
FROM orders o LEFT JOIN clicks c ON c.key = o.key
GROUP BY o.key, o.value
"""


def build(config) -> DAG:
    with DAG(dag_id="reclock_example_as_of_join", schedule=[reclocked_asset(config, s) for s in SOURCES],
             catchup=False, max_active_runs=1, tags=["reclock", "example"],
             doc_md=f"### AS OF join of {', '.join(SOURCES)}\n\nRuns when all of them have published; writes "
                    f"`{JOIN}` under `{config.warehouse}`, one `as_of` IntoTime per run.\n\n```sql\n{SQL.strip()}\n```"
             ) as dag:
        @task(**task_policy("publish_as_of"))
        def publish_as_of() -> dict:
            from reclock.query import publish_as_of
            return publish_as_of(JOIN, SQL, SOURCES, str(config.path))

        publish_as_of()
    return dag


try:
    _config = load_config()
except ConfigError:  # reported by reclock_sources.py, which imports the same config
    _config = None
if _config is not None and set(SOURCES) <= set(_config.sources):
    dag = build(_config)
