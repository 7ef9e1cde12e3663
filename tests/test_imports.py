"""Import cost: ``import oelm``, ``import oelm.report`` and ``oelm --help`` must not load the heavy
libraries (plotting, statistics, data frames, logging; and for the first and last, torch and
Hugging Face) — they are imported where they are used. Each check runs in a fresh interpreter,
since this test process has long imported all of them. A property of what gets imported, not a
timing: it holds on a loaded machine too.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import oelm

SRC = str(Path(oelm.__file__).resolve().parents[1])  # the oelm under test, not an installed one

HEAVY = ("matplotlib", "scipy", "pandas", "tensorboard")
FRAMEWORKS = ("torch", "transformers", "accelerate", "datasets")


def _loaded_after(code: str, env: dict[str, str] | None = None) -> list[str]:
    """Which of HEAVY + FRAMEWORKS are in sys.modules after running ``code`` in a fresh python."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in {HEAVY + FRAMEWORKS!r} if m in sys.modules)))"
    run_env = {**os.environ, **(env or {}), "PYTHONPATH": SRC}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=run_env, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_oelm_loads_no_heavy_library():
    assert _loaded_after("import oelm") == []


def test_import_oelm_report_loads_no_heavy_library():
    loaded = _loaded_after("import oelm.report")
    assert [m for m in loaded if m in HEAVY] == []


def test_jinja2_is_imported_by_the_html_writer_only():
    """The report.html template engine is loaded when the HTML is written, not by ``import oelm``
    or the report modules (the markdown report and ``oelm run`` never need it)."""
    code = (
        "import sys, oelm, oelm.report, oelm.report.render\n"
        "assert 'jinja2' not in sys.modules\n"
        "oelm.report.render.render_html({'name': 'n', 'task': 't', 'model': 'm'}, [])\n"
        "assert 'jinja2' in sys.modules\n"
    )
    _loaded_after(code)  # asserts a zero exit status


def test_cli_help_loads_no_heavy_library():
    code = "from oelm.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    assert _loaded_after(code) == []


def test_oelm_run_start_up_loads_no_report_library():
    """What ``oelm run`` imports before its first step (cli.cmd_run's imports, the experiment, the
    trainer and the model builders) loads no statistics or plotting library: scipy and matplotlib
    belong to the report, written after the runs, and are no start-up cost (issue 12, item 6)."""
    code = (
        "from oelm.config import load_config\n"
        "from oelm.runtime.distributed import is_main_process\n"
        "from oelm.errors import RunInterruptedError\n"
        "from oelm.matrix import run_matrix\n"
        "import oelm.matrix.driver, oelm.training, oelm.matrix.model, oelm.matrix.data\n"
        "import inspect, oelm.cli.run\n"
        "src = inspect.getsource(oelm.cli.run.cmd_run)\n"
        "head = src.split('started = ')[0]\n"
        "assert 'oelm.report' not in head, head  # the report is imported after the runs\n"
    )
    loaded = _loaded_after(code)
    assert [m for m in loaded if m in HEAVY] == []


def test_public_api_is_unchanged():
    code = (
        "import oelm\n"
        "from oelm import *\n"
        "missing = [n for n in oelm.__all__ if n not in globals()]\n"
        "assert not missing, missing\n"
        "from oelm import apply_oelm, OELMConfig, head_wise_orthogonal_, save_pretrained, load_oelm\n"
        "import oelm.method, oelm.checkpoint\n"
        "assert oelm.apply_oelm is oelm.method.apply_oelm and oelm.load_oelm is oelm.checkpoint.load_oelm\n"
        "assert oelm.io.read_json  # a submodule reached as an attribute, as before\n"
        "from oelm.report import write_comparison, compare_results, comparison_rows, render_report, load_results\n"
        "import oelm.report.compare, oelm.report.render\n"
        "assert compare_results is oelm.report.compare.compare_results\n"
        "assert comparison_rows is oelm.report.render.comparison_rows\n"
    )
    _loaded_after(code)  # asserts a zero exit status


def test_the_old_module_names_stay_public_aliases_that_nothing_inside_oelm_imports():
    """``oelm.train`` and ``oelm.experiment`` keep their public names for users (the same objects
    as ``oelm.training`` / ``oelm.matrix``), but oelm's own code imports the packages directly."""
    import ast

    import oelm.experiment
    import oelm.matrix
    import oelm.train
    import oelm.training

    assert oelm.train.train is oelm.training.train and oelm.train.build_engine is oelm.training.build_engine
    assert oelm.experiment.run_experiment is oelm.matrix.run_matrix
    assert not [n for n in oelm.train.__all__ if n.startswith("_")]
    src = Path(oelm.__file__).parent
    importers = []
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n in ("oelm.train", "oelm.experiment", "oelm.peft") for n in names):
                importers.append(str(path.relative_to(src)))
    assert importers == []


def test_oelm_peft_is_the_peft_integration_under_its_documented_name():
    """``import oelm.peft`` (the documented name) gives the module oelm.integrations.peft itself, not a
    second copy (PEFT would get OELM registered twice); ``oelm.peft`` works as an attribute too, and
    ``import oelm`` alone loads neither."""
    pytest.importorskip("peft")
    code = (
        "import sys, oelm\n"
        "assert 'oelm.integrations.peft' not in sys.modules and 'peft' not in sys.modules\n"
        "import oelm.peft\n"
        "import oelm.integrations.peft as integration\n"
        "assert oelm.peft is integration and sys.modules['oelm.peft'] is integration\n"
        "assert oelm.peft.OELMPeftConfig is integration.OELMPeftConfig and oelm.peft.__name__ == 'oelm.integrations.peft'\n"
        "from oelm.peft import OELMPeftConfig, add_lora\n"
        "import importlib; assert importlib.import_module('oelm.peft') is integration\n"
    )
    _loaded_after(code)  # asserts a zero exit status
    _loaded_after("import oelm\nassert oelm.peft.OELMPeftConfig.__module__ == 'oelm.integrations.peft'")


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        oelm.no_such_name  # noqa: B018
    report = importlib.import_module("oelm.report")
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        report.no_such_name  # noqa: B018


def test_omp_default_is_set_before_torch_loads():
    """Lazy imports must keep the OMP_WAIT_POLICY default in place for any oelm module that
    brings torch in (busy-waiting OpenMP threads made CPU steps ~20x slower on 2 cores)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    code = (
        "import oelm.method.apply, os, sys\n"
        "assert 'torch' in sys.modules\n"
        "assert os.environ['OMP_WAIT_POLICY'] == 'PASSIVE', os.environ.get('OMP_WAIT_POLICY')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**env, "PYTHONPATH": SRC}, timeout=120)
    assert out.returncode == 0, out.stderr
