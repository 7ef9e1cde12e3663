"""Slow end-to-end run on real data: gpt-tiny from scratch on TinyStories really learns, and
OELM-Freeze's saved query projections stay orthogonal (a file of its own so that `make test`'s
parallel workers can run it beside the SST-2 quickstart run in test_end_to_end_slow.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oelm.cli import main
from oelm.method.init import max_orthogonality_error

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_tinystories_tiny_perplexity_drops(tmp_path, data_dir):
    """gpt-tiny from scratch: validation perplexity falls far below the untrained model's (step 0).

    200 of the 714 validation stories: the full set (1,554 blocks, more than the 1,351 trained on)
    made the three validations ~55% of the test's time."""
    out = tmp_path / "ts"
    code = main([
        "run", str(ROOT / "configs/tinystories-tiny.yaml"), "--output-dir", str(out),
        "task.train_samples=800", "task.validation_samples=200", "training.epochs=1", "training.progress_bar=false",
        "training.evals_per_epoch=2",
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
