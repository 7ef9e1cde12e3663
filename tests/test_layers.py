"""The layers of src/oelm as contracts (issue 45): ``lint-imports`` (import-linter) checks the
``[tool.importlinter]`` contracts of pyproject.toml — the layers, top to bottom, that an import never
runs up (imports inside functions included), the report reading runs through records only, the
config's first pass free of torch, the library free of the study (research/), no import circles
between the modules of a package. It passes on this tree, and fails on a copy of it with one upward
import planted (records, the ground floor of the run folder, importing the matrix's plan)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import oelm

pytest.importorskip("importlinter", reason="import-linter is in the test extra: pip install -e '.[test]'")

ROOT = Path(oelm.__file__).resolve().parents[2]  # the repository of the oelm under test


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` with ``root``'s pyproject.toml, over ``root/src/oelm`` and ``root/research``."""
    script = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert script, "import-linter is installed but its lint-imports command is not beside python"
    env = {**os.environ, "PYTHONPATH": f"{root / 'src'}{os.pathsep}{root}"}
    return subprocess.run([script, "pyproject.toml", "--no-cache"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_tree_keeps_every_layer_contract():
    out = _lint_imports(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    kept = [line for line in out.stdout.splitlines() if line.rstrip().endswith("KEPT")]
    assert "Contracts: 5 kept, 0 broken." in out.stdout and len(kept) == 5, out.stdout


def test_an_upward_import_breaks_the_layers(tmp_path):
    """One import inside a function, records -> matrix (up six layers), in a copy of the tree: the
    layers contract and the no-circles contract break, naming the module, the import and its line."""
    for part in ("src", "research"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    folder = tmp_path / "src" / "oelm" / "records" / "folder.py"
    folder.write_text(folder.read_text() + "\n\ndef _planted():\n    from oelm.matrix.plan import plan_runs\n\n"
                      "    return plan_runs\n")
    line = folder.read_text().splitlines().index("    from oelm.matrix.plan import plan_runs") + 1
    out = _lint_imports(tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "The layers of oelm: an import never runs up BROKEN" in out.stdout
    assert "oelm.records is not allowed to import oelm.matrix" in out.stdout
    assert f"oelm.records.folder -> oelm.matrix.plan (l.{line})" in out.stdout
    assert "Contracts: 3 kept, 2 broken." in out.stdout
