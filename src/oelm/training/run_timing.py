"""Timing and MFU glue of a run: the epoch clock and ``TrainResult.timing`` (the step timer
itself is :class:`oelm.runtime.timing.StepTimer`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from oelm.runtime.timing import PhaseTimer
from oelm.training.engine import compile_mode, compiled_graphs

if TYPE_CHECKING:
    from oelm.training.engine import Engine
    from oelm.training.state import TrainState

__all__ = ["EpochClock", "run_timing", "training_progress"]


class EpochClock:
    """Seconds of training steps and data waits in the current epoch (validation, checkpointing
    and keeping the best validation's predictions excluded), carried over a resume."""

    _EXCLUDED = ("validation", "checkpoint", "predictions")

    def __init__(self, phases: PhaseTimer, carried: float) -> None:
        self.phases = phases
        self.start = time.perf_counter() - carried
        self.excluded_before = self._excluded()

    def _excluded(self) -> float:
        return sum(self.phases.seconds.get(k, 0.0) for k in self._EXCLUDED)

    def seconds(self) -> float:
        return time.perf_counter() - self.start - (self._excluded() - self.excluded_before)


def run_timing(engine: "Engine", state: "TrainState", warmup_seconds: float, telemetry: dict[str, Any] | None,
               setup_seconds: float = 0.0) -> dict[str, Any]:
    """``TrainResult.timing`` (see :func:`oelm.training.train`). ``setup_seconds``: from
    :func:`~oelm.training.train`'s call to the start of the run's clock in this process (engine,
    warm-up passes, trackers)."""
    e = engine
    summary = e.timer.summary()
    timing = {
        "total_seconds": time.perf_counter() - e.t_start,
        "setup_seconds": setup_seconds,
        # the run time of the earlier processes of a resumed run (the clock started that far back)
        "resumed_seconds": e.t_start_here - e.t_start,
        "train_seconds": summary["train_step_seconds"],
        "validation_seconds": e.phases.seconds.get("validation", 0.0),
        "checkpoint_seconds": e.phases.seconds.get("checkpoint", 0.0),
        "best_weights_seconds": e.phases.seconds.get("best_weights", 0.0),
        "test_seconds": e.phases.seconds.get("test", 0.0),
        "predictions_seconds": e.phases.seconds.get("predictions", 0.0),
        "data_seconds": summary["data_seconds"],
        "data_stall_seconds": summary.get("data_stall_seconds"),
        "num_workers": e.loader_workers,  # DataLoader worker processes of the training loader
        "measured_seconds": summary.get("measured_seconds"),
        "per_epoch_seconds": state.per_epoch_seconds,
        "per_step_ms": summary["per_step_ms"],
        "step_ms": [round(ms, 3) for ms in e.timer.measured_step_times_ms],
        "process_start_steps": state.process_start_steps,
        "tokens_per_second": summary["tokens_per_second"],
        "samples_per_second": summary["samples_per_second"],
        "tokens": summary["tokens"],
        "samples": summary["samples"],
        "timing_warmup_steps_excluded": summary["warmup_steps_excluded"],
        "device": str(e.device),
        "mixed_precision": e.precision.mode,
        "warmup_seconds": warmup_seconds,
        "compile": compile_mode(e.config) is not None,
        "compile_mode": compile_mode(e.config),
        "compile_seconds": warmup_seconds if compile_mode(e.config) is not None else None,
        # graphs compiled in this run (warm-up included) and, of those, after the warm-up: new shapes
        # met while training (training.length_buckets keeps classification shapes to a few)
        "compiled_graphs": compiled_graphs() - e.graphs_at_start if e.compiled is not None else None,
        "recompilations": compiled_graphs() - e.graphs_after_warmup if e.compiled is not None else None,
        "num_processes": e.world_size,
        "gradient_accumulation_steps": e.accumulation,
    }
    if e.world_size > 1:  # this process's tokens; the whole job's throughput is world_size times as many
        timing["tokens_per_second_all_processes"] = (summary["tokens_per_second"] or 0.0) * e.world_size or None
    timing["mfu"] = _mfu(e, summary)
    timing["gpu_telemetry"] = telemetry
    return timing


def training_progress(engine: "Engine") -> dict[str, Any]:
    """How much training the weights of a validation have had, for its ``metrics.jsonl`` record
    (the x axes of AUCC and time-to-quality, :mod:`oelm.report.convergence`):

    * ``train_wall_seconds`` — seconds of optimizer steps plus the device's waits for data, summed
      over the steps so far (over resumes too: the step timer is checkpointed); validation,
      checkpoints, start-up and the warm-up passes before the first step are not in it;
    * ``train_tokens`` — tokens trained on so far, all processes;
    * ``train_flops`` — ``train_tokens`` x the FLOPs per token a step executes
      (:func:`oelm.architectures.flops.executed_flops_per_token`: 6N + 12LHT less the weight gradients a frozen
      weight skips, at the mean tokens per sequence so far); None when the model's layers and
      width cannot be read.

    Reads the step timer's summary, which flushes it (on CUDA a wait for the last step's event;
    a validation synchronizes the device anyway).
    """
    from oelm.architectures.flops import executed_flops_per_token

    summary = engine.timer.summary()  # flushes the ended steps first
    tokens, samples = summary["tokens"] * engine.world_size, summary["samples"]
    flops = 0.0 if not tokens else None
    if tokens and samples:
        try:
            flops = tokens * executed_flops_per_token(engine.unwrapped, max(1, round(summary["tokens"] / samples)))
        except (ValueError, AttributeError, TypeError):
            flops = None
    return {"train_wall_seconds": summary["train_step_seconds"] + (summary.get("data_stall_seconds") or 0.0),
            "train_tokens": tokens, "train_flops": flops}


def _mfu(engine: "Engine", summary: dict[str, Any]) -> dict[str, Any] | None:
    """Model FLOPs utilization of the measured steps (:func:`oelm.runtime.environment.mfu_record`), or
    None when the model's FLOPs per token cannot be derived from its config."""
    from oelm.runtime.environment import mfu_record
    from oelm.architectures.flops import model_flops_per_token

    tokens, samples = summary["tokens"], summary["samples"]
    if not tokens or not samples or summary["tokens_per_second"] is None:
        return None
    seq_len = max(1, round(tokens / samples))  # mean tokens per sequence (block size for LM)
    try:
        flops = model_flops_per_token(engine.unwrapped, seq_len)
    except (ValueError, AttributeError, TypeError):
        return None
    return mfu_record(flops, summary["tokens_per_second"], engine.device, engine.precision.mode)
