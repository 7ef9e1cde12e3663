"""Hugging Face Trainer's whole vocabulary in an experiment config (issue 46, item 7): every field
of ``transformers.TrainingArguments`` — read from the installed dataclass, so a newer transformers
that adds one fails here until it is placed — is accepted and recorded under oelm's name, is oelm's
name already, or is refused with one line naming the oelm key to use or the reason there is none.
A misspelt Trainer name gets the Trainer name back, never the closest-spelled unrelated oelm key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from transformers import TrainingArguments

from oelm.config import TrainingConfig, load_config
from oelm.config.aliases import TRAINER_ALIASES, TRAINER_REFUSED, TRAINER_SAME
from oelm.errors import ConfigError

CONFIG = """
name: t
task: {dataset: sst2}
model: {pretrained: sentence-transformers/all-MiniLM-L6-v2}
methods: [{name: baseline}, {name: oelm_freeze, training: {METHOD}}]
seeds: [0]
training: {TRAINING}
"""
TRAINER_FIELDS = [f.name for f in dataclasses.fields(TrainingArguments)]
# a value each accepted name takes (the refused ones are refused whatever their value)
ACCEPTED_VALUES = {"bf16": "true", "fp16": "true", "torch_compile": "true", "lr_scheduler_type": "cosine",
                   "eval_on_start": "true", "report_to": "[]", "learning_rate": "0.001", "weight_decay": "0.1",
                   "max_grad_norm": "0.5", "num_train_epochs": "2"}


def _load(tmp_path: Path, training: str = "{}", method: str = "{}"):
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG.replace("{TRAINING}", training).replace("{METHOD}", method))
    return load_config(path)


def _refusal(tmp_path: Path, training: str = "{}", method: str = "{}") -> str:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, training, method)
    return str(info.value)


def test_every_training_arguments_field_is_placed_once():
    tables = {"accepted": set(TRAINER_ALIASES), "same name": set(TRAINER_SAME), "refused": set(TRAINER_REFUSED)}
    unplaced = [n for n in TRAINER_FIELDS if not any(n in t for t in tables.values())]
    assert not unplaced, f"TrainingArguments fields oelm's table does not place: {unplaced}"
    for a, b in [("accepted", "same name"), ("accepted", "refused"), ("same name", "refused")]:
        assert not tables[a] & tables[b], (a, b, tables[a] & tables[b])
    fields = set(TrainingConfig.model_fields)
    assert TRAINER_SAME <= fields and set(TRAINER_ALIASES.values()) <= fields
    assert not set(TRAINER_REFUSED) & fields  # a refused name is never one oelm takes itself


@pytest.mark.parametrize("name", TRAINER_FIELDS)
def test_each_trainer_field_is_accepted_or_refused_in_one_line_with_its_fix(tmp_path, name):
    training = f"{{{name}: {ACCEPTED_VALUES.get(name, 4)}}}"
    if name not in TRAINER_REFUSED:
        config = _load(tmp_path, training)
        target = TRAINER_ALIASES.get(name, name)
        assert target in config.training.model_fields_set, (name, target)
        if name in TRAINER_ALIASES:
            assert name not in config.training.model_dump()  # recorded under oelm's name only
        return
    message = _refusal(tmp_path, training)
    lines = message.splitlines()
    assert len(lines) == 2, message  # the header and one line
    assert f"training.{name} is a Hugging Face Trainer setting oelm does not take: {TRAINER_REFUSED[name]}" in lines[1]
    assert "did you mean" not in message and "valid keys" not in message


@pytest.mark.parametrize("name, fix", [
    # the four wrong suggestions issue 46 found, and what the right answer names
    ("gradient_checkpointing", "training.gradient_accumulation_steps to fit memory"),
    ("resume_from_checkpoint", "training.resume: true"),
    ("eval_accumulation_steps", "training.eval_batch_size"),
    ("per_device_train_batch_sze", "did you mean 'per_device_train_batch_size' (Hugging Face Trainer's name for "
                                   "training.batch_size)?"),
    # common ones that got a bare key list
    ("save_strategy", "training.checkpoint_every"),
    ("load_best_model_at_end", "training.save_best_checkpoint"),
    ("metric_for_best_model", "accuracy: higher, perplexity: lower"),
    ("greater_is_better", "accuracy: higher, perplexity: lower"),
    ("optim", "AdamW only"),
    ("push_to_hub", "oelm export RUN_DIR OUT"),
    ("hub_model_id", "oelm export RUN_DIR OUT"),
    ("save_total_limit", "training.keep_checkpoints: N"),
    ("gradient_checkpointing_kwargs", "training.batch_size"),
    ("label_smoothing_factor", "plain cross-entropy"),
    ("dataloader_pin_memory", "training.num_workers"),
    ("fsdp", "training.distributed: fsdp"),
    ("disable_tqdm", "training.progress_bar: false"),
    ("torch_compile_mode", "training.compile: default, reduce-overhead or max-autotune"),
    ("logging_strategy", "training.log_every"),
    ("save_total_limt", "did you mean 'save_total_limit'? That Trainer setting has no oelm key: write "
                        "training.keep_checkpoints"),
])
def test_a_trainer_name_is_answered_with_the_right_key(tmp_path, name, fix):
    for training, method in [(f"{{{name}: 1}}", "{}"), ("{}", f"{{{name}: 1}}")]:  # the experiment's, a method's
        message = _refusal(tmp_path, training, method)
        assert fix in message, message
        assert "valid keys" not in message
        assert len(message.splitlines()) == 2, message


def test_an_unknown_key_far_from_every_name_still_lists_the_keys(tmp_path):
    message = _refusal(tmp_path, "{zzz_qqq: 1}")
    assert "training.zzz_qqq: unknown key; valid keys: epochs, max_steps" in message
