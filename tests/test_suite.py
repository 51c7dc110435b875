"""The test suite's own contracts: what a module that needs no JVM costs."""
from __future__ import annotations

import json
import subprocess
import sys

from airflow_env import REPO

CHILD = """
import json, sys, pytest

class Seen:
    @pytest.hookimpl(tryfirst=True)
    def pytest_unconfigure(self, config):
        self.servers = sorted(p.stem for p in config.reclock_servers.dir.glob("*.keeper"))

seen = Seen()
code = pytest.main(["-p", "no:xdist", "-p", "no:cacheprovider", "-q", "tests/test_engine.py"], plugins=[seen])
print("RESULT " + json.dumps({"code": int(code), "pyspark": "pyspark" in sys.modules, "servers": seen.servers}))
"""


def test_the_engine_tests_start_no_jvm():
    """``pytest tests/test_engine.py`` imports no pyspark (so starts no Spark) and starts no shared server."""
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result == {"code": 0, "pyspark": False, "servers": []}, proc.stdout[-3000:]
