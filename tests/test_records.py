"""oelm.records, the ground floor every writer and reader of a run folder goes through: the
writer's constructor is checked by the schema the readers check with before anything is written,
and "which runs are final" is decided once, so the plan and the report agree on real outputs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from oelm.config import load_config
from oelm.errors import OELMError
from oelm.matrix.plan import final_results, select_learning_rates
from oelm.records import (
    MatrixFolder, PlannedRun, RunRecord, failed_result, final_runs, read_record, run_identity, write_record,
)
from oelm.report import load_results

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
COMMITTED = sorted(p.parent for p in RESULTS.glob("*/comparison.json"))


def test_a_written_record_reads_back_equal(tmp_path):
    run = PlannedRun("baseline", 1e-3, 0, "final", "baseline-seed0")
    record = failed_result(run_identity(run, "sst2", "gpt-tiny"), config={"name": "x"}, kind="nan", message="loss is nan",
                           step=7)
    write_record(tmp_path / "result.json", record)
    back = read_record(tmp_path / "result.json")
    assert back == record and back.failed and back.failure_kind == "nan" and back.failure_step == 7
    assert back.name == "baseline-seed0" and back.key() == ("baseline", 1e-3, 0)


def test_the_writer_refuses_a_record_its_readers_would_refuse(tmp_path):
    """A result the schema rejects (a seed that is a string) is never written: the next reader would
    call the run damaged and train it again."""
    run = PlannedRun("baseline", 1e-3, "0", "final", "baseline-seed0")  # type: ignore[arg-type]
    record = failed_result(run_identity(run, "sst2", "gpt-tiny"), config={}, kind="nan", message="", step=1)
    with pytest.raises(ValueError, match=r"field seed = '0'"):
        write_record(tmp_path / "result.json", record)
    assert not (tmp_path / "result.json").exists()


def test_non_finite_numbers_are_written_as_null_and_read_back(tmp_path):
    record = RunRecord({"method": "m", "seed": 0, "status": "finished",
                        "performance": {"metric": "accuracy", "best_validation": float("nan"), "test": float("inf")}})
    write_record(tmp_path / "result.json", record)
    back = read_record(tmp_path / "result.json")
    assert back.best_validation is None and back.test is None


@pytest.mark.parametrize("out", COMMITTED, ids=[p.name for p in COMMITTED])
def test_plan_and_report_select_the_same_final_runs(out):
    """On every committed matrix: the final runs the plan compares at the end of `oelm run`
    (selection recomputed from the runs) are the ones `oelm report` reads back (selection from
    sweep.json), in the same order."""
    config = load_config(out / "config.yaml")
    results = MatrixFolder(out).results()
    metric = next(r.metric for r in results.values() if r.finished)
    by_plan = {m: runs for m, runs in final_results(config, select_learning_rates(config, metric, results), results).items()
               if runs}
    by_report = load_results(out)
    assert {m: [r.name for r in runs] for m, runs in by_plan.items()} == \
           {m: [r.name for r in runs] for m, runs in by_report.items()}
    assert all(r.is_final or r.failed for runs in by_report.values() for r in runs)


def test_a_copied_final_run_is_refused_naming_both_folders(tmp_path):
    out = tmp_path / "cpu-sst2"
    shutil.copytree(RESULTS / "cpu-sst2", out)
    run, first = next((d, r) for d, r in MatrixFolder(out).iter_results() if r.method == "baseline" and r.is_final)
    copy = out / "runs" / f"{run.name}-copy"
    copy.mkdir()
    shutil.copy(run.result, copy / "result.json")
    with pytest.raises(OELMError, match=f"two final runs of baseline seed {first.seed} under .*: {run.name} and {copy.name}"):
        load_results(out)


def test_records_is_the_ground_floor():
    """oelm.records imports no other layer of oelm than the ground floor (errors, io, metrics,
    _version; and no torch, no pydantic until a file is read)."""
    code = ("import sys, oelm.records; "
            "print(sorted(m for m in sys.modules if m.startswith('oelm.') and not m.startswith('oelm.records')), "
            "'torch' in sys.modules, 'pydantic' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "['oelm._version', 'oelm.errors', 'oelm.io', 'oelm.metrics'] False False"


def test_result_json_keys_are_spelled_only_in_records():
    """Readers ask RunRecord's properties: a result.json section read by key outside oelm.records
    (``["performance"]``, ``.get("timing")``, ``record.raw``) is a reader that bypasses the typed record."""
    src = Path(__file__).resolve().parents[1] / "src" / "oelm"
    sections = ("performance", "timing", "budget", "method_config", "stop_signal", "failure")
    offenders = []
    for path in src.rglob("*.py"):
        if "records" in path.relative_to(src).parts:
            continue
        text = path.read_text()
        offenders += [f"{path.relative_to(src)}: {key}" for key in sections if f'["{key}"]' in text or f'.get("{key}")' in text]
        reader = path.relative_to(src).parts[0] != "data"  # data/ has no run records (and names wiki.test.raw)
        offenders += [f"{path.relative_to(src)}: .raw"] if reader and re.search(r"\.raw\b", text) else []
    assert offenders == []
