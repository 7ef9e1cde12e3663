"""Checkpoints and resume: ``run_dir/checkpoints/step-<N>/`` written atomically, the newest
intact one loaded on resume, and the best weights a finished run keeps
(``run_dir/checkpoint/model.safetensors``)."""

from __future__ import annotations

import json
import shutil
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from oelm.errors import ConfigError
from oelm.io import atomic_path, disk_writes, verify_dir, write_dir_atomic
from oelm.records import RunFolder, step_checkpoints
from oelm.training.evaluation import cpu_copy
from oelm.training.faults import DISK_FULL, TrainingDivergedError, all_finite, check_finite, disk_full_error, raise_disk_full
from oelm.training.metrics_log import MetricsLog
from oelm.training.prediction_collector import BEST_PREDICTIONS_FILE, load_best_predictions, save_best_predictions
from oelm.training.rng import capture_rng, gather_rng, rank_rng
from oelm.training.state import TrainState

if TYPE_CHECKING:
    from oelm.training.engine import Engine

__all__ = ["CHECKPOINT_FORMAT", "check_format", "checkpoint_dirs", "identity_changes", "save_best_weights", "save_checkpoint", "start_or_resume"]

#: The layout of ``trainer_state.json`` / ``state.pt`` this oelm writes and reads (``format`` in
#: ``trainer_state.json``); a checkpoint of another format is refused on resume (:func:`check_format`).
CHECKPOINT_FORMAT = 1

#: Identity entries recorded only when they differ from these (one process, no accumulation).
_IDENTITY_DEFAULTS = {"gradient_accumulation_steps": 1, "num_processes": 1}


#: ``(step, path)`` of every ``step-<N>`` directory under a run's ``checkpoints/``, newest first
#: (the layout is the record layer's: :func:`oelm.records.step_checkpoints`).
checkpoint_dirs = step_checkpoints


def _fill_checkpoint(tmp: Path, engine: "Engine", best_state: dict[str, torch.Tensor] | None,
                     tensors: dict[str, Any], trainer_state: dict[str, Any]) -> None:
    with disk_writes(tmp):  # safetensors' and torch.save's own errors on a full disk: OSError ENOSPC
        save_model(engine.unwrapped, str(tmp / "model.safetensors"))
        if best_state is not None:
            save_file(best_state, str(tmp / "best.safetensors"))
        if engine.best_predictions is not None:  # a final run: its best validation's predictions so far
            save_best_predictions(tmp / BEST_PREDICTIONS_FILE, engine.best_predictions, engine.metric.name)
        torch.save(tensors, tmp / "state.pt")
        (tmp / "trainer_state.json").write_text(json.dumps(trainer_state) + "\n", encoding="utf-8")


def _find_checkpoint(root: Path, remove_bad: bool = True) -> tuple[int, Path] | None:
    """The newest checkpoint under ``root`` that passes its integrity check; every newer one
    that fails is reported with a warning and removed (by rank 0 only: ``remove_bad``)."""
    for step, path in checkpoint_dirs(root):
        reason = verify_dir(path)
        if reason is None:
            return step, path
        warnings.warn(f"checkpoint {path} failed its integrity check ({reason}); skipped, using the previous one",
                      RuntimeWarning, stacklevel=3)
        if remove_bad:
            shutil.rmtree(path, ignore_errors=True)
    return None


def identity_changes(saved: dict[str, Any], now: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{entry: (checkpoint's, this run's)}`` for each identity entry that differs. An entry
    left out for its default counts as the default on either side, so a checkpoint of several
    processes is refused by a one-process run too: each process's data shard, the global batch
    and the per-rank RNG states all depend on the number of processes."""
    keys = [*now, *(k for k in _IDENTITY_DEFAULTS if k not in now)]
    values = {k: (saved.get(k, _IDENTITY_DEFAULTS.get(k)), now.get(k, _IDENTITY_DEFAULTS.get(k))) for k in keys}
    return {k: v for k, v in values.items() if v[0] != v[1]}


def check_format(ckpt_dir: Path, trainer_state: dict[str, Any]) -> None:
    """Refuse a checkpoint whose ``format`` (in ``trainer_state.json``) is not :data:`CHECKPOINT_FORMAT`:
    its files would be read with the wrong layout (a KeyError mid-resume, or states restored into
    the wrong places).

    Raises:
        ConfigError: one line naming the checkpoint, its format and this oelm's, and the fix
            (start the run over, or resume with the oelm that wrote it).
    """
    found = trainer_state.get("format")
    if found == CHECKPOINT_FORMAT:
        return
    newer = isinstance(found, int) and not isinstance(found, bool) and found > CHECKPOINT_FORMAT
    age = "a newer" if newer else "an older"
    raise ConfigError(
        f"the checkpoint {ckpt_dir} has format {found!r}, but this oelm reads format {CHECKPOINT_FORMAT} (it was "
        f"written by {age} oelm); set training.resume=false to start this run over, or resume it with the oelm that "
        "wrote it"
    )


def start_or_resume(engine: "Engine") -> tuple[TrainState, tuple | None, bool]:
    """Open ``metrics.jsonl`` and load the newest intact checkpoint (when ``config.resume``).

    Returns ``(state, RNG states to restore once the first batch is drawn, resumed?)``.

    Raises:
        ConfigError: the checkpoint was written by a run with other settings, or in another
            format (:func:`check_format`).
    """
    config, ckpt_root = engine.config, engine.ckpt_root
    found = _find_checkpoint(ckpt_root, remove_bad=engine.is_main) if config.resume else None
    if found is None:
        if engine.is_main:
            shutil.rmtree(ckpt_root, ignore_errors=True)  # a fresh start: nothing of an older attempt stays
        engine.barrier()
        engine.log = MetricsLog(engine.run_dir, config.tensorboard, offset=0, purge_step=0, enabled=engine.is_main,
                                steps_per_epoch=engine.steps_per_epoch)
        return TrainState(), None, False
    ckpt_step, ckpt_dir = found
    st = json.loads((ckpt_dir / "trainer_state.json").read_text(encoding="utf-8"))
    check_format(ckpt_dir, st)
    changed = identity_changes(st["identity"], engine.identity)
    if changed:
        raise ConfigError(
            f"the checkpoint {ckpt_dir} was written by a run with different {', '.join(changed)} "
            f"({ {k: v[0] for k, v in changed.items()} } now { {k: v[1] for k, v in changed.items()} }); "
            "set training.resume=false to start this run over, or use another output directory"
        )
    tensors = torch.load(ckpt_dir / "state.pt", map_location="cpu", weights_only=True)
    # safetensors takes "cuda:N" but refuses "cpu:N", which Accelerate names a multi-process CPU (gloo) device
    device = "cpu" if engine.device.type == "cpu" else str(engine.device)
    load_model(engine.unwrapped, str(ckpt_dir / "model.safetensors"), device=device)
    engine.optimizer.load_state_dict(tensors["optimizer"])
    engine.scheduler.load_state_dict(tensors["scheduler"])
    if engine.scaler is not None and tensors.get("scaler"):
        engine.scaler.load_state_dict(tensors["scaler"])
    engine.running_loss.copy_(tensors["running_loss"])
    engine.grad_nonfinite.zero_()
    engine.timer.load_state_dict(tensors["timer"])
    state = TrainState.from_dict(st)
    if state.best_value is not None:
        src = ckpt_dir / "best.safetensors"
        engine.best_state = load_file(str(src)) if src.is_file() else cpu_copy(engine.unwrapped)
    kept = ckpt_dir / BEST_PREDICTIONS_FILE  # absent in checkpoints of sweep runs and of older oelm
    engine.best_predictions = load_best_predictions(kept) if kept.is_file() else None
    engine.phases.seconds, engine.phases.counts = dict(st["phases"]["seconds"]), dict(st["phases"]["counts"])
    engine.log = MetricsLog(engine.run_dir, config.tensorboard, offset=st["metrics_offset"],
                            purge_step=state.step + 1, enabled=engine.is_main,
                            steps_per_epoch=engine.steps_per_epoch)
    engine.barrier()  # every rank has read the checkpoint before rank 0 prunes newer ones
    if engine.is_main:
        for newer_step, path in checkpoint_dirs(ckpt_root):
            if newer_step > ckpt_step:
                shutil.rmtree(path, ignore_errors=True)
    engine.saved_step = ckpt_step
    return state, rank_rng(engine, st, tensors, ckpt_dir), True


def remove_unfinished(engine: "Engine") -> None:
    """Remove the temporary directories of checkpoints a killed process never finished (rank 0)."""
    for leftover in engine.ckpt_root.glob(".tmp-*") if engine.ckpt_root.is_dir() and engine.is_main else ():
        shutil.rmtree(leftover, ignore_errors=True)


def save_checkpoint(engine: "Engine", state: TrainState) -> Path:
    """Write ``checkpoints/step-<step>/`` atomically (rank 0) and prune to the newest K.

    Raises:
        TrainingDivergedError: the loss, gradients or weights are not finite (nothing is written).
        RunFaultError: kind ``disk_full``.
    """
    check_finite(engine, state.step)
    if not all_finite(engine.unwrapped):
        raise TrainingDivergedError(f"the weights became NaN/Inf by step {state.step}; the last good checkpoint is kept",
                                    step=state.step)
    path = engine.ckpt_root / f"step-{state.step}"
    if engine.saved_step == state.step:  # saved already; decided from memory so every rank returns together
        return path
    with engine.phases.measure("checkpoint"):
        engine.timer.flush()
        rng_json, rng_tensors = capture_rng()
        rank_states = gather_rng(engine, (rng_json, rng_tensors)) if engine.world_size > 1 else None
        tensors = {
            "optimizer": engine.optimizer.state_dict(),
            "scheduler": engine.scheduler.state_dict(),
            "scaler": engine.scaler.state_dict() if engine.scaler is not None else {},
            "rng": rng_tensors,
            "running_loss": engine.running_loss.detach().cpu(),
            "timer": engine.timer.state_dict(),
        }
        state.elapsed_seconds = time.perf_counter() - engine.t_start
        trainer_state = state.to_dict() | {
            "format": CHECKPOINT_FORMAT, "identity": engine.identity,
            "phases": {"seconds": engine.phases.seconds, "counts": engine.phases.counts},
            "metrics_offset": engine.log.offset, "rng": rng_json,
        }
        if rank_states is not None:  # every rank's own states; "rng" stays rank 0's (what a reader of format 1 expects)
            tensors["rng_ranks"] = [t for _, t in rank_states]
            trainer_state["rng_ranks"] = [j for j, _ in rank_states]
        best = engine.best_state if state.best_step != state.step else None  # at the best step the weights are the best
        if engine.is_main:
            try:
                engine.log.sync()
                write_dir_atomic(path, lambda tmp: _fill_checkpoint(tmp, engine, best, tensors, trainer_state),
                                 extra={"step": state.step})
            except OSError as exc:
                if exc.errno in DISK_FULL:
                    raise disk_full_error(exc, f"checkpoint {path}", state.step) from exc
                raise
            for _, old in checkpoint_dirs(engine.ckpt_root)[engine.config.keep_checkpoints:]:
                shutil.rmtree(old, ignore_errors=True)
        engine.saved_step = state.step
        engine.barrier()
    return path


def save_best_weights(engine: "Engine", state: TrainState) -> None:
    """Load the best-on-validation weights into the model and save them to
    ``checkpoint/model.safetensors`` (rank 0, when ``save_best_checkpoint``): temp file, fsync,
    rename over the old file, directory fsync, so a crash or a full disk leaves the previous
    weights or the new ones, never neither.

    Raises:
        RunFaultError: kind ``disk_full`` naming the file and "free disk space then rerun".
    """
    e = engine
    if e.best_state is not None and state.best_step != state.step:
        e.unwrapped.load_state_dict(e.best_state)
    if not (e.config.save_best_checkpoint and e.is_main):
        return
    target = RunFolder(e.run_dir).best_weights
    try:
        target.parent.mkdir(exist_ok=True)
        with atomic_path(target) as tmp, disk_writes(tmp):
            save_model(e.unwrapped, str(tmp))
    except OSError as exc:
        raise_disk_full(exc, target, state.step)
        raise
