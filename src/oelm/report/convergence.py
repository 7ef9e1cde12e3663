"""Time to quality: the area under the convergence curve (AUCC) and the training time / FLOPs a
method needs to reach 90, 95 and 99% of baseline's quality. Pure functions on a run's validation
records, :func:`time_to_quality_comparison` for ``comparison.json`` and
:func:`convergence_blocks` for the report.

The x axes come from each ``eval`` record of ``metrics.jsonl``
(:func:`oelm.training.run_timing.training_progress`): ``train_wall_seconds`` (seconds of optimizer
steps and data stalls so far; validation and checkpoints excluded) and ``train_flops`` (the FLOPs
the steps executed so far). Runs written before oelm recorded them get no such section.

AUCC, following the "area under the convergence curve" of Shen et al., "Reservoir Transformers"
(ACL 2021, section 4): the validation curve's area up to a common budget ``B``, normalized so
that it lies in [0, 1]::

    AUCC = (1 / B) * integral_0^B score(t) dt

* ``score`` maps the metric to [0, 1]: accuracy / 100; for perplexity ``1 − ln(PPL) / ln(V)``
  (``V`` the vocabulary size; clipped to [0, 1]): the share of a uniform guess's log-perplexity
  ``ln V`` the model has removed (0 at the uniform guess or worse, 1 at perplexity 1).
* Interpolation: a step-wise hold (``score(t)`` is the last validation at or before ``t``; 0
  before the first one, unless a validation at ``t = 0`` gives the start): the quality one could
  have shipped by stopping at ``t``. No trapezoid: it would credit quality before it was measured.
* ``B`` is the smallest total over the compared runs (every sound seed of every method): each
  run's last validation, so every curve is observed over the whole interval. 1 = a perfect
  score from the first instant; a faster-converging method has a larger AUCC at equal final quality.

Time to quality at level ``q``: the first validation with accuracy ``>= q x`` baseline's mean final
validation accuracy (perplexity: ``<= baseline's / q``); its training seconds and FLOPs, per seed,
with the Student-t interval over the seeds that reached it (:func:`oelm.report.stats.summarize`).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from oelm.records import RunRecord
from oelm.report import plots_wanted
from oelm.report.stats import paired_difference, reaches, summarize

__all__ = ["QUALITY_LEVELS", "normalized_score", "aucc", "first_reaching", "time_to_quality", "convergence_curve",
           "time_to_quality_comparison", "convergence_blocks", "convergence_plot"]

#: Fractions of baseline's final validation quality for the time-to-quality table.
QUALITY_LEVELS = (0.90, 0.95, 0.99)
_AXES = {"seconds": "train_wall_seconds", "flops": "train_flops"}


def normalized_score(values: Sequence[float], metric: str, vocab_size: int | None = None) -> np.ndarray:
    """Metric values mapped to [0, 1] (module docstring): accuracy % / 100; perplexity
    ``clip(1 − ln(PPL) / ln(vocab_size), 0, 1)``.

    Raises:
        ValueError: perplexity without a vocabulary size > 1, or an unknown metric.
    """
    v = np.asarray(values, dtype=np.float64)
    if metric == "accuracy":
        return v / 100.0
    if metric == "perplexity":
        if not vocab_size or vocab_size < 2:
            raise ValueError("normalizing perplexity needs the vocabulary size (result.json tokenizer.vocab_size)")
        return np.clip(1.0 - np.log(v) / math.log(vocab_size), 0.0, 1.0)
    raise ValueError(f"no normalized score for metric {metric!r}")


def aucc(x: Sequence[float], scores: Sequence[float], budget: float) -> float | None:
    """Area under the step-wise-held curve ``scores`` over ``x`` from 0 to ``budget``, divided by
    ``budget``: in [0, 1] when the scores are. ``x`` are the validations' training seconds (or
    FLOPs), ascending; the curve is 0 before ``x[0]`` and holds each score until the next ``x``,
    the last one until ``budget``. None for a budget <= 0 or no point."""
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(scores, dtype=np.float64)
    if budget is None or not budget > 0 or xs.size == 0:
        return None
    ends = np.minimum(np.append(xs[1:], max(budget, xs[-1])), budget)
    widths = np.clip(ends - np.minimum(xs, budget), 0.0, None)
    return float(np.sum(widths * ys) / budget)


def first_reaching(values: Sequence[float], target: float, higher_is_better: bool) -> int | None:
    """Position of the first value that reaches ``target`` (``>=`` / ``<=``: :func:`reaches`), None if none."""
    return next((i for i, v in enumerate(values) if reaches(float(v), target, higher_is_better)), None)


def time_to_quality(x: Sequence[float], values: Sequence[float], target: float, higher_is_better: bool) -> float | None:
    """``x`` (training seconds or FLOPs) of the first validation whose value reaches ``target``;
    None when none does. No interpolation: quality counts once a validation measured it."""
    i = first_reaching(values, target, higher_is_better)
    return None if i is None else x[i]


def convergence_curve(records: Sequence[Mapping[str, Any]], metric: str) -> list[list[float | None]] | None:
    """``[[train_wall_seconds, train_flops, value, step], ...]`` of a run's ``eval`` records in step
    order (one per step: the last), or None when they lack ``train_wall_seconds`` (older runs)."""
    evals = {r["step"]: r for r in records if r.get("type") == "eval" and isinstance(r.get(metric), (int, float))}
    if not evals or any(not isinstance(r.get("train_wall_seconds"), (int, float)) for r in evals.values()):
        return None
    return [[float(r["train_wall_seconds"]), r.get("train_flops"), float(r[metric]), int(s)] for s, r in sorted(evals.items())]


def _per_seed(curve: list, metric: str, vocab: int | None, budgets: dict[str, float | None], targets: dict[str, float],
              higher: bool) -> dict[str, Any]:
    """AUCC over seconds and FLOPs and the time / FLOPs to each level, for one run's curve."""
    values = [p[2] for p in curve]
    try:
        score = normalized_score(values, metric, vocab)
    except ValueError:
        score = None
    out: dict[str, Any] = {}
    for axis, col in (("seconds", 0), ("flops", 1)):
        xs = [p[col] for p in curve]
        ok = score is not None and budgets[axis] and all(isinstance(v, (int, float)) for v in xs)
        out[f"aucc_{axis}"] = aucc(xs, score, budgets[axis]) if ok else None
    out["to_quality"] = {}
    for level, target in targets.items():
        i = first_reaching(values, target, higher)
        out["to_quality"][level] = None if i is None else {"seconds": curve[i][0], "flops": curve[i][1], "step": curve[i][3]}
    return out


def time_to_quality_comparison(comparison: dict[str, Any], results: Mapping[str, list[RunRecord]],
                               records_of: Mapping[tuple[str, int], list[dict[str, Any]]]) -> dict[str, Any]:
    """``{"time_to_quality": {...}}`` for ``comparison.json``, or ``{}`` when no sound run's
    validations record their training seconds (results of older oelm versions: unchanged).

    ``time_to_quality``: ``common_budget`` {seconds, flops} (the smallest total of the runs),
    ``levels`` and ``targets`` (level -> the metric value to reach), ``baseline_final``,
    ``interpolation`` / ``normalization`` (in words), ``left_out`` (sound runs without the
    records), and per method: ``aucc_seconds`` / ``aucc_flops`` (:func:`summarize` over seeds),
    ``to_quality`` (level -> {reached, n, seconds, flops: summarize over the seeds that reached
    it}), ``runs`` (seed -> its AUCCs and times), ``curves`` (seed -> the curve, for the plot) and
    vs baseline ``paired_aucc_seconds`` / ``paired_aucc_flops`` (:func:`paired_difference`, by seed).
    """
    metric, higher = comparison.get("metric"), bool(comparison.get("higher_is_better"))
    curves: dict[str, dict[int, list]] = {}
    vocab: dict[tuple[str, int], int | None] = {}
    left_out = []
    for name, m in comparison["methods"].items():
        for seed in m.get("included_seeds") or []:
            curve = convergence_curve(records_of.get((name, seed)) or [], metric)
            if curve is None:
                left_out.append(f"{name} seed {seed}")
                continue
            curves.setdefault(name, {})[seed] = curve
            record = next((r for r in results.get(name, []) if r.seed == seed), None)
            vocab[(name, seed)] = record.vocab_size if record else None
    if not curves:
        return {}
    budgets = {}
    for axis, col in (("seconds", 0), ("flops", 1)):
        totals = [c[-1][col] for runs in curves.values() for c in runs.values()]
        budgets[axis] = min(totals) if totals and all(isinstance(t, (int, float)) for t in totals) else None
    base = comparison["methods"].get("baseline") or {}
    base_final = (base.get("final_validation") or {}).get("mean")
    targets = {} if base_final is None else {
        f"{q:g}": (q * base_final if higher else base_final / q) for q in QUALITY_LEVELS}
    methods: dict[str, Any] = {}
    for name, runs in curves.items():
        per = {seed: _per_seed(c, metric, vocab[(name, seed)], budgets, targets, higher) for seed, c in runs.items()}
        to_quality = {}
        for level in targets:
            hit = [v["to_quality"][level] for v in per.values() if v["to_quality"][level] is not None]
            to_quality[level] = {"reached": len(hit), "n": len(per), "seconds": summarize([h["seconds"] for h in hit]),
                                 "flops": summarize([h["flops"] for h in hit])}
        methods[name] = {"aucc_seconds": summarize([v["aucc_seconds"] for v in per.values()]),
                         "aucc_flops": summarize([v["aucc_flops"] for v in per.values()]),
                         "to_quality": to_quality, "runs": per, "curves": runs}
    if "baseline" in methods:
        for name, m in methods.items():
            if name != "baseline":
                for axis in ("seconds", "flops"):
                    m[f"paired_aucc_{axis}"] = paired_difference(
                        {s: v[f"aucc_{axis}"] for s, v in methods["baseline"]["runs"].items()},
                        {s: v[f"aucc_{axis}"] for s, v in m["runs"].items()})
    return {"time_to_quality": {
        "common_budget": budgets, "levels": list(QUALITY_LEVELS), "targets": targets, "baseline_final": base_final,
        "interpolation": "step-wise hold of the last validation; 0 before the first",
        "normalization": ("accuracy / 100" if metric == "accuracy" else "1 - ln(perplexity) / ln(vocabulary size)")
                         + ", integrated over [0, budget] and divided by the budget",
        "left_out": left_out, "methods": methods,
    }}


def _sci(v: float | None) -> str:
    return "–" if v is None else f"{v:.3g}"


def _stat(s: Mapping[str, Any] | None, fmt) -> str:
    """``mean [low, high]`` of a :func:`summarize` ("–" without a value)."""
    if not s or s.get("mean") is None:
        return "–"
    ci = s.get("ci95")
    return fmt(s["mean"]) + (f" [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else "")


def convergence_blocks(comparison: dict[str, Any]) -> list[tuple[str, list[tuple[str, Any]]]]:
    """The report's "Time to quality" section (AUCC table, time / FLOPs to each level, the plot):
    ``[(title, blocks)]`` in the block format of :class:`oelm.report.render.Section`; [] without
    the section."""
    t = comparison.get("time_to_quality")
    if not t:
        return []
    metric = comparison.get("metric") or "metric"
    budget = t["common_budget"]
    rows = []
    for name, m in t["methods"].items():
        pa, pf = m.get("paired_aucc_seconds") or {}, m.get("paired_aucc_flops") or {}
        rows.append([name, str(m["aucc_seconds"]["n"]), _stat(m["aucc_seconds"], lambda v: f"{v:.4f}"),
                     "–" if pa.get("mean") is None else f"{pa['mean']:+.4f}", _stat(m["aucc_flops"], lambda v: f"{v:.4f}"),
                     "–" if pf.get("mean") is None else f"{pf['mean']:+.4f}"])
    blocks: list[tuple[str, Any]] = [
        ("text", f"AUCC (area under the convergence curve, after Shen et al. 2021): the validation {metric} as a score in "
                 f"[0, 1] ({t['normalization']}); curve: {t['interpolation']}. Common budget: "
                 f"{_sci(budget.get('seconds'))} training seconds (steps and data stalls; validation excluded) and "
                 f"{_sci(budget.get('flops'))} executed training FLOPs: the smallest total of the compared runs. "
                 "Mean over seeds with the 95% Student-t interval; Δ = method − baseline, paired by seed."),
        ("table", (["method", "seeds", "AUCC (seconds)", "Δ", "AUCC (FLOPs)", "Δ"], rows)),
    ]
    if t.get("targets"):
        header = ["method"] + [f"to {float(q):.0%}: reached, seconds, FLOPs" for q in t["targets"]]
        rows = [[name] + [f"{x['reached']}/{x['n']}, {_stat(x['seconds'], lambda v: f'{v:.1f}')} s, "
                          f"{_stat(x['flops'], _sci)}" for x in m["to_quality"].values()]
                for name, m in t["methods"].items()]
        cmp = "≥ level × " if comparison.get("higher_is_better") else "≤ (1 / level) × "
        blocks += [("text", f"Time to quality: the first validation with {metric} {cmp}baseline's mean final validation "
                            f"{metric} ({t['baseline_final']:.4g}); targets "
                            + ", ".join(f"{float(q):.0%}: {v:.4g}" for q, v in t["targets"].items())
                            + ". Training seconds and FLOPs at that validation: mean [95% t interval] over the seeds that reached it."),
                   ("table", (header, rows))]
    if plots_wanted():
        blocks.append(("image", ("convergence.png", convergence_plot(t, metric),
                                 f"validation {metric} against training seconds per method, AUCC in the legend")))
    if t.get("left_out"):
        blocks.append(("text", f"Left out (their validations do not record training seconds): {', '.join(t['left_out'])}."))
    return [("Time to quality (AUCC)", blocks)]


def convergence_plot(section: Mapping[str, Any], metric: str) -> bytes:
    """PNG: validation ``metric`` against training seconds, one step-wise line per seed in its
    method's colour, the method's mean AUCC (seconds) in the legend, the common budget dashed."""

    from matplotlib.figure import Figure  # here: matplotlib only when a report draws this plot (~0.6 s)

    from oelm.report.plots import figure_png, method_colors

    fig = Figure(figsize=(8, 4.8))
    ax = fig.subplots()
    colors = method_colors(list(section["methods"]))
    for name, m in section["methods"].items():
        mean = m["aucc_seconds"].get("mean")
        label = f"{name} (AUCC {mean:.3f})" if mean is not None else name
        for i, curve in enumerate(m["curves"].values()):
            ax.plot([p[0] for p in curve], [p[2] for p in curve], drawstyle="steps-post", color=colors[name],
                    alpha=0.8, lw=1.3, label=label if i == 0 else None)
    if section["common_budget"].get("seconds"):
        ax.axvline(section["common_budget"]["seconds"], color="0.4", ls="--", lw=1, label="common budget")
    if metric == "perplexity":
        ax.set_yscale("log")
    ax.set_xlabel("training seconds (steps and data stalls; validation excluded)")
    ax.set_ylabel(f"validation {metric}" + (" (%)" if metric == "accuracy" else ""))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return figure_png(fig)
