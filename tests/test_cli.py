"""The command line: its errors (one line ``reclock: error: ...`` each, exit status 2, no traceback), and
``reclock status`` showing every source while one upstream's broker is stopped."""
from __future__ import annotations

import json
import time
from datetime import datetime

import pytest
import yaml
from conftest import edit_config, run_cli, write_config

from devtools.kafka_broker import LocalBroker, create_topic, produce
from reclock import cli, pipeline

MAX = "253402300799999"  # 9999-12-31T23:59:59.999Z


@pytest.fixture
def config(tmp_path):
    """A sources file with one files source that was never ticked."""
    (tmp_path / "logs").mkdir()
    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump({"warehouse": str(tmp_path / "warehouse"),
                                    "sources": [{"name": "logs", "kind": "files",
                                                 "options": {"url": str(tmp_path / "logs")}}]}))
    return str(path)


def errors(capsys, argv: list[str]) -> tuple[int, list[str]]:
    """Exit status and stderr lines of ``reclock *argv`` run in this process."""
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    return code, capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("args, message", [
    (["query", "--as-of", "99999999999999999999999"],
     "argument --as-of: 99999999999999999999999 is out of range: IntoTimes are ms from 0 (1970-01-01T00:00:00Z) "
     f"to {MAX} (9999-12-31T23:59:59.999Z)"),
    (["query", "--as-of", "-5"], "argument --as-of: -5 is out of range"),
    (["query", "--as-of", "1969-12-31T23:59:59"], "argument --as-of: 1969-12-31T23:59:59 is out of range"),
    (["query", "--as-of", "yesterday"], "argument --as-of: 'yesterday' is neither milliseconds since the epoch nor "
                                        "an ISO datetime (nor 'latest' where that is allowed)"),
    (["query", "--as-of", "1", "--limit", "-1"], "argument --limit: must be a whole number from 0 to 2147483647, "
                                                 "got '-1'"),
    (["query", "--as-of", "1", "--limit", "2147483648"], "argument --limit: must be a whole number from 0"),
    (["query", "--as-of", "1", "--source", "logs", "--source", "nope"], "no source named 'nope' (known: logs)"),
    (["query"], "the following arguments are required: --as-of"),
    (["query", "--as-of", "1", "--engine", "duckdb"], "logs: AS OF 1 is not complete yet; logs is complete below 0"),
    (["query", "--as-of", "1", "--engine", "sql"], "argument --engine: invalid choice: 'sql'"),
    (["backfill", "logs", "--from", "0", "--to", "99999999999999999999999999"], "argument --to: "
                                                                                "99999999999999999999999999 is out"),
    (["backfill", "logs", "--from", "latest", "--to", "5"], "argument --from: 'latest' is neither milliseconds"),
    (["backfill", "logs", "--from", "9", "--to", "5"], "logs: cannot replay IntoTimes [9, 5]: start is after end"),
    (["backfill", "logs", "--from", "5", "--to", "9"], "logs: cannot replay IntoTimes [5, 9]: not published yet "
                                                       "(nothing is published)"),
    (["backfill", "nope", "--from", "1", "--to", "2"], "no source named 'nope' (known: logs)"),
    (["tick", "nope"], "no source named 'nope' (known: logs)"),
    (["sink-cdcv2", "nope", "--to", "file:///tmp/x"], "no source named 'nope' (known: logs)"),
    (["transactions", "nope"], "no transactions entry named 'nope' (known: none)"),
])
def test_bad_arguments_are_one_line(capsys, config, args, message):
    code, lines = errors(capsys, ["--config", config, *args])
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("reclock: error: ") and message in lines[0]


def test_every_config_problem_is_a_line(capsys, tmp_path):
    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump({"warehouse": str(tmp_path), "sources": [
        {"name": "orders", "kind": "kafka", "schedule": "hourly",
         "options": {"bootstrap_servers": "b:9092", "topic": "t", "group_id": "g", "startng_offsets": "latest"}}]}))
    code, lines = errors(capsys, ["--config", str(path), "status"])
    assert code == 2 and lines == [
        f"reclock: error: {path}: sources[0] (orders).options: unknown option(s) for kind kafka: startng_offsets "
        f"(did you mean starting_offsets?) (allowed: bootstrap_servers, topic, group_id, isolation_level, encoding, "
        f"timeout_s, config, starting_offsets)",
        lines[1]]
    assert lines[1].startswith(f"reclock: error: {path}: sources[0] (orders).schedule: not a cron expression")


def test_an_out_of_range_time_is_no_traceback_in_a_real_process(config):
    proc = run_cli(config, "query", "--as-of", "99999999999999999999999")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert out.decode().splitlines() == [f"reclock: error: argument --as-of: 99999999999999999999999 is out of range: "
                                         f"IntoTimes are ms from 0 (1970-01-01T00:00:00Z) to {MAX} "
                                         f"(9999-12-31T23:59:59.999Z) (see reclock query --help)"]


@pytest.mark.slow
def test_status_shows_every_source_while_a_broker_is_stopped(spark, tmp_path):
    """A Kafka source whose (private) broker was stopped after its first tick, and a files source: status
    shows both within a few seconds, the stopped one with its warehouse frontiers and "unreachable since T"
    with one line of reason, exits 0, and prints nothing else (no librdkafka retry logs: stdout and
    stderr together are the JSON)."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a.log").write_text("one\ntwo\n")
    with LocalBroker(heap="256m") as broker:
        create_topic(broker.bootstrap, "orders", partitions=2)
        produce(broker.bootstrap, "orders", [("k", "v0", 0), ("k", "v1", 1), ("k", "v2", 1)])
        config = write_config(tmp_path, broker.bootstrap, {"orders": "orders"})  # the default 10 s client timeout
        edit_config(config, lambda doc: doc["sources"].append(
            {"name": "logs", "kind": "files", "options": {"url": str(tmp_path / "logs")}}))
        pipeline.tick("orders", config, now=1_000, spark=spark)
        bootstrap = broker.bootstrap
    assert not broker.running()  # stopped by its PID (SIGTERM)

    before, start = datetime.now().astimezone(), time.monotonic()
    proc = run_cli(config, "status")
    out = proc.communicate(timeout=120)[0].decode()
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, out
    assert elapsed < 30, f"status took {elapsed:.0f} s"  # the probe's deadline is 6 s; the rest is start-up
    orders, logs = json.loads(out)  # nothing but the JSON was printed
    assert len(out.splitlines()) < 45  # the JSON only: no client retry logs (about 190 lines before)
    assert {k: orders[k] for k in ("source", "since", "remap_upper", "bound_frontier", "upstream_frontier")} == {
        "source": "orders", "since": 0, "remap_upper": 1_001, "bound_frontier": {"0": 1, "1": 2},
        "upstream_frontier": None}
    assert orders["lag_offsets"].startswith("unreachable since ")
    assert orders["last_measured_upstream"]["frontier"] == {"0": 1, "1": 2}  # as the tick measured it
    assert orders["last_measured_upstream"]["by"] == "tick"
    assert before.replace(microsecond=0) <= datetime.fromisoformat(orders["lag_offsets"].split()[-1]) <= \
        datetime.now().astimezone()
    reason = orders["upstream_error"]
    assert "\n" not in reason and bootstrap in reason and "Connection refused" in reason, reason
    assert logs == {"source": "logs", "since": None, "remap_upper": None, "reclocked_upper": None,
                    "bound_frontier": {}, "upstream_frontier": logs["upstream_frontier"], "lag_offsets": 8}
    assert list(logs["upstream_frontier"].values()) == [8]  # both lines of a.log, in bytes
