"""``oelm init --suite frozen-attention`` (oelm.config.suite): the config it writes for a pretrained model
(all-MiniLM-L6-v2 on SST-2) and for oelm's GPT from scratch (gpt-tiny on TinyStories) validates,
holds the controls and inits that apply to that kind of model, one learning-rate grid fixed in the
file, at least 3 seeds, the test split, and a targets block; a 2-step run of each (real data, small
validation / test samples, one seed and one rate to stay fast) ends with the report, its targets
section included. Bad flags are one line."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from oelm.cli import main
from oelm.config import load_config
from oelm.config.suite import DEFAULT_SEEDS, GRIDS

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
PRETRAINED = ["baseline", "oelm_freeze", "oelm_random", "oelm_random_orthogonal", "oelm_random_matched",
              "oelm_pretrained_frozen", "oelm_rescaled", "oelm_mimetic"]
SCRATCH = ["baseline", "oelm_freeze", "oelm_random", "oelm_global", "oelm_mimetic", "mimetic_trained", "mimetic_vo_trained",
           "fixed_attention", "reservoir"]


def _init(tmp_path: Path, model: str, task: str, *extra: str) -> Path:
    path = tmp_path / f"{task}-suite.yaml"
    assert main(["init", str(path), "--suite", "frozen-attention", "--model", model, "--task", task, *extra]) == 0
    return path


@pytest.mark.parametrize(("model", "task", "methods", "grid", "test_split"), [
    (MINILM, "sst2", PRETRAINED, GRIDS["pretrained"], "test"),
    ("gpt-tiny", "tinystories", SCRATCH, GRIDS["scratch"], "validation"),  # no test split: half of validation held out
])
def test_the_suite_config_validates_and_holds_what_applies_to_the_model(tmp_path, data_dir, model, task, methods, grid,
                                                                        test_split):
    path = _init(tmp_path, model, task)
    config = load_config(path)
    assert [m.name for m in config.methods] == methods
    assert all(config.learning_rate_candidates(m) == list(grid) for m in config.methods)  # one grid, in the file
    assert config.seeds == list(range(DEFAULT_SEEDS)) and config.task.test_split == test_split
    assert config.name == f"{task}-suite" and set(config.targets) == {"oelm_freeze"}
    if model == MINILM:
        assert config.model.pretrained == MINILM and config.targets["oelm_freeze"].accuracy_gap_min == -2.0
        rnd = next(m for m in config.methods if m.name == "oelm_random_orthogonal")
        assert (rnd.base, rnd.init) == ("oelm_freeze", "random_orthogonal")
    else:
        assert config.model.gpt == "gpt-tiny" and config.targets["oelm_freeze"].perplexity_ratio_max == 1.05
        assert config.task.validation_samples == 357  # 714 local validation stories: 357 select, 357 test
    text = path.read_text()
    assert "fixed before any test" in text and "Trockman & Kolter" in text  # the grid rule and sources, in the file
    three = _init(tmp_path / "three", model, task, "--seeds", "3")
    assert load_config(three).seeds == [0, 1, 2]


@pytest.mark.parametrize(("argv", "needle"), [
    (["--suite", "frozen-attention", "--model", "gpt-tiny", "--task", "tinystories", "--seeds", "2"], "at least 3 seeds"),
    (["--suite", "frozen-attention", "--task", "tinystories"], "--suite needs --model M and --task T"),
    (["--suite", "frozen-attention", "--model", "gpt-tiny", "--task", "tinystories", "--template", "quickstart"],
     "no --template"),
    (["--model", "gpt-tiny"], "--model, --task and --seeds go with --suite"),
    (["--suite", "frozen-q", "--model", "gpt-tiny", "--task", "tinystories"], "unknown suite; available: frozen-attention"),
    (["--suite", "frozen-attention", "--model", "gpt-tiny", "--task", "sst3"], "unknown dataset 'sst3'"),
])
def test_bad_suite_flags_are_one_line(tmp_path, capsys, argv, needle):
    assert main(["init", str(tmp_path / "x.yaml"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "x.yaml").exists()


# The smoke run the config's header gives (2 optimizer steps, one seed and rate, 64 evaluation examples,
# its own output folder), with smaller samples to fit a test (later overrides win).
_SMALL = {"gpt-tiny": ["task.train_samples=16", "task.validation_samples=8", "task.test_samples=8"],
          MINILM: ["task.train_samples=64", "task.validation_samples=32", "task.test_samples=32"]}


def _smoke_argv(path: Path) -> list[str]:
    """The header's smoke command for the config at ``path``, as `oelm` arguments."""
    line = next(line for line in path.read_text().splitlines() if "--output-dir" in line and "max_steps=2" in line)
    argv = shlex.split(line.lstrip("# "))
    assert argv[:3] == ["oelm", "run", "THIS_FILE"]
    return ["run", str(path), *argv[3:]]


@pytest.mark.parametrize(("model", "task", "methods"), [
    ("gpt-tiny", "tinystories", SCRATCH),
    pytest.param(MINILM, "sst2", PRETRAINED, marks=pytest.mark.slow),  # 8 MiniLM runs: ~1.5 min on 2 loaded cores
])
def test_a_two_step_run_of_the_suite_ends_with_its_report(tmp_path, data_dir, monkeypatch, model, task, methods):
    monkeypatch.chdir(tmp_path)
    path = _init(tmp_path, model, task)
    argv = _smoke_argv(path)
    assert {"training.max_steps=2", "seeds=[0]", "task.validation_samples=64", "task.test_samples=64"} <= set(argv)
    assert main([*argv, "training.progress_bar=false", *_SMALL[model]]) == 0
    out = tmp_path / "outputs" / f"{task}-suite-smoke"
    assert not (tmp_path / "outputs" / f"{task}-suite").exists()  # the full run's folder is left to the full run
    comparison = json.loads((out / "comparison.json").read_text())
    assert list(comparison["methods"]) == methods
    assert all(m["runs"][0]["status"] == "finished" and m["runs"][0]["test"] is not None for m in comparison["methods"].values())
    target = comparison["targets"]["methods"]["oelm_freeze"]
    sound = all(comparison["methods"][m]["included_seeds"] for m in ("baseline", "oelm_freeze"))
    # one seed: no seed interval, so no verdict; a 2-step classifier may end at chance (excluded): no runs to judge
    assert (target["result"], target["n"]) == (("undecided", 1) if sound else ("no sound runs", 0))
    report = (out / "report.md").read_text()
    assert "## Targets" in report and all(f"| {m} |" in report for m in methods)
    assert (out / "report.html").is_file()
    assert load_config(out / "config.yaml").targets == load_config(path).targets  # `oelm report DIR` re-checks them
