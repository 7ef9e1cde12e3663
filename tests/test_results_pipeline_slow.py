"""Slow end-to-end runs of the committed CPU results' pipeline (sweep -> selection -> final runs ->
test once -> comparison -> monitor) on real data, at a reduced budget: what CI runs instead of the
full matrices. Kept apart from test_end_to_end_slow.py so that `make test`'s parallel workers (one
file each) can run the two side by side.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oelm.cli import main

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


# SST-2's labelled test split (1,821 sentences) is cut to 64, like the validation split: three full
# test passes of MiniLM were most of this test's ~150 s on one core
@pytest.mark.parametrize(("config", "extra"), [
    pytest.param("cpu/phase1_bert/sst2.yaml", ["task.test_samples=64"], id="cpu/phase1_bert/sst2.yaml"),
    pytest.param("cpu/phase2_gpt_lm/tinystories.yaml", [], id="cpu/phase2_gpt_lm/tinystories.yaml"),
])
def test_results_pipeline_on_a_reduced_budget(config, extra, tmp_path, data_dir, capsys):
    """The pipeline of the committed CPU results (sweep -> selection -> final runs -> test once ->
    comparison -> monitor), on one seed and a few steps: what CI runs instead of the full matrix."""
    out = tmp_path / "out"
    code = main([
        "run", str(ROOT / "configs" / config), "--output-dir", str(out), "seeds=[0]", "training.max_steps=4",
        "training.eval_every=2", "training.log_every=2", "training.progress_bar=false", "task.train_samples=64",
        "task.validation_samples=64", *extra,
    ])
    assert code == 0
    sweep = json.loads((out / "sweep.json").read_text())
    assert set(sweep["methods"]) == {"baseline", "oelm_freeze", "oelm_random"}
    results = [json.loads(p.read_text()) for p in (out / "runs").glob("*/result.json")]
    assert len(results) == 6 and all(r["status"] == "finished" for r in results)
    finals = [r for r in results if r["stage"] == "final"]
    assert len(finals) == 3 and all(r["selected"] for r in finals)
    has_test = bool(json.loads((out / "experiment.json").read_text())["fingerprint"]["task"]["test_split"])
    for r in results:
        assert (r["performance"]["test"] is not None) == (has_test and r["stage"] == "final")
        if r["performance"]["test"] is not None and extra:
            assert r["data"]["test"]["examples"] == 64
    capsys.readouterr()
    assert main(["monitor", str(out), "--once"]) == 0
    assert "6 runs: 0 pending, 0 running, 6 finished" in capsys.readouterr().out
