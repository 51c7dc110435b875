"""The runtime (reclock.runtime): a process parses its sources file once, and starts Spark only when a step needs it."""
from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
from conftest import REPO, reclocked_rows, write_config

from devtools.kafka_broker import create_topic, produce
from reclock import cli, config as config_module, pipeline
from reclock import runtime as runtime_module
from reclock.runtime import Runtime

pytestmark = pytest.mark.slow


@pytest.fixture
def orders(kafka_broker, tmp_path):
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker, topic, partitions=2)
    return topic, write_config(tmp_path, kafka_broker, {"orders": topic})


def test_a_run_parses_the_sources_file_once(kafka_broker, spark, orders, monkeypatch, capsys):
    """``reclock run``: every step of the run, in one process, works from one parse of the sources file."""
    topic, config = orders
    produce(kafka_broker, topic, [("k", f"o{i}", i % 2) for i in range(5)])
    parses = []
    model = config_module.sources_file_model
    monkeypatch.setattr(config_module, "sources_file_model", lambda *a, **k: parses.append(1) or model(*a, **k))

    assert cli.main(["--config", config, "run", "orders"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert list(done) == list(pipeline.STEPS) and done["publish"]["published"], done
    assert len(parses) == 1
    assert sorted(r[0] for r in reclocked_rows("orders", config)) == [f"o{i}" for i in range(5)]


#: In a fresh interpreter: the steps that need no Spark, on one runtime; what they return, and what was imported.
NO_SPARK = """
import builtins, json, sys, traceback
first = []  # where pyspark was first imported, if it was
_import = builtins.__import__
def tracing(name, *args, **kwargs):
    if name.startswith(("pyspark", "py4j")) and not first:
        first.append("".join(traceback.format_stack(limit=8)))
    return _import(name, *args, **kwargs)
builtins.__import__ = tracing
from reclock import pipeline, progress, status
from reclock.runtime import Runtime

runtime = Runtime.load(sys.argv[1])
fresh = Runtime.load(sys.argv[3])  # another warehouse: this source's first tick
done = {"publish": pipeline.publish("orders", runtime), "tick": pipeline.tick("orders", runtime, now=int(sys.argv[2])),
        "first_tick": pipeline.tick("orders", fresh, now=int(sys.argv[2])), "fresh_spark_started": fresh.spark_started,
        "status": status.status(runtime), "page": progress.collect(sys.argv[1], upstream=False)["sources"]}
done.update({f"idle_{step}": pipeline.run_once("orders", runtime, steps=(step,))[step]
             for step in ("stage", "check", "publish", "resume")})
done.update({"spark_started": runtime.spark_started,
        "imported": sorted({m.split(".")[0] for m in sys.modules} & {"pyspark", "py4j", "great_expectations"}),
        "first_import": first})
print("RESULT " + json.dumps(done, default=str))
"""


def test_steps_without_spark_work_start_none(kafka_broker, spark, orders, tmp_path):
    """A publish without dead letters, an idle tick, a Kafka source's first tick (creating its tables, recording
    its upstream), ``reclock status``, the progress page, and the rest of the idle run (staging a window that
    binds nothing, its check, its publish, resume) import no pyspark (no JVM, no Spark Connect client) and no
    Great Expectations: their commits are delta-rs's and their reads light ones."""
    topic, config = orders
    produce(kafka_broker, topic, [("k", f"o{i}", i % 2) for i in range(4)])
    pipeline.run_once("orders", config, spark, now=1_000, steps=("tick", "stage", "check"))  # checked, not published
    (tmp_path / "fresh").mkdir()
    fresh = write_config(tmp_path / "fresh", kafka_broker, {"orders": topic})

    out = subprocess.run([sys.executable, "-c", NO_SPARK, config, "2000", fresh], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    done = json.loads(lines[0].removeprefix("RESULT "))
    assert done["publish"] == {"published": True, "reclocked_upper": 1_001}
    assert done["tick"]["new_offsets"] == 0 and done["tick"]["written"] and done["tick"]["into_time"] == 2_000
    assert done["first_tick"]["new_offsets"] == 4 and done["first_tick"]["written"], done["first_tick"]
    assert done["fresh_spark_started"] is False
    with runtime_module.open_source("orders", fresh, connect=False) as ctx:  # what the first tick recorded
        assert ctx.tables.version("remap") == 2  # created, the upstream recorded, the binding committed
        assert ctx.tables.upstream_record() is not None and ctx.tables.remap_upper() == 2_001
    assert [row["remap_upper"] for row in done["status"]] == [2_001]
    assert [row["reclocked_upper"] for row in done["page"]] == [1_001]
    assert done["idle_stage"] == {"staged_rows": 0, "start": 1_001, "upto": 2_000, "ranges": 0}
    assert "nothing to validate" in json.dumps(done["idle_check"]["reclocked"]) and done["idle_publish"] == {"published": True, "reclocked_upper": 2_001}
    assert done["spark_started"] is False and done["imported"] == [], done["first_import"]
    assert sorted(r[0] for r in reclocked_rows("orders", config)) == [f"o{i}" for i in range(4)]


def test_a_runtime_opens_spark_on_first_use_only(tmp_path, kafka_broker, orders):
    """Building a runtime and opening a source's published tables reads the file once and starts nothing."""
    _, config = orders
    runtime = Runtime.load(config)
    assert Runtime.of(runtime) is runtime and runtime.warehouse is runtime.warehouse
    with runtime.source("orders", connect=False) as ctx:
        assert ctx.tables.reclocked_upper() == 0
    assert not runtime.spark_started
