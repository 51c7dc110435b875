#!/usr/bin/env bash
# The airflow-init service of docker-compose.yaml, run once before the other Airflow services:
#   1. migrate the metadata DB (Postgres),
#   2. write the simple auth manager's password file (user $AIRFLOW_ADMIN_USER, password
#      $AIRFLOW_ADMIN_PASSWORD) so the UI login is known instead of generated,
#   3. create the pool of the DAGs' Spark tasks (reclock_spark, $RECLOCK_SPARK_POOL_SLOTS slots, default 2),
#   4. import the DAGs, failing with the import errors if dags/ or $RECLOCK_CONFIG is broken.
set -euo pipefail

echo "airflow-init: airflow db migrate"
airflow db migrate

echo "airflow-init: password file ${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE}"
python - <<'PY'
import json, os
path = os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path, "w") as f:
    json.dump({os.environ.get("AIRFLOW_ADMIN_USER", "admin"): os.environ.get("AIRFLOW_ADMIN_PASSWORD", "admin")}, f)
    f.write("\n")
os.chmod(path, 0o600)
PY

echo "airflow-init: pool reclock_spark"
airflow pools set reclock_spark "${RECLOCK_SPARK_POOL_SLOTS:-2}" "reclock: tasks that start Spark"

echo "airflow-init: importing the DAGs in ${AIRFLOW__CORE__DAGS_FOLDER} with ${RECLOCK_CONFIG}"
python - <<'PY'
import os, sys
from airflow.models import DagBag
bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
for path, error in bag.import_errors.items():
    print(f"DAG import error in {path}:\n{error}", file=sys.stderr)
if bag.import_errors or not bag.dags:
    sys.exit(f"airflow-init: DAG import failed ({len(bag.dags)} DAGs, {len(bag.import_errors)} errors)")
print("airflow-init: DAGs:", ", ".join(sorted(bag.dags)))
PY
