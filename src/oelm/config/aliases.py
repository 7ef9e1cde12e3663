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
==============================  =======================  =============================================

``warmup_ratio`` is oelm's own name (Trainer 4.x had it too, with the same meaning: linear warmup
over that share of the optimizer steps). Refused, with what to write instead: a fractional
``eval_steps`` / ``logging_steps`` / ``save_steps`` / ``warmup_steps`` (Trainer reads a float below
1 as a share of the training steps), ``lr_scheduler_type: constant`` (Trainer's has no warmup),
the other schedulers, ``eval_strategy``, ``adam_beta1`` / ``adam_beta2``, ``seed`` and
``output_dir`` (top-level keys in oelm). A Trainer name given beside its oelm name is refused too
(keep one).

Pure Python, no torch: the config's keys are checked before any heavy import.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TRAINER_ALIASES", "TRAINER_REFUSED", "canonical_training"]

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
}

#: Trainer names with no oelm setting of the same meaning -> what to write instead.
TRAINER_REFUSED: dict[str, str] = {
    "eval_strategy": "oelm validates training.evals_per_epoch times an epoch, or every training.eval_every optimizer "
                     "steps when that is set (and always at the end); set one of those",
    "evaluation_strategy": "oelm validates training.evals_per_epoch times an epoch, or every training.eval_every "
                           "optimizer steps when that is set (and always at the end); set one of those",
    "adam_beta1": "use training.adam_betas: [beta1, beta2]",
    "adam_beta2": "use training.adam_betas: [beta1, beta2]",
    "seed": "seeds are the experiment's top-level `seeds: [0, 1, 2]` (one run per method and seed)",
    "output_dir": "the output folder is the experiment's top-level `output_dir` (or oelm run --output-dir)",
    "lr_scheduler_kwargs": "oelm's schedules take no extra arguments; training.decay_ratio sets the decay of "
                           "schedule: wsd",
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
