"""The reclock demo on the embedded default: ``python -m devtools.demo`` (``make demo``).

Five sources with five gauges of progress, each with its own Airflow DAG
(``airflow dags test``: tick -> Spark reclock -> Great Expectations checks -> publish
-> resume -> compact):

* ``orders``: a slow Kafka topic, 2 partitions (a local Apache Kafka broker);
* ``clicks``: a fast Kafka topic, 3 partitions;
* ``weblogs``: a directory of growing log files, ``(file identity, byte offset)``;
* ``payments``: a Postgres table read by logical replication, commit LSN (a private cluster);
* ``taps``: a Kinesis stream of 2 shards, ``(shard, sequence number)`` (kinesis-local, a
  Kinesis-compatible server); the first round splits shard 0 after putting into it.

The sources file names the Kafka broker and the Postgres database by Airflow connection
(``reclock_kafka``, ``reclock_postgres``), defined as ``AIRFLOW_CONN_*`` variables.

Every Spark step runs on one long-lived Spark, a local Spark Connect server (``devtools.spark_connect``,
the config's ``spark.remote``): no step starts a JVM of its own (``--local-spark``: each does, as without
a server).  Each round changes every source, ticks all five IntoTime clocks at one moment and runs
the five DAGs.  At the end it joins all five AS OF each round's tick: the answer for a
past IntoTime stays the same however much arrives later.  Everything lives under
``var/demo`` (removed at the start of each run).
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import time
from contextlib import ExitStack
from pathlib import Path

import yaml

from reclock import pipeline
from devtools.airflow_home import (AIRFLOW, PYTHON, REPO, airflow_env, kafka_connection, migrate, postgres_connection,
                                   run)
from devtools.kafka_broker import LocalBroker, create_topic, produce
from devtools.kinesis_server import KinesisServer, create_stream, open_shards, put, split
from devtools.pg_cluster import PgCluster
from devtools.spark_connect import LocalSparkConnect

TOPICS = {"orders": 2, "clicks": 3}  # topic -> partitions
SOURCES = [*TOPICS, "weblogs", "payments", "taps"]
STREAM = "taps"  # Kinesis stream (2 shards, one split after the first round)
USERS = [f"user-{i}" for i in range(5)]
CLI = [PYTHON, "-m", "reclock.cli"]
JOIN = """
WITH c AS (SELECT key AS user, count(*) AS clicks FROM clicks GROUP BY key),
     w AS (SELECT split(line, ' ')[0] AS user, count(*) AS visits FROM weblogs GROUP BY 1),
     p AS (SELECT get_json_object(row, '$.user_id') AS user,
                  sum(CAST(get_json_object(row, '$.amount') AS INT)) AS paid FROM payments GROUP BY 1),
     k AS (SELECT partition_key AS user, count(*) AS taps FROM taps GROUP BY 1)
SELECT o.key AS user, o.value AS order_id, coalesce(c.clicks, 0) AS clicks,
       coalesce(w.visits, 0) AS visits, coalesce(p.paid, 0) AS paid, coalesce(k.taps, 0) AS taps
FROM orders o LEFT JOIN c ON c.user = o.key LEFT JOIN w ON w.user = o.key LEFT JOIN p ON p.user = o.key
     LEFT JOIN k ON k.user = o.key
ORDER BY order_id"""


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


KAFKA_CONN, PG_CONN = "reclock_kafka", "reclock_postgres"  # the Airflow connections of the demo's upstreams


def connections(bootstrap: str, dsn: str) -> dict[str, str]:
    """The demo's Airflow connections, as Airflow's ``AIRFLOW_CONN_<ID>`` variables: the sources file names
    them (``connection:``) instead of holding the broker's address and the database's DSN."""
    return {**kafka_connection(KAFKA_CONN, bootstrap), **postgres_connection(PG_CONN, dsn)}


def write_config(path: Path, logs: Path, kinesis: dict, remote: str | None) -> None:
    kafka = [{"name": name, "kind": "kafka", "retention_ms": 3_600_000, "connection": KAFKA_CONN,
              "options": {"topic": name, "group_id": f"reclock-{name}"}}
             for name in TOPICS]
    path.write_text(yaml.safe_dump({
        "warehouse": str(path.parent / "warehouse"),
        "spark": {"remote": remote} if remote else {"master": "local[2]"},
        "sources": kafka + [
            {"name": "weblogs", "kind": "files", "retention_ms": 3_600_000, "options": {"url": str(logs)}},
            {"name": "payments", "kind": "postgres", "retention_ms": 3_600_000, "connection": PG_CONN,
             "options": {"slot": "reclock_payments", "tables": ["public.payments"]}},
            {"name": "taps", "kind": "kinesis", "retention_ms": 3_600_000, "options": {**kinesis, "stream": STREAM}},
        ],
    }, sort_keys=False))


def start_servers(stack: ExitStack, directory: Path, connect: bool = True):
    """``(broker, Postgres cluster, Kinesis server, Spark Connect server or None)``, entered on ``stack``, with
    the demo's topics, stream and payments table created."""
    import psycopg

    broker = stack.enter_context(LocalBroker(data_dir=str(directory / "broker")))
    cluster = stack.enter_context(PgCluster())
    kinesis_server = stack.enter_context(KinesisServer())
    spark = stack.enter_context(LocalSparkConnect()) if connect else None
    create_stream(kinesis_server.client(), STREAM, shards=2)
    for topic, partitions in TOPICS.items():
        create_topic(broker.bootstrap, topic, partitions=partitions)
    with psycopg.connect(cluster.dsn(), autocommit=True) as db:
        db.execute("CREATE TABLE payments (id serial PRIMARY KEY, user_id text NOT NULL, amount int NOT NULL)")
    return broker, cluster, kinesis_server, spark


def change_round(bootstrap: str, logs: Path, dsn: str, kinesis, round_: int, rng: random.Random) -> dict[str, int]:
    """A couple of orders, dozens of clicks, appended log lines, payment transactions and taps in every open
    shard of the Kinesis stream (split after the first round: the parent's taps are bound before its children's)."""
    import psycopg

    orders = [(rng.choice(USERS), f"order-{round_}-{i}", i % TOPICS["orders"]) for i in range(2)]
    clicks = [(rng.choice(USERS), f"click-{round_}-{i}", i % TOPICS["clicks"]) for i in range(40)]
    produce(bootstrap, "orders", orders)
    produce(bootstrap, "clicks", clicks)
    # the round in each line: the two files never start with the same line (a files partition is its first line)
    visits = [f"{rng.choice(USERS)} GET /page/{round_}/{i}\n" for i in range(15)]
    with open(logs / f"web-{round_ % 2}.log", "a") as f:  # two files growing, appended in turn
        f.writelines(visits)
    with psycopg.connect(dsn, autocommit=True) as db:
        for _ in range(3):
            with db.transaction():  # all changes of one transaction get one IntoTime
                for _ in range(2):
                    db.execute("INSERT INTO payments (user_id, amount) VALUES (%s, %s)",
                               (rng.choice(USERS), rng.randint(1, 100)))
        db.execute("DELETE FROM payments WHERE id = (SELECT min(id) FROM payments)")  # a refund: diff -1
    taps, shards = 0, open_shards(kinesis, STREAM)
    for split_now in (False, True) if round_ == 1 else (False,):
        if split_now:  # the first round splits a shard: its children's taps are bound a tick after the parent's
            split(kinesis, STREAM, shards[0])
            shards = [s for s in open_shards(kinesis, STREAM) if s not in shards]
        for shard in shards:
            put(kinesis, STREAM, [f"tap-{round_}-{shard[-1]}-{i}".encode() for i in range(5)], shard,
                keys=[rng.choice(USERS) for _ in range(5)])  # partition key: the user; put() routes into the shard
            taps += 5
    return {"orders": len(orders), "clicks": len(clicks), "log lines": len(visits), "payment txns": 4,
            "taps": taps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=REPO / "var" / "demo")
    parser.add_argument("--local-spark", action="store_true",
                        help="every Spark step starts a local session of its own (default: one Spark Connect server)")
    args = parser.parse_args(argv)
    shutil.rmtree(args.dir, ignore_errors=True)
    logs = args.dir / "weblogs"
    logs.mkdir(parents=True)
    config = args.dir / "sources.yaml"
    env = airflow_env(args.dir / "airflow", config)

    with ExitStack() as stack:
        say("starting a local Apache Kafka broker (Apache Kafka, KRaft), a private Postgres cluster, a "
            "Kinesis-compatible server (kinesis-local) and a Spark Connect server (the long-lived Spark)")
        broker, cluster, kinesis_server, spark = start_servers(stack, args.dir, connect=not args.local_spark)
        kinesis, dsn = kinesis_server.client(), cluster.dsn()
        write_config(config, logs, kinesis_server.options(), spark and spark.url)
        conns = connections(broker.bootstrap, dsn)
        env.update(conns)  # for the Airflow and reclock processes
        os.environ.update(conns)  # for the steps this process runs (the first tick below)
        print(f"broker at {broker.bootstrap}; Postgres at {dsn}; Kinesis at {kinesis_server.endpoint}; "
              f"Spark {f'Connect server at {spark.url}' if spark else 'local sessions'}; config {config}")
        pipeline.tick("payments", str(config))  # creates the replication slot before any change
        say("initialising Airflow (SQLite) in var/demo/airflow")
        migrate(args.dir / "airflow", env)

        rng, times = random.Random(7), []
        for round_ in range(1, args.rounds + 1):
            changed = change_round(broker.bootstrap, logs, dsn, kinesis, round_, rng)
            say(f"round {round_}/{args.rounds}: {changed}; ticking all clocks, running every DAG")
            ticks = [pipeline.tick(name, str(config)) for name in SOURCES]  # one moment for all sources
            times.append(max(t["into_time"] for t in ticks))
            for name, tick in zip(SOURCES, ticks):
                print(f"  {name} bound {tick['frontier']}", flush=True)
            for name in SOURCES:
                started = time.monotonic()
                run([AIRFLOW, "dags", "test", f"reclock_{name}"], env, timeout=900)
                print(f"  reclock_{name}: success in {time.monotonic() - started:.0f}s", flush=True)

        say("status of every source")
        print(run([*CLI, "--config", str(config), "status"], env, stderr=False))
        for round_, t in enumerate(times, 1):
            say(f"AS OF join of all five sources at round {round_}'s tick: the same answer whenever it is asked")
            print(run([*CLI, "--config", str(config), "query", "--as-of", str(t), "--sql", JOIN], env, stderr=False))
        say(f"done: the tables are Delta Lake under {args.dir / 'warehouse'}; "
            f"query them with: reclock --config {config} query --as-of latest --sql '...'")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
