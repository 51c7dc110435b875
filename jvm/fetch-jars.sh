#!/usr/bin/env bash
# Copy the JVM jars of each jvm/<name>/pom.xml into var/jars/<name> (git-ignored), idempotently:
# a folder is fetched again only when its pom changed. Spark's folders keep only what pyspark does not
# ship already (pyspark's own jars win, so the classpath has one copy of each library).
# Usage: jvm/fetch-jars.sh PYTHON [NAME...]   (the interpreter with pyspark, to find pyspark's jars; the
# folders to fetch, e.g. `spark spark-s3` in docker/Dockerfile: default all). Maven fails on a bad checksum.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-.venv/bin/python}
names=("${@:2}")
[ ${#names[@]} -gt 0 ] || names=($(ls jvm/*/pom.xml | cut -d/ -f2))
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
    shipped=$(for j in "$pyspark_jars"/*.jar; do artifact "$j"; done | sort -u)
    for j in "$out.tmp"/*.jar; do
      if grep -qxF "$(artifact "$j")" <<<"$shipped"; then rm "$j"; fi
    done
  fi
  rm -rf "$out"
  mv "$out.tmp" "$out"
  touch "$out/.fetched"
done
