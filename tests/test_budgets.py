"""Budgets to convergence (issue 49, item 1): the report says per final run whether it stopped on
patience (converged: at which step, best at which step) or ran to its budget's end (hit the cap),
in comparison.json's ``budgets`` and the report's Runs table; the "still improving" caveat stays for
runs that hit the cap while improving. On the committed runs (real results), some edited the way a
run that hit its cap would have written them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from oelm.cli import main
from oelm.report import render_report

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


def _finals(folder: Path) -> dict[tuple[str, int], dict]:
    found = {}
    for path in folder.glob("runs/*/result.json"):
        r = json.loads(path.read_text())
        if r.get("stage", "final") == "final":
            found[r["method"], r["seed"]] = r | {"_path": path}
    return found


def test_runs_that_stopped_on_patience_are_converged_with_their_steps(tmp_path):
    """evidence-gpt-cls-imdb: every final run stopped on patience 2; comparison.json gives each its
    steps, planned steps and best step from its result.json, and the Runs table says it."""
    copy = tmp_path / "imdb"
    shutil.copytree(RESULTS / "evidence-gpt-cls-imdb", copy)
    assert main(["report", str(copy)]) == 0
    c = json.loads((copy / "comparison.json").read_text())
    finals = _finals(copy)
    budgets = c["budgets"]["methods"]
    assert sum(m["converged"] for m in budgets.values()) == len(finals) == 9
    report = (copy / "report.md").read_text()
    for name, m in budgets.items():
        assert m["hit_cap"] == 0 and m["still_improving"] == 0
        for e in m["runs"]:
            r = finals[name, e["seed"]]
            assert e["ended"] == "patience" and e["patience"] == 2 and e["still_improving"] is False
            assert (e["steps"], e["planned_steps"], e["best_step"]) == (
                r["performance"]["steps"], r["budget"]["planned_steps"], r["performance"]["best_step"])
            assert e["steps"] < e["planned_steps"]
            assert (f"| {name} | {e['seed']} | finished | " in report
                    and f"| converged: stopped on patience at step {e['steps']:,} of {e['planned_steps']:,} "
                        f"(best at {e['best_step']:,}) |" in report)
    assert "Budget: 9 of 9 finished run(s) converged" in report


def test_a_run_that_hit_its_cap_says_so_and_still_improving_keeps_its_warning(tmp_path):
    """Two runs edited to have trained their whole budget (patience set, no early stop): one with its
    best at the last step (hit the cap, still improving: the warning stays), one with its best
    earlier (hit the cap, not improving: no warning for it)."""
    copy = tmp_path / "imdb"
    shutil.copytree(RESULTS / "evidence-gpt-cls-imdb", copy)
    finals = _finals(copy)
    (improving, plateau) = sorted(k for k in finals if k[0] == "oelm_freeze")[:2]
    for key, best_at_end in ((improving, True), (plateau, False)):
        r = finals[key]
        path = r.pop("_path")
        planned = r["budget"]["planned_steps"]
        r["performance"].update(early_stopped=False, steps=planned, best_step=planned if best_at_end else 1)
        path.write_text(json.dumps(r))
    assert main(["report", str(copy)]) == 0
    c = json.loads((copy / "comparison.json").read_text())
    freeze = c["budgets"]["methods"]["oelm_freeze"]
    by_seed = {e["seed"]: e for e in freeze["runs"]}
    assert by_seed[improving[1]]["ended"] == by_seed[plateau[1]]["ended"] == "budget"
    assert by_seed[improving[1]]["still_improving"] and not by_seed[plateau[1]]["still_improving"]
    assert (freeze["converged"], freeze["hit_cap"], freeze["still_improving"]) == (1, 2, 1)
    assert c["best_at_last_step"]["oelm_freeze"] == [improving[1]]
    assert any(w.startswith(f"oelm_freeze: best validation at the last evaluation of the budget in seed(s) {improving[1]}:")
               for w in c["warnings"])
    report = (copy / "report.md").read_text()
    planned = by_seed[improving[1]]["planned_steps"]
    assert f"| hit the cap: {planned:,} of {planned:,} steps (best at {planned:,}; still improving) |" in report
    assert f"| hit the cap: {planned:,} of {planned:,} steps (best at 1) |" in report
    assert "2 hit the cap (trained every step of their budget), 1 of them still improving" in report


def test_runs_without_early_stopping_ran_their_budget(tmp_path):
    """cpu-sst2 trained without early stopping: every run ran its budget, which the report names as
    such (its budget, not convergence, ended it)."""
    copy = tmp_path / "sst2"
    shutil.copytree(RESULTS / "cpu-sst2", copy)
    assert main(["report", str(copy)]) == 0
    c = json.loads((copy / "comparison.json").read_text())
    entries = [e for m in c["budgets"]["methods"].values() for e in m["runs"]]
    assert len(entries) == 9 and all(e["ended"] == "budget" and e["patience"] is None for e in entries)
    assert {e["seed"] for e in entries if e["still_improving"]} and not all(e["still_improving"] for e in entries)
    report = (copy / "report.md").read_text()
    assert "ran its budget (no early stopping): 64 of 64 steps (best at 64; still improving)" in report
    assert "Early stopping was off for those, so their budget, not convergence, ended them." in report


def test_a_comparison_written_before_budgets_renders_as_it_did():
    """An older comparison.json (no ``budgets``) keeps its Runs table: no budget column, the early
    stop in the status."""
    c = json.loads((RESULTS / "evidence-gpt-cls-imdb" / "comparison.json").read_text())
    c.pop("budgets")  # as oelm wrote it before the key existed (every committed one has been re-rendered since)
    text = render_report(c)
    runs = text.split("## Runs", 1)[1].split("\n## ", 1)[0]
    assert "| ended |" not in runs and ", stopped early at step " in runs and "Budget:" not in runs
