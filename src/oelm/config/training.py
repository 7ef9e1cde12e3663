"""How and where an experiment's runs train (:mod:`oelm.config`): ``training:``
(:class:`TrainingConfig`: optimization, evaluation cadence, checkpoints, timing knobs; Hugging Face
Trainer's names accepted through :mod:`oelm.config.aliases`) and ``executor:``
(:class:`ExecutorConfig`: local or Ray, never part of the config's fingerprint).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from oelm.config.aliases import canonical_training
from oelm.config.fields import MAX_CORES, MAX_GPUS, Beta, Float, Int, StrictModel

__all__ = ["ExecutorConfig", "TrainingConfig", "parse_ray_address"]


class TrainingConfig(StrictModel):
    """Optimization, evaluation cadence and timing knobs (same for every method unless overridden)."""

    epochs: Float = Field(1.0, gt=0, description="Passes over the training data (fractions allowed).")
    max_steps: Int | None = Field(None, gt=0, description="Optimizer steps; overrides epochs when set.")
    batch_size: Int = Field(32, gt=0)
    eval_batch_size: Int = Field(128, gt=0)
    learning_rate: Float = Field(1e-4, gt=0)
    weight_decay: Float = Field(0.01, ge=0, description="AdamW decoupled decay on 2-D+ trainable weights only.")
    adam_betas: tuple[Beta, Beta] = Field((0.9, 0.999), description="AdamW (beta1, beta2), each in [0, 1).")
    adam_eps: Float = Field(1e-8, gt=0)
    head_temperature_lr_scale: Float = Field(
        1.0, gt=0,
        description="Learning rate of the learned per-head temperatures (oelm_temperature's head_temperature "
        "parameters) as a multiple of the method's learning rate; the schedule scales both alike, and the "
        "temperatures get no weight decay. 1 (default): one rate for all. Adam moves a parameter by about the "
        "learning rate per step, so at 1e-4 a temperature near 2.5 changes by well under 1% in a few thousand "
        "steps; a larger scale lets it learn. Only parameters named head_temperature are affected.",
    )
    warmup_ratio: Float = Field(0.1, ge=0, lt=1, description="Linear warmup as a fraction of the steps.")
    warmup_steps: Int | None = Field(None, ge=0, description="Overrides warmup_ratio.")
    schedule: Literal["linear", "cosine", "constant", "wsd"] = Field(
        "linear",
        description="Learning rate after warmup: linear or cosine decay to 0, constant, or wsd "
        "(warmup-stable-decay: constant, then a cosine decay over the last decay_ratio of the steps).",
    )
    decay_ratio: Float = Field(0.2, gt=0, le=1, description="wsd: fraction of the optimizer steps in the final decay.")
    gradient_accumulation_steps: Int = Field(
        1, ge=1,
        description="Micro-batches per optimizer step; global batch = batch_size x gradient_accumulation_steps x "
        "number of processes (recorded in result.json budget.global_batch_size).",
    )
    max_grad_norm: Float | None = Field(1.0, gt=0, description="Gradient clipping; None disables it.")
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    compile: bool | Literal["default", "reduce-overhead", "max-autotune"] = Field(
        False,
        description="torch.compile the model: false (eager), true or \"default\", \"reduce-overhead\" (CUDA graphs) or "
        "\"max-autotune\" (torch.compile modes); compile time is measured during the warm-up pass and reported as "
        "timing.compile_seconds, outside every step time and total_seconds.",
    )
    length_buckets: bool | None = Field(
        None,
        description="Classification: pad each batch to the smallest of a few fixed lengths (powers of two from 16 up to "
        "task.max_length) instead of its longest example, so compiled code and CUDA graphs meet few shapes (attention "
        "masks keep padding inert: logits equal to ~1e-4). None (default): on when training.compile is set.",
    )
    timing_warmup_passes: Int = Field(
        1, ge=0,
        description="Forward+backward passes on a fixed training batch before the run's clock starts, then undone "
        "(gradients cleared, no optimizer step, RNG restored): every method starts timed runs equally warm "
        "(kernels, allocator, lazy imports, compilation). Does not change any result.",
    )
    distributed: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="Strategy when launched on several processes (accelerate launch / torchrun): DistributedDataParallel, "
        "or FSDP through Accelerate's plugin (use_orig_params, so frozen Q/K stay frozen).",
    )
    eval_every: Int | None = Field(None, gt=0, description="Validate every N optimizer steps (and at the end).")
    evals_per_epoch: Int = Field(2, gt=0, description="Used when eval_every is not set.")
    eval_at_start: bool = Field(False, description="Also validate the untrained model at step 0 (learning curves start there).")
    early_stopping_patience: Int | None = Field(
        None, gt=0,
        description="Stop after this many consecutive validations without an improvement of the validation metric "
        "(accuracy: higher, perplexity: lower); the test split is then evaluated with the best weights as at a normal "
        "end. The learning-rate schedule keeps its planned length (it is not shortened). None = never stop early.",
    )
    early_stopping_min_delta: Float = Field(
        0.0, ge=0,
        description="Early stopping: a validation counts as an improvement only when it beats the last counted one by "
        "more than this, in the metric's unit (accuracy points %, perplexity). The best weights are still the "
        "strictly best validation.",
    )
    log_every: Int = Field(10, gt=0, description="Steps between metric log lines and timer flushes.")
    timing_warmup_steps: Int = Field(5, ge=0, description="First steps excluded from per-step statistics.")
    num_workers: Annotated[Int, Field(ge=0, le=MAX_CORES)] | Literal["auto"] = Field(
        "auto",
        description="DataLoader worker processes per training process, or \"auto\": none on CPU (the cores train the "
        "model), on CUDA min(4, cores per local process - 1), the training loader's workers kept alive across epochs. "
        "Raise it when the report warns of data waits (timing.data_stall_seconds); it changes no result. "
        "At most the CPU cores of the machine that trains (checked before any data is prepared).",
    )
    group_by_length: bool = Field(
        False,
        description="Classification: batch examples of similar length together (transformers' LengthGroupedSampler, "
        "as Trainer(group_by_length=True)); less padding, same examples per epoch.",
    )
    save_best_checkpoint: bool = Field(True, description="Keep the best-on-validation weights (safetensors).")
    checkpoint_every: Int | None = Field(
        None, gt=0,
        description="Save a resumable checkpoint (run_dir/checkpoints/step-<N>/) every N optimizer steps; "
        "None = after every validation. A checkpoint is also saved on SIGTERM/SIGINT.",
    )
    keep_checkpoints: Int = Field(2, ge=1, description="Resumable checkpoints kept (the newest K); removed when the run finishes.")
    resume: bool = Field(
        True, description="Resume from the newest intact checkpoint in run_dir; False starts over (old checkpoints are removed)."
    )

    @model_validator(mode="before")
    @classmethod
    def _trainer_names(cls, data: Any) -> Any:
        # per_device_train_batch_size, num_train_epochs, bf16, ...: Hugging Face Trainer's names for the
        # same settings (oelm.config.aliases), recorded under oelm's; refused with the key to use otherwise
        return canonical_training(data)

    @field_validator("mixed_precision", mode="before")
    @classmethod
    def _yaml_no(cls, value: Any) -> Any:
        # YAML 1.1 reads an unquoted `no` as False; mean the string "no" (no mixed precision).
        return "no" if value is False else value

    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=lambda: ["tensorboard"],
        description="Experiment trackers each run logs its metrics.jsonl records to (as Trainer's report_to): "
        "tensorboard (run_dir/tensorboard), wandb (offline unless WANDB_MODE is set), mlflow (file store "
        "OUT/mlruns unless MLFLOW_TRACKING_URI is set); [] or none for none. wandb / mlflow need "
        'pip install "oelm[wandb]" / "oelm[mlflow]".',
    )
    tensorboard: bool = Field(True, description="Older spelling: false removes tensorboard from report_to; "
                              "after validation it says whether report_to has tensorboard.")
    progress_bar: bool = True

    @field_validator("report_to", mode="before")
    @classmethod
    def _report_to_list(cls, value: Any) -> Any:
        # "none" / null / a single name, as Trainer accepts; names in lower case, each once
        value = [] if value is None or value == "none" else [value] if isinstance(value, str) else value
        if isinstance(value, list):
            value = list(dict.fromkeys(v.strip().lower() if isinstance(v, str) else v for v in value))
        return value

    @model_validator(mode="after")
    def _tensorboard_alias(self) -> "TrainingConfig":
        # tensorboard: false (older configs) removes it from report_to; then the two agree
        if not self.tensorboard and "tensorboard" in self.report_to:
            self.__dict__["report_to"] = [n for n in self.report_to if n != "tensorboard"]
        self.__dict__["tensorboard"] = "tensorboard" in self.report_to
        return self


#: ``executor.address``: ``HOST:PORT`` or ``ray://HOST:PORT`` (IPv6 hosts in brackets).
_RAY_ADDRESS = re.compile(r"(ray://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?):([0-9]{1,5})")


def parse_ray_address(address: str) -> tuple[str, str, int] | None:
    """``("ray://" or "", host, port)`` of a Ray cluster address, None when it is not one."""
    match = _RAY_ADDRESS.fullmatch(address.strip())
    if not match or not 0 < int(match.group(3)) < 65536:
        return None
    return match.group(1) or "", match.group(2).strip("[]"), int(match.group(3))


class ExecutorConfig(StrictModel):
    """Where the ready runs of a matrix train (:mod:`oelm.matrix.executors`). Never part of the
    config's fingerprint: the same matrix may be continued by another executor."""

    name: Literal["local", "ray"] = Field(
        "local", description="local: in this process, one run after another (Ray never imported); "
        "ray: each run a Ray task, on a local Ray instance or the cluster at `address`.")
    address: str | None = Field(
        None, description="ray: HOST:PORT (or ray://HOST:PORT) of a running cluster to join, or 'auto' for the one "
        "RAY_ADDRESS names; default: start a local instance.")
    parallel: Int | Literal["auto"] | None = Field(
        None, description="Runs training at once. local: 1. ray: default 1; 'auto': one per GPU on a cluster "
        "with GPUs, else 1 (one line says which and why; docs/scaling.md, \"The demo in lanes\").")
    cpus_per_run: Float | None = Field(
        None, gt=0, le=MAX_CORES, description="CPU cores (and torch threads) per run. Default, under every executor: the "
        "`oelm run` process's own torch thread setting, so that both give the same numbers bit for bit.")
    gpus_per_run: Float = Field(0.0, ge=0, le=MAX_GPUS, description="ray: GPUs per run, fractions share one GPU (0.125 = 8 runs per GPU).")
    max_retries: Int = Field(2, ge=0, le=100, description="ray: times a run whose process or node died is started again "
                             "(it resumes from its own checkpoint).")

    @model_validator(mode="after")
    def _local_is_one_lane(self) -> "ExecutorConfig":
        if self.name == "local" and self.parallel not in (None, 1):
            raise ValueError(f"executor.parallel={self.parallel!r}: the local executor trains one run at a time; "
                             "use executor.name: ray (oelm run --executor ray) for runs side by side")
        if self.name == "local" and (self.address or self.gpus_per_run):
            raise ValueError("executor.address and executor.gpus_per_run are Ray settings; set executor.name: ray")
        if isinstance(self.parallel, int) and not 1 <= self.parallel <= MAX_CORES:
            raise ValueError(f"executor.parallel={self.parallel}: give 1 to {MAX_CORES} runs at once, or 'auto'")
        if self.address is not None and self.address != "auto" and parse_ray_address(self.address) is None:
            raise ValueError(f"executor.address={self.address!r}: give HOST:PORT of the cluster's head (the port of "
                             "`ray start --head --port=PORT`), ray://HOST:PORT, or auto (with RAY_ADDRESS set)")
        return self
