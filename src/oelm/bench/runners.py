"""The runners ``oelm bench`` interleaves: the engine's step and a plain PyTorch loop doing the same math.

* An **engine runner** steps with :func:`oelm.train.optimizer_step` itself, on an engine built by
  :func:`oelm.train.build_engine` (the code ``oelm run`` trains with).
* The **plain runner** is the reference loop a user would write by hand, doing the engine's math
  and nothing else::

      loss = model(**batch).loss                                   # under autocast for bf16
      loss.backward()
      norm = clip_grad_norm_(model.parameters(), max_grad_norm)    # TrainingConfig default 1.0
      nonfinite |= ~isfinite(norm)                                 # the NaN check, no host sync
      optimizer.step(); scheduler.step(); optimizer.zero_grad(set_to_none=True)
      running_loss += loss.detach().float()

  with the engine's optimizer (:func:`oelm.train.build_optimizer`: AdamW, the same parameter
  groups, weight decay, betas, eps and fused kernel) and schedule
  (:func:`oelm.train.make_scheduler`: warmup, then decay, over the same number of steps). So
  ``engine / plain`` is the engine's overhead, not a difference of features.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from oelm.errors import RunFaultError

__all__ = ["Runner", "engine_step", "find_batch_size", "frozen_bytes", "make_runners", "plain_step"]


@dataclass
class Runner:
    """One model copy with its optimizer, schedule, step kind and timer."""

    name: str
    kind: str  # "engine" | "plain"
    model: nn.Module  # what is called (compiled or not)
    base: nn.Module  # the nn.Module (for FLOPs, frozen tensors)
    optimizer: torch.optim.Optimizer
    scheduler: Any
    timer: Any
    frozen_before: dict[str, bytes]
    step_memory_mib: float | None = None
    compile_seconds: float | None = None
    losses: list[float] = field(default_factory=list)
    engine: Any = None  # oelm.train's engine (kind "engine")
    state: Any = None  # its TrainState
    max_grad_norm: float | None = None  # plain: the engine's clipping norm
    running_loss: torch.Tensor | None = None  # plain: the engine's loss accumulator
    grad_nonfinite: torch.Tensor | None = None  # plain: the engine's NaN/Inf flag


def engine_step(r: Runner, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """oelm's training step: :func:`oelm.train.optimizer_step` itself (forward, backward,
    clipping, the NaN check's accumulator, AdamW, schedule), timed by the engine's own timer."""
    from oelm.training import optimizer_step

    return optimizer_step(r.engine, r.state, batch, iter(()))


def plain_step(r: Runner, batch: dict[str, torch.Tensor], device: torch.device, autocast) -> torch.Tensor:
    """The reference: a hand-written PyTorch step with the engine's math (see the module docstring)."""
    x = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    with autocast():
        loss = r.model(**x).loss
    loss.backward()
    if r.max_grad_norm is not None:
        norm = torch.nn.utils.clip_grad_norm_(r.model.parameters(), r.max_grad_norm)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in r.model.parameters() if p.grad is not None])
    r.grad_nonfinite.logical_or_(~torch.isfinite(norm))
    r.optimizer.step()
    r.scheduler.step()
    r.optimizer.zero_grad(set_to_none=True)
    r.running_loss += loss.detach().float()
    return loss


def frozen_bytes(model: nn.Module) -> dict[str, bytes]:
    """Name -> raw bytes of every frozen (``requires_grad=False``) parameter."""
    return {n: p.detach().cpu().contiguous().numpy().tobytes() for n, p in model.named_parameters() if not p.requires_grad}


def training_config(learning_rate: float, steps: int, warmup_steps: int, precision: str):
    """The TrainingConfig every runner shares (defaults otherwise: clipping 1.0, weight decay, warmup ratio)."""
    from oelm.config import TrainingConfig

    return TrainingConfig(
        learning_rate=learning_rate, max_steps=steps, timing_warmup_steps=warmup_steps, timing_warmup_passes=0,
        compile=False, tensorboard=False, progress_bar=False, mixed_precision="bf16" if precision == "bf16" else "no",
    )


def make_runners(template: nn.Module, names: list[str], *, device: torch.device, steps: int, warmup_steps: int,
                 precision: str, learning_rate: float, seed: int, compile_mode: str | None) -> list[Runner]:
    """One runner per name: a method's engine (:func:`oelm.train.build_engine` over a copy of
    ``template`` with the method applied) or ``"plain"`` (baseline weights, the plain loop with the
    engine's optimizer and schedule). ``compile_mode`` (a torch.compile mode, or ``"default"``)
    compiles every runner's model the same way; None leaves them eager."""
    from torch.utils.data import DataLoader

    from oelm.method.apply import apply_oelm
    from oelm.runtime.timing import StepTimer
    from oelm.training import TrainState, build_engine, build_optimizer, make_scheduler

    training = training_config(learning_rate, steps, warmup_steps, precision)
    # The engine's loader only sizes the schedule: the bench feeds the same batches to every runner.
    sizing = DataLoader(list(range(steps)), batch_size=1)

    def compiled(module: nn.Module) -> nn.Module:
        if compile_mode is None:
            return module
        return torch.compile(module, mode=None if compile_mode == "default" else compile_mode)

    runners = []
    for name in names:
        base = copy.deepcopy(template)
        apply_oelm(base, "baseline" if name == "plain" else name, seed=seed)
        base.to(device).train()
        if name == "plain":
            optimizer = build_optimizer(base, learning_rate, training)
            runners.append(Runner(
                name, "plain", compiled(base), base, optimizer, make_scheduler(optimizer, training, steps),
                StepTimer(device, warmup_steps=warmup_steps), frozen_bytes(base), max_grad_norm=training.max_grad_norm,
                running_loss=torch.zeros((), device=device), grad_nonfinite=torch.zeros((), dtype=torch.bool, device=device)))
            continue
        engine = build_engine(base, sizing, config=training, learning_rate=learning_rate)
        engine.model = compiled(engine.model)
        runners.append(Runner(name, "engine", engine.model, base, engine.optimizer, engine.scheduler, engine.timer,
                              frozen_bytes(base), engine=engine, state=TrainState()))
    return runners


class _OutOfMemory(RuntimeError):
    """An engine OOM (a RunFaultError) in the words accelerate's batch-size search reacts to."""


def find_batch_size(fits: Callable[[int], None], start: int) -> int:
    """The largest batch ``start, start/2, start/4, ...`` for which ``fits(batch)`` raises no
    out-of-memory error (accelerate's ``find_executable_batch_size``, halving).

    ``fits`` runs whatever must fit (e.g. one step of every runner); an engine OOM
    (:class:`RunFaultError` of kind ``oom``) counts as out of memory too.

    Raises:
        RuntimeError: not even a batch of 1 fits.
    """
    from accelerate.utils import find_executable_batch_size

    size = start

    def halve() -> int:
        nonlocal size
        size //= 2
        return size

    @find_executable_batch_size(starting_batch_size=start, reduce_batch_size_fn=halve)
    def probe(batch_size: int) -> int:
        try:
            fits(batch_size)
        except RunFaultError as exc:
            if exc.kind != "oom":
                raise
            raise _OutOfMemory(f"CUDA out of memory. (engine: {exc})") from None
        return batch_size

    return probe()
