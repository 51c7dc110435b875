"""reclock installed as a package (``pip install``, not editable) runs without this checkout: its package data (the
Great Expectations project) loads with importlib.resources, and it is given its sources file, from anywhere."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import yaml
from conftest import REPO


def test_an_installed_reclock_runs_from_anywhere(tmp_path):
    # The wheel, built offline (this venv's setuptools) from a copy of what the package is made of.
    source = tmp_path / "src"
    shutil.copytree(Path(REPO) / "include" / "reclock", source / "include" / "reclock",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(Path(REPO) / "pyproject.toml", source)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    str(source), "-w", str(tmp_path / "dist")], check=True, timeout=300)
    [wheel] = (tmp_path / "dist").glob("reclock-*.whl")

    # A fresh venv with the wheel installed; its dependencies are this venv's packages (a path line: this venv's
    # own .pth files, among them the editable reclock of the checkout, are not read from there).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", str(wheel)],
                   check=True, timeout=300)

    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "logs").mkdir(parents=True)
    (elsewhere / "logs" / "app.log").write_text("one\ntwo\n")
    config = elsewhere / "my-sources.yaml"
    config.write_text(yaml.safe_dump({
        "warehouse": str(elsewhere / "warehouse"), "spark": {"master": "local[1]"},
        "sources": [{"name": "logs", "kind": "files", "options": {"url": str(elsewhere / "logs"), "pattern": "*.log"}}]}))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RECLOCK_CONFIG")}
    reclock = str(venv / "bin" / "reclock")

    def run(*args, **kwargs):
        return subprocess.run(args, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300, **kwargs)

    where = run(str(python), "-c", "import reclock, reclock.gx_context as g; print(reclock.__file__); "
                "print(sorted(g.suite_names()))")
    assert where.returncode == 0, where.stderr
    module, suites = where.stdout.splitlines()
    assert module.startswith(purelib), module  # the installed package, not the checkout's
    assert "remap" in suites and "reclocked" in suites, suites

    schema = run(reclock, "config-schema")
    assert schema.returncode == 0 and json.loads(schema.stdout)["properties"]["sources"], schema.stderr
    status = run(reclock, "--config", str(config), "status")
    assert status.returncode == 0, status.stderr
    [row] = json.loads(status.stdout)
    assert row["source"] == "logs" and row["remap_upper"] is None and "error" not in row, row
    missing = run(reclock, "status")  # an installed reclock has no default sources file
    assert missing.returncode == 2 and missing.stderr.startswith("reclock: error: no sources file"), missing.stderr
