"""A config's ``targets:`` block (oelm.config.quality_targets) and its check against the comparison
(oelm.report.target_verdicts): the schema refuses what cannot be checked, with one line naming the key;
each bound is pass / fail / undecided by its 95% interval, the seeds × examples interval where
both methods saved predictions (the same stand-in matrix on the real SST-2 labels as
tests/test_uncertainty.py), else the seed-only interval recomputed here with scipy; the report
shows both."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from test_uncertainty import RATE, SEEDS, _sst2_labels, _write_run

from oelm.config import config_from_dict
from oelm.config.quality_targets import QualityTarget
from oelm.errors import ConfigError
from oelm.report import compare_results, write_comparison
from oelm.report.target_verdicts import bound_result, targets_comparison

TINY = {"gpt": "gpt-tiny"}


def _config(targets, dataset="sst2", methods=("baseline", "oelm_freeze", "oelm_random")):
    task = {"dataset": dataset, "test_split": "test"} if dataset == "sst2" else {"dataset": dataset}
    return config_from_dict({"name": "targets", "task": task, "model": TINY, "methods": [{"name": m} for m in methods],
                             "seeds": list(SEEDS), "targets": targets})


def test_a_targets_block_validates_and_keeps_its_bounds():
    c = _config({"oelm_freeze": {"accuracy_gap_min": -2.0, "accuracy_gap_max": 1.0}})
    assert c.targets["oelm_freeze"].bounds() == {"accuracy_gap_min": -2.0, "accuracy_gap_max": 1.0}
    lm = _config({"oelm_freeze": {"perplexity_ratio_max": 1.05}}, dataset="tinystories")
    assert lm.targets["oelm_freeze"].perplexity_ratio_max == 1.05


@pytest.mark.parametrize(("targets", "dataset", "needle"), [
    ({"oelm_freeze": {"perplexity_ratio_mx": 1.05}}, "tinystories", "perplexity_ratio_mx"),  # a typo: named
    ({"baseline": {"accuracy_gap_min": -1.0}}, "sst2", "targets.baseline"),
    ({"oelm_global": {"accuracy_gap_min": -1.0}}, "sst2", "targets.oelm_global: not a method of this config"),
    ({"oelm_freeze": {"perplexity_ratio_max": 1.05}}, "sst2", "this task is scored by accuracy"),
    ({"oelm_freeze": {"accuracy_gap_min": -1.0}}, "tinystories", "this task is scored by perplexity"),
    ({"oelm_freeze": {}}, "sst2", "at least one bound"),
    ({"oelm_freeze": {"accuracy_gap_min": 1.0, "accuracy_gap_max": -1.0}}, "sst2", "no gap can meet both"),
    ({"oelm_freeze": {"perplexity_ratio_max": True}}, "tinystories", "not the boolean true"),
    ({"oelm_freeze": {"perplexity_ratio_max": 0}}, "tinystories", "greater than 0"),
])
def test_bad_targets_are_one_line_naming_the_key(targets, dataset, needle):
    with pytest.raises(ConfigError) as err:
        _config(targets, dataset=dataset)
    message = str(err.value)
    assert needle in message and "targets" in message, message


@pytest.mark.parametrize(("kind", "bound", "ci", "expected"), [
    ("min", -1.0, [-0.5, 0.5], "pass"), ("min", -1.0, [-3.0, -2.0], "fail"), ("min", -1.0, [-1.5, 0.2], "undecided"),
    ("max", 1.05, [1.01, 1.04], "pass"), ("max", 1.05, [1.06, 1.2], "fail"), ("max", 1.05, [1.03, 1.07], "undecided"),
    ("max", 1.05, None, "undecided"),
])
def test_a_bound_is_judged_by_its_whole_interval(kind, bound, ci, expected):
    estimate = 0.0 if kind == "min" else 1.04
    result, point = bound_result(kind, bound, estimate, ci)
    assert result == expected and point == "pass"


@pytest.fixture(scope="module")
def matrix(tmp_path_factory, data_dir):
    """baseline and oelm_freeze with saved predictions of the real SST-2 validation labels (3 seeds);
    oelm_random without predictions."""
    out = tmp_path_factory.mktemp("targets")
    labels = _sst2_labels(Path(data_dir))
    results = {m: [_write_run(out, m, s, labels) for s in SEEDS] for m in RATE}
    results["oelm_random"] = [_write_run(out, "oelm_random", s, None, test_accuracy=80.0 + s) for s in SEEDS]
    return out, results


def test_pass_and_fail_on_the_hierarchical_interval_where_predictions_exist(matrix):
    out, results = matrix
    plain = compare_results(_config({}), results, out)
    assert "targets" not in plain  # no block: the comparison is as before
    lo, hi = plain["uncertainty"]["methods"]["oelm_freeze"]["ci95"]
    targets = {"oelm_freeze": {"accuracy_gap_min": lo - 1.0}}
    passed = compare_results(_config(targets), results, out)["targets"]["methods"]["oelm_freeze"]
    assert passed["result"] == "pass" and passed["interval"].startswith("seeds × examples")
    assert passed["ci95"] == pytest.approx([lo, hi]) and passed["split"] == "test" and passed["n"] == 3
    failed = compare_results(_config({"oelm_freeze": {"accuracy_gap_min": hi + 0.5}}), results, out)
    assert failed["targets"]["methods"]["oelm_freeze"]["result"] == "fail"
    straddled = compare_results(_config({"oelm_freeze": {"accuracy_gap_min": (lo + hi) / 2}}), results, out)
    check = straddled["targets"]["methods"]["oelm_freeze"]["checks"][0]
    assert check["result"] == "undecided" and straddled["targets"]["methods"]["oelm_freeze"]["result"] == "undecided"


def test_a_method_without_predictions_is_judged_on_the_seed_only_interval_and_the_report_says_which(matrix):
    out, results = matrix
    base = [r.test for r in results["baseline"]]
    gaps = [80.0 + s - base[s] for s in SEEDS]
    ci = stats.t.interval(0.95, 2, loc=np.mean(gaps), scale=stats.sem(gaps))
    targets = {"oelm_random": {"accuracy_gap_min": ci[0] - 0.1}, "oelm_freeze": {"accuracy_gap_max": -50.0}}
    c = write_comparison(_config(targets), results, out)
    rnd = c["targets"]["methods"]["oelm_random"]
    assert rnd["interval"] == "seed-only interval (t)" and rnd["split"] == "test" and rnd["result"] == "pass"
    assert rnd["gap"] == pytest.approx(np.mean(gaps)) and rnd["ci95"] == pytest.approx(list(ci))
    assert c["targets"]["methods"]["oelm_freeze"]["result"] == "fail"
    section = (out / "report.md").read_text().split("## Targets", 1)[1].split("\n## ", 1)[0]
    rows = {line.split(" | ")[0].lstrip("| "): line for line in section.splitlines() if line.startswith("| oelm_")}
    assert "seed-only interval (t)" in rows["oelm_random"] and "**pass** (pass)" in rows["oelm_random"]
    assert "seeds × examples" in rows["oelm_freeze"] and "**fail** (fail)" in rows["oelm_freeze"]
    assert "Targets" in (out / "report.html").read_text()


def test_a_perplexity_ratio_target_uses_the_per_seed_ratio():
    """An LM comparison without predictions: the ratio per seed is method / baseline test
    perplexity, its interval Student's t over the seeds (validation when a run has no test value)."""
    def runs(values, test=True):
        return [{"seed": s, "best_validation": v + 1, "test": v if test else None} for s, v in enumerate(values)]

    base, freeze = [40.0, 41.0, 39.0], [42.5, 42.0, 41.5]
    comparison = {"metric": "perplexity", "methods": {
        "baseline": {"included_seeds": [0, 1, 2], "runs": runs(base)},
        "oelm_freeze": {"included_seeds": [0, 1, 2], "runs": runs(freeze)},
        "oelm_random": {"included_seeds": [0, 1], "runs": runs([50.0, 51.0, 52.0], test=False)}}}
    out = targets_comparison({"oelm_freeze": QualityTarget(perplexity_ratio_max=1.05),
                              "oelm_random": QualityTarget(perplexity_ratio_max=1.5)}, comparison)["targets"]["methods"]
    ratios = [f / b for f, b in zip(freeze, base)]
    ci = stats.t.interval(0.95, 2, loc=np.mean(ratios), scale=stats.sem(ratios))
    assert out["oelm_freeze"]["gap"] == pytest.approx(np.mean(ratios)) and out["oelm_freeze"]["ci95"] == pytest.approx(list(ci))
    assert out["oelm_freeze"]["result"] == ("pass" if ci[1] <= 1.05 else "undecided" if ci[0] <= 1.05 else "fail")
    assert out["oelm_random"]["split"] == "validation" and out["oelm_random"]["seeds"] == [0, 1]
    assert out["oelm_random"]["gap"] == pytest.approx(np.mean([51 / 41, 52 / 42]))
