"""Hand-damaged output files: `oelm report` names the file (and field) and the fix in one line; a
rerun of the matrix moves a run with a damaged result.json aside whole and trains it again; `oelm
monitor` shows such a run as damaged; SIGTERM while the data is prepared exits 130 with the
"rerun the same command" line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _tiny_matrix import ONE_RUN
from oelm.cli import main
from oelm.cli.monitor import collect_runs, snapshot_text
from oelm.errors import DamagedFileError
from oelm.io import read_json, read_json_object
from oelm.records import MatrixFolder, read_record

ROOT = Path(__file__).resolve().parents[1]
SST2 = ROOT / "docs" / "results" / "cpu-sst2"


@pytest.fixture
def sst2(tmp_path) -> Path:
    """A copy of the committed CPU SST-2 comparison (real runs) to damage."""
    shutil.copytree(SST2, tmp_path / "cpu-sst2")
    return tmp_path / "cpu-sst2"


def _first_result(out: Path) -> Path:
    return sorted(out.glob("runs/*/result.json"))[0]


def _edit(path: Path, change) -> None:
    r = json.loads(path.read_text())
    change(r)
    path.write_text(json.dumps(r))


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    return err[0]


def test_read_json_names_a_damaged_file_and_the_fix(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"a": 1,')
    with pytest.raises(DamagedFileError, match=rf"{path} is damaged: not valid JSON .*line 1.*; do this"):
        read_json(path, fix="do this")
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(DamagedFileError, match="not UTF-8"):
        read_json(path)
    path.write_text("[1, 2]")
    with pytest.raises(DamagedFileError, match="holds a JSON array, not an object"):
        read_json_object(path)


def test_report_of_a_matrix_with_only_sweep_runs_finished_says_so(sst2, capsys):
    """A matrix still in its learning-rate sweep has result.json files but no final run: `oelm
    report` says that, with the count, instead of claiming there are no results."""
    finals = [p for p in sst2.glob("runs/*/result.json") if read_record(p).stage == "final"]
    assert finals and len(finals) < len(list(sst2.glob("runs/*/result.json")))
    for path in finals:
        shutil.rmtree(path.parent)
    sweep = len(list(sst2.glob("runs/*/result.json")))
    before = (sst2 / "comparison.json").read_bytes()
    assert main(["report", str(sst2)]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"oelm: error: no final runs yet under {sst2 / 'runs'}: {sweep} sweep run(s) have a result")
    assert f"rerun `oelm run` with --output-dir {sst2}" in line
    assert (sst2 / "comparison.json").read_bytes() == before  # nothing written over the last comparison
    for path in sst2.glob("runs/*"):
        shutil.rmtree(path)
    assert main(["report", str(sst2)]) == 2
    assert "no runs under" in _error_line(capsys)


def test_report_on_a_truncated_result_json_names_the_file(sst2, capsys):
    path = _first_result(sst2)
    path.write_text(path.read_text()[:300])
    assert main(["report", str(sst2)]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"oelm: error: {path} is damaged: not valid JSON")
    assert "rerun `oelm run` with the same --output-dir" in line


@pytest.mark.parametrize("field, value, shown", [
    (("performance", "best_validation"), "88.5", "performance.best_validation = '88.5'"),
    (("timing", "per_step_ms"), "fast", "timing.per_step_ms = 'fast'"),
    (("seed",), True, "seed = True"),
    (("environment", "matmul_probe_drift_percent"), [3], "environment.matmul_probe_drift_percent = [3]"),
    (("performance",), [], "performance = []"),
    (("status",), "done", "status = 'done'"),
])
def test_report_on_a_result_with_a_wrong_field_type_names_file_and_field(sst2, capsys, field, value, shown):
    path = _first_result(sst2)

    def change(r):
        target = r
        for key in field[:-1]:
            target = target[key]
        target[field[-1]] = value

    _edit(path, change)
    assert main(["report", str(sst2)]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"oelm: error: {path} is damaged: field {shown}")


def test_report_on_a_result_that_is_not_an_object(sst2, capsys):
    path = _first_result(sst2)
    path.write_text("null\n")
    assert main(["report", str(sst2)]) == 2
    assert f"{path} is damaged: it holds a JSON null, not an object" in _error_line(capsys)


def test_report_on_a_damaged_sweep_json_says_it_can_be_rewritten(sst2, capsys):
    (sst2 / "sweep.json").write_text('{"selected_learning_rates": ')
    assert main(["report", str(sst2)]) == 2
    line = _error_line(capsys)
    assert f"{sst2 / 'sweep.json'} is damaged" in line and "--collect" in line


def test_every_committed_result_passes_the_field_check():
    paths = sorted((ROOT / "docs" / "results").glob("*/runs/*/result.json"))
    assert len(paths) > 100
    for path in paths:
        read_record(path)


def test_monitor_shows_a_run_with_an_unreadable_result_as_damaged(sst2, capsys):
    path = _first_result(sst2)
    path.write_text(path.read_text()[:100])
    rows = {r["name"]: r for r in collect_runs(sst2)}
    row = rows[path.parent.name]
    assert row["state"] == "damaged" and str(path) in row["damage"]
    assert sum(r["state"] == "finished" for r in rows.values()) == len(rows) - 1
    text = snapshot_text(sst2)
    assert "1 damaged" in text and f"damaged: {path}: not valid JSON" in text and "runs/.damaged/" in text
    # a result with a wrong field type is damaged too, not "finished" with numbers that are not numbers
    shutil.copy(SST2 / "runs" / path.parent.name / "result.json", path)
    _edit(path, lambda r: r["performance"].update(steps="many"))
    assert {r["name"]: r for r in collect_runs(sst2)}[path.parent.name]["state"] == "damaged"


def test_monitor_survives_a_damaged_plan_and_status(sst2):
    (sst2 / "plan.json").write_text('{"runs": "not a list"}')
    run = sorted((sst2 / "runs").iterdir())[0]
    (run / "result.json").unlink()
    (run / "status.json").write_text("{")
    rows = {r["name"]: r for r in collect_runs(sst2)}
    assert rows[run.name]["state"] == "damaged" and "status.json" in rows[run.name]["damage"]
    (sst2 / "plan.json").write_text("[")
    assert f"damaged: {sst2 / 'plan.json'}" in snapshot_text(sst2)


@pytest.mark.slow
def test_a_rerun_moves_a_damaged_run_aside_and_trains_it_again(tmp_path, data_dir, capsys):
    (tmp_path / "c.yaml").write_text(ONE_RUN)
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "c.yaml"), "--output-dir", str(out)]) == 0
    result = out / "runs" / "baseline-seed0" / "result.json"
    read_record(result)  # what the runner writes passes the reader's field check (else a rerun would redo sound runs)
    good = json.loads(result.read_text())
    damaged = result.read_text()[:200]
    result.write_text(damaged)
    capsys.readouterr()
    assert main(["run", str(tmp_path / "c.yaml"), "--output-dir", str(out)]) == 0
    log = capsys.readouterr().out
    aside = out / "runs" / ".damaged" / "baseline-seed0-1"
    assert f"{result} is damaged (not valid JSON" in log and str(aside) in log
    assert (aside / "result.json").read_text() == damaged  # nothing lost: the damaged file and its run folder
    assert (aside / "metrics.jsonl").is_file()
    again = json.loads(result.read_text())  # trained again, to the same numbers (deterministic on one process)
    assert again["status"] == "finished"
    assert again["performance"]["best_validation"] == good["performance"]["best_validation"]
    assert [r.name for _, r in MatrixFolder(out).iter_results()] == ["baseline-seed0"]


@pytest.mark.parametrize("module, name, phase", [
    ("oelm.matrix.output", "prepare_data", "preparing the data"),
    ("oelm.matrix.driver", "_check_kept", "checking the finished runs' weights"),
])
def test_sigterm_before_any_run_exits_130_with_the_rerun_line(tmp_path, data_dir, module, name, phase):
    """A real SIGTERM to `oelm run` while it prepares the data, or checks the weights of the runs it
    keeps (held in that phase by a stand-in that waits, so the signal cannot land in another one):
    exit 130 and one line saying what to do, as for a run interrupted while training."""
    (tmp_path / "c.yaml").write_text(ONE_RUN)
    script = textwrap.dedent(f"""
        import sys, time, importlib
        def waiting(*args, **kwargs):
            print("WAITING", flush=True)
            time.sleep(60)
        setattr(importlib.import_module({module!r}), {name!r}, waiting)
        from oelm.cli import main
        sys.exit(main(["run", {str(tmp_path / 'c.yaml')!r}, "--output-dir", {str(tmp_path / 'out')!r}]))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=os.environ | {"PYTHONUNBUFFERED": "1"})
    try:
        for line in proc.stdout:
            if line.strip() == "WAITING":
                break
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == (f"oelm: interrupted: SIGTERM while {phase}; no run had started, "
                                            "nothing is lost: rerun the same command to continue")
    assert "Traceback" not in err


def test_report_on_a_sweep_json_with_a_wrong_field_type_names_the_field(sst2, capsys):
    sweep = json.loads((sst2 / "sweep.json").read_text())
    sweep["methods"]["baseline"][0]["learning_rate"] = "fast"
    (sst2 / "sweep.json").write_text(json.dumps(sweep))
    assert main(["report", str(sst2)]) == 2
    assert f"{sst2 / 'sweep.json'} is damaged: field methods.baseline.0.learning_rate = 'fast'" in _error_line(capsys)


def test_hand_edited_metrics_lines_are_skipped_not_fatal(sst2):
    """A metrics.jsonl line that is not an object, or whose step or numbers are not numbers, is
    left out like a torn line: the comparison is the committed one."""
    path = sorted(sst2.glob("runs/*/metrics.jsonl"))[0]
    with path.open("a") as fh:
        fh.write("[1, 2]\n5\n" + json.dumps({"type": "eval", "step": "late", "accuracy": 99.0}) + "\n"
                 + json.dumps({"type": "eval", "step": 10**6, "accuracy": "high"}) + "\n")
    with path.open("ab") as fh:
        fh.write(b"\xff\xfe\x00 not text\n")
    assert main(["report", str(sst2)]) == 0
    committed = json.loads((SST2 / "comparison.json").read_text())
    rebuilt = json.loads((sst2 / "comparison.json").read_text())
    assert rebuilt["methods"] == committed["methods"] and rebuilt["warnings"] == committed["warnings"]


def test_report_that_cannot_be_written_is_one_line_and_the_runs_stay(sst2, capsys, report_plots):
    """A report file that cannot be written (here report_files/ is a file, so nothing can go in it;
    a read-only folder or a full disk fail the same way): one line naming the folder and the fix."""
    shutil.rmtree(sst2 / "report_files")
    (sst2 / "report_files").write_text("in the way")
    before = {p: p.read_bytes() for p in sst2.glob("runs/*/result.json")}
    assert main(["report", str(sst2)]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"oelm: error: cannot write the report into {sst2}") and "run `oelm report` on the copy" in line
    assert {p: p.read_bytes() for p in sst2.glob("runs/*/result.json")} == before


def test_claims_on_a_damaged_committed_comparison_names_it(tmp_path):
    from research.claims import claims_markdown

    results = tmp_path / "results"
    shutil.copytree(ROOT / "docs" / "results", results, ignore=shutil.ignore_patterns("runs", "report_files"))
    (results / "evidence2-sst2-full" / "comparison.json").write_text('{"methods": ')
    with pytest.raises(DamagedFileError, match=r"evidence2-sst2-full/comparison.json is damaged.*oelm report DIR"):
        claims_markdown(results)


def test_a_result_json_that_is_a_directory_is_damaged_not_a_traceback(sst2, capsys):
    path = _first_result(sst2)
    path.unlink()
    path.mkdir()
    assert main(["report", str(sst2)]) == 2
    assert f"{path} is damaged: it is a directory, not a file" in _error_line(capsys)
    assert {r["name"]: r["state"] for r in collect_runs(sst2)}[path.parent.name] == "damaged"
    moved = MatrixFolder(sst2).set_aside_damaged(lambda line: None)
    assert moved == [sst2 / "runs" / ".damaged" / f"{path.parent.name}-1"] and (moved[0] / "result.json").is_dir()


@pytest.mark.parametrize("text, shown", [("{", "not valid JSON"), ('{"fingerprint": [1]}', "field fingerprint = [1] is not an object")])
def test_a_rerun_on_a_damaged_experiment_json_names_it_and_trains_nothing(tmp_path, capsys, text, shown):
    (tmp_path / "c.yaml").write_text(ONE_RUN)
    out = tmp_path / "out"
    out.mkdir()
    (out / "experiment.json").write_text(text)
    assert main(["run", str(tmp_path / "c.yaml"), "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"oelm: error: {out / 'experiment.json'} is damaged: {shown}") and "restore it from a copy" in err
    assert (out / "experiment.json").read_text() == text and not (out / "runs").exists()


def test_a_damaged_status_json_is_replaced_when_the_run_starts(tmp_path):
    from oelm.records import PlannedRun, read_status, write_status

    (tmp_path / "status.json").write_text("{")
    with pytest.raises(DamagedFileError, match="status.json is damaged"):
        read_status(tmp_path)
    write_status(tmp_path, PlannedRun("baseline", 1e-3, 0, "final", "baseline-seed0"), "running", total_steps=4)
    assert read_status(tmp_path)["state"] == "running" and read_status(tmp_path)["total_steps"] == 4


def test_report_on_a_damaged_config_yaml_names_it(sst2, capsys):
    with (sst2 / "config.yaml").open("a") as fh:
        fh.write("\n: : [\n")
    assert main(["report", str(sst2)]) == 2
    assert _error_line(capsys).startswith(f"oelm: error: config file {sst2 / 'config.yaml'} is not valid YAML at line")


def test_a_copied_run_folder_is_refused_not_counted_twice(sst2, capsys):
    run = _first_result(sst2).parent
    shutil.copytree(run, run.with_name(run.name + "-copy"))
    assert main(["report", str(sst2)]) == 2
    line = _error_line(capsys)
    assert f"{run.name} and {run.name}-copy (a copied run folder?)" in line and "move the one that does not belong" in line
