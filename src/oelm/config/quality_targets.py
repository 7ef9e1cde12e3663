"""A config's ``targets:`` block: the bounds a method's gap to baseline should meet, fixed
before the runs (the original project's plan wrote "OELM-Freeze PPL <= Baseline PPL x 1.05")::

    targets:
      oelm_freeze: {perplexity_ratio_max: 1.05}     # language modelling: method / baseline perplexity
      oelm_random: {accuracy_gap_min: -1.0}         # classification: method - baseline, accuracy points

Each bound is checked against the comparison (:mod:`oelm.report.target_verdicts`) with its 95% interval
and reported pass / fail / undecided in ``comparison.json`` (``targets``) and the report. The
block is read by the report only: it is no part of the matrix's fingerprint, so adding or editing
a target never invalidates finished runs (``oelm report DIR`` reads the output folder's
``config.yaml``: edit the block there to check a new target against finished runs).

No torch, no data registry: the keys-only pass of :mod:`oelm.config` reads this module.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

__all__ = ["QualityTarget", "QUALITY_BOUNDS", "check_quality_targets"]


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):  # YAML's true would pass as 1.0
        raise ValueError(f"expected a number, not the boolean {str(value).lower()}")
    return value


_Number = Annotated[float, BeforeValidator(_not_bool)]

#: bound -> (metric it applies to, "min" or "max", the gap it bounds, in words).
QUALITY_BOUNDS: dict[str, tuple[str, str, str]] = {
    "accuracy_gap_min": ("accuracy", "min", "accuracy gap (method − baseline, points)"),
    "accuracy_gap_max": ("accuracy", "max", "accuracy gap (method − baseline, points)"),
    "perplexity_ratio_min": ("perplexity", "min", "perplexity ratio (method / baseline)"),
    "perplexity_ratio_max": ("perplexity", "max", "perplexity ratio (method / baseline)"),
}


class QualityTarget(BaseModel):
    """Bounds on one method's gap to baseline (at least one; a ``_min`` and a ``_max`` of the
    same gap make a band). Accuracy gaps are in points, method − baseline; perplexity ratios are
    method / baseline (1.05: at most 5% higher perplexity)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    accuracy_gap_min: _Number | None = Field(None, description="The method's accuracy minus baseline's, in points, is at least this.")
    accuracy_gap_max: _Number | None = Field(None, description="The method's accuracy minus baseline's, in points, is at most this.")
    perplexity_ratio_min: _Number | None = Field(None, gt=0, description="The method's perplexity / baseline's is at least this.")
    perplexity_ratio_max: _Number | None = Field(None, gt=0, description="The method's perplexity / baseline's is at most this "
                                                 "(the original plan's strict target: 1.05).")

    @model_validator(mode="after")
    def _a_bound_and_a_band(self) -> "QualityTarget":
        given = self.bounds()
        if not given:
            raise ValueError(f"a target needs at least one bound: {', '.join(QUALITY_BOUNDS)}")
        metrics = {QUALITY_BOUNDS[k][0] for k in given}
        if len(metrics) > 1:
            raise ValueError(f"a target bounds one metric: {sorted(given)} mixes accuracy and perplexity bounds")
        for stem in ("accuracy_gap", "perplexity_ratio"):
            low, high = given.get(f"{stem}_min"), given.get(f"{stem}_max")
            if low is not None and high is not None and low > high:
                raise ValueError(f"{stem}_min {low} is above {stem}_max {high}: no gap can meet both")
        return self

    def bounds(self) -> dict[str, float]:
        """The bounds set, name -> value, in :data:`QUALITY_BOUNDS` order."""
        return {k: getattr(self, k) for k in QUALITY_BOUNDS if getattr(self, k) is not None}


def check_quality_targets(targets: dict[str, QualityTarget], methods: list[str], metric: str | None = None) -> None:
    """The config-level checks of a ``targets:`` block: each key names a method of the config
    other than baseline (the gap is to baseline), and, once the task's ``metric`` is known
    (``"accuracy"`` / ``"perplexity"``), its bounds are of that metric.

    Raises:
        ValueError: one line naming the target and the fix.
    """
    for name, target in targets.items():
        if name == "baseline":
            raise ValueError("targets.baseline: a target bounds a method's gap to baseline; name another method")
        if name not in methods:
            raise ValueError(f"targets.{name}: not a method of this config ({', '.join(methods)}); key each target by "
                             "the method name it bounds")
        if metric is not None:
            wrong = [k for k in target.bounds() if QUALITY_BOUNDS[k][0] != metric]
            if wrong:
                fix = "accuracy_gap_min / accuracy_gap_max" if metric == "accuracy" else "perplexity_ratio_min / perplexity_ratio_max"
                raise ValueError(f"targets.{name}.{wrong[0]}: this task is scored by {metric}; use {fix}")
