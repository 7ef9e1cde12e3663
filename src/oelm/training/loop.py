"""The training loop: :func:`train` reads top-down (set up, warm up, resume, epochs of steps
with logging, validation and checkpoints on their cadence, the final evaluation, the best
weights saved and tested)."""

from __future__ import annotations

import math

import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from accelerate import skip_first_batches
from torch import nn
from torch.utils.data import DataLoader

from oelm.config import TrainingConfig
from oelm.errors import RunInterruptedError
from oelm.integrations.trackers import check_installed
from oelm.metrics import Metric
from oelm.runtime.telemetry import GPUTelemetry
from oelm.training.checkpoint import remove_unfinished, save_best_weights, save_checkpoint, start_or_resume
from oelm.training.engine import Engine, setup, with_learning_rate
from oelm.training.evaluation import (
    early_stop_due, evaluate_predictions, evaluate_test, stop_early, token_accuracy_of, validate, validated_at,
)
from oelm.training.faults import StopSignals
from oelm.training.metrics_log import log_train, start_trackers
from oelm.training.prediction_collector import PredictionCollector, collector_for, write_final_predictions
from oelm.training.rng import epoch_seed, restore_rng
from oelm.training.run_timing import EpochClock, run_timing
from oelm.training.state import TrainResult, TrainState
from oelm.training.step import next_batch, optimizer_step, warm_up

if TYPE_CHECKING:
    from oelm.integrations.trackers import TrackedRun

__all__ = ["finish", "train"]


def train(model: nn.Module, train_loader: DataLoader, eval_loader: DataLoader, *, metric: Metric | str,
          config: TrainingConfig, learning_rate: float | None = None, run_dir: Path,
          test_loader: DataLoader | None = None, description: str = "train",
          tracked: "TrackedRun | None" = None, predictions: bool = False) -> TrainResult:
    """Train ``model`` and select the best weights on ``eval_loader``; resumable at any step.

    ``learning_rate`` (the peak rate after warmup) defaults to ``config.learning_rate``; given,
    it replaces it (a sweep point), so the config is the one carrier of the rate. Loaders,
    accumulation, warm-up, checkpoints and resume, early stopping, faults and the returned timing
    are described in the package docstring of :mod:`oelm.training`. ``config.report_to``'s W&B /
    MLflow trackers get every metrics record as a run named ``run_dir``'s name (``tracked``: its
    project, config and output folder; :class:`oelm.integrations.trackers.TrackedRun`). With ``predictions``
    (a matrix's final runs) the best weights' per-example predictions on the validation split (kept
    during the best validation, and in the checkpoints after it) and the test split (its one
    evaluation) are saved to ``run_dir/predictions.npz`` (:func:`_save_predictions`).

    Raises:
        TrainingDivergedError: (``RunFaultError``, kind ``"nan"``) NaN/Inf loss, gradients or weights.
        RunFaultError: kind ``"oom"`` or ``"disk_full"`` (a checkpoint, the metrics or the best weights).
        RunInterruptedError: SIGTERM/SIGINT; a checkpoint of the finished step was saved and
            calling ``train`` again on the same ``run_dir`` resumes there.
        ConfigError: the checkpoint in ``run_dir`` belongs to a run with other settings,
            ``gradient_accumulation_steps`` exceeds the batches of an epoch, or ``warmup_steps``
            exceeds the planned steps, or a tracker of ``report_to`` is not installed (before anything runs).
    """
    from tqdm.auto import tqdm

    entered = time.perf_counter()
    check_installed(config.report_to)

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    engine, (train_loader, eval_loader, test_loader), generators, base_seeds = setup(
        model, (train_loader, eval_loader, test_loader), metric=metric,
        config=with_learning_rate(config, learning_rate), run_dir=run_dir)
    engine.keep_predictions = predictions
    warmup_seconds = warm_up(engine)
    wall_start = time.perf_counter()
    state, rng_to_restore, resumed = start_or_resume(engine)
    wall_start += start_trackers(engine, run_dir.name, tracked, state.step if resumed else 0)  # not the run's time
    remove_unfinished(engine)
    state.process_start_steps.append(state.step)
    engine.t_start_here, engine.t_start = wall_start, wall_start - state.elapsed_seconds

    bar = tqdm(total=engine.total_steps, initial=state.step, desc=description,
               disable=not engine.config.progress_bar or not engine.is_main, dynamic_ncols=True, leave=True)
    if engine.config.eval_at_start and not resumed:
        validate(engine, state, eval_loader, 0)
    engine.model.train()
    if state.step >= engine.total_steps and state.batches_in_epoch:  # stopped by a signal right after the last step
        state.per_epoch_seconds.append(state.epoch_elapsed_seconds)
    stop, telemetry = StopSignals(), GPUTelemetry(engine.device)
    try:
        with stop, telemetry:
            stopped_early = _run_epochs(engine, state, (train_loader, eval_loader), generators, base_seeds,
                                        rng_to_restore, stop, bar)
            if not validated_at(state, state.step):  # an early stop has validated this step already
                validate(engine, state, eval_loader, state.step)
            stop_signal = stop.name
    except BaseException as exc:
        engine.log.end_trackers(exc)
        raise
    finally:
        bar.close()
        engine.timer.flush()

    if stop_signal is not None:
        warnings.warn(f"{stop_signal} received during the final evaluation; the run was finished first",
                      RuntimeWarning, stacklevel=2)
    test_rows = collector_for(test_loader, engine.metric.name) if predictions and test_loader is not None else None
    test_value = finish(engine, state, test_loader, test_rows)
    timing = run_timing(engine, state, warmup_seconds, telemetry.summary(), setup_seconds=wall_start - entered)
    saved = _save_predictions(engine, state, (eval_loader, test_loader), test_rows, timing) if predictions else None
    return TrainResult(
        metric=engine.metric.name, best_validation=float(state.best_value), best_step=state.best_step,
        final_validation=float(state.last_eval["value"]), final_train_loss=state.last_loss, steps=state.step,
        test=test_value, timing=timing, history=state.history, stop_signal=stop_signal, early_stopped=stopped_early,
        token_accuracy=token_accuracy_of(state.history, state.best_step), predictions=saved,
    )


def _save_predictions(engine: Engine, state: TrainState, loaders: tuple[DataLoader, DataLoader | None],
                      test_rows: PredictionCollector | None, timing: dict) -> dict:
    """Write ``predictions.npz``: the best validation's predictions, kept when it ran
    (``engine.best_predictions``), and the test split's from its one evaluation; only a run resumed
    from a checkpoint of an older oelm, which kept none, evaluates the best weights (loaded by
    :func:`finish`) on the validation split once more. After the run's timings (in no run time);
    ``timing["predictions_seconds"]`` counts it with the predictions kept at validations."""
    eval_loader, test_loader = loaders
    with engine.phases.measure("predictions"):
        best = engine.best_predictions
        if best is None or best.step != state.best_step:
            best = evaluate_predictions(engine.model, eval_loader, engine.metric.name, engine.precision,
                                        engine.accelerator, step=state.best_step)
        splits = {"validation": best}
        if test_rows is not None:
            splits["test"] = test_rows.split(test_loader, state.best_step)
        saved = write_final_predictions(engine.run_dir, engine.metric.name, splits, is_main=engine.is_main)
    timing["predictions_seconds"] = engine.phases.seconds["predictions"]
    return saved


def _run_epochs(engine: Engine, state: TrainState, loaders: tuple, generators: list, base_seeds: list,
                rng_to_restore: tuple | None, stop: StopSignals, bar) -> bool:
    """The loop: epochs of optimizer steps, with logging, validation and checkpoints on their cadence.
    Returns True when it stopped early (``early_stopping_patience``), right after that validation.

    Raises:
        RunInterruptedError: a stop signal arrived; a checkpoint of the finished step was saved.
    """
    e, config = engine, engine.config
    train_loader, eval_loader = loaders
    micro_batches_per_epoch = e.steps_per_epoch * e.accumulation
    stopped_early = False
    while state.step < e.total_steps and not stopped_early:
        clock = EpochClock(e.phases, state.epoch_elapsed_seconds)
        state.epoch_elapsed_seconds = 0.0
        for g, seed in zip(generators, base_seeds):
            g.manual_seed(epoch_seed(seed, state.epoch))
        it, batch = _epoch_iterator(e, train_loader, state.batches_in_epoch)
        if rng_to_restore is not None:  # after the first fetch, which draws the loader's seeds
            restore_rng(*rng_to_restore)
            rng_to_restore = None
        while state.step < e.total_steps and state.batches_in_epoch + e.accumulation <= micro_batches_per_epoch:
            batch = batch if batch is not None else next_batch(e, it)
            if batch is None:
                break
            optimizer_step(e, state, batch, it)
            batch = None
            bar.update(1)
            if state.step % config.log_every == 0 or state.step == e.total_steps:
                log_train(e, state)
                bar.set_postfix(loss=f"{state.last_loss:.4f}", refresh=False)
            validated = _validation_due(e, state.step)
            if validated:
                validate(e, state, eval_loader, state.step)
                # no train loss before the first log step (it is read at log steps only): show none, not nan
                shown = {"loss": f"{state.last_loss:.4f}"} if math.isfinite(state.last_loss) else {}
                bar.set_postfix(**shown, val=f"{state.last_eval['value']:.3f}", refresh=False)
                stopped_early = early_stop_due(e, state)
                if stopped_early:
                    stop_early(e, state)
                    break
            if stop.requested(e, state.step):
                state.epoch_elapsed_seconds = clock.seconds()
                _interrupt(e, state, stop)
            periodic = state.step % config.checkpoint_every == 0 if config.checkpoint_every else validated
            if periodic and state.step != e.total_steps:
                state.epoch_elapsed_seconds = clock.seconds()
                save_checkpoint(e, state)
                state.epoch_elapsed_seconds = 0.0  # the clock carries the epoch on; only a resume reads this
        state.per_epoch_seconds.append(clock.seconds())
        state.epoch += 1
        state.batches_in_epoch = 0
    return stopped_early


def _validation_due(engine: Engine, step: int) -> bool:
    """Is a scheduled validation (every ``eval_every`` steps) due after ``step``? Not near the end:
    the end-of-training evaluation validates the last step, and a scheduled one fewer than half an
    interval before it would evaluate nearly the same weights (two records, e.g. a step apart)."""
    return step % engine.eval_every == 0 and engine.total_steps - step >= engine.eval_every / 2


def _epoch_iterator(engine: Engine, loader: DataLoader, skip: int) -> tuple[Iterator, dict | None]:
    """An iterator over this epoch's batches (the first ``skip`` already consumed before a resume)
    and its first batch. Worker start-up counts as waiting for data."""
    with engine.timer.data_wait():
        it = iter(skip_first_batches(loader, skip) if skip else loader)
        return it, next(it, None)


def _interrupt(engine: Engine, state: TrainState, stop: StopSignals) -> None:
    """Save a checkpoint of the finished step and raise RunInterruptedError."""
    path = save_checkpoint(engine, state)
    name = stop.name or "SIGTERM"
    raise RunInterruptedError(
        f"{name} received: stopped after step {state.step} of {engine.total_steps}, checkpoint {path}; "
        "run again to resume from there",
        step=state.step, signal_name=name,
    )


def finish(engine: Engine, state: TrainState, test_loader: DataLoader | None,
           test_predictions: PredictionCollector | None = None) -> float | None:
    """Load and save the best-on-validation weights (rank 0), evaluate the test split once with
    them (``test_predictions``: a :class:`~oelm.training.prediction_collector.PredictionCollector` that keeps
    its per-example outcomes), close the log and remove the resumable checkpoints. Returns the
    test value (None without a test split)."""
    import shutil

    try:
        with engine.phases.measure("best_weights"):
            save_best_weights(engine, state)
        test_value = evaluate_test(engine, state, test_loader, test_predictions)
    finally:
        engine.log.close()
    engine.barrier()
    if engine.is_main:
        shutil.rmtree(engine.ckpt_root, ignore_errors=True)  # finished: the resumable state is no longer needed
    return test_value
