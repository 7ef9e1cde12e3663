"""Statistics of a comparison: seed summaries, paired differences, step-time spread, collapse
detection and time-to-target. Pure functions on plain numbers and run records (no plotting).

Methods (all over seeds, i.e. over independent runs of one method):

* :func:`summarize` — mean, sample standard deviation (``ddof=1``) and the 95% confidence
  interval of the mean with Student's t: ``mean ± t(0.975, n-1) · s / sqrt(n)``. One value has
  no spread: ``std`` 0 and no interval (None), never an invented one.
* :func:`paired_difference` — differences ``d_s = method_s − baseline_s`` for the seeds ``s``
  both ran; mean, 95% t interval of the mean difference and the two-sided p-value of the paired
  t-test (``scipy.stats.ttest_rel``: ``t = mean(d) / (s_d / sqrt(n))``, ``n-1`` degrees of
  freedom). Fewer than 2 pairs: interval and p-value are None ("n/a" in the report).
* :func:`step_time_stats` — median, quartiles (numpy's default linear interpolation), IQR = Q3 −
  Q1 and the coefficient of variation CV = s / mean (ddof=1) of per-step times in ms.
* :func:`collapse_reasons` — why a run must not be averaged in (see its docstring for the rule).
* :func:`best_at_last_evaluation` — whether a run was still improving when its budget ended.
* :func:`time_to_target` — MLPerf-style "time to quality": the first validation evaluation at
  which a run reaches a target value, with its step and wall-clock seconds since the run began.
* :func:`holm` — Holm's adjusted p-values over a family of comparisons (the claims table's rows).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from oelm.records import RunRecord
from oelm.metrics import METRICS, get_metric

__all__ = [
    "CHANCE_MARGIN_POINTS",
    "percent_change",
    "sound_runs",
    "summarize",
    "paired_difference",
    "step_time_stats",
    "collapse_reasons",
    "best_at_last_evaluation",
    "reaches",
    "time_to_target",
    "holm",
]

#: An accuracy run whose final validation accuracy is at most the chance level plus this many
#: points is "at chance". The chance level is ``100 / num_labels``, or the validation split's
#: majority-class share when that is higher (a constant predictor scores it: SST-2 validation is
#: 50.92% positive).
CHANCE_MARGIN_POINTS = 2.0


def sound_runs(results: Mapping[str, list[RunRecord]], comparison: dict[str, Any]) -> Iterator[tuple[str, RunRecord]]:
    """``(method, record)`` for each named final run of a sound seed: a seed in the method's
    ``included_seeds`` in ``comparison["methods"]`` (collapsed and failed seeds left out), the
    seeds every per-seed section of the report (intervals, diagnostics) reads."""
    for name, runs in results.items():
        keep = set((comparison["methods"].get(name) or {}).get("included_seeds") or [])
        yield from ((name, r) for r in runs if r.seed in keep and r.name)


def _finite(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]


def _t_interval(mean: float, std: float, n: int) -> list[float] | None:
    """95% Student-t interval of a mean from ``n`` values with sample std ``std``; None for n < 2."""
    if n < 2:
        return None
    from scipy import stats as _st  # here, not at import: a single-seed report needs no scipy (~1 s)

    half = float(_st.t.ppf(0.975, n - 1)) * std / math.sqrt(n)
    return [mean - half, mean + half]


def summarize(values: Iterable[Any]) -> dict[str, Any]:
    """Mean, sample std (ddof=1), n and 95% Student-t confidence interval of the mean.

    Non-numbers and non-finite values are dropped (a diverged run is flagged elsewhere, not
    averaged in). Returns ``{"mean", "std", "n", "ci95": [low, high] | None, "values"}``; with no
    value every statistic is None and n is 0; with one value std is 0.0 and ci95 None.
    """
    vals = _finite(values)
    n = len(vals)
    if n == 0:
        return {"mean": None, "std": None, "n": 0, "ci95": None, "values": []}
    mean = float(np.mean(vals))
    std = float(np.std(vals, ddof=1)) if n > 1 else 0.0
    return {"mean": mean, "std": std, "n": n, "ci95": _t_interval(mean, std, n), "values": vals}


def paired_difference(baseline: dict[int, Any], other: dict[int, Any]) -> dict[str, Any]:
    """Paired difference ``other − baseline`` over the seeds both have (finite values only).

    Args:
        baseline, other: seed -> value (e.g. best validation accuracy in %, or seconds).

    Returns:
        ``{"test": "paired t-test", "n", "seeds", "mean", "std", "ci95", "p_value"}``: mean and
        sample std of the per-seed differences; ci95 (Student t, n-1 df) and the two-sided
        p-value of ``scipy.stats.ttest_rel`` — both None when fewer than 2 pairs exist, and the
        p-value also None when every difference is identical (the t statistic is undefined).
    """
    seeds = sorted(s for s in baseline if s in other and _finite([baseline[s]]) and _finite([other[s]]))
    diffs = [float(other[s]) - float(baseline[s]) for s in seeds]
    n = len(diffs)
    out: dict[str, Any] = {"test": "paired t-test", "n": n, "seeds": seeds, "mean": None, "std": None, "ci95": None, "p_value": None}
    if n == 0:
        return out
    out["mean"] = float(np.mean(diffs))
    out["std"] = float(np.std(diffs, ddof=1)) if n > 1 else 0.0
    if n >= 2:
        out["ci95"] = _t_interval(out["mean"], out["std"], n)
        if out["std"] > 0:
            from scipy import stats as _st

            p = float(_st.ttest_rel([float(other[s]) for s in seeds], [float(baseline[s]) for s in seeds]).pvalue)
            out["p_value"] = p if math.isfinite(p) else None
    return out


def step_time_stats(step_ms: Sequence[float]) -> dict[str, Any]:
    """Spread of per-step times (ms): ``{"n", "median", "q1", "q3", "iqr", "mean", "cv"}``.

    Quartiles use numpy's linear interpolation; IQR = Q3 − Q1 (ms); CV = sample std / mean
    (dimensionless; None for fewer than 2 steps). Empty input gives n = 0 and None elsewhere.
    """
    vals = _finite(step_ms)
    if not vals:
        return {"n": 0, "median": None, "q1": None, "q3": None, "iqr": None, "mean": None, "cv": None}
    a = np.asarray(vals)
    q1, med, q3 = (float(x) for x in np.percentile(a, [25, 50, 75]))
    mean = float(a.mean())
    cv = float(a.std(ddof=1) / mean) if len(a) > 1 and mean > 0 else None
    return {"n": len(vals), "median": med, "q1": q1, "q3": q3, "iqr": q3 - q1, "mean": mean, "cv": cv}


def collapse_reasons(
    record: RunRecord,
    records: Sequence[dict[str, Any]] = (),
    *,
    num_labels: int | None = None,
    majority_percent: float | None = None,
    chance_margin: float = CHANCE_MARGIN_POINTS,
) -> list[str]:
    """Why a run must be excluded from the means (empty list: the run is sound).

    The rule, in order:

    1. ``status`` is not ``"finished"`` (a failed run, with ``failure.kind`` such as nan/oom, or
       an interrupted one);
    2. a non-finite loss: any train record's ``loss`` in ``metrics.jsonl`` (``records``), or the
       final train loss, or the best/final validation value is NaN/Inf/missing;
    3. accuracy runs: final validation accuracy ``<= max(100 / num_labels, majority_percent) +
       chance_margin`` points, i.e. no better than uniform guessing or than always predicting the
       validation split's most frequent label (skipped when both are unknown);
    4. perplexity runs: the final validation perplexity is not below the first validation
       evaluation's (needs at least two evaluations in ``records``).

    Args:
        record: a run's record.
        records: the run's ``metrics.jsonl`` records (may be empty for old outputs).
        num_labels: classes of the task (for the chance rule).
        majority_percent: the validation split's most frequent label, in % of its examples
            (``data.validation.majority_class_percent`` of the run's record).
        chance_margin: points above chance still counted as chance.
    """
    reasons: list[str] = []
    if not record.finished:
        detail = ", ".join(f"{k} {v}" for k, v in (("kind", record.failure_kind), ("step", record.failure_step))
                           if v is not None)
        reasons.append(f"{record.status}" + (f" ({detail})" if detail else ""))
        return reasons
    losses = [r.get("loss") for r in records if r.get("type") == "train"]
    bad_loss = [x for x in losses if not _finite([x])]
    final_loss = record.final_train_loss
    if bad_loss or (final_loss is not None and not _finite([final_loss])):
        reasons.append("non-finite training loss")
    for what, value in (("best validation", record.best_validation), ("final validation", record.final_validation)):
        if not _finite([value]):
            reasons.append(f"non-finite {what}")
    if reasons:
        return reasons
    metric = get_metric(record.metric) if record.metric in METRICS else None
    final = float(record.final_validation)
    majority = majority_percent if _finite([majority_percent]) else None
    chance = metric.chance_level(num_labels=num_labels, majority_percent=majority) if metric else None
    if chance is not None:
        what = "majority class" if majority_percent is not None and chance == majority_percent and (
            not num_labels or majority_percent > 100.0 / num_labels) else "uniform"
        if final <= chance + chance_margin:
            reasons.append(
                f"at chance: final validation {metric.name} {final:.2f}% <= {chance:.2f}% ({what}) + {chance_margin:g}")
    elif metric is not None and not metric.higher_is_better:
        evals = [r for r in records if r.get("type") == "eval" and _finite([r.get(metric.name)])]
        if len(evals) >= 2:
            first = float(min(evals, key=lambda r: r.get("step", 0))[metric.name])
            if not metric.better(final, first):
                reasons.append(f"no learning: final validation {metric.name} {final:.2f} not below first evaluation {first:.2f}")
    return reasons


def best_at_last_evaluation(record: RunRecord, records: Sequence[dict[str, Any]] = ()) -> bool:
    """Whether ``record``'s run was still improving when its budget ended: it did not stop early
    and its best validation is at its last *scheduled* evaluation.

    With the run's ``metrics.jsonl`` ``records``: every evaluation after ``performance.best_step``
    lies less than half an evaluation interval (the median step gap between its evaluations)
    after it. So an end-of-training evaluation one step after the last scheduled one (which
    repeats it, tying or nearly tying its value) does not hide a best at the last scheduled
    evaluation, and a run whose end-of-training evaluation is the only one after its best, or
    that has none after it, is flagged either way. Without records (or without ``best_step``):
    ``best_step == steps``, or the last evaluation (``final_validation``) equals the best.
    """
    if record.early_stopped:
        return False  # it stopped because it no longer improved
    best_step, steps = record.best_step, record.steps
    if isinstance(best_step, int) and best_step == steps:
        return True
    evals = sorted({r["step"] for r in records if r.get("type") == "eval" and isinstance(r.get("step"), int)})
    if isinstance(best_step, int) and len(evals) >= 2:
        interval = float(np.median(np.diff(evals)))
        return all(s - best_step < interval / 2 for s in evals if s > best_step)
    best, final = record.best_validation, record.final_validation
    numbers = _finite([best, final])
    return len(numbers) == 2 and math.isclose(numbers[0], numbers[1], rel_tol=1e-12, abs_tol=1e-12)


def reaches(value: float, target: float, higher_is_better: bool) -> bool:
    """Has ``value`` reached ``target``? (``>=`` for accuracy, ``<=`` for perplexity)."""
    return value >= target if higher_is_better else value <= target


def time_to_target(
    records: Sequence[dict[str, Any]], metric: str, target: float, higher_is_better: bool
) -> dict[str, Any] | None:
    """First validation evaluation reaching ``target`` (MLPerf "time to quality").

    Args:
        records: a run's ``metrics.jsonl`` records; ``{"type": "eval", "step", <metric>,
            "elapsed_seconds"}`` are used, in step order.
        metric: "accuracy" or "perplexity" (the record key).
        target: the value to reach (the report uses baseline's mean final validation value).

    Returns:
        ``{"step", "seconds", "value"}`` (seconds: wall time since the run began, evaluation time
        included, as MLPerf counts it), or None when no evaluation reached the target.
    """
    evals = sorted((r for r in records if r.get("type") == "eval" and _finite([r.get(metric)])), key=lambda r: r["step"])
    for r in evals:
        if reaches(float(r[metric]), target, higher_is_better):
            return {"step": int(r["step"]), "seconds": r.get("elapsed_seconds"), "value": float(r[metric])}
    return None


def percent_change(a: float | None, b: float | None) -> float | None:
    """``(a - b) / b`` in % (None when either is missing or ``b`` is 0)."""
    if a is None or b is None or b == 0:
        return None
    return 100.0 * (a - b) / b


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values of one family of tests (Holm 1979, "A simple sequentially
    rejective multiple test procedure", Scand. J. Statist. 6: 65–70), in the order given.

    With the m p-values sorted ascending, ``p_(1) <= ... <= p_(m)``, the adjusted ``p~_(i) =
    max_{j <= i} min(1, (m − j + 1) · p_(j))``; rejecting every hypothesis whose adjusted p is below α
    is Holm's procedure, which keeps the chance of any false rejection in the family at most α
    whatever the dependence between the tests. Ties keep their given order (their adjusted values
    are equal either way). [] gives [].
    """
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * float(p_values[i])))
        adjusted[i] = running
    return adjusted
