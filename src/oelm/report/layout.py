"""``original_layout.json``: the comparison in the JSON layout of the original OELM project, so its
readers and scripts keep working on oelm's results."""

from __future__ import annotations

from typing import Any

from oelm.report.stats import percent_change

__all__ = ["original_layout"]


def original_layout(comparison: dict[str, Any], method: str = "oelm_freeze") -> dict[str, Any]:
    """The original project's JSON layout: ``{"baseline", <method>, "comparison"}``.

    Per method (means over its sound seeds): ``best_<metric>``, ``final_<metric>``, ``test_<metric>``,
    ``total_time_seconds``, ``avg_step_time_ms`` (mean of the per-run median step times),
    ``trainable_params``, ``total_params``, ``trainable_percent``, ``learning_rate``, ``seeds``.

    ``comparison`` (``method`` against baseline):

    * ``accuracy_gap`` — method − baseline best validation, in metric units (accuracy points, or
      perplexity for language modelling; the key keeps the original name);
    * ``time_analysis.total_gap_seconds`` — method − baseline mean total seconds (negative = faster);
    * ``time_analysis.total_gap_percent`` — that gap in % of baseline's total seconds;
    * ``time_analysis.per_step_gap`` — method − baseline median step time, in ms;
    * ``time_analysis.speedup_ratio`` — baseline total seconds / method total seconds (> 1 = faster).

    Missing methods or values are None.
    """
    metric = comparison.get("metric") or "metric"

    def block(name: str) -> dict[str, Any] | None:
        m = comparison["methods"].get(name)
        if not m:
            return None
        p = m.get("parameters") or {}
        return {
            f"best_{metric}": m["best_validation"]["mean"],
            f"final_{metric}": m["final_validation"]["mean"],
            f"test_{metric}": m["test"]["mean"],
            "total_time_seconds": m["total_seconds"]["mean"],
            "avg_step_time_ms": m["step_ms_median"]["mean"],
            "trainable_params": p.get("trainable"),
            "total_params": p.get("total"),
            "trainable_percent": p.get("trainable_percent"),
            "learning_rate": m.get("learning_rate"),
            "seeds": m["included_seeds"],
        }

    base, other = block("baseline"), block(method)
    comp: dict[str, Any] = {"method": method, "metric": metric, "accuracy_gap": None, "time_analysis": {
        "total_gap_seconds": None, "total_gap_percent": None, "per_step_gap": None, "speedup_ratio": None}}
    if base and other:
        def diff(key):
            a, b = other[key], base[key]
            return None if a is None or b is None else a - b

        bt, mt = base["total_time_seconds"], other["total_time_seconds"]
        comp["accuracy_gap"] = diff(f"best_{metric}")
        comp["time_analysis"] = {
            "total_gap_seconds": diff("total_time_seconds"),
            "total_gap_percent": percent_change(mt, bt),
            "per_step_gap": diff("avg_step_time_ms"),
            "speedup_ratio": bt / mt if bt and mt else None,
        }
    return {"baseline": base, method: other, "comparison": comp}
