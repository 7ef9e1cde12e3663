"""Faults of a training run turned into one-line errors, and the stop signals.

NaN/Inf (:class:`TrainingDivergedError`), out of memory and a full disk become
:class:`~oelm.errors.RunFaultError` with a ``kind`` the matrix records; SIGTERM/SIGINT are caught
by :class:`StopSignals` and acted on after the current step.
"""

from __future__ import annotations

import errno
import math
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from oelm.errors import RunFaultError

if TYPE_CHECKING:
    from oelm.training.engine import Engine

__all__ = ["DISK_FULL", "StopSignals", "TrainingDivergedError", "all_finite", "check_finite", "disk_full_error",
           "is_oom", "oom_error", "raise_disk_full"]


class TrainingDivergedError(RunFaultError):
    """The training loss became NaN or infinite (``kind == "nan"``)."""

    def __init__(self, message: str, *, step: int | None = None) -> None:
        super().__init__(message, kind="nan", step=step)


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full_error(exc: OSError, what: str, step: int) -> RunFaultError:
    """The ``disk_full`` fault for ``exc`` (ENOSPC/EDQUOT) raised while writing ``what``."""
    return RunFaultError(
        f"no space left on the device while writing {what} at step {step} ({exc}); the last good checkpoint is "
        "intact. Free disk space (or lower training.keep_checkpoints) and run again to resume",
        kind="disk_full",
        step=step,
    )


def raise_disk_full(exc: OSError, path: Path | str, step: int) -> None:
    """Raise the ``disk_full`` fault for a finished run's file ``path`` when ``exc`` is ENOSPC/EDQUOT
    (returns otherwise: the caller re-raises ``exc``)."""
    if exc.errno in DISK_FULL:
        raise RunFaultError(
            f"no space left on the device while writing {path} at step {step} ({exc.strerror or exc}); "
            "free disk space then rerun",
            kind="disk_full",
            step=step,
        ) from exc


def is_oom(exc: BaseException) -> bool:
    """True for ``torch.OutOfMemoryError`` and RuntimeErrors whose message says out of memory."""
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
    )


def oom_error(exc: BaseException, batch: dict[str, torch.Tensor], step: int, field_name: str, where: str) -> RunFaultError:
    """The ``oom`` fault: names the batch shape and ``training.<field_name>`` to lower."""
    ids = batch.get("input_ids")
    size, length = (tuple(ids.shape) + (None,))[:2] if ids is not None else (None, None)
    smaller = max(1, size // 2) if size else 1
    shape = f"a batch of {size} sequences x {length} tokens" if length else f"a batch of {size} examples"
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return RunFaultError(
        f"out of memory during {where} at step {step} with {shape} (training.{field_name}={size}); "
        f"lower training.{field_name} (e.g. {smaller}), task.max_length/task.block_size, or use "
        f"training.mixed_precision=bf16 ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})",
        kind="oom",
        step=step,
    )


def all_finite(model: nn.Module) -> bool:
    """True when every parameter and buffer is finite (one device sync)."""
    flags = [torch.isfinite(t).all() for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()]
    return bool(torch.stack(flags).all()) if flags else True


def check_finite(engine: "Engine", at_step: int) -> None:
    """Raise TrainingDivergedError on a non-finite loss sum or gradient norm (syncs once; the
    loss sum is reduced over processes so every rank stops together)."""
    loss = engine.running_loss if engine.world_size == 1 else engine.accelerator.reduce(engine.running_loss.clone(), "sum")
    loss_sum = float(loss)
    if not math.isfinite(loss_sum) or bool(engine.grad_nonfinite):
        what = "training loss" if not math.isfinite(loss_sum) else "gradient norm"
        raise TrainingDivergedError(
            f"{what} became NaN/Inf by step {at_step} (learning rate {engine.learning_rate}); the last good checkpoint "
            "is kept. Lower the learning rate or enable gradient clipping (training.max_grad_norm)",
            step=at_step,
        )


class StopSignals:
    """SIGTERM/SIGINT handlers for the duration of a training loop (main thread only).

    The first signal only sets :attr:`signum`; the loop acts on it after the current step. A
    second signal raises ``KeyboardInterrupt`` at once (stop without a checkpoint).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopping without a checkpoint")
        self.signum = signum

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    @property
    def name(self) -> str | None:
        return signal.Signals(self.signum).name if self.signum is not None else None

    def requested(self, engine: "Engine", step: int) -> bool:
        """Did a SIGTERM/SIGINT arrive? Several processes agree at log intervals (one all-reduce
        there, none per step), so all of them stop after the same step."""
        if engine.world_size == 1:
            return self.signum is not None
        if step % engine.config.log_every:
            return False
        flag = torch.tensor(float(self.signum is not None), device=engine.device)
        return bool(engine.accelerator.reduce(flag, "sum") > 0)
