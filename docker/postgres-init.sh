#!/usr/bin/env bash
# First start of the postgres service (docker-entrypoint-initdb.d; skipped once the data volume
# exists): the Airflow metadata database and the reclock source database, each with its own role.
#   airflow  owner of database "airflow"  (AIRFLOW__DATABASE__SQL_ALCHEMY_CONN)
#   reclock  owner of database "source" and its table public.orders, REPLICATION (pgoutput slots
#            of the Postgres source pg_orders)
set -euo pipefail

psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
     -v airflow_password="${AIRFLOW_DB_PASSWORD:?}" -v source_password="${SOURCE_DB_PASSWORD:?}" <<'SQL'
CREATE ROLE airflow LOGIN PASSWORD :'airflow_password';
CREATE DATABASE airflow OWNER airflow;
CREATE ROLE reclock LOGIN REPLICATION PASSWORD :'source_password';
CREATE DATABASE source OWNER reclock;
\connect source
-- The table of the pg_orders source in docker/sources.yaml (owned by reclock, which creates the
-- publication and sets REPLICA IDENTITY FULL on first use).
CREATE TABLE public.orders (
    id         bigint PRIMARY KEY,
    customer   text NOT NULL,
    amount     numeric(12, 2) NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE public.orders OWNER TO reclock;
SQL
