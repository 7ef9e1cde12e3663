"""`oelm run` refuses what cannot work before any work starts, and never leaves a run "running".

- a max_length / block_size longer than the model takes (pretrained positions, GPT cap/override);
- a directory given as the config file;
- an output directory that is a file, lies under a file, or cannot be written (or created);
- an unexpected exception inside a run marks its status.json failed before it propagates.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest

from oelm.config import config_from_dict, load_config
from oelm.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _config(**task_changes) -> dict:
    task = {"dataset": "sst2", "train_samples": 64, "validation_samples": 32, "max_length": 32} | task_changes
    return {
        "name": "guards",
        "task": task,
        "model": {"gpt": "gpt-tiny", "gpt_overrides": {"num_layers": 1, "hidden_size": 32, "num_heads": 2}},
        "methods": [{"name": "baseline"}, {"name": "oelm_freeze"}],
        "training": {"max_steps": 2, "batch_size": 8, "progress_bar": False, "tensorboard": False},
    }


@pytest.fixture
def no_work(monkeypatch):
    """Any data preparation means the check came too late."""
    import oelm.experiment

    def prepare(*args, **kwargs):
        raise AssertionError("data preparation started before the check")

    monkeypatch.setattr(oelm.experiment, "_prepare", prepare)


def _run(config: dict, out: Path):
    from oelm.experiment import run_experiment

    return run_experiment(config_from_dict(config), out, log=lambda _: None)


# --- a directory as the config ----------------------------------------------------------------


def test_a_directory_as_the_config_is_named_a_directory_with_its_yaml_files(tmp_path):
    (tmp_path / "b.yaml").write_text("name: b\n")
    (tmp_path / "a.yml").write_text("name: a\n")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    assert str(info.value) == (
        f"config file {tmp_path} is a directory, not a YAML file; pass one of its YAML files: a.yml, b.yaml, "
        f"e.g. {tmp_path / 'a.yml'}"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="is a directory, not a YAML file; it holds no .yaml file"):
        load_config(empty)
