"""research/temperature_drift.py: how far a matrix's learned temperatures moved, from its result files
and the pretrained model (the real all-MiniLM-L6-v2, offline), recomputing each start with no training."""

from __future__ import annotations

import json

import pytest
import torch

from research.temperature_drift import drift_rows, start_temperatures


def _result(method: str, seed: int, per_head: dict, **extra) -> dict:
    return {"method": method, "seed": seed, "run_name": f"{method}-seed{seed}", "stage": "final", "selected": False,
            "model": "sentence-transformers/all-MiniLM-L6-v2", "diagnostics": {"per_head": per_head}, **extra}


def test_the_start_is_the_norm_ratio_and_the_drift_is_read_from_result_json(tmp_path):
    method_config = {"method": "tau", "init": "orthogonalize", "targets": ["query", "key"],
                     "head_temperature": "norm_ratio", "split_fused": True, "learning_rate": 1e-4}
    starts = start_temperatures(_result("tau", 0, {}, method_config=method_config))
    assert len(starts) == 6 and all(len(layer) == 12 for layer in starts)  # MiniLM-L6: 6 layers x 12 heads
    # the norm ratio of each head (> 1 on MiniLM: pretrained rows are longer than orthonormal ones), not a constant
    flat = torch.tensor(starts).flatten()
    assert bool((flat > 1).all()) and flat.std() > 0.1
    moved = [[s * (1.10 if h % 2 else 0.95) for h, s in enumerate(layer)] for layer in starts]
    scale = [[1.0] * 12 for _ in range(6)]
    for name, res in {"tau-lr0.0001-seed0": _result("tau", 0, {"head_temperature": moved, "logit_scale": scale},
                                                     method_config=method_config),
                      "fixed-lr0.0001-seed0": _result("fixed", 0, {"logit_scale": scale}),
                      "old-lr0.0001-seed0": _result("old", 0, {"logit_scale": [[1.02] * 12 for _ in range(6)]}),
                      "old-lr0.0002-seed0": _result("old", 0, {}, stage="sweep")}.items():
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "result.json").write_text(json.dumps(res | {"run_name": name}))
    lines = drift_rows(tmp_path, ["tau", "old"], against="fixed")
    assert lines[0] == "tau seed 0: tau moved median 7.50%, max 10.00% from its start (72 heads)"
    assert lines[1] == "old seed 0: no recorded tau; logit scale against fixed's, per head: median 2.00%, max 2.00% apart"
    assert len(lines) == 2  # the sweep run is not a final run
    with pytest.raises(ValueError, match="learns no head temperature"):
        start_temperatures(_result("fixed", 0, {}, method_config={"head_temperature": None}))
