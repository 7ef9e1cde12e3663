"""The validation metrics oelm selects and reports on: one :class:`Metric` per name.

A metric knows its direction, its unit, how it is formatted and what "chance" means for it, so
no other module tests ``metric == "accuracy"``::

    from oelm.metrics import get_metric
    m = get_metric("perplexity")
    m.better(4.2, 4.7)          # True: lower is better
    m.improves(4.65, 4.7, min_delta=0.1)   # False: better, but by less than 0.1
    m.format(4.6912)            # '4.691'
    get_metric("accuracy").chance_level(num_labels=2, majority_percent=50.92)   # 50.92

Values: accuracy in % (0-100) of examples whose arg-max logit is the label; perplexity is
``exp`` of the token-weighted mean next-token negative log-likelihood (nats).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Metric", "METRICS", "ACCURACY", "PERPLEXITY", "get_metric"]


@dataclass(frozen=True)
class Metric:
    """A validation metric: name, direction, unit and its chance level.

    Attributes:
        name: the key of the metric in ``metrics.jsonl`` records and results (``"accuracy"``).
        higher_is_better: True for accuracy, False for perplexity.
        unit: ``"%"`` or ``""`` (shown after labels: ``accuracy (%)``).
        decimals: digits after the point in :meth:`format`.
        log_scale: plots of it read better on a log axis (perplexity).
        lowest, highest: the values it can take, by its definition (accuracy: a percentage,
            0 to 100; perplexity: ``exp`` of a non-negative mean loss, 1 to infinity).
    """

    name: str
    higher_is_better: bool
    unit: str = ""
    decimals: int = 3
    log_scale: bool = False
    lowest: float = -math.inf
    highest: float = math.inf

    @property
    def range_text(self) -> str:
        """The values it can take, in words: ``"perplexity is at least 1"``, ``"accuracy is 0 to 100"``."""
        if math.isinf(self.highest):
            return f"{self.name} is at least {self.lowest:g}"
        return f"{self.name} is {self.lowest:g} to {self.highest:g}{self.unit and ' ' + self.unit}"

    def better(self, a: float, b: float) -> bool:
        """Is ``a`` strictly better than ``b``?"""
        return a > b if self.higher_is_better else a < b

    def improves(self, value: float, reference: float, min_delta: float = 0.0) -> bool:
        """Is ``value`` better than ``reference`` by more than ``min_delta`` (in the metric's unit)?
        With ``min_delta=0`` this is :meth:`better`."""
        return self.better(value, reference + min_delta if self.higher_is_better else reference - min_delta)

    def reaches(self, value: float, target: float) -> bool:
        """Has ``value`` reached ``target`` (``>=`` when higher is better, else ``<=``)?"""
        return value >= target if self.higher_is_better else value <= target

    def best(self, values: list[float]) -> float:
        """The best of ``values``. Raises ValueError when empty."""
        return max(values) if self.higher_is_better else min(values)

    @property
    def label(self) -> str:
        """``"accuracy (%)"`` / ``"perplexity"``: axis and column labels."""
        return f"{self.name} ({self.unit})" if self.unit else self.name

    def format(self, value: float | None) -> str:
        """``value`` with the metric's decimals; ``"—"`` for None or NaN."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "—"
        return f"{value:.{self.decimals}f}"

    def chance_level(self, *, num_labels: int | None = None, majority_percent: float | None = None) -> float | None:
        """What a predictor that learned nothing scores, or None when the metric has no such level.

        Accuracy: the higher of ``100 / num_labels`` (uniform guessing) and ``majority_percent``
        (always predicting the validation split's majority class). Perplexity: None (the
        collapse rule for language models compares the final perplexity with the first
        evaluation instead).
        """
        if not self.higher_is_better or self.unit != "%":
            return None
        levels = [x for x in (100.0 / num_labels if num_labels else None, majority_percent)
                  if x is not None and math.isfinite(x)]
        return max(levels) if levels else None


ACCURACY = Metric("accuracy", higher_is_better=True, unit="%", decimals=2, lowest=0.0, highest=100.0)
PERPLEXITY = Metric("perplexity", higher_is_better=False, unit="", decimals=3, log_scale=True, lowest=1.0)
METRICS: dict[str, Metric] = {m.name: m for m in (ACCURACY, PERPLEXITY)}


def get_metric(metric: str | Metric) -> Metric:
    """The :class:`Metric` named ``metric`` (a Metric is returned as is).

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    if isinstance(metric, Metric):
        return metric
    try:
        return METRICS[metric]
    except KeyError:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}") from None
