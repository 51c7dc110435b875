#!/usr/bin/env bash
# System packages reclock needs beyond Python: Java for Spark, Postgres server binaries for the
# Postgres tests, Chromium for the progress-view browser test, Node.js and npm for the Kinesis-compatible
# server of the Kinesis tests and demo (devtools/kinesis).
set -euo pipefail
missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$pg_bin" ]; then
  missing+=(postgresql)
fi
command -v chromium >/dev/null 2>&1 || missing+=(chromium fonts-dejavu-core)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)  # validates docker-compose.yaml
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)  # the Celery broker of make soak's production part
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "reclock: please install: ${missing[*]} (needs root)" >&2; exit 1
  fi
  echo "reclock: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
