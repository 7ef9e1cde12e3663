"""Values checked against their meaning before any average (issue 46): a ``result.json`` whose
perplexity is below 1, whose accuracy is outside 0-100 %, whose times are negative or not finite,
or whose ``run_name`` names another run folder, is damaged: ``oelm report`` names the file and the
field in one line and averages nothing; a rerun of the matrix sets the run aside like any damaged
one and trains it again. Every committed result passes the check."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from _tiny_matrix import ONE_RUN
from oelm.cli import main
from oelm.io import sha256_file
from oelm.records import MatrixFolder, read_record

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"


def _copy(tmp_path: Path, name: str) -> Path:
    shutil.copytree(RESULTS / name, tmp_path / name)
    return tmp_path / name


def _final(out: Path) -> Path:
    return next(p for p in sorted(out.glob("runs/*/result.json")) if read_record(p).is_final)


def _set(path: Path, keys: tuple[str, ...], value) -> None:
    raw = json.loads(path.read_text())
    target = raw
    for key in keys[:-1]:
        target = target.setdefault(key, {})
    target[keys[-1]] = value
    path.write_text(json.dumps(raw))  # json writes float("nan") / inf as NaN / Infinity, as a hand edit could


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    return err[0]


def test_every_committed_result_passes_the_value_check():
    paths = sorted(RESULTS.glob("*/runs/*/result.json"))
    assert len(paths) > 300
    for path in paths:
        read_record(path)  # raises DamagedFileError naming the file on an impossible value


@pytest.mark.parametrize("matrix, keys, value, shown", [
    ("cpu-tinystories", ("performance", "best_validation"), -5.0, "performance.best_validation = -5.0 (perplexity is at least 1)"),
    ("cpu-tinystories", ("performance", "test"), 0.5, "performance.test = 0.5 (perplexity is at least 1)"),
    ("cpu-tinystories", ("performance", "token_accuracy", "test"), 101.0, "performance.token_accuracy.test = 101.0"),
    ("cpu-sst2", ("performance", "best_validation"), 150.0, "performance.best_validation = 150.0 (accuracy is 0 to 100 %)"),
    ("cpu-sst2", ("performance", "test"), -1.0, "performance.test = -1.0 (accuracy is 0 to 100 %)"),
    ("cpu-sst2", ("performance", "test"), float("nan"), "performance.test = nan (not a finite number)"),
    ("cpu-sst2", ("performance", "final_train_loss"), -0.1, "performance.final_train_loss = -0.1"),
    ("cpu-sst2", ("performance", "steps"), -3, "performance.steps = -3 (a step count is at least 0)"),
    ("cpu-sst2", ("timing", "total_seconds"), -12.0, "timing.total_seconds = -12.0 (a time or a speed is at least 0)"),
    ("cpu-sst2", ("timing", "train_seconds"), float("inf"), "timing.train_seconds = inf (not a finite number)"),
    ("cpu-sst2", ("learning_rate",), -0.001, "learning_rate = -0.001 (a learning rate is above 0)"),
])
def test_report_refuses_an_impossible_value_in_one_line_and_averages_nothing(tmp_path, capsys, matrix, keys, value, shown):
    out = _copy(tmp_path, matrix)
    path = _final(out)
    _set(path, keys, value)
    before = (out / "comparison.json").read_bytes()
    assert main(["report", str(out)]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"oelm: error: {path} is damaged: field {shown}")
    assert "rerun `oelm run` with the same --output-dir" in line
    assert (out / "comparison.json").read_bytes() == before  # nothing averaged, nothing written


def _weights(run: Path, data: bytes) -> dict:
    (run / "checkpoint").mkdir()
    (run / "checkpoint" / "model.safetensors").write_bytes(data)
    return {"path": "checkpoint/model.safetensors", "sha256": sha256_file(run / "checkpoint" / "model.safetensors"),
            "bytes": len(data)}


def test_a_result_whose_run_name_names_another_run_is_the_damaged_file_not_the_healthy_run(tmp_path, capsys):
    """Run B's result.json edited (or copied) to name run A: the line names B's file; A, healthy,
    is neither blamed nor to be deleted."""
    out = _copy(tmp_path, "cpu-sst2")
    healthy, damaged = (out / "runs" / n for n in ("baseline-lr0.0001-seed0", "baseline-lr0.0001-seed1"))
    _set(healthy / "result.json", ("checkpoint",), _weights(healthy, b"weights of A"))
    _set(damaged / "result.json", ("checkpoint",), _weights(damaged, b"weights of B"))
    assert main(["report", str(out)]) == 0  # both sound: no warning about either
    assert "corrupted" not in capsys.readouterr().err
    _set(damaged / "result.json", ("run_name",), healthy.name)
    assert main(["report", str(out)]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"oelm: error: {damaged / 'result.json'} is damaged: field run_name = '{healthy.name}' "
                           f"(it names another run: the file is in the run folder '{damaged.name}'")
    assert f"delete {healthy}" not in line


def test_a_rerun_sets_a_run_with_an_impossible_value_aside_and_trains_it_again(tmp_path, data_dir, capsys):
    (tmp_path / "c.yaml").write_text(ONE_RUN)
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "c.yaml"), "--output-dir", str(out)]) == 0
    result = out / "runs" / "baseline-seed0" / "result.json"
    good = read_record(result).best_validation
    _set(result, ("performance", "best_validation"), -5.0)
    edited = result.read_text()
    capsys.readouterr()
    assert main(["run", str(tmp_path / "c.yaml"), "--output-dir", str(out)]) == 0
    log = capsys.readouterr().out
    aside = out / "runs" / ".damaged" / "baseline-seed0-1"
    lines = [line for line in log.splitlines() if "is damaged" in line]
    assert len(lines) == 1 and f"{result} is damaged (field performance.best_validation = -5.0" in lines[0]
    assert str(aside) in lines[0]
    assert (aside / "result.json").read_text() == edited  # kept whole, never averaged
    assert read_record(result).best_validation == good  # trained again, to the same number
    assert [r.best_validation for _, r in MatrixFolder(out).iter_results()] == [good]


def test_impossible_values_in_metrics_lines_are_skipped_like_torn_ones(tmp_path):
    """Curves and times to quality are averaged from metrics.jsonl: a line whose accuracy is over
    100 %, whose loss or step is negative, is left out like a torn line; the comparison is the committed one."""
    out = _copy(tmp_path, "cpu-sst2")
    for path in sorted(out.glob("runs/*/metrics.jsonl"))[:3]:
        last = max(json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip())
        with path.open("a") as fh:
            for bad in ({"accuracy": 150.0}, {"accuracy": -3.0}, {"accuracy": 99.0, "loss": -1.0}):
                fh.write(json.dumps({"type": "eval", "step": last + 1} | bad) + "\n")
            fh.write(json.dumps({"type": "eval", "step": -1, "accuracy": 99.0}) + "\n")
    assert main(["report", str(out)]) == 0
    committed = json.loads((RESULTS / "cpu-sst2" / "comparison.json").read_text())
    rebuilt = json.loads((out / "comparison.json").read_text())
    assert rebuilt["methods"] == committed["methods"] and rebuilt["warnings"] == committed["warnings"]
    assert rebuilt["time_to_target"] == committed["time_to_target"]  # an accuracy of 150 % reached no target


def test_the_writer_refuses_a_value_its_readers_would_refuse(tmp_path):
    """What is written can be read back: a perplexity of 0.5 is never written (the next reader would
    call the run damaged and train it again)."""
    from oelm.records import RunRecord, write_record

    raw = json.loads(_final(RESULTS / "cpu-tinystories").read_text())
    raw["performance"]["best_validation"] = 0.5
    with pytest.raises(ValueError, match=r"field performance.best_validation = 0.5 \(perplexity is at least 1\)"):
        write_record(tmp_path / "result.json", RunRecord(raw))
    assert not (tmp_path / "result.json").exists()
