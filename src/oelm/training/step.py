"""One optimizer step of the engine, and the undone warm-up passes before a run's clock starts.

No host sync per step in fp32 and bf16: the loss is summed and the gradient norm's finiteness
OR-ed on the device (read at log steps, :func:`oelm.training.metrics_log.log_train`), tokens are
counted on the host batch. fp16 syncs only where the optimizer lacks amp-scaling support: with
the fused AdamW the engine builds (CUDA, CPU), ``GradScaler.step`` hands the inf flag to the
kernel instead of reading it.

On one plain process (:func:`oelm.training.engine.direct_step_safe`, ``engine.direct``) the step
calls torch itself: ``loss.backward()``, ``torch.nn.utils.clip_grad_norm_``, the inner
optimizer's ``step`` and ``zero_grad(set_to_none=True)`` — the same arithmetic as Accelerate's
wrappers there, without their Python per step (a launch-bound step pays for every call). With
several processes or sharding, Accelerate's ``backward``, ``clip_grad_norm_`` and optimizer do it.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Iterator

import torch

from oelm.training.faults import is_oom, oom_error
from oelm.training.rng import capture_rng, restore_rng

if TYPE_CHECKING:
    from oelm.training.engine import Engine
    from oelm.training.state import TrainState

__all__ = ["count_tokens", "next_batch", "optimizer_step", "to_device", "warm_up"]


def count_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Non-padding tokens of a host (CPU) batch: attention_mask sum, else every input id."""
    mask = batch.get("attention_mask")
    return int(mask.sum()) if mask is not None else int(batch["input_ids"].numel())


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """``batch`` on ``device`` with non-blocking copies (asynchronous from pinned host memory)."""
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def next_batch(engine: "Engine", it: Iterator) -> dict[str, torch.Tensor] | None:
    """The next batch of ``it`` (None at its end), the wait timed as data time."""
    with engine.timer.data_wait():
        return next(it, None)


def optimizer_step(engine: "Engine", state: "TrainState", batch: dict[str, torch.Tensor], it: Iterator) -> torch.Tensor:
    """One optimizer step over ``gradient_accumulation_steps`` micro-batches (``batch`` and the
    next ones drawn from ``it``, their waits timed as data time): forward, backward (the loss
    divided by the accumulation count; gradients synchronized across processes on the last
    micro-batch only), clipping, optimizer and scheduler step. Timed as one step with
    ``engine.timer``. Returns the last micro-batch's loss (a device tensor: reading it syncs).

    Raises:
        RunFaultError: kind ``oom``, naming the batch size to lower.
    """
    e = engine
    tokens = samples = 0
    e.timer.start_step()
    try:
        for micro in range(e.accumulation):
            if micro:
                batch = next_batch(e, it)
            tokens += count_tokens(batch)  # host tensors: no sync
            samples += int(batch["input_ids"].shape[0])
            last = micro == e.accumulation - 1
            sync = contextlib.nullcontext() if last or e.world_size == 1 else e.accelerator.no_sync(e.model)
            with sync:
                with e.autocast():
                    loss = e.model(**to_device(batch, e.device)).loss
                scaled = loss / e.accumulation if e.accumulation > 1 else loss
                _backward(e, e.scaler.scale(scaled) if e.scaler else scaled)
            e.running_loss += loss.detach().float()
            state.batches_in_epoch += 1
        _apply_gradients(e)
    except Exception as exc:
        if is_oom(exc):
            e.optimizer.zero_grad(set_to_none=True)
            raise oom_error(exc, batch, state.step + 1, "batch_size", "training") from exc
        raise
    e.timer.end_step(tokens=tokens, samples=samples)
    state.running_n += e.accumulation
    state.step += 1
    return loss


def _backward(e: "Engine", loss: torch.Tensor) -> None:
    """``loss.backward()`` on one plain process (``e.direct``), else Accelerate's backward (which
    divides by its own accumulation count, 1 here: the engine has divided already)."""
    if e.direct:
        loss.backward()
    else:
        e.accelerator.backward(loss)


def _apply_gradients(e: "Engine") -> None:
    """Unscale (fp16), clip, check the gradient norm for NaN/Inf (no sync), step, zero the grads."""
    # GradScaler keys its state by optimizer object and hands its inf flag to optimizers that take
    # it (fused AdamW: no .item()); Accelerate's wrapper hides that, so the scaler sees the inner one.
    scaled_opt = e.raw_optimizer if e.scaler else None
    if e.scaler:
        e.scaler.unscale_(scaled_opt)
    # one plain process: torch's own calls, which Accelerate's wrappers make there (see the module docstring)
    opt = e.raw_optimizer if e.direct else e.optimizer
    clip = torch.nn.utils.clip_grad_norm_ if e.direct else e.accelerator.clip_grad_norm_
    grad_norm = None
    if e.config.max_grad_norm is not None:
        grad_norm = clip(e.model.parameters(), e.config.max_grad_norm)
    elif e.scaler is None:
        grads = [p.grad for p in e.model.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.get_total_norm(grads) if grads else None
    if grad_norm is not None and e.scaler is None:  # fp16: the scaler skips inf steps by design
        e.grad_nonfinite.logical_or_(~torch.isfinite(grad_norm))
    if e.scaler:
        e.scaler.step(scaled_opt)
        e.scaler.update()
    else:
        opt.step()
    e.scheduler.step()
    opt.zero_grad(set_to_none=True)


def warm_up(engine: "Engine") -> float:
    """``config.timing_warmup_passes`` forward+backward passes on a fixed batch, then undone.

    Gradients are cleared, no optimizer step is taken and the RNG states are restored, so the run
    that follows is bit-identical to one without the warm-up; but the kernels, the allocator, the
    lazily imported modules and (``training.compile``) the compiled graph are ready before the
    run's clock starts, for every method alike. Returns the seconds it took (the compile time
    when compiling: the first compiled pass traces and compiles).

    Raises:
        RunFaultError: kind ``oom`` (the warm-up batch does not fit).
    """
    passes = engine.config.timing_warmup_passes if engine.compiled is None else max(1, engine.config.timing_warmup_passes)
    batch = engine.warmup_batch
    if batch is None or not passes:
        return 0.0
    rng = capture_rng()
    try:
        _warm_up_passes(engine, batch, passes)
    except Exception as exc:
        if is_oom(exc):
            engine.optimizer.zero_grad(set_to_none=True)
            raise oom_error(exc, batch, 0, "batch_size", "the warm-up pass before training") from exc
        raise
    restore_rng(*rng)
    if engine.compiled is not None:
        from oelm.training.engine import compiled_graphs

        engine.graphs_after_warmup = compiled_graphs()
    return engine.phases.seconds.pop("warmup", 0.0)


def _warm_up_passes(engine: "Engine", batch: dict[str, torch.Tensor], passes: int) -> None:
    with engine.phases.measure("warmup"):
        for _ in range(passes):
            with engine.accelerator.no_sync(engine.model) if engine.world_size > 1 else contextlib.nullcontext():
                with engine.autocast():
                    loss = engine.model(**to_device(batch, engine.device)).loss
                loss.backward()
            engine.optimizer.zero_grad(set_to_none=True)
        if engine.compiled is not None:  # the evaluation graph compiles too (eval mode, no grad)
            engine.model.eval()
            with torch.no_grad(), engine.autocast():
                engine.model(**to_device(batch, engine.device))
            engine.model.train()
