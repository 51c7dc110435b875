"""The package's layout rules: the import contracts of pyproject.toml (no import cycle, the engine imports nothing
of reclock, layers from the commands down to the engine), and no module reaching into another's private names."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "include" / "reclock"


def test_the_import_contracts_hold():
    """lint-imports checks [tool.importlinter] of pyproject.toml; its report names each broken contract and the
    import that breaks it."""
    lint = Path(sys.executable).parent / "lint-imports"
    env = {**os.environ, "PYTHONPATH": str(REPO / "include")}
    run = subprocess.run([str(lint), "--no-cache", str(REPO / "pyproject.toml")], cwd=REPO / "include", env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


def private_imports(path: Path) -> list[str]:
    """``module -> name`` of each underscore name ``path`` imports from another reclock module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("reclock")):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{'.' * node.level}{node.module or ''} -> {alias.name}")
    return found


def test_no_module_imports_another_modules_private_names():
    product = [*PACKAGE.rglob("*.py"), *(REPO / "dags").glob("*.py"), *(REPO / "spark_jobs").glob("*.py")]
    offenders = {str(p.relative_to(REPO)): names for p in product if (names := private_imports(p))}
    assert offenders == {}


def test_the_private_import_rule_sees_one(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from .storage import _app_version, Warehouse\nfrom reclock.x import _y\nimport os\n")
    assert private_imports(module) == [".storage -> _app_version", "reclock.x -> _y"]


def test_no_product_file_is_over_500_lines():
    """A module a newcomer can read: every product file (the package, the DAG file, the Spark job, the plugin) is at
    most 500 lines."""
    product = [*PACKAGE.rglob("*.py"), *(REPO / "dags").glob("*.py"), *(REPO / "spark_jobs").glob("*.py"),
               *(REPO / "plugins").rglob("*.py")]
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in product}
    assert len(sizes) > 40 and {p: n for p, n in sizes.items() if n > 500} == {}


def pyspark_imports(path: Path) -> list[int]:
    """The lines of ``path`` that import pyspark or py4j, inside functions too."""
    return sorted(node.lineno for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if (isinstance(node, ast.Import) and any(a.name.split(".")[0] in ("pyspark", "py4j") for a in node.names))
            or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("pyspark", "py4j")))


def test_source_adapters_import_no_pyspark(tmp_path):
    """Spark glue lives in reclock/spark/: no module of reclock/sources/ imports pyspark, not even lazily."""
    offenders = {str(p.relative_to(REPO)): lines for p in (PACKAGE / "sources").glob("*.py")
                 if (lines := pyspark_imports(p))}
    assert offenders == {}
    module = tmp_path / "m.py"
    module.write_text("import os\ndef f():\n    from pyspark.sql import functions as F\nimport py4j.protocol\n")
    assert pyspark_imports(module) == [3, 4]
