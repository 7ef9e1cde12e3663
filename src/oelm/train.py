"""The training loop's public names, kept importable from ``oelm.train`` (the loop itself lives
in the :mod:`oelm.training` package, one job per module)."""

from __future__ import annotations

from oelm.training import (
    Engine, Precision, TrainingDivergedError, TrainResult, TrainState, autocast_context, build_engine,
    build_optimizer, evaluate, higher_is_better, make_scheduler, optimizer_step, optimizer_steps_per_epoch,
    planned_total_steps, train, use_fused_adamw,
)
from oelm.training.checkpoint import identity_changes as _identity_changes
from oelm.training.loop import finish as _save_best_and_test
from oelm.training.metrics_log import MetricsLog as _MetricsLog
from oelm.training.rng import rank_rng as _rank_rng

_Engine = Engine  # the name before the package split

__all__ = [
    "TrainingDivergedError", "TrainResult", "TrainState", "build_engine", "build_optimizer", "evaluate", "make_scheduler",
    "optimizer_step", "train",
    "higher_is_better",
]
