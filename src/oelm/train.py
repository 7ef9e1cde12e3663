"""One training loop for every method, model and device (Hugging Face Accelerate underneath).

The loop is deliberately plain: AdamW over ``requires_grad`` parameters only (frozen tensors
never enter the optimizer, so weight decay cannot move them), linear warmup then linear,
cosine, constant or warmup-stable-decay (``transformers``' schedulers), gradient accumulation,
gradient clipping, optional bf16 autocast and ``torch.compile``, validation every N steps and
at the end, optional early stopping on the validation metric, the best weights chosen on
validation only, a test split evaluated once with those best weights. Everything it measures
goes to ``metrics.jsonl`` (one JSON object per line) and TensorBoard. One process or many
(``accelerate launch`` / ``torchrun``: DDP, or FSDP through Accelerate's plugin); only rank 0
writes files.

Reading order: :func:`train` at the bottom calls, top-down, :func:`_setup` (the
:class:`_Engine`: optimizer, schedule, Accelerate), :func:`_warm_up`, :func:`_start_or_resume`
(a :class:`TrainState` from the newest checkpoint), :func:`_run_epochs` (each step is
:func:`optimizer_step`; :func:`_log_train`, :func:`_validate` (then :func:`_early_stop_due`)
and :func:`_save_checkpoint` on their cadence), :func:`_save_best_and_test` and :func:`_timing`.

Timing follows :mod:`oelm.timing`: each optimizer step is timed on its own (CUDA events read at
log intervals on GPU, ``perf_counter`` on CPU), time waiting for the data loader and time spent
validating are reported separately, and the first ``timing_warmup_steps`` are excluded from
per-step statistics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import os
import random
import re
import shutil
import signal
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import torch
from accelerate import Accelerator, skip_first_batches
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn
from torch.utils.data import DataLoader

from oelm.config import TrainingConfig
from oelm.errors import ConfigError, OELMError, RunFaultError, RunInterruptedError
from oelm.io import atomic_path, verify_dir, write_dir_atomic
from oelm.metrics import Metric, get_metric
from oelm.timing import PhaseTimer, StepTimer

__all__ = [
    "TrainingDivergedError", "TrainResult", "TrainState", "build_engine", "build_optimizer", "evaluate", "make_scheduler",
    "optimizer_step", "train",
    "higher_is_better",
]


class TrainingDivergedError(RunFaultError):
    """The training loss became NaN or infinite (``kind == "nan"``)."""

    def __init__(self, message: str, *, step: int | None = None) -> None:
        super().__init__(message, kind="nan", step=step)


def higher_is_better(metric: Metric | str) -> bool:
    """True for accuracy (%), False for perplexity (:attr:`oelm.metrics.Metric.higher_is_better`)."""
    return get_metric(metric).higher_is_better


@dataclass
class TrainResult:
    """What :func:`train` measured. Metric values: accuracy in %, perplexity as exp(mean token NLL)."""

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


def build_optimizer(model: nn.Module, learning_rate: float, config: TrainingConfig) -> torch.optim.AdamW:
    """AdamW over trainable parameters only; decay on >=2-D weights, none on biases and norms.

    Frozen parameters (``requires_grad=False``) are never handed to the optimizer, so neither
    the update nor the decoupled weight decay can change them.

    Raises:
        OELMError: the model has no trainable parameter.
    """
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.ndim >= 2 else no_decay).append(p)
    if not decay and not no_decay:
        raise OELMError("the model has no trainable parameters; nothing to optimize")
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    kwargs = {"lr": learning_rate, "betas": config.adam_betas, "eps": config.adam_eps}
    try:  # one fused kernel per step: ~6x faster than the per-tensor loop on CPU (131 -> 23 ms for MiniLM)
        return torch.optim.AdamW(groups, fused=True, **kwargs)
    except (RuntimeError, TypeError, ValueError):  # device/dtype without a fused kernel
        return torch.optim.AdamW(groups, **kwargs)


def _count_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Non-padding tokens of a host (CPU) batch: attention_mask sum, else every input id."""
    mask = batch.get("attention_mask")
    return int(mask.sum()) if mask is not None else int(batch["input_ids"].numel())


def autocast_context(device: torch.device, mixed_precision: str):
    """A factory of ``torch.autocast`` contexts for ``"bf16"``/``"fp16"``; a no-op for ``"no"``.

    Mixed precision is done with PyTorch's autocast per run rather than Accelerate's
    process-wide state, so runs with different precisions can follow each other in one process.
    """
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mixed_precision)
    if dtype is None:
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: Iterable[dict[str, torch.Tensor]], metric: Metric | str, mixed_precision: str = "no",
    accelerator: Accelerator | None = None,
) -> dict[str, float]:
    """Evaluate ``model`` on ``loader`` (under autocast when ``mixed_precision`` is bf16/fp16).

    With an ``accelerator`` of several processes, ``loader`` is that process's shard (as
    Accelerate prepared it): per-example sums are gathered with ``gather_for_metrics``, which
    drops the examples Accelerate repeated to even out the shards, so every example counts once
    and every process returns the same numbers.

    Returns:
        ``{"value": accuracy % or perplexity, "loss": mean loss, "n": examples or tokens}``.
        Perplexity is ``exp`` of the token-weighted mean next-token NLL.

    Raises:
        OELMError: the loader is empty.
    """
    metric = get_metric(metric)
    classification = metric.unit == "%"
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    autocast = autocast_context(device, mixed_precision)
    if accelerator is not None and accelerator.num_processes > 1:
        loss_sum, count, correct = _gathered_sums(model, loader, classification, autocast, accelerator)
    else:
        loss_sum, count, correct = 0.0, 0, 0
        for batch in loader:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with autocast():
                out = model(**batch)
            labels = batch["labels"]
            if classification:
                n = labels.numel()
                correct += int((out.logits.argmax(dim=-1) == labels).sum())
            else:
                n = int((labels[:, 1:] != -100).sum())
            loss_sum += float(out.loss) * n
            count += n
    model.train(was_training)
    if count == 0:
        raise OELMError("the evaluation split is empty")
    mean_loss = loss_sum / count
    value = 100.0 * correct / count if classification else math.exp(min(mean_loss, 700.0))
    return {"value": value, "loss": mean_loss, "n": count}


def _gathered_sums(model, loader, classification: bool, autocast, accelerator: Accelerator) -> tuple[float, int, int]:
    """(loss sum, examples or tokens, correct) over every process's shard, each example once."""
    import torch.nn.functional as F

    device = accelerator.device
    rows: list[torch.Tensor] = []
    for batch in loader:
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with autocast():
            logits = model(**batch).logits.float()
        labels = batch["labels"]
        if classification:
            loss = F.cross_entropy(logits, labels, reduction="none")  # (B,)
            stats = torch.stack([loss, torch.ones_like(loss), (logits.argmax(-1) == labels).float()], dim=1)
        else:  # logits[:, t] predicts labels[:, t + 1]; -100 is ignored
            target = labels[:, 1:]
            nll = F.cross_entropy(logits[:, :-1].transpose(1, 2), target, ignore_index=-100, reduction="none")  # (B, T-1)
            valid = (target != -100).float()
            stats = torch.stack([nll.sum(1), valid.sum(1), torch.zeros_like(valid[:, 0])], dim=1)
        rows.append(accelerator.gather_for_metrics(stats).double().sum(0))  # (3,) per batch, over processes
    if not rows:
        return 0.0, 0, 0
    total = torch.stack(rows).sum(0)
    return float(total[0]), int(total[1]), int(total[2])


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _disk_full_error(exc: OSError, what: str, step: int) -> RunFaultError:
    return RunFaultError(
        f"no space left on the device while writing {what} at step {step} ({exc}); the last good checkpoint is "
        "intact. Free disk space (or lower training.keep_checkpoints) and run again to resume",
        kind="disk_full",
        step=step,
    )


def _is_oom(exc: BaseException) -> bool:
    """True for ``torch.OutOfMemoryError`` and RuntimeErrors whose message says out of memory."""
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
    )


def _oom_error(exc: BaseException, batch: dict[str, torch.Tensor], step: int, field_name: str, where: str) -> RunFaultError:
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


class _MetricsLog:
    """Appends JSON lines to ``metrics.jsonl`` and mirrors scalars to TensorBoard.

    ``offset`` (bytes) is where a resumed run cuts the file, so no record is lost or repeated;
    TensorBoard events at or after ``purge_step`` are hidden for the same reason.
    """

    def __init__(self, run_dir: Path, tensorboard: bool, offset: int = 0, purge_step: int | None = None,
                 enabled: bool = True) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.enabled = enabled  # False on every process but rank 0: nothing is written
        self._offset = offset
        self._tb = None
        if not enabled:
            return
        self._fh = self.path.open("a+b")
        self._fh.truncate(offset)
        self._fh.seek(offset)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=purge_step)

    @property
    def offset(self) -> int:
        return self._fh.tell() if self.enabled else self._offset

    def write(self, record: dict[str, Any]) -> None:
        """Append one record. Raises RunFaultError(kind="disk_full") when the disk is full."""
        if not self.enabled:
            return
        try:
            self._fh.write((json.dumps(record) + "\n").encode("utf-8"))
            self._fh.flush()
        except OSError as exc:
            if exc.errno in _DISK_FULL:
                raise _disk_full_error(exc, "metrics.jsonl", record.get("step", 0)) from exc
            raise
        if self._tb is not None:
            kind, step = record["type"], record["step"]
            for k, v in record.items():
                if k not in ("type", "step") and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(f"{kind}/{k}", v, step)

    def sync(self) -> None:
        """Make the records written so far durable (called before a checkpoint refers to them)."""
        if not self.enabled:
            return
        self._fh.flush()
        os.fsync(self._fh.fileno())
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        self._fh.close()
        if self._tb is not None:
            self._tb.close()


class _StopSignals:
    """SIGTERM/SIGINT handlers for the duration of :func:`train` (main thread only).

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

    def __enter__(self) -> "_StopSignals":
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


# --------------------------------------------------------------------------------------------
# Checkpoints: run_dir/checkpoints/step-<N>/
# --------------------------------------------------------------------------------------------

CHECKPOINTS_DIR = "checkpoints"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_CHECKPOINT_FORMAT = 1


def _checkpoint_dirs(root: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step-<N>`` directory under ``root``, newest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(found, reverse=True)


def _data_generators(loader: DataLoader) -> list[torch.Generator]:
    """The distinct ``torch.Generator`` objects that decide a loader's order (loader, sampler,
    batch sampler's sampler)."""
    found: list[torch.Generator] = []
    candidates = [
        getattr(loader, "generator", None),
        getattr(getattr(loader, "sampler", None), "generator", None),
        getattr(getattr(getattr(loader, "batch_sampler", None), "sampler", None), "generator", None),
    ]
    for g in candidates:
        if isinstance(g, torch.Generator) and all(g is not h for h in found):
            found.append(g)
    return found


def _epoch_seed(base_seed: int, epoch: int) -> int:
    """Seed of one epoch's data order: a function of (loader seed, epoch) only, so a resumed
    run draws exactly the batches of an uninterrupted one."""
    return int(np.random.SeedSequence([base_seed, epoch]).generate_state(1, dtype=np.uint64)[0] >> 1)


def _capture_rng() -> tuple[dict[str, Any], dict[str, torch.Tensor | list[torch.Tensor]]]:
    """(JSON part: Python and NumPy states, tensor part: torch CPU and CUDA states)."""
    version, internal, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    json_part = {
        "python": [version, list(internal), gauss],
        "numpy": [np_name, np_keys.tolist(), int(np_pos), int(np_has_gauss), float(np_gauss)],
    }
    tensors: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors["cuda"] = torch.cuda.get_rng_state_all()
    return json_part, tensors


def _restore_rng(json_part: dict[str, Any], tensors: dict[str, Any]) -> None:
    version, internal, gauss = json_part["python"]
    random.setstate((version, tuple(internal), gauss))
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = json_part["numpy"]
    np.random.set_state((np_name, np.asarray(np_keys, dtype=np.uint32), np_pos, np_has_gauss, np_gauss))
    torch.set_rng_state(tensors["torch"])
    if "cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(tensors["cuda"])


def _gather_rng(engine: "_Engine", rng: tuple[dict[str, Any], dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Every rank's :func:`_capture_rng` states, in rank order (a collective: all ranks call it).

    The ranks start from one seed but part as soon as they draw different numbers of random
    values (dropout on classification batches padded to different lengths), so a checkpoint
    keeps each rank's own."""
    gathered: list[Any] = [None] * engine.world_size
    torch.distributed.all_gather_object(gathered, rng)
    return gathered


def _rank_rng(engine: "_Engine", st: dict[str, Any], tensors: dict[str, Any],
              ckpt_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """This process's RNG states from a checkpoint: its own (``rng_ranks``, written by a run on
    several processes), else rank 0's (``rng``: the only ones of a one-process checkpoint, and
    of a multi-process one written before per-rank states were kept; a warning says so)."""
    rank, world = engine.accelerator.process_index, engine.world_size
    json_ranks, tensor_ranks = st.get("rng_ranks") or [], tensors.get("rng_ranks") or []
    stored = min(len(json_ranks), len(tensor_ranks))
    if world > 1 and stored < world and engine.is_main:
        held = f"ranks 0-{stored - 1}" if stored else "rank 0 only (written before checkpoints kept every rank's)"
        warnings.warn(f"checkpoint {ckpt_dir} holds the RNG states of {held}: ranks {max(stored, 1)}-{world - 1} "
                      "resume with rank 0's, so their random draws (dropout) differ from an uninterrupted run's",
                      RuntimeWarning, stacklevel=3)
    return (json_ranks[rank], tensor_ranks[rank]) if rank < stored else (st["rng"], tensors["rng"])


def _all_finite(model: nn.Module) -> bool:
    """True when every parameter and buffer is finite (one device sync)."""
    flags = [torch.isfinite(t).all() for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()]
    return bool(torch.stack(flags).all()) if flags else True


def _fill_checkpoint(tmp: Path, unwrapped: nn.Module, best_state: dict[str, torch.Tensor] | None,
                     tensors: dict[str, Any], trainer_state: dict[str, Any]) -> None:
    save_model(unwrapped, str(tmp / "model.safetensors"))
    if best_state is not None:
        save_file(best_state, str(tmp / "best.safetensors"))
    torch.save(tensors, tmp / "state.pt")
    (tmp / "trainer_state.json").write_text(json.dumps(trainer_state) + "\n", encoding="utf-8")


def _find_checkpoint(root: Path, remove_bad: bool = True) -> tuple[int, Path] | None:
    """The newest checkpoint under ``root`` that passes its integrity check; every newer one
    that fails is reported with a warning and removed (by rank 0 only: ``remove_bad``)."""
    for step, path in _checkpoint_dirs(root):
        reason = verify_dir(path)
        if reason is None:
            return step, path
        warnings.warn(f"checkpoint {path} failed its integrity check ({reason}); skipped, using the previous one",
                      RuntimeWarning, stacklevel=3)
        if remove_bad:
            shutil.rmtree(path, ignore_errors=True)
    return None


# --------------------------------------------------------------------------------------------
# The engine: fixed parts of a run, the state that moves, and the steps of the loop
# --------------------------------------------------------------------------------------------


def make_scheduler(optimizer: torch.optim.Optimizer, config: TrainingConfig, total_steps: int):
    """The learning-rate schedule of a run: linear warmup, then ``config.schedule``.

    ``linear`` / ``cosine``: decay to 0 at ``total_steps``; ``constant``: flat after warmup;
    ``wsd`` (warmup-stable-decay, Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training
    Beyond Fixed Training Durations"): flat after warmup, then a cosine decay to 0 over the last
    ``ceil(decay_ratio * total_steps)`` steps. Warmup is ``warmup_steps``, else
    ``int(warmup_ratio * total_steps)``. All come from ``transformers``' schedulers.
    """
    from transformers import get_scheduler, get_wsd_schedule

    warmup = config.warmup_steps if config.warmup_steps is not None else int(config.warmup_ratio * total_steps)
    if config.schedule == "wsd":
        decay = min(max(1, math.ceil(config.decay_ratio * total_steps)), max(1, total_steps - warmup))
        return get_wsd_schedule(optimizer, num_warmup_steps=warmup, num_decay_steps=decay,
                                num_training_steps=total_steps, decay_type="cosine")
    return get_scheduler("constant_with_warmup" if config.schedule == "constant" else config.schedule,
                         optimizer=optimizer, num_warmup_steps=warmup, num_training_steps=total_steps)


def optimizer_steps_per_epoch(micro_batches_per_epoch: int, accumulation: int) -> int:
    """Optimizer steps in one pass over a loader of ``micro_batches_per_epoch`` batches.

    Raises:
        OELMError: fewer micro-batches than one optimizer step needs (empty split, or
            ``gradient_accumulation_steps`` larger than the loader).
    """
    if micro_batches_per_epoch == 0:
        raise OELMError("the training split is empty (0 batches)")
    steps = micro_batches_per_epoch // accumulation
    if steps == 0:
        raise ConfigError(
            f"training.gradient_accumulation_steps={accumulation} is more than the {micro_batches_per_epoch} batches of "
            "one epoch (per process); lower it or training.batch_size"
        )
    return steps


def planned_total_steps(config: TrainingConfig, steps_per_epoch: int) -> int:
    """Optimizer steps of a run: ``max_steps``, else ``ceil(epochs x steps_per_epoch)`` (at least 1).
    The one place this is computed (the loop, the schedule and ``status.json`` all use it)."""
    return config.max_steps or max(1, math.ceil(config.epochs * steps_per_epoch))


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


@dataclass
class _Engine:
    """The fixed parts of one :func:`train` call (nothing here changes from step to step except
    the device accumulators ``running_loss`` and ``grad_nonfinite``)."""

    accelerator: Accelerator
    model: nn.Module  # as prepared (DDP/FSDP-wrapped, compiled)
    unwrapped: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler | None
    config: TrainingConfig
    metric: Metric
    learning_rate: float
    run_dir: Path
    identity: dict[str, Any]
    timer: StepTimer
    phases: PhaseTimer
    log: "_MetricsLog"
    total_steps: int
    steps_per_epoch: int
    eval_every: int
    running_loss: torch.Tensor  # summed on the device: no sync per step
    grad_nonfinite: torch.Tensor  # OR over steps since the last check
    t_start: float = 0.0
    best_state: dict[str, torch.Tensor] | None = None
    compiled: Any = None  # torch.compile wrapper, when training.compile
    warmup_batch: dict[str, torch.Tensor] | None = None  # the first batch_size training examples (warm-up)
    saved_step: int | None = None  # the step of the newest checkpoint on disk (the same on every rank)

    @property
    def ckpt_root(self) -> Path:
        return self.run_dir / CHECKPOINTS_DIR

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    @property
    def world_size(self) -> int:
        return self.accelerator.num_processes

    @property
    def accumulation(self) -> int:
        return self.config.gradient_accumulation_steps

    def autocast(self):
        return autocast_context(self.device, self.config.mixed_precision)()

    def barrier(self) -> None:
        if self.world_size > 1:
            self.accelerator.wait_for_everyone()


def _accelerator(config: TrainingConfig) -> Accelerator:
    """Accelerate's state for this process: device placement, sharding, DDP or FSDP.

    Mixed precision is not handed to Accelerate (see :func:`autocast_context`)."""
    from accelerate import PartialState

    from oelm.distributed import cpu_only

    kwargs: dict[str, Any] = {"cpu": cpu_only()}
    if config.distributed == "fsdp" and PartialState(cpu=kwargs["cpu"]).num_processes > 1:
        from accelerate.utils import FullyShardedDataParallelPlugin

        # use_orig_params keeps each parameter's requires_grad: frozen Q/K stay out of the optimizer.
        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(use_orig_params=True)
    return Accelerator(**kwargs)


def _setup(model, loaders, *, metric, config, learning_rate, run_dir) -> tuple[_Engine, tuple, list, list]:
    """Build the engine: optimizer, schedule, Accelerate preparation, timers, resume identity.

    Returns ``(engine, (train, eval, test loaders as prepared), data generators, their seeds)``.
    """
    train_loader, eval_loader, test_loader = loaders
    if config.tensorboard:  # a one-time import of seconds: before the run's clock, not inside the first run
        from torch.utils import tensorboard  # noqa: F401
    accelerator = _accelerator(config)
    optimizer = build_optimizer(model, learning_rate, config)
    generators = _data_generators(train_loader)
    base_seeds = [int(g.initial_seed()) for g in generators]
    sampler = getattr(train_loader, "sampler", None)
    if not generators and isinstance(sampler, torch.utils.data.RandomSampler):
        warnings.warn("the training loader shuffles without a torch.Generator; a resumed run will see a different "
                      "data order (give DataLoader(generator=torch.Generator().manual_seed(seed)))", RuntimeWarning,
                      stacklevel=3)
    batch_size = getattr(train_loader, "batch_size", None)
    warmup_batch = _fixed_batch(train_loader) if config.timing_warmup_passes or config.compile else None
    model, optimizer = accelerator.prepare(model, optimizer)
    # Loaders are sharded by Accelerate but left on the host: tokens are counted there (counting
    # on a GPU would synchronize every step) and batches are moved with non_blocking copies.
    train_loader, eval_loader, test_loader = (
        accelerator.prepare_data_loader(dl, device_placement=False) if dl is not None else None
        for dl in (train_loader, eval_loader, test_loader)
    )
    steps_per_epoch = optimizer_steps_per_epoch(len(train_loader), config.gradient_accumulation_steps)
    total_steps = planned_total_steps(config, steps_per_epoch)
    scheduler = make_scheduler(optimizer, config, total_steps)
    identity = {"learning_rate": learning_rate, "total_steps": total_steps, "steps_per_epoch": steps_per_epoch,
                "batch_size": batch_size, "data_seeds": base_seeds}
    if config.gradient_accumulation_steps > 1 or accelerator.num_processes > 1:
        identity |= {"gradient_accumulation_steps": config.gradient_accumulation_steps,
                     "num_processes": accelerator.num_processes}
    device = accelerator.device
    unwrapped = accelerator.unwrap_model(model)
    compiled = None
    if config.compile:
        compiled = model = torch.compile(model)
    engine = _Engine(
        accelerator=accelerator, model=model, unwrapped=unwrapped, optimizer=optimizer, scheduler=scheduler,
        # fp16 needs loss scaling against gradient underflow; bf16 has fp32's exponent range and does not.
        scaler=torch.amp.GradScaler(device.type) if config.mixed_precision == "fp16" else None,
        config=config, metric=get_metric(metric), learning_rate=learning_rate, run_dir=run_dir, identity=identity,
        timer=StepTimer(device, warmup_steps=config.timing_warmup_steps), phases=PhaseTimer(device), log=None,
        total_steps=total_steps, steps_per_epoch=steps_per_epoch,
        eval_every=config.eval_every or max(1, steps_per_epoch // config.evals_per_epoch),
        running_loss=torch.zeros((), device=device), grad_nonfinite=torch.zeros((), dtype=torch.bool, device=device),
        compiled=compiled, warmup_batch=warmup_batch,
    )
    return engine, (train_loader, eval_loader, test_loader), generators, base_seeds


def build_engine(model: nn.Module, train_loader: DataLoader, *, config: TrainingConfig, learning_rate: float,
                 metric: Metric | str = "perplexity", run_dir: Path | None = None) -> _Engine:
    """The engine :func:`train` runs, without its loop, resume or files: for benchmarks that time
    the engine's own step (:func:`optimizer_step`) beside other code (``oelm bench``).

    ``train_loader`` decides the schedule's length (``config.max_steps`` or its epochs); nothing
    is written (``run_dir`` defaults to the current directory and is only recorded).
    """
    engine, _, _, _ = _setup(model, (train_loader, None, None), metric=metric, config=config,
                             learning_rate=learning_rate, run_dir=Path(run_dir or "."))
    engine.log = _MetricsLog(engine.run_dir, False, enabled=False)
    return engine


#: Identity entries recorded only when they differ from these (one process, no accumulation).
_IDENTITY_DEFAULTS = {"gradient_accumulation_steps": 1, "num_processes": 1}


def _identity_changes(saved: dict[str, Any], now: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{entry: (checkpoint's, this run's)}`` for each identity entry that differs. An entry
    left out for its default counts as the default on either side, so a checkpoint of several
    processes is refused by a one-process run too: each process's data shard, the global batch
    and the per-rank RNG states all depend on the number of processes."""
    keys = [*now, *(k for k in _IDENTITY_DEFAULTS if k not in now)]
    values = {k: (saved.get(k, _IDENTITY_DEFAULTS.get(k)), now.get(k, _IDENTITY_DEFAULTS.get(k))) for k in keys}
    return {k: v for k, v in values.items() if v[0] != v[1]}


def _start_or_resume(engine: _Engine) -> tuple[TrainState, tuple | None, bool]:
    """Open ``metrics.jsonl`` and load the newest intact checkpoint (when ``config.resume``).

    Returns ``(state, RNG states to restore once the first batch is drawn, resumed?)``.

    Raises:
        ConfigError: the checkpoint was written by a run with other settings.
    """
    config, ckpt_root = engine.config, engine.ckpt_root
    found = _find_checkpoint(ckpt_root, remove_bad=engine.is_main) if config.resume else None
    if found is None:
        if engine.is_main:
            shutil.rmtree(ckpt_root, ignore_errors=True)  # a fresh start: nothing of an older attempt stays
        engine.barrier()
        engine.log = _MetricsLog(engine.run_dir, config.tensorboard, offset=0, purge_step=0, enabled=engine.is_main)
        return TrainState(), None, False
    ckpt_step, ckpt_dir = found
    st = json.loads((ckpt_dir / "trainer_state.json").read_text(encoding="utf-8"))
    changed = _identity_changes(st["identity"], engine.identity)
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
        engine.best_state = load_file(str(src)) if src.is_file() else _cpu_copy(engine.unwrapped)
    engine.phases.seconds, engine.phases.counts = dict(st["phases"]["seconds"]), dict(st["phases"]["counts"])
    engine.log = _MetricsLog(engine.run_dir, config.tensorboard, offset=st["metrics_offset"],
                             purge_step=state.step + 1, enabled=engine.is_main)
    engine.barrier()  # every rank has read the checkpoint before rank 0 prunes newer ones
    if engine.is_main:
        for newer_step, path in _checkpoint_dirs(ckpt_root):
            if newer_step > ckpt_step:
                shutil.rmtree(path, ignore_errors=True)
    engine.saved_step = ckpt_step
    return state, _rank_rng(engine, st, tensors, ckpt_dir), True


def _cpu_copy(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def _fixed_batch(loader: DataLoader) -> dict[str, torch.Tensor] | None:
    """The first ``batch_size`` examples of ``loader``'s dataset, collated without touching any
    random number generator (the warm-up batch)."""
    dataset, size = getattr(loader, "dataset", None), getattr(loader, "batch_size", None)
    if dataset is None or not size or not hasattr(dataset, "__len__"):
        return None
    collate = loader.collate_fn or torch.utils.data.default_collate
    return collate([dataset[i] for i in range(min(size, len(dataset)))])


def _warm_up(engine: _Engine) -> float:
    """``config.timing_warmup_passes`` forward+backward passes on a fixed batch, then undone.

    Gradients are cleared, no optimizer step is taken and the RNG states are restored, so the run
    that follows is bit-identical to one without the warm-up; but the kernels, the allocator, the
    lazily imported modules and (``training.compile``) the compiled graph are ready before the
    run's clock starts, for every method alike. Returns the seconds it took (the compile time
    when compiling: the first compiled pass traces and compiles).
    """
    passes = engine.config.timing_warmup_passes if engine.compiled is None else max(1, engine.config.timing_warmup_passes)
    batch = engine.warmup_batch
    if batch is None or not passes:
        return 0.0
    rng = _capture_rng()
    try:
        _warm_up_passes(engine, batch, passes)
    except Exception as exc:
        if _is_oom(exc):
            engine.optimizer.zero_grad(set_to_none=True)
            raise _oom_error(exc, batch, 0, "batch_size", "the warm-up pass before training") from exc
        raise
    _restore_rng(*rng)
    return engine.phases.seconds.pop("warmup", 0.0)


def _warm_up_passes(engine: _Engine, batch: dict[str, torch.Tensor], passes: int) -> None:
    with engine.phases.measure("warmup"):
        for _ in range(passes):
            with engine.accelerator.no_sync(engine.model) if engine.world_size > 1 else contextlib.nullcontext():
                with engine.autocast():
                    loss = engine.model(**_to_device(batch, engine.device)).loss
                loss.backward()
            engine.optimizer.zero_grad(set_to_none=True)
        if engine.compiled is not None:  # the evaluation graph compiles too (eval mode, no grad)
            engine.model.eval()
            with torch.no_grad(), engine.autocast():
                engine.model(**_to_device(batch, engine.device))
            engine.model.train()


def _to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def _check_finite(engine: _Engine, at_step: int) -> None:
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


def _validate(engine: _Engine, state: TrainState, loader: DataLoader, at_step: int) -> None:
    """Evaluate on the validation loader, log it, keep the weights when they are the best, and
    count validations without an improvement (early stopping). The value is the same on every
    process (reduced over them in :func:`evaluate`), so every rank keeps the same best and count."""
    with engine.phases.measure("validation"):
        try:
            result = evaluate(engine.model, loader, engine.metric.name, engine.config.mixed_precision,
                              accelerator=engine.accelerator)
        except Exception as exc:
            if _is_oom(exc):
                raise _oom_error(exc, next(iter(loader)), at_step, "eval_batch_size", "validation") from exc
            raise
    state.last_eval = result
    record = {"type": "eval", "step": at_step, engine.metric.name: result["value"], "loss": result["loss"],
              "elapsed_seconds": time.perf_counter() - engine.t_start}
    engine.log.write(record)
    state.history.append(record)
    if state.best_value is None or engine.metric.better(result["value"], state.best_value):
        state.best_value, state.best_step = result["value"], at_step
        engine.best_state = _cpu_copy(engine.unwrapped)
    reference = state.early_stopping_reference
    if reference is None or engine.metric.improves(result["value"], reference, engine.config.early_stopping_min_delta):
        state.early_stopping_reference, state.evals_without_improvement = result["value"], 0
    else:
        state.evals_without_improvement += 1


def _early_stop_due(engine: _Engine, state: TrainState) -> bool:
    """Has the run gone ``early_stopping_patience`` validations without an improvement? Every
    process counts from the same reduced validation values; on several processes they also agree
    by an all-reduce (any says stop: all stop), so none can be left waiting in a collective."""
    patience = engine.config.early_stopping_patience
    if patience is None:
        return False
    due = state.evals_without_improvement >= patience
    if engine.world_size > 1:
        flag = torch.tensor(float(due), device=engine.device)
        due = bool(engine.accelerator.reduce(flag, "sum") > 0)
    return due


def _stop_early(engine: _Engine, state: TrainState) -> None:
    """Log the steps since the last train line (as at the last planned step) and the
    ``early_stop`` record; the caller leaves the loop and the run ends as a finished one."""
    if state.running_n:
        _log_train(engine, state)
    record = {"type": "early_stop", "step": state.step, "planned_steps": engine.total_steps,
              "evals_without_improvement": state.evals_without_improvement,
              "patience": engine.config.early_stopping_patience, "min_delta": engine.config.early_stopping_min_delta,
              "best_step": state.best_step, f"best_{engine.metric.name}": state.best_value,
              "elapsed_seconds": time.perf_counter() - engine.t_start}
    engine.log.write(record)
    state.history.append(record)


def _save_checkpoint(engine: _Engine, state: TrainState) -> Path:
    """Write ``checkpoints/step-<step>/`` atomically (rank 0) and prune to the newest K.

    Raises:
        TrainingDivergedError: the loss, gradients or weights are not finite (nothing is written).
        RunFaultError: kind ``disk_full``.
    """
    _check_finite(engine, state.step)
    if not _all_finite(engine.unwrapped):
        raise TrainingDivergedError(f"the weights became NaN/Inf by step {state.step}; the last good checkpoint is kept",
                                    step=state.step)
    path = engine.ckpt_root / f"step-{state.step}"
    if engine.saved_step == state.step:  # saved already; decided from memory so every rank returns together
        return path
    with engine.phases.measure("checkpoint"):
        engine.timer.flush()
        rng_json, rng_tensors = _capture_rng()
        rank_rng = _gather_rng(engine, (rng_json, rng_tensors)) if engine.world_size > 1 else None
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
            "format": _CHECKPOINT_FORMAT, "identity": engine.identity,
            "phases": {"seconds": engine.phases.seconds, "counts": engine.phases.counts},
            "metrics_offset": engine.log.offset, "rng": rng_json,
        }
        if rank_rng is not None:  # every rank's own states; "rng" stays rank 0's (what a reader of format 1 expects)
            tensors["rng_ranks"] = [t for _, t in rank_rng]
            trainer_state["rng_ranks"] = [j for j, _ in rank_rng]
        best = engine.best_state if state.best_step != state.step else None  # at the best step the weights are the best
        if engine.is_main:
            try:
                engine.log.sync()
                write_dir_atomic(path, lambda tmp: _fill_checkpoint(tmp, engine.unwrapped, best, tensors, trainer_state),
                                 extra={"step": state.step})
            except OSError as exc:
                if exc.errno in _DISK_FULL:
                    raise _disk_full_error(exc, f"checkpoint {path}", state.step) from exc
                raise
            for _, old in _checkpoint_dirs(engine.ckpt_root)[engine.config.keep_checkpoints:]:
                shutil.rmtree(old, ignore_errors=True)
        engine.saved_step = state.step
        engine.barrier()
    return path


def _next_batch(engine: _Engine, it: Iterator) -> dict[str, torch.Tensor] | None:
    with engine.timer.data_wait():
        return next(it, None)


def optimizer_step(engine: _Engine, state: TrainState, batch: dict[str, torch.Tensor], it: Iterator) -> torch.Tensor:
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
                batch = _next_batch(e, it)
            tokens += _count_tokens(batch)  # host tensors: no sync
            samples += int(batch["input_ids"].shape[0])
            last = micro == e.accumulation - 1
            sync = contextlib.nullcontext() if last or e.world_size == 1 else e.accelerator.no_sync(e.model)
            with sync:
                with e.autocast():
                    loss = e.model(**_to_device(batch, e.device)).loss
                scaled = loss / e.accumulation if e.accumulation > 1 else loss
                e.accelerator.backward(e.scaler.scale(scaled) if e.scaler else scaled)
            e.running_loss += loss.detach().float()
            state.batches_in_epoch += 1
        _apply_gradients(e)
    except Exception as exc:
        if _is_oom(exc):
            e.optimizer.zero_grad(set_to_none=True)
            raise _oom_error(exc, batch, state.step + 1, "batch_size", "training") from exc
        raise
    e.timer.end_step(tokens=tokens, samples=samples)
    state.running_n += e.accumulation
    state.step += 1
    return loss


def _apply_gradients(e: _Engine) -> None:
    """Unscale (fp16), clip, check the gradient norm for NaN/Inf (no sync), step, zero the grads."""
    if e.scaler:
        e.scaler.unscale_(e.optimizer)
    grad_norm = None
    if e.config.max_grad_norm is not None:
        grad_norm = e.accelerator.clip_grad_norm_(e.model.parameters(), e.config.max_grad_norm)
    elif e.scaler is None:
        grads = [p.grad for p in e.model.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.get_total_norm(grads) if grads else None
    if grad_norm is not None and e.scaler is None:  # fp16: the scaler skips inf steps by design
        e.grad_nonfinite.logical_or_(~torch.isfinite(grad_norm))
    if e.scaler:
        e.scaler.step(e.optimizer)
        e.scaler.update()
    else:
        e.optimizer.step()
    e.scheduler.step()
    e.optimizer.zero_grad(set_to_none=True)


def _log_train(engine: _Engine, state: TrainState) -> None:
    """Flush the timer, check for NaN/Inf and write the mean training loss since the last line
    (averaged over processes)."""
    engine.timer.flush()
    _check_finite(engine, state.step)
    loss_sum = engine.running_loss if engine.world_size == 1 else engine.accelerator.reduce(engine.running_loss.clone(), "mean")
    state.last_loss = float(loss_sum) / state.running_n
    engine.running_loss.zero_()
    state.running_n = 0
    record = {"type": "train", "step": state.step, "epoch": state.epoch, "loss": state.last_loss,
              "learning_rate": engine.scheduler.get_last_lr()[0],
              "step_ms": engine.timer.last_step_ms, "elapsed_seconds": time.perf_counter() - engine.t_start}
    engine.log.write(record)
    state.history.append(record)


class _EpochClock:
    """Seconds of training steps and data waits in the current epoch (validation and
    checkpointing excluded), carried over a resume."""

    _EXCLUDED = ("validation", "checkpoint")

    def __init__(self, phases: PhaseTimer, carried: float) -> None:
        self.phases = phases
        self.start = time.perf_counter() - carried
        self.excluded_before = self._excluded()

    def _excluded(self) -> float:
        return sum(self.phases.seconds.get(k, 0.0) for k in self._EXCLUDED)

    def seconds(self) -> float:
        return time.perf_counter() - self.start - (self._excluded() - self.excluded_before)


def _stop_requested(engine: _Engine, stop: _StopSignals, state: TrainState) -> bool:
    """Did a SIGTERM/SIGINT arrive? Several processes agree at log intervals (one all-reduce
    there, none per step), so all of them stop after the same step."""
    if engine.world_size == 1:
        return stop.signum is not None
    if state.step % engine.config.log_every:
        return False
    flag = torch.tensor(float(stop.signum is not None), device=engine.device)
    return bool(engine.accelerator.reduce(flag, "sum") > 0)


def _run_epochs(engine: _Engine, state: TrainState, loaders: tuple, generators: list, base_seeds: list,
                rng_to_restore: tuple | None, stop: _StopSignals, bar) -> bool:
    """The loop: epochs of optimizer steps, with logging, validation and checkpoints on their cadence.
    Returns True when it stopped early (``early_stopping_patience``), right after that validation.

    Raises:
        RunInterruptedError: a stop signal arrived; a checkpoint of the finished step was saved.
    """
    e, config = engine, engine.config
    train_loader, eval_loader, _ = loaders
    micro_batches_per_epoch = e.steps_per_epoch * e.accumulation
    stopped_early = False
    while state.step < e.total_steps and not stopped_early:
        clock = _EpochClock(e.phases, state.epoch_elapsed_seconds)
        state.epoch_elapsed_seconds = 0.0
        for g, seed in zip(generators, base_seeds):
            g.manual_seed(_epoch_seed(seed, state.epoch))
        with e.timer.data_wait():  # worker start-up counts as waiting for data
            loader = skip_first_batches(train_loader, state.batches_in_epoch) if state.batches_in_epoch else train_loader
            it = iter(loader)
            # The first fetch draws the loader's seeds (worker base seed, sampler order), so it
            # happens before the RNG states of a resumed run are restored.
            batch = next(it, None)
        if rng_to_restore is not None:
            _restore_rng(*rng_to_restore)
            rng_to_restore = None
        while state.step < e.total_steps and state.batches_in_epoch + e.accumulation <= micro_batches_per_epoch:
            if batch is None:
                batch = _next_batch(e, it)
                if batch is None:
                    break
            optimizer_step(e, state, batch, it)
            batch = None
            bar.update(1)
            if state.step % config.log_every == 0 or state.step == e.total_steps:
                _log_train(e, state)
                bar.set_postfix(loss=f"{state.last_loss:.4f}", refresh=False)
            validated = state.step % e.eval_every == 0 and state.step != e.total_steps
            if validated:
                _validate(e, state, eval_loader, state.step)
                bar.set_postfix(loss=f"{state.last_loss:.4f}", val=f"{state.last_eval['value']:.3f}", refresh=False)
                stopped_early = _early_stop_due(e, state)
                if stopped_early:
                    _stop_early(e, state)
                    break
            if _stop_requested(e, stop, state):
                state.epoch_elapsed_seconds = clock.seconds()
                path = _save_checkpoint(e, state)
                name = stop.name or "SIGTERM"
                raise RunInterruptedError(
                    f"{name} received: stopped after step {state.step} of {e.total_steps}, checkpoint {path}; "
                    "run again to resume from there",
                    step=state.step, signal_name=name,
                )
            periodic = state.step % config.checkpoint_every == 0 if config.checkpoint_every else validated
            if periodic and state.step != e.total_steps:
                state.epoch_elapsed_seconds = clock.seconds()
                _save_checkpoint(e, state)
                state.epoch_elapsed_seconds = 0.0  # the clock carries the epoch on; only a resume reads this
        state.per_epoch_seconds.append(clock.seconds())
        state.epoch += 1
        state.batches_in_epoch = 0
    return stopped_early


def _save_best_and_test(engine: _Engine, state: TrainState, test_loader: DataLoader | None) -> float | None:
    """Load the best-on-validation weights, save them (``checkpoint/model.safetensors``, rank 0)
    and evaluate the test split once with them. Returns the test value (None without a test split)."""
    e = engine
    if e.best_state is not None and state.best_step != state.step:
        e.unwrapped.load_state_dict(e.best_state)
    try:
        if e.config.save_best_checkpoint and e.is_main:
            ckpt = e.run_dir / "checkpoint"
            ckpt.mkdir(exist_ok=True)
            # temp file, fsync, rename over the old file, directory fsync: a crash or a full disk
            # leaves the previous weights or the new ones, never neither
            with atomic_path(ckpt / "model.safetensors") as tmp:
                save_model(e.unwrapped, str(tmp))
        test_value = None
        if test_loader is not None:
            with e.phases.measure("test"):
                test_value = evaluate(e.model, test_loader, e.metric.name, e.config.mixed_precision,
                                      accelerator=e.accelerator)["value"]
            e.log.write({"type": "test", "step": state.best_step, e.metric.name: test_value})
    except OSError as exc:
        if exc.errno in _DISK_FULL:
            raise _disk_full_error(exc, "the best weights", state.step) from exc
        raise
    finally:
        e.log.close()
    e.barrier()
    if e.is_main:
        shutil.rmtree(e.ckpt_root, ignore_errors=True)  # finished: the resumable state is no longer needed
    return test_value


def _timing(engine: _Engine, state: TrainState, warmup_seconds: float, telemetry: dict[str, Any] | None) -> dict[str, Any]:
    """``TrainResult.timing`` (see :func:`train`)."""
    e = engine
    summary = e.timer.summary()
    timing = {
        "total_seconds": time.perf_counter() - e.t_start,
        "train_seconds": summary["train_step_seconds"],
        "validation_seconds": e.phases.seconds.get("validation", 0.0),
        "checkpoint_seconds": e.phases.seconds.get("checkpoint", 0.0),
        "test_seconds": e.phases.seconds.get("test", 0.0),
        "data_seconds": summary["data_seconds"],
        "data_stall_seconds": summary.get("data_stall_seconds"),
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
        "mixed_precision": e.config.mixed_precision,
        "warmup_seconds": warmup_seconds,
        "compile": bool(e.config.compile),
        "compile_seconds": warmup_seconds if e.config.compile else None,
        "num_processes": e.world_size,
        "gradient_accumulation_steps": e.accumulation,
    }
    if e.world_size > 1:  # this process's tokens; the whole job's throughput is world_size times as many
        timing["tokens_per_second_all_processes"] = (summary["tokens_per_second"] or 0.0) * e.world_size or None
    timing["mfu"] = _mfu(e, summary)
    timing["gpu_telemetry"] = telemetry
    return timing


def _mfu(engine: _Engine, summary: dict[str, Any]) -> dict[str, Any] | None:
    """Model FLOPs utilization of the measured steps (:func:`oelm.environment.mfu_record`), or
    None when the model's FLOPs per token cannot be derived from its config."""
    from oelm.environment import mfu_record
    from oelm.flops import model_flops_per_token

    tokens, samples = summary["tokens"], summary["samples"]
    if not tokens or not samples or summary["tokens_per_second"] is None:
        return None
    seq_len = max(1, round(tokens / samples))  # mean tokens per sequence (block size for LM)
    try:
        flops = model_flops_per_token(engine.unwrapped, seq_len)
    except (ValueError, AttributeError, TypeError):
        return None
    return mfu_record(flops, summary["tokens_per_second"], engine.device, engine.config.mixed_precision)


def train(
    model: nn.Module,
    train_loader: DataLoader,
    eval_loader: DataLoader,
    *,
    metric: Metric | str,
    config: TrainingConfig,
    learning_rate: float,
    run_dir: Path,
    test_loader: DataLoader | None = None,
    description: str = "train",
) -> TrainResult:
    """Train ``model`` and select the best weights on ``eval_loader``; resumable at any step.

    Args:
        model: any module whose ``forward(**batch)`` returns an object with ``.loss`` and
            ``.logits`` (Hugging Face models, oelm's GPT), freshly built (its weights are
            replaced from a checkpoint when the run resumes).
        train_loader / eval_loader / test_loader: loaders of dict batches (``input_ids``,
            ``attention_mask``, ``labels``, ...) with the *per-process micro-batch* size.
            ``test_loader`` is evaluated once, after training, with the best-on-validation
            weights; it never influences selection. The training order is a function of (the
            seed of the train loader's ``torch.Generator``, epoch): each epoch reseeds the
            generator with ``_epoch_seed(seed, epoch)``. Launched on several processes
            (``accelerate launch`` / ``torchrun``), Accelerate shards every loader.
        metric: ``"accuracy"`` (higher is better, %) or ``"perplexity"`` (lower is better), or a
            :class:`oelm.metrics.Metric`.
        config: optimization, cadence, accumulation, compile and checkpoint knobs.
        learning_rate: peak learning rate after warmup.
        run_dir: where ``metrics.jsonl``, ``tensorboard/``, ``checkpoint/`` (best weights at the
            end) and ``checkpoints/step-<N>/`` (resumable state) go; only rank 0 writes.

    One optimizer step consumes ``gradient_accumulation_steps`` micro-batches per process, so
    the global batch is ``batch_size x gradient_accumulation_steps x processes``; an epoch is
    ``len(loader) // gradient_accumulation_steps`` steps (a remainder of micro-batches is left
    out). Validation sums are reduced over processes (each example counted once,
    ``gather_for_metrics``), so every rank selects the same best step.

    Before the clock starts, ``timing_warmup_passes`` forward+backward passes on a fixed batch
    are run and undone (:func:`_warm_up`): every run starts equally warm, and with
    ``compile`` the compilation happens there and is reported as ``compile_seconds``, outside
    ``total_seconds`` and every step time.

    Checkpoints and resume:
        Every ``config.checkpoint_every`` optimizer steps (default: after every validation) and
        on SIGTERM/SIGINT, ``checkpoints/step-<N>/`` is written atomically (temp dir, fsync,
        ``manifest.json`` with the sha256 of every file written last, rename): weights
        (``model.safetensors``), best-so-far weights (``best.safetensors``), optimizer,
        scheduler, gradient-scaler and torch/CUDA RNG states and the running loss and step
        times (``state.pt``, loaded with ``weights_only=True``), and ``trainer_state.json``
        (:class:`TrainState`: step, epoch, micro-batches consumed in the epoch, best metric and
        step, history, timing accumulators; the data seeds, Python/NumPy RNG states and the
        ``metrics.jsonl`` byte offset). On several processes rank 0 writes the checkpoint, and
        every rank's RNG states go into it (gathered to all ranks: ``rng_ranks`` in both files,
        beside rank 0's in ``rng``); each rank restores its own on resume (the ranks' states part
        as soon as they draw different numbers of random values, e.g. dropout on batches padded
        to different lengths). A checkpoint written before per-rank states were kept resumes with
        rank 0's states on every rank, with a warning. The number of processes is part of the
        resume identity (as are the batch size and the accumulation): a checkpoint written by
        another number of processes is refused. The newest ``config.keep_checkpoints`` are kept;
        all are removed when the run finishes. With ``config.resume`` (default), a call on a
        ``run_dir`` holding checkpoints continues from the newest one that passes its integrity
        check (failing ones are skipped with a warning), cutting ``metrics.jsonl`` back to that
        point. On CPU in fp32 in one process the resumed run's metrics and weights are
        bit-identical to an uninterrupted run's (tested); on two CPU processes (gloo) its train
        loss is identical at every step (tested, with dropout on). On GPU or with bf16/fp16 they
        are equal up to the non-determinism of the kernels used (not guaranteed bit-identical;
        the same holds for two uninterrupted GPU runs).

    Early stopping:
        With ``config.early_stopping_patience = P`` the run stops right after the validation that
        makes P in a row without an improvement: a value better than the last one that counted
        (the first validation counts) by more than ``config.early_stopping_min_delta`` (with the
        default 0: strictly better, so the run stops exactly P validations after its best one).
        It then ends as at its last planned step: the steps since the last train line are
        logged, an ``early_stop`` record goes to ``metrics.jsonl``, the best-on-validation
        weights are saved and tested once, the checkpoints are removed; no second validation of
        that step. ``TrainResult.early_stopped`` is True and ``steps`` counts the steps taken. The
        schedule is not re-planned: it was built for the planned ``total_steps`` and simply ends
        where it was (a linear or cosine decay has not reached 0). The count lives in
        :class:`TrainState`, so a resumed run continues it; on several processes every rank
        counts the same reduced values and they agree by an all-reduce before stopping.

    Faults:
        NaN/Inf in the training loss or the gradient norm is checked at log intervals (and
        before every checkpoint), not every step, so the step path never waits for the GPU;
        the run stops within ``log_every`` steps of the fault. A checkpoint is never written
        from non-finite weights, so the last one on disk is good. On several processes a stop
        signal is acted on at the next log interval, by every process after the same step.

    Returns:
        :class:`TrainResult` with ``timing``: ``total_seconds`` (whole run after the warm-up,
        summed over the processes of a resumed run; the time lost between a checkpoint and a
        kill is not counted, the steps redone are), ``train_seconds`` (sum of optimizer-step
        times), ``validation_seconds``, ``checkpoint_seconds``, ``data_seconds`` (waiting for
        batches), ``per_epoch_seconds`` (wall time of each epoch's training steps + data waits,
        validation and checkpointing excluded), ``per_step_ms`` {median, mean, p10, p90, n},
        ``step_ms`` (every non-warm-up step time in ms, 3 decimals, in step order, across
        resumes), ``process_start_steps`` (step at which each process started: ``[0]``, or
        ``[0, 40, ...]`` after resumes; the first ``timing_warmup_steps`` of *each* process are
        warm-up), ``tokens_per_second`` and ``samples_per_second`` (non-warm-up steps, this
        process), ``warmup_seconds`` / ``compile_seconds`` (the undone warm-up passes; compile
        time when ``compile``), ``num_processes``, ``gradient_accumulation_steps``, ``mfu``
        (:func:`oelm.environment.mfu_record`) and ``gpu_telemetry``
        (:class:`oelm.telemetry.GPUTelemetry` summary: utilisation, memory, temperature, power,
        clocks, min/median/max). ``stop_signal`` is the name of a SIGTERM/SIGINT that arrived
        during the final evaluation (the run was finished first); the caller should stop after
        saving it.

    Raises:
        TrainingDivergedError: (``RunFaultError``, kind ``"nan"``) NaN/Inf loss, gradients or weights.
        RunFaultError: kind ``"oom"`` (out of memory; the message names the batch size and
            length) or ``"disk_full"`` (ENOSPC/EDQUOT while writing a checkpoint or the
            metrics; the partial checkpoint is removed, the previous one is intact).
        RunInterruptedError: SIGTERM/SIGINT; a checkpoint of the finished step was saved and
            calling ``train`` again on the same ``run_dir`` resumes there.
        ConfigError: the checkpoint in ``run_dir`` belongs to a run with other settings, or
            ``gradient_accumulation_steps`` exceeds the batches of an epoch.
    """
    from tqdm.auto import tqdm

    from oelm.telemetry import GPUTelemetry

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    engine, loaders, generators, base_seeds = _setup(
        model, (train_loader, eval_loader, test_loader), metric=metric, config=config,
        learning_rate=learning_rate, run_dir=run_dir)
    warmup_seconds = _warm_up(engine)
    wall_start = time.perf_counter()
    state, rng_to_restore, resumed = _start_or_resume(engine)
    for leftover in engine.ckpt_root.glob(".tmp-*") if engine.ckpt_root.is_dir() and engine.is_main else ():
        shutil.rmtree(leftover, ignore_errors=True)  # a checkpoint a killed process never finished
    state.process_start_steps.append(state.step)
    engine.t_start = wall_start - state.elapsed_seconds

    bar = tqdm(total=engine.total_steps, initial=state.step, desc=description,
               disable=not config.progress_bar or not engine.is_main, dynamic_ncols=True, leave=True)
    if config.eval_at_start and not resumed:
        _validate(engine, state, loaders[1], 0)
    engine.model.train()
    if state.step >= engine.total_steps and state.batches_in_epoch:  # stopped by a signal right after the last step
        state.per_epoch_seconds.append(state.epoch_elapsed_seconds)
    stop = _StopSignals()
    telemetry = GPUTelemetry(engine.device)
    try:
        with stop, telemetry:
            stopped_early = _run_epochs(engine, state, loaders, generators, base_seeds, rng_to_restore, stop, bar)
            if not stopped_early:  # an early stop happens right after a validation of this step
                _validate(engine, state, loaders[1], state.step)
            stop_signal = stop.name
    finally:
        bar.close()
        engine.timer.flush()

    if stop_signal is not None:
        warnings.warn(f"{stop_signal} received during the final evaluation; the run was finished first",
                      RuntimeWarning, stacklevel=2)
    test_value = _save_best_and_test(engine, state, loaders[2])
    return TrainResult(
        metric=engine.metric.name,
        best_validation=float(state.best_value),
        best_step=state.best_step,
        final_validation=float(state.last_eval["value"]),
        final_train_loss=state.last_loss,
        steps=state.step,
        test=test_value,
        timing=_timing(engine, state, warmup_seconds, telemetry.summary()),
        history=state.history,
        stop_signal=stop_signal,
        early_stopped=stopped_early,
    )
