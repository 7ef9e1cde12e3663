"""Slow end-to-end runs on real data: the shipped configs, at reduced budgets, really learn.

These take a few minutes on 2 CPU cores and run in CI (`make test`); `make test-fast` skips them.
The reduced-budget runs of the committed results' pipeline are in test_results_pipeline_slow.py (a
file of their own: `make test` hands each file to one parallel worker).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oelm.cli import main
from oelm.init import max_orthogonality_error

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_quickstart_learns_sst2(tmp_path, data_dir):
    """MiniLM on 3,200 SST-2 sentences, full validation: both methods far above chance (50.9%)."""
    out = tmp_path / "qs"
    code = main([
        "run", str(ROOT / "configs/quickstart.yaml"), "--output-dir", str(out),
        "task.train_samples=3200", "training.progress_bar=false",
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


def test_tinystories_tiny_perplexity_drops(tmp_path, data_dir):
    """gpt-tiny from scratch: validation perplexity falls far below the untrained model's (step 0)."""
    out = tmp_path / "ts"
    code = main([
        "run", str(ROOT / "configs/tinystories-tiny.yaml"), "--output-dir", str(out),
        "task.train_samples=800", "training.epochs=1", "training.progress_bar=false", "training.evals_per_epoch=2",
        "training.eval_at_start=true",
        "methods=[{name: baseline, learning_rate: 1.0e-3}, {name: oelm_freeze, learning_rate: 2.0e-3}]",
    ])
    assert code == 0
    for method in ("baseline", "oelm_freeze"):
        run = out / "runs" / f"{method}-seed0"
        evals = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if '"eval"' in l]
        assert evals[0]["step"] == 0
        first, best = evals[0]["perplexity"], min(e["perplexity"] for e in evals)
        r = json.loads((run / "result.json").read_text())
        assert r["performance"]["best_validation"] == pytest.approx(best)
        # untrained: about the vocabulary size (4,096, uniform prediction); trained: far below
        assert first > 1000 and best < 0.1 * first, (method, first, best)
    from safetensors.torch import load_file

    state = load_file(str(out / "runs" / "oelm_freeze-seed0" / "checkpoint" / "model.safetensors"))
    for layer in range(4):
        assert max_orthogonality_error(state[f"transformer.h.{layer}.attn.q_proj.weight"], 4) < 1e-5
