"""Hugging Face Trainer's names in an experiment config (issue 35, item 4): each one either means
exactly an oelm setting and is accepted, recorded under oelm's name, or is refused with the oelm
setting to use; a Trainer name is never answered with a wrong "did you mean"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from oelm.config import TrainingConfig, load_config
from oelm.config.aliases import TRAINER_ALIASES, TRAINER_REFUSED
from oelm.errors import ConfigError
from oelm.matrix.output import config_fingerprint, start_output

CONFIG = """
name: t
task: {dataset: sst2}
model: {pretrained: sentence-transformers/all-MiniLM-L6-v2}
methods: [{name: baseline}, {name: oelm_freeze}]
seeds: [0]
training: {TRAINING}
"""

HF_NAMES = ("{per_device_train_batch_size: 16, per_device_eval_batch_size: 64, num_train_epochs: 2, eval_steps: 25, "
            "bf16: true, lr_scheduler_type: cosine, warmup_ratio: 0.05, logging_steps: 5, adam_epsilon: 1.0e-6, "
            "torch_compile: false, save_steps: 50}")
OELM_NAMES = ("{batch_size: 16, eval_batch_size: 64, epochs: 2, eval_every: 25, mixed_precision: bf16, schedule: cosine, "
              "warmup_ratio: 0.05, log_every: 5, adam_eps: 1.0e-6, compile: false, checkpoint_every: 50}")


def _keys(tree) -> set[str]:
    """Every mapping key anywhere in ``tree``."""
    if isinstance(tree, dict):
        return set(tree).union(*map(_keys, tree.values()))
    if isinstance(tree, list):
        return set().union(*map(_keys, tree))
    return set()


def _config(tmp_path: Path, training: str, overrides: list[str] | None = None):
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG.replace("{TRAINING}", training))
    return load_config(path, overrides)


def test_trainer_names_are_read_as_oelm_settings_and_recorded_under_oelm_names(tmp_path):
    hf, ours = _config(tmp_path, HF_NAMES), _config(tmp_path, OELM_NAMES)
    t = hf.training
    assert (t.batch_size, t.eval_batch_size, t.epochs, t.eval_every, t.mixed_precision, t.schedule, t.warmup_ratio,
            t.log_every, t.adam_eps, t.compile, t.checkpoint_every) == (16, 64, 2.0, 25, "bf16", "cosine", 0.05, 5, 1e-6,
                                                                       False, 50)
    assert hf == ours
    # the fingerprint (the resume check) is the same, so either spelling continues the other's matrix
    assert config_fingerprint(hf) == config_fingerprint(ours)
    out = tmp_path / "out"
    out.mkdir()
    start_output(hf, out)
    recorded = _keys(yaml.safe_load((out / "config.yaml").read_text())) | _keys(json.loads((out / "experiment.json").read_text()))
    assert not recorded & set(TRAINER_ALIASES)
    assert yaml.safe_load((out / "config.yaml").read_text())["training"]["batch_size"] == 16
    assert json.loads((out / "experiment.json").read_text())["fingerprint"]["training"]["mixed_precision"] == "bf16"


def test_a_method_s_training_and_an_override_take_trainer_names(tmp_path):
    text = CONFIG.replace("{TRAINING}", "{batch_size: 32}").replace(
        "{name: oelm_freeze}", "{name: oelm_freeze, training: {num_train_epochs: 3, fp16: true}}")
    (tmp_path / "c.yaml").write_text(text)
    # the override replaces the file's batch_size (it is the same setting), it does not conflict with it
    c = load_config(tmp_path / "c.yaml", ["training.per_device_train_batch_size=8", "training.bf16=true"])
    assert c.training.batch_size == 8 and c.training.mixed_precision == "bf16"
    entry = c.methods[1]
    assert entry.training == {"epochs": 3, "mixed_precision": "fp16"}  # recorded under oelm's names
    assert c.training_for(entry).epochs == 3.0 and c.training_for(entry).mixed_precision == "fp16"
    assert config_fingerprint(c)["methods"]["oelm_freeze"]["training"] == {"epochs": 3, "mixed_precision": "fp16"}
    # a later override in oelm's name replaces the earlier one too
    c = load_config(tmp_path / "c.yaml", ["methods.oelm_freeze.training.num_train_epochs=5"])
    assert c.methods[1].training["epochs"] == 5


@pytest.mark.parametrize("training, fix", [
    ("{eval_steps: 0.25}", "training.eval_every: N"),                    # Trainer: a share of the steps
    ("{logging_steps: 0.1}", "training.log_every: N"),
    ("{save_steps: 0.5}", "training.checkpoint_every: N"),
    ("{warmup_steps: 0.1}", "use training.warmup_ratio"),
    ("{lr_scheduler_type: constant}", "training.warmup_steps: 0"),      # Trainer's constant has no warmup
    ("{lr_scheduler_type: warmup_stable_decay}", "training.schedule: wsd"),
    ("{lr_scheduler_type: polynomial}", "linear, cosine, constant (after warmup) or wsd"),
    ("{eval_strategy: steps}", "training.eval_every"),
    ("{adam_beta1: 0.8}", "training.adam_betas: [beta1, beta2]"),
    ("{seed: 3}", "top-level `seeds"),
    ("{output_dir: x}", "top-level `output_dir`"),
    ("{bf16: true, fp16: true}", "training.mixed_precision: bf16 or fp16"),
    ("{bf16: 1}", "takes true or false"),
    ("{per_device_train_batch_size: 16, batch_size: 32}", "keep one (batch_size)"),
    ("{num_train_epochs: 2, epochs: 1}", "keep one (epochs)"),
    ("{bf16: true, mixed_precision: fp16}", "keep one (mixed_precision)"),
])
def test_trainer_names_without_the_same_meaning_are_refused_with_the_setting_to_use(tmp_path, training, fix):
    with pytest.raises(ConfigError) as info:
        _config(tmp_path, training)
    message = str(info.value)
    assert fix in message and "did you mean" not in message
    assert len(message.splitlines()) == 2  # the header and one line


def test_no_trainer_name_gets_a_wrong_suggestion(tmp_path):
    """The two suggestions the issue found (per_device_train_batch_size -> eval_batch_size,
    eval_steps -> max_steps) and every other name of the table: accepted or refused, never
    answered with the closest-spelled oelm key."""
    values = {"bf16": "true", "fp16": "true", "torch_compile": "true", "lr_scheduler_type": "linear", "eval_on_start": "true"}
    for name in [*TRAINER_ALIASES, *TRAINER_REFUSED]:
        try:
            _config(tmp_path, f"{{{name}: {values.get(name, 4)}}}")
        except ConfigError as err:
            assert name in TRAINER_REFUSED and "did you mean" not in str(err) and "does not take" in str(err), err


def test_a_trainer_name_in_a_method_s_training_is_refused_by_its_name(tmp_path):
    text = CONFIG.replace("{TRAINING}", "{}").replace("{name: oelm_freeze}", "{name: oelm_freeze, training: {seed: 1}}")
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"methods\.1\.training: training\.seed is a Hugging Face Trainer setting"):
        load_config(tmp_path / "c.yaml")


def _lr_curve(scheduler, optimizer, steps: int) -> list[float]:
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


@pytest.mark.parametrize("hf_type, steps, warmup", [("linear", 40, 4), ("cosine", 40, 4), ("constant_with_warmup", 40, 4),
                                                    ("cosine", 37, 0)])
def test_an_accepted_schedule_is_the_one_trainer_builds(hf_type, steps, warmup):
    """lr_scheduler_type: what oelm trains with (make_scheduler) is what Trainer builds from the
    same TrainingArguments (create_scheduler), step by step."""
    from transformers import Trainer, TrainingArguments

    from oelm.training.engine import make_scheduler

    def optimizer():
        return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)

    ours_opt = optimizer()
    ours = make_scheduler(ours_opt, TrainingConfig(lr_scheduler_type=hf_type, warmup_steps=warmup), steps)
    args = TrainingArguments(output_dir="/nonexistent-unused", lr_scheduler_type=hf_type, warmup_steps=warmup,
                             learning_rate=1e-3, report_to=[], use_cpu=True)
    trainer = Trainer.__new__(Trainer)  # only its scheduler factory: no model, no data
    trainer.args, trainer.lr_scheduler, trainer.optimizer = args, None, optimizer()
    theirs = trainer.create_scheduler(steps, trainer.optimizer)
    assert _lr_curve(ours, ours_opt, steps) == pytest.approx(_lr_curve(theirs, trainer.optimizer, steps), abs=0, rel=1e-12)


def test_trainer_constant_is_oelm_constant_without_warmup():
    """Why ``lr_scheduler_type: constant`` is refused: Trainer's has no warmup, oelm's ``constant``
    warms up over warmup_ratio; the fix the message gives (warmup_steps: 0) is Trainer's."""
    from transformers import get_scheduler

    from oelm.training.engine import make_scheduler

    def curve(make):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
        return _lr_curve(make(opt), opt, 20)

    trainer = curve(lambda o: get_scheduler("constant", optimizer=o, num_warmup_steps=5, num_training_steps=20))
    assert curve(lambda o: make_scheduler(o, TrainingConfig(schedule="constant"), 20)) != trainer
    assert curve(lambda o: make_scheduler(o, TrainingConfig(schedule="constant", warmup_steps=0), 20)) == trainer
