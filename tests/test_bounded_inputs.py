"""Bounded resources and one file per split (issue 46, item 5): the counts that multiply runs are
refused past their bound, in one line naming the field, the bound and why, before anything is
planned or allocated (a real huge number on the command line); the same file given as two splits
(train and test, train and validation), by name, by a link or as a copy, is refused in one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from oelm.cli import main
from oelm.config import config_from_dict
from oelm.config.fields import MAX_GRID_GROWTH, MAX_LEARNING_RATES, MAX_METHODS, MAX_RUNS, MAX_SEEDS
from oelm.errors import ConfigError, DataFormatError

TINY_GPT = {"gpt": "gpt-tiny", "gpt_overrides": {"hidden_size": 32, "num_layers": 2, "num_heads": 2,
                                                 "intermediate_size": 64, "dropout": 0.0}}
TRAINING = {"max_steps": 2, "batch_size": 16, "eval_every": 2, "log_every": 2, "progress_bar": False, "tensorboard": False}
TASK = {"dataset": "sst2", "tokenizer": "bpe-512", "train_samples": 32, "validation_samples": 16, "max_length": 32}


pytestmark = pytest.mark.usefixtures("forget_own_datasets")  # tests/conftest.py


def _raw(**changes) -> dict:
    return {"name": "bounded", "task": TASK, "model": TINY_GPT, "methods": [{"name": "baseline", "learning_rate": 1e-3}],
            "seeds": [0], "training": TRAINING} | changes


def test_the_committed_configs_are_inside_the_bounds():
    root = Path(__file__).resolve().parents[1]
    paths = sorted((root / "src" / "oelm" / "configs").glob("*.yaml")) + sorted((root / "docs" / "results").glob("*/config.yaml"))
    assert len(paths) > 10
    for path in paths:
        import yaml

        raw = yaml.safe_load(path.read_text())
        assert len(raw.get("seeds", [])) <= MAX_SEEDS and len(raw["methods"]) <= MAX_METHODS
        assert raw.get("max_grid_growth", 0) <= MAX_GRID_GROWTH


@pytest.mark.parametrize("changes, shown", [
    ({"seeds": list(range(MAX_SEEDS + 1))}, f"seeds: {MAX_SEEDS + 1} is more than {MAX_SEEDS} (it multiplies the runs"),
    ({"methods": [{"name": f"m{i}", "base": "baseline", "learning_rate": 1e-3} for i in range(MAX_METHODS + 1)]},
     f"methods: {MAX_METHODS + 1} is more than {MAX_METHODS}"),
    ({"learning_rates": [1e-5 * (i + 1) for i in range(MAX_LEARNING_RATES + 1)], "methods": [{"name": "baseline"}]},
     f"learning_rates: {MAX_LEARNING_RATES + 1} is more than {MAX_LEARNING_RATES}"),
    ({"methods": [{"name": "baseline", "learning_rates": [1e-5 * (i + 1) for i in range(MAX_LEARNING_RATES + 1)]}]},
     f"methods[baseline].learning_rates: {MAX_LEARNING_RATES + 1} is more than {MAX_LEARNING_RATES}"),
    ({"max_grid_growth": 10**9}, f"max_grid_growth: 1000000000 is more than {MAX_GRID_GROWTH}"),
    ({"seeds": list(range(MAX_SEEDS)), "methods": [{"name": f"m{i}", "base": "baseline", "learning_rate": 1e-3}
                                                  for i in range(MAX_RUNS // MAX_SEEDS + 1)]},
     f"make up to {(MAX_RUNS // MAX_SEEDS + 1) * MAX_SEEDS} runs, more than {MAX_RUNS}"),
])
def test_a_count_that_multiplies_runs_is_bounded_with_the_reason(changes, shown):
    with pytest.raises(ConfigError) as caught:
        config_from_dict(_raw(**changes))
    assert shown in str(caught.value) and "a typo, not an experiment" in str(caught.value)


def test_a_huge_seed_count_on_the_command_line_is_one_line_before_anything_is_allocated(tmp_path):
    """`oelm init --suite ... --seeds 1000000000`, as typed: one line, little memory, no file
    (before the bound it grew to 22.9 GB before the kernel killed it)."""
    # the peak resident set of this process image: VmHWM (reset by exec; getrusage's ru_maxrss is not, so under
    # a pytest worker of 3 GB it read the worker's peak)
    code = ("import re, sys; from oelm.cli import main; rc = main(sys.argv[1:]); "
            "hwm = re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1); "
            "print('maxrss_mb', int(hwm) // 1024, file=sys.stderr); sys.exit(rc)")
    path = tmp_path / "suite.yaml"
    proc = subprocess.run([sys.executable, "-c", code, "init", str(path), "--suite", "frozen-attention", "--model",
                           "gpt-tiny", "--task", "sst2", "--seeds", "1000000000"], capture_output=True, text=True,
                          timeout=300, env=os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")})
    assert proc.returncode == 2, proc.stderr[-2000:]
    error, rss = proc.stderr.strip().splitlines()
    assert error == (f"oelm: error: --seeds 1000000000: more than {MAX_SEEDS} (every seed is a run of every method, so a "
                     f"count this large is a typo, not an experiment); give at most {MAX_SEEDS} (default 5)")
    assert int(rss.split()[1]) < 2000 and not path.exists()


def _own(tmp_path: Path, data_dir: Path, files: dict[str, str]) -> dict:
    return _raw(task={"dataset": "my-reviews", "tokenizer": "bpe-512", "max_length": 32, "test_split": "test",
                      "source": {"files": files}})


@pytest.fixture
def reviews(tmp_path, data_dir) -> Path:
    frame = pd.read_parquet(data_dir / "sst2" / "validation.parquet").iloc[:96]
    frame.iloc[:64].to_csv(tmp_path / "train.csv", index=False)
    frame.iloc[64:].to_csv(tmp_path / "dev.csv", index=False)
    return tmp_path


@pytest.mark.parametrize("test_file, validation_file, shown", [
    ("train.csv", "dev.csv", "the file {d}/train.csv is both the train split and the test split"),
    ("dev.csv", "dev.csv", "the file {d}/dev.csv is both the validation split and the test split"),
    ("link.csv", "dev.csv", "the file {d}/train.csv is both the train split and the test split (as {d}/link.csv)"),
])
def test_the_same_file_as_two_splits_is_refused_in_one_line(reviews, data_dir, test_file, validation_file, shown):
    (reviews / "link.csv").symlink_to(reviews / "train.csv")
    files = {"train": str(reviews / "train.csv"), "validation": str(reviews / validation_file), "test": str(reviews / test_file)}
    with pytest.raises(ConfigError) as caught:
        config_from_dict(_own(reviews, data_dir, files))
    assert f"task: {shown.format(d=reviews)}" in str(caught.value)
    assert "give the" in str(caught.value) and "its own file" in str(caught.value)


def test_a_copy_of_the_training_file_as_the_test_split_is_refused_before_training(reviews, data_dir, tmp_path, capsys):
    """A copy under another name passes the path check; its sha256 is the training file's: one
    line when the data is read, no run trained."""
    shutil.copy(reviews / "train.csv", reviews / "test.csv")
    files = {"train": str(reviews / "train.csv"), "validation": str(reviews / "dev.csv"), "test": str(reviews / "test.csv")}
    (tmp_path / "c.yaml").write_text(json.dumps(_own(reviews, data_dir, files)))
    assert main(["run", str(tmp_path / "c.yaml"), "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"oelm: error: my-reviews: the content of {reviews}/train.csv is both the train split and the test "
                       f"split (as {reviews}/test.csv): a model would be scored on rows it trained or was selected on; "
                       "give the test split its own file")
    assert not list((tmp_path / "out").glob("runs/*/result.json"))


def test_distinct_files_and_a_held_out_validation_are_accepted(reviews, data_dir):
    files = {"train": str(reviews / "train.csv"), "validation": str(reviews / "dev.csv")}
    config_from_dict(_own(reviews, data_dir, files) | {"task": {"dataset": "my-reviews", "tokenizer": "bpe-512",
                                                                "source": {"files": files}}})
    held = {"dataset": "my-held", "tokenizer": "bpe-512", "source": {"files": {"train": str(reviews / "train.csv")},
                                                                      "validation_holdout": 0.25}}
    config_from_dict(_raw(task=held))
