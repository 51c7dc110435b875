"""docker-compose.yaml and docker/: validated by a Compose CLI when one is installed, checked at the
YAML level always.

* ``docker compose config --quiet`` (or ``docker-compose config --quiet``) validates the file
  against the Compose schema; no Docker engine is needed.  Without a Compose CLI that one test
  is skipped, saying so; Debian ships ``docker-compose`` (apt-get install docker-compose).
* The YAML checks interpolate ``${VAR:-default}`` with an empty environment (the defaults, as a
  fresh checkout runs) and check what the DAGs need: the services, Airflow 3 settings that the
  installed Airflow knows, the warehouse on S3, the Spark master in the connection and the
  config, the broker and bucket the config names, and depends_on/healthcheck consistency.
* docker/sources.yaml is loaded with the Airflow services' environment, and the DAGs are parsed
  with it by a real DagBag (in a subprocess, like tests/test_dags.py).
* The image (docker/Dockerfile): Airflow installed with its release's constraints file, the runtime
  requirements only (no test tools), the versions of the poms and pins; the Spark Connect service's
  command as docker/spark-connect-server.py builds it from the compose environment.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from airflow_env import DAGS_FOLDER, PYTHON, REPO, airflow_env, run_python

COMPOSE_FILE = REPO / "docker-compose.yaml"
DOCKERFILE = REPO / "docker" / "Dockerfile"
SOURCES = REPO / "docker" / "sources.yaml"

AIRFLOW = ["airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"]
SPARK = ["spark-master", "spark-worker-1", "spark-worker-2", "spark-connect"]
RECLOCK_IMAGE_SERVICES = AIRFLOW + SPARK
SERVICES = RECLOCK_IMAGE_SERVICES + ["postgres", "kafka", "kafka-init", "minio", "minio-init"]
# Paths inside the image (docker/Dockerfile: WORKDIR /opt/reclock, the repository copied there).
IMAGE_REPO = "/opt/reclock"


# --- Compose CLI ---------------------------------------------------------------------------------


def compose_cli() -> list[str] | None:
    """``docker compose`` (the v2 plugin) if it answers, else ``docker-compose``, else None."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_compose_config_validates(tmp_path):
    cli = compose_cli()
    if cli is None:
        pytest.skip("no Compose CLI: neither `docker compose` nor `docker-compose` is installed "
                    "(Debian: apt-get install docker-compose); the YAML-level checks still ran")
    # Compose reads .env and the shell: validate with the file's own defaults, as a fresh checkout would.
    # (`docker compose config` also checks that every bind-mounted file and build context exists.)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "RECLOCK_", "AIRFLOW"))}
    (tmp_path / "empty.env").write_text("")
    base = [*cli, "-f", str(COMPOSE_FILE), "--project-directory", str(REPO), "--env-file", str(tmp_path / "empty.env")]
    proc = subprocess.run([*base, "config", "--quiet"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{' '.join(cli)} config failed:\n{proc.stdout}\n{proc.stderr}"
    # The resolved model agrees with the YAML-level reading below.
    proc = subprocess.run([*base, "config"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    resolved = yaml.safe_load(proc.stdout)["services"]
    assert sorted(resolved) == sorted(SERVICES)
    scheduler = resolved["airflow-scheduler"]["environment"]
    ours = services()["airflow-scheduler"]["environment"]
    for key in ("RECLOCK_WAREHOUSE", "RECLOCK_SPARK_MASTER", "RECLOCK_SPARK_REMOTE", "AIRFLOW_CONN_RECLOCK_SPARK",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CORE__EXECUTION_API_SERVER_URL"):
        assert str(scheduler[key]) == ours[key], key


# --- YAML-level model ----------------------------------------------------------------------------

_VAR = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def interpolate(value, env: dict[str, str]):
    """Compose's interpolation: ``$$``, ``$VAR``, ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        if m.group(1):
            return "$"
        name = m.group(2) or m.group(5)
        op, arg = m.group(3), m.group(4)
        current = env.get(name)
        if op == ":-":
            return current if current else arg
        if op == "-":
            return arg if current is None else current
        if op in (":?", "?"):
            if not current:
                raise AssertionError(f"required variable {name} is unset: {arg}")
            return current
        return current or ""

    return _VAR.sub(sub, value)


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v).lower() if isinstance(v, bool) else str(v) for k, v in env.items()}


def services(env: dict[str, str] | None = None) -> dict[str, dict]:
    """The services with variables interpolated (default: as with no variables set) and env as strings."""
    doc = interpolate(yaml.safe_load(COMPOSE_FILE.read_text()), env or {})
    out = {}
    for name, service in doc["services"].items():
        service = dict(service)
        service["environment"] = environment(service)
        out[name] = service
    return out


def depends_on(service: dict) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return {d: "service_started" for d in deps}
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def command(service: dict) -> list[str]:
    cmd = service.get("command") or []
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


@pytest.fixture(scope="module")
def svc() -> dict[str, dict]:
    return services()


@pytest.fixture(scope="module")
def airflow_vars(svc) -> dict[str, str]:
    return svc["airflow-scheduler"]["environment"]


def test_services_exist(svc):
    assert sorted(svc) == sorted(SERVICES)


def test_reclock_services_share_the_one_image(svc):
    images = {svc[name]["image"] for name in RECLOCK_IMAGE_SERVICES}
    assert len(images) == 1, images
    for name in RECLOCK_IMAGE_SERVICES:
        build = svc[name]["build"]
        assert (REPO / build["context"]).resolve() == REPO
        assert (REPO / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    assert svc["postgres"]["image"].startswith("postgres:15")
    assert svc["minio"]["image"].startswith("minio/minio")
    assert svc["minio-init"]["image"].startswith("minio/mc")
    assert svc["kafka"]["image"] == svc["kafka-init"]["image"]


def test_airflow_settings_are_known_to_the_installed_airflow(svc):
    """Every AIRFLOW__SECTION__KEY is an option of this Airflow's config.yml (a typo is silently ignored)."""
    spec = importlib.util.find_spec("airflow")
    assert spec and spec.submodule_search_locations
    template = Path(list(spec.submodule_search_locations)[0]) / "config_templates" / "config.yml"
    known = {(section, key) for section, body in yaml.safe_load(template.read_text()).items()
             for key in (body.get("options") or {})}
    for name in AIRFLOW:
        for var in svc[name]["environment"]:
            if var.startswith("AIRFLOW__"):
                section, key = var[len("AIRFLOW__"):].lower().split("__", 1)
                assert (section, key) in known, f"{name}: {var} is not an Airflow {spec.name} option"


def test_airflow_3_essentials(svc, airflow_vars):
    for name in AIRFLOW:
        env = dict(svc[name]["environment"])
        if name == "airflow-init":  # the UI password goes to the job that writes it, nowhere else
            assert env.pop("AIRFLOW_ADMIN_PASSWORD") == "admin"
        assert env == airflow_vars, f"{name} has a different Airflow environment"
    assert "AIRFLOW_ADMIN_PASSWORD" not in airflow_vars
    assert airflow_vars["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert airflow_vars["AIRFLOW__CORE__AUTH_MANAGER"].endswith("simple_auth_manager.SimpleAuthManager")
    assert airflow_vars["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == "admin:admin"
    assert airflow_vars["AIRFLOW__CORE__DAGS_FOLDER"] == f"{IMAGE_REPO}/dags"
    assert airflow_vars["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"
    # The commands of Airflow 3's components.
    assert command(svc["airflow-apiserver"]) == ["airflow", "api-server"]
    assert command(svc["airflow-scheduler"]) == ["airflow", "scheduler"]
    assert command(svc["airflow-dag-processor"]) == ["airflow", "dag-processor"]
    assert command(svc["airflow-triggerer"]) == ["airflow", "triggerer"]
    init = command(svc["airflow-init"])
    assert init[0].startswith(IMAGE_REPO)
    script = REPO / init[0][len(IMAGE_REPO) + 1:]
    assert "airflow db migrate" in script.read_text()
    assert os.access(script, os.X_OK)
    # Task processes reach the execution API on the api-server service's container port.
    url = urlsplit(airflow_vars["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    assert (url.scheme, url.hostname, url.port, url.path) == ("http", "airflow-apiserver", 8080, "/execution/")
    assert any(str(p).endswith(":8080") for p in svc["airflow-apiserver"]["ports"])
    # One JWT secret for the scheduler (issues task tokens) and the api-server (checks them).
    assert len(airflow_vars["AIRFLOW__API_AUTH__JWT_SECRET"]) >= 64


def test_metadata_db_is_the_airflow_database_on_postgres(svc, airflow_vars):
    from sqlalchemy.engine import make_url

    for key in ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"):
        url = make_url(airflow_vars[key])
        assert (url.host, url.port, url.database) == ("postgres", 5432, "airflow"), key
        assert url.password == svc["postgres"]["environment"]["AIRFLOW_DB_PASSWORD"]
        # The driver is installed (requirements.txt pins psycopg 3; there is no psycopg2 or asyncpg).
        dialect = url.get_dialect()
        assert importlib.util.find_spec(dialect.driver) is not None, f"{key}: driver {dialect.driver} missing"
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(airflow_vars["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"])  # no connection yet
    assert engine.dialect.is_async
    init = (REPO / "docker" / "postgres-init.sh").read_text()
    assert "CREATE DATABASE airflow OWNER airflow" in init and "CREATE DATABASE source OWNER reclock" in init
    assert "REPLICATION" in init and "ALTER TABLE public.orders OWNER TO reclock" in init


def test_postgres_is_logical_and_initialised_by_the_script(svc):
    pg = svc["postgres"]
    assert "wal_level=logical" in command(pg)
    mounts = [str(v) for v in pg["volumes"]]
    assert any(m.startswith("./docker/postgres-init.sh:/docker-entrypoint-initdb.d/") for m in mounts)
    assert os.access(REPO / "docker" / "postgres-init.sh", os.X_OK)


def test_warehouse_on_s3_and_its_bucket_is_created(svc, airflow_vars):
    warehouse = urlsplit(airflow_vars["RECLOCK_WAREHOUSE"])
    assert warehouse.scheme == "s3" and (warehouse.netloc, warehouse.path) == ("reclock", "/warehouse")
    assert svc["minio-init"]["environment"]["S3_BUCKET"] == warehouse.netloc
    assert "mc mb" in " ".join(map(str, svc["minio-init"]["entrypoint"]))
    # The S3 credentials the reclock containers use are MinIO's root user.
    minio = svc["minio"]["environment"]
    assert (airflow_vars["AWS_ACCESS_KEY_ID"], airflow_vars["AWS_SECRET_ACCESS_KEY"]) == (
        minio["MINIO_ROOT_USER"], minio["MINIO_ROOT_PASSWORD"])
    assert urlsplit(airflow_vars["S3_ENDPOINT_URL"]).hostname == "minio"


def test_spark_master_url_in_connection_and_config(svc, airflow_vars):
    conn = json.loads(airflow_vars["AIRFLOW_CONN_RECLOCK_SPARK"])
    assert conn == {"conn_type": "spark", "host": "spark://spark-master:7077"}
    assert airflow_vars["RECLOCK_SPARK_MASTER"] == conn["host"]
    master = svc["spark-master"]
    assert master["hostname"] == "spark-master"
    cmd = command(master)
    assert cmd[:2] == ["spark-class", "org.apache.spark.deploy.master.Master"]
    assert cmd[cmd.index("--port") + 1] == "7077"
    for worker in ("spark-worker-1", "spark-worker-2"):  # spark-connect: test_spark_connect_service
        cmd = command(svc[worker])
        assert cmd[:3] == ["spark-class", "org.apache.spark.deploy.worker.Worker", conn["host"]]
        assert depends_on(svc[worker]) == {"spark-master": "service_healthy"}
        assert svc[worker]["environment"]["RECLOCK_WAREHOUSE"] == airflow_vars["RECLOCK_WAREHOUSE"]
    # Client deploy mode: executors connect back to the driver in the scheduler container.
    assert svc["airflow-scheduler"]["hostname"] == airflow_vars["SPARK_DRIVER_HOST"]


def test_kafka_topics_and_listeners(svc, airflow_vars):
    host, _, port = airflow_vars["KAFKA_BOOTSTRAP_SERVERS"].partition(":")
    assert host == "kafka" and f"PLAINTEXT://{host}:{port}" in svc["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    topics = set(svc["kafka-init"]["environment"]["KAFKA_TOPICS"].split())
    kafka = [s for s in yaml.safe_load(SOURCES.read_text())["sources"] if s["kind"] == "kafka"]
    assert kafka and {s["options"]["topic"] for s in kafka} <= topics


def test_depends_on_and_healthchecks_are_consistent(svc):
    for name, service in svc.items():
        for dep, condition in depends_on(service).items():
            assert dep in svc, f"{name} depends on unknown {dep}"
            if condition == "service_healthy":
                assert "healthcheck" in svc[dep], f"{name} waits for {dep} to be healthy; it has no healthcheck"
            elif condition == "service_completed_successfully":
                assert svc[dep].get("restart") == "no", f"{dep} is a one-shot job: restart must be 'no'"
            else:
                assert condition == "service_started", condition
    long_running = [n for n, s in svc.items() if s.get("restart") != "no"]
    for name in long_running:
        assert "healthcheck" in svc[name], f"{name} has no healthcheck"
    for name in AIRFLOW:
        if name != "airflow-init":
            assert depends_on(svc[name])["airflow-init"] == "service_completed_successfully"
    assert depends_on(svc["airflow-init"])["postgres"] == "service_healthy"
    scheduler = depends_on(svc["airflow-scheduler"])
    assert {"kafka-init", "minio-init", "airflow-apiserver"} <= set(scheduler)
    # The local Spark cluster is optional (an existing cluster can replace it): nothing Airflow waits for.
    for name in AIRFLOW:
        assert not set(depends_on(svc[name])) & set(SPARK), name


def test_bind_mounts_and_dockerfile_copies_exist(svc):
    for name, service in svc.items():
        for volume in service.get("volumes") or []:
            source = str(volume).split(":", 1)[0]
            if source.startswith("."):
                assert (REPO / source).exists(), f"{name}: bind mount source {source} is missing"
    text = DOCKERFILE.read_text()
    for line in re.findall(r"^COPY\s+(.+)$", text, re.M):
        *sources, _ = line.split()
        for source in sources:
            assert (REPO / source).exists(), f"Dockerfile copies {source}, which is not in the repository"


def dockerfile_args() -> dict[str, str]:
    """The Dockerfile's ``ARG NAME=default`` values, expanded (``${OTHER}`` from an earlier ARG)."""
    args: dict[str, str] = {}
    for name, default in re.findall(r"^ARG\s+([A-Za-z_][A-Za-z0-9_]*)=(\S+)$", DOCKERFILE.read_text(), re.M):
        args[name] = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], default)
    return args


def pip_installs(text: str) -> list[str]:
    """The ``pip install`` commands of the Dockerfile's RUN lines (continuations joined)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [m.strip() for line in re.findall(r"^RUN\s+(.+)$", joined, re.M)
            for m in re.split(r"&&|;", line) if m.strip().startswith("pip install")]


def test_dockerfile_matches_the_pins():
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM python:\$\{PYTHON_VERSION\}-slim", text, re.M)
    # The image's Python is the one the tests run on.
    assert dockerfile_args()["PYTHON_VERSION"] == "%d.%d" % sys.version_info[:2]
    assert "openjdk-17-jre-headless maven " in text
    assert "pip install --no-deps -e ." in text
    # The jars are the poms' (jvm/fetch-jars.sh, after pyspark is installed: it drops what pyspark ships), in
    # var/jars/ under the image's repository, where reclock.spark.session looks, as in a checkout.  The
    # Connect plugins after spark: fetch-jars drops what var/jars/spark has.
    steps = ['--constraint "${AIRFLOW_CONSTRAINTS_URL}"', "-r requirements-runtime.txt", "COPY jvm/ jvm/",
             "bash jvm/fetch-jars.sh /usr/local/bin/python spark spark-s3 spark-connect",
             "pip install --no-deps -e .", "python docker/spark-connect-server.py --print"]
    assert [text.index(step) for step in steps] == sorted(text.index(step) for step in steps)
    assert f"WORKDIR {IMAGE_REPO}\n" in text and "!jvm/" in (REPO / "docker" / "Dockerfile.dockerignore").read_text()
    from reclock.spark import session as spark_session

    assert (spark_session.JARS, spark_session.S3_JARS) == (REPO / "var" / "jars" / "spark", REPO / "var" / "jars" / "spark-s3")


def pom_properties(name: str) -> dict[str, str]:
    """The ``<properties>`` of jvm/<name>/pom.xml."""
    from xml.etree import ElementTree

    properties = ElementTree.parse(REPO / "jvm" / name / "pom.xml").getroot().find("{*}properties")
    return {element.tag.split("}")[1]: element.text for element in properties}


def test_versions_agree_with_the_poms_and_pins(svc):
    import pyspark

    pins = runtime_pins()
    spark = pom_properties("spark")
    assert pins["pyspark"] == pins["pyspark-client"] == pyspark.__version__ == spark["spark.version"]
    assert pins["delta-spark"] == spark["delta.version"] == pom_properties("spark-connect")["delta.version"]
    # hadoop-aws is the Hadoop of the client jars inside the installed pyspark wheel.
    [client] = (Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar")
    assert client.name == f"hadoop-client-api-{pom_properties('spark-s3')['hadoop.version']}.jar"
    # The compose broker is the Kafka the tests run (jvm/kafka-broker/pom.xml).
    kafka = pom_properties("kafka-broker")["kafka.version"]
    assert svc["kafka"]["image"] == svc["kafka-init"]["image"] == f"apache/kafka:{kafka}"
    # Kafka 4 has no ZooKeeper: one KRaft node is broker and controller, voting for itself.
    assert int(kafka.split(".")[0]) >= 4
    env = svc["kafka"]["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{env['KAFKA_NODE_ID']}@kafka:9093"
    assert not any("ZOOKEEPER" in key for key in env)


# --- the image's Python packages: Airflow with its constraints, the runtime without the test tools -----

RUNTIME = REPO / "requirements-runtime.txt"
#: requirements.txt's own packages: the test runner, the docs site's and the import rules' (lint-imports).
TEST_TOOLS = {"pytest", "pytest-xdist", "hypothesis", "moto", "mkdocs", "mkdocs-material", "import-linter", "setuptools",
              "apache-airflow-providers-celery", "celery"}  # the last two: make soak's production part


def requirement_names(path: Path) -> set[str]:
    """The projects a requirements file names itself (not through ``-r``), normalised."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    lines = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    return {canonicalize_name(Requirement(line).name) for line in lines if line and not line.startswith("-")}


def runtime_pins() -> dict[str, str]:
    return dict(re.findall(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==(\S+)$", RUNTIME.read_text(), re.M))


def installed_closure(names: set[str]) -> set[str]:
    """``names`` and everything they require, transitively, as installed here (extras they ask for included)."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    lines = [line.split("#", 1)[0].strip() for line in RUNTIME.read_text().splitlines()]
    todo = [(canonicalize_name(r.name), frozenset(r.extras)) for r in map(Requirement, filter(None, lines))
            if canonicalize_name(r.name) in names]
    seen: set[tuple[str, frozenset]] = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            continue  # a marker-excluded or optional dependency that is not installed here
        for req in map(Requirement, requires):
            envs = [{"extra": e} for e in extras] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((canonicalize_name(req.name), frozenset(req.extras)))
    return {name for name, _ in seen}


def test_image_installs_airflow_with_its_constraints():
    """Airflow's documented install: ``apache-airflow==X`` with constraints-X/constraints-<python>.txt, alone;
    the project's own requirements after it, without the constraints and with apache-airflow==X again."""
    args = dockerfile_args()
    pins = runtime_pins()
    assert args["AIRFLOW_VERSION"] == pins["apache-airflow"]
    python = "%d.%d" % sys.version_info[:2]
    assert args["AIRFLOW_CONSTRAINTS_URL"] == (
        f"https://raw.githubusercontent.com/apache/airflow/constraints-{pins['apache-airflow']}/constraints-{python}.txt")
    installs = pip_installs(DOCKERFILE.read_text())
    constrained = [cmd for cmd in installs if "--constraint" in cmd or " -c " in cmd]
    assert constrained == ['pip install "apache-airflow==${AIRFLOW_VERSION}" --constraint "${AIRFLOW_CONSTRAINTS_URL}"']
    [runtime] = [cmd for cmd in installs if "-r " in cmd]
    assert runtime == 'pip install "apache-airflow==${AIRFLOW_VERSION}" -r requirements-runtime.txt'
    assert installs.index(constrained[0]) < installs.index(runtime)
    # The later installs: the project itself, with no dependencies.
    assert installs[2:] == ["pip install --no-deps -e ."]
    for arg in ("PYTHON_VERSION", "AIRFLOW_VERSION", "AIRFLOW_CONSTRAINTS_URL"):
        assert re.search(rf"^ARG {arg}\b", DOCKERFILE.read_text(), re.M), f"{arg} is not a build arg"


def test_image_has_no_test_tools():
    """The image installs requirements-runtime.txt; requirements.txt (make setup) is it plus the test tools."""
    text = "\n".join(line for line in DOCKERFILE.read_text().splitlines() if not line.startswith("#"))
    assert "requirements.txt" not in text.replace("requirements-runtime.txt", "")
    ignore = (REPO / "docker" / "Dockerfile.dockerignore").read_text().split()
    assert "!requirements-runtime.txt" in ignore and "!requirements.txt" not in ignore
    runtime = requirement_names(RUNTIME)
    dev = requirement_names(REPO / "requirements.txt")
    assert "-r requirements-runtime.txt" in (REPO / "requirements.txt").read_text().splitlines()
    assert dev == TEST_TOOLS and not runtime & TEST_TOOLS
    # Nothing the runtime requires pulls a test tool in (the installed dependency graph, transitively).
    closure = installed_closure(runtime)
    assert {"apache-airflow", "pyspark", "great-expectations", "deltalake"} <= closure
    assert not closure & TEST_TOOLS, sorted(closure & TEST_TOOLS)
    # make setup still installs everything the tests need, and reinstalls when either file changes.
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^\$\(STAMP\): requirements\.txt requirements-runtime\.txt ", makefile, re.M)
    assert "$(BIN)/pip install --quiet -r requirements.txt" in makefile


# --- Spark Connect -------------------------------------------------------------------------------------

CONNECT_SCRIPT = REPO / "docker" / "spark-connect-server.py"


def connect_launcher():
    spec = importlib.util.spec_from_file_location("spark_connect_server", CONNECT_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_spark_connect_service(svc, airflow_vars):
    connect = svc["spark-connect"]
    assert connect["hostname"] == "spark-connect"
    assert command(connect) == [f"{IMAGE_REPO}/docker/spark-connect-server.py"]
    assert os.access(CONNECT_SCRIPT, os.X_OK) and CONNECT_SCRIPT.read_text().startswith("#!/usr/bin/env python\n")
    env = connect["environment"]
    # Its driver is the server itself: executors connect back to this container.
    assert env["SPARK_DRIVER_HOST"] == connect["hostname"]
    assert env["RECLOCK_SPARK_MASTER"] == airflow_vars["RECLOCK_SPARK_MASTER"] == "spark://spark-master:7077"
    assert env["RECLOCK_CONFIG"] == airflow_vars["RECLOCK_CONFIG"]
    port = int(env["RECLOCK_CONNECT_PORT"])
    assert port == connect_launcher().DEFAULT_PORT == 15002
    assert [str(p) for p in connect["ports"]] == [f"127.0.0.1:{port}:{port}"]
    assert f"('localhost', {port})" in " ".join(connect["healthcheck"]["test"])
    assert depends_on(connect) == {"spark-master": "service_healthy"}
    assert "./docker/sources.yaml:/opt/reclock/docker/sources.yaml:ro" in connect["volumes"]
    # The Airflow services (and reclock in them) reach it by that name and port.
    remote = urlsplit(airflow_vars["RECLOCK_SPARK_REMOTE"])
    assert (remote.scheme, remote.hostname, remote.port) == ("sc", connect["hostname"], port)
    # SPARK_REMOTE_URL= (empty) turns it off, as the README says.
    assert services({"SPARK_REMOTE_URL": ""})["airflow-scheduler"]["environment"]["RECLOCK_SPARK_REMOTE"] == ""


def test_spark_connect_plugin_jars_are_the_delta_pin():
    """jvm/spark-connect/pom.xml: delta-connect-server for the pyspark pin's Spark line, at the delta-spark pin."""
    from xml.etree import ElementTree

    import pyspark

    pom = ElementTree.parse(REPO / "jvm" / "spark-connect" / "pom.xml").getroot()
    [dep] = pom.find("{*}dependencies")
    line = ".".join(pyspark.__version__.split(".")[:2])
    assert (dep.findtext("{*}groupId"), dep.findtext("{*}artifactId"), dep.findtext("{*}version")) == (
        "io.delta", f"delta-connect-server_{line}_2.13", "${delta.version}")
    assert pom_properties("spark-connect")["delta.version"] == runtime_pins()["delta-spark"]
    # delta-spark itself comes from jvm/spark (one copy on the server's classpath).
    excluded = {e.findtext("{*}artifactId") for e in dep.findall(".//{*}exclusion")}
    assert excluded == {f"delta-spark_{line}_2.13"}
    spark = ElementTree.parse(REPO / "jvm" / "spark" / "pom.xml").getroot().find("{*}dependencies")
    assert f"delta-spark_{line}_2.13" in {d.findtext("{*}artifactId") for d in spark}
    # A checkout's make setup does not fetch them (fetch-jars' default); the image build does.
    fetch = (REPO / "jvm" / "fetch-jars.sh").read_text()
    assert "grep -vx spark-connect" in fetch


# --- the reclock config and the DAGs under the compose environment ---------------------------------


def config_env(airflow_vars: dict[str, str]) -> dict[str, str]:
    """The Airflow services' environment, with the image's paths mapped to this checkout."""
    env = dict(airflow_vars)
    env["RECLOCK_CONFIG"] = str(SOURCES)
    return env


def test_sources_yaml_under_the_compose_environment(monkeypatch, airflow_vars):
    from sqlalchemy.engine import make_url

    from reclock.config import load_config

    assert airflow_vars["RECLOCK_CONFIG"] == f"{IMAGE_REPO}/docker/sources.yaml"
    for key in list(os.environ):
        if key.startswith(("RECLOCK_", "AWS_", "S3_", "SPARK_", "KAFKA_")):
            monkeypatch.delenv(key)
    for key, value in config_env(airflow_vars).items():
        monkeypatch.setenv(key, value)
    config = load_config()
    assert config.path == SOURCES
    assert config.warehouse == "s3://reclock/warehouse"
    assert config.spark_master == "spark://spark-master:7077"
    assert config.storage_options == {
        "AWS_ENDPOINT_URL": "http://minio:9000", "AWS_ACCESS_KEY_ID": "reclock",
        "AWS_SECRET_ACCESS_KEY": "reclock-secret", "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true", "AWS_CONDITIONAL_PUT": "etag"}
    conf = config.spark_conf
    assert conf["spark.driver.host"] == "airflow-scheduler"
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://minio:9000"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert (conf["spark.hadoop.fs.s3a.access.key"], conf["spark.hadoop.fs.s3a.secret.key"]) == ("reclock", "reclock-secret")
    assert sorted(config.sources) == ["clicks", "orders", "pg_orders"]
    assert {s.options["bootstrap_servers"] for s in config.sources.values() if s.kind == "kafka"} == {"kafka:9092"}
    pg = config.source("pg_orders")
    assert pg.kind == "postgres" and pg.options["tables"] == ["public.orders"]
    dsn = make_url(pg.options["dsn"])
    assert (dsn.username, dsn.password, dsn.host, dsn.port, dsn.database) == (
        "reclock", "reclock", "postgres", 5432, "source")
    # And the same file with no environment at all (its own defaults) says the same.
    for key in config_env(airflow_vars):
        if key != "RECLOCK_CONFIG":
            monkeypatch.delenv(key)
    again = load_config()
    assert (again.warehouse, again.spark_master, again.storage_options, again.spark_conf) == (
        config.warehouse, config.spark_master, config.storage_options, config.spark_conf)


def test_spark_connect_server_command(monkeypatch, tmp_path, svc):
    """docker/spark-connect-server.py under the spark-connect service's environment: spark-submit of the
    Connect server class on the compose master, with reclock's session conf, the sources file's spark.conf,
    Delta's Connect plugins (their jars added to spark.jars) and the port."""
    from reclock.config import load_config
    from reclock.spark.session import jars_dir, session_conf

    launcher = connect_launcher()
    use_connect_service_env(monkeypatch, svc)
    monkeypatch.setenv("RECLOCK_SPARK_JARS", str(jars_dir()))
    monkeypatch.setenv("RECLOCK_SPARK_S3_JARS", str(jars_dir().parent / "spark-s3"))
    # No plugin jar: it fails before starting, naming the folder (the image build runs --print).
    monkeypatch.setenv("RECLOCK_SPARK_CONNECT_JARS", str(tmp_path))
    with pytest.raises(launcher.ConnectSetupError, match=re.escape(str(tmp_path))):
        launcher.connect_jars(launcher.connect_jars_dir())
    plugin = tmp_path / "delta-connect-server_4.1_2.13-4.4.0.jar"
    plugin.write_bytes(b"")  # where the image build puts it; only its path is used here
    config = load_config()
    argv = launcher.server_argv(config.spark_master, launcher.connect_conf(
        config, launcher.connect_jars(launcher.connect_jars_dir()), int(os.environ["RECLOCK_CONNECT_PORT"])))
    assert argv[:7] == ["spark-submit", "--master", "spark://spark-master:7077", "--name", "reclock-connect",
                        "--class", "org.apache.spark.sql.connect.service.SparkConnectServer"]
    pairs = argv[7:]
    assert pairs[::2] == ["--conf"] * (len(pairs) // 2)
    conf = dict(p.split("=", 1) for p in pairs[1::2])
    reclock_conf = session_conf(s3=True)  # the warehouse is s3://: the S3A jars too
    assert conf["spark.jars"].split(",") == reclock_conf.pop("spark.jars").split(",") + [str(plugin)]
    assert any("delta-spark_" in j for j in conf["spark.jars"].split(",")) and any("hadoop-aws" in j for j in conf["spark.jars"].split(","))
    for key, value in {**reclock_conf, **config.spark_conf}.items():
        assert conf[key] == value, key
    assert conf["spark.driver.host"] == "spark-connect"
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://minio:9000"
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert conf["spark.connect.extensions.relation.classes"] == "org.apache.spark.sql.connect.delta.DeltaRelationPlugin"
    assert conf["spark.connect.extensions.command.classes"] == "org.apache.spark.sql.connect.delta.DeltaCommandPlugin"
    assert conf["spark.connect.grpc.binding.port"] == "15002"
    # The Connect server class is in the pyspark wheel's Spark (no --packages at start-up).
    import pyspark

    [jar] = (Path(pyspark.__file__).parent / "jars").glob("spark-connect_2.13-*.jar")
    assert jar.name == f"spark-connect_2.13-{pyspark.__version__}.jar"
    import zipfile

    with zipfile.ZipFile(jar) as z:
        assert "org/apache/spark/sql/connect/service/SparkConnectServer.class" in z.namelist()


CONNECT_CLIENT = """
import json, sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
path = sys.argv[2]
spark.range(5).write.format("delta").save(path)
spark.sql(f"INSERT INTO delta.`{path}` VALUES (7)")
ids = sorted(row.id for row in spark.read.format("delta").load(path).collect())
history = [row.operation for row in spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()]
print(json.dumps({"ids": ids, "history": history, "partitions": spark.conf.get("spark.sql.shuffle.partitions"),
                  "extensions": spark.conf.get("spark.sql.extensions")}))
"""


@pytest.mark.slow
def test_connect_server_serves_delta_tables(monkeypatch, tmp_path, svc):
    """The spark-connect service's command, run here on a local master: a Spark Connect client writes,
    appends to and reads a Delta table through it (Delta's SQL extension and catalog come from reclock's
    session conf).  Delta's Connect plugins (DeltaTable over Connect) are left out: their jar
    (jvm/spark-connect/pom.xml) cannot be fetched on this machine; the image build fetches it."""
    from deltalake import DeltaTable

    from devtools.kafka_broker import free_port, stop_process
    from reclock.config import load_config
    from reclock.spark.session import jars_dir

    launcher = connect_launcher()
    use_connect_service_env(monkeypatch, svc)
    # This machine instead of the compose network: a local master, a local warehouse, this host as driver.
    monkeypatch.setenv("RECLOCK_SPARK_MASTER", "local[1]")
    monkeypatch.setenv("RECLOCK_WAREHOUSE", str(tmp_path / "warehouse"))
    monkeypatch.setenv("SPARK_DRIVER_HOST", "127.0.0.1")
    monkeypatch.setenv("RECLOCK_SPARK_JARS", str(jars_dir()))
    config = load_config()
    port = free_port()
    conf = launcher.connect_conf(config, [], port)
    for key in launcher.DELTA_CONNECT_CONF:
        del conf[key]
    argv = launcher.server_argv(config.spark_master, conf, launcher.spark_submit_binary())
    log = tmp_path / "connect.log"
    with log.open("wb") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, "PYSPARK_PYTHON": sys.executable}, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, f"the Connect server exited ({server.returncode}):\n{log.read_text()[-4000:]}"
            try:
                socket.create_connection(("127.0.0.1", port), 2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"no Connect server on {port}:\n{log.read_text()[-4000:]}"
                time.sleep(1)
        table = tmp_path / "t"
        client = subprocess.run([sys.executable, "-c", CONNECT_CLIENT, f"sc://127.0.0.1:{port}", str(table)],
                                capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert client.returncode == 0, f"{client.stderr[-4000:]}\nserver:\n{log.read_text()[-4000:]}"
        result = json.loads(client.stdout.strip().splitlines()[-1])
    finally:
        stop_process(server, "Spark Connect server")
    assert result["ids"] == [0, 1, 2, 3, 4, 7]
    assert result["history"] == ["WRITE", "WRITE"]
    # reclock's session conf reached the server's sessions (Spark's defaults: 200 and none).
    assert (result["partitions"], result["extensions"]) == ("2", "io.delta.sql.DeltaSparkSessionExtension")
    # A Delta table as any reader sees it (delta-rs, as the tick and publish steps read).
    assert DeltaTable(str(table)).version() == 1
    assert sorted(DeltaTable(str(table)).to_pyarrow_table().column("id").to_pylist()) == [0, 1, 2, 3, 4, 7]


def test_standalone_master_refuses_python_in_cluster_mode(tmp_path):
    """Why the DAGs submit in client mode (docker/README.md): the pinned Spark's spark-submit rejects a Python
    application in cluster deploy mode on a standalone master before it contacts any master."""
    app = tmp_path / "app.py"
    app.write_text("raise SystemExit('never run')\n")
    launcher = connect_launcher()
    proc = subprocess.run([launcher.spark_submit_binary(), "--master", "spark://127.0.0.1:1", "--deploy-mode",
                           "cluster", str(app)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert proc.returncode != 0
    assert ("Cluster deploy mode is currently not supported for python applications on standalone clusters"
            in proc.stderr), proc.stderr[-2000:]
    assert "never run" not in proc.stdout + proc.stderr


def test_every_variable_of_sources_yaml_reaches_the_containers(svc, airflow_vars):
    """A ${VAR} in docker/sources.yaml set in .env only matters if the compose file passes it on."""
    used = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", "\n".join(
        line for line in SOURCES.read_text().splitlines() if not line.lstrip().startswith("#"))))
    assert used and not used - set(airflow_vars), f"not in the Airflow environment: {sorted(used - set(airflow_vars))}"
    for name in SPARK:
        assert svc[name]["environment"]["RECLOCK_SPARK_MASTER"] == airflow_vars["RECLOCK_SPARK_MASTER"]


DESCRIBE = """
from airflow.models import DagBag
bag = DagBag(dag_folder=DAGS)
dags = {}
for dag_id, dag in bag.dags.items():
    if dag_id.startswith(("reclock_backfill_", "reclock_example_")):  # the source DAGs carry the Spark job
        continue
    spark = dag.get_task("reclock")
    dags[dag_id] = {"conf": spark.conf, "args": spark.application_args, "application": spark.application,
                    "master": spark._get_hook()._connection["master"]}
emit({"dags": dags, "errors": bag.import_errors})
"""


def use_connect_service_env(monkeypatch, svc) -> None:
    """This process's environment as the compose spark-connect service's (none of this machine's reclock,
    AWS, S3, Spark or Kafka variables)."""
    for key in list(os.environ):
        if key.startswith(("RECLOCK_", "AWS_", "S3_", "SPARK_", "KAFKA_")):
            monkeypatch.delenv(key)
    for key, value in config_env(svc["spark-connect"]["environment"]).items():
        monkeypatch.setenv(key, value)


def test_dags_parse_with_the_compose_environment(tmp_path, airflow_vars):
    env = airflow_env(tmp_path / "airflow", config=SOURCES)
    for key in list(env):
        if key.startswith(("RECLOCK_", "AWS_", "S3_", "SPARK_", "KAFKA_")):
            del env[key]
    keep_local = {"AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__PLUGINS_FOLDER", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
                  "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC", "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"}
    env.update({k: v for k, v in config_env(airflow_vars).items() if k not in keep_local})
    assert env["RECLOCK_SPARK_REMOTE"] == "sc://spark-connect:15002"  # compose runs the steps over Spark Connect
    env["RECLOCK_SPARK_REMOTE"] = ""  # turned off (compose's SPARK_REMOTE_URL=""): the spark-submit path below
    result = run_python(f"DAGS = {str(DAGS_FOLDER)!r}\n" + DESCRIBE, env, timeout=300)
    assert result["errors"] == {}, result["errors"]
    assert sorted(result["dags"]) == ["reclock_clicks", "reclock_orders", "reclock_pg_orders"]
    for name in ("orders", "clicks", "pg_orders"):
        spark = result["dags"][f"reclock_{name}"]
        assert spark["master"] == "spark://spark-master:7077"  # the compose connection, not local[2]
        assert spark["args"] == ["--config", str(SOURCES), "--source", name]
        assert spark["conf"]["spark.pyspark.python"] == PYTHON  # spark:// runs this interpreter on workers
        assert spark["conf"]["spark.hadoop.fs.s3a.endpoint"] == "http://minio:9000"
        assert spark["conf"]["spark.driver.host"] == "airflow-scheduler"
