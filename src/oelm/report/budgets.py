"""Budgets to convergence: per final run, whether it stopped on patience (converged: no better
validation for ``training.early_stopping_patience`` evaluations) or ran to the end of its budget
(hit the cap: epochs / ``max_steps``), at which step, and where its best validation was; and the
report's table of runs, which says it beside each run's numbers.

A gap between methods depends on where training was cut (issue 49: OELM-Freeze's cost on SST-2 is
−3.93 points at 375 steps and −1.57 at 2,105), so a run that hit its cap while still improving
(:func:`oelm.report.stats.best_at_last_evaluation`) is named, and the warnings say a longer budget
could change the comparison; a run that stopped on patience had stopped improving.
"""

from __future__ import annotations

from typing import Any, Mapping

from oelm.records import RunRecord
from oelm.report.stats import best_at_last_evaluation

__all__ = ["run_budget", "budgets_comparison", "budget_cell", "runs_blocks"]

PATIENCE, BUDGET = "patience", "budget"


def run_budget(record: RunRecord, records: list[dict[str, Any]]) -> dict[str, Any]:
    """How one final run ended: ``ended`` ``"patience"`` (early stopping ended it: converged),
    ``"budget"`` (it trained every planned step: hit the cap) or None (it did not finish);
    ``patience`` (its ``early_stopping_patience``, None without early stopping), ``steps`` (optimizer
    steps taken), ``planned_steps`` (None in older results), ``best_step`` (the step of its best
    validation) and ``still_improving`` (hit the cap with its best validation at its last scheduled
    evaluation: :func:`~oelm.report.stats.best_at_last_evaluation` on its ``metrics.jsonl`` ``records``)."""
    ended = None if not record.finished else PATIENCE if record.early_stopped else BUDGET
    return {"seed": record.seed, "run_name": record.name, "ended": ended, "patience": record.early_stopping_patience,
            "steps": record.steps, "planned_steps": record.planned_steps, "best_step": record.best_step,
            "still_improving": ended == BUDGET and best_at_last_evaluation(record, records)}


def budgets_comparison(results: Mapping[str, list[RunRecord]],
                       records_of: Mapping[tuple[str, int], list[dict[str, Any]]]) -> dict[str, Any]:
    """``{"budgets": {...}}`` for ``comparison.json`` ({} without runs): ``rule`` (in words) and per
    method ``converged`` (runs that stopped on patience), ``hit_cap`` (ran to the end of the budget),
    ``still_improving`` (of those, best at the last evaluation) and ``runs`` (:func:`run_budget`
    each, by seed; collapsed and failed runs included, as under the report's Runs)."""
    methods: dict[str, Any] = {}
    for name, runs in results.items():
        if not runs:
            continue
        entries = [run_budget(r, list(records_of.get((name, r.seed)) or [])) for r in sorted(runs, key=lambda r: r.seed)]
        methods[name] = {"converged": sum(e["ended"] == PATIENCE for e in entries),
                         "hit_cap": sum(e["ended"] == BUDGET for e in entries),
                         "still_improving": sum(e["still_improving"] for e in entries), "runs": entries}
    if not methods:
        return {}
    return {"budgets": {"methods": methods, "rule": (
        "converged: stopped on patience (training.early_stopping_patience validations without improvement); hit the "
        "cap: trained every step of its budget (epochs / max_steps); still improving: hit the cap with its best "
        "validation at its last scheduled evaluation")}}


def budget_cell(entry: Mapping[str, Any] | None) -> str:
    """One run's :func:`run_budget` in words, for the Runs table ("–" for a run that did not finish)."""
    if not entry or entry.get("ended") is None:
        return "–"
    steps, planned, best = entry.get("steps"), entry.get("planned_steps"), entry.get("best_step")
    of = f"{steps:,}" if steps is not None else "?"
    of += f" of {planned:,}" if planned is not None else ""
    best_at = f"best at {best:,}" if best is not None else "best step unknown"
    if entry["ended"] == PATIENCE:
        return f"converged: stopped on patience at step {of} ({best_at})"
    what = "hit the cap" if entry.get("patience") else "ran its budget (no early stopping)"
    return f"{what}: {of} steps ({best_at}{'; still improving' if entry.get('still_improving') else ''})"


def _chance_text(rule: dict[str, Any]) -> str:
    """The chance level of the collapse rule, in words."""
    majority = rule.get("validation_majority_class_percent")
    if rule.get("num_labels"):
        chance = f"100/{rule['num_labels']}"
        if majority is not None:
            chance = f"the higher of {chance} and the validation majority-class share {majority:.2f}%"
        return chance + f" + {rule['chance_margin_points']:g} points"
    if majority is not None:
        return f"the validation majority-class share {majority:.2f}% + {rule['chance_margin_points']:g} points"
    return "not applied (number of labels unknown)"


def _num(v: Any, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def runs_blocks(c: dict[str, Any], unit: str) -> list[tuple[str, list[tuple[str, Any]]]]:
    """The report's "Runs" section: every final run with its status, numbers, how its budget ended
    (:func:`budget_cell`, when ``c`` has ``budgets``; a comparison written before has the early
    stop in its status instead) and its collapse check; the collapse rule in words; the budgets'
    summary; the runs that stopped early. Blocks as :class:`oelm.report.render.Section` holds them."""
    budgets = (c.get("budgets") or {}).get("methods")
    rows, stopped_early = [], []
    for n, m in c["methods"].items():
        by_seed = {e["seed"]: e for e in (budgets or {}).get(n, {}).get("runs", [])}
        for r in m.get("runs", []):
            status = r["status"]
            if r.get("stopped_early_at") is not None:
                status += "" if budgets is not None else f", stopped early at step {r['stopped_early_at']}"
                stopped_early.append(f"{n} seed {r['seed']}")
            row = [n, str(r["seed"]), status, _num(r["best_validation"]), _num(r["final_validation"]), _num(r["test"]),
                   _num(r["total_seconds"], 1), "–" if r["learning_rate"] is None else f"{r['learning_rate']:g}"]
            row += [budget_cell(by_seed.get(r["seed"]))] if budgets is not None else []
            rows.append(row + ["; ".join(r["collapse"]) or "ok"])
    header = ["method", "seed", "status", f"best val{unit}", f"final val{unit}", "test", "total s", "lr"]
    header += ["ended"] if budgets is not None else []
    blocks: list[tuple[str, Any]] = [("table", (header + ["collapse check"], rows)), ("text", (
        "Collapse rule: a run is excluded from every mean (and listed here) if it did not finish (failed or interrupted), "
        "if any training loss or its validation value is non-finite, if an accuracy run's final validation accuracy is at "
        f"or below chance ({_chance_text(c.get('collapse_rule') or {})}), or if a perplexity run's final validation "
        "perplexity is not below its first evaluation."))]
    if budgets is not None:
        blocks.append(("text", _budget_summary(budgets)))
    if stopped_early:
        blocks.append(("text", f"Stopped early (training.early_stopping_patience): {', '.join(stopped_early)}. Their time "
                               "columns cover fewer optimizer steps than planned, so their times are not a same-budget comparison."))
    return [("Runs", blocks)]


def _budget_summary(budgets: dict[str, Any]) -> str:
    """One paragraph: how many final runs converged, hit the cap, and were still improving there."""
    runs = [e for m in budgets.values() for e in m["runs"] if e["ended"] is not None]
    converged = sum(e["ended"] == PATIENCE for e in runs)
    capped = [e for e in runs if e["ended"] == BUDGET]
    improving = sum(e["still_improving"] for e in capped)
    text = (f"Budget: {converged} of {len(runs)} finished run(s) converged (stopped on patience: no better validation "
            f"for training.early_stopping_patience evaluations); {len(capped)} hit the cap (trained every step of "
            f"their budget)")
    if capped:
        text += (f", {improving} of them still improving at their last evaluation (best validation there: a longer "
                 "budget could change the comparison; see the warnings)" if improving else ", none still improving at its last evaluation")
    if capped and not any(e.get("patience") for e in capped):
        text += ". Early stopping was off for those, so their budget, not convergence, ended them"
    return text + "."
