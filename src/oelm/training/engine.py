"""The engine: the fixed parts of one run (Accelerate, optimizer, schedule, precision, timers).

:func:`build_engine` is public: ``oelm bench`` times the engine's own step
(:func:`oelm.training.step.optimizer_step`) on it beside a plain PyTorch loop, and
:func:`oelm.training.train` runs its loop on the same object.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader

from oelm.config import TrainingConfig
from oelm.errors import ConfigError, OELMError
from oelm.method.temperature import TEMPERATURE_NAME
from oelm.metrics import Metric, get_metric
from oelm.records import RunFolder
from oelm.runtime.distributed import cpu_only
from oelm.runtime.timing import PhaseTimer, StepTimer
from oelm.training.metrics_log import MetricsLog
from oelm.training.precision import Precision

if TYPE_CHECKING:
    from oelm.training.prediction_collector import SplitPredictions

__all__ = ["Engine", "build_engine", "build_optimizer", "check_warmup", "compile_mode", "compiled_graphs", "direct_step_safe",
           "make_scheduler", "optimizer_steps_per_epoch", "planned_total_steps", "use_fused_adamw", "with_learning_rate"]

#: Device types whose fused AdamW kernel the engine uses (one kernel per step instead of one per tensor).
FUSED_ADAMW_DEVICES = ("cuda", "cpu")


def use_fused_adamw(params: Iterable[torch.Tensor], device: torch.device | str | None = None) -> bool:
    """Should AdamW run fused? True when ``device`` (where the engine puts the model; default: the
    first parameter's) is CUDA or the CPU and every parameter is a floating tensor on the CPU or on
    ``device`` already (the engine moves the model there after building the optimizer). Otherwise
    (another device type, a meta or mixed placement) the per-tensor implementation."""
    params = list(params)
    if not params:
        return False
    device = torch.device(device) if device is not None else params[0].device
    if device.type not in FUSED_ADAMW_DEVICES:
        return False
    return all(p.is_floating_point() and p.device.type in ("cpu", device.type) for p in params)


def build_optimizer(model: nn.Module, learning_rate: float, config: TrainingConfig,
                    device: torch.device | str | None = None) -> torch.optim.AdamW:
    """AdamW over trainable parameters only; decay on >=2-D weights, none on biases and norms.

    Frozen parameters (``requires_grad=False``) are never handed to the optimizer, so neither
    the update nor the decoupled weight decay can change them. Fused (one kernel per step: ~6x
    faster than the per-tensor loop on CPU, 131 -> 23 ms for MiniLM) when :func:`use_fused_adamw`
    says so for ``device`` (default: where the parameters are); a dtype without a fused kernel falls back to the per-tensor loop.
    With ``config.head_temperature_lr_scale`` != 1, the learned per-head temperatures (parameters named
    ``head_temperature``, shape ``(num_heads,)``) form a third group at ``learning_rate x scale`` without
    decay; at 1 they stay in the no-decay group (the optimizer of every earlier run, unchanged).

    Raises:
        OELMError: the model has no trainable parameter.
        ConfigError: ``head_temperature_lr_scale`` != 1 and the model has no trainable temperature.
    """
    scale = config.head_temperature_lr_scale
    decay, no_decay, temperatures = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if scale != 1.0 and name.rsplit(".", 1)[-1] == TEMPERATURE_NAME:
            temperatures.append(p)
        else:
            (decay if p.ndim >= 2 else no_decay).append(p)
    if not decay and not no_decay and not temperatures:
        raise OELMError("the model has no trainable parameters; nothing to optimize")
    if scale != 1.0 and not temperatures:
        raise ConfigError(
            f"training.head_temperature_lr_scale={scale:g} but the model has no trainable {TEMPERATURE_NAME} "
            "parameter (only oelm_temperature and methods based on it learn one); drop the setting or use such a method"
        )
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
        {"params": temperatures, "weight_decay": 0.0, "lr": learning_rate * scale},
    ]
    groups = [g for g in groups if g["params"]]
    kwargs = {"lr": learning_rate, "betas": config.adam_betas, "eps": config.adam_eps}
    if use_fused_adamw(decay + no_decay + temperatures, device):
        try:
            return torch.optim.AdamW(groups, fused=True, **kwargs)
        except (RuntimeError, TypeError, ValueError):  # a dtype without a fused kernel
            pass
    return torch.optim.AdamW(groups, **kwargs)


def make_scheduler(optimizer: torch.optim.Optimizer, config: TrainingConfig, total_steps: int):
    """The learning-rate schedule of a run: linear warmup, then ``config.schedule``.

    ``linear`` / ``cosine``: decay to 0 at ``total_steps``; ``constant``: flat after warmup;
    ``wsd`` (warmup-stable-decay, Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training
    Beyond Fixed Training Durations"): flat after warmup, then a cosine decay to 0 over the last
    ``ceil(decay_ratio * total_steps)`` steps. Warmup is ``warmup_steps``, else
    ``int(warmup_ratio * total_steps)``. All come from ``transformers``' schedulers.

    Raises:
        ConfigError: ``warmup_steps`` is more than ``total_steps`` (the rate would stay a small
            fraction of the peak for the whole run).
    """
    from transformers import get_scheduler, get_wsd_schedule

    check_warmup(config, total_steps)
    warmup = config.warmup_steps if config.warmup_steps is not None else int(config.warmup_ratio * total_steps)
    if config.schedule == "wsd":
        decay = min(max(1, math.ceil(config.decay_ratio * total_steps)), max(1, total_steps - warmup))
        return get_wsd_schedule(optimizer, num_warmup_steps=warmup, num_decay_steps=decay,
                                num_training_steps=total_steps, decay_type="cosine")
    return get_scheduler("constant_with_warmup" if config.schedule == "constant" else config.schedule,
                         optimizer=optimizer, num_warmup_steps=warmup, num_training_steps=total_steps)


def check_warmup(config: TrainingConfig, total_steps: int, where: str = "") -> None:
    """Refuse a ``warmup_steps`` longer than the run's ``total_steps`` optimizer steps. The matrix
    driver calls it before any data is read when ``max_steps`` fixes the count; with an
    epoch-based count, :func:`make_scheduler` does once the data is there.

    Args:
        where: appended to the message when the settings are a method's (``" (method oelm)"``).

    Raises:
        ConfigError: naming both numbers and the fix (the rate would stay a small fraction of its peak).
    """
    if config.warmup_steps is not None and config.warmup_steps > total_steps:
        raise ConfigError(
            f"training.warmup_steps={config.warmup_steps} is longer than the run's {total_steps} planned optimizer "
            f"steps{where} (the learning rate would never reach its peak); lower training.warmup_steps or use "
            "training.warmup_ratio"
        )


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


def compiled_graphs() -> int:
    """Graphs ``torch.compile`` has compiled in this process so far (``torch._dynamo``'s
    ``unique_graphs`` counter): a run's difference counts its compilations, and those after the
    warm-up are recompilations for new shapes (see ``training.length_buckets``)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def compile_mode(config: TrainingConfig) -> str | None:
    """``torch.compile``'s ``mode`` for ``training.compile`` (``"default"`` for true), or None
    when the model runs eagerly (false)."""
    if config.compile is False:
        return None
    return "default" if config.compile is True else str(config.compile)


def with_learning_rate(config: TrainingConfig, learning_rate: float | None) -> TrainingConfig:
    """``config`` carrying ``learning_rate`` (the run's peak rate, e.g. a sweep point): the one
    carrier of the rate inside the engine. None keeps ``config.learning_rate``."""
    if learning_rate is None or learning_rate == config.learning_rate:
        return config
    return config.model_copy(update={"learning_rate": learning_rate})


@dataclass
class Engine:
    """The fixed parts of one run (nothing here changes from step to step except the device
    accumulators ``running_loss`` and ``grad_nonfinite``, read only at log steps).

    ``config`` carries the learning rate (:attr:`learning_rate`) and ``precision`` the autocast
    and gradient-scaler choice; ``model`` is the prepared (DDP/FSDP-wrapped, compiled) module,
    ``unwrapped`` the plain one whose weights are saved. ``direct``: the step calls torch itself
    instead of Accelerate's wrappers (:func:`direct_step_safe`).
    """

    accelerator: Accelerator
    model: nn.Module  # as prepared (DDP/FSDP-wrapped, compiled)
    unwrapped: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler | None
    config: TrainingConfig
    precision: Precision
    metric: Metric
    run_dir: Path
    identity: dict[str, Any]
    timer: StepTimer
    phases: PhaseTimer
    log: MetricsLog | None
    total_steps: int
    steps_per_epoch: int
    eval_every: int
    running_loss: torch.Tensor  # summed on the device: no sync per step
    grad_nonfinite: torch.Tensor  # OR over steps since the last check
    t_start: float = 0.0  # time.perf_counter() at the run's start: this process's start less earlier processes' time
    t_start_here: float = 0.0  # ... at this process's start of the run's clock
    best_state: dict[str, torch.Tensor] | None = None
    compiled: Any = None  # torch.compile wrapper, when training.compile
    warmup_batch: dict[str, torch.Tensor] | None = None  # the first batch_size training examples (warm-up)
    saved_step: int | None = None  # the step of the newest checkpoint on disk (the same on every rank)
    direct: bool = False  # one plain process: step with torch directly, not Accelerate's wrappers (direct_step_safe)
    graphs_at_start: int = 0  # torch._dynamo's graph count when the model was compiled (compiled_graphs)
    graphs_after_warmup: int = 0  # ... and after the warm-up pass compiled the first shapes
    loader_workers: int = 0  # the training DataLoader's worker processes (training.num_workers resolved)
    keep_predictions: bool = False  # a final run: validations keep per-example outcomes (predictions.npz)
    best_predictions: "SplitPredictions | None" = None  # ... those of the best validation so far

    @property
    def learning_rate(self) -> float:
        return self.config.learning_rate

    @property
    def raw_optimizer(self) -> torch.optim.Optimizer:
        """The ``torch.optim`` optimizer inside Accelerate's wrapper (the one the schedule and the
        fp16 scaler step)."""
        return getattr(self.optimizer, "optimizer", self.optimizer)

    @property
    def ckpt_root(self) -> Path:
        """``checkpoints/`` of the run folder (:attr:`oelm.records.RunFolder.checkpoints`)."""
        return RunFolder(self.run_dir).checkpoints

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
        return self.precision.autocast()

    def barrier(self) -> None:
        if self.world_size > 1:
            self.accelerator.wait_for_everyone()


def _accelerator(config: TrainingConfig) -> Accelerator:
    """Accelerate's state for this process: device placement, sharding, DDP or FSDP.

    Mixed precision is not handed to Accelerate (see :class:`~oelm.training.precision.Precision`)."""
    from accelerate import PartialState

    kwargs: dict[str, Any] = {"cpu": cpu_only()}
    if config.distributed == "fsdp" and PartialState(cpu=kwargs["cpu"]).num_processes > 1:
        from accelerate.utils import FullyShardedDataParallelPlugin

        # use_orig_params keeps each parameter's requires_grad: frozen Q/K stay out of the optimizer.
        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(use_orig_params=True)
    return Accelerator(**kwargs)


def direct_step_safe(accelerator: Accelerator) -> bool:
    """Can the step bypass Accelerate's wrappers with the same arithmetic? True on one plain
    process (no DDP, FSDP, DeepSpeed, XLA, Megatron), with no Accelerate gradient scaler and
    Accelerate's own accumulation count 1 (the engine accumulates itself). Then, as read in
    accelerate 1.x:

    * ``Accelerator.backward(loss)`` is ``(loss / 1).backward()``: dividing by 1 is exact, so
      ``loss.backward()`` gives the same gradients without the two extra operators;
    * ``Accelerator.clip_grad_norm_`` unscales nothing (no Accelerate scaler) and, with no DTensor
      gradient (only FSDP2 makes them), calls ``torch.nn.utils.clip_grad_norm_`` itself;
    * ``AcceleratedOptimizer.step`` (its LOMO check costs two ``importlib`` look-ups a step) steps
      the inner optimizer when gradients are synchronized, which they always are outside
      ``Accelerator.accumulate`` (never used here); ``zero_grad`` (an ``inspect.signature`` a
      step) calls the inner ``zero_grad(set_to_none=True)``.

    Elsewhere (several processes, sharding, Accelerate's scaler) the step keeps Accelerate's
    path: its gradient synchronization, sharded clipping and scaling are needed there."""
    from accelerate.utils import DistributedType

    return (accelerator.distributed_type == DistributedType.NO and accelerator.num_processes == 1
            and accelerator.scaler is None and accelerator.gradient_accumulation_steps == 1)


def data_generators(loader: DataLoader) -> list[torch.Generator]:
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


def fixed_batch(loader: DataLoader) -> dict[str, torch.Tensor] | None:
    """The first ``batch_size`` examples of ``loader``'s dataset, collated without touching any
    random number generator (the warm-up batch)."""
    dataset, size = getattr(loader, "dataset", None), getattr(loader, "batch_size", None)
    if dataset is None or not size or not hasattr(dataset, "__len__"):
        return None
    collate = loader.collate_fn or torch.utils.data.default_collate
    return collate([dataset[i] for i in range(min(size, len(dataset)))])


def _host_loader(accelerator: Accelerator, loader: DataLoader | None) -> DataLoader | None:
    """``loader`` sharded by Accelerate but left on the host: tokens are counted there (counting
    on a GPU would synchronize every step) and batches are moved with non_blocking copies, from
    pinned memory when the device is CUDA (so the copy overlaps the step)."""
    if loader is None:
        return None
    if accelerator.device.type == "cuda" and isinstance(loader, DataLoader):
        loader.pin_memory = True  # read by prepare_data_loader when it rebuilds the loader
    return accelerator.prepare_data_loader(loader, device_placement=False)


def setup(model: nn.Module, loaders: tuple, *, metric: Metric | str, config: TrainingConfig,
          run_dir: Path) -> tuple[Engine, tuple, list, list]:
    """Build the engine: optimizer, schedule, Accelerate preparation, timers, resume identity.

    Returns ``(engine, (train, eval, test loaders as prepared), data generators, their seeds)``.

    Raises:
        ConfigError: accumulation longer than an epoch, warmup longer than the run.
    """
    train_loader, eval_loader, test_loader = loaders
    if config.tensorboard:  # a one-time import of seconds: before the run's clock, not inside the first run
        from torch.utils import tensorboard  # noqa: F401
    accelerator = _accelerator(config)
    device = accelerator.device
    optimizer = build_optimizer(model, config.learning_rate, config, device)
    generators = data_generators(train_loader)
    base_seeds = [int(g.initial_seed()) for g in generators]
    sampler = getattr(train_loader, "sampler", None)
    if not generators and isinstance(sampler, torch.utils.data.RandomSampler):
        warnings.warn("the training loader shuffles without a torch.Generator; a resumed run will see a different "
                      "data order (give DataLoader(generator=torch.Generator().manual_seed(seed)))", RuntimeWarning,
                      stacklevel=3)
    batch_size = getattr(train_loader, "batch_size", None)
    warmup_batch = fixed_batch(train_loader) if config.timing_warmup_passes or config.compile else None
    model, optimizer = accelerator.prepare(model, optimizer)
    train_loader, eval_loader, test_loader = (_host_loader(accelerator, dl) for dl in (train_loader, eval_loader, test_loader))
    steps_per_epoch = optimizer_steps_per_epoch(len(train_loader), config.gradient_accumulation_steps)
    total_steps = planned_total_steps(config, steps_per_epoch)
    # on the optimizer Accelerate wraps: the fp16 GradScaler steps that one (see step.py), and the
    # schedule's "optimizer stepped" bookkeeping must see it
    scheduler = make_scheduler(getattr(optimizer, "optimizer", optimizer), config, total_steps)
    identity = {"learning_rate": config.learning_rate, "total_steps": total_steps, "steps_per_epoch": steps_per_epoch,
                "batch_size": batch_size, "data_seeds": base_seeds}
    if config.gradient_accumulation_steps > 1 or accelerator.num_processes > 1:
        identity |= {"gradient_accumulation_steps": config.gradient_accumulation_steps,
                     "num_processes": accelerator.num_processes}
    unwrapped = accelerator.unwrap_model(model)
    compiled = None
    mode = compile_mode(config)
    graphs_at_start = 0
    if mode is not None:
        graphs_at_start = compiled_graphs()
        compiled = model = torch.compile(model, mode=mode)
    precision = Precision(config.mixed_precision, device)
    engine = Engine(
        accelerator=accelerator, model=model, unwrapped=unwrapped, optimizer=optimizer, scheduler=scheduler,
        scaler=precision.grad_scaler(), config=config, precision=precision, metric=get_metric(metric),
        run_dir=run_dir, identity=identity,
        timer=StepTimer(device, warmup_steps=config.timing_warmup_steps), phases=PhaseTimer(device), log=None,
        total_steps=total_steps, steps_per_epoch=steps_per_epoch,
        eval_every=config.eval_every or max(1, steps_per_epoch // config.evals_per_epoch),
        running_loss=torch.zeros((), device=device), grad_nonfinite=torch.zeros((), dtype=torch.bool, device=device),
        compiled=compiled, warmup_batch=warmup_batch, direct=direct_step_safe(accelerator),
        graphs_at_start=graphs_at_start, graphs_after_warmup=graphs_at_start,
        loader_workers=int(getattr(train_loader, "num_workers", 0) or 0),
    )
    return engine, (train_loader, eval_loader, test_loader), generators, base_seeds


def build_engine(model: nn.Module, train_loader: DataLoader, *, config: TrainingConfig,
                 learning_rate: float | None = None, metric: Metric | str = "perplexity",
                 run_dir: Path | None = None) -> Engine:
    """The engine :func:`oelm.training.train` runs, without its loop, resume or files: for
    benchmarks that time the engine's own step (:func:`oelm.training.optimizer_step`) beside
    other code (``oelm bench``).

    ``train_loader`` decides the schedule's length (``config.max_steps`` or its epochs);
    ``learning_rate`` (default ``config.learning_rate``) is the peak rate. Nothing is written
    (``run_dir`` defaults to the current directory and is only recorded).

    Raises:
        OELMError: no trainable parameter, an empty loader.
        ConfigError: accumulation longer than an epoch, warmup longer than the run.
    """
    engine, _, _, _ = setup(model, (train_loader, None, None), metric=metric,
                            config=with_learning_rate(config, learning_rate), run_dir=Path(run_dir or "."))
    engine.log = MetricsLog(engine.run_dir, False, enabled=False)
    return engine
