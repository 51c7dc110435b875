"""The reclock demo on the embedded default: ``python -m reclock.demo`` (``make demo``).

Starts a local Kafka-protocol broker, produces to a slow ``orders`` topic and a fast
``clicks`` topic, runs several rounds of both sources' Airflow DAGs (``airflow dags test``:
tick -> Spark reclock -> Great Expectations checks -> publish -> resume -> compact),
then joins the two topics AS OF one IntoTime and shows that each answer is fixed.
Everything lives under ``var/demo`` (removed at the start of each run).
"""
from __future__ import annotations

import argparse
import random
import shutil
import time
from pathlib import Path

import yaml

from .airflow_home import AIRFLOW, PYTHON, REPO, airflow_env, migrate, run
from .broker import LocalBroker, create_topic, produce
from . import pipeline

SOURCES = {"orders": 2, "clicks": 3}  # topic -> partitions
CLI = [PYTHON, "-m", "reclock.cli"]
JOIN = """SELECT o.key AS user, o.value AS order_id, count(c.value) AS clicks_by_user
FROM orders o LEFT JOIN clicks c ON c.key = o.key GROUP BY o.key, o.value ORDER BY o.value"""


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def write_config(path: Path, bootstrap: str) -> None:
    path.write_text(yaml.safe_dump({
        "warehouse": str(path.parent / "warehouse"),
        "spark": {"master": "local[2]"},
        "sources": [{"name": name, "kind": "kafka", "retention_ms": 3_600_000,
                     "options": {"bootstrap_servers": bootstrap, "topic": name, "group_id": f"reclock-{name}"}}
                    for name in SOURCES],
    }, sort_keys=False))


def produce_round(bootstrap: str, round_: int, rng: random.Random) -> dict[str, int]:
    """A slow topic (a couple of orders) and a fast one (dozens of clicks), keyed by user."""
    users = [f"user-{i}" for i in range(5)]
    orders = [(rng.choice(users), f"order-{round_}-{i}", i % SOURCES["orders"]) for i in range(2)]
    clicks = [(rng.choice(users), f"click-{round_}-{i}", i % SOURCES["clicks"]) for i in range(40)]
    produce(bootstrap, "orders", orders)
    produce(bootstrap, "clicks", clicks)
    return {"orders": len(orders), "clicks": len(clicks)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=REPO / "var" / "demo")
    args = parser.parse_args(argv)
    shutil.rmtree(args.dir, ignore_errors=True)
    args.dir.mkdir(parents=True)
    config = args.dir / "sources.yaml"
    env = airflow_env(args.dir / "airflow", config)

    say("starting a local Kafka-protocol broker (noida-db)")
    with LocalBroker(data_dir=str(args.dir / "broker")) as broker:
        for topic, partitions in SOURCES.items():
            create_topic(broker.bootstrap, topic, partitions=partitions)
        write_config(config, broker.bootstrap)
        print(f"broker at {broker.bootstrap}; config {config}")
        say("initialising Airflow (SQLite) in var/demo/airflow")
        migrate(args.dir / "airflow", env)

        rng, times = random.Random(7), []
        for round_ in range(1, args.rounds + 1):
            produced = produce_round(broker.bootstrap, round_, rng)
            say(f"round {round_}/{args.rounds}: produced {produced}; ticking both clocks, running both DAGs")
            ticks = [pipeline.tick(name, str(config)) for name in SOURCES]  # one moment for both sources
            times.append(max(t["into_time"] for t in ticks))
            bound = ", ".join(f"{name} {tick['frontier']}" for name, tick in zip(SOURCES, ticks))
            print(f"  bound {bound} by IntoTime {times[-1]}", flush=True)
            for name in SOURCES:
                started = time.monotonic()
                run([AIRFLOW, "dags", "test", f"reclock_{name}"], env, timeout=900)
                print(f"  reclock_{name}: success in {time.monotonic() - started:.0f}s", flush=True)

        say("status of every source")
        print(run([*CLI, "--config", str(config), "status"], env))
        for round_, t in enumerate(times, 1):
            say(f"AS OF join of orders and clicks at round {round_}'s tick: the same answer whenever it is asked")
            print(run([*CLI, "--config", str(config), "query", "--as-of", str(t), "--sql", JOIN], env, stderr=False))
        say(f"done: the tables are Delta Lake under {args.dir / 'warehouse'}; "
            f"query them with: reclock --config {config} query --as-of latest --sql '...'")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
