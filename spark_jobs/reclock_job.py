"""spark-submit entry point: stage every pending binding of one source as Parquet files.

    spark-submit spark_jobs/reclock_job.py --config include/sources.yaml --source orders

With ``--replay-interval START END`` (IntoTime ms, half-open: an Airflow data interval) it replays
the published IntoTimes ``START <= t < END`` instead (``reclock.backfill.replay``, ``--mode verify``
or ``repair``): the job of the ``reclock_backfill_<source>`` DAG.
"""
import argparse
import json
import logging

from reclock import pipeline
from reclock.runtime import Runtime
from reclock.spark.session import submitted_spark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--replay-interval", nargs=2, type=int, metavar=("START", "END"),
                        help="replay the published IntoTimes START <= t < END (ms) instead of staging")
    parser.add_argument("--mode", default="verify", choices=["verify", "repair"])
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    spark = submitted_spark(f"reclock-{args.source}")
    runtime = Runtime.load(args.config, spark)
    try:
        if args.replay_interval is None:
            print(json.dumps(pipeline.stage(args.source, runtime)))
        else:
            from reclock.backfill import replay, window_of_interval
            start, end = window_of_interval(*args.replay_interval)
            print(json.dumps(replay(args.source, runtime, start, end, mode=args.mode)))
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
