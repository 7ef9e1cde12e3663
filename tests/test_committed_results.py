"""The results committed under docs/results/ are what oelm's report code computes from the
committed runs: rebuilding a comparison from its runs/*/result.json and metrics.jsonl gives the
committed comparison.json numbers (so a report cannot silently drift from the code or be edited)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from oelm.cli import main

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
COMPARISONS = sorted(p.parent.name for p in RESULTS.glob("*/comparison.json"))


def test_both_issue4_comparisons_are_committed_with_three_seeds():
    assert {"cpu-sst2", "cpu-tinystories"} <= set(COMPARISONS)
    for name in ("cpu-sst2", "cpu-tinystories"):
        comparison = json.loads((RESULTS / name / "comparison.json").read_text())
        assert set(comparison["methods"]) == {"baseline", "oelm_freeze", "oelm_random"}
        for m in comparison["methods"].values():
            assert sorted(m["included_seeds"]) == [0, 1, 2]
        html = (RESULTS / name / "report.html").read_text()
        assert "<img" in html and "http://" not in html and "https://" not in html


@pytest.mark.parametrize("name", sorted(p.parent.relative_to(RESULTS).as_posix() for p in RESULTS.glob("**/report.html")))
def test_a_committed_report_html_shows_the_plots_committed_beside_it_and_copies_none_in(name):
    """Each committed report.html links the plots its report.md links, in the same order, each a
    file beside it under report_files/, and holds no base64 copy of them: the tree travels with
    every GPU command (docs/scaling.md), and copies made the reports 6.8 MiB of it."""
    folder = RESULTS / name
    html = (folder / "report.html").read_text()
    srcs = re.findall(r'<img [^>]*src="([^"]+)"', html)
    assert srcs and srcs == re.findall(r"\]\((report_files/[^)]+\.png)\)", (folder / "report.md").read_text())
    assert all((folder / s).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for s in srcs) and ";base64," not in html


@pytest.mark.parametrize("name", COMPARISONS)
def test_committed_comparison_is_rebuilt_from_its_runs(tmp_path, name):
    copy = tmp_path / name
    shutil.copytree(RESULTS / name, copy)
    (copy / "comparison.json").unlink()
    assert main(["report", str(copy)]) == 0
    committed = json.loads((RESULTS / name / "comparison.json").read_text())
    rebuilt = json.loads((copy / "comparison.json").read_text())
    for key in ("methods", "vs_baseline", "time_to_target", "collapsed", "sweep", "warnings"):
        assert rebuilt[key] == committed[key], key


@pytest.mark.parametrize("name", [n for n in COMPARISONS if json.loads((RESULTS / n / "comparison.json").read_text())
                                  ["methods"]["baseline"]["test"]["n"]])
def test_committed_test_gap_is_paired_over_the_final_runs_test_results(name):
    """The paired test-set gap (what a claim is judged on) is scipy's paired t-test over the final
    runs' once-evaluated test numbers, and the report's test table prints it."""
    from scipy import stats

    c = json.loads((RESULTS / name / "comparison.json").read_text())
    test = {}
    for path in (RESULTS / name / "runs").glob("*/result.json"):
        r = json.loads(path.read_text())
        if r.get("status") == "finished" and r["performance"].get("test") is not None:
            test.setdefault(r["method"], {})[r["seed"]] = r["performance"]["test"]
    report = (RESULTS / name / "report.md").read_text()
    for method, gap in c["vs_baseline"].items():
        # the pairs are the seeds sound in both (collapsed runs excluded): 3 in the evidence matrices,
        # 5 in the research ones, fewer where a run collapsed
        sound = set(c["methods"]["baseline"]["included_seeds"]) & set(c["methods"][method]["included_seeds"])
        seeds = sorted(sound & set(test["baseline"]) & set(test[method]))
        assert seeds == sorted(sound)  # every sound final run was tested once
        diffs = [test[method][s] - test["baseline"][s] for s in seeds]
        paired = gap["paired_test"]
        assert paired["n"] == len(seeds) and paired["seeds"] == seeds
        if len(seeds) < 2:  # no interval, no p-value
            assert paired["p_value"] is None and paired["ci95"] is None
            continue
        assert paired["mean"] == pytest.approx(sum(diffs) / len(seeds))
        assert paired["p_value"] == pytest.approx(stats.ttest_rel([test[method][s] for s in seeds],
                                                                  [test["baseline"][s] for s in seeds]).pvalue)
        lo, hi = paired["ci95"]
        assert f"| {method} | " in report and f"| {paired['mean']:+.2f} | [{lo:.2f}, {hi:.2f}] |" in report


@pytest.mark.parametrize("name", COMPARISONS)
def test_committed_gaps_are_the_arithmetic_of_the_method_means(name):
    """On real runs: each gap to baseline is computed from the method means over the seeds both
    have a sound run of, as its docstring says (compare_results); a run excluded as collapsed is
    out of its method's seeds, and a method with no sound seed has no gap."""
    c = json.loads((RESULTS / name / "comparison.json").read_text())
    for entry in c["collapsed"]:
        assert entry["reasons"] and entry["seed"] not in c["methods"][entry["method"]]["included_seeds"]
    b = c["methods"]["baseline"]
    assert b["included_seeds"]
    for method, gap in c["vs_baseline"].items():
        m = c["methods"][method]
        if not m["included_seeds"]:
            assert gap["metric_gap"] is None and gap["speedup"] is None
            continue
        if m["included_seeds"] != b["included_seeds"]:  # fewer seeds: the gaps are over the common ones
            common = set(m["included_seeds"]) & set(b["included_seeds"])

            def mean(x, key):
                return sum(r[key] for r in x["runs"] if r["seed"] in common) / len(common)

            assert gap["paired_metric"]["n"] == len(common)
            assert gap["metric_gap"] == pytest.approx(mean(m, "best_validation") - mean(b, "best_validation"))
            assert gap["speedup"] == pytest.approx(mean(b, "total_seconds") / mean(m, "total_seconds"))
            continue
        assert gap["metric_gap"] == pytest.approx(m["best_validation"]["mean"] - b["best_validation"]["mean"])
        assert gap["speedup"] == pytest.approx(b["total_seconds"]["mean"] / m["total_seconds"]["mean"])
        assert gap["total_time_gap_percent"] == pytest.approx(100 * (m["total_seconds"]["mean"] / b["total_seconds"]["mean"] - 1))
        assert gap["per_step_gap_percent"] == pytest.approx(100 * (m["step_ms_median"]["mean"] / b["step_ms_median"]["mean"] - 1))
        trainable_b, trainable_m = b["parameters"]["trainable"], m["parameters"]["trainable"]
        assert gap["parameters_saved_percent"] == pytest.approx(100 * (trainable_b - trainable_m) / trainable_b)


def test_runs_still_improving_at_their_last_step_are_listed_and_warned(tmp_path):
    """On the committed SST-2 demo (evaluations at steps 32 and 64 of 64, the last one at the last
    step, no repeat): best_at_last_step lists, per method, exactly the final runs whose best
    validation is at their last step (the report warns about each method); a run that stopped
    early is not listed (it stopped because it no longer improved)."""
    copy = tmp_path / "cpu-sst2"
    shutil.copytree(RESULTS / "cpu-sst2", copy)
    finals = [json.loads(p.read_text()) for p in sorted(copy.glob("runs/*/result.json"))]
    finals = [r for r in finals if r.get("stage", "final") == "final"]
    expected: dict[str, list[int]] = {}
    for r in sorted(finals, key=lambda r: (r["method"], r["seed"])):
        if r["performance"]["best_step"] == r["performance"]["steps"]:
            expected.setdefault(r["method"], []).append(r["seed"])
    assert expected and any(r["performance"]["best_step"] < r["performance"]["steps"] for r in finals)  # both kinds here
    c = json.loads((copy / "comparison.json").read_text())
    assert {m: sorted(s) for m, s in c["best_at_last_step"].items()} == expected
    for method, seeds in expected.items():
        assert any(w.startswith(f"{method}: best validation at the last evaluation of the budget in seed(s) "
                                f"{', '.join(map(str, sorted(seeds)))}:") for w in c["warnings"])
    method, seed = next(iter(expected.items()))[0], expected[next(iter(expected))][0]
    path = next(p for p in copy.glob("runs/*/result.json")
                if (r := json.loads(p.read_text()))["method"] == method and r["seed"] == seed and r.get("stage") == "final")
    r = json.loads(path.read_text())
    r["performance"]["early_stopped"] = True
    path.write_text(json.dumps(r))
    assert main(["report", str(copy)]) == 0
    rebuilt = json.loads((copy / "comparison.json").read_text())
    assert seed not in rebuilt["best_at_last_step"].get(method, [])


def test_total_time_over_different_step_counts_is_warned(tmp_path):
    """On the committed SST-2 demo (every run trained its whole budget): no warning about total
    seconds; once one method's runs stop early at fewer steps, ``steps`` gives each method's mean
    and the report warns that total seconds cover different amounts of training."""
    copy = tmp_path / "cpu-sst2"
    shutil.copytree(RESULTS / "cpu-sst2", copy)
    c = json.loads((copy / "comparison.json").read_text())
    planned = {m: c["methods"][m]["steps"]["mean"] for m in c["methods"]}
    assert len(set(planned.values())) == 1
    assert not any(w.startswith("total seconds") for w in c["warnings"])
    for path in copy.glob("runs/*/result.json"):
        r = json.loads(path.read_text())
        if r["method"] == "oelm_freeze" and r.get("stage") == "final":
            r["performance"].update(steps=r["performance"]["steps"] - 16, early_stopped=True)
            path.write_text(json.dumps(r))
    assert main(["report", str(copy)]) == 0
    rebuilt = json.loads((copy / "comparison.json").read_text())
    base = planned["baseline"]
    assert rebuilt["methods"]["oelm_freeze"]["steps"]["mean"] == base - 16
    assert rebuilt["methods"]["baseline"]["steps"]["mean"] == base
    warning = next(w for w in rebuilt["warnings"] if w.startswith("total seconds"))
    assert f"oelm_freeze {base - 16:,.0f}" in warning and f"baseline {base:,.0f}" in warning


_COMPUTE = re.compile(r"\*\*Measured compute\*\*: (\d+) runs, ([\d.]+) wall-clock hours, ([\d.]+) core-hours")


@pytest.mark.parametrize("name", [p.parent.name for p in sorted(RESULTS.glob("*/README.md"))
                                  if _COMPUTE.search(p.read_text())])
def test_a_results_readme_states_the_compute_its_runs_measured(name):
    """A results folder's README states its matrix's measured compute by hand; it is what
    oelm.report.compute sums from the committed runs (every run, the sweep's too), to 2 decimals."""
    from oelm.records import MatrixFolder
    from oelm.report.compute import matrix_compute

    runs, hours, core_hours = _COMPUTE.search((RESULTS / name / "README.md").read_text()).groups()
    compute = matrix_compute(MatrixFolder(RESULTS / name).results().values())
    assert compute["runs"] == compute["timed_runs"] == int(runs)
    assert f"{compute['run_seconds'] / 3600:.2f}" == hours
    assert f"{compute['cpu_core_seconds'] / 3600:.2f}" == core_hours


def test_the_in_progress_table_counts_the_runs_each_carried_folder_holds():
    """docs/results/in-progress/README.md's "Carried now" table says how many runs of each carried
    matrix have a result; that is the number of runs/*/result.json in its folder, and every carried
    folder has a row."""
    progress = RESULTS / "in-progress"
    rows = dict(re.findall(r"^\| `([\w-]+)` \|.*?\| (\d+) of \d+ \|", (progress / "README.md").read_text(), re.M))
    carried = {p.name for p in progress.iterdir() if p.is_dir()}
    assert set(rows) == carried
    for name, count in rows.items():
        assert len(list((progress / name).glob("runs/*/result.json"))) == int(count), name
