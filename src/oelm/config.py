"""Experiment configuration: a YAML file validated by Pydantic, overridable from the CLI.

An experiment is data (``configs/<name>.yaml``)::

    name: quickstart
    task: {dataset: sst2, train_samples: 8000, max_length: 128}
    model: {pretrained: sentence-transformers/all-MiniLM-L6-v2}
    methods:
      - {name: baseline, learning_rate: 1.0e-4}
      - {name: oelm_freeze, learning_rate: 2.0e-4}
    seeds: [0]
    training: {epochs: 1, batch_size: 32}

Unknown keys and wrong types are errors that name the key (with the closest valid key
suggested); inf/nan, booleans given for numbers, empty paths, seeds outside [0, 2**32) and
Adam betas outside [0, 1) are refused. ``key=value`` overrides use dotted paths
(``training.epochs=2``, ``seeds=[0,1,2]``, ``methods.0.learning_rate=1e-3``); values are parsed
as YAML (:mod:`oelm.config_io`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel, BeforeValidator, ConfigDict, Field, Strict, ValidationError, ValidationInfo, field_validator, model_validator,
)

from oelm.config_aliases import canonical_training
from oelm.config_io import (
    canonical_file, format_validation_error, override_changes, override_sites, parse_overrides, safe_load_unique,
    safetensors_problem, source_name,
)
from oelm.config_io import merge as _merge
from oelm.config_targets import Target, check_targets
from oelm.errors import ConfigError
from oelm.init_names import InitName  # the init table's names, without torch

if TYPE_CHECKING:
    from oelm.method import OELMConfig

__all__ = [
    "DatasetSource",
    "TaskConfig",
    "ModelConfig",
    "MethodEntry",
    "TrainingConfig",
    "ExperimentConfig",
    "load_config",
    "parse_overrides",
]


def _not_bool(value: Any) -> Any:
    # YAML's true/false would otherwise pass as 1/0 (`max_steps: true` trained one step).
    if isinstance(value, bool):
        raise ValueError(f"expected a number, not the boolean {str(value).lower()}")
    return value


# Integers: a boolean, a float or a string is an error, never silently 1 / truncated.
Int = Annotated[int, BeforeValidator(_not_bool), Strict()]
# Floats: a boolean is an error; inf / nan are refused by every model (allow_inf_nan=False).
Float = Annotated[float, BeforeValidator(_not_bool)]

#: Bounds no machine reaches: a value beyond is a typo or an attack, refused at validation.
MAX_CORES, MAX_GPUS = 4096, 1024

# Seeds feed numpy / torch generators, which take 0 <= seed < 2**32.
Seed = Annotated[int, BeforeValidator(_not_bool), Strict(), Field(ge=0, lt=2**32)]
Beta = Annotated[float, BeforeValidator(_not_bool), Field(ge=0, lt=1)]


def _not_blank(value: Any) -> Any:
    # An empty path or name would silently mean "here" or "the default" (`output_dir: ''` wrote to ./).
    if isinstance(value, str) and not value.strip():
        raise ValueError("is empty; give a value or leave the key out for its default")
    return value


Text = Annotated[str, BeforeValidator(_not_blank)]

# config_from_dict validates twice: first with this context, keys, types and bounds only (no check
# that imports torch, transformers or the data registry), so a typo fails in a fraction of a second.
_KEYS_ONLY = {"keys_only": True}


def _keys_only(info: ValidationInfo) -> bool:
    return bool((info.context or {}).get("keys_only"))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class DatasetSource(_Strict):
    """Your own dataset (``task.source``): local files, or a Hugging Face ``datasets`` id, with its
    columns. Registered under ``task.dataset`` and then loaded and checked like a shipped dataset
    (:mod:`oelm.data.sources`)."""

    files: dict[str, Text | list[Text]] | None = Field(
        None, description="Split -> file (or files): .csv, .tsv, .jsonl, .parquet (tables with the text and label "
        "columns), or .txt / .txt.gz (language modelling; documents separated by <|endoftext|>, else one per file). "
        "Relative paths are resolved against the working directory when the config is read.")
    hub: Text | None = Field(None, description="A Hugging Face datasets id (datasets.load_dataset), instead of files.")
    hub_config: Text | None = Field(None, description="The Hub dataset's configuration name (e.g. sst2 for nyu-mll/glue).")
    hub_splits: dict[str, Text] | None = Field(
        None, description="Our split -> the Hub's split name; default train, validation and test as named.")
    type: Literal["classification", "language_modeling"] | None = Field(
        None, description="Default: language_modeling for .txt files, classification otherwise.")
    text_columns: list[Text] = Field(
        default_factory=lambda: ["text"], min_length=1, max_length=2,
        description="The text column, or two for sentence pairs (e.g. [premise, hypothesis]).")
    label_column: Text = Field("label", description="Classification: the column of class ids (0..n-1) or label names.")
    label_names: list[Text] | None = Field(
        None, min_length=2, description="Classification: the name of class 0, 1, ...; labels may then be these names.")
    validation_holdout: Float | None = Field(
        None, gt=0, lt=1, description="No validation file: this fraction of train becomes validation (seeded, disjoint).")

    @field_validator("files")
    @classmethod
    def _absolute_paths(cls, files: dict[str, str | list[str]] | None) -> dict[str, str | list[str]] | None:
        # resolved once, when the config is read: the runs (another process, a Ray worker) read the same files
        if files is None:
            return None

        def absolute(path: str) -> str:
            return str(Path(path).expanduser().absolute())

        return {split: absolute(p) if isinstance(p, str) else [absolute(x) for x in p] for split, p in files.items()}


class TaskConfig(_Strict):
    """Which data, how much of it, and how it is tokenized."""

    dataset: str = Field(description="Registered dataset name (oelm.data.DATASETS), e.g. sst2, tinystories; with "
                         "task.source, the name you give your own data.")
    source: DatasetSource | None = Field(
        None, description="Your own data: files (CSV, TSV, JSON lines, Parquet, text) or a Hugging Face datasets id, "
        "with its columns; registered under task.dataset.")
    data_dir: Text | None = Field(None, description="Folder laid out like shared/data; default: $OELM_DATA_DIR.")
    train_split: str = "train"
    validation_split: str = "validation"
    test_split: str | None = Field(
        None, description="Evaluated once at the end with the best checkpoint; never used for selection. May name "
        "validation_split itself: the test set is then the rest of that split, disjoint from the validation_samples "
        "subset (for data with one held-out split, such as the local TinyStories sample).")
    train_samples: Int | None = Field(None, gt=0, description="Random training subset (documents for LM); None = all.")
    validation_samples: Int | None = Field(None, gt=0, description="Random validation subset; None = all.")
    test_samples: Int | None = Field(
        None, gt=0, description="Random subset of test_split (the same for every run); None = all. For test sets too large to "
        "evaluate on CPU (IMDB: 25,000 reviews).")
    subset_seed: Seed = Field(0, description="Seed of the subsets; fixed across methods and seeds so all runs see the same data.")
    max_length: Int = Field(128, gt=0, description="Classification: truncation length in tokens.")
    block_size: Int = Field(256, gt=1, description="Language modelling: tokens per packed block.")
    tokenizer: Text | None = Field(
        None,
        description="Language modelling / oelm GPT: 'gpt2' (local files under <data_dir>/tokenizers/gpt2), "
        "'bpe-<vocab_size>' trained on the training split, or the path of a tokenizer.json (e.g. the one a "
        "pretraining `oelm run` saved as <output_dir>/tokenizer.json, for init_from). Pretrained models use their "
        "own tokenizer.",
    )


    @model_validator(mode="after")
    def _known_dataset_and_splits(self, info: ValidationInfo) -> "TaskConfig":
        # Refused when the config is read, not after the output folder and the lock exist.
        if _keys_only(info):
            return self
        from oelm.data.registry import get_dataset_spec, resolve_split

        try:
            if self.source is not None:  # your own data: registered now, so every reader finds it by name
                from oelm.data.sources import register_source

                spec = register_source(self.dataset, self.source.model_dump())
            else:
                spec = get_dataset_spec(self.dataset)
        except ConfigError as err:
            raise ValueError(f"task.dataset: {err}" if self.source is None else str(err)) from None
        for key in ("train_split", "validation_split", "test_split"):
            split = getattr(self, key)
            if split is not None:
                try:
                    resolve_split(spec, split)
                except ConfigError as err:
                    hint = (f"; name its file in task.source.files.{split}" + (
                        " or hold validation out of train (task.source.validation_holdout: 0.1)" if key == "validation_split"
                        else "")) if self.source is not None and self.source.files else ""
                    raise ValueError(f"task.{key}: {err}{hint}") from None
        return self

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer_spec(cls, value: str | None) -> str | None:
        # A name is checked now; a path may be written later (by the pretraining run), so it is checked when loaded.
        if value is None or "/" in value or value.endswith(".json") or Path(value).expanduser().exists():
            return value
        match = re.fullmatch(r"bpe-(\d+)", value)
        if value != "gpt2" and not match:
            raise ValueError(f"unknown tokenizer {value!r}; use 'gpt2', 'bpe-<vocab_size>' (e.g. 'bpe-8192') or the path of a "
                             "tokenizer.json")
        if match and int(match.group(1)) < 257:
            raise ValueError(f"{value!r}: a byte-level BPE needs vocab_size >= 257 (256 bytes + <|endoftext|>)")
        return value

    @model_validator(mode="after")
    def _held_out_test(self) -> "TaskConfig":
        if self.test_samples is not None and self.test_split is None:
            raise ValueError(f"task.test_samples={self.test_samples} is set but task.test_split is not; name the test split "
                             "(e.g. test_split: test) or remove test_samples")
        if self.test_split is not None and self.test_split == self.validation_split and self.validation_samples is None:
            raise ValueError(
                f"task.test_split is the validation split ({self.test_split!r}) but task.validation_samples is not set: "
                "set task.validation_samples below the split's size, so the test set is the held-out rest of it"
            )
        return self


class ModelConfig(_Strict):
    """Exactly one of ``pretrained`` (a Hugging Face id or local dir) and ``gpt`` (an oelm GPT preset)."""

    pretrained: Text | None = Field(None, description="Hugging Face model id or local directory.")
    gpt: Text | None = Field(None, description="oelm GPT preset: gpt-tiny, gpt-medium-512.")
    gpt_overrides: dict[str, Any] = Field(default_factory=dict, description="GPTConfig fields to override.")
    trust_remote_code: bool = False
    architecture: dict[str, Any] | None = Field(
        None,
        description="Registry entry for a model type oelm does not know (oelm.architecture_from_dict keys: "
        "model_type, attention_pattern, query, key, num_heads, ...); registered when the model is built.",
    )

    @model_validator(mode="after")
    def _one_source(self, info: ValidationInfo) -> "ModelConfig":
        if (self.pretrained is None) == (self.gpt is None):
            raise ValueError("set exactly one of model.pretrained (Hugging Face id / local dir) and model.gpt (preset name)")
        if self.gpt is not None:
            if _keys_only(info):
                return self
            # Catch an unknown preset or a bad override (e.g. hidden_size not divisible by
            # num_heads) when the config is read, not when the first run builds its model.
            from oelm.models.gpt import gpt_config

            gpt_config(self.gpt, **self.gpt_overrides)
        elif self.gpt_overrides:
            raise ValueError("gpt_overrides applies to model.gpt only; a pretrained model keeps its own config.json")
        return self

    @property
    def display_name(self) -> str:
        return self.pretrained or f"oelm-{self.gpt}"


#: The PEFT LoraConfig fields a method's ``lora:`` may set (checked here without importing PEFT).
LORA_KEYS = frozenset({
    "r", "lora_alpha", "lora_dropout", "target_modules", "modules_to_save", "bias", "use_rslora", "fan_in_fan_out",
    "init_lora_weights", "layers_to_transform", "task_type",
})


class MethodEntry(_Strict):
    """One method of the comparison: a named method, optionally modified, with its learning rate."""

    name: str = Field(description="Run name; a named method (oelm.METHODS) unless `base` is given.")
    base: str | None = Field(None, description="Named method this one starts from (default: `name`).")
    learning_rate: Float | None = Field(None, gt=0, description="Overrides training.learning_rate for this method.")
    learning_rates: list[Float] | None = Field(
        None,
        min_length=1,
        description="Learning-rate candidates swept for this method (selected on validation only); "
        "overrides learning_rate and the experiment's learning_rates.",
    )
    training: dict[str, Any] = Field(
        default_factory=dict,
        description="TrainingConfig fields overridden for this method only (e.g. a different budget); "
        "empty = the experiment's training settings, the same for every method.",
    )
    init: InitName | None = Field(None, description="Q/K init kind, from the table oelm.init.INITS.")
    normal_std: Float | Literal["matched"] | None = None
    targets: list[Literal["query", "key"]] | None = None
    freeze: bool | None = None
    freeze_bias: bool | None = None
    extra_frozen_groups: list[str] | None = None
    reservoir_layers: list[Annotated[Int, Field(ge=0)]] | Literal["alternate"] | None = Field(
        None, description="OELMConfig.reservoir_layers: layers drawn at random and frozen whole (indices, or "
        "'alternate' = 1, 3, 5, ...).")
    fixed_attention: bool | None = Field(
        None, description="OELMConfig.fixed_attention: a frozen random attention map per head (oelm GPT only).")
    split_fused: bool | None = Field(
        None,
        description="OELMConfig.split_fused: false keeps a fused Q/K/V module (GPT-2 c_attn, GPT-NeoX "
        "query_key_value) fused in methods that do not target Q/K (baseline, oelm_ffn_only); default true "
        "splits it in every method so all run the same matmuls.",
    )
    lora: dict[str, Any] | None = Field(
        None,
        description="A PEFT LoRA adapter on top of the method (LoraConfig fields: r, lora_alpha, lora_dropout, "
        "target_modules, modules_to_save, ...): the method is applied first (frozen orthogonal Q/K for oelm_freeze), "
        "then LoRA freezes the rest and trains its matrices and modules_to_save (oelm.peft.add_lora; the peft extra).",
    )

    @field_validator("training", mode="before")
    @classmethod
    def _trainer_names(cls, value: Any) -> Any:
        # Hugging Face Trainer's names for the same settings (oelm.config_aliases); recorded under oelm's
        return canonical_training(value)

    @model_validator(mode="after")
    def _known_base(self, info: ValidationInfo) -> "MethodEntry":
        if self.learning_rates is not None:
            if any(not (isinstance(lr, (int, float)) and lr > 0) for lr in self.learning_rates):
                raise ValueError(f"method {self.name!r}: learning_rates must be positive numbers, got {self.learning_rates}")
            if len(set(self.learning_rates)) != len(self.learning_rates):
                raise ValueError(f"method {self.name!r}: learning_rates has duplicates: {self.learning_rates}")
        unknown = sorted(set(self.training) - set(TrainingConfig.model_fields))
        if unknown:
            raise ValueError(
                f"method {self.name!r}: training has unknown key(s) {unknown}; valid keys: {', '.join(TrainingConfig.model_fields)}"
            )
        if self.lora is not None:
            unknown = sorted(set(self.lora) - LORA_KEYS)
            if unknown or not self.lora.get("target_modules"):
                raise ValueError(f"method {self.name!r}: lora needs target_modules and takes only {sorted(LORA_KEYS)}; "
                                 f"got {sorted(self.lora)}")
        if "learning_rate" in self.training and (self.learning_rate is not None or self.learning_rates is not None):
            given = "learning_rate" if self.learning_rate is not None else "learning_rates"
            raise ValueError(
                f"method {self.name!r} sets both {given} and training.learning_rate; keep one (they mean the same: "
                "this method's rate)"
            )
        if _keys_only(info):
            return self
        from oelm.method import METHODS  # torch: only once the keys-only pass has found no typo

        base = self.base or self.name
        if self.base is not None and base not in METHODS:
            raise ValueError(f"method {self.name!r}: base {self.base!r} is not a named method ({', '.join(METHODS)})")
        if base not in METHODS:
            raise ValueError(
                f"method {self.name!r} is not a named method ({', '.join(METHODS)}); "
                "to define a new one, give `base:` naming the method it starts from"
            )
        self.oelm_config()  # init / normal_std / groups checked now, not when the first run builds its model
        return self

    def oelm_config(self) -> "OELMConfig":
        """The :class:`~oelm.method.OELMConfig` this entry describes."""
        from oelm.method import get_method  # torch: not needed to read a config (a typo fails before it loads)
        from oelm.structural import ALTERNATE

        changes: dict[str, Any] = {"method": self.name}
        for key in ("init", "normal_std", "freeze", "freeze_bias", "split_fused", "fixed_attention"):
            if getattr(self, key) is not None:
                changes[key] = getattr(self, key)
        if self.reservoir_layers is not None:
            changes["reservoir_layers"] = self.reservoir_layers if self.reservoir_layers == ALTERNATE else tuple(self.reservoir_layers)
        if self.targets is not None:
            changes["targets"] = tuple(self.targets)
        if self.extra_frozen_groups is not None:
            changes["extra_frozen_groups"] = tuple(self.extra_frozen_groups)
        return get_method(self.base or self.name).replace(**changes)


class TrainingConfig(_Strict):
    """Optimization, evaluation cadence and timing knobs (same for every method unless overridden)."""

    epochs: Float = Field(1.0, gt=0, description="Passes over the training data (fractions allowed).")
    max_steps: Int | None = Field(None, gt=0, description="Optimizer steps; overrides epochs when set.")
    batch_size: Int = Field(32, gt=0)
    eval_batch_size: Int = Field(128, gt=0)
    learning_rate: Float = Field(1e-4, gt=0)
    weight_decay: Float = Field(0.01, ge=0, description="AdamW decoupled decay on 2-D+ trainable weights only.")
    adam_betas: tuple[Beta, Beta] = Field((0.9, 0.999), description="AdamW (beta1, beta2), each in [0, 1).")
    adam_eps: Float = Field(1e-8, gt=0)
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
        # same settings (oelm.config_aliases), recorded under oelm's; refused with the key to use otherwise
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


class ExecutorConfig(_Strict):
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


_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")


class ExperimentConfig(_Strict):
    """A comparison: one task and model, several methods, several seeds.

    The protocol (see :mod:`oelm.matrix.plan`): each method's learning-rate candidates
    (:meth:`learning_rate_candidates`) are swept on ``sweep_seeds`` and the best on validation
    (mean over those seeds) is selected; then every seed runs at the selected rate. With a
    single candidate there is no sweep stage.
    """

    name: str = Field(description="Experiment name; also the default output folder outputs/<name>, so a plain folder name.")
    description: str = ""
    task: TaskConfig
    model: ModelConfig
    methods: list[MethodEntry] = Field(min_length=1)
    seeds: list[Seed] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    learning_rates: list[Float] | None = Field(
        None,
        min_length=1,
        description="Learning-rate candidates for every method without its own learning_rate(s); "
        "None = training.learning_rate only (no sweep).",
    )
    sweep_seeds: list[Seed] | None = Field(
        None, min_length=1, description="Seeds the learning-rate sweep runs on (a subset of seeds); default: the first seed."
    )
    init_from: Text | None = Field(
        None,
        description="Start every run from saved weights (pretrain-then-fine-tune): a safetensors file, or an "
        "`oelm run` output directory whose selected final run of the same method and seed is used. "
        "{method} and {seed} are substituted.",
    )
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig, description="Where the runs train (local or Ray).")
    output_dir: Text | None = Field(None, description="Default: outputs/<name>.")
    reference: dict[str, Float] = Field(
        default_factory=dict, description="Published numbers to show beside ours (method -> metric)."
    )
    reference_source: str = ""
    targets: dict[str, Target] = Field(
        default_factory=dict, description="Bounds a method's gap to baseline should meet (oelm.config_targets), e.g. "
        "oelm_freeze: {perplexity_ratio_max: 1.05}; checked pass / fail with its interval in the report.")

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        # The name becomes a path (outputs/<name>): refuse anything that could leave outputs/.
        if not _SAFE_NAME.fullmatch(value) or ".." in value:
            raise ValueError(
                "the experiment name becomes the folder outputs/<name>, so it may only use letters, digits and "
                "'_', '-', '.', '+' (at most 128, not starting with '.' or '-', no '..', no path separators), "
                "e.g. 'sst2-minilm'"
            )
        return value

    @model_validator(mode="after")
    def _unique_methods(self) -> "ExperimentConfig":
        names = [m.name for m in self.methods]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"methods has duplicate names {dup}")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds has duplicates: {self.seeds}")
        if self.learning_rates is not None:
            if any(lr <= 0 for lr in self.learning_rates) or len(set(self.learning_rates)) != len(self.learning_rates):
                raise ValueError(f"learning_rates must be distinct positive numbers, got {self.learning_rates}")
        if self.sweep_seeds is not None:
            extra = [s for s in self.sweep_seeds if s not in self.seeds]
            if extra or len(set(self.sweep_seeds)) != len(self.sweep_seeds):
                raise ValueError(f"sweep_seeds {self.sweep_seeds} must be distinct members of seeds {self.seeds}")
        for m in self.methods:
            try:
                TrainingConfig.model_validate(self.training.model_dump() | m.training)
            except ValidationError as err:
                first = err.errors()[0]
                raise ValueError(
                    f"methods[{m.name}].training.{'.'.join(map(str, first['loc']))}: "
                    f"{first['msg'].removeprefix('Value error, ')} (got {first.get('input')!r})"
                ) from None
        unknown = sorted(set(self.reference) - set(names))
        if unknown:
            raise ValueError(f"reference names {unknown}, which are not methods of this config ({', '.join(names)}); "
                             "key each published number by the method name it is shown beside")
        check_targets(self.targets, names)
        if self.init_from:
            for m in self.methods:
                for seed in self.seeds:
                    path = Path(self.init_from.replace("{method}", m.name).replace("{seed}", str(seed))).expanduser()
                    problem = safetensors_problem(path) if path.is_file() else None
                    if problem:
                        raise ValueError(
                            f"init_from: the file {path} {problem}; give a model.safetensors (e.g. <output_dir>/runs/"
                            "<run>/checkpoint/model.safetensors) or an `oelm run` output directory"
                        )
        if self.task.test_split and not self.training.save_best_checkpoint and any(
            len(self.learning_rate_candidates(m)) > 1 for m in self.methods
        ):
            raise ValueError(
                "a learning-rate sweep with a test split needs training.save_best_checkpoint: true "
                "(the selected sweep run is tested once from its best checkpoint)"
            )
        return self

    @model_validator(mode="after")
    def _methods_fit_the_model(self, info: ValidationInfo) -> "ExperimentConfig":
        """Methods that need a kind of model: refused when the config is read, not when a run builds it
        (in the full pass: the methods' configs need torch)."""
        if _keys_only(info):
            return self
        from oelm.data.registry import get_dataset_spec  # TaskConfig's full pass has imported it
        from oelm.structural import reservoir_indices  # torch, as the methods' configs

        check_targets(self.targets, [m.name for m in self.methods], get_dataset_spec(self.task.dataset).metric)

        num_layers = None
        if self.model.gpt is not None:
            from oelm.models.gpt import gpt_config  # already imported by ModelConfig's check of the preset

            num_layers = gpt_config(self.model.gpt, **self.model.gpt_overrides).num_layers
        for m in self.methods:
            cfg = m.oelm_config()
            if cfg.fixed_attention and self.model.gpt is None:
                raise ValueError(
                    f"method {m.name!r}: fixed_attention replaces the attention scores inside oelm's own GPT, but "
                    f"model.pretrained {self.model.pretrained!r} keeps its library's attention code; use model.gpt "
                    "(e.g. gpt-tiny) or drop this method"
                )
            if cfg.reservoir_layers and num_layers is not None:
                try:
                    reservoir_indices(cfg.reservoir_layers, range(num_layers))
                except ConfigError as exc:
                    raise ValueError(f"method {m.name!r}: {exc}") from None
        return self

    def learning_rate(self, method: MethodEntry) -> float:
        """The method's single learning rate (its first candidate)."""
        return self.learning_rate_candidates(method)[0]

    def learning_rate_candidates(self, method: MethodEntry) -> list[float]:
        """Candidates swept for ``method``, in config order: ``method.learning_rates``, else
        ``method.learning_rate`` (or, the same, ``method.training.learning_rate``), else the
        experiment's ``learning_rates``, else ``training.learning_rate``. One candidate = no sweep."""
        if method.learning_rates:
            return list(method.learning_rates)
        if method.learning_rate is not None:
            return [method.learning_rate]
        if "learning_rate" in method.training:
            return [float(method.training["learning_rate"])]
        if self.learning_rates:
            return list(self.learning_rates)
        return [self.training.learning_rate]

    def sweep_seed_list(self) -> list[int]:
        """Seeds of the learning-rate sweep (default: the first seed)."""
        return list(self.sweep_seeds) if self.sweep_seeds else self.seeds[:1]

    def training_for(self, method: MethodEntry) -> TrainingConfig:
        """The training settings of ``method``: the experiment's, with ``method.training`` applied.
        Equal for every method (equal budgets) unless a method overrides them."""
        if not method.training:
            return self.training
        return TrainingConfig.model_validate(self.training.model_dump() | method.training)


# --------------------------------------------------------------------------------------------
# Loading (overrides and error messages: oelm.config_io)
# --------------------------------------------------------------------------------------------


def config_from_dict(data: dict[str, Any], source: str = "(dict)", overrides: dict[str, str] | None = None) -> ExperimentConfig:
    """Validate a config mapping. Raises :class:`ConfigError` naming every bad key (and the
    command-line override that set it: ``overrides``, resolved key path -> ``key=value`` as typed,
    from :func:`oelm.config_io.override_sites`).

    Validated twice: first keys, types and bounds only (nothing that imports torch, so a typo is
    reported at once), then fully (named methods, datasets and splits, GPT presets)."""
    if not isinstance(data, dict):
        raise ConfigError(f"experiment config {source} must be a YAML mapping at the top level, got {type(data).__name__}")
    for context in (_KEYS_ONLY, None):
        try:
            config = ExperimentConfig.model_validate(data, context=context)
        except ValidationError as err:
            raise format_validation_error(err, source, ExperimentConfig, overrides) from None
        except ConfigError as err:
            raise ConfigError(f"invalid experiment config {source}: {err}") from None
    return config


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read, merge overrides into, and validate an experiment YAML file.

    Raises:
        ConfigError: missing file, a directory, malformed YAML (with line/column), unknown keys (with the
            closest valid key), wrong types or out-of-range values.
    """
    path = Path(path)
    if path.is_dir():
        found = sorted(p.name for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
        if found:
            shown = ", ".join(found[:10]) + (f" (and {len(found) - 10} more)" if len(found) > 10 else "")
            fix = f"pass one of its YAML files: {shown}, e.g. {path / found[0]}"
        else:
            fix = "it holds no .yaml file; pass a YAML file such as configs/quickstart.yaml"
        raise ConfigError(f"config file {path} is a directory, not a YAML file; {fix}")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist (configs live under configs/, e.g. configs/quickstart.yaml)")
    try:
        data = safe_load_unique(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"config file {path} is not valid YAML{where}: {problem}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text ({exc})") from None
    if data is None:
        raise ConfigError(f"config file {path} is empty")
    sites = None
    if overrides:
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must be a YAML mapping at the top level")
        data = _merge(canonical_file(data), override_changes(overrides))
        sites = override_sites(overrides, data)
    return config_from_dict(data, source=source_name(path), overrides=sites)
