"""reclock.query.publish_as_of, what the example AS OF join DAG runs: a query over several sources AS OF the
latest IntoTime all of them can answer, written to a Delta table one ``as_of`` at a time.  Real Spark, Delta
tables on disk, ``files`` sources."""
from __future__ import annotations

import pytest

from conftest import write_sources_config
from reclock import pipeline
from reclock.query import QueryError, publish_as_of, query_as_of

SQL = "SELECT a.line AS line, count(b.line) AS seen FROM a LEFT JOIN b ON b.line = a.line GROUP BY a.line"


def test_written_as_of_the_time_every_source_has_published(tmp_path, spark):
    roots = {n: tmp_path / n for n in ("a", "b")}
    for root in roots.values():
        root.mkdir()
    config = write_sources_config(tmp_path, *[(n, "files", {"url": str(r), "pattern": "*.log"})
                                              for n, r in roots.items()], retention_ms=10**9)

    def log(name, *lines):
        with open(roots[name] / "x.log", "a") as f:
            f.writelines(f"{line}\n" for line in lines)

    assert publish_as_of("j", SQL, ["a", "b"], config, spark)["as_of"] is None  # nothing published yet
    log("a", "x", "y")
    log("b", "x")
    pipeline.run_once("a", config, spark, now=1_000)
    pipeline.run_once("b", config, spark, now=1_000)
    log("a", "z")
    log("b", "y", "z")
    pipeline.run_once("a", config, spark, now=2_000)  # b is published only up to 1000: j is AS OF 1000
    assert publish_as_of("j", SQL, ["a", "b"], config, spark) == {"target": "j", "as_of": 1_000, "rows": 2,
                                                                  "sources": ["a", "b"]}
    pipeline.run_once("b", config, spark, now=2_500)  # b's y and z are bound at 2500: not yet AS OF 2000
    assert publish_as_of("j", SQL, ["a", "b"], config, spark)["as_of"] == 2_000
    assert publish_as_of("j", SQL, ["a", "b"], config, spark)["rows"] == 3  # a rerun replaces its own as_of
    table = spark.read.format("delta").load(str(tmp_path / "warehouse" / "j"))
    got = sorted((r["as_of"], r["line"], r["seen"]) for r in table.collect())
    assert got == [(1_000, "x", 1), (1_000, "y", 0), (2_000, "x", 1), (2_000, "y", 0), (2_000, "z", 0)]
    assert sorted(map(tuple, query_as_of(spark, SQL, 1_000, ["a", "b"], config).collect())) == [("x", 1), ("y", 0)]
    with pytest.raises(QueryError, match="a is a source"):
        publish_as_of("a", SQL, ["a", "b"], config, spark)
