"""oelm's verdict on each quantitative claim of the original OELM project, from committed results.

The claims table that opens ``docs/results/README.md`` is *computed* here from the committed
comparisons (``docs/results/<name>/comparison.json``, and their runs' ``predictions.npz``), the
committed benchmarks (``docs/results/bench-cpu/*.json``; ``docs/results/gpu-*/bench-*.json`` of
committed GPU checks; :mod:`research.claims_rows`), never typed by hand;
``tests/test_claims.py`` checks that the README's table is exactly what :func:`claims_markdown`
writes. The claims themselves are listed in :mod:`research.claims_list`. Update it with::

    python -m research.claims docs/results --update docs/results/README.md

Our gap (:func:`measure`): ``method − reference`` over the seeds both ran, in accuracy points or,
for perplexity, percent of the reference (``100 (method / reference − 1)``), with a 95% interval
and the p-value of **the same model** ("no difference"):

* **seeds × examples** where both methods' runs saved predictions of the split
  (:func:`oelm.report.uncertainty.paired_interval`, paired by seed and by example: the seeds'
  Student-t half-width and the test set's, from its bootstrap SE, added in quadrature; it covers
  the test set's sampling error as well as the seeds'). Its p is that interval inverted
  (:func:`oelm.report.uncertainty.interval_p_value`): the α whose (1 − α) interval just reaches 0,
  so p < 0.05 exactly when the 95% interval excludes 0. Classification rows also show McNemar's
  exact test per seed (the reference's and the method's runs of one seed on the same examples,
  McNemar 1947), beside the verdict, not in it; the seeds are not pooled into one test (a
  Mantel–Haenszel or pooled exact test over seeds, Mantel & Haenszel 1959), because every seed
  saw the same test examples: the k tables are not independent strata, and pooling would count
  each example k times and leave out the spread between seeds;
* **seed-only** otherwise (results written before oelm saved predictions): the paired Student-t
  interval over seeds and the paired t-test's p (:func:`oelm.report.stats.paired_difference`),
  which is the same inversion with no test-set term.

**Multiplicity** (:func:`measure_all`): the p-values are Holm-adjusted (:func:`oelm.report.stats.holm`)
within each family of rows (:attr:`Claim.family`): the original's claims (rows with a claimed gap,
the original's and the second-dataset ones) and our questions (the "(ours)" rows). The verdict
calls a gap *significant* when its Holm-adjusted p is below :data:`ALPHA` (0.05); whether the
claimed gap lies in our interval is read from the unadjusted 95% interval. Rows without a p (not
testable, pending, parameter counts, benchmark rows) are in no family.

Verdict rule (:func:`verdict`) for a claimed gap ``g`` against our interval ``[lo, hi]``:

==============================================  ==============================================
our gap                                         verdict
==============================================  ==============================================
significant, same sign as g, interval has g     reproduced
significant, same sign as g, interval misses g  direction reproduced, size smaller / larger
significant, opposite sign                      opposite direction at <scale>
not significant, interval has g                 inconclusive at n seeds
not significant, interval misses g              not reproduced at <scale>
==============================================  ==============================================

Each verdict carries its scale ("reproduced at 22.7M parameters": the reference model's parameters
in that comparison), since ours are small models. Our own questions, which the original did not
ask (the research matrices' controls), get a two-sided verdict (:func:`difference_verdict`):
"differs" when the gap is significant, else "no difference resolved".

A verdict is **fragile** (:func:`fragile`), and says so among its caveats, when it rests on
``n <= 3`` seeds and an end of its interval lies within 0.25 (points or % perplexity) of 0, or when
the p its verdict uses (Holm-adjusted) lies in [0.01, 0.1): one more seed or another test sample
could flip it.

Claims whose data or scale this machine cannot reach say so ("not testable here") with the reason;
claims whose committed run does not exist yet say "pending (running in the background)" and the
config that produces it.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any, Iterable

from oelm.records import MatrixFolder
from oelm.report.render import _num, _p, _signed  # the report's number formats
from research.claims_list import CLAIMS, ORIGINAL, OURS, RESEARCH, Claim  # noqa: F401 - the table's public names
from research.claims_rows import (  # noqa: F401 - PUBLISHED_MINILM_L6_SST2, anchor_row: the table's public names
    PUBLISHED_MINILM_L6_SST2, anchor_row, bench_row, per_step_row, read_json, speed_rows, stability_row, trainable_rows,
)

BEGIN = "<!-- claims:begin (written by python -m research.claims; do not edit by hand) -->"
END = "<!-- claims:end -->"
#: A gap is significant when its Holm-adjusted p is below this (the 95% interval's level).
ALPHA = 0.05
#: An interval end this close to 0 (points, or % perplexity) with n <= 3 seeds makes a verdict fragile.
FRAGILE_END = 0.25
#: A (Holm-adjusted) p in [FRAGILE_P[0], FRAGILE_P[1]) makes a verdict fragile.
FRAGILE_P = (0.01, 0.1)


def _significant(ci: list[float], p: float | None) -> bool:
    """``p < ALPHA``; without a p (identical per-seed gaps), whether ``ci`` excludes 0."""
    return p < ALPHA if p is not None else not ci[0] <= 0.0 <= ci[1]


def verdict(gap: float, ci: list[float] | None, n: int, scale: str | None = None, p: float | None = None) -> str:
    """The verdict of the module docstring's table for claimed ``gap``, our 95% interval ``ci`` and
    the p the verdict uses (``p``: Holm-adjusted in the table; None: whether ``ci`` excludes 0),
    said at ``scale`` (e.g. "22.7M parameters") when given. The sign of our gap is that of the
    interval's centre (both intervals are symmetric about the gap)."""
    if ci is None or n < 2:
        return f"not decidable (n = {n} seeds)"
    at = f" at {scale}" if scale else ""
    lo, hi = ci
    if not _significant(ci, p):
        return f"inconclusive at n = {n}" + (f", {scale}" if scale else "") if lo <= gap <= hi else f"not reproduced{at}"
    if (lo + hi > 0) != (gap > 0):
        return f"opposite direction{at}"
    if lo <= gap <= hi:
        return f"reproduced{at}"
    return f"direction reproduced{at}, size " + ("smaller" if abs(gap) > max(abs(lo), abs(hi)) else "larger")


def difference_verdict(ci: list[float] | None, n: int, scale: str, method: str, reference: str, higher_is_better: bool,
                       p: float | None = None) -> str:
    """A two-sided question's verdict: ``method`` better or worse than ``reference`` when the gap
    ``method − reference`` is significant (``p`` below :data:`ALPHA`; None: the 95% interval ``ci``
    excludes 0), else no difference resolved (at ``n`` seeds)."""
    if ci is None or n < 2:
        return f"not decidable (n = {n} seeds)"
    lo, hi = ci
    if not _significant(ci, p):
        return f"no difference resolved at n = {n}, {scale}"
    better = (lo + hi > 0) == higher_is_better
    return f"differs at {scale}: {method} {'better' if better else 'worse'} than {reference}"


def fragile(m: dict[str, Any]) -> list[str]:
    """Why a measured verdict is fragile (module docstring): n <= 3 with an interval end within
    :data:`FRAGILE_END` of 0, or the p its verdict uses (``p_holm``, else ``p_value``) in
    :data:`FRAGILE_P`; [] when it is not."""
    reasons = []
    ci = m.get("ci95")
    p, name = (m["p_holm"], "Holm-adjusted p") if m.get("p_holm") is not None else (m.get("p_value"), "p")
    if ci and m["n"] <= 3 and min(abs(ci[0]), abs(ci[1])) < FRAGILE_END:
        reasons.append(f"n = {m['n']} and the interval ends {min(abs(ci[0]), abs(ci[1])):.2f} from 0")
    if p is not None and FRAGILE_P[0] <= p < FRAGILE_P[1]:
        reasons.append(f"{name} = {p:.3f}")
    return reasons


def _per_seed(comparison: dict[str, Any], method: str, field: str) -> dict[int, float]:
    m = comparison["methods"].get(method)
    if not m:
        return {}
    keep = set(m["included_seeds"])
    return {r["seed"]: r[field] for r in m["runs"] if r["seed"] in keep and r.get(field) is not None}


def _scale(comparison: dict[str, Any], method: str) -> str | None:
    """"22.7M parameters": the total parameters of ``method``'s model in ``comparison``."""
    total = ((comparison["methods"].get(method) or {}).get("parameters") or {}).get("total")
    return f"{total / 1e6:.1f}M parameters" if total else None


def _rates(comparison: dict[str, Any], claim: Claim) -> str:
    """"reservoir 0.002, baseline 0.001": both methods' selected learning rates (:attr:`Claim.show_rates`)."""
    rate = lambda m: (comparison["methods"].get(m) or {}).get("learning_rate")  # noqa: E731
    return ", ".join(f"{m} {rate(m):g}" for m in (claim.method, claim.reference) if rate(m) is not None)


def seeds_examples_gap(claim: Claim, results: Path, comparison: dict[str, Any], seeds: list[int]) -> dict[str, Any] | None:
    """The seeds × examples interval of ``claim.method − claim.reference`` over ``seeds`` from the
    committed runs' ``predictions.npz`` (:func:`oelm.report.uncertainty.paired_interval`, paired by
    seed and example), in the claim's unit, with its own p
    (:func:`oelm.report.uncertainty.interval_p_value`) and, for classification, McNemar's exact p
    per seed (``mcnemar``: seed order); None when a run of either method saved no predictions of
    the split, or there is one seed (then the row keeps the seed-only interval).

    Raises:
        ChecksumError / DamagedFileError / RecordedFileMissingError: a committed predictions file does not
            match its result.json (one line naming it).
    """
    from oelm.records.predictions import read_predictions  # numpy + the records: only for comparisons with predictions
    from oelm.report.uncertainty import interval_p_value, mcnemar, paired_interval, paired_outcomes

    lm = comparison.get("metric") == "perplexity"
    if not seeds or lm != claim.relative:
        return None
    split = "test" if claim.field == "test" else "validation"
    folder = MatrixFolder(results / claim.comparison)
    splits: dict[str, dict[int, Any]] = {}
    for method in (claim.reference, claim.method):
        names = {r["seed"]: r.get("run_name") for r in comparison["methods"][method]["runs"]}
        for seed in seeds:
            run = folder.run(names[seed]) if names.get(seed) else None
            record = run.read_result() if run is not None and run.result.exists() else None
            saved = read_predictions(run.path, record) if record is not None else None
            if saved is None or saved.split(split) is None:
                return None
            splits.setdefault(method, {})[seed] = saved.split(split)
    paired = paired_outcomes(splits[claim.reference], splits[claim.method], "language_modeling" if lm else "classification")
    both = paired_interval(paired["numerators"], paired.get("denominators"), transform="ratio" if lm else "points")
    if both["ci"] is None:
        return None
    unit = (lambda x: 100.0 * (x - 1.0)) if lm else (lambda x: x)  # noqa: E731 - % of the reference's perplexity
    p = interval_p_value(both["estimate"] - (1.0 if lm else 0.0), both["seed_std"], both["n_seeds"], both["test_se"],
                         both["n_examples"])
    tests = None if lm else [mcnemar(paired["baseline_correct"][i], paired["method_correct"][i])["p_exact"]
                             for i in range(len(seeds))]
    return {"mean": unit(both["estimate"]), "ci95": [unit(x) for x in both["ci"]], "examples": both["n_examples"],
            "p_value": p, "mcnemar": tests}


def _measured(claim: Claim, results: Path) -> dict[str, Any]:
    """:func:`measure`'s numbers for one claim, before the family's Holm adjustment and the verdict."""
    from oelm.report.stats import paired_difference  # scipy (~1 s): only when a claim is measured

    if claim.untestable:
        return {"status": "untestable", "why": claim.untestable}
    path = MatrixFolder(results / claim.comparison).comparison
    if not path.exists():
        return {"status": "pending", "config": claim.config}
    comparison = read_json(path)
    ref = _per_seed(comparison, claim.reference, claim.field)
    other = _per_seed(comparison, claim.method, claim.field)
    if claim.relative:
        other = {s: 100.0 * (other[s] / ref[s] - 1.0) for s in other if s in ref}
        ref = {s: 0.0 for s in other}
    paired = paired_difference(ref, other)
    if paired["n"] == 0:
        return {"status": "pending", "config": claim.config}
    mean = lambda d: sum(d.values()) / len(d) if d else None  # noqa: E731
    m = {"status": "measured", "n": paired["n"], "seeds": paired["seeds"], "mean": paired["mean"], "ci95": paired["ci95"],
         "p_value": paired["p_value"], "test": "paired t-test", "interval": "seed-only interval", "mcnemar": None,
         "method_mean": mean(_per_seed(comparison, claim.method, claim.field)),
         "reference_mean": mean(_per_seed(comparison, claim.reference, claim.field)),
         "scale": _scale(comparison, claim.reference), "rates": _rates(comparison, claim) if claim.show_rates else None}
    found = seeds_examples_gap(claim, results, comparison, paired["seeds"])
    if found is not None:
        m |= {"mean": found["mean"], "ci95": found["ci95"], "p_value": found["p_value"], "mcnemar": found["mcnemar"],
              "test": "seeds × examples interval inverted", "interval": "seeds × examples interval"}
    m["caveats"] = caveats(comparison, (claim.reference, claim.method))
    return m


def _judge(claim: Claim, m: dict[str, Any], p_holm: float | None) -> dict[str, Any]:
    """``m`` with ``p_holm``, ``significant``, ``verdict`` and the fragile caveat added."""
    if m["status"] != "measured":
        return m
    m = m | {"p_holm": p_holm, "caveats": list(m["caveats"])}
    m["significant"] = None if m["ci95"] is None else _significant(m["ci95"], p_holm)
    if claim.gap is None:
        m["verdict"] = difference_verdict(m["ci95"], m["n"], m["scale"] or "this scale", claim.method, claim.reference,
                                          not claim.lower_is_better, p_holm)
    else:
        m["verdict"] = verdict(claim.gap, m["ci95"], m["n"], m["scale"], p_holm)
    if fragile(m):
        m["caveats"].append("fragile: " + "; ".join(fragile(m)))
    return m


def measure_all(claims: Iterable[Claim], results: Path) -> dict[str, dict[str, Any]]:
    """:func:`measure` for each of ``claims`` (by key), with the p-values Holm-adjusted within each
    family (:attr:`Claim.family`) of the measured rows that have a p; the verdicts use the adjusted
    p (module docstring)."""
    from oelm.report.stats import holm  # with paired_difference's scipy: only when claims are measured

    claims = tuple(claims)
    measured = {c.key: _measured(c, results) for c in claims}
    adjusted: dict[str, float] = {}
    for family in (ORIGINAL, OURS):
        keys = [c.key for c in claims if c.family == family and measured[c.key].get("p_value") is not None]
        adjusted |= dict(zip(keys, holm([measured[k]["p_value"] for k in keys])))
    return {c.key: _judge(c, measured[c.key], adjusted.get(c.key)) for c in claims}


def measure(claim: Claim, results: Path) -> dict[str, Any]:
    """Our measurement of ``claim`` from the committed comparison under ``results``, as a family of
    its own (its Holm-adjusted p is its p; the table adjusts over each family: :func:`measure_all`).

    Returns ``{"status": "measured" | "pending" | "untestable", ...}``; measured adds ``n``,
    ``seeds``, ``mean``, ``ci95`` (seeds × examples where both methods saved predictions, else the
    paired t interval: ``interval`` says which), ``p_value`` (of the same model: ``test`` names it),
    ``p_holm`` (Holm-adjusted within its family), ``significant``, ``mcnemar`` (McNemar's exact p
    per seed for a classification row with predictions, else None), the two methods' means
    (``method_mean``, ``reference_mean``), ``scale``, ``rates`` (selected learning rates, where
    the claim shows them), ``verdict`` and ``caveats`` (:func:`caveats`, then :func:`fragile`'s
    reasons; the table prints them after the verdict). For relative claims the per-seed
    differences are ``100 * (method / reference − 1)`` (% of the reference's perplexity).
    """
    return measure_all((claim,), results)[claim.key]


def caveats(comparison: dict[str, Any], methods: tuple[str, ...]) -> list[str]:
    """What the comparison's report warns about ``methods`` that bears on a verdict: a selected
    learning rate on the edge of its grid (the best rate may lie outside it), runs excluded as
    collapsed, runs still improving at their last evaluation, and a grid that grew after test results
    existed. Short phrases, in method order."""
    out = []
    for name in methods:
        m = comparison["methods"].get(name) or {}
        if m.get("selected_at_grid_edge"):
            out.append(f"{name}'s learning rate is the {'lowest' if m['selected_at_grid_edge'] == 'low' else 'highest'} "
                       "of its grid")
        if m.get("excluded"):
            out.append(f"{name}: {len(m['excluded'])} run(s) excluded as collapsed")
        if (comparison.get("best_at_last_step") or {}).get(name):
            out.append(f"{name} still improving at its last evaluation in {len(comparison['best_at_last_step'][name])} seed(s)")
        for g in ((comparison.get("sweep") or {}).get("grid_growth") or {}).get(name, []):
            if g.get("tested_final_runs"):
                out.append(f"{name}'s grid grew after test results existed")
    return out


def _p_text(p: float | None) -> str:
    text = _p(p)
    return text if text.startswith("<") else f"= {text}"


def _row(claim: Claim, m: dict[str, Any]) -> str:
    """One table row of a gap claim (or question) and its measurement (:func:`measure_all`)."""
    unit = "% perplexity" if claim.relative else " points"
    original = claim.original if claim.gap is None else f"{claim.original} ({_signed(claim.gap)}{unit})"
    setting = claim.setting or "–"
    if m["status"] == "untestable":
        ours, verdict_text = "–", f"not testable here: {m['why']}"
    elif m["status"] == "pending":
        ours, verdict_text = f"pending (running in the background): `{m['config']}`", "pending"
    else:
        ci = m["ci95"] or [None, None]
        mcnemar = ("" if not m.get("mcnemar") else
                   ", McNemar p per seed " + ", ".join(_p(x) for x in m["mcnemar"]))
        ours = (f"{_num(m['reference_mean'])} → {_num(m['method_mean'])}: {_signed(m['mean'])}{unit} "
                f"[{_signed(ci[0])}, {_signed(ci[1])}], p {_p_text(m['p_value'])}, Holm p {_p_text(m['p_holm'])}"
                f"{mcnemar}, n = {m['n']} ({claim.field.replace('_', ' ')}; {m['interval']})")
        verdict_text = m["verdict"] + (f" (caveat: {'; '.join(m['caveats'])})" if m["caveats"] else "")
        if m.get("rates"):
            setting += f"; selected learning rates (each on validation): {m['rates']}"
    return f"| {claim.text} | {original} | {ours} | {setting} | {verdict_text} |"


#: The rows :func:`task_kind_row` reads: OELM-Freeze vs baseline on classification and on generation.
_CLASSIFICATION, _GENERATION = ("sst2", "imdb", "ag_news"), ("tinystories",)


def task_kind_row(measured: dict[str, dict[str, Any]]) -> list[str]:
    """"Classification suits OELM, generation does not", against the measured OELM-Freeze rows
    (:func:`measure_all`): it suits a task when OELM-Freeze has no significant cost there (its gap
    not significant, or significant on the winning side; ``significant`` as the row's verdict, else
    the interval excluding 0); the claim holds when that is so on every classification task, with a
    significant gain on at least one (the original's were gains), and not on any generation task.
    Without any significant difference on classification only the generation half is reproduced."""
    claim, original = "\"Classification suits OELM, generation does not\"", "(summary of the original's results)"
    rows = {k: m for k, m in measured.items() if m.get("status") == "measured" and k in _CLASSIFICATION + _GENERATION}
    if not any(k in rows for k in _CLASSIFICATION) or not any(k in rows for k in _GENERATION):
        return [claim, original, "pending: the OELM-Freeze rows above", "–", "pending"]
    by_key = {c.key: c for c in CLAIMS}

    def side(key: str) -> int:  # +1 a significant gain, -1 a significant cost, 0 neither
        m = rows[key]
        if not m["ci95"] or not m.get("significant", not m["ci95"][0] <= 0.0 <= m["ci95"][1]):
            return 0
        return -1 if (m["mean"] > 0) == by_key[key].lower_is_better else 1

    def costs(key: str) -> bool:
        return side(key) < 0

    cls = [k for k in _CLASSIFICATION if k in rows]
    gen = [k for k in _GENERATION if k in rows]
    lost = [k for k in cls if costs(k)]
    gained = [k for k in cls if side(k) > 0]
    ours = "; ".join(f"{k}: {_signed(rows[k]['mean'])}{'%' if by_key[k].relative else ''} "
                     f"[{_signed(rows[k]['ci95'][0])}, {_signed(rows[k]['ci95'][1])}]" for k in cls + gen)
    scales = sorted({rows[k]["scale"] for k in cls + gen if rows[k].get("scale")}, key=lambda x: float(x.split("M")[0]))
    at = f"at {' and '.join(scales)}" if scales else "at our scale"
    generation = "generation does not suit it" if all(costs(k) for k in gen) else "generation is not worse"
    if not lost and gained:
        verdict_text = f"reproduced {at}: no classification task loses, OELM-Freeze gains on {len(gained)} of {len(cls)}, {generation}"
    elif not lost:  # no significant difference either way: the original's gains are not there
        worse = [k for k in cls if rows[k]["mean"] != 0 and (rows[k]["mean"] > 0) == by_key[k].lower_is_better]
        verdict_text = (f"half reproduced {at}: {generation}, but on classification OELM-Freeze neither gains nor loses "
                        f"significantly on any of the {len(cls)} tasks ({len(worse)} of {len(cls)} gaps on the losing "
                        "side): no sign that classification suits it")
    else:
        verdict_text = (f"half reproduced {at}: {generation}, but classification does not suit it either: OELM-Freeze "
                        f"loses on {len(lost)} of {len(cls)} classification tasks and gains on {len(gained)}")
    return [claim, original, ours + " (OELM-Freeze − baseline: points; perplexity %)",
            "the SST-2, IMDB, AG News and TinyStories rows above", verdict_text]


def claims_markdown(results: str | Path, measured: dict[str, dict[str, Any]] | None = None) -> str:
    """The claims table (GitHub markdown) computed from the committed results under ``results``;
    ``measured``: :func:`measure_all` of ``CLAIMS + RESEARCH`` over the same ``results``, when the
    caller has it already (its bootstraps take ~15 s), else computed here."""
    results = Path(results)
    rows = ["| original claim | original | ours: gap (95% CI), p, Holm-adjusted p, seeds | our setting | verdict |",
            "|---|---|---|---|---|"]
    measured = measure_all(CLAIMS + RESEARCH, results) if measured is None else measured
    rows.extend(_row(claim, measured[claim.key]) for claim in CLAIMS)
    rows.append("| " + " | ".join(task_kind_row(measured)) + " |")
    rows.append("| " + " | ".join(anchor_row(results)) + " |")
    rows.extend("| " + " | ".join(row) + " |" for row in trainable_rows())
    rows.append("| " + " | ".join(per_step_row(results)) + " |")
    rows.append("| " + " | ".join(stability_row(results)) + " |")
    rows.extend("| " + " | ".join(row) + " |" for row in speed_rows(results))
    rows.extend(_row(claim, measured[claim.key]) for claim in RESEARCH)
    return "\n".join(rows) + "\n"


def update_readme(readme: str | Path, results: str | Path) -> bool:
    """Replace the block between :data:`BEGIN` and :data:`END` in ``readme`` with the current
    table; returns whether the file changed. Raises ValueError naming the file if a marker is missing."""
    readme = Path(readme)
    text = readme.read_text()
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{readme}: no claims block; add the lines {BEGIN!r} and {END!r} where the table goes")
    new = pattern.sub(lambda _: BEGIN + "\n" + claims_markdown(results) + END, text)
    if new != text:
        readme.write_text(new)
    return new != text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m research.claims", description=__doc__.split("\n")[0])
    parser.add_argument("results", help="folder of committed results (docs/results)")
    parser.add_argument("--update", metavar="README", help="rewrite the claims block of this markdown file")
    args = parser.parse_args(argv)
    if args.update:
        changed = update_readme(args.update, args.results)
        print(f"{args.update}: claims table {'updated' if changed else 'unchanged'}")
    else:
        print(claims_markdown(args.results), end="")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
