"""One Airflow DAG per ``transactions`` entry of the reclock config: ``reclock_txn_<name>``.

It runs :func:`reclock.transactions.publish_transactions`, which publishes the Debezium
transactions of two reclocked Kafka sources (a data topic and its transaction-metadata
topic) once complete and in order.  Schedule it after (or as often as) the two sources'
DAGs: each run processes every IntoTime both have published.
"""
from __future__ import annotations

from airflow.sdk import DAG, task

from reclock.config import Config, ConfigError, TransactionsConfig, load_config


def build_dag(config: Config, txn: TransactionsConfig) -> DAG:
    config_path = str(config.path)
    with DAG(
        dag_id=f"reclock_txn_{txn.name}",
        schedule=txn.schedule,
        start_date=txn.start_date,
        catchup=False,
        max_active_runs=1,
        tags=["reclock"],
        doc_md=(f"### Debezium transactions `{txn.name}`\n\nData source `{txn.data_source}`, transaction "
                f"source `{txn.tx_source}`; writes `{txn.name}_txn_output` and `{txn.name}_txn_temp` under "
                f"`{config.warehouse}`. A transaction is published once complete and after every earlier one."),
    ) as dag:
        @task
        def publish_transactions() -> dict:
            from reclock.transactions import publish_transactions
            return publish_transactions(txn.name, txn.data_source, txn.tx_source, config_path)

        publish_transactions()
    return dag


try:
    _config = load_config()
except ConfigError:  # reclock_sources.py reports it as its import error; one report is enough
    _config = None
if _config is not None:
    globals().update({f"reclock_txn_{t.name}": build_dag(_config, t) for t in _config.transactions.values()})
