"""The warnings of a comparison: the reasons a reader should distrust part of it (runs on
different devices, the machine's speed drifting, runs that shared a machine, collapsed runs, a
learning rate on the edge of its grid, a grid that grew, runs still improving, totals over
different step counts, a GPU waiting for data, superseded final runs), one sentence each,
recomputed from ``comparison.json``'s fields."""

from __future__ import annotations

import statistics
from typing import Any

from oelm.records import format_rates, grid_edge_note, is_automatic

__all__ = ["comparison_warnings", "warnings_of", "DRIFT_WARNING_PERCENT", "DATA_STALL_WARNING_PERCENT"]

# Change of the matmul speed probe between the start and the end of a run (%) beyond which the
# report says the run's timings are suspect (the machine's speed drifted).
DRIFT_WARNING_PERCENT = 10.0

# A GPU idle for more than this % of its training time waiting for batches gets a warning (CPU runs
# do not: there a loader worker would compete with the model for the same cores).
DATA_STALL_WARNING_PERCENT = 5.0


def comparison_warnings(comparison: dict[str, Any]) -> list[str]:
    """The warnings ``oelm report`` prints for ``comparison`` (what :func:`compare_results`
    returns, or a ``comparison.json`` read back), one sentence each: runs on different devices,
    the machine's speed drifting during runs or between methods, runs that shared a machine,
    collapsed runs, a learning rate on the edge of its grid, a grid that grew, runs still improving
    at their last evaluation, totals over different step counts, a GPU waiting for data
    (``DATA_STALL_WARNING_PERCENT``), superseded final runs.

    Recomputed from the comparison's fields with the current rules; a comparison that lacks them
    (written by an older oelm) gives its stored ``warnings``. ``[]`` when there is nothing to warn of.
    """
    try:
        return warnings_of(comparison)
    except (KeyError, TypeError, AttributeError):
        return [str(w) for w in comparison.get("warnings") or []]


def _grid_warnings(c: dict[str, Any]) -> list[str]:
    """A selected rate on its grid's edge (naming the cap when automatic growth reached it) and each
    growth of a grid by hand (an automatic one, on validation before any final run, is none)."""
    out = []
    growth = (c.get("sweep") or {}).get("grid_growth") or {}
    for name, m in c["methods"].items():
        if m.get("selected_at_grid_edge"):
            automatic = [g for g in growth.get(name) or [] if is_automatic(g)]
            capped = (f" (its grid grew {len(automatic)} time(s) on validation and max_grid_growth "
                      f"{automatic[-1].get('max_grid_growth')} stopped it at this edge)" if automatic else "")
            out.append(f"{name}: {grid_edge_note(m['learning_rate_grid'], m['selected_at_grid_edge'])}{capped}.")
    for name, steps in growth.items():
        for g in steps:
            if is_automatic(g):  # on validation, before any final run: no test result could steer it
                continue
            tested = g.get("tested_final_runs") or []
            out.append(f"{name}: its learning-rate grid grew from {format_rates(g['from'])} to {format_rates(g['to'])} ({g.get('at')}) "
                       "and the rate was selected again on validation"
                       + (f"; {len(tested)} final run(s) had already evaluated the test split ({', '.join(tested)}), "
                          "so the grid grew after test results existed." if tested else "; no test result existed then."))
    return out


def warnings_of(c: dict[str, Any]) -> list[str]:
    """Reasons a reader should distrust part of the comparison (devices, drift within a run or
    between methods' runs, collapses, a
    learning rate selected on the edge of its grid (grown rates included; one whose automatic
    growth reached ``max_grid_growth`` says so), a grid grown by hand (an automatic growth, made
    on validation before any final run, is no caveat: the sweep section reports it), superseded
    final runs, runs whose best validation is at their last scheduled evaluation)."""
    out = []
    devices = c["environment"]["devices"]
    if len(devices) > 1:
        out.append(f"runs of this comparison ran on different devices ({'; '.join(devices)}): timings are not comparable.")
    drifted = [
        f"{p['run']}: {p['drift_percent']:+.0f}%"
        for p in c["environment"]["probe"]
        if p["drift_percent"] is not None and abs(p["drift_percent"]) > DRIFT_WARNING_PERCENT
    ]
    if drifted:
        out.append(
            f"the matrix-multiply speed probe changed by more than {DRIFT_WARNING_PERCENT:.0f}% between the start and end "
            f"of some runs ({'; '.join(drifted)}): the machine's speed drifted, so time differences of that size are not evidence."
        )
    speeds: dict[str, list[float]] = {}
    for p in c["environment"]["probe"]:
        if p.get("gflops_before"):
            speeds.setdefault(p["method"], []).append(p["gflops_before"])
    medians = {name: statistics.median(v) for name, v in speeds.items()}
    if len(medians) > 1 and max(medians.values()) > (1 + DRIFT_WARNING_PERCENT / 100) * min(medians.values()):
        out.append(
            f"the matrix-multiply speed probe at the start of each method's runs differs by more than {DRIFT_WARNING_PERCENT:.0f}% "
            f"between methods (median GFLOP/s: {', '.join(f'{n} {v:.1f}' for n, v in medians.items())}): the methods met the "
            "machine at different speeds (run at different times or beside different loads), so step-time and total-time "
            "differences of that size are not evidence."
        )
    shared = (c.get("execution") or {}).get("shared_node_runs") or []
    if shared:
        out.append(
            f"{len(shared)} final run(s) trained beside other runs on the same machine (one overlapped up to "
            f"{c['execution']['most_overlapped_runs']} others, executor {', '.join(c['execution']['executors'])}; "
            f"{', '.join(shared)}): they shared its cores or GPUs, so their step times and total times are not speed "
            "evidence; rerun with --parallel 1 (or the local executor) for timings."
        )
    for x in c["collapsed"]:
        out.append(f"{x['method']} seed {x['seed']} excluded from the means: {'; '.join(x['reasons'])}.")
    out += _grid_warnings(c)
    for name, seeds in (c.get("best_at_last_step") or {}).items():
        out.append(f"{name}: best validation at the last evaluation of the budget in seed(s) {', '.join(map(str, seeds))}: "
                   "still improving when training ended, so a longer budget could change the comparison.")
    steps = {name: (m.get("steps") or {}).get("mean") for name, m in c["methods"].items()}
    known = {name: v for name, v in steps.items() if v is not None}
    if len(set(known.values())) > 1:
        out.append("total seconds (and Δ time %) cover different numbers of training steps, since runs stopped early at "
                   f"different points (mean steps: {', '.join(f'{n} {v:,.0f}' for n, v in known.items())}): they say when "
                   "each method stopped, not how fast it trains; compare step ms for speed and time to target for time to a quality.")
    for name, m in c["methods"].items():
        stall = (m.get("data_stall_percent") or {}).get("mean")
        if stall is not None and stall > DATA_STALL_WARNING_PERCENT and any("cuda" in d for d in m.get("devices") or []):
            workers = "/".join(map(str, m.get("num_workers") or [])) or "?"
            out.append(f"{name}: the GPU waited for data {stall:.0f}% of its training time (timing.data_stall_seconds, mean "
                       f"over seeds) with {workers} DataLoader worker(s): step times and tokens/s are partly data loading; "
                       "raise training.num_workers so batches are ready before each step.")
    by_method: dict[tuple[str, float], list[str]] = {}
    for r in c.get("superseded") or []:
        by_method.setdefault((r["method"], r["learning_rate"]), []).append(r["run_name"])
    for (name, lr), runs in by_method.items():
        out.append(f"{name}: {len(runs)} final run(s) at learning rate {lr:g}, no longer selected after its grid grew, "
                   f"are left out of every mean ({', '.join(runs)}).")
    return out
