"""What a run carries from step to step (:class:`TrainState`, saved in every checkpoint) and
what it returns (:class:`TrainResult`)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from oelm.metrics import Metric, get_metric

__all__ = ["TrainResult", "TrainState", "higher_is_better"]


def higher_is_better(metric: Metric | str) -> bool:
    """True for accuracy (%), False for perplexity (:attr:`oelm.metrics.Metric.higher_is_better`)."""
    return get_metric(metric).higher_is_better


@dataclass
class TrainResult:
    """What :func:`oelm.training.train` measured. Metric values: accuracy in %, perplexity as
    exp(mean token NLL)."""

    metric: str  # the Metric's name
    best_validation: float
    best_step: int
    final_validation: float
    final_train_loss: float
    steps: int
    test: float | None
    timing: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    stop_signal: str | None = None  # SIGTERM/SIGINT that arrived during the final evaluation
    early_stopped: bool = False  # stopped by training.early_stopping_patience before the planned steps
    #: LM only: next-token top-1 accuracy (%) at the best validation and on the test split
    #: (:func:`oelm.training.evaluation.token_accuracy_of`); None for classification
    token_accuracy: dict[str, float | None] | None = None
    #: with ``train(predictions=True)``: per split the value / loss / n / rows of the evaluation its
    #: saved predictions come from (:func:`oelm.training.prediction_collector.write_final_predictions`); else None
    predictions: dict[str, Any] | None = None


@dataclass
class TrainState:
    """Everything the loop carries from one step to the next, saved in every checkpoint.

    ``step`` counts optimizer steps, ``batches_in_epoch`` micro-batches consumed in the current
    epoch (the sampler position), ``running_n`` micro-steps since the last train log line.
    Early stopping counts ``evals_without_improvement`` (consecutive validations that did not beat
    ``early_stopping_reference``, the last validation value that counted as an improvement, by
    more than ``early_stopping_min_delta``); both are 0/None in checkpoints written before them.
    Times are seconds; ``elapsed_seconds`` is the run time of earlier processes of a resumed run.
    The best-on-validation weights live beside it (``best.safetensors``), the tensors (optimizer,
    scheduler, RNG, timer) in ``state.pt``.
    """

    step: int = 0
    epoch: int = 0
    batches_in_epoch: int = 0
    running_n: int = 0
    last_loss: float = float("nan")
    best_value: float | None = None
    best_step: int = 0
    evals_without_improvement: int = 0
    early_stopping_reference: float | None = None
    last_eval: dict[str, float] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    per_epoch_seconds: list[float] = field(default_factory=list)
    elapsed_seconds: float = 0.0
    epoch_elapsed_seconds: float = 0.0
    process_start_steps: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The JSON part of a checkpoint (``trainer_state.json``); NaN loss stored as null."""
        d = dataclasses.asdict(self)
        d["last_loss"] = self.last_loss if math.isfinite(self.last_loss) else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainState":
        """Inverse of :meth:`to_dict` (unknown keys, e.g. the checkpoint's identity, are ignored)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        state = cls(**{k: v for k, v in d.items() if k in fields})
        state.last_loss = float("nan") if state.last_loss is None else state.last_loss
        return state
