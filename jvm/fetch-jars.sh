#!/usr/bin/env bash
# Copy the JVM jars of each jvm/<name>/pom.xml into var/jars/<name> (git-ignored), idempotently:
# a folder is fetched again only when its pom changed. Spark's folders keep only what pyspark does not
# ship already (pyspark's own jars win, so the classpath has one copy of each library).
# Usage: jvm/fetch-jars.sh PYTHON [NAME...]   (the interpreter with pyspark, to find pyspark's jars; the
# folders to fetch, e.g. `spark spark-s3 spark-connect` in docker/Dockerfile: default all but spark-connect,
# the Connect server's plugins, which only the image needs). Maven fails on a bad checksum.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-.venv/bin/python}
names=("${@:2}")
[ ${#names[@]} -gt 0 ] || names=($(ls jvm/*/pom.xml | cut -d/ -f2 | grep -vx spark-connect))
pyspark_jars=$("$python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
artifact() { basename "$1" | sed -E 's/-[0-9][^-]*(-[A-Za-z0-9]+)*\.jar$//'; }
for name in "${names[@]}"; do
  pom=jvm/$name/pom.xml
  out=var/jars/$name
  if [ -f "$out/.fetched" ] && [ "$out/.fetched" -nt "$pom" ] && [ "$out/.fetched" -nt "$0" ]; then
    continue
  fi
  echo "reclock: fetching the $name jars with Maven ($pom)"
  rm -rf "$out.tmp"
  mvn -q -B -C -f "$pom" dependency:copy-dependencies -DoutputDirectory="$PWD/$out.tmp" -DincludeScope=runtime
  if [ "$name" != kafka-broker ]; then
    have=("$pyspark_jars"/*.jar)
    if [ "$name" = spark-connect ]; then  # loaded beside var/jars/spark: one copy of what both need
      [ -f var/jars/spark/.fetched ] || { echo "reclock: fetch the spark jars before spark-connect" >&2; exit 1; }
      have+=(var/jars/spark/*.jar)
    fi
    shipped=$(for j in "${have[@]}"; do artifact "$j"; done | sort -u)
    for j in "$out.tmp"/*.jar; do
      if grep -qxF "$(artifact "$j")" <<<"$shipped"; then rm "$j"; fi
    done
  fi
  rm -rf "$out"
  mv "$out.tmp" "$out"
  touch "$out/.fetched"
done
