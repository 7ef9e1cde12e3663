"""Uncertainty over seeds x test examples: what the final runs' saved predictions
(:mod:`oelm.records.predictions`) add to the seed-only intervals of :mod:`oelm.report.stats`.

Pure functions on arrays:

* :func:`hierarchical_bootstrap` — a percentile bootstrap of a method's gap to baseline that
  resamples seeds and test examples, paired by seed and by example;
* :func:`paired_interval` — the interval oelm reports: the seeds' Student-t half-width and the
  test set's (from its bootstrap SE) added in quadrature;
* :func:`interval_p_value` — the p-value of that same interval (the α at which it reaches 0);
* :func:`mcnemar` — McNemar's test of two classifiers on the same examples (one seed pair);
* :func:`seeds_needed` — the power line: seeds for a ± x interval at the observed spread.

:func:`uncertainty_comparison` builds ``comparison.json``'s ``uncertainty`` section from a
matrix's runs (present only when a final run saved predictions), and :func:`uncertainty_blocks`
the report's table from it.

The gap. Classification: accuracy points, method − baseline. Language modelling: the perplexity
ratio method / baseline (token-weighted over the resampled documents), and beside it the mean
per-document loss difference (nats). Per seed ``s`` on example weights ``w`` (how often each
example was drawn): ``g_s = f(sum_i w_i (y_method,s,i − y_base,s,i) / sum_i w_i n_i)``, with
``y`` = correct (0/1), ``n`` = 1 and ``f(x) = 100 x`` for accuracy; ``y`` = a document's summed
NLL, ``n`` = its tokens and ``f = exp`` for the perplexity ratio. The gap is the mean of ``g_s``
over the seeds both methods ran (with every weight 1 for the point estimate).

The interval (:func:`paired_interval`). Two sources of error, crossed: the seeds (k per-seed gaps
``g_s``, sample std ``s``) and the test set (one sample of N examples every run saw: ``SE_test``,
the bootstrap SE of the gap with the seeds held fixed, times ``sqrt(N / (N − 1))`` because a
bootstrap's variance of a mean is ``(N − 1) / N`` of the unbiased one). Each gets its own Student-t
half-width and the two add in quadrature::

    gap ± sqrt( (t(0.975, k − 1) · s / √k)²  +  (t(0.975, N − 1) · SE_test)² )

With SE_test = 0 this is the Student-t interval over seeds, and it is never narrower than that
interval nor than the test set's alone: more sources of error never shrink it. A test set of few
examples (2 held-out books) counts with its own few degrees of freedom. (The Welch–Satterthwaite
combination, one t on the summed variances, gives more degrees of freedom than the seeds have and
can come out narrower than the seed-only interval at k = 3; so can a percentile bootstrap that
resamples the seeds, which from 2-5 seeds draws only a handful of distinct seed sets and shrinks
their variance by (k − 1) / k: on variants-sst2's 3 seeds it was 3.7 points wide where the seed-only
t interval was 5.4. That bootstrap is kept beside the interval, as ``bootstrap``, not used as it.)

The bootstrap. Each replicate draws ``k`` seeds with replacement from the ``k`` seed pairs, and
``N`` examples with replacement from the ``N`` test examples; the replicate's gap is the mean of
``g_s`` over the drawn seeds. The test split is one sample shared by every run, so examples are
*crossed* with seeds, not nested in them: by default (``example_draw="shared"``) one example draw
per replicate is applied to every seed and both methods. Drawing examples afresh for each drawn
seed (``"per_seed"``, the nested hierarchical bootstrap of Saravanan et al. 2020, "Application of
the hierarchical bootstrap to multi-level data in neuroscience") would divide the test set's
sampling variance by the number of seeds, although every seed saw the same examples. The interval
is the percentile interval of the replicates (numpy's linear interpolation).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import numpy as np

from oelm.errors import OELMError
from oelm.records import MatrixFolder, RunRecord
from oelm.records.predictions import RunPredictions, read_predictions
from oelm.report.stats import sound_runs, summarize

__all__ = [
    "BOOTSTRAP_REPLICATES", "hierarchical_bootstrap", "paired_interval", "interval_p_value", "mcnemar", "seeds_needed",
    "paired_outcomes", "uncertainty_comparison", "uncertainty_blocks",
]

#: Replicates of the report's bootstrap (Monte Carlo error of a 95% interval's ends ~1% of its width).
BOOTSTRAP_REPLICATES = 10_000
#: The power line's target half-width: accuracy points, or the perplexity ratio's distance from its value.
TARGET_HALF_WIDTH = {"accuracy": 1.0, "perplexity": 0.01}

_TRANSFORMS = {"identity": lambda x: x, "points": lambda x: 100.0 * x, "ratio": np.exp}


def hierarchical_bootstrap(numerators: np.ndarray, denominators: np.ndarray | None = None, *,
                           transform: Literal["identity", "points", "ratio"] = "identity",
                           replicates: int = BOOTSTRAP_REPLICATES, confidence: float = 95.0,
                           example_draw: Literal["shared", "per_seed"] = "shared", resample_seeds: bool = True,
                           rng_seed: int = 0, chunk: int = 256) -> dict[str, Any]:
    """Percentile bootstrap of ``mean_s f(sum_i num[s, i] / sum_i den[s, i])`` over seeds x examples
    (module docstring).

    Args:
        numerators: (k seeds, N examples) paired differences, method − baseline, example i of
            seed s in the same column for every seed (correct_m − correct_b; summed NLL difference).
        denominators: (k, N) or (N,) weights (tokens per document); None: ones.
        transform: ``f``: ``"points"`` (100 x, accuracy points), ``"ratio"`` (exp: a perplexity
            ratio from a mean log-ratio) or ``"identity"``.
        example_draw: ``"shared"`` (one draw of the N examples per replicate for all seeds) or
            ``"per_seed"`` (a fresh draw for each drawn seed).
        resample_seeds: False keeps the k seeds in every replicate (examples only: the test set's
            share of the uncertainty).
        rng_seed: seed of ``numpy.random.default_rng`` (the result is reproducible).

    Returns:
        ``{"estimate", "ci": [low, high], "confidence", "se" (std of the replicates), "replicates",
        "example_draw", "resample_seeds", "n_seeds", "n_examples"}``.

    Raises:
        ValueError: empty or mismatched arrays, or an unknown option.
    """
    num = np.atleast_2d(np.asarray(numerators, dtype=np.float64))
    den = None if denominators is None else np.broadcast_to(np.asarray(denominators, dtype=np.float64), num.shape)
    k, n = num.shape
    if k == 0 or n == 0 or transform not in _TRANSFORMS or example_draw not in ("shared", "per_seed") or replicates < 1:
        raise ValueError(f"bootstrap needs k, N >= 1 (got {k}, {n}), a transform of {sorted(_TRANSFORMS)}, "
                         f"example_draw 'shared' or 'per_seed' and replicates >= 1")
    f = _TRANSFORMS[transform]
    rng = np.random.default_rng(rng_seed)
    reps = np.empty(replicates)
    # Integer-valued data (a classifier's correct_m − correct_b; token counts) sums exactly in any order,
    # so a replicate's sums can come from how often it drew each example (a matrix product) instead of
    # gathering the N drawn columns: the same bits, ~5x faster (SST-2's 1,821 examples x 5 seeds).
    counted = _sums_exactly(num, n) and (den is None or _sums_exactly(den, n))
    for start in range(0, replicates, chunk):
        b = min(chunk, replicates - start)
        seeds = rng.integers(0, k, size=(b, k)) if resample_seeds else np.broadcast_to(np.arange(k), (b, k))
        if example_draw == "shared":
            picks = rng.integers(0, n, size=(b, n))  # one draw of N examples per replicate, for every seed
            if counted:
                counts = np.bincount((np.arange(b)[:, None] * n + picks).ravel(), minlength=b * n).reshape(b, n)
                counts = counts.astype(np.float64).T  # (N, b): how often replicate j drew example i
                per_seed = f((num @ counts).T / (n if den is None else (den @ counts).T))  # (b, k)
            else:
                per_seed = f(num[:, picks].sum(axis=2).T / (n if den is None else den[:, picks].sum(axis=2).T))
            reps[start:start + b] = np.take_along_axis(per_seed, seeds, axis=1).mean(axis=1)
        else:
            picks = rng.integers(0, n, size=(b, k, n))  # a fresh draw for each drawn seed
            rows = seeds[:, :, None]
            reps[start:start + b] = f(num[rows, picks].sum(axis=2) / (n if den is None else den[rows, picks].sum(axis=2))).mean(axis=1)
    tail = (100.0 - confidence) / 2
    low, high = (float(x) for x in np.percentile(reps, [tail, 100.0 - tail]))
    whole = num.sum(1) / (n if den is None else den.sum(1))
    return {"estimate": float(np.mean(f(whole))), "ci": [low, high], "confidence": confidence,
            "se": float(reps.std(ddof=1)) if replicates > 1 else 0.0, "replicates": replicates,
            "example_draw": example_draw, "resample_seeds": resample_seeds, "n_seeds": k, "n_examples": n}


def _sums_exactly(values: np.ndarray, n: int) -> bool:
    """Whether every sum of ``n`` draws of ``values`` (float64) is exact whatever the order: integer
    values whose largest possible sum stays below 2**53."""
    biggest = float(np.abs(values).max()) if values.size else 0.0
    return bool(np.all(values == np.round(values))) and biggest * n < 2.0 ** 53


def _half_widths(seed_std: float, seeds: int, test_se: float, examples: int | None,
                 confidence: float) -> tuple[float, float]:
    """The two Student-t half-widths :func:`paired_interval` adds in quadrature (and
    :func:`seeds_needed` plans with): ``t(q, k − 1) · s / √k`` for ``seeds`` = k and ``t(q, N − 1) ·
    SE_test`` for ``examples`` = N (None or N < 2: a normal quantile)."""
    from scipy import stats as st  # here, not at import (see mcnemar)

    q = 1 - (1 - confidence / 100) / 2
    test_q = st.norm.ppf(q) if examples is None or examples < 2 else st.t.ppf(q, examples - 1)
    return float(st.t.ppf(q, seeds - 1)) * seed_std / math.sqrt(seeds), float(test_q) * test_se


def paired_interval(numerators: np.ndarray, denominators: np.ndarray | None = None, *,
                    transform: Literal["identity", "points", "ratio"] = "identity",
                    replicates: int = BOOTSTRAP_REPLICATES, confidence: float = 95.0) -> dict[str, Any]:
    """The seeds × examples interval of a gap (module docstring, "The interval"): the k per-seed
    gaps' Student-t half-width and the test set's (its bootstrap SE, N − 1 degrees of freedom),
    added in quadrature.

    Args:
        numerators, denominators, transform: as :func:`hierarchical_bootstrap` ((k seeds, N examples)).

    Returns:
        ``{"estimate", "ci" ([low, high]; None with fewer than 2 seeds or 2 examples), "half_width",
        "seed_half_width" (t(k − 1) · s / √k), "test_half_width" (t(N − 1) · SE_test), "seed_gaps" (k,
        in the unit), "seed_std" (sample std; None for one seed), "test_se" (the bootstrap SE with the
        seeds fixed, × sqrt(N / (N − 1))), "n_seeds", "n_examples", "confidence", "bootstrap" ({"ci",
        "se"}: the percentile bootstrap over seeds and examples, kept for comparison)}``.

    Raises:
        ValueError: as :func:`hierarchical_bootstrap`.
    """
    boot = hierarchical_bootstrap(numerators, denominators, transform=transform, replicates=replicates,
                                  confidence=confidence)
    test_only = hierarchical_bootstrap(numerators, denominators, transform=transform, confidence=confidence,
                                       replicates=max(1000, replicates // 5), resample_seeds=False, rng_seed=1)
    num = np.atleast_2d(np.asarray(numerators, dtype=np.float64))
    k, n = num.shape
    den = n if denominators is None else np.broadcast_to(np.asarray(denominators, dtype=np.float64), num.shape).sum(1)
    gaps = _TRANSFORMS[transform](num.sum(1) / den)
    test_se = test_only["se"] * math.sqrt(n / (n - 1)) if n > 1 else None
    out: dict[str, Any] = {"estimate": float(gaps.mean()), "ci": None, "half_width": None, "seed_half_width": None,
                           "test_half_width": None, "seed_gaps": [float(g) for g in gaps],
                           "seed_std": float(gaps.std(ddof=1)) if k > 1 else None, "test_se": test_se,
                           "n_seeds": k, "n_examples": n, "confidence": confidence,
                           "bootstrap": {"ci": boot["ci"], "se": boot["se"]}}
    if k < 2 or test_se is None:
        return out
    seed_half, test_half = _half_widths(out["seed_std"], k, test_se, n, confidence)
    half = math.hypot(seed_half, test_half)
    return out | {"ci": [out["estimate"] - half, out["estimate"] + half], "half_width": half,
                  "seed_half_width": seed_half, "test_half_width": test_half}


#: The smallest p :func:`interval_p_value` resolves; a smaller one is returned as this bound.
P_FLOOR = 1e-12


def interval_p_value(gap: float, seed_std: float | None, seeds: int, test_se: float | None,
                     examples: int | None) -> float | None:
    """Two-sided p of "no difference" from the seeds × examples interval itself: the α whose (1 − α)
    interval of :func:`paired_interval` just reaches the null, i.e. the root of
    ``sqrt((t(1 − α/2, k − 1) · s/√k)² + (t(1 − α/2, N − 1) · SE_test)²) = |gap|`` (``scipy.optimize.brentq``
    on :func:`_half_widths`, the interval's own formula). So ``p < α`` exactly when the (1 − α)
    interval excludes the null, and a verdict's p and interval come from one model. With
    ``test_se`` = 0 it is the paired t-test's p over the k per-seed gaps.

    Args:
        gap: the estimate's distance from the null, in the interval's unit (accuracy points; for a
            perplexity ratio, ratio − 1).
        seed_std, seeds, test_se, examples: the interval's ``seed_std``, ``n_seeds``, ``test_se`` and
            ``n_examples`` (:func:`paired_interval`).

    Returns:
        p in [:data:`P_FLOOR`, 1] (a smaller p is returned as :data:`P_FLOOR`, an upper bound); 1.0
        for a zero gap; None with fewer than 2 seeds or an unknown spread (no interval either).
    """
    from scipy.optimize import brentq  # here, not at import (see mcnemar)

    if seeds < 2 or seed_std is None or test_se is None or not math.isfinite(gap):
        return None
    if gap == 0.0:
        return 1.0

    def excess(alpha: float) -> float:  # half-width of the (1 − α) interval beyond |gap|; falls as α grows
        return math.hypot(*_half_widths(seed_std, seeds, test_se, examples, 100.0 * (1.0 - alpha))) - abs(gap)

    if excess(P_FLOOR) <= 0.0:
        return P_FLOOR
    return float(brentq(excess, P_FLOOR, 1.0, xtol=P_FLOOR * 1e-3))


def mcnemar(baseline_correct: Sequence[bool], method_correct: Sequence[bool]) -> dict[str, Any]:
    """McNemar's test of two classifiers on the same examples (McNemar 1947).

    ``b`` = examples baseline gets right and the method wrong, ``c`` = the reverse; under the null
    hypothesis (equal accuracy) each of the ``b + c`` discordant examples is either kind with
    probability 1/2. ``p_exact``: the two-sided exact binomial test of ``c`` in ``b + c``
    (``scipy.stats.binomtest``; the one the report shows, valid for any count); ``p_chi2_cc``: the
    chi-square approximation with Edwards' continuity correction, ``(|b − c| − 1)^2 / (b + c)``
    on 1 degree of freedom (``scipy.stats.chi2.sf``; poor for ``b + c < 25``). No discordant
    example: both p-values are 1.

    Returns:
        ``{"b", "c", "n_discordant", "p_exact", "chi2_cc", "p_chi2_cc"}``.

    Raises:
        ValueError: the arrays differ in length.
    """
    from scipy import stats as st  # here, not at import: a report without predictions needs no scipy (~1 s)

    base, other = np.asarray(baseline_correct, dtype=bool), np.asarray(method_correct, dtype=bool)
    if base.shape != other.shape:
        raise ValueError(f"McNemar needs paired outcomes, got {base.shape} and {other.shape}")
    b, c = int(np.sum(base & ~other)), int(np.sum(~base & other))
    if b + c == 0:
        return {"b": 0, "c": 0, "n_discordant": 0, "p_exact": 1.0, "chi2_cc": 0.0, "p_chi2_cc": 1.0}
    chi2 = max(abs(b - c) - 1, 0) ** 2 / (b + c)
    return {"b": b, "c": c, "n_discordant": b + c, "p_exact": float(st.binomtest(c, b + c, 0.5).pvalue),
            "chi2_cc": float(chi2), "p_chi2_cc": float(st.chi2.sf(chi2, 1))}


def seeds_needed(seed_std: float | None, half_width: float, *, test_se: float = 0.0, test_examples: int | None = None,
                 confidence: float = 95.0, max_seeds: int = 1000) -> int | None:
    """The power line: the fewest seeds ``n >= 2`` whose interval of a gap (:func:`paired_interval`)
    has half-width at most ``half_width``, at the observed between-seed spread ``seed_std`` (sample
    std of the per-seed gaps) and the test set's own standard error ``test_se`` (which more seeds
    cannot shrink): ``sqrt((t(1 − α/2, n − 1) · seed_std / √n)² + (t(1 − α/2, N − 1) · test_se)²) <=
    half_width``, N = ``test_examples`` (None: a normal quantile for the test set's part). None when
    no ``n <= max_seeds`` reaches it (in particular when the test set's part alone exceeds
    ``half_width``) or ``seed_std`` is unknown.
    """
    if seed_std is None or not math.isfinite(seed_std) or half_width <= 0:
        return None
    if _half_widths(seed_std, 2, test_se, test_examples, confidence)[1] >= half_width:
        return None
    for n in range(2, max_seeds + 1):
        if math.hypot(*_half_widths(seed_std, n, test_se, test_examples, confidence)) <= half_width:
            return n
    return None


def paired_outcomes(baseline: Mapping[int, Mapping[str, np.ndarray]], method: Mapping[int, Mapping[str, np.ndarray]],
                    task_type: str) -> dict[str, np.ndarray]:
    """Numerators and denominators for :func:`hierarchical_bootstrap` from two methods' saved
    predictions of one split (seed -> columns), seeds in sorted order, examples (or documents)
    sorted by their index and aligned across seeds and methods.

    Returns:
        Classification: ``{"baseline_correct", "method_correct"}`` (k, N) bool and ``"numerators"``
        (their difference). LM: ``"numerators"`` (summed-NLL differences), ``"denominators"``
        (tokens), ``"document_loss"`` (mean-NLL differences per document).

    Raises:
        ValueError: the seeds do not hold the same examples (not the same data).
    """
    key = "index" if task_type == "classification" else "document"
    seeds = sorted(set(baseline) & set(method))
    reference = np.sort(baseline[seeds[0]][key])
    rows: dict[str, list[np.ndarray]] = {}
    for s in seeds:
        for who, cols in (("baseline", baseline[s]), ("method", method[s])):
            order = np.argsort(cols[key], kind="stable")
            if not np.array_equal(cols[key][order], reference):
                raise ValueError(f"seed {s}: the {who}'s saved {key}s differ from baseline seed {seeds[0]}'s (not the same data)")
            for column, values in cols.items():
                rows.setdefault(f"{who}/{column}", []).append(np.asarray(values)[order])
    a = {k: np.stack(v) for k, v in rows.items()}
    if task_type == "classification":
        base_ok, method_ok = a["baseline/label"] == a["baseline/prediction"], a["method/label"] == a["method/prediction"]
        return {"baseline_correct": base_ok, "method_correct": method_ok,
                "numerators": method_ok.astype(np.float64) - base_ok.astype(np.float64)}
    tokens = a["baseline/tokens"].astype(np.float64)
    return {"numerators": (a["method/loss"] - a["baseline/loss"]) * tokens, "denominators": tokens,
            "document_loss": a["method/loss"] - a["baseline/loss"]}


# --- the comparison's section ------------------------------------------------------------------

def _read_all(results: Mapping[str, list[RunRecord]], comparison: dict[str, Any], out: Path,
              notes: list[str]) -> dict[str, dict[int, RunPredictions]]:
    """method -> seed -> saved predictions, for the sound seeds; damaged files become notes."""
    found: dict[str, dict[int, RunPredictions]] = {}
    for name, r in sound_runs(results, comparison):
        try:
            p = read_predictions(MatrixFolder(out).run(r.name).path, r)
        except OELMError as exc:
            notes.append(f"{name} seed {r.seed}: {exc}")
            continue
        if p is not None:
            found.setdefault(name, {})[r.seed] = p
    return found


def _seed_gaps(results: Mapping[str, list[RunRecord]], name: str, split: str, higher: bool) -> dict[int, float]:
    """Per seed the gap from result.json values (accuracy points, or perplexity ratio)."""
    def values(m):
        return {r.seed: r.test if split == "test" else r.best_validation for r in results.get(m, []) if r.finished}

    base, mine = values("baseline"), values(name)
    out = {}
    for s in sorted(set(base) & set(mine)):
        b, m = base[s], mine[s]
        if isinstance(b, (int, float)) and isinstance(m, (int, float)) and b:
            out[s] = m - b if higher else m / b
    return out


def _method_entry(name: str, seeds: list[int], preds: dict, split: str, task_type: str, metric: str,
                  seed_gaps: dict[int, float], replicates: int) -> dict[str, Any]:
    """One method's row: the seeds x examples interval when both methods saved predictions of
    ``split`` for every seed, else the seed-only interval (with the reason)."""
    seed_only = summarize([seed_gaps[s] for s in seeds if s in seed_gaps])
    entry: dict[str, Any] = {"seeds": seeds, "seed_only": {k: seed_only[k] for k in ("mean", "std", "n", "ci95")}}
    have = [s for s in seeds if s in preds.get(name, {}) and s in preds.get("baseline", {})
            and preds[name][s].split(split) is not None and preds["baseline"][s].split(split) is not None]
    if not seeds or have != seeds:
        missing = sorted(set(seeds) - set(have))
        return entry | {"interval": "seed-only interval", "gap": seed_only["mean"], "ci95": seed_only["ci95"],
                        "reason": f"no saved {split} predictions for seed(s) {', '.join(map(str, missing)) or '–'}"}
    try:
        paired = paired_outcomes({s: preds["baseline"][s].split(split) for s in seeds},
                                 {s: preds[name][s].split(split) for s in seeds}, task_type)
    except ValueError as exc:
        return entry | {"interval": "seed-only interval", "gap": seed_only["mean"], "ci95": seed_only["ci95"], "reason": str(exc)}
    transform = "points" if task_type == "classification" else "ratio"
    both = paired_interval(paired["numerators"], paired.get("denominators"), transform=transform, replicates=replicates)
    half = TARGET_HALF_WIDTH.get(metric, 1.0)
    distance = abs(both["estimate"] - 1.0) if transform == "ratio" else abs(both["estimate"])  # from "no difference"
    test_se = both["test_se"] or 0.0
    entry |= {"interval": "seeds × examples", "gap": both["estimate"], "ci95": both["ci"],
              "half_width": {"seeds": both["seed_half_width"], "test": both["test_half_width"]},
              "examples": both["n_examples"], "test_se": both["test_se"],
              "bootstrap": {"ci95": both["bootstrap"]["ci"], "se": both["bootstrap"]["se"]},
              "power": {"seed_std": seed_only["std"], "target_half_width": half,
                        "seeds_needed": seeds_needed(seed_only["std"], half, test_se=test_se, test_examples=both["n_examples"]),
                        "seeds_needed_to_resolve_gap": seeds_needed(seed_only["std"], distance, test_se=test_se,
                                                                    test_examples=both["n_examples"])}}
    if task_type == "classification":
        entry["mcnemar"] = [{"seed": s, **mcnemar(paired["baseline_correct"][i], paired["method_correct"][i])}
                            for i, s in enumerate(seeds)]
    else:
        doc = paired_interval(paired["document_loss"], replicates=replicates)
        entry["document_loss"] = {"gap": doc["estimate"], "ci95": doc["ci"]}
    return entry


def uncertainty_comparison(comparison: dict[str, Any], results: Mapping[str, list[RunRecord]], out: str | Path | None,
                           replicates: int = BOOTSTRAP_REPLICATES) -> dict[str, Any]:
    """``{"uncertainty": {...}}`` for ``comparison.json`` — or ``{}`` when no final run records saved
    predictions (results written before oelm saved them: their comparison is unchanged).

    ``uncertainty``: ``split`` ("test" when every baseline run saved one, else "validation": the
    selection split, optimistic), ``unit``, ``method`` (the procedure in words), ``replicates``,
    ``confidence`` (95), ``example_draw`` ("shared"), ``notes`` (damaged or missing prediction
    files: those runs count as without predictions) and per method but baseline: ``interval``
    ("seeds × examples" or "seed-only interval"), ``gap`` and ``ci95`` (its unit), ``seeds``,
    ``seed_only`` (mean / std / n / Student-t ci95 of the per-seed gaps from result.json),
    ``reason`` (why seed-only), and with predictions ``half_width`` (``seeds`` and ``test``: the two
    Student-t half-widths :func:`paired_interval` adds in quadrature), ``examples``, ``test_se`` (the
    bootstrap SE with the seeds held fixed, × sqrt(N / (N − 1)): the test set's share),
    ``bootstrap`` (``ci95`` and ``se`` of the percentile bootstrap over seeds and examples, kept for
    comparison), ``power`` (:func:`seeds_needed`
    for ``TARGET_HALF_WIDTH`` and for resolving the observed gap), ``mcnemar`` per seed
    (classification) or ``document_loss`` (LM: mean per-document NLL difference, nats, with its interval).
    """
    if out is None or "baseline" not in results:
        return {}
    if not any(isinstance(r.predictions, dict) for runs in results.values() for r in runs):
        return {}
    notes: list[str] = []
    preds = _read_all(results, comparison, Path(out), notes)
    base = preds.get("baseline", {})
    split = "test" if base and all(p.split("test") is not None for p in base.values()) else "validation"
    metric = comparison.get("metric") or "accuracy"
    task_type = "classification" if metric == "accuracy" else "language_modeling"
    higher = bool(comparison.get("higher_is_better"))
    included = {n: set(m.get("included_seeds") or []) for n, m in comparison["methods"].items()}
    methods = {}
    for name in comparison["methods"]:
        if name == "baseline":
            continue
        seeds = sorted(included["baseline"] & included[name])
        methods[name] = _method_entry(name, seeds, preds, split, task_type, metric,
                                      _seed_gaps(results, name, split, higher), replicates)
    unit = "accuracy points (method − baseline)" if task_type == "classification" else "perplexity ratio (method / baseline)"
    return {"uncertainty": {
        "split": split, "unit": unit, "confidence": 95.0, "replicates": replicates, "example_draw": "shared",
        "method": ("interval over seeds x examples: gap ± sqrt((t(k−1)·s/√k)² + (t(N−1)·SE_test)²), s the per-seed gaps' "
                   f"sample std, SE_test the bootstrap SE over the N {split} examples with the seeds fixed (one draw shared "
                   "by every seed and both methods: paired by seed and by example)"),
        "target_half_width": TARGET_HALF_WIDTH.get(metric, 1.0), "methods": methods, "notes": notes,
    }}


def _fmt(v: float | None, digits: int) -> str:
    return "–" if v is None else f"{v:+.{digits}f}"


def _interval(ci: Sequence[float] | None, digits: int, signed: bool = True) -> str:
    sign = "+" if signed else ""
    return "n/a" if not ci else f"[{ci[0]:{sign}.{digits}f}, {ci[1]:{sign}.{digits}f}]"


def uncertainty_blocks(comparison: dict[str, Any]) -> list[tuple[str, list[tuple[str, Any]]]]:
    """The report's section for ``comparison["uncertainty"]``: ``[(title, blocks)]`` with blocks
    ``("text", str)`` / ``("table", (header, rows))`` as :class:`oelm.report.render.Section`
    holds them; [] without the section."""
    u = comparison.get("uncertainty")
    if not u:
        return []
    ratio = "ratio" in u["unit"]
    digits = 4 if ratio else 2
    header = ["method", "seeds", "examples", f"Δ {u['split']} ({'ratio' if ratio else 'points'})", "95% interval",
              "interval covers", "seed-only 95% CI (t)", "test-set SE", "McNemar p (exact), per seed" if not ratio
              else "Δ doc loss (nats) [95%]", f"seeds for ±{u['target_half_width']:g}", "seeds to resolve Δ"]
    rows = []
    for name, m in u["methods"].items():
        power = m.get("power") or {}
        if ratio:
            extra = "–" if "document_loss" not in m else (f"{m['document_loss']['gap']:+.4f} "
                                                          f"{_interval(m['document_loss']['ci95'], 4)}")
        else:
            extra = ", ".join(f"s{x['seed']}: {x['p_exact']:.3g} ({x['c']}↑/{x['b']}↓)" for x in m.get("mcnemar") or []) or "–"
        rows.append([name, str(len(m["seeds"])), str(m.get("examples", "–")),
                     (f"{m['gap']:.4f}" if ratio and m.get("gap") is not None else _fmt(m.get("gap"), digits)),
                     _interval(m.get("ci95"), digits, not ratio), m["interval"], _interval(m["seed_only"]["ci95"], digits, not ratio),
                     "–" if m.get("test_se") is None else f"{m['test_se']:.{digits}f}", extra,
                     str(power.get("seeds_needed") or "–") if power else "–",
                     str(power.get("seeds_needed_to_resolve_gap") or "–") if power else "–"])
    text = (f"Gap to baseline on the {u['split']} split in {u['unit']}, with a 95% {u['method']}; "
            f"{u['replicates']:,} bootstrap replicates. Each source of error gets its own Student-t factor, so the "
            "interval is never narrower than the seeds' own t interval, and a test set of few examples (2 books) "
            "widens it as it should; a percentile bootstrap that resamples 3 or 5 seeds can come out narrower than "
            "the seed-only interval, so comparison.json keeps it only for comparison (`bootstrap`). \"seed-only "
            "interval\": that method has no saved predictions for every seed, so its interval is the Student-t "
            "interval over seeds alone (it leaves out the test set's sampling error). Test-set SE: SE_test. "
            + ("McNemar: exact two-sided binomial test of the discordant examples per seed pair (↑ method right where "
               "baseline was wrong, ↓ the reverse); the chi-square version with continuity correction is in comparison.json. "
               if not ratio else "Δ doc loss: the mean per-document NLL difference (nats) with its bootstrap interval. ")
            + f"Seeds for ±{u['target_half_width']:g}: the fewest seeds whose interval would have that half-width at the "
            "observed between-seed spread plus the test set's SE (– when more seeds cannot get there); seeds to resolve Δ: "
            "the same for a half-width of the observed gap.")
    blocks: list[tuple[str, Any]] = [("text", text), ("table", (header, rows))]
    if u["split"] == "validation":
        blocks.append(("text", "No test split was saved: these intervals are on the validation split, which also "
                               "selected each run's best step, so they are optimistic."))
    if u.get("notes"):
        blocks.append(("list", list(u["notes"])))
    return [("Uncertainty over seeds × test examples", blocks)]
