#!/usr/bin/env python
"""The spark-connect service of docker-compose.yaml: the Spark Connect server of the pyspark pin's Spark
(4.1.1; its spark-connect jar ships in the wheel), on the sources file's Spark master, configured like
every reclock session, with Delta's Connect plugins so that clients (``sc://spark-connect:15002``,
``RECLOCK_SPARK_REMOTE``) get Delta tables and ``DeltaTable`` over Connect.

    spark-submit --master <spark.master> --name reclock-connect
                 --class org.apache.spark.sql.connect.service.SparkConnectServer --conf K=V ...

    conf = reclock.spark.session.session_conf(s3)   the jars (delta-spark, spark-sql-kafka; S3A for an s3://
                                                    warehouse), Delta's SQL extension and catalog, UTC, ...
         + the sources file's spark.conf            S3A endpoint and keys, executor sizes, spark.driver.host
                                                    (SPARK_DRIVER_HOST: this service's name, executors connect
                                                    back to the server, which is the driver: client mode)
         + the Delta Connect plugins                spark.connect.extensions.{relation,command}.classes, and
                                                    their jars (var/jars/spark-connect) added to spark.jars
         + spark.connect.grpc.binding.port          RECLOCK_CONNECT_PORT, default 15002

The server's driver runs in this container: a standalone master takes no Python application in cluster
deploy mode, and the Connect server is the driver by design.  A missing plugin jar fails here, naming the
folder, not at the first DeltaTable call.

Usage: spark-connect-server.py [--print]   (--print: the command, one argument a line, instead of running it)
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_PORT = 15002
DELTA_CONNECT_CONF = {
    "spark.connect.extensions.relation.classes": "org.apache.spark.sql.connect.delta.DeltaRelationPlugin",
    "spark.connect.extensions.command.classes": "org.apache.spark.sql.connect.delta.DeltaCommandPlugin",
}


class ConnectSetupError(RuntimeError):
    """The Connect server cannot get the Delta Connect plugin jars."""


def connect_jars_dir() -> Path:
    """var/jars/spark-connect beside the session jars (``RECLOCK_SPARK_CONNECT_JARS`` names another folder)."""
    from reclock.spark.session import jars_dir

    return Path(os.environ.get("RECLOCK_SPARK_CONNECT_JARS", jars_dir().parent / "spark-connect"))


def connect_jars(folder: Path) -> list[str]:
    jars = sorted(str(p) for p in folder.glob("*.jar"))
    if not any(Path(j).name.startswith("delta-connect-server_") for j in jars):
        raise ConnectSetupError(f"no delta-connect-server jar in {folder}: the image build fetches it "
                                "(jvm/fetch-jars.sh ... spark-connect, from jvm/spark-connect/pom.xml)")
    return jars


def connect_conf(config, jars: list[str], port: int = DEFAULT_PORT) -> dict[str, str]:
    """The server's ``--conf``: reclock's session conf, the sources file's ``spark.conf``, the plugins, the port."""
    from reclock.spark.session import session_conf

    conf = {**session_conf(s3=config.warehouse.startswith("s3")), **config.spark_conf}
    conf["spark.jars"] = ",".join([*filter(None, conf["spark.jars"].split(",")), *jars])
    if config.spark_master.startswith(("local", "spark://")):
        conf.setdefault("spark.pyspark.python", sys.executable)  # Python UDFs: the workers run this image's Python
    return {**conf, **DELTA_CONNECT_CONF, "spark.connect.grpc.binding.port": str(port)}


def server_argv(master: str, conf: dict[str, str], spark_submit: str = "spark-submit") -> list[str]:
    argv = [spark_submit, "--master", master, "--name", "reclock-connect", "--class", CONNECT_SERVER_CLASS]
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    return argv


def spark_submit_binary() -> str:
    """This interpreter's spark-submit (pip's, which finds SPARK_HOME through $PYSPARK_PYTHON)."""
    local = Path(sys.executable).parent / "spark-submit"
    return str(local) if local.exists() else "spark-submit"


def main(args: list[str]) -> None:
    from reclock.config import load_config
    from reclock.spark.session import SparkSetupError

    if args not in ([], ["--print"]):
        sys.exit(f"usage: {sys.argv[0]} [--print]")
    config = load_config()
    port = int(os.environ.get("RECLOCK_CONNECT_PORT", DEFAULT_PORT))
    try:
        argv = server_argv(config.spark_master, connect_conf(config, connect_jars(connect_jars_dir()), port),
                           spark_submit_binary())
    except (ConnectSetupError, SparkSetupError) as e:
        sys.exit(f"spark-connect-server: {e}")
    if args == ["--print"]:
        print("\n".join(argv))
        return
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
