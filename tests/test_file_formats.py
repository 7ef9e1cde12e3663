"""Every versioned file oelm writes is checked on read (issue 46, item 5): ``predictions.npz``
(``meta["format"]``), ``result.json`` and ``sweep.json`` (``format``; files written before it
have none and read as version 1, so committed results still read). A newer version is one line
naming the file and "upgrade oelm"; an older one or none (predictions) names the file and the fix;
a rerun never moves such a file aside as damaged. Resume checkpoints and lean / stock checkpoints
were checked before (tests/test_checkpoint.py, tests/test_hf_checkpoints.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from oelm.cli import main
from oelm.errors import FileFormatError
from oelm.io import sha256_file
from oelm.records import RunRecord, read_record, read_sweep
from oelm.records.predictions import PREDICTIONS_FORMAT, predictions_record, read_predictions
from oelm.records.result import RESULT_FORMAT, validate_result
from oelm.records.sweep import SWEEP_FORMAT

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ROOT / "docs" / "results" / "research-variants-sst2"
RUN = "oelm_ffn_only-lr0.0002-seed1"


@pytest.fixture
def matrix(tmp_path) -> Path:
    shutil.copytree(VARIANTS, tmp_path / "m")
    return tmp_path / "m"


def _rewrite_predictions(run: Path, format_value) -> Path:
    """The run's predictions.npz written again with ``meta["format"]`` = ``format_value`` (None:
    removed), and its record in result.json updated to match, as a newer or older oelm would leave it."""
    path = run / "predictions.npz"
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(str(arrays["meta"]))
    meta.pop("format")
    if format_value is not None:
        meta["format"] = format_value
    arrays["meta"] = np.array(json.dumps(meta))
    with open(path, "wb") as fh:
        np.savez_compressed(fh, **arrays)
    raw = json.loads((run / "result.json").read_text())
    raw["predictions"] = predictions_record(run)
    (run / "result.json").write_text(json.dumps(raw))
    return path


def test_committed_files_read_as_the_current_version():
    assert all("format" not in json.loads(p.read_text()) for p in VARIANTS.glob("runs/*/result.json"))
    record = read_record(VARIANTS / "runs" / RUN / "result.json")  # no format: read as version 1
    assert read_predictions(VARIANTS / "runs" / RUN, record).meta["format"] == PREDICTIONS_FORMAT
    read_sweep(VARIANTS / "sweep.json")


def test_what_is_written_carries_its_version():
    raw = json.loads((VARIANTS / "runs" / RUN / "result.json").read_text())
    assert validate_result(raw)["format"] == RESULT_FORMAT == 1
    from oelm.records import sweep_file

    assert sweep_file([0], {}, {}, {})["format"] == SWEEP_FORMAT == 1


@pytest.mark.parametrize("version, shown", [
    (PREDICTIONS_FORMAT + 1, f"has format {PREDICTIONS_FORMAT + 1}, newer than this oelm reads ({PREDICTIONS_FORMAT}): "
                             "a newer oelm wrote it; upgrade oelm"),
    (0, f"has format 0, but this oelm reads format {PREDICTIONS_FORMAT}; restore it from a copy"),
    (None, f"has no format, but this oelm reads format {PREDICTIONS_FORMAT}; restore it from a copy"),
    ("1", f"has format '1', but this oelm reads format {PREDICTIONS_FORMAT}"),
])
def test_a_predictions_file_of_another_version_is_one_line(matrix, version, shown):
    run = matrix / "runs" / RUN
    path = _rewrite_predictions(run, version)
    with pytest.raises(FileFormatError) as caught:
        read_predictions(run, read_record(run / "result.json"))
    assert str(caught.value).startswith(f"{path} {shown}") and "\n" not in str(caught.value)


def test_the_report_leaves_a_newer_predictions_file_out_with_a_note(matrix):
    from oelm.config import load_config
    from oelm.report import compare_results, load_results

    path = _rewrite_predictions(matrix / "runs" / RUN, PREDICTIONS_FORMAT + 1)
    c = compare_results(load_config(matrix / "config.yaml"), load_results(matrix), matrix)
    (note,) = c["uncertainty"]["notes"]
    assert str(path) in note and "upgrade oelm" in note
    assert c["uncertainty"]["methods"]["oelm_ffn_only"]["interval"] == "seed-only interval"


@pytest.mark.parametrize("name", ["result", "sweep"])
def test_a_newer_result_or_sweep_json_is_one_line_and_never_set_aside(matrix, capsys, name):
    path = matrix / "runs" / RUN / "result.json" if name == "result" else matrix / "sweep.json"
    raw = json.loads(path.read_text())
    path.write_text(json.dumps(raw | {"format": 2}))
    assert main(["report", str(matrix)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (f"oelm: error: {path} has format 2, newer than this oelm reads (1): a newer oelm wrote it; upgrade "
                    "oelm (pip install -U oelm) to read it")
    from oelm.records import MatrixFolder

    if name == "result":  # not damage: `oelm run` stops on the same line and keeps the file where it is
        with pytest.raises(FileFormatError, match="upgrade oelm"):
            MatrixFolder(matrix).set_aside_damaged(print)
    assert path.is_file() and not (matrix / "runs" / ".damaged").exists()
