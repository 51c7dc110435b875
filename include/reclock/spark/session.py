"""Spark sessions with Delta Lake and Spark's Kafka source: local by default, any master by argument
or ``RECLOCK_SPARK_MASTER``, or a long-lived Spark Connect server (``remote``, ``sc://host:port``).

The JVM jars Spark lacks (delta-spark, spark-sql-kafka and their dependencies) are fetched by
``make setup`` from ``jvm/spark/pom.xml`` into ``var/jars/spark`` (``RECLOCK_SPARK_JARS`` names another
folder, e.g. in a container image).  A session on a local master puts them on its driver's classpath
(``spark.driver.extraClassPath``: its executors are the driver); any other master gets them as ``spark.jars``,
which the driver serves to its executors.  ``spark.jars`` on a local master would copy every jar into the
driver's scratch directory at each start (2-3 s and 640 MB with the S3 jars, left behind by a JVM that is
killed).

A session on a master starts a JVM (the driver) in this process: seconds before the first job.  A
*remote* session is a thin Spark Connect client of a server that stays up (:func:`connect_server_command`
starts one with reclock's jars and settings; ``devtools/spark_connect.py`` runs it locally): the session
costs a gRPC handshake, and the server's JVM is warm.  The server holds what a session on a master gets at
its start (jars, Delta's extension, memory, the Python of its workers, which must import reclock); a remote
session only sets the runtime SQL settings (:func:`runtime_conf`).  PySpark switches a process that opened a
remote session to Spark Connect for good (``pyspark.sql.functions`` build Connect columns from then on), so
one process uses either a master or a remote, not both.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

JARS = Path(__file__).resolve().parents[3] / "var" / "jars" / "spark"
S3_JARS = JARS.parent / "spark-s3"
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


class SparkSetupError(RuntimeError):
    """Spark cannot get the jars reclock needs."""


def jars_dir() -> Path:
    return Path(os.environ.get("RECLOCK_SPARK_JARS", JARS))


def spark_jars(s3: bool = False) -> list[str]:
    """The jars a reclock session loads: delta-spark and spark-sql-kafka with their dependencies, and with
    ``s3`` (or ``RECLOCK_SPARK_S3=1``) hadoop-aws for ``s3a://`` (``RECLOCK_SPARK_S3_JARS`` names its folder)."""
    folder = jars_dir()
    jars = sorted(str(p) for p in folder.glob("*.jar"))
    if not any("delta-spark" in j for j in jars) or not any("spark-sql-kafka" in j for j in jars):
        raise SparkSetupError(f"no delta-spark / spark-sql-kafka jars in {folder}: run `make setup` "
                              "(Maven copies them from jvm/spark/pom.xml) or set RECLOCK_SPARK_JARS")
    if s3 or os.environ.get("RECLOCK_SPARK_S3") == "1":
        s3_folder = Path(os.environ.get("RECLOCK_SPARK_S3_JARS", S3_JARS))
        s3_jars = sorted(str(p) for p in s3_folder.glob("*.jar"))
        if not any("hadoop-aws" in j for j in s3_jars):
            raise SparkSetupError(f"no hadoop-aws jars in {s3_folder}: run `make setup` (jvm/spark-s3/pom.xml)")
        jars += s3_jars
    return jars


def session_conf(s3: bool = False, master: str | None = None) -> dict[str, str]:
    """What every reclock session on ``master`` is configured with (also what spark-submit gets as --conf):
    the jars on the driver's classpath for a local master, as ``spark.jars`` for any other (or ``None``)."""
    jars = spark_jars(s3)
    if master is not None and is_local(master):
        return {"spark.driver.extraClassPath": os.pathsep.join(jars), **_settings()}
    return {"spark.jars": ",".join(jars), **_settings()}


def is_local(master: str) -> bool:
    """Whether ``master`` runs its executors in the driver's JVM (``local``, ``local[4]``, ``local[*, 2]``)."""
    return master == "local" or master.startswith("local[")


def _settings() -> dict[str, str]:
    """:func:`session_conf` but the jars (a Spark Connect client has none)."""
    return {
        **DELTA_CONF,
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.databricks.delta.snapshotPartitions": "2",
        # Delta VACUUM lists files in this many tasks (Spark's default, 10000, costs minutes on small tables).
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": "4",
        "spark.driver.memory": os.environ.get("RECLOCK_SPARK_DRIVER_MEMORY", "2g"),
        # Kafka consumers pooled for the next read (reclock.spark.kafka.reader_group): one per source's partition
        # and concurrent read.  At Spark's default, 64, a source of 64 partitions kept the pool full, and every
        # consumer taken then closed idle ones first, the sources' own.
        "spark.kafka.consumer.cache.capacity": "1024",
    }


#: What only a JVM's start can set: a remote session leaves them to its server (:func:`connect_server_command`).
STATIC_CONF = ("spark.jars", "spark.sql.extensions", "spark.sql.catalog.spark_catalog", "spark.ui.", "spark.driver.",
               "spark.executor.", "spark.pyspark.", "spark.hadoop.", "spark.connect.", "spark.master", "spark.app.",
               "spark.kafka.")


def runtime_conf(conf: dict[str, str]) -> dict[str, str]:
    """The settings of ``conf`` a Spark Connect session may set on its server session (runtime SQL settings)."""
    return {k: v for k, v in conf.items() if not k.startswith(STATIC_CONF)}


def connect_server_command(port: int, host: str = "0.0.0.0", master: str = "local[2]", s3: bool = False,
                           python: str | None = None, conf: dict | None = None) -> tuple[list[str], dict[str, str]]:
    """``(argv, environment)`` of a Spark Connect server for reclock: pyspark's ``spark-submit`` of Spark's
    ``SparkConnectServer`` (pyspark's jars include it) on ``master``, serving gRPC on ``host:port``, with
    :func:`session_conf` (reclock's jars, Delta) and ``conf`` (the sources file's ``spark.conf``) over it.

    Its Python workers (the "reclock" data source, e.g. a files source) must import reclock: they run ``python``
    (default this interpreter) with this reclock's ``include/`` first on ``PYTHONPATH``.  Restart the server when
    reclock's code changes: its Python workers are reused and keep the code they imported."""
    import pyspark

    python = python or sys.executable
    include = str(Path(__file__).resolve().parents[2])
    inherited = filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))
    pythonpath = os.pathsep.join(dict.fromkeys([include, *inherited]))
    spark_submit = Path(pyspark.__file__).resolve().parent / "bin" / "spark-submit"
    settings = {**session_conf(s3, master), "spark.connect.grpc.binding.address": host,
                "spark.connect.grpc.binding.port": str(port), "spark.pyspark.python": python,
                "spark.executorEnv.PYTHONPATH": pythonpath, **(conf or {})}
    argv = [str(spark_submit), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--master", master, "--name", "reclock-connect"]
    for key, value in settings.items():
        argv += ["--conf", f"{key}={value}"]
    env = {"PYSPARK_PYTHON": python, "PYTHONPATH": pythonpath, "SPARK_HOME": str(spark_submit.parents[1])}
    return argv + ["spark-internal"], env


def _builder(app_name: str, master: str | None, s3: bool = False, conf: dict | None = None):
    """``master`` ``None``: spark-submit chose it (and set the jars)."""
    from pyspark.sql import SparkSession

    # Python workers must import reclock: run them on this interpreter unless told otherwise.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in {**session_conf(s3, master), **(conf or {})}.items():
        builder = builder.config(key, value)
    return builder


def get_spark(master: str | None = None, app_name: str = "reclock", s3: bool = False, conf: dict | None = None,
              remote: str | None = None):
    """A session on ``master`` (default ``$RECLOCK_SPARK_MASTER`` or ``local[2]``); ``s3``: with s3a:// jars;
    ``conf``: the sources file's ``spark.conf`` (e.g. the s3a endpoint), over reclock's own settings.
    ``remote`` (the sources file's ``spark.remote``): a Spark Connect session of that server instead
    (:func:`remote_spark`), ``master`` and ``s3`` being the server's business.

    Like every ``getOrCreate``, an existing session of this process is returned (runtime settings applied).
    """
    if remote:
        return remote_spark(remote, app_name, conf)
    return _builder(app_name, master or os.environ.get("RECLOCK_SPARK_MASTER", "local[2]"), s3, conf).getOrCreate()


def remote_spark(url: str, app_name: str = "reclock", conf: dict | None = None):
    """A Spark Connect session of the server at ``url`` (``sc://host:port``) with reclock's runtime settings and
    those of ``conf`` (:func:`runtime_conf`: the others are the server's); :class:`SparkSetupError` when the server
    cannot be reached or lacks Delta (started without reclock's conf: :func:`connect_server_command`)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.remote(url).appName(app_name)
    for key, value in runtime_conf({**_settings(), **(conf or {})}).items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
        extensions = spark.conf.get("spark.sql.extensions", "") or ""
    except Exception as e:
        raise SparkSetupError(f"cannot open a Spark Connect session on {url}: {str(e).splitlines()[0]} (is the "
                              "server up? docs: operations/spark.md, A long-lived Spark)") from e
    if DELTA_CONF["spark.sql.extensions"] not in extensions:
        raise SparkSetupError(f"the Spark Connect server at {url} has no Delta Lake (spark.sql.extensions is "
                              f"{extensions!r}): start it with reclock's jars and settings (python -m "
                              "reclock.spark.session; docs: operations/spark.md, A long-lived Spark)")
    return spark


def is_remote(spark) -> bool:
    """Whether ``spark`` is a Spark Connect session."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def submitted_spark(app_name: str = "reclock", s3: bool = False):
    """The session of a job started by spark-submit, which chose the master."""
    return _builder(app_name, None, s3).getOrCreate()


def spark_schema(arrow_schema):
    """The Spark schema of an Arrow schema (``pyspark.sql.pandas.types.from_arrow_schema``)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(arrow_schema)


def main(argv: list[str] | None = None) -> int:
    """``python -m reclock.spark.session [--port 15002] [--master M] [--config F] [--print]``: run (exec) the Spark
    Connect server of :func:`connect_server_command`, with the sources file's ``spark.conf`` (s3a jars when its
    warehouse is on S3); ``--print`` prints the command instead."""
    import argparse
    import shlex

    parser = argparse.ArgumentParser(prog="python -m reclock.spark.session", description=main.__doc__)
    parser.add_argument("--port", type=int, default=15002)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--master", default=os.environ.get("RECLOCK_SPARK_MASTER", "local[2]"))
    parser.add_argument("--config", default=None,
                        help="the sources file (default: $RECLOCK_CONFIG or include/sources.yaml)")
    parser.add_argument("--print", action="store_true", help="print the command and its environment, run nothing")
    args = parser.parse_args(argv)
    from ..config import load_config

    config = load_config(args.config)
    argv_, env = connect_server_command(args.port, args.host, args.master, s3=config.warehouse.startswith("s3"),
                                        conf=config.spark_conf)
    if args.print:
        print(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()), shlex.join(argv_))
        return 0
    os.execve(argv_[0], argv_, {**os.environ, **env})


if __name__ == "__main__":
    raise SystemExit(main())
