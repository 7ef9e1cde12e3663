"""AUCC and multi-level time to quality (oelm.report.convergence) on synthetic curves whose area
and crossing times are known in closed form, then through compare_results and the report on
constructed run folders (metrics.jsonl eval records as the training loop writes them)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from oelm.config import config_from_dict
from oelm.records import RunRecord
from oelm.report import compare_results, write_comparison
from oelm.report.convergence import aucc, first_reaching, normalized_score, time_to_quality


def test_aucc_of_a_staircase_is_its_left_riemann_sum():
    # validations at t = 0, 1, ..., 10 with accuracy 10 t %: held step-wise, the area over [0, 10] is
    # sum_{j<10} j/10 = 4.5 (the triangle's 5 less half a step per interval); normalized: 0.45
    t = np.arange(11.0)
    score = normalized_score(10 * t, "accuracy")
    assert aucc(t, score, 10.0) == pytest.approx(0.45)
    assert aucc(t, score, 5.0) == pytest.approx((0 + 0.1 + 0.2 + 0.3 + 0.4) / 5)  # a budget cuts the curve
    assert aucc(t, score, 4.5) == pytest.approx((0 + 0.1 + 0.2 + 0.3 + 0.4 * 0.5) / 4.5)
    # nothing before the first validation: a curve measured from t = 2 on has 2 units less area
    assert aucc(t[2:], score[2:], 10.0) == pytest.approx((4.5 - 0.1) / 10)
    assert aucc([], [], 1.0) is None and aucc(t, score, 0.0) is None


def test_aucc_of_a_densely_validated_exponential_approaches_the_analytic_area():
    tau, budget = 3.0, 10.0
    t = np.linspace(0.0, 12.0, 120_001)  # a validation every 1e-4 s
    acc = 100 * (1 - np.exp(-t / tau))
    exact = 1 - tau * (1 - math.exp(-budget / tau)) / budget  # (1/B) * integral_0^B (1 - e^{-t/tau}) dt
    got = aucc(t, normalized_score(acc, "accuracy"), budget)
    assert got == pytest.approx(exact, abs=2e-5) and got < exact  # the hold lags a rising curve


def test_perplexity_score_is_the_share_of_the_uniform_log_perplexity_removed():
    v = 4096
    assert normalized_score([v, 1.0, math.sqrt(v), 10 * v], "perplexity", v) == pytest.approx([0.0, 1.0, 0.5, 0.0])
    with pytest.raises(ValueError, match="vocabulary size"):
        normalized_score([10.0], "perplexity")


def test_time_to_each_quality_level_is_the_first_validation_past_the_analytic_crossing():
    tau, final = 2.0, 90.0
    t = np.arange(0.0, 20.0, 0.25)
    acc = final * (1 - np.exp(-t / tau))
    for q in (0.90, 0.95, 0.99):
        crossing = -tau * math.log(1 - q)  # a(t) = q * final
        expected = t[t >= crossing - 1e-12][0]
        assert time_to_quality(t, acc, q * final, True) == pytest.approx(expected)
    ppl = 30 * np.exp(2 * np.exp(-t / tau))  # falls towards 30
    target = 30 / 0.95
    assert time_to_quality(t, ppl, target, False) == t[first_reaching(ppl, target, False)]
    assert time_to_quality(t, acc, 200.0, True) is None


# --- through the comparison -----------------------------------------------------------------

TAU = {"baseline": 2.0, "oelm_freeze": 4.0}  # freeze converges half as fast
SECONDS_PER_STEP = {"baseline": 1.0, "oelm_freeze": 0.8}
FLOPS_PER_STEP = {"baseline": 1e9, "oelm_freeze": 0.9e9}
FINAL = {0: 90.0, 1: 91.0, 2: 89.0}


def _curve(method: str, seed: int, steps: int) -> list[tuple[int, float, float, float]]:
    """(step, train seconds, FLOPs, accuracy) of each validation (every 2 steps and at step 0)."""
    out = []
    for step in range(0, steps + 1, 2):
        sec = step * SECONDS_PER_STEP[method]
        out.append((step, sec, step * FLOPS_PER_STEP[method], FINAL[seed] * (1 - math.exp(-sec / TAU[method]))))
    return out


def _write(out: Path, method: str, seed: int, steps: int) -> RunRecord:
    run = out / "runs" / f"{method}-seed{seed}"
    run.mkdir(parents=True)
    curve = _curve(method, seed, steps)
    with (run / "metrics.jsonl").open("w") as fh:
        for step, sec, flops, acc in curve:
            fh.write(json.dumps({"type": "train", "step": step, "loss": 0.5}) + "\n")
            fh.write(json.dumps({"type": "eval", "step": step, "accuracy": acc, "loss": 0.4, "elapsed_seconds": sec + 1,
                                 "train_wall_seconds": sec, "train_tokens": 100 * step, "train_flops": flops}) + "\n")
    final = curve[-1][3]
    result = {"method": method, "seed": seed, "run_name": run.name, "stage": "final", "status": "finished",
              "data": {"num_labels": 2}, "timing": {"total_seconds": curve[-1][1]},
              "performance": {"metric": "accuracy", "best_validation": final, "final_validation": final, "test": None,
                              "best_step": steps, "steps": steps, "final_train_loss": 0.3}}
    (run / "result.json").write_text(json.dumps(result))
    return RunRecord(result)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    out = tmp_path_factory.mktemp("convergence")
    steps = {"baseline": 20, "oelm_freeze": 24}
    results = {m: [_write(out, m, s, steps[m]) for s in FINAL] for m in TAU}
    config = config_from_dict({"name": "synthetic", "task": {"dataset": "sst2"}, "model": {"gpt": "gpt-tiny"},
                               "methods": [{"name": m} for m in TAU], "seeds": list(FINAL)})
    return out, config, results


def _held_area(method: str, seed: int, budget: float, col: int) -> float:
    """The step-wise-held area of the synthetic curve over column ``col`` (1 seconds, 2 FLOPs) up
    to ``budget``, written out from its definition (the curve extended far past the budget)."""
    pts = _curve(method, seed, 100)
    area = 0.0
    for a, b in zip(pts, pts[1:]):
        lo, hi = a[col], min(b[col], budget)
        if lo < budget:
            area += (a[3] / 100) * (hi - lo)
    return area / budget


def test_comparison_aucc_uses_the_smallest_total_as_budget_and_seed_intervals(matrix):
    out, config, results = matrix
    t = compare_results(config, results, out)["time_to_quality"]
    # totals: baseline 20 s / 20e9 FLOPs, freeze 24 x 0.8 = 19.2 s / 21.6e9: the budget is the smallest of each
    assert t["common_budget"] == {"seconds": pytest.approx(19.2), "flops": pytest.approx(20e9)}
    for method in TAU:
        per_seed = [_held_area(method, s, 19.2, 1) for s in FINAL]
        m = t["methods"][method]
        assert [m["runs"][s]["aucc_seconds"] for s in FINAL] == pytest.approx(per_seed)
        assert m["aucc_seconds"]["ci95"] == pytest.approx(
            list(stats.t.interval(0.95, 2, loc=np.mean(per_seed), scale=stats.sem(per_seed))))
        assert [m["runs"][s]["aucc_flops"] for s in FINAL] == pytest.approx([_held_area(method, s, 20e9, 2) for s in FINAL])
    freeze = t["methods"]["oelm_freeze"]
    assert freeze["paired_aucc_seconds"]["mean"] == pytest.approx(
        np.mean([_held_area("oelm_freeze", s, 19.2, 1) - _held_area("baseline", s, 19.2, 1) for s in FINAL]))
    assert freeze["paired_aucc_seconds"]["mean"] < 0  # slower to converge, though each step is faster


def test_comparison_time_to_90_95_99_percent_of_baseline(matrix):
    out, config, results = matrix
    t = compare_results(config, results, out)["time_to_quality"]
    base_final = np.mean([r.final_validation for r in results["baseline"]])
    assert t["baseline_final"] == pytest.approx(base_final)
    for q in (0.9, 0.95, 0.99):
        level = t["targets"][f"{q:g}"]
        assert level == pytest.approx(q * base_final)
        for method in TAU:
            x = t["methods"][method]["to_quality"][f"{q:g}"]
            expected = []
            for s in FINAL:  # the first validation (every 2 steps) at or past the analytic crossing, if any
                if FINAL[s] <= level:
                    continue
                sec = -TAU[method] * math.log(1 - level / FINAL[s])
                step = 2 * math.ceil(sec / SECONDS_PER_STEP[method] / 2 - 1e-12)
                if step <= {"baseline": 20, "oelm_freeze": 24}[method]:
                    expected.append(step * SECONDS_PER_STEP[method])
            assert x["reached"] == len(expected) and x["n"] == 3
            assert x["seconds"]["values"] == pytest.approx(expected)


def test_report_has_the_aucc_table_and_the_convergence_plot(matrix, report_plots):
    out, config, results = matrix
    c = write_comparison(config, results, out)
    md = (out / "report.md").read_text()
    section = md.split("## Time to quality (AUCC)", 1)[1].split("\n## ", 1)[0]
    row = next(l for l in section.splitlines() if l.startswith("| oelm_freeze |"))
    assert f"{c['time_to_quality']['methods']['oelm_freeze']['aucc_seconds']['mean']:.4f}" in row
    assert "step-wise hold" in section and "](report_files/convergence.png)" in section
    png = (out / "report_files" / "convergence.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5_000


def test_runs_without_training_seconds_get_no_section(matrix, tmp_path):
    out, config, results = matrix
    import shutil

    copy = tmp_path / "old"
    shutil.copytree(out, copy)
    for path in copy.glob("runs/*/metrics.jsonl"):  # as oelm wrote them before it recorded training seconds
        lines = [json.loads(l) for l in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({k: v for k, v in r.items() if not k.startswith("train_")}) + "\n" for r in lines))
    assert "time_to_quality" not in compare_results(config, results, copy)
