"""Hugging Face ``Trainer``'s names in an experiment config's ``training`` (and a method's
``training``): accepted where they mean exactly what an oelm setting means, refused with the oelm
setting to use where they do not. The run records only oelm's name (``config.yaml``, the
fingerprint in ``experiment.json``, each ``result.json``).

Accepted (``transformers.TrainingArguments`` -> ``training.<oelm name>``):

==============================  =======================  =============================================
Trainer                          oelm                     why it is the same
==============================  =======================  =============================================
per_device_train_batch_size      batch_size               examples per micro-batch per process
per_device_eval_batch_size       eval_batch_size          examples per evaluation batch per process
num_train_epochs                 epochs                   passes over the data (fractions allowed;
                                                          ``max_steps`` overrides it in both)
eval_steps (a whole number)      eval_every               optimizer steps between validations
logging_steps (a whole number)   log_every                optimizer steps between train-loss records
save_steps (a whole number)      checkpoint_every         optimizer steps between resumable checkpoints
bf16 / fp16: true                mixed_precision          bf16 / fp16 autocast (both false: "no")
lr_scheduler_type                schedule                 linear, cosine: transformers' own schedulers
                                                          (oelm calls them); constant_with_warmup:
                                                          oelm's constant
adam_epsilon                     adam_eps                 AdamW epsilon
dataloader_num_workers           num_workers              DataLoader worker processes
torch_compile                    compile                  torch.compile the model
eval_on_start                    eval_at_start            also validate the untrained model at step 0
==============================  =======================  =============================================

``warmup_ratio`` is oelm's own name (Trainer 4.x had it too, with the same meaning: linear warmup
over that share of the optimizer steps). Refused, with what to write instead: a fractional
``eval_steps`` / ``logging_steps`` / ``save_steps`` / ``warmup_steps`` (Trainer reads a float below
1 as a share of the training steps), ``lr_scheduler_type: constant`` (Trainer's has no warmup),
the other schedulers, ``eval_strategy``, ``adam_beta1`` / ``adam_beta2``, ``seed`` and
``output_dir`` (top-level keys in oelm), and every other ``TrainingArguments`` field
(:data:`TRAINER_REFUSED`: optimizers, Hub upload, best-model selection, checkpoint strategies,
DeepSpeed, ...: each with the oelm key to use or the reason there is none). ``learning_rate``,
``weight_decay``, ``max_steps``, ``warmup_steps``, ``gradient_accumulation_steps``,
``max_grad_norm`` and ``report_to`` are oelm's names too (:data:`TRAINER_SAME`). A Trainer name
given beside its oelm name is refused too (keep one). A misspelt name is answered with the closest
oelm or Trainer name (:func:`trainer_hint`).

Pure Python, no torch: the config's keys are checked before any heavy import.
"""

from __future__ import annotations

import difflib
from typing import Any

__all__ = ["TRAINER_ALIASES", "TRAINER_REFUSED", "TRAINER_SAME", "canonical_training", "trainer_hint"]

#: Trainer name -> the oelm training setting that means the same.
TRAINER_ALIASES: dict[str, str] = {
    "per_device_train_batch_size": "batch_size",
    "per_device_eval_batch_size": "eval_batch_size",
    "num_train_epochs": "epochs",
    "eval_steps": "eval_every",
    "logging_steps": "log_every",
    "save_steps": "checkpoint_every",
    "bf16": "mixed_precision",
    "fp16": "mixed_precision",
    "lr_scheduler_type": "schedule",
    "adam_epsilon": "adam_eps",
    "dataloader_num_workers": "num_workers",
    "torch_compile": "compile",
    "eval_on_start": "eval_at_start",
}

#: Trainer names that are oelm's names too, with the same meaning (``training.<name>``).
TRAINER_SAME: frozenset[str] = frozenset({
    "learning_rate", "weight_decay", "max_steps", "warmup_steps", "gradient_accumulation_steps", "max_grad_norm",
    "report_to",
})

_BEST = ("the best weights are the best validation of the task's own metric (accuracy: higher, perplexity: lower; "
         "set by the task), and the test split is evaluated once with them at the end; training.save_best_checkpoint "
         "keeps them")
_EVAL = ("oelm's evaluation sums the metric and loss over batches on the device (nothing is gathered, concatenated "
         "or accumulated on the host); training.eval_batch_size sets its memory")
_LOADER = ("oelm builds its data loaders itself (the same batches for every method; pinned memory and persistent "
           "workers where they help); training.num_workers sets the workers")
_HUB = ("oelm works offline and never uploads; write a Hugging Face model folder with `oelm export RUN_DIR OUT` "
        "and upload OUT yourself (huggingface-cli upload)")
_LOGS = ("oelm logs every training.log_every optimizer steps on rank 0 (train.log, metrics.jsonl and training.report_to's "
         "trackers); nothing else to set")
_DISTRIBUTED = ("oelm configures Accelerate itself: training.distributed: ddp or fsdp, launched with accelerate launch "
                "or torchrun")
_CHECKPOINTS = ("oelm saves a resumable checkpoint every training.checkpoint_every optimizer steps (default: after every "
                "validation) and on SIGTERM/SIGINT, keeps the newest training.keep_checkpoints, and a rerun resumes "
                "from it (training.resume)")
_RECOMPUTE = ("oelm's training config has no activation recomputation (it trades step time for memory, and the "
              "comparison times steps); lower training.batch_size and raise training.gradient_accumulation_steps to fit "
              "memory")
_OPTIMIZER = ("oelm trains with AdamW only (torch.optim.AdamW over the trainable weights); set it with "
              "training.learning_rate, weight_decay, adam_betas and adam_eps")
_PHASES = "oelm always trains, validates, and evaluates the task's test split once at the end (when it has one)"

#: Trainer names with no oelm setting of the same meaning -> what to write instead, or why there is none.
#: With TRAINER_ALIASES and TRAINER_SAME this covers every ``transformers.TrainingArguments`` field
#: (tests/test_trainer_vocabulary.py introspects the dataclass, so a new field fails it until it is placed).
TRAINER_REFUSED: dict[str, str] = {
    "eval_strategy": "oelm validates training.evals_per_epoch times an epoch, or every training.eval_every optimizer "
                     "steps when that is set (and always at the end); set one of those",
    "evaluation_strategy": "oelm validates training.evals_per_epoch times an epoch, or every training.eval_every "
                           "optimizer steps when that is set (and always at the end); set one of those",
    "adam_beta1": "use training.adam_betas: [beta1, beta2]",
    "adam_beta2": "use training.adam_betas: [beta1, beta2]",
    "seed": "seeds are the experiment's top-level `seeds: [0, 1, 2]` (one run per method and seed)",
    "data_seed": "the training order follows each run's seed (the experiment's top-level `seeds`); task.subset_seed "
                 "picks the data subsets",
    "full_determinism": "each run is seeded by the experiment's top-level `seeds`; oelm does not force torch's "
                        "deterministic algorithms (they would change the step times the comparison measures)",
    "output_dir": "the output folder is the experiment's top-level `output_dir` (or oelm run --output-dir)",
    "lr_scheduler_kwargs": "oelm's schedules take no extra arguments; training.decay_ratio sets the decay of "
                           "schedule: wsd",
    "optim": _OPTIMIZER, "optim_args": _OPTIMIZER, "optim_target_modules": _OPTIMIZER,
    "label_smoothing_factor": "oelm's loss is plain cross-entropy (the loss and perplexity it reports are defined "
                              "on it); no label smoothing",
    "average_tokens_across_devices": "oelm's loss is each process's mean, averaged over the processes (as DDP's "
                                     "gradients are); not configurable",
    "bf16_full_eval": "evaluation runs under training.mixed_precision's autocast, as training does",
    "fp16_full_eval": "evaluation runs under training.mixed_precision's autocast, as training does",
    "tf32": "oelm leaves PyTorch's TF32 setting as the process has it (torch.backends.cuda.matmul.allow_tf32); "
            "the run's environment records the device",
    "activation_checkpointing": _RECOMPUTE, "activation_checkpointing_kwargs": _RECOMPUTE,
    "gradient_checkpointing": _RECOMPUTE, "gradient_checkpointing_kwargs": _RECOMPUTE,
    "torch_compile_backend": "training.compile uses torch.compile's default backend (inductor)",
    "torch_compile_mode": "write the mode as training.compile: default, reduce-overhead or max-autotune",
    "use_liger_kernel": "oelm trains the model's own modules (Liger's kernels would replace what is timed)",
    "liger_kernel_config": "oelm trains the model's own modules (Liger's kernels would replace what is timed)",
    "use_cache": "training never uses the key/value cache; nothing to set",
    "neftune_noise_alpha": "oelm adds no noise to the embeddings (NEFTune); not supported",
    "torch_empty_cache_steps": "oelm never empties the CUDA cache during a run (it would change the step times)",
    "auto_find_batch_size": "oelm keeps training.batch_size fixed so that every method trains on the same batches; a "
                            "run out of memory fails with one line naming training.batch_size",
    "logging_strategy": _LOGS, "logging_first_step": _LOGS, "log_on_each_node": _LOGS, "log_level": _LOGS,
    "log_level_replica": _LOGS,
    "logging_nan_inf_filter": "oelm stops a run whose loss or gradients turn NaN/Inf (a run fault, with one line), "
                              "never filters them",
    "include_num_input_tokens_seen": "oelm always records the tokens trained on (train_tokens in metrics.jsonl, "
                                     "budget in result.json)",
    "disable_tqdm": "write training.progress_bar: false",
    "run_name": "oelm names each run <method>-seed<k> (the output folder's layout); the experiment's top-level "
                "`name` names the matrix",
    "project": "the trackers group runs under the experiment's top-level `name`",
    "trackio_space_id": "oelm's trackers are tensorboard, wandb and mlflow (training.report_to); not Trackio",
    "trackio_bucket_id": "oelm's trackers are tensorboard, wandb and mlflow (training.report_to); not Trackio",
    "trackio_static_space_id": "oelm's trackers are tensorboard, wandb and mlflow (training.report_to); not Trackio",
    "eval_delay": "oelm validates on training.eval_every / evals_per_epoch from the start (training.eval_at_start "
                  "adds step 0)",
    "prediction_loss_only": "oelm's validation always computes the loss and the task's metric",
    "eval_do_concat_batches": _EVAL, "eval_use_gather_object": _EVAL, "eval_accumulation_steps": _EVAL,
    "include_for_metrics": _EVAL, "batch_eval_metrics": _EVAL,
    "save_strategy": _CHECKPOINTS, "save_on_each_node": _CHECKPOINTS, "enable_jit_checkpoint": _CHECKPOINTS,
    "restore_callback_states_from_checkpoint": _CHECKPOINTS,
    "save_total_limit": "write training.keep_checkpoints: N (the newest N resumable checkpoints; removed when the run "
                        "ends, the best weights kept by training.save_best_checkpoint)",
    "save_only_model": "the best weights are saved alone (training.save_best_checkpoint); resumable checkpoints "
                       "hold the optimizer too, or they could not resume",
    "resume_from_checkpoint": "training.resume: true (the default) resumes each run from the newest intact "
                              "checkpoint in its own run folder",
    "ignore_data_skip": "a resumed run continues where its sampler stopped (training.resume); not configurable",
    "push_to_hub": _HUB, "hub_token": _HUB, "hub_private_repo": _HUB, "hub_model_id": _HUB, "hub_strategy": _HUB,
    "hub_always_push": _HUB, "hub_revision": _HUB,
    "load_best_model_at_end": _BEST, "metric_for_best_model": _BEST, "greater_is_better": _BEST,
    "use_cpu": "oelm trains on the device Accelerate finds; hide the GPUs with CUDA_VISIBLE_DEVICES= to train on "
               "the CPU",
    "accelerator_config": _DISTRIBUTED, "parallelism_config": _DISTRIBUTED, "ddp_find_unused_parameters": _DISTRIBUTED,
    "ddp_bucket_cap_mb": _DISTRIBUTED, "ddp_broadcast_buffers": _DISTRIBUTED, "ddp_static_graph": _DISTRIBUTED,
    "ddp_backend": _DISTRIBUTED, "ddp_timeout": _DISTRIBUTED,
    "fsdp": "write training.distributed: fsdp (Accelerate's FSDP plugin, use_orig_params, so frozen Q/K stay frozen)",
    "fsdp_config": "write training.distributed: fsdp (Accelerate's FSDP plugin, use_orig_params, so frozen Q/K stay frozen)",
    "deepspeed": "oelm trains with DDP or FSDP (training.distributed), not DeepSpeed",
    "dataloader_drop_last": _LOADER, "dataloader_pin_memory": _LOADER, "dataloader_persistent_workers": _LOADER,
    "dataloader_prefetch_factor": _LOADER, "dataloader_multiprocessing_context": _LOADER, "dataloader_in_order": _LOADER,
    "remove_unused_columns": "the task's columns are task.source.text_columns and label_column (your own data) or "
                             "the registered dataset's",
    "label_names": "the label column is task.source.label_column (your own data) or the registered dataset's",
    "length_column_name": "training.group_by_length measures each example's tokens itself",
    "train_sampling_strategy": "the training order is random per seed; training.group_by_length: true batches "
                               "examples of similar length (transformers' LengthGroupedSampler)",
    "debug": "no debug modes; `oelm diagnose OUT` explains a failed run",
    "skip_memory_metrics": "oelm records the GPU's memory use in result.json (timing.gpu_telemetry) when it can; "
                           "not configurable",
    "do_train": _PHASES, "do_eval": _PHASES, "do_predict": _PHASES,
    "local_rank": "the launcher sets it (accelerate launch / torchrun), never a config",
}

# lr_scheduler_type value -> oelm schedule; None: refused (the reason is in _SCHEDULE_REFUSED)
_SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant_with_warmup": "constant"}
_SCHEDULE_REFUSED = {
    "constant": "Trainer's 'constant' has no warmup; write training.schedule: constant with training.warmup_steps: 0 "
                "(or lr_scheduler_type: constant_with_warmup to keep the warmup)",
    "warmup_stable_decay": "write training.schedule: wsd (warmup, constant, then a cosine decay over the last "
                           "training.decay_ratio of the steps; Trainer's takes its phase lengths from lr_scheduler_kwargs)",
}
# interval names whose Trainer value may be a share of the training steps (a float below 1)
_FRACTION_HINT = {
    "eval_steps": "training.evals_per_epoch: N (validations per epoch) or training.eval_every: N (steps)",
    "logging_steps": "training.log_every: N (steps)",
    "save_steps": "training.checkpoint_every: N (steps)",
    "warmup_steps": "training.warmup_ratio",
}


def _interval(name: str, value: Any, where: str) -> Any:
    """A Trainer step interval as oelm's whole number of steps (a share of the steps is refused)."""
    if isinstance(value, float) and not isinstance(value, bool) and 0 < value < 1:
        raise ValueError(f"{where}.{name}={value:g} is a share of the training steps (as Trainer reads a float below 1); "
                         f"oelm counts steps here: use {_FRACTION_HINT[name]}")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _schedule(value: Any, where: str) -> Any:
    if not isinstance(value, str):
        return value  # the schedule field's own check names the type
    key = value.strip().lower()
    if key in _SCHEDULES:
        return _SCHEDULES[key]
    if key in _SCHEDULE_REFUSED:
        raise ValueError(f"{where}.lr_scheduler_type={value!r}: {_SCHEDULE_REFUSED[key]}")
    raise ValueError(f"{where}.lr_scheduler_type={value!r} has no oelm schedule of the same shape; oelm's are "
                     "training.schedule: linear, cosine, constant (after warmup) or wsd")


def _precision(values: dict[str, Any], where: str) -> str:
    """bf16 / fp16 flags as oelm's ``mixed_precision``."""
    for flag in ("bf16", "fp16"):
        if flag in values and not isinstance(values[flag], bool):
            raise ValueError(f"{where}.{flag} takes true or false, got {values[flag]!r} (oelm's own key: "
                             "training.mixed_precision: bf16, fp16 or 'no')")
    if values.get("bf16") and values.get("fp16"):
        raise ValueError(f"{where}.bf16 and {where}.fp16 are both true; choose one: training.mixed_precision: bf16 or fp16")
    return "bf16" if values.get("bf16") else "fp16" if values.get("fp16") else "no"


def trainer_hint(name: str, keys: list[str]) -> str:
    """The "did you mean" of an unknown ``training`` key ``name``: the closest of oelm's ``keys``
    or of Trainer's names (:data:`TRAINER_ALIASES`, :data:`TRAINER_REFUSED`), said as such; ""
    when nothing is close (difflib's ratio below 0.75: a bare key list serves better than a wrong
    guess)."""
    trainer = [*TRAINER_ALIASES, *TRAINER_REFUSED]
    close = difflib.get_close_matches(name, [*keys, *trainer], n=1, cutoff=0.75)
    if not close:
        return ""
    guess = close[0]
    if guess in TRAINER_ALIASES:
        return f"did you mean {guess!r} (Hugging Face Trainer's name for training.{TRAINER_ALIASES[guess]})?"
    if guess in TRAINER_REFUSED and guess not in keys:
        return f"did you mean {guess!r}? That Trainer setting has no oelm key: {TRAINER_REFUSED[guess]}"
    return f"did you mean {guess!r}?"


def canonical_training(values: Any, where: str = "training") -> Any:
    """``values`` (a ``training`` mapping as written) with Trainer's names replaced by oelm's.

    Returns anything that is not a mapping unchanged (its type error is the schema's to report).

    Raises:
        ValueError: a refused Trainer name or value (the message names the oelm setting to use), or
            a Trainer name given beside the oelm name it stands for.
    """
    if not isinstance(values, dict) or not any(k in TRAINER_ALIASES or k in TRAINER_REFUSED or k == "warmup_steps"
                                               for k in values):
        return values
    for name in values:
        if name in TRAINER_REFUSED:
            raise ValueError(f"{where}.{name} is a Hugging Face Trainer setting oelm does not take: {TRAINER_REFUSED[name]}")
    out = {k: v for k, v in values.items() if k not in TRAINER_ALIASES}
    if "warmup_steps" in out:
        out["warmup_steps"] = _interval("warmup_steps", out["warmup_steps"], where)
    for name, value in values.items():
        target = TRAINER_ALIASES.get(name)
        if target is None:
            continue
        if target in values:
            raise ValueError(f"{where}.{name} (Hugging Face Trainer's name) and {where}.{target} (oelm's) are the same "
                             f"setting; keep one ({target})")
        if name in ("eval_steps", "logging_steps", "save_steps"):
            value = _interval(name, value, where)
        elif name == "lr_scheduler_type":
            value = _schedule(value, where)
        elif name in ("bf16", "fp16"):
            value = _precision(values, where)
        out[target] = value
    return out
