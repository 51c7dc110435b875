"""spark-submit entry point: stage every pending binding of one source as Parquet files.

    spark-submit spark_jobs/reclock_job.py --config include/sources.yaml --source orders
"""
import argparse
import json
import logging

from reclock import pipeline
from reclock.spark_session import submitted_spark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--source", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    spark = submitted_spark(f"reclock-{args.source}")
    try:
        print(json.dumps(pipeline.stage(args.source, args.config, spark)))
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
