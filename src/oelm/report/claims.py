"""oelm's verdict on each quantitative claim of the original OELM project, from committed results.

The claims table that opens ``docs/results/README.md`` is *computed* here from the committed
comparisons (``docs/results/<name>/comparison.json``, and their runs' ``predictions.npz``), the
committed benchmarks (``docs/results/bench-cpu/*.json``; ``docs/results/gpu-*/bench-*.json`` of
committed GPU checks; :mod:`oelm.report.claims_rows`), never typed by hand;
``tests/test_committed_results.py`` checks that the README's table is exactly what
:func:`claims_markdown` writes. Update it with::

    python -m oelm.report.claims docs/results --update docs/results/README.md

Our gap (:func:`measure`): ``method − reference`` over the seeds both ran, in accuracy points or,
for perplexity, percent of the reference (``100 (method / reference − 1)``), with a 95% interval:

* **seeds × examples** where both methods' runs saved predictions of the split
  (:func:`oelm.report.uncertainty.paired_interval`, paired by seed and by example: the seeds'
  Student-t half-width and the test set's, from its bootstrap SE, added in quadrature; it covers
  the test set's sampling error as well as the seeds');
* **seed-only** otherwise (results written before oelm saved predictions): the paired Student-t
  interval over seeds (:func:`oelm.report.stats.paired_difference`).
The paired t-test's p is shown either way.

Verdict rule (:func:`verdict`) for a claimed gap ``g`` against our interval ``[lo, hi]``:

=========================================  ==============================================
our interval                               verdict
=========================================  ==============================================
excludes 0, same sign as g, contains g     reproduced
excludes 0, same sign as g, misses g       direction reproduced, size not (smaller/larger)
excludes 0, opposite sign                  contradicted (opposite direction)
contains 0 and g                           inconclusive at n seeds
contains 0, misses g                       contradicted (no effect of the claimed size)
=========================================  ==============================================

Each verdict carries its scale ("reproduced at 22.7M parameters": the reference model's parameters
in that comparison), since ours are small models. Our own questions, which the original did not
ask (the research matrices' controls: :data:`RESEARCH`), get a two-sided verdict
(:func:`difference_verdict`): "differs" when the interval excludes 0, else "no difference resolved".

A verdict is **fragile** (:func:`fragile`), and says so among its caveats, when it rests on
``n <= 3`` seeds and an end of its interval lies within 0.25 (points or % perplexity) of 0, or when
the paired p lies in [0.01, 0.1): one more seed or another test sample could flip it.

Claims whose data or scale this machine cannot reach say so ("not testable here") with the reason;
claims whose committed run does not exist yet say "pending (running in the background)" and the
config that produces it. Sources of the original numbers: the original OELM project's README
(single seed each).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oelm.records import MatrixFolder
from oelm.report.claims_rows import (  # noqa: F401 - PUBLISHED_MINILM_L6_SST2, anchor_row: the table's public names
    PUBLISHED_MINILM_L6_SST2, anchor_row, bench_row, per_step_row, read_json, speed_rows, stability_row, trainable_rows,
)
from oelm.report.render import _num, _p, _signed  # the report's number formats

BEGIN = "<!-- claims:begin (written by python -m oelm.report.claims; do not edit by hand) -->"
END = "<!-- claims:end -->"
#: An interval end this close to 0 (points, or % perplexity) with n <= 3 seeds makes a verdict fragile.
FRAGILE_END = 0.25
#: A paired p in [FRAGILE_P[0], FRAGILE_P[1]) makes a verdict fragile.
FRAGILE_P = (0.01, 0.1)


@dataclass(frozen=True)
class Claim:
    """One quantitative claim of the original project and where oelm measures it.

    ``gap`` is the original's ``method − reference`` (accuracy points; for ``relative`` claims the
    percent change of the reference's perplexity); None for our own two-sided questions
    (:data:`RESEARCH`). ``comparison`` names a committed folder under
    ``docs/results``; ``field`` is the per-seed value compared (``best_validation`` or ``test``).
    ``untestable`` is the reason when this machine cannot test the claim at all.
    """

    key: str
    text: str
    original: str
    gap: float | None
    method: str = "oelm_freeze"
    reference: str = "baseline"
    comparison: str | None = None
    config: str | None = None
    field: str = "best_validation"
    relative: bool = False
    lower_is_better: bool = False
    setting: str = ""
    untestable: str | None = None


CLAIMS: tuple[Claim, ...] = (
    Claim("sst2", "BERT-base SST-2: OELM-Freeze costs 1.84 points", "93.12 → 91.28", -1.84,
          comparison="evidence-sst2-minilm", config="configs/evidence/sst2_minilm.yaml", field="test",
          setting="all-MiniLM-L6-v2, full SST-2 train, SST-2 test (1,821; evaluated once per run)"),
    Claim("mnli", "BERT-base MNLI: OELM-Freeze costs 1.21 points", "83.44 → 82.23", -1.21,
          untestable="MNLI's training set (~300 MB) is not in the local data and the Hub is unreachable"),
    Claim("xnli", "BERT-base XNLI-en: OELM-Freeze gains 1.08 points", "76.71 → 77.79", 1.08,
          untestable="XNLI-en trains on MNLI (not in the local data); only XNLI's 2,490 validation pairs are here"),
    Claim("random", "OELM-Random loses 9.17 points to OELM-Freeze, \"so orthogonality is necessary\"",
          "91.28 → 82.11", -9.17, method="oelm_random", reference="oelm_freeze",
          comparison="evidence-sst2-minilm", config="configs/evidence/sst2_minilm.yaml", field="test",
          setting="SST-2 as above; Q/K ~ N(0, 0.02²), frozen"),
    Claim("matched", "…and it is orthogonality, not scale (our control: scale-matched random Q/K)",
          "(not run by the original)", -9.17, method="oelm_random_matched", reference="oelm_freeze",
          comparison="evidence-sst2-minilm", config="configs/evidence/sst2_minilm.yaml", field="test",
          setting="SST-2 as above; Q/K ~ N(0, 1/hidden_size): orthonormal rows' norm"),
    Claim("orthogonal", "…and orthogonality is what OELM-Random lacks (our control: random orthogonal Q/K "
          "should recover the gap)", "(not run by the original)", 9.17, method="oelm_random_orthogonal",
          reference="oelm_random", comparison="evidence-sst2-minilm", config="configs/evidence/sst2_minilm.yaml",
          field="test", setting="SST-2 as above; fresh Gaussian Q/K orthogonalized per head (QR, sign-fixed; "
                                "no pretrained Q/K), frozen"),
    Claim("imdb", "GPT classification IMDB: OELM-Freeze gains 7.14 points", "78.56 → 85.70", 7.14,
          comparison="evidence-gpt-cls-imdb", config="configs/evidence/gpt_cls_imdb.yaml", field="test",
          setting="gpt-tiny from scratch, causal, 5k reviews at 128 tokens, 5k IMDB test reviews"),
    Claim("ag_news", "GPT classification AG News: OELM-Freeze gains 5.69 points", "87.05 → 92.74", 5.69,
          comparison="evidence-gpt-cls-ag-news", config="configs/evidence/gpt_cls_ag_news.yaml", field="test",
          setting="gpt-tiny from scratch, causal, ALPS 10k train, AG News test"),
    Claim("xnli_standin", "…XNLI-en on a small-data stand-in: OELM-Freeze gains 1.08 points", "76.71 → 77.79", 1.08,
          comparison="research-xnli-en", config="configs/research/xnli_en.yaml", field="test",
          setting="all-MiniLM-L6-v2 trained on 1,992 English XNLI validation pairs (not MNLI), selected on 249 and tested "
                  "on 249 held-out pairs: a small-data stand-in, not the benchmark"),
    Claim("xnli_gpt", "GPT classification XNLI: OELM-Freeze gains 11.60 points", "46.39 → 57.99", 11.60,
          untestable="XNLI trains on MNLI (not in the local data); 1,992 local pairs are too few for a GPT from scratch"),
    Claim("tinystories", "TinyStories: OELM-Freeze perplexity 9.8% higher", "4.27 → 4.69", 9.84,
          comparison="evidence-tinystories-lm", config="configs/evidence/tinystories_lm.yaml",
          field="test", relative=True, lower_is_better=True,
          setting="gpt-tiny from scratch, 800 TinyStories stories, BPE-4096, perplexity on 414 held-out stories "
                  "(learning rate and early stopping on 300 others)"),
    Claim("tinystories_random", "TinyStories: OELM-Random perplexity 6.0% higher than OELM-Freeze's", "4.69 → 4.97",
          5.97, method="oelm_random", reference="oelm_freeze", comparison="evidence-tinystories-lm",
          config="configs/evidence/tinystories_lm.yaml", field="test", relative=True, lower_is_better=True,
          setting="TinyStories as above; Q/K ~ N(0, 0.02²), frozen"),
    Claim("global_qr", "GPT with one global QR of Q/K (not per head): perplexity 19% higher than baseline",
          "(Phase 2: \"GPT + global QR fails\")", 19.0, method="oelm_global", comparison="research-gpt-tiny-inits",
          config="configs/research/gpt_tiny_inits.yaml", field="test", relative=True, lower_is_better=True,
          setting="TinyStories as above (configs/research/gpt_tiny_inits.yaml); one QR over the whole Q/K matrix, frozen"),
    Claim("openwebtext", "OpenWebText: OELM-Freeze perplexity 14.9% higher", "47.24 → 54.29", 14.92,
          relative=True, lower_is_better=True,
          untestable="OpenWebText is not in the local data (every copy is over the 4 MiB download limit)"),
    Claim("wikitext103", "WikiText-103: OELM-Freeze perplexity 15.5% higher", "25.13 → 29.03", 15.52,
          relative=True, lower_is_better=True,
          untestable="WikiText-103 (~540 MB) is not in the local data, nor WikiText-2's training split (every copy is "
                     "over the 4 MiB download limit)"),
)

_MECHANISM = ("configs/research/sst2_mechanism.yaml", "research-sst2-mechanism",
              "all-MiniLM-L6-v2, 12,000 SST-2 sentences, 1 epoch, SST-2 test (1,821), 5 seeds")
_INITS = ("configs/research/gpt_tiny_inits.yaml", "research-gpt-tiny-inits",
          "gpt-tiny from scratch, 800 TinyStories stories, perplexity on 414 held-out stories")
_GUTENBERG = ("configs/research/gutenberg_lm.yaml", "research-gutenberg-lm",
              "gpt-tiny from scratch on 3 Gutenberg novels, perplexity on 2 held-out books")
_VARIANTS = ("configs/research/variants_sst2.yaml", "research-variants-sst2",
             "all-MiniLM-L6-v2, 12,000 SST-2 sentences, 1 epoch, SST-2 test (1,821)")
_LORA = ("configs/research/lora_sst2.yaml", "research-lora-sst2",
         "all-MiniLM-L6-v2, 8,000 SST-2 sentences, 3 epochs, LoRA r 8 on value / attention output, SST-2 test")


def _question(key: str, text: str, method: str, reference: str, where: tuple[str, str, str], *, gap: float | None = None,
              original: str = "(not run by the original)", lm: bool = False, setting: str = "") -> Claim:
    config, folder, context = where
    return Claim(key, text, original, gap, method=method, reference=reference, comparison=folder, config=config,
                 field="test", relative=lm, lower_is_better=lm, setting=context + (f"; {setting}" if setting else ""))


#: The research matrices' rows (issue 36): our questions, and two seed claims tested on a second dataset.
RESEARCH: tuple[Claim, ...] = (
    _question("pretrained_vs_qr", "(ours) pretrained vs orthogonalized Q/K: does the QR step matter?",
              "oelm_pretrained_frozen", "oelm_freeze", _MECHANISM, setting="the pretrained Q/K frozen as they are vs QR per head"),
    _question("temperature", "(ours) temperature: OELM-Freeze's rows at the pretrained per-head norm",
              "oelm_rescaled", "oelm_freeze", _MECHANISM, setting="oelm_rescaled vs oelm_freeze"),
    _question("mimetic_frozen", "(ours) from scratch: mimetic vs orthogonal frozen Q/K", "oelm_mimetic", "oelm_freeze",
              _INITS, lm=True, setting="W_q W_kᵀ ≈ I per head (Trockman & Kolter 2023) vs random orthogonal, both frozen"),
    _question("mimetic_trained", "(ours) from scratch: mimetic initialization, trained, vs baseline", "mimetic_trained",
              "baseline", _INITS, lm=True, setting="Trockman & Kolter 2023 report faster, better training"),
    _question("mimetic_vo_trained", "(ours) from scratch: the whole mimetic initialization (Q/K and V/O), trained, vs "
              "baseline", "mimetic_vo_trained", "baseline", _INITS, lm=True,
              setting="W_q W_kᵀ ≈ I per head and W_v W_o ≈ −I (Trockman & Kolter 2023), everything trained"),
    _question("fixed_attention", "(ours) from scratch: a frozen random attention map vs baseline", "fixed_attention",
              "baseline", _INITS, lm=True, setting="Synthesizer Random (Tay et al. 2021)"),
    _question("reservoir", "(ours) from scratch: reservoir layers vs baseline", "reservoir", "baseline", _INITS, lm=True,
              setting="layers 1 and 3 of 4 frozen at random (Shen et al. 2021)"),
    _question("global_vs_head_wise", "(ours) from scratch: one global QR vs a QR per head (OELM), both frozen",
              "oelm_global", "oelm_freeze", _INITS, lm=True,
              setting="does the head-wise QR matter? (the original's Phase 2 premise: global QR fails on GPT)"),
    _question("freeze_vs_fixed_map", "(ours) from scratch: frozen orthogonal Q/K vs a frozen random attention map",
              "oelm_freeze", "fixed_attention", _INITS, lm=True,
              setting="input-dependent attention from frozen Q/K vs an input-independent map (Synthesizer Random)"),
    _question("gutenberg_freeze", "Gutenberg (a second LM dataset): OELM-Freeze perplexity 9.8% higher", "oelm_freeze",
              "baseline", _GUTENBERG, gap=9.84, original="4.27 → 4.69 (TinyStories)", lm=True),
    _question("gutenberg_random", "Gutenberg: OELM-Random perplexity 6.0% higher than OELM-Freeze's", "oelm_random",
              "oelm_freeze", _GUTENBERG, gap=5.97, original="4.69 → 4.97 (TinyStories)", lm=True),
    _question("qk_ffn", "(ours) Q/K and feed-forward frozen (oelm_qk_ffn) vs baseline", "oelm_qk_ffn", "baseline", _VARIANTS),
    _question("ffn_only", "(ours) only the feed-forward frozen (oelm_ffn_only) vs baseline", "oelm_ffn_only", "baseline",
              _VARIANTS),
    _question("lora", "(ours) under LoRA: frozen orthogonal Q/K vs LoRA alone", "oelm_freeze_lora", "lora", _LORA,
              setting="oelm_freeze_lora vs lora"),
)


def verdict(gap: float, ci: list[float] | None, n: int, scale: str | None = None) -> str:
    """The verdict of the module docstring's table for claimed ``gap`` and our 95% interval ``ci``,
    said at ``scale`` (e.g. "22.7M parameters") when given."""
    if ci is None or n < 2:
        return f"not decidable (n = {n} seeds)"
    at = f" at {scale}" if scale else ""
    lo, hi = ci
    if lo <= 0.0 <= hi:
        return f"inconclusive at n = {n}" + (f", {scale}" if scale else "") if lo <= gap <= hi \
            else f"contradicted{at}: no effect of the claimed size"
    if (lo > 0) != (gap > 0):
        return f"contradicted{at}: opposite direction"
    if lo <= gap <= hi:
        return f"reproduced{at}"
    return f"direction reproduced{at}, size " + ("smaller" if abs(gap) > max(abs(lo), abs(hi)) else "larger")


def difference_verdict(ci: list[float] | None, n: int, scale: str, method: str, reference: str, higher_is_better: bool) -> str:
    """A two-sided question's verdict: ``method`` better or worse than ``reference`` when the 95%
    interval of ``method − reference`` excludes 0, else no difference resolved (at ``n`` seeds)."""
    if ci is None or n < 2:
        return f"not decidable (n = {n} seeds)"
    lo, hi = ci
    if lo <= 0.0 <= hi:
        return f"no difference resolved at n = {n}, {scale}"
    better = (lo > 0) == higher_is_better
    return f"differs at {scale}: {method} {'better' if better else 'worse'} than {reference}"


def fragile(m: dict[str, Any]) -> list[str]:
    """Why a measured verdict is fragile (module docstring): n <= 3 with an interval end within
    :data:`FRAGILE_END` of 0, or a paired p in :data:`FRAGILE_P`; [] when it is not."""
    reasons = []
    ci, p = m.get("ci95"), m.get("p_value")
    if ci and m["n"] <= 3 and min(abs(ci[0]), abs(ci[1])) < FRAGILE_END:
        reasons.append(f"n = {m['n']} and the interval ends {min(abs(ci[0]), abs(ci[1])):.2f} from 0")
    if p is not None and FRAGILE_P[0] <= p < FRAGILE_P[1]:
        reasons.append(f"p = {p:.3f}")
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


def seeds_examples_gap(claim: Claim, results: Path, comparison: dict[str, Any], seeds: list[int]) -> dict[str, Any] | None:
    """The seeds × examples interval of ``claim.method − claim.reference`` over ``seeds`` from the
    committed runs' ``predictions.npz`` (:func:`oelm.report.uncertainty.paired_interval`, paired by
    seed and example), in the claim's unit; None when a run of either method saved no predictions of
    the split, or there is one seed (then the row keeps the seed-only interval).

    Raises:
        ChecksumError / DamagedFileError / RecordedFileMissingError: a committed predictions file does not
            match its result.json (one line naming it).
    """
    from oelm.predictions import read_predictions  # numpy + the records: only for comparisons with predictions
    from oelm.report.uncertainty import paired_interval, paired_outcomes

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
    return {"mean": unit(both["estimate"]), "ci95": [unit(x) for x in both["ci"]], "examples": both["n_examples"]}


def measure(claim: Claim, results: Path) -> dict[str, Any]:
    """Our measurement of ``claim`` from the committed comparison under ``results``.

    Returns ``{"status": "measured" | "pending" | "untestable", ...}``; measured adds ``n``,
    ``seeds``, ``mean``, ``ci95`` (seeds × examples where both methods saved predictions, else the
    paired t interval: ``interval`` says which), ``p_value`` (paired t-test, :func:`paired_difference`),
    the two methods' means (``method_mean``, ``reference_mean``), ``scale``, ``verdict`` and ``caveats``
    (:func:`caveats`, then :func:`fragile`'s reasons; the table prints them after the verdict). For
    relative claims the per-seed differences are ``100 * (method / reference − 1)`` (% of the
    reference's perplexity).
    """
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
         "p_value": paired["p_value"], "interval": "seed-only interval",
         "method_mean": mean(_per_seed(comparison, claim.method, claim.field)),
         "reference_mean": mean(_per_seed(comparison, claim.reference, claim.field)),
         "scale": _scale(comparison, claim.reference)}
    found = seeds_examples_gap(claim, results, comparison, paired["seeds"])
    if found is not None:
        m |= {"mean": found["mean"], "ci95": found["ci95"], "interval": "seeds × examples interval"}
    if claim.gap is None:
        m["verdict"] = difference_verdict(m["ci95"], m["n"], m["scale"] or "this scale", claim.method, claim.reference,
                                          not claim.lower_is_better)
    else:
        m["verdict"] = verdict(claim.gap, m["ci95"], m["n"], m["scale"])
    m["caveats"] = caveats(comparison, (claim.reference, claim.method))
    if fragile(m):
        m["caveats"].append("fragile: " + "; ".join(fragile(m)))
    return m


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
    """One table row of a gap claim (or question) and its measurement."""
    unit = "% perplexity" if claim.relative else " points"
    original = claim.original if claim.gap is None else f"{claim.original} ({_signed(claim.gap)}{unit})"
    if m["status"] == "untestable":
        ours, verdict_text = "–", f"not testable here: {m['why']}"
    elif m["status"] == "pending":
        ours, verdict_text = f"pending (running in the background): `{m['config']}`", "pending"
    else:
        ci = m["ci95"] or [None, None]
        ours = (f"{_num(m['reference_mean'])} → {_num(m['method_mean'])}: {_signed(m['mean'])}{unit} "
                f"[{_signed(ci[0])}, {_signed(ci[1])}], p {_p_text(m['p_value'])}, "
                f"n = {m['n']} ({claim.field.replace('_', ' ')}; {m['interval']})")
        verdict_text = m["verdict"] + (f" (caveat: {'; '.join(m['caveats'])})" if m["caveats"] else "")
    return f"| {claim.text} | {original} | {ours} | {claim.setting or '–'} | {verdict_text} |"


#: The rows :func:`task_kind_row` reads: OELM-Freeze vs baseline on classification and on generation.
_CLASSIFICATION, _GENERATION = ("sst2", "imdb", "ag_news"), ("tinystories",)


def task_kind_row(measured: dict[str, dict[str, Any]]) -> list[str]:
    """"Classification suits OELM, generation does not", against the measured OELM-Freeze rows:
    it suits a task when OELM-Freeze's interval is not wholly on the losing side there (no
    significant cost); the claim holds when that is so on every classification task and not on
    any generation task."""
    claim, original = "\"Classification suits OELM, generation does not\"", "(summary of the original's results)"
    rows = {k: m for k, m in measured.items() if m.get("status") == "measured" and k in _CLASSIFICATION + _GENERATION}
    if not any(k in rows for k in _CLASSIFICATION) or not any(k in rows for k in _GENERATION):
        return [claim, original, "pending: the OELM-Freeze rows above", "–", "pending"]
    by_key = {c.key: c for c in CLAIMS}

    def costs(key: str) -> bool:  # the interval wholly on the losing side
        lo, hi = rows[key]["ci95"] or [0.0, 0.0]
        return lo > 0 if by_key[key].lower_is_better else hi < 0

    cls = [k for k in _CLASSIFICATION if k in rows]
    gen = [k for k in _GENERATION if k in rows]
    lost = [k for k in cls if costs(k)]
    gained = [k for k in cls if (rows[k]["ci95"] or [0.0, 0.0])[0] > 0]
    ours = "; ".join(f"{k}: {_signed(rows[k]['mean'])}{'%' if by_key[k].relative else ''} "
                     f"[{_signed(rows[k]['ci95'][0])}, {_signed(rows[k]['ci95'][1])}]" for k in cls + gen)
    scales = sorted({rows[k]["scale"] for k in cls + gen if rows[k].get("scale")}, key=lambda x: float(x.split("M")[0]))
    at = f"at {' and '.join(scales)}" if scales else "at our scale"
    generation = "generation does not suit it" if all(costs(k) for k in gen) else "generation is not worse"
    if not lost:
        verdict_text = f"reproduced {at}: no classification task loses, {generation}"
    else:
        verdict_text = (f"half reproduced {at}: {generation}, but classification does not suit it either: OELM-Freeze "
                        f"loses on {len(lost)} of {len(cls)} classification tasks and gains on {len(gained)}")
    return [claim, original, ours + " (OELM-Freeze − baseline: points; perplexity %)",
            "the SST-2, IMDB, AG News and TinyStories rows above", verdict_text]


def claims_markdown(results: str | Path) -> str:
    """The claims table (GitHub markdown) computed from the committed results under ``results``."""
    results = Path(results)
    rows = ["| original claim | original | ours: gap (95% CI), paired p, seeds | our setting | verdict |",
            "|---|---|---|---|---|"]
    measured = {}
    for claim in CLAIMS:
        measured[claim.key] = measure(claim, results)
        rows.append(_row(claim, measured[claim.key]))
    rows.append("| " + " | ".join(task_kind_row(measured)) + " |")
    rows.append("| " + " | ".join(anchor_row(results)) + " |")
    rows.extend("| " + " | ".join(row) + " |" for row in trainable_rows())
    rows.append("| " + " | ".join(per_step_row(results)) + " |")
    rows.append("| " + " | ".join(stability_row(results)) + " |")
    rows.extend("| " + " | ".join(row) + " |" for row in speed_rows(results))
    rows.extend(_row(claim, measure(claim, results)) for claim in RESEARCH)
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
    parser = argparse.ArgumentParser(prog="python -m oelm.report.claims", description=__doc__.split("\n")[0])
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
