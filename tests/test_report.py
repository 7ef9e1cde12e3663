"""oelm.report: statistics checked against independent computation, the collapse rule on
constructed cases, and the report files of a real tiny experiment."""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from _tiny_lm import tiny_lm_overrides
from oelm.cli import main
from oelm.records import RunRecord
from oelm.report import compare_results, load_results, original_layout, write_comparison
from oelm.report.stats import (
    CHANCE_MARGIN_POINTS,
    collapse_reasons,
    paired_difference,
    step_time_stats,
    summarize,
    time_to_target,
)

ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------------------------
# Statistics against scipy / numpy
# --------------------------------------------------------------------------------------------


def test_summarize_matches_scipy_t_interval():
    values = [81.2, 83.9, 82.4, 80.7]
    s = summarize(values)
    lo, hi = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
    assert s["n"] == 4 and s["mean"] == pytest.approx(np.mean(values))
    assert s["std"] == pytest.approx(np.std(values, ddof=1))
    assert s["ci95"] == pytest.approx([lo, hi])


def test_summarize_one_value_has_no_interval_and_drops_non_finite():
    assert summarize([5.0])["ci95"] is None and summarize([5.0])["std"] == 0.0
    s = summarize([1.0, float("nan"), None, float("inf"), 3.0])
    assert s["n"] == 2 and s["mean"] == 2.0
    assert summarize([])["mean"] is None and summarize([])["n"] == 0


def test_paired_difference_matches_ttest_rel():
    base = {0: 90.1, 1: 91.0, 2: 89.4, 3: 90.6}
    other = {0: 88.7, 1: 90.2, 2: 88.9, 3: 89.0, 9: 99.0}  # seed 9 has no pair: ignored
    d = paired_difference(base, other)
    a, b = [other[s] for s in range(4)], [base[s] for s in range(4)]
    ref = stats.ttest_rel(a, b)
    diffs = np.subtract(a, b)
    lo, hi = stats.t.interval(0.95, 3, loc=diffs.mean(), scale=stats.sem(diffs))
    assert d["test"] == "paired t-test" and d["n"] == 4 and d["seeds"] == [0, 1, 2, 3]
    assert d["mean"] == pytest.approx(diffs.mean())
    assert d["p_value"] == pytest.approx(ref.pvalue)
    assert d["ci95"] == pytest.approx([lo, hi])


def test_paired_difference_with_one_pair_is_not_a_number():
    d = paired_difference({0: 1.0, 1: 2.0}, {0: 1.5})
    assert d["n"] == 1 and d["mean"] == 0.5 and d["ci95"] is None and d["p_value"] is None


def test_step_time_stats_matches_numpy():
    rng = np.random.default_rng(0)
    ms = list(rng.gamma(20, 1.5, size=101))
    s = step_time_stats(ms)
    q1, q3 = np.percentile(ms, [25, 75])
    assert s["n"] == 101 and s["median"] == pytest.approx(np.median(ms))
    assert s["iqr"] == pytest.approx(q3 - q1) and s["q1"] == pytest.approx(q1)
    assert s["cv"] == pytest.approx(stats.variation(ms, ddof=1))


# --------------------------------------------------------------------------------------------
# Collapse rule and time-to-target on constructed runs
# --------------------------------------------------------------------------------------------


def _result(metric="accuracy", final=85.0, status="finished", loss=0.4, **extra):
    return RunRecord({"status": status, "performance": {"metric": metric, "best_validation": final,
                                                        "final_validation": final, "final_train_loss": loss}, **extra})


def test_collapse_rule_cases():
    assert collapse_reasons(_result(), num_labels=2) == []
    chance_edge = 50.0 + CHANCE_MARGIN_POINTS
    assert collapse_reasons(_result(final=chance_edge), num_labels=2)[0].startswith("at chance")
    assert collapse_reasons(_result(final=chance_edge + 0.01), num_labels=2) == []
    assert collapse_reasons(_result(final=34.0), num_labels=3)  # 3-way chance = 33.3%
    assert collapse_reasons(_result(final=34.0), num_labels=None) == []  # rule needs num_labels
    # A constant predictor on an imbalanced validation set (70% one label) beats 100/3 + 2 but is
    # still at chance: the majority-class share is the chance level when it is higher.
    assert collapse_reasons(_result(final=71.0), num_labels=3) == []
    reason = collapse_reasons(_result(final=71.0), num_labels=3, majority_percent=70.0)
    assert reason and reason[0].startswith("at chance") and "majority class" in reason[0]
    assert collapse_reasons(_result(final=72.01), num_labels=3, majority_percent=70.0) == []
    assert collapse_reasons(_result(final=71.0), majority_percent=70.0)  # enough without num_labels
    assert "50.00% (uniform)" in collapse_reasons(_result(final=51.0), num_labels=2)[0]
    assert "50.92% (majority class)" in collapse_reasons(_result(final=51.0), num_labels=2, majority_percent=50.917)[0]
    failed = _result(status="failed", failure={"kind": "nan", "message": "loss is nan", "step": 17})
    assert collapse_reasons(failed) == ["failed (kind nan, step 17)"]
    assert collapse_reasons(_result(loss=float("nan")), num_labels=2) == ["non-finite training loss"]
    recs = [{"type": "train", "step": 1, "loss": 0.7}, {"type": "train", "step": 2, "loss": float("inf")}]
    assert collapse_reasons(_result(), recs, num_labels=2) == ["non-finite training loss"]


def test_collapse_rule_perplexity_must_improve():
    evals = [{"type": "eval", "step": 0, "perplexity": 500.0}, {"type": "eval", "step": 10, "perplexity": 300.0}]
    assert collapse_reasons(_result("perplexity", final=300.0), evals) == []
    stuck = [{"type": "eval", "step": 0, "perplexity": 500.0}, {"type": "eval", "step": 10, "perplexity": 510.0}]
    assert collapse_reasons(_result("perplexity", final=510.0), stuck)[0].startswith("no learning")
    assert collapse_reasons(_result("perplexity", final=510.0), stuck[:1]) == []  # one evaluation: no judgement


def test_time_to_target_first_evaluation_reaching_it():
    recs = [
        {"type": "eval", "step": 10, "accuracy": 70.0, "elapsed_seconds": 3.0},
        {"type": "train", "step": 15, "loss": 0.3, "elapsed_seconds": 4.0},
        {"type": "eval", "step": 20, "accuracy": 84.0, "elapsed_seconds": 6.5},
        {"type": "eval", "step": 30, "accuracy": 86.0, "elapsed_seconds": 9.0},
    ]
    assert time_to_target(recs, "accuracy", 84.0, True) == {"step": 20, "seconds": 6.5, "value": 84.0}
    assert time_to_target(recs, "accuracy", 90.0, True) is None
    ppl = [{"type": "eval", "step": 5, "perplexity": 40.0, "elapsed_seconds": 1.0},
           {"type": "eval", "step": 9, "perplexity": 20.0, "elapsed_seconds": 2.0}]
    assert time_to_target(ppl, "perplexity", 25.0, False)["step"] == 9


# --------------------------------------------------------------------------------------------
# A real tiny experiment: comparison, exports and report files
# --------------------------------------------------------------------------------------------

TINY_LM = tiny_lm_overrides(max_steps=12, eval_every=4) + [
    "reference={baseline: 4.27, oelm_freeze: 4.69}", "reference_source='original README (gpt-medium-512)'",
]


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("report_lm")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OELM_REPORT_PLOTS", "1")  # the suite's default is off (conftest): these tests read the plots
        assert main(["run", str(ROOT / "configs/tinystories-tiny.yaml"), "--output-dir", str(out), *TINY_LM]) == 0
    return out


def test_oelm_report_plots_0_leaves_out_only_the_plots_and_a_bad_value_is_one_line(lm_run, tmp_path, monkeypatch, capsys):
    """$OELM_REPORT_PLOTS=0: the same comparison.json and every section with its tables, no plot
    written or linked, one line saying where they went; another value is one line naming the
    variable, from `oelm report` and from `oelm run` before any folder is made."""
    copy = tmp_path / "copy"
    shutil.copytree(lm_run, copy)
    shutil.rmtree(copy / "report_files")
    monkeypatch.setenv("OELM_REPORT_PLOTS", "0")
    assert main(["report", str(copy)]) == 0
    assert (copy / "comparison.json").read_bytes() == (lm_run / "comparison.json").read_bytes()
    assert not (copy / "report_files").exists()
    md, html = (copy / "report.md").read_text(), (copy / "report.html").read_text()
    assert "report_files/" not in md and "<img" not in html and "Plots are off (OELM_REPORT_PLOTS=0)" in md
    headings = lambda text: [l for l in text.splitlines() if l.startswith("## ")]  # noqa: E731
    drawn = headings((lm_run / "report.md").read_text())
    plot_only = {"## Learning curves", "## Best validation metric with 95% CI"}
    assert plot_only <= set(drawn)
    assert [h for h in drawn if h not in plot_only] == [h for h in headings(md) if h != "## Plots"]
    tables = lambda text: [l for l in text.splitlines() if l.startswith("|")]  # noqa: E731
    assert tables(md) == tables((lm_run / "report.md").read_text())  # every table, to the digit
    monkeypatch.setenv("OELM_REPORT_PLOTS", "no")
    capsys.readouterr()
    for argv in (["report", str(copy)], ["run", str(ROOT / "configs/tinystories-tiny.yaml"), "--output-dir",
                                         str(tmp_path / "bad"), *TINY_LM]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "OELM_REPORT_PLOTS='no'" in err[0] and "use 1" in err[0], err
    assert not (tmp_path / "bad").exists()


def test_run_writes_every_report_file(lm_run):
    for name in ("comparison.json", "original_layout.json", "report.md", "report.html",
                 "report_files/learning_curves.png", "report_files/final_metric.png", "report_files/step_times.png"):
        assert (lm_run / name).is_file(), name
    for png in (lm_run / "report_files").glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000


def test_comparison_statistics_match_the_runs(lm_run):
    c = json.loads((lm_run / "comparison.json").read_text())
    results = load_results(lm_run)
    best = {m: {r.seed: r.best_validation for r in runs} for m, runs in results.items()}
    f = c["methods"]["oelm_freeze"]["best_validation"]
    vals = [best["oelm_freeze"][s] for s in (0, 1)]
    assert f["mean"] == pytest.approx(np.mean(vals)) and f["std"] == pytest.approx(np.std(vals, ddof=1))
    assert f["ci95"] == pytest.approx(list(stats.t.interval(0.95, 1, loc=np.mean(vals), scale=stats.sem(vals))))
    paired = c["vs_baseline"]["oelm_freeze"]["paired_metric"]
    ref = stats.ttest_rel([best["oelm_freeze"][s] for s in (0, 1)], [best["baseline"][s] for s in (0, 1)])
    assert paired["n"] == 2 and paired["p_value"] == pytest.approx(ref.pvalue)
    # time to target: baseline's mean final perplexity, reached where the metrics log says so
    t = c["time_to_target"]
    target = np.mean([r.final_validation for r in results["baseline"]])
    assert t["target"] == pytest.approx(target)
    for seed in (0, 1):
        evals = [json.loads(l) for l in (lm_run / "runs" / f"oelm_freeze-seed{seed}" / "metrics.jsonl").read_text().splitlines()]
        evals = [e for e in evals if e["type"] == "eval"]
        first = next((e for e in evals if e["perplexity"] <= target), None)
        got = t["methods"]["oelm_freeze"]["runs"][str(seed)]
        assert (got is None) == (first is None)
        if first:
            assert got["step"] == first["step"] and got["seconds"] == pytest.approx(first["elapsed_seconds"])
    st = c["methods"]["baseline"]["step_times"]
    assert st["n"] > 0 and st["q1"] <= st["median"] <= st["q3"]


def test_mfu_per_method_is_the_mean_of_the_runs_and_has_its_section(lm_run):
    """Every run records timing.mfu (CPU: against the measured matmul probe; GPU: its datasheet peak); the comparison's
    mfu_percent is 100 x the mean of the runs' fractions and the report shows it."""
    c = json.loads((lm_run / "comparison.json").read_text())
    for method, runs in load_results(lm_run).items():
        fractions = [r.mfu["mfu"] for r in runs]
        assert all(0 < f < 1 for f in fractions), fractions
        sources = {r.mfu["peak_source"] for r in runs}
        if torch.cuda.is_available():  # the engine trained on the GPU: its datasheet peak (e.g. "datasheet:H100 SXM")
            assert len(sources) == 1 and next(iter(sources)).startswith("datasheet:")
        else:
            assert sources == {"measured-probe"}
            assert all(r.gpu_telemetry["available"] is False for r in runs)
        assert c["methods"][method]["mfu_percent"]["mean"] == pytest.approx(100 * np.mean(fractions))
        assert c["methods"][method]["mfu_peak_source"] == sorted(sources)
    md = (lm_run / "report.md").read_text()
    section = md.split("## Throughput and utilization", 1)[1].split("\n## ", 1)[0]
    row = next(l for l in section.splitlines() if l.startswith("| baseline |"))
    assert f"{c['methods']['baseline']['mfu_percent']['mean']:.1f}" in row
    # MFU is labelled with what it is a fraction of: on CPU the measured probe, never read as the hardware peak
    assert c["methods"]["baseline"]["mfu_reference"] and all(ref in row for ref in c["methods"]["baseline"]["mfu_reference"])
    if not torch.cuda.is_available():
        assert "matmul probe (not the hardware peak)" in row
    assert "| MFU of (reference peak) |" in section and "not the hardware's peak" in section


def test_mfu_reference_names_the_peak_in_words():
    from oelm.report.compare import mfu_reference

    assert mfu_reference("measured-probe", "fp32") == "the measured fp32 matmul probe (not the hardware peak)"
    assert mfu_reference("datasheet:H100 SXM", "bf16") == "the H100 SXM datasheet peak for bf16"
    assert mfu_reference(None) == "–"


def test_bar_chart_axis_starts_at_zero_and_the_zoomed_panel_says_where_it_starts(lm_run):
    from oelm.report.plots import final_metric_figure

    c = json.loads((lm_run / "comparison.json").read_text())
    full, zoom = final_metric_figure(c).axes
    assert full.get_ylim()[0] == 0.0 and len(full.patches) == len(c["methods"])  # one bar per method, from 0
    start = zoom.get_ylim()[0]
    assert start > 0 and f"axis starts at {start:.4g}, not 0" in zoom.get_title()
    assert not zoom.patches  # no bars on the cut axis: points and intervals only
    values = [v for m in c["methods"].values() for v in m["best_validation"]["values"]]
    assert zoom.get_ylim()[0] <= min(values) and max(values) <= zoom.get_ylim()[1]


def test_original_layout_definitions(lm_run):
    c = json.loads((lm_run / "comparison.json").read_text())
    o = json.loads((lm_run / "original_layout.json").read_text())
    assert set(o) == {"baseline", "oelm_freeze", "comparison"}
    b, f = c["methods"]["baseline"], c["methods"]["oelm_freeze"]
    ta = o["comparison"]["time_analysis"]
    bt, ft = b["total_seconds"]["mean"], f["total_seconds"]["mean"]
    assert o["comparison"]["accuracy_gap"] == pytest.approx(f["best_validation"]["mean"] - b["best_validation"]["mean"])
    assert ta["total_gap_seconds"] == pytest.approx(ft - bt)
    assert ta["total_gap_percent"] == pytest.approx(100 * (ft - bt) / bt)
    assert ta["speedup_ratio"] == pytest.approx(bt / ft)
    assert ta["per_step_gap"] == pytest.approx(f["step_ms_median"]["mean"] - b["step_ms_median"]["mean"])
    assert o["oelm_freeze"]["trainable_params"] < o["baseline"]["trainable_params"]


def test_report_md_has_every_section_and_published_numbers(lm_run):
    md = (lm_run / "report.md").read_text()
    for heading in ("## Comparison", "## Difference to baseline, paired by seed", "## Runs", "## Learning curves",
                    "## Best validation metric with 95% CI", "## Step time", "## Time to target (MLPerf-style)",
                    "## Parameters per group", "## Environment"):
        assert heading in md, heading
    assert "paired t-test" in md and "| published |" in md
    row = next(l for l in md.splitlines() if l.startswith("| oelm_freeze |"))
    assert "| 4.69 |" in row  # the published number beside ours
    for link in re.findall(r"\]\((report_files/[^)]+)\)", md):
        assert (lm_run / link).is_file()


def test_html_links_only_its_plot_files_beside_it(lm_run):
    """report.html needs nothing outside its folder: every src/href is a plot under report_files/
    that report.md links too and that is a PNG there; no URL, no CSS url(), no base64 copy."""
    page = (lm_run / "report.html").read_text()
    srcs = re.findall(r'(?:src|href)\s*=\s*"([^"]*)"', page)
    linked = re.findall(r"\]\((report_files/[^)]+\.png)\)", (lm_run / "report.md").read_text())
    assert srcs and sorted(srcs) == sorted(linked)
    assert all((lm_run / s).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for s in srcs)
    assert not re.search(r"https?://|url\(|data:image|;base64,", page)
    assert len(page) < 60_000  # the page is text and tables: its plots are not copied in
    # learning curves, best-metric bars, step times, the convergence plot (the runs record training seconds per
    # validation) and the attention entropy per layer (final runs record attention diagnostics)
    assert page.count("<img ") == 5 and '<table class="comparison">' in page and ">Attention diagnostics</h2>" in page


def test_collapsed_run_is_excluded_and_listed(lm_run, tmp_path):
    """A failed run (a real result marked failed with a NaN fault) is listed and not averaged in."""
    out = tmp_path / "copy"
    shutil.copytree(lm_run, out)
    path = out / "runs" / "oelm_freeze-seed1" / "result.json"
    r = json.loads(path.read_text())
    r["status"], r["failure"] = "failed", {"kind": "nan", "message": "loss became nan", "step": 7}
    path.write_text(json.dumps(r))
    assert main(["report", str(out)]) == 0
    c = json.loads((out / "comparison.json").read_text())
    f = c["methods"]["oelm_freeze"]
    assert f["included_seeds"] == [0] and f["excluded"] == [{"seed": 1, "reasons": ["failed (kind nan, step 7)"]}]
    seed0 = json.loads((out / "runs" / "oelm_freeze-seed0" / "result.json").read_text())["performance"]["best_validation"]
    assert f["best_validation"]["mean"] == pytest.approx(seed0) and f["best_validation"]["n"] == 1
    assert c["vs_baseline"]["oelm_freeze"]["paired_metric"]["p_value"] is None  # one pair left: n/a, not a number
    md = (out / "report.md").read_text()
    assert "oelm_freeze seed 1 excluded from the means: failed (kind nan, step 7)" in md
    assert "n/a" in next(l for l in md.splitlines() if l.startswith("| oelm_freeze | 1 |"))


def test_drift_and_device_warnings(lm_run):
    results = load_results(lm_run)
    results = copy.deepcopy(results)
    r = results["baseline"][0]
    r.raw["environment"]["matmul_probe_drift_percent"] = -25.0
    r.raw["environment"]["hostname"] = "other-node"
    from oelm.config import load_config

    config = load_config(ROOT / "configs/tinystories-tiny.yaml", TINY_LM)
    c = compare_results(config, results, lm_run)
    text = " ".join(c["warnings"])
    assert "different devices" in text and "other-node" in text
    assert "baseline-seed0: -25%" in text


def test_methods_measured_at_different_machine_speeds_are_warned(lm_run):
    """A method added to a finished matrix runs hours later: if the matmul probe says the machine
    was >10% faster for it, its step times are no evidence of a speed difference."""
    from oelm.config import load_config

    config = load_config(ROOT / "configs/tinystories-tiny.yaml", TINY_LM)
    results = copy.deepcopy(load_results(lm_run))
    for method, gflops in (("baseline", 30.0), ("oelm_freeze", 34.0)):
        for r in results[method]:
            r.raw["environment"]["matmul_probe"] = {"gflops": gflops}
            r.raw["environment"]["matmul_probe_drift_percent"] = 0.0
    text = " ".join(compare_results(config, results, lm_run)["warnings"])
    assert "between methods (median GFLOP/s: baseline 30.0, oelm_freeze 34.0)" in text
    for r in results["oelm_freeze"]:
        r.raw["environment"]["matmul_probe"] = {"gflops": 32.9}  # 9.7% faster: inside the 10% tolerance
    assert "between methods" not in " ".join(compare_results(config, results, lm_run)["warnings"])


def test_a_gpu_waiting_for_data_is_warned_with_the_workers_to_raise(lm_run):
    """A CUDA run whose device sat idle for batches > 5% of its training time gets a warning naming the
    share and the loader workers; the same figures on CPU do not (a worker would compete for the cores)."""
    from oelm.config import load_config

    config = load_config(ROOT / "configs/tinystories-tiny.yaml", TINY_LM)
    results = copy.deepcopy(load_results(lm_run))
    for r in results["oelm_freeze"]:
        assert r.loader_workers == 0  # "auto" on CPU: no worker processes
        r.raw["timing"]["data_stall_seconds"] = 0.1 * r.train_seconds  # idle 1 / 11 of the span: 9.1%
    c = compare_results(config, results, lm_run)
    assert c["methods"]["oelm_freeze"]["data_stall_percent"]["mean"] == pytest.approx(100 / 11)
    assert c["methods"]["oelm_freeze"]["num_workers"] == [0]
    assert not [w for w in c["warnings"] if "waited for data" in w]  # CPU
    for r in results["oelm_freeze"]:
        r.raw["timing"]["device"] = "cuda:0"
    warned = [w for w in compare_results(config, results, lm_run)["warnings"] if "waited for data" in w]
    assert warned == ["oelm_freeze: the GPU waited for data 9% of its training time (timing.data_stall_seconds, mean over "
                      "seeds) with 0 DataLoader worker(s): step times and tokens/s are partly data loading; raise "
                      "training.num_workers so batches are ready before each step."]
    for r in results["oelm_freeze"]:
        r.raw["timing"]["data_stall_seconds"] = 0.04 * r.train_seconds  # 3.8%: under the 5% bar
    assert not [w for w in compare_results(config, results, lm_run)["warnings"] if "waited for data" in w]


def test_sweep_table_when_present(lm_run, tmp_path):
    out = tmp_path / "sweep"
    shutil.copytree(lm_run, out)
    sweep = {"selection_metric": "validation perplexity", "methods": {"baseline": [
        {"learning_rate": 1e-3, "seed": 0, "best_validation": 300.0, "selected": False, "status": "finished"},
        {"learning_rate": 3e-3, "seed": 0, "best_validation": 250.0, "selected": True, "status": "finished"}]}}
    (out / "sweep.json").write_text(json.dumps(sweep))
    from oelm.config import load_config

    config = load_config(ROOT / "configs/tinystories-tiny.yaml", TINY_LM)
    write_comparison(config, load_results(out), out)
    md = (out / "report.md").read_text()
    assert "## Learning-rate sweep (validation only)" in md and "| baseline | 0.003 | 0 | 250.00 | finished | ✔ |" in md


def _old_sweep(out: Path, grid: list[float], selected: float, **extra) -> None:
    """A ``sweep.json`` for baseline as written before ``selected_at_grid_edge`` existed."""
    sweep = {"selection_metric": "best_validation", "sweep_seeds": [0], "selected_learning_rates": {"baseline": selected},
             "methods": {"baseline": [{"learning_rate": lr, "seed": 0, "best_validation": 200.0 if lr == selected else 300.0,
                                       "selected": lr == selected, "status": "finished"} for lr in grid]}, **extra}
    (out / "sweep.json").write_text(json.dumps(sweep))


def test_grid_edge_needs_two_rates_and_a_selection():
    from oelm.records import grid_edge

    assert grid_edge([4e-4, 1e-4, 2e-4], 1e-4) == "low" and grid_edge([4e-4, 1e-4, 2e-4], 4e-4) == "high"
    assert grid_edge([1e-4, 2e-4, 4e-4], 2e-4) is None
    assert grid_edge([1e-4, 2e-4], 2e-4) == "high"  # with two rates every selection is on an edge
    assert grid_edge([1e-4], 1e-4) is None and grid_edge([1e-4, 1e-4], 1e-4) is None  # one rate: no sweep
    assert grid_edge([1e-4, 2e-4], None) is None  # nothing selected (every sweep run failed)


@pytest.mark.parametrize("selected, edge, word", [(1e-3, "low", "lowest"), (3e-3, "high", "highest")])
def test_selected_rate_on_the_edge_of_its_grid_is_flagged_and_noted(lm_run, tmp_path, selected, edge, word):
    """An old sweep.json (no selected_at_grid_edge key): the report computes the flag from the
    sweep's entries and writes it to comparison.json, report.md and report.html."""
    out = tmp_path / "edge"
    shutil.copytree(lm_run, out)
    _old_sweep(out, [1e-3, 2e-3, 3e-3], selected)
    from oelm.config import load_config

    write_comparison(load_config(ROOT / "configs/tinystories-tiny.yaml", TINY_LM), load_results(out), out)
    c = json.loads((out / "comparison.json").read_text())
    assert c["methods"]["baseline"]["selected_at_grid_edge"] == edge
    assert c["methods"]["baseline"]["learning_rate_grid"] == [1e-3, 2e-3, 3e-3]
    assert c["methods"]["oelm_freeze"]["selected_at_grid_edge"] is None  # not swept
    assert "selected_at_grid_edge" not in c["sweep"]  # sweep.json itself is copied as it is
    note = f"baseline: selected learning rate {selected:g} is the {word} of its grid [0.001, 0.002, 0.003]; a wider grid could change the result."
    assert [w for w in c["warnings"] if "wider grid" in w] == [note]
    md = (out / "report.md").read_text()
    assert f"- {note}" in md.split("## Warnings", 1)[1].split("\n## ", 1)[0]
    assert f"<li>{note}</li>" in (out / "report.html").read_text()


def test_interior_selection_has_no_grid_edge_note_whatever_the_file_says(lm_run, tmp_path):
    out = tmp_path / "interior"
    shutil.copytree(lm_run, out)
    _old_sweep(out, [1e-3, 3e-3, 1e-2], 3e-3, selected_at_grid_edge={"baseline": "high"})  # a stale key is not trusted
    from oelm.config import load_config
    from oelm.report import render_report

    c = compare_results(load_config(ROOT / "configs/tinystories-tiny.yaml", TINY_LM), load_results(out), out)
    assert c["methods"]["baseline"]["selected_at_grid_edge"] is None
    assert c["methods"]["baseline"]["learning_rate_grid"] == [1e-3, 3e-3, 1e-2]
    assert not any("wider grid" in w for w in c["warnings"])
    assert "wider grid" not in render_report(c)


def test_report_of_a_directory_without_runs_is_a_clear_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "no config.yaml" in capsys.readouterr().err


def test_layers_point_one_way_report_and_monitor_never_import_the_experiment():
    """The run record (oelm.records) is the ground floor: the readers (report, monitor) and the run
    record itself load without oelm.experiment, so there is no experiment <-> report cycle."""
    import subprocess
    import sys

    code = (
        "import sys, oelm.records, oelm.metrics; a = 'oelm.experiment' in sys.modules; "
        "import oelm.report, oelm.cli.monitor; b = 'oelm.experiment' in sys.modules; print(a, b)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
    from oelm.report.caveats import DRIFT_WARNING_PERCENT

    assert math.isclose(DRIFT_WARNING_PERCENT, 10.0)


@pytest.fixture(scope="module")
def cls_run(tmp_path_factory, data_dir):
    """The tiny SST-2 classifier (gpt-tiny, 4 steps): baseline and OELM-Freeze, seeds 0 and 1."""
    from _tiny_matrix import CONFIG, write_config

    tmp = tmp_path_factory.mktemp("report_cls")
    text = CONFIG.replace("test_split: test, ", "").replace("seeds: [0]", "seeds: [0, 1]")
    text = re.sub(r"methods: \[.*?\]\n(?=seeds)", "methods: [{name: baseline, learning_rate: 3.0e-3}, "
                  "{name: oelm_freeze, learning_rate: 2.0e-3}]\n", text, flags=re.S)
    cfg = write_config(tmp, text)
    assert main(["run", str(cfg), "--output-dir", str(tmp / "out")]) == 0
    return tmp / "out"


def test_an_at_chance_baseline_is_shown_marked_and_kept_in_the_learning_curves(cls_run, tmp_path):
    """Every baseline run ends at chance (its final validation accuracy set to the validation
    majority share, as a run that learned nothing ends), OELM-Freeze's do not. The table shows the
    baseline's mean marked "(at chance)", not a blank; it enters no Δ; its runs' real curves are
    drawn (dashed) in the learning curves."""
    from oelm.report import comparison_rows
    from oelm.report.plots import learning_curves
    from oelm.report.render import curves_from_runs

    out = tmp_path / "copy"
    shutil.copytree(cls_run, out)
    chance_values = {}
    for seed, path in enumerate(sorted(out.glob("runs/*-seed*/result.json"))):
        r = json.loads(path.read_text())
        majority = max(50.0, r["data"]["validation"]["majority_class_percent"])
        value = majority - 1.0 if r["method"] == "baseline" else 90.0 + seed
        r["performance"]["best_validation"] = r["performance"]["final_validation"] = value
        if r["method"] == "baseline":
            chance_values[r["seed"]] = value
        path.write_text(json.dumps(r))
    assert main(["report", str(out)]) == 0
    c = json.loads((out / "comparison.json").read_text())
    base = c["methods"]["baseline"]
    assert base["included_seeds"] == [] and base["at_chance_seeds"] == [0, 1]
    assert base["best_validation"]["mean"] is None  # in no mean ...
    assert base["at_chance_best_validation"]["mean"] == pytest.approx(np.mean(list(chance_values.values())))
    assert c["vs_baseline"]["oelm_freeze"]["metric_gap"] is None  # ... and no gap
    header, rows = comparison_rows(c)
    cell = dict((r[0], r[1]) for r in rows)
    assert cell["baseline"].endswith("(at chance)") and cell["baseline"].startswith(f"{base['at_chance_best_validation']['mean']:.2f}")
    assert not cell["oelm_freeze"].endswith("(at chance)") and "at chance" in (out / "report.md").read_text()
    curves = curves_from_runs(out, c)
    assert curves["baseline"]["eval"] == [] and len(curves["baseline"]["at_chance"]["eval"]) == 2
    metrics = (out / "runs" / "baseline-seed0" / "metrics.jsonl").read_text().splitlines()
    evals = {json.loads(x)["step"]: json.loads(x)["accuracy"] for x in metrics if json.loads(x)["type"] == "eval"}
    assert {s: v for s, (v, _) in curves["baseline"]["at_chance"]["eval"][0].items()} == evals  # the run's real curve
    without = {m: {k: v for k, v in parts.items() if k != "at_chance"} for m, parts in curves.items()}
    assert learning_curves(curves, "accuracy") != learning_curves(without, "accuracy")  # drawn, not dropped


def test_matrix_compute_sums_every_run_by_its_threads_processes_and_device():
    """Run-hours, CPU core-hours and GPU-hours from hand-made records: threads and processes
    multiply a CPU run's seconds, processes a GPU run's; a run without a recorded time adds nothing
    but is counted; the report's sentence says so."""
    from oelm.records import RunRecord
    from oelm.report.compute import compute_line, matrix_compute

    records = [
        RunRecord({"timing": {"total_seconds": 1800.0, "device": "cpu"}, "environment": {"torch_num_threads": 2}}),
        RunRecord({"timing": {"total_seconds": 900.0, "device": "cpu", "num_processes": 2},
                   "environment": {"torch_num_threads": 1}}),
        RunRecord({"timing": {"total_seconds": 3600.0, "device": "cuda:0", "num_processes": 4},
                   "environment": {"torch_num_threads": 8}}),
        RunRecord({"status": "failed", "timing": {}}),
    ]
    c = matrix_compute(records)
    assert (c["runs"], c["timed_runs"]) == (4, 3)
    assert c["run_seconds"] == 1800 + 900 + 3600
    assert c["cpu_core_seconds"] == 1800 * 2 + 900 * 1 * 2
    assert c["gpu_seconds"] == 3600 * 4
    assert compute_line(c) == ("4 runs in all (the sweep's too, where there is one): 1.75 run-hours, 1.50 CPU "
                               "core-hours, 4.00 GPU-hours (1 run(s) without a recorded time add nothing)")
