"""Progress view: rendering (fabricated data), the check log, collection, and the Airflow plugin in Chromium.

The rendering tests need neither Airflow nor storage.  The check-log and collection tests
use real Delta tables and a ``files`` source in a temp directory: ticks and publishes commit
with the session-scoped ``spark`` fixture (delta-spark writes every Delta table), batches are
staged with pyarrow as a completed Spark job would, and the checks, the collection and the page
read with the light ``deltalake`` reader.  The slow end-to-end test starts a real
``airflow api-server`` with ``plugins/`` as its plugins folder and loads the page in headless
Debian Chromium (``apt-get install chromium``; skipped with the reason when it is missing).
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import stage_parquet

from airflow_env import REPO, http_ok, prepare_home, stop_group
from devtools.kafka_broker import free_port
from airflow_env import airflow_db_template  # noqa: F401  (a session fixture)
from reclock import check_log, pipeline, sources
from reclock import runtime
from reclock.checks import ChecksFailed
from reclock.engine import Frontier
from reclock.progress import UpstreamUnreachable, collect, data_docs_file, probe_options, probe_upper
from reclock.sources.kafka import CLIENT_LOGGER
from reclock.progress_view import (MARGIN_LEFT, MARGIN_RIGHT, WIDTH, chart_svg, downsample, fmt_duration, legend,
                                   render_checks, render_page, render_source, series, time_ticks, value_ticks)
from reclock.storage import Warehouse

SVG = "{http://www.w3.org/2000/svg}"
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


# --- fabricated data ----------------------------------------------------------------------


def check_record(success: bool = True, checked_at: int = T0 + 90_000) -> dict:
    results = [{"name": "reclocked.first_covering_binding", "expectation": "expect_column_pair_values_to_be_equal",
                "success": success, "description": "into_time is the first binding covering (partition, offset)",
                "unexpected_count": 0 if success else 2, "sample": [] if success else [{"partition": 0, "offset": 7}],
                "error": None},
               {"name": "reclocked.stamped", "expectation": "expect_column_values_to_not_be_null", "success": True,
                "description": "every record has an IntoTime", "unexpected_count": 0, "sample": [], "error": None}]
    return {"version": 1, "source": "orders", "checked_at": checked_at, "success": success,
            "window": [0, T0 + 30_000], "remap_upper": T0 + 30_001,
            "data_docs": "/wh/orders/gx/uncommitted/data_docs/local_site",
            "reports": {"remap": {"subject": "remap (3 bindings)", "rows": 6, "success": True, "failed": [],
                                  "summary": "remap: 5/5 checks passed on 6 rows", "results": []},
                        "reclocked": {"subject": "reclocked batch", "rows": 40, "success": success,
                                      "failed": [] if success else ["reclocked.first_covering_binding"],
                                      "docs": [f"validations/reclocked/__none__/{checked_at}/r.html"],
                                      "summary": "...", "results": results}}}


def fabricated_source(name: str = "orders", **overrides) -> dict:
    progress = [[T0 + 30_000, 1, 25], [T0, 0, 10], [T0 + 10_000, 1, 5], [T0 + 30_000, 0, 40],
                [T0 + 10_000, 0, 20], [T0 + 20_000, 0, 30], [T0 + 20_000, 1, 15]]  # deliberately unordered
    row = {"source": name, "kind": "kafka", "uri": f"/wh/{name}", "error": None, "tables": True,
           "since": 0, "remap_upper": T0 + 30_001, "reclocked_upper": T0 + 20_001,
           "bound_frontier": {"0": 40, "1": 25}, "progress": progress,
           "upstream_frontier": {"0": 45, "1": 25}, "upstream_error": None, "lag_offsets": 5,
           "lag_by_partition": {"0": 5}, "publish_lag_ms": 10_000, "last_check": check_record(),
           "last_check_error": None}
    return {**row, **overrides}


def page_data(*sources: dict, **overrides) -> dict:
    return {"generated_at": T0 + 100_000, "config": "/etc/reclock/sources.yaml", "warehouse": "/wh",
            "error": None, "sources": list(sources), **overrides}


def svg_tree(svg: str) -> ET.Element:
    return ET.fromstring(svg)  # also proves the SVG is well-formed XML


def section(page: str, name: str) -> str:
    """The ``<section>`` of source ``name`` in a rendered page."""
    m = re.search(rf'<section class="source" id="source-{re.escape(name)}".*?</section>', page, re.S)
    assert m, f"no section for {name!r}"
    return m.group(0)


# --- the chart ----------------------------------------------------------------------------


def test_series_groups_partitions_and_orders_points():
    rows = fabricated_source()["progress"]
    assert series(rows) == {0: [(T0, 10), (T0 + 10_000, 20), (T0 + 20_000, 30), (T0 + 30_000, 40)],
                            1: [(T0 + 10_000, 5), (T0 + 20_000, 15), (T0 + 30_000, 25)]}
    assert list(series([[1, 10, 1], [1, 2, 1], [1, "b", 1], [1, "a", 1]])) == [2, 10, "a", "b"]


def test_chart_points_are_ordered_and_scaled():
    root = svg_tree(chart_svg(fabricated_source()["progress"], "orders"))
    groups = root.findall(f"{SVG}g[@class='series']")
    assert [g.get("data-partition") for g in groups] == ["0", "1"]
    lo, hi, _ = value_ticks(5, 40)
    assert (lo, hi) == (0, 40)
    top, bottom = 14, 280 - 42
    for g, expected in zip(groups, ([(T0, 10), (T0 + 10_000, 20), (T0 + 20_000, 30), (T0 + 30_000, 40)],
                                    [(T0 + 10_000, 5), (T0 + 20_000, 15), (T0 + 30_000, 25)])):
        circles = g.findall(f"{SVG}circle")
        assert [(int(c.get("data-t")), int(c.get("data-offset"))) for c in circles] == expected
        for c, (t, o) in zip(circles, expected):
            x = MARGIN_LEFT + (t - T0) / 30_000 * (WIDTH - MARGIN_RIGHT - MARGIN_LEFT)
            y = bottom - (o - lo) / (hi - lo) * (bottom - top)
            assert float(c.get("cx")) == pytest.approx(x, abs=0.06)
            assert float(c.get("cy")) == pytest.approx(y, abs=0.06)
        xs = [float(c.get("cx")) for c in circles]
        assert xs == sorted(xs) and len(set(xs)) == len(xs)
    first = groups[0].findall(f"{SVG}circle")
    assert float(first[0].get("cx")) == MARGIN_LEFT  # earliest binding on the left edge
    assert float(first[-1].get("cx")) == WIDTH - MARGIN_RIGHT  # latest on the right edge
    assert float(first[-1].get("cy")) == top  # the highest upper at the top


def test_chart_draws_a_step_line_through_every_binding():
    root = svg_tree(chart_svg([[T0, "k", 0], [T0 + 1000, "k", 10], [T0 + 3000, "k", 30]]))
    points = [tuple(map(float, p.split(","))) for p in root.find(f".//{SVG}polyline").get("points").split()]
    assert len(points) == 5  # start, then (across, up) for each later binding
    (x0, y0), (x1, y1), (x2, y2), (x3, y3), (x4, y4) = points
    assert y1 == y0 and x1 > x0  # the upper holds until the next binding...
    assert x2 == x1 and y2 < y1  # ...then jumps up
    assert y3 == y2 and x4 == x3 and y4 < y3


def test_partitions_with_the_same_uppers_stay_apart():
    rows = [[T0 + i * 1000, p, 10 * i] for i in range(3) for p in (0, 1, 2)]
    groups = svg_tree(chart_svg(rows)).findall(f".//{SVG}g[@class='series']")
    styles = [(g.find(f"{SVG}polyline").get("stroke-dasharray"), g.get("transform")) for g in groups]
    assert len(set(styles)) == 3 and styles[0] == (None, None)  # the first solid, each later one dashed and shifted
    assert len({g.find(f"{SVG}polyline").get("points") for g in groups}) == 1  # the same uppers
    assert legend(rows).count("stroke-dasharray") == 2


def test_single_binding_and_empty_chart():
    root = svg_tree(chart_svg([[T0, 0, 7]]))
    (circle,) = root.findall(f".//{SVG}circle")
    assert MARGIN_LEFT < float(circle.get("cx")) < WIDTH - MARGIN_RIGHT  # padded around the one time
    empty = svg_tree(chart_svg([]))
    assert empty.findall(f".//{SVG}circle") == [] and "no bindings yet" in "".join(empty.itertext())


def test_axis_ticks_and_downsampling():
    assert value_ticks(3, 97) == (0, 100, [0, 20, 40, 60, 80, 100])
    assert value_ticks(7, 7) == (6, 8, [6, 7, 8])
    lo, hi, ticks = value_ticks(2**32, 2**32 + 5_000_000)  # LSNs: far from 0, the axis does not start at 0
    assert lo <= 2**32 and hi >= 2**32 + 5_000_000 and lo > 0 and len(ticks) <= 7
    assert time_ticks(T0, T0 + 75_000) == [T0 + i * 15_000 for i in range(6)]
    assert len(time_ticks(T0 + 1, T0 + 3 * 86_400_000)) <= 6
    points = [(t, t) for t in range(1000)]
    kept = downsample(points, 50)
    assert len(kept) == 50 and kept[0] == points[0] and kept[-1] == points[-1] and kept == sorted(kept)
    assert downsample(points[:10], 50) == points[:10]
    root = svg_tree(chart_svg([[t, 0, t] for t in range(1, 2001)], max_points=100))
    assert len(root.findall(f".//{SVG}circle")) == 100


# --- the page -----------------------------------------------------------------------------


def test_page_shows_facts_chart_and_check_results():
    page = render_page(page_data(fabricated_source()))
    s = section(page, "orders")
    assert "0 (nothing compacted)" in s  # since
    assert f"{T0 + 30_001} = 2026-01-01 00:00:30.001 UTC" in s  # remap upper
    assert "2026-01-01 00:00:20.001 UTC" in s  # reclocked upper
    assert "10.0 s" in s and "5 offsets" in s  # publish lag, upstream lag
    assert s.count("<circle") == 7
    assert "checks passed" in s and "PASS" in s and "reclocked.first_covering_binding" in s
    assert s.index('data-report="remap"') < s.index('data-report="reclocked"')
    assert 'href="api/progress"' in page and "<script" not in page
    # the latest run's Great Expectations Data Docs: the site, and the page of each report that has one
    assert '<a class="data-docs" href="gx/orders/index.html">Data Docs</a>' in s
    reclocked = s[s.index('data-report="reclocked"'):]
    assert f'href="gx/orders/validations/reclocked/__none__/{T0 + 90_000}/r.html">result</a>' in reclocked
    older = render_checks({k: v for k, v in check_record().items() if k != "data_docs"})  # recorded before GX sites
    assert 'href="gx/orders/index.html"' not in older


def test_a_kinesis_source_shows_its_lag_in_time():
    """A source that lands what it reads shows how far behind the stream's tip each shard's last read was (the
    largest in the overview, each shard in the facts); the others show none."""
    kinesis = fabricated_source("taps", kind="kinesis", lag_ms=1_500, lag_ms_measured_at=T0 + 50_000,
                                lag_ms_by_partition={"shardId-000000000000": 1_500, "shardId-000000000001": 0})
    page = render_page(page_data(kinesis, fabricated_source()))
    taps, orders = section(page, "taps"), section(page, "orders")
    assert "upstream lag in time" in taps and "1.5 s (read at 2026-01-01 00:00:50.000 UTC" in taps
    assert "shardId-000000000000 1.5 s, shardId-000000000001 0 ms" in taps
    assert "upstream lag in time" not in orders
    overview = page[:page.index('<section class="source"')]
    assert "1.5 s behind" in overview and "5 offsets behind" in overview


def test_failed_check_is_shown_with_its_failing_check():
    html = render_checks(check_record(success=False), now=T0 + 100_000)
    assert "FAIL" in html and "10.0 s ago" in html
    assert re.search(r'<tr class="fail"><td>reclocked.first_covering_binding</td><td>FAIL</td>', html)
    assert "2 bad, e.g. [{&#x27;partition&#x27;: 0, &#x27;offset&#x27;: 7}]" in html
    page = render_page(page_data(fabricated_source(last_check=check_record(success=False))))
    assert "checks failed" in page
    assert "never checked" in render_source(fabricated_source(last_check=None))


@pytest.mark.parametrize("overrides, shown", [
    ({}, None),  # on_bad_record: fail, nothing dead-lettered: no such fact
    ({"on_bad_record": "fail", "dead_letters": None}, None),
    ({"on_bad_record": "dead_letter", "dead_letters": None}, "0 in orders_dead_letter"),  # before its first publish
    ({"on_bad_record": "dead_letter", "dead_letters": 12_345}, "12,345 in orders_dead_letter"),
    ({"on_bad_record": "fail", "dead_letters": 2}, "2 in orders_dead_letter"),  # switched back: still there
])
def test_page_shows_the_dead_letter_count(overrides, shown):
    s = section(render_page(page_data(fabricated_source(**overrides))), "orders")
    fact = re.search(r'<div class="fact dead-letters"><dt>[^<]*</dt><dd>([^<]*)</dd>', s)
    assert (fact.group(1) if fact else None) == shown


def test_the_dead_letter_check_shows_the_batchs_count():
    record = check_record()
    record["reports"]["dead_letter"] = {
        "subject": "dead letters of IntoTimes 0..30000", "rows": 3, "success": True, "failed": [],
        "results": [{"name": "dead_letter.count", "expectation": "expect_table_row_count_to_be_between",
                     "success": True, "description": "records of the batch that could not be decoded",
                     "unexpected_count": None, "sample": [], "error": None, "observed": 3}]}
    html = render_checks(record)
    assert html.index('data-report="reclocked"') < html.index('data-report="dead_letter"')
    assert re.search(r'<tr class="pass"><td>dead_letter.count</td><td>PASS</td><td>[^<]*</td><td>3</td></tr>', html)


def test_names_and_messages_are_escaped():
    evil = '<script>alert("x")</script>'
    src = fabricated_source("orders", kind=evil, progress=[[T0, evil, 1], [T0 + 1000, evil, 2]],
                            bound_frontier={evil: 2}, upstream_error=f"upstream unreachable: {evil}",
                            last_check={**check_record(success=False), "reports": {evil: {
                                "subject": evil, "rows": 1, "success": False, "failed": [evil],
                                "results": [{"name": evil, "success": False, "description": evil,
                                             "unexpected_count": 1, "sample": [evil], "error": None}]}}})
    page = render_page(page_data(src, config=evil, warehouse=evil))
    assert "<script" not in page and "&lt;script&gt;" in page
    svg = re.search(r"<svg.*?</svg>", page, re.S).group(0)
    assert svg_tree(svg).find(f"{SVG}g[@class='series']").get("data-partition") == evil  # escaped, well-formed


def test_an_unreachable_upstream_is_an_error_of_its_source_only():
    broken = fabricated_source("clicks", upstream_frontier=None, lag_offsets=None, lag_by_partition={},
                               upstream_error="upstream unreachable: SourceError: broker 127.0.0.1:1 down")
    unreadable = fabricated_source("audit", error="cannot read the warehouse tables at /wh/audit: OSError: gone",
                                   tables=False, progress=[], since=None, remap_upper=None, reclocked_upper=None,
                                   last_check=None, last_check_error="cannot read /wh/audit/last_check.json: bad")
    page = render_page(page_data(fabricated_source("orders"), broken, unreadable))
    ok, clicks, audit = section(page, "orders"), section(page, "clicks"), section(page, "audit")
    assert 'class="error' not in ok and ok.count("<circle") == 7
    assert 'class="error upstream"' in clicks and "broker 127.0.0.1:1 down" in clicks
    assert clicks.count("<circle") == 7  # the bound history still shows
    assert "unknown (upstream unreachable)" in clicks and "<td class=\"num\">?</td>" in clicks
    assert "OSError: gone" in audit and "last_check.json: bad" in audit and "no bindings yet" in audit
    assert "unreachable" in page.split("<section")[0]  # the overview flags it too


def test_config_error_page():
    page = render_page(page_data(error="/etc/reclock/sources.yaml: cannot read config: No such file"))
    assert 'class="error config"' in page and "No such file" in page and "<section" not in page


def test_durations():
    assert [fmt_duration(ms) for ms in (5, 1500, 200_000, 7_500_000, 90_000_000)] == [
        "5 ms", "1.5 s", "3 min 20 s", "2 h 5 min", "1 d 1 h"]


# --- the check log and collection (real tables, files source, no Spark) --------------------


def write_config(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "data").mkdir(exist_ok=True)
    config = tmp_path / "conf" / "sources.yaml"
    config.parent.mkdir(exist_ok=True)
    config.write_text(f"warehouse: {tmp_path / 'warehouse'}\nsources:\n"
                      f"  - name: events\n    kind: files\n    options: {{url: \"{tmp_path / 'data'}\"}}\n" + extra)
    return config


def append_lines(directory: Path, i: int) -> None:
    for key, n in (("a.log", i + 1), ("b.log", 2 * i + 3)):
        with open(directory / key, "a") as f:
            f.write("".join(f"{key} line {i}.{j}\n" for j in range(n)))


def stage_with_pyarrow(name: str, config: Path, corrupt: bool = False) -> int:
    """Stage the pending bindings as a completed Spark job would (Parquet + _SUCCESS), without Spark.

    ``corrupt`` stamps the first record one ms late, which the checks must catch.
    """
    with runtime.open_source(name, str(config)) as ctx:
        remap = ctx.tables.read_remap()
        start, upto = pipeline.pending(remap, ctx.tables)
        rows = [{**data, "partition": partition, "offset": offset, "into_time": into_time, "diff": diff}
                for into_time, partition, lo, hi in remap.ranges(start)
                for data, offset, diff in ctx.source.read(partition, lo, hi)]
        if corrupt:
            rows[0]["into_time"] += 1
        stage_parquet(ctx.tables, upto, rows)
        return len(rows)


def run_ticks(config: Path, start: int, count: int, spark, name: str = "events") -> None:
    for i in range(start, start + count):
        append_lines(config.parent.parent / "data", i)
        pipeline.tick(name, str(config), now=T0 + i * 15_000, spark=spark)


def test_check_log_round_trip(tmp_path):
    uri = str(tmp_path / "warehouse" / "orders")
    assert check_log.read(uri) is None  # never checked (the directory does not even exist)
    path = check_log.write(uri, {"success": True, "n": 1})
    assert path == f"{uri}/{check_log.FILE_NAME}" and check_log.read(uri) == {"success": True, "n": 1}
    check_log.write(uri, {"success": False, "n": 2})
    assert check_log.read(uri) == {"success": False, "n": 2}
    assert os.listdir(uri) == [check_log.FILE_NAME]  # no temp file left behind
    assert Warehouse(str(tmp_path / "warehouse") + "/").source_uri("orders") == uri
    assert Warehouse("s3://bucket/wh/").source_uri("orders") == "s3://bucket/wh/orders"


def test_pipeline_check_records_results_before_raising(tmp_path, spark):
    config = write_config(tmp_path)
    uri = Warehouse(str(tmp_path / "warehouse")).source_uri("events")
    run_ticks(config, 0, 3, spark)
    assert stage_with_pyarrow("events", config) > 0
    before = pipeline.now_ms()
    summaries = pipeline.check("events", str(config))
    passed = check_log.read(uri)
    assert passed["success"] is True and passed["checked_at"] >= before and passed["source"] == "events"
    assert passed["window"] == [0, T0 + 30_000] and passed["remap_upper"] == T0 + 30_001
    assert {k: r["summary"] for k, r in passed["reports"].items()} == summaries
    assert all(r["success"] for report in passed["reports"].values() for r in report["results"])
    # GX keeps the results and Data Docs in the source's context, beside its tables (not in the repository)
    site = passed["data_docs"]
    assert site == f"{uri}/gx/uncommitted/data_docs/local_site"
    index = Path(data_docs_file("events", "index.html", str(config))).read_text()  # once the validator built it
    assert "reclocked" in index and "reclocked_keys" in index and "remap" in index
    pages = [page for report in passed["reports"].values() for page in report["docs"]]
    assert len(pages) == 3 and all(Path(site, page).is_file() for page in pages)  # remap, reclocked, its keys
    assert data_docs_file("events", pages[0], str(config)) == os.path.realpath(Path(site, pages[0]))
    assert data_docs_file("events", "../../../../last_check.json", str(config)) is None  # outside the site
    assert data_docs_file("nosuch", "index.html", str(config)) is None
    assert list(Path(uri, "gx", "uncommitted", "validations").iterdir())  # the validation results store
    pipeline.publish("events", str(config), spark=spark)

    run_ticks(config, 3, 2, spark)
    stage_with_pyarrow("events", config, corrupt=True)
    with pytest.raises(ChecksFailed):
        pipeline.check("events", str(config))
    failed = check_log.read(uri)
    assert failed["success"] is False and failed["checked_at"] >= passed["checked_at"]
    assert failed["window"] == [T0 + 30_001, T0 + 60_000]
    assert "reclocked.first_covering_binding" in failed["reports"]["reclocked"]["failed"]
    assert failed["reports"]["remap"]["success"] is True
    page = Path(data_docs_file("events", failed["reports"]["reclocked"]["docs"][0], str(config))).read_text()
    assert "reclocked.first_covering_binding" in page or "not_covering" in page  # the failed expectation's page
    with pytest.raises(ChecksFailed, match="not been checked|not passed"):
        pipeline.publish("events", str(config), spark=spark)  # a failed check publishes nothing


def test_collect_reads_the_warehouse_and_survives_an_unreachable_upstream(tmp_path, spark):
    port = free_port()  # nothing listens there
    config = write_config(tmp_path, "  - name: offline\n    kind: kafka\n    options: {bootstrap_servers: "
                                    f"\"127.0.0.1:{port}\", topic: t, group_id: g, timeout_s: 1}}\n"
                                    "  - name: fresh\n    kind: files\n"
                                    f"    options: {{url: \"{tmp_path / 'nothing'}\"}}\n")
    run_ticks(config, 0, 3, spark)
    append_lines(tmp_path / "data", 9)  # upstream moves on after the last tick
    data = collect(str(config), now=T0 + 100_000)
    assert data["error"] is None and data["generated_at"] == T0 + 100_000
    events, offline, fresh = data["sources"]
    assert events["since"] == 0 and events["remap_upper"] == T0 + 30_001 and events["reclocked_upper"] == 0
    assert [row[0] for row in events["progress"]] == [T0, T0, T0 + 15_000, T0 + 15_000, T0 + 30_000, T0 + 30_000]
    assert events["bound_frontier"] == {p: u for _, p, u in events["progress"][-2:]}
    assert events["lag_offsets"] == sum(events["lag_by_partition"].values()) > 0
    assert events["publish_lag_ms"] == 30_001 and events["upstream_error"] is None and events["last_check"] is None
    assert offline["upstream_error"].startswith("upstream unreachable: SourceError") and offline["error"] is None
    assert offline["upstream_unreachable_since"] >= T0 and events["upstream_unreachable_since"] is None
    assert fresh["tables"] is False and fresh["error"] is None and fresh["upstream_frontier"] == {}
    assert not (tmp_path / "warehouse" / "fresh").exists()  # the view never creates tables
    json.dumps(data)  # JSON-able as served
    page = render_page(data)
    assert 'class="error upstream"' in section(page, "offline") and section(page, "events").count("<circle") == 6
    assert "upstream unreachable since 20" in page.split("<section")[0]  # the overview says since when

    # What the progress page shows: the warehouse only, with the upstream upper the last tick measured
    cached = collect(str(config), now=T0 + 100_000, upstream=False)
    events, offline, fresh = cached["sources"]
    assert events["upstream_measured_by"] == "tick" and events["upstream_measured_at"] > T0
    assert events["upstream_frontier"] == events["bound_frontier"] and events["lag_offsets"] == 0
    assert events["upstream_error"] is None and offline["upstream_error"] is None
    assert offline["upstream_frontier"] is None and offline["upstream_measured_by"] is None
    page = render_page(cached)
    assert "as the tick step measured it at 20" in section(page, "events")
    assert "not measured yet" in section(page, "offline") and 'class="error upstream"' not in page


class FakeUpstream:
    """A source kind for the probe: ``behaviour`` is ``ok``, ``fails`` or ``hangs``; it logs like librdkafka."""

    def __init__(self, behaviour: str, timeout_s: float = 10.0):
        self.behaviour, self.timeout_s = behaviour, timeout_s

    def upper(self) -> Frontier:
        logging.getLogger(CLIENT_LOGGER).error("FAIL [rdkafka#consumer-1]: Connect to %s failed: Connection refused",
                                               "127.0.0.1:1")
        if self.behaviour == "hangs":
            time.sleep(self.timeout_s)
        if self.behaviour != "ok":
            raise sources.SourceError(f"metadata request failed\nafter {self.timeout_s} s")
        return Frontier.of({0: 7})

    def close(self) -> None:
        pass


@pytest.fixture
def fake_kind(monkeypatch):
    monkeypatch.setattr(sources, "_REGISTRY", dict(sources._REGISTRY))
    sources.register_source("fake", FakeUpstream)


@pytest.mark.parametrize("behaviour, outcome", [
    ("ok", Frontier.of({0: 7})),
    ("fails", "SourceError: metadata request failed after 0.2 s (last client log: FAIL [rdkafka#consumer-1]: "
              "Connect to 127.0.0.1:1 failed: Connection refused)"),
    ("hangs", "no answer within 0.5 s (last client log: FAIL [rdkafka#consumer-1]: Connect to 127.0.0.1:1 failed: "
              "Connection refused)"),
])
def test_probe_upper_answers_or_says_why_within_its_deadline(fake_kind, caplog, behaviour, outcome):
    """The client's own logs never reach the handlers; the last one ends the reason, on one line."""
    start = time.monotonic()
    if isinstance(outcome, Frontier):
        assert probe_upper("fake", {"behaviour": behaviour}, timeout_s=0.2, deadline_s=0.5) == outcome
    else:
        with pytest.raises(UpstreamUnreachable) as e:
            probe_upper("fake", {"behaviour": behaviour, "timeout_s": 5.0}, timeout_s=0.2 if behaviour == "fails"
                        else 5.0, deadline_s=0.5)
        assert str(e.value) == outcome
    assert time.monotonic() - start < 1.5
    assert not [r for r in caplog.records if r.name == CLIENT_LOGGER]


def test_client_logs_outside_probes_still_reach_the_handlers(caplog):
    logging.getLogger(CLIENT_LOGGER).warning("a tick's client log")
    assert [r.getMessage() for r in caplog.records if r.name == CLIENT_LOGGER] == ["a tick's client log"]


@pytest.mark.parametrize("kind, options, expected", [
    ("kafka", {"topic": "t"}, {"topic": "t", "timeout_s": 3.0}),  # the client's default 10 s, lowered
    ("kafka", {"topic": "t", "timeout_s": 1}, {"topic": "t", "timeout_s": 1}),
    ("cdcv2", {"transport": "file:///x", "timeout_s": 30}, {"transport": "file:///x", "timeout_s": 3.0}),
    ("files", {"url": "/logs"}, {"url": "/logs"}),  # no client timeout: only the deadline bounds it
])
def test_probe_options_lower_the_client_timeout(kind, options, expected):
    assert probe_options(kind, options) == expected


def test_collect_reports_a_bad_config(tmp_path):
    data = collect(str(tmp_path / "missing.yaml"))
    assert "cannot read config" in data["error"] and data["sources"] == []


# --- end to end: a real Airflow API server and headless Chromium --------------------------

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


def chromium() -> str | None:
    return next((p for p in (shutil.which("chromium"), "/usr/bin/chromium") if p and os.path.exists(p)), None)


def browse(url: str, profile: Path, *args: str, timeout: float = 120) -> str:
    """Run headless Chromium on ``url`` with ``args`` (``--dump-dom``, ``--screenshot=...``); its stdout."""
    proc = subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def http_get(url: str, timeout: float = 60) -> tuple[int, str, str]:
    """``(status, final url, body)``, following redirects."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.geturl(), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, url, e.read().decode()


@pytest.fixture
def api_server(tmp_path, airflow_db_template, spark):  # noqa: F811
    """A populated warehouse and a running ``airflow api-server`` on a free port; yields its base URL."""
    config = write_config(tmp_path, "  - name: offline\n    kind: kafka\n    options: {bootstrap_servers: "
                                    f"\"127.0.0.1:{free_port()}\", topic: t, group_id: g, timeout_s: 2}}\n")
    run_ticks(config, 0, 4, spark)
    stage_with_pyarrow("events", config)
    pipeline.check("events", str(config))  # passes, recorded
    pipeline.publish("events", str(config), spark=spark)
    run_ticks(config, 4, 3, spark)
    stage_with_pyarrow("events", config, corrupt=True)
    with pytest.raises(ChecksFailed):
        pipeline.check("events", str(config))  # fails, recorded before raising
    append_lines(tmp_path / "data", 20)  # upstream ahead of the last binding

    env = prepare_home(tmp_path / "airflow", config, db_template=airflow_db_template)
    port = free_port()
    env.update({"AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"), "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(port), "AIRFLOW__API__WORKERS": "1",
                "AIRFLOW__CORE__AUTH_MANAGER":
                    "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True"})
    log = open(tmp_path / "api-server.log", "w")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "airflow"), "api-server"], env=env, cwd=tmp_path,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while http_ok(f"{base}/api/v2/monitor/health") is False:
            if proc.poll() is not None or time.monotonic() > deadline:
                log_text = (tmp_path / "api-server.log").read_text()
                raise AssertionError(f"api-server did not come up:\n{log_text[-5000:]}")
            time.sleep(1)
        yield base
    finally:
        stop_group(proc)  # the server and its workers: the group this fixture started
        log.close()


@pytest.mark.slow
def test_progress_page_in_airflow_and_chromium(api_server, tmp_path):
    if chromium() is None:
        pytest.skip("headless Chromium is not installed (Debian: apt-get install chromium; "
                    "devtools/system-packages.sh installs it)")
    base = api_server

    plugins = json.loads(http_get(f"{base}/api/v2/plugins")[2])["plugins"]
    (plugin,) = [p for p in plugins if p["name"] == "reclock"]
    assert plugin["fastapi_apps"][0]["url_prefix"] == "/reclock"
    assert plugin["external_views"][0]["href"] == "reclock/"
    assert plugin["external_views"][0]["url_route"] == "reclock-progress"

    status, _, body = http_get(f"{base}/reclock/api/progress")
    data = json.loads(body)
    assert status == 200 and [s["source"] for s in data["sources"]] == ["events", "offline"]

    dom = browse(f"{base}/reclock/", tmp_path / "chrome", "--dump-dom")
    events, offline = section(dom, "events"), section(dom, "offline")
    assert "<svg" in events and events.count("<circle") == 14  # 2 files x 7 bindings
    assert re.search(r"<dt>since</dt><dd>0 \(nothing compacted\)</dd>", events)
    assert "checks failed" in events and "FAIL" in events and "reclocked.first_covering_binding" in events
    assert f"{T0 + 90_001} = 2026-01-01 00:01:30.001 UTC" in events  # remap upper
    assert "2026-01-01 00:00:45.001 UTC" in events  # reclocked upper: the first batch was published
    assert "never checked" in offline
    # the last check links to its Great Expectations Data Docs, which the plugin serves
    links = re.findall(r'<a class="data-docs" href="([^"]+)"', events)
    assert "gx/events/index.html" in links and any("validations/reclocked/" in link for link in links), links
    docs = browse(f"{base}/reclock/gx/events/index.html", tmp_path / "chrome", "--dump-dom")
    assert "reclocked" in docs and "remap" in docs
    failed_page = next(link for link in links if "validations/reclocked/" in link)
    status, _, body = http_get(f"{base}/reclock/{failed_page}")
    assert status == 200 and "not_covering" in body
    assert http_get(f"{base}/reclock/gx/events/..%2F..%2Flast_check.json")[0] == 404
    # the page asks no upstream: the lag is the one the last tick measured, "offline" never ticked
    assert "as the tick step measured it at" in events and "not measured yet" in offline
    assert "upstream unreachable" not in dom

    ui = browse(f"{base}/plugin/reclock-progress", tmp_path / "chrome", "--dump-dom",
                "--virtual-time-budget=15000")
    assert re.search(r'<iframe[^>]*src="reclock/"[^>]*title="Reclock progress"', ui)  # the menu entry's page

    shot = Path(os.environ.get("RECLOCK_SCREENSHOT_DIR", tmp_path)) / "reclock-progress.png"
    browse(f"{base}/reclock/", tmp_path / "chrome", f"--screenshot={shot}", "--window-size=1100,1400")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
