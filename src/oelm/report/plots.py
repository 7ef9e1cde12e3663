"""Plots of a comparison as PNG bytes (matplotlib Figures rendered by the Agg canvas: no display needed).

* :func:`learning_curves` — train loss and validation metric against step and against wall time,
  per method: the mean over seeds as a line, the min–max range over seeds as a band;
* :func:`final_metric_bars` — best validation metric per method: bars from zero, beside a zoomed
  panel of means with 95% t-intervals and every seed as a dot (its axis start written in its title);
* :func:`step_time_boxes` — per-step time distribution per method (box = quartiles, whiskers =
  1.5 IQR, the matplotlib default).
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from matplotlib.figure import Figure  # not pyplot: no backend, no global figure registry (~0.3 s less import)
from PIL import Image  # Pillow: a dependency of matplotlib (its PNG writer)

__all__ = ["figure_png", "learning_curves", "final_metric_bars", "final_metric_figure", "step_time_boxes", "method_colors"]

_PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]


def method_colors(methods: list[str]) -> dict[str, str]:
    """A fixed colour per method, in the order given (baseline first in every plot)."""
    return {m: _PALETTE[i % len(_PALETTE)] for i, m in enumerate(methods)}


def figure_png(fig) -> bytes:
    """A laid-out matplotlib Figure as PNG bytes (110 dpi, a 256-colour palette): every plot of the report.

    The Agg canvas draws RGBA; the PNG keeps 256 colours (Pillow's fast octree, no dithering), which
    a plot's few flat colours, bands and anti-aliased edges fit without a visible change, at about a
    quarter of the bytes (the committed reports' 60 plots: 4.9 MiB as RGBA, 1.3 MiB as palette PNGs).
    Reports are committed as evidence and travel with every GPU command (docs/scaling.md), so
    their size counts. ~0.1 s per plot.
    """
    buf = io.BytesIO()
    # Agg canvas, picked by the format. Each figure is laid out by tight_layout already, so no
    # bbox_inches="tight": that draws the whole figure once more (~0.4 s of a report's ~1.4 s)
    fig.savefig(buf, format="png", dpi=110)
    buf.seek(0)
    with Image.open(buf) as rgba:
        palette = rgba.convert("RGB").quantize(256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
    out = io.BytesIO()
    palette.save(out, format="PNG", optimize=True)
    return out.getvalue()


def _band(curves: list[dict[int, tuple[float, float]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Steps every seed logged; per step mean/min/max of the value and mean wall time.

    ``curves``: per seed, step -> (value, elapsed_seconds). Returns steps, mean, low, high, seconds.
    """
    steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    vals = np.array([[c[s][0] for s in steps] for c in curves], dtype=float).reshape(len(curves), len(steps))
    secs = np.array([[c[s][1] for s in steps] for c in curves], dtype=float).reshape(len(curves), len(steps))
    return np.array(steps), vals.mean(0), vals.min(0), vals.max(0), secs.mean(0)


def learning_curves(curves: dict[str, dict[str, list[dict[int, tuple[float, float]]]]], metric: str) -> bytes:
    """2×2 panel: train loss / validation ``metric`` (rows) vs step / wall seconds (columns).

    Args:
        curves: method -> {"train": [per seed: step -> (loss, elapsed_seconds)],
            "eval": [per seed: step -> (metric value, elapsed_seconds)]}, and optionally
            ``"at_chance"``: the same for its runs that ended at chance (left out of the mean;
            drawn dashed, in the method's colour).
        metric: "accuracy" (%) or "perplexity" (log-scale axis).
    """
    colors = method_colors(list(curves))
    fig = Figure(figsize=(11, 7.5))
    axes = fig.subplots(2, 2)
    for row, (kind, label) in enumerate((("train", "train loss"), ("eval", f"validation {metric}" + (" (%)" if metric == "accuracy" else "")))):
        for col, xlabel in enumerate(("step", "wall time since run start (s)")):
            ax = axes[row][col]
            for method, per_kind in curves.items():
                for part, style, name in ((per_kind, "-", method), (per_kind.get("at_chance") or {}, "--", f"{method}, at chance")):
                    seeds = [c for c in part.get(kind, []) if c]
                    if not seeds:
                        continue
                    steps, mean, lo, hi, secs = _band(seeds)
                    if len(steps) == 0:
                        continue
                    x = steps if col == 0 else secs
                    ax.plot(x, mean, style, color=colors[method], label=f"{name} (n={len(seeds)})", lw=1.6,
                            marker="o" if kind == "eval" else None, ms=3)
                    if len(seeds) > 1:
                        ax.fill_between(x, lo, hi, color=colors[method], alpha=0.18 if style == "-" else 0.08, lw=0)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(label)
            if kind == "eval" and metric == "perplexity":
                ax.set_yscale("log")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Learning curves: mean over seeds, band = min–max over seeds", fontsize=11)
    fig.tight_layout()
    return figure_png(fig)


def final_metric_bars(comparison: dict[str, Any]) -> bytes:
    """:func:`final_metric_figure` as PNG bytes."""
    return figure_png(final_metric_figure(comparison))


def final_metric_figure(comparison: dict[str, Any]):
    """Best validation metric per method, two panels side by side (a matplotlib Figure whose
    ``axes`` are ``[full, zoom]``).

    Left: bars from zero (bar = mean of sound seeds), so bar lengths compare honestly. Right: the
    same means as points with their 95% t-interval and every seed as a dot, on an axis zoomed to
    the data; no bars there (a bar on a cut axis exaggerates gaps), and its title says where the
    axis starts. Collapsed runs are excluded, as in the table.
    """
    metric = comparison.get("metric") or "metric"
    methods = list(comparison["methods"])
    colors = method_colors(methods)
    ylabel = f"best validation {metric}" + (" (%)" if metric == "accuracy" else "")
    fig = Figure(figsize=(2.0 * max(len(methods), 2) + 3, 4.2))
    full, zoom = fig.subplots(1, 2)
    ends: list[float] = []
    for i, m in enumerate(methods):
        s = comparison["methods"][m]["best_validation"]
        if s["mean"] is None:
            chance = (comparison["methods"][m].get("at_chance_best_validation") or {}).get("mean")
            for ax in (full, zoom):
                # at the foot of each panel (x in data, y in axes units): the zoomed axis may not reach 0
                ax.text(i, 0.02, "no sound run" if chance is None else f"at chance\n({chance:.4g})", ha="center",
                        va="bottom", fontsize=8, transform=ax.get_xaxis_transform())
            continue
        err = None
        if s.get("ci95"):
            err = [[s["mean"] - s["ci95"][0]], [s["ci95"][1] - s["mean"]]]
            ends += list(s["ci95"])
        ends += [s["mean"], *s["values"]]
        full.bar(i, s["mean"], color=colors[m], alpha=0.75, width=0.6)
        zoom.errorbar(i, s["mean"], yerr=err, fmt="o", color=colors[m], capsize=6, ms=7)
        zoom.scatter([i] * len(s["values"]), s["values"], color="black", s=12, zorder=3)
    for ax in (full, zoom):
        ax.set_xticks(range(len(methods)), methods, rotation=25 if len(methods) > 3 else 0,
                      ha="right" if len(methods) > 3 else "center")
        ax.set_xlim(-0.6, len(methods) - 0.4)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
    full.set_ylim(bottom=0.0)
    full.set_title("Mean over seeds (axis from 0)", fontsize=10)
    if ends:
        lo, hi = min(ends), max(ends)
        pad = max(0.15 * (hi - lo), 0.02 * abs(hi), 1e-6)
        top = hi + pad if metric != "accuracy" else min(100.0, hi + pad)
        zoom.set_ylim(max(0.0, lo - pad), top)
    start = zoom.get_ylim()[0]
    zoom.set_title("Zoomed: mean, 95% CI (Student t), seeds as dots" + (f"\n(axis starts at {start:.4g}, not 0)" if start > 0 else ""),
                   fontsize=10)
    fig.tight_layout()
    return fig


def step_time_boxes(step_ms: dict[str, list[float]]) -> bytes:
    """Per-step time (ms) distribution per method, all sound seeds pooled."""
    methods = [m for m, v in step_ms.items() if v]
    colors = method_colors(list(step_ms))
    fig = Figure(figsize=(1.6 * max(len(methods), 2) + 2, 4))
    ax = fig.subplots()
    if methods:
        box = ax.boxplot([step_ms[m] for m in methods], patch_artist=True, widths=0.5)
        ax.set_xticks(range(1, len(methods) + 1), [f"{m}\n(n={len(step_ms[m])})" for m in methods])
        for patch, m in zip(box["boxes"], methods):
            patch.set_facecolor(colors[m])
            patch.set_alpha(0.6)
    ax.set_ylabel("step time (ms)")
    ax.set_title("Step time: box = quartiles, whiskers = 1.5 IQR", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return figure_png(fig)
