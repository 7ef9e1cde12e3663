"""Slow end-to-end runs on real data: the shipped configs, at reduced budgets, really learn.

These take a few minutes on 2 CPU cores and run in CI (`make test`); `make test-fast` skips them.
The TinyStories run is in test_end_to_end_lm_slow.py and the reduced-budget runs of the committed
results' pipeline in test_results_pipeline_slow.py: `make test` hands each file to one parallel
worker, so the longest runs sit in files of their own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oelm.cli import main

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_quickstart_learns_sst2(tmp_path, data_dir):
    """MiniLM on 3,200 SST-2 sentences, full validation: both methods far above chance (50.9%).

    One validation, at the end of the epoch (the config's four cost ~70 s more of this test's time on
    one core; on this machine the end-of-epoch accuracies were 79.7 / 76.7%)."""
    out = tmp_path / "qs"
    code = main([
        "run", str(ROOT / "configs/quickstart.yaml"), "--output-dir", str(out),
        "task.train_samples=3200", "training.progress_bar=false", "training.evals_per_epoch=1",
        "methods=[{name: baseline, learning_rate: 1.0e-4}, {name: oelm_freeze, learning_rate: 2.0e-4}]",
    ])
    assert code == 0
    c = json.loads((out / "comparison.json").read_text())
    for method in ("baseline", "oelm_freeze"):
        r = json.loads((out / "runs" / f"{method}-seed0" / "result.json").read_text())
        assert r["data"]["validation"]["examples"] == 872
        assert r["performance"]["best_validation"] > 75.0, (method, r["performance"])
        assert r["timing"]["per_step_ms"]["n"] == 100 - 5  # 3,200 / 32 steps minus timing warm-up
    assert c["vs_baseline"]["oelm_freeze"]["parameters_saved_percent"] == pytest.approx(100 * 1_774_080 / 22_713_986)
