"""The comparison's caveats: "still improving at its last evaluation" (the rule on constructed runs
and on the committed SST-2 evidence, whose end-of-training evaluation repeats the last scheduled
one a step later) and :func:`oelm.report.comparison_warnings`, the warnings `oelm report` prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oelm.records import RunRecord
from oelm.report import comparison_warnings
from oelm.report.stats import best_at_last_evaluation

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
SCHEDULED = [526, 1052, 1578, 2104]  # SST-2, 2,105 steps, 4 evaluations an epoch


def _run(best_step: int, best: float, final: float, steps: int = 2105, early: bool = False) -> RunRecord:
    return RunRecord({"performance": {"best_step": best_step, "best_validation": best, "final_validation": final,
                                      "steps": steps, "early_stopped": early}})


def _evals(values: dict[int, float]) -> list[dict]:
    return [{"type": "eval", "step": s, "accuracy": v} for s, v in values.items()]


def test_best_at_the_last_scheduled_evaluation_tied_one_step_later_is_flagged():
    values = dict(zip(SCHEDULED, [85.0, 86.0, 87.0, 88.0])) | {2105: 88.0}
    assert best_at_last_evaluation(_run(2104, 88.0, 88.0), _evals(values))
    assert best_at_last_evaluation(_run(2104, 88.0, 88.0))  # from result.json alone: the last evaluation ties the best


def test_best_at_the_last_scheduled_evaluation_is_flagged_whatever_the_repeat_says():
    values = dict(zip(SCHEDULED, [85.0, 86.0, 87.0, 88.0])) | {2105: 87.9}
    assert best_at_last_evaluation(_run(2104, 88.0, 87.9), _evals(values))


def test_without_the_repeated_end_of_training_evaluation_the_rule_is_the_same():
    values = dict(zip(SCHEDULED, [85.0, 86.0, 87.0, 88.0]))
    assert best_at_last_evaluation(_run(2104, 88.0, 88.0), _evals(values))
    values = dict(zip([526, 1052, 1578, 2105], [85.0, 86.0, 87.0, 88.0]))  # or the last evaluation at the last step
    assert best_at_last_evaluation(_run(2105, 88.0, 88.0), _evals(values))


def test_a_best_before_the_last_scheduled_evaluation_is_not_flagged():
    values = dict(zip(SCHEDULED, [85.0, 86.0, 88.0, 87.0])) | {2105: 87.0}
    assert not best_at_last_evaluation(_run(1578, 88.0, 87.0), _evals(values))
    assert not best_at_last_evaluation(_run(1578, 88.0, 87.0))


def test_a_run_that_stopped_early_is_never_flagged():
    values = dict(zip(SCHEDULED[:2], [85.0, 86.0]))
    assert not best_at_last_evaluation(_run(1052, 86.0, 86.0, steps=1052, early=True), _evals(values))


def test_the_committed_sst2_evidence_flags_every_final_run_best_at_its_last_scheduled_evaluation():
    """evidence-sst2-minilm: every final run evaluates at 526, 1052, 1578, 2104 and again at the end
    (2105). A run is still improving when its best is at step 2104 or 2105; before the fix the
    comparison flagged none of them."""
    folder = RESULTS / "evidence-sst2-minilm"
    c = json.loads((folder / "comparison.json").read_text())
    compared = {run["run_name"] for m in c["methods"].values() for run in m["runs"]}  # superseded final runs left out
    expected: dict[str, list[int]] = {}
    for path in sorted(folder.glob("runs/*/result.json")):
        r = json.loads(path.read_text())
        evals = sorted({json.loads(l)["step"] for l in (path.parent / "metrics.jsonl").read_text().splitlines()
                        if json.loads(l).get("type") == "eval"})
        assert evals == [*SCHEDULED, 2105]
        if r["run_name"] in compared and r["performance"]["best_step"] >= 2104:
            expected.setdefault(r["method"], []).append(r["seed"])
    assert expected and sum(map(len, expected.values())) < sum(len(m["seeds"]) for m in c["methods"].values())
    assert {m: sorted(s) for m, s in c["best_at_last_step"].items()} == {m: sorted(s) for m, s in expected.items()}
    for method, seeds in expected.items():
        assert f"{method}: best validation at the last evaluation of the budget in seed(s) " \
               f"{', '.join(map(str, sorted(seeds)))}:" in " ".join(c["warnings"])


@pytest.mark.parametrize("name", sorted(p.parent.name for p in RESULTS.glob("*/comparison.json")))
def test_comparison_warnings_are_the_ones_the_report_wrote(name):
    c = json.loads((RESULTS / name / "comparison.json").read_text())
    assert comparison_warnings(c) == c["warnings"]


def test_comparison_warnings_names_machine_speed_drift_and_falls_back_to_stored_warnings():
    c = json.loads((RESULTS / "cpu-sst2" / "comparison.json").read_text())
    probe = c["environment"]["probe"][0]
    probe["drift_percent"] = 40.0
    warned = comparison_warnings(c)
    assert any(w.startswith("the matrix-multiply speed probe changed by more than 10%") and f"{probe['run']}: +40%" in w
               for w in warned)
    assert comparison_warnings({"warnings": ["written by an older oelm"]}) == ["written by an older oelm"]
    assert comparison_warnings({}) == []
