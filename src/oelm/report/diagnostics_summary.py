"""The report's attention diagnostics (:mod:`oelm.method.diagnostics`): per method, the mean and seed spread
of each run's attention entropy, logit scale, effective rank of the Q/K bilinear form and overlap
with the pretrained Q/K, for ``comparison.json`` (:func:`diagnostics_comparison`), a table and a plot
of the entropy per layer (:func:`diagnostics_blocks`).

Each final run's diagnostics come from its ``result.json`` (``diagnostics``, recorded at the end of
the run) or, for runs that finished without them, from ``runs/<run>/diagnostics.json``, which
``oelm diagnose OUTPUT_DIR`` writes from the run's best weights (:func:`recorded_diagnostics`).
Results without either leave the comparison as it was.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from oelm.errors import OELMError
from oelm.io import read_json_object
from oelm.records import MatrixFolder, RunFolder, RunRecord
from oelm.report import plots_wanted
from oelm.report.stats import sound_runs

__all__ = ["QUANTITIES", "recorded_diagnostics", "diagnostics_comparison", "diagnostics_blocks", "entropy_plot"]

#: The per-run means the comparison summarizes over seeds (keys of a record's ``mean``).
QUANTITIES = ("entropy", "uniform_entropy", "normalized_entropy", "logit_scale", "qk_effective_rank", "overlap")


def recorded_diagnostics(folder: RunFolder | None, record: RunRecord) -> dict[str, Any] | None:
    """A run's diagnostics: ``result.json``'s (``record.diagnostics``), else its run folder's
    ``diagnostics.json`` (:attr:`RunFolder.diagnostics <oelm.records.RunFolder.diagnostics>`; not
    looked for when ``folder`` is None); None when it has neither (or only a recorded error).

    Raises:
        OELMError: ``diagnostics.json`` is damaged, or was computed from other weights than the ones
            ``result.json`` records (a run trained again since); the message names the file and the fix.
    """
    if isinstance(record.diagnostics_mean, dict):
        return record.diagnostics
    if folder is None or not folder.diagnostics.is_file():
        return None
    path = folder.diagnostics
    fix = f"delete it and run `oelm diagnose {folder.path.parent.parent}` again"
    data = read_json_object(path, fix)
    sha = (record.checkpoint or {}).get("sha256")
    if sha and data.get("checkpoint_sha256") != sha:
        raise OELMError(f"{path} was computed from other weights (sha256 {str(data.get('checkpoint_sha256'))[:12]}) than "
                        f"result.json records ({sha[:12]}); {fix}")
    found = data.get("diagnostics")
    if not isinstance(found, dict) or not isinstance(found.get("mean"), dict):
        return None
    return found


def _spread(values: list[float | None]) -> dict[str, Any]:
    vals = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if not vals:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": float(np.mean(vals)), "std": float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0, "n": len(vals)}


def _method_entry(found: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Seed means and spreads of one method's diagnostics (seed -> record)."""
    records = list(found.values())
    entry: dict[str, Any] = {"seeds": sorted(found)}
    for q in QUANTITIES:
        entry[q] = _spread([(r.get("mean") or {}).get(q) for r in records])
    sites = records[0].get("sites") or []
    layers = [r.get("per_layer") or {} for r in records if (r.get("sites") or []) == sites]
    per_site = np.array([[np.nan if v is None else v for v in (lay.get("entropy") or [None] * len(sites))] for lay in layers],
                        dtype=float).reshape(len(layers), len(sites))
    entry["per_layer"] = {
        "sites": sites,
        "entropy": [None if np.isnan(col).all() else float(np.nanmean(col)) for col in per_site.T],
        "entropy_std": [None if np.isfinite(col).sum() < 2 else float(np.nanstd(col, ddof=1)) for col in per_site.T],
        "uniform_entropy": (layers[0].get("uniform_entropy") if layers else None),
    }
    entry["entropy_source"] = records[0].get("entropy_source")
    entry["head_dim"] = records[0].get("head_dim")
    return entry


def diagnostics_comparison(comparison: dict[str, Any], results: Mapping[str, list[RunRecord]],
                           out: str | Path | None) -> dict[str, Any]:
    """``{"diagnostics": {...}}`` for ``comparison.json``, or ``{}`` when no final run has any.

    ``diagnostics``: ``batch`` (the fixed batch, as the runs recorded it), ``reference`` (what the
    overlap compares with), ``methods`` (per method: ``seeds``, for each of :data:`QUANTITIES`
    ``{"mean", "std" (sample std over seeds, the seed spread), "n"}``, ``per_layer`` {sites, entropy
    and entropy_std per site over seeds, uniform_entropy}, ``entropy_source``, ``head_dim``) and
    ``notes`` (runs without diagnostics, damaged or stale files). Seeds: the method's sound seeds.
    """
    found: dict[str, dict[int, dict[str, Any]]] = {}
    notes: list[str] = []
    for name, r in sound_runs(results, comparison):
        try:
            d = recorded_diagnostics(MatrixFolder(out).run(r.name) if out is not None else None, r)
        except OELMError as exc:
            notes.append(f"{name} seed {r.seed}: {exc}")
            continue
        if d is None:
            notes.append(f"{name} seed {r.seed}: no diagnostics (run `oelm diagnose` on the output directory)")
        else:
            found.setdefault(name, {})[r.seed] = d
    if not found:
        return {}
    first = next(iter(next(iter(found.values())).values()))
    methods = {name: _method_entry(found[name]) for name in comparison["methods"] if name in found}
    return {"diagnostics": {"batch": first.get("batch"), "reference": first.get("reference"), "methods": methods,
                            "notes": notes}}


def _pm(stat: Mapping[str, Any], digits: int) -> str:
    if stat.get("mean") is None:
        return "–"
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}" if stat.get("n", 0) > 1 else f"{stat['mean']:.{digits}f}"


def _rank(m: Mapping[str, Any]) -> str:
    text = _pm(m["qk_effective_rank"], 2)
    return f"{text} of {m['head_dim']}" if m.get("head_dim") and text != "–" else text


def diagnostics_blocks(comparison: dict[str, Any]) -> list[tuple[str, list[tuple[str, Any]]]]:
    """The report's "Attention diagnostics" section (table, how to read it, the entropy plot):
    ``[(title, blocks)]`` in the block format of :class:`oelm.report.render.Section`; [] without it."""
    d = comparison.get("diagnostics")
    if not d:
        return []
    rows = [[name, str(len(m["seeds"])), _pm(m["entropy"], 3), _pm(m["uniform_entropy"], 3), _pm(m["normalized_entropy"], 3),
             _pm(m["logit_scale"], 3), _rank(m), _pm(m["overlap"], 3)] for name, m in d["methods"].items()]
    batch = d.get("batch") or {}
    blocks: list[tuple[str, Any]] = [
        ("text", f"Attention of each final run's best weights on one fixed batch ({batch.get('rule', 'validation examples')}); "
                 "mean ± sample std over seeds of each run's mean over layers and heads. Entropy: of each query's attention "
                 "(nats), against a uniform attention over the same keys; normalized = entropy / uniform (1 = uniform, 0 = "
                 "one key). Logit scale: mean |q·k|/√head_dim over the attended pairs (the temperature Q/K set). Effective "
                 "rank of each head's Q/K bilinear form W_qᵀW_k (Roy & Vetterli 2007), of head_dim; orthonormal Q and K rows "
                 "give exactly head_dim. Overlap: mean squared cosine of the principal angles between each head's Q (K) row "
                 + (f"space and the {d['reference']}'s (1 = same subspace; head_dim / hidden_size for an unrelated random "
                    "one)" if d.get("reference") else "space and a pretrained model's: none here (trained from scratch)")
                 + ". docs/protocol.md says how to read them."),
        ("table", (["method", "seeds", "entropy (nats)", "uniform", "normalized", "logit scale", "effective rank",
                    "overlap"], rows)),
    ]
    if plots_wanted():
        blocks.append(("image", ("attention_entropy.png", entropy_plot(d), "attention entropy per layer and method (mean "
                                                                          "over heads and seeds; dashed: a uniform attention)")))
    sources = sorted({m.get("entropy_source") for m in d["methods"].values() if m.get("entropy_source")})
    if sources:
        blocks.append(("text", "Attention probabilities: " + "; ".join(sources) + " (\"model\": the model's own, eager "
                               "attention; \"recomputed\": softmax(QKᵀ/√d + mask) from the projections; \"fixed map\": "
                               "softmax of the fixed map)."))
    if d.get("notes"):
        blocks.append(("list", list(d["notes"])))
    return [("Attention diagnostics", blocks)]


def entropy_plot(section: Mapping[str, Any]) -> bytes:
    """PNG: mean attention entropy per layer (site) for each method, seed spread as error bars, and
    a uniform attention's entropy dashed."""

    from matplotlib.figure import Figure  # here: matplotlib only when a report draws this plot

    from oelm.report.plots import figure_png, method_colors

    fig = Figure(figsize=(8, 4.4))
    ax = fig.subplots()
    colors = method_colors(list(section["methods"]))
    uniform, sites = None, []
    for name, m in section["methods"].items():
        layer = m["per_layer"]
        sites = layer["sites"] or sites
        x = np.arange(len(layer["entropy"]))
        y = np.array([np.nan if v is None else v for v in layer["entropy"]], dtype=float)
        err = np.array([0.0 if v is None else v for v in layer["entropy_std"]], dtype=float)
        ax.errorbar(x, y, yerr=err, marker="o", ms=4, lw=1.4, capsize=3, color=colors[name], label=name)
        uniform = uniform if uniform is not None else layer.get("uniform_entropy")
    if uniform:
        ax.plot(np.arange(len(uniform)), [np.nan if v is None else v for v in uniform], ls="--", color="0.2", lw=1.2,
                label="uniform attention", zorder=5)  # on top: an untrained baseline lies on it
    ax.set_xticks(np.arange(len(sites)), [str(s) for s in sites])
    ax.set_xlabel("layer")
    ax.set_ylabel("attention entropy (nats)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return figure_png(fig)
