"""A documented public alias: the training loop's public names, importable from ``oelm.train``
as before the loop became the :mod:`oelm.training` package (one job per module). Nothing inside
oelm imports this module; new code imports :mod:`oelm.training`."""

from __future__ import annotations

from oelm.training import (
    Engine, Precision, TrainingDivergedError, TrainResult, TrainState, autocast_context, build_engine,
    build_optimizer, evaluate, higher_is_better, make_scheduler, optimizer_step, optimizer_steps_per_epoch,
    planned_total_steps, train, use_fused_adamw,
)

__all__ = [
    "Engine", "Precision", "TrainingDivergedError", "TrainResult", "TrainState", "autocast_context", "build_engine",
    "build_optimizer", "evaluate", "higher_is_better", "make_scheduler", "optimizer_step", "optimizer_steps_per_epoch",
    "planned_total_steps", "train", "use_fused_adamw",
]
