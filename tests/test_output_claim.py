"""An output folder is claimed only by a valid config (issue 37 item 9; docs/reliability.md items 4, 6).

A config error found before the data (warmup longer than ``max_steps``) writes nothing; one found
after the folder was written (warmup longer than an epoch-based run, known once the data is
there) leaves a folder whose runs hold no result, and the corrected config takes it over. A folder
in which a run holds a result (``result.json``) or a resumable checkpoint still refuses a
different config (the refusal with a finished run: ``tests/test_experiment.py``,
``tests/test_bad_input.py``). Real SST-2 data, oelm's tiny GPT, real CPU training.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from oelm.config import config_from_dict
from oelm.errors import ConfigError, RunInterruptedError
from oelm.records import MatrixFolder

SRC = Path(__file__).resolve().parents[1] / "src"
TAKEOVER = "but no run there has a result or a checkpoint: this config takes it over"


def _config(**training) -> dict:
    """The issue's reproduction: 96 SST-2 examples, batch 16 (6 optimizer steps an epoch)."""
    return {
        "name": "claim",
        "task": {"dataset": "sst2", "tokenizer": "bpe-512", "train_samples": 96, "validation_samples": 32, "max_length": 32},
        "model": {"gpt": "gpt-tiny", "gpt_overrides": {"hidden_size": 32, "num_layers": 2, "num_heads": 2,
                                                      "intermediate_size": 64, "dropout": 0.0}},
        "methods": [{"name": "baseline", "learning_rate": 1.0e-3}],
        "seeds": [0],
        "training": {"batch_size": 16, "tensorboard": False, **training},
    }


def _cli(config: dict, out: Path, cwd: Path) -> subprocess.CompletedProcess:
    path = cwd / "c.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = dict(os.environ, PYTHONPATH=str(SRC), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "oelm", "run", str(path), "--output-dir", str(out)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _finished(out: Path) -> list[str]:
    return sorted(d.name for d, r in MatrixFolder(out).iter_results() if r.finished)


def test_warmup_longer_than_max_steps_writes_nothing_and_the_fix_runs_in_that_folder(tmp_path, data_dir):
    """The issue's reproduction through the real command line: the error is one line, exit 2,
    before any data or file; the corrected config then runs in the same folder and finishes."""
    out = tmp_path / "out"
    proc = _cli(_config(max_steps=6, warmup_steps=100), out, tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "Warning" not in line]
    assert lines == ["oelm: error: training.warmup_steps=100 is longer than the run's 6 planned optimizer steps (the "
                     "learning rate would never reach its peak); lower training.warmup_steps or use training.warmup_ratio"]
    assert "preparing data" not in proc.stdout
    assert not out.exists() or not any(out.iterdir()), sorted(p.name for p in out.rglob("*"))

    proc = _cli(_config(max_steps=6, warmup_steps=2), out, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _finished(out) == ["baseline-seed0"]
    assert json.loads(MatrixFolder(out).experiment.read_text())["fingerprint"]["training"]["warmup_steps"] == 2


def test_a_method_override_is_checked_before_the_data_too(tmp_path):
    config = _config(max_steps=6)
    config["methods"] = [{"name": "baseline"}, {"name": "oelm_freeze", "training": {"warmup_steps": 7}}]
    out = tmp_path / "out"
    from oelm.matrix import run_matrix

    with pytest.raises(ConfigError, match=r"warmup_steps=7 is longer than the run's 6 planned optimizer steps of method "
                                          r"oelm_freeze"):
        run_matrix(config_from_dict(config), out, log=lambda _: None)
    assert not out.exists()


def test_an_error_after_the_data_leaves_the_folder_to_the_corrected_config(tmp_path, data_dir):
    """Warmup against an epoch-based length is known only once the data is there, after the folder
    was written: the run fails with the config error and no result; the corrected config takes the
    folder over (one line), removes the stale run folder and files, and finishes there."""
    from oelm.matrix import run_matrix

    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"training.warmup_steps=100 is longer than the run's 6 planned"):
        run_matrix(config_from_dict(_config(epochs=1, warmup_steps=100)), out, log=lambda _: None)
    folder = MatrixFolder(out)
    assert folder.experiment.is_file() and folder.tokenizer.is_file()  # the folder was written
    run = folder.run("baseline-seed0")
    assert [d.name for d in folder.run_folders()] == [run.name]
    assert not run.result.exists() and not run.checkpoints.exists()  # no result, nothing to resume
    stale_status, stale_tokenizer = run.status.read_text(), folder.tokenizer.read_text()

    logs: list[str] = []  # corrected, and with another tokenizer: the earlier data binding must go too
    corrected = _config(epochs=1, warmup_steps=2)
    corrected["task"]["tokenizer"] = "bpe-384"
    run_matrix(config_from_dict(corrected), out, log=logs.append)
    takeover = [line for line in logs if TAKEOVER in line]
    assert takeover == [f"output directory {out} was started by a different config (changed: task, training) {TAKEOVER}"]
    assert folder.tokenizer.read_text() != stale_tokenizer  # the new config's tokenizer, not the stale one
    assert _finished(out) == ["baseline-seed0"]
    assert folder.run("baseline-seed0").status.read_text() != stale_status
    assert "ConfigError" not in folder.run("baseline-seed0").train_log.read_text()  # the stale log went with its folder
    experiment = json.loads(folder.experiment.read_text())
    assert experiment["fingerprint"]["training"]["warmup_steps"] == 2 and "data" in experiment
    assert yaml.safe_load(folder.config.read_text())["training"]["warmup_steps"] == 2

    logs.clear()  # the folder now holds a result of the corrected config: the first one is refused
    with pytest.raises(ConfigError, match=r"holds results of a different config \(changed: task, training\)"):
        run_matrix(config_from_dict(_config(epochs=1, warmup_steps=100)), out, log=logs.append)
    assert not any(TAKEOVER in line for line in logs) and _finished(out) == ["baseline-seed0"]


def test_a_resumable_checkpoint_keeps_the_folder_from_a_different_config(tmp_path, data_dir, monkeypatch):
    """A run stopped by SIGTERM after its checkpoint has no result.json but can resume: the folder
    holds a result, so a different config is refused and nothing of the run is removed."""
    import oelm.matrix.run_one as run_one

    build = run_one.build_run_model

    def build_and_stop_at_step_4(*args, **kwargs):  # SIGTERM arrives while training step 4
        built = build(*args, **kwargs)
        calls = {"n": 0}

        def hook(module, inputs, output):
            calls["n"] += module.training
            if calls["n"] == 4:
                os.kill(os.getpid(), signal.SIGTERM)
        built[0].register_forward_hook(hook)
        return built

    monkeypatch.setattr(run_one, "build_run_model", build_and_stop_at_step_4)
    out = tmp_path / "out"
    with pytest.raises(RunInterruptedError):
        run_matrix_quiet(_config(max_steps=6, warmup_steps=2, timing_warmup_passes=0), out)
    monkeypatch.undo()
    run = MatrixFolder(out).run("baseline-seed0")
    assert not run.result.exists() and "step-4" in [p.parent.name for p in run.checkpoints.glob("step-*/manifest.json")]
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))

    with pytest.raises(ConfigError, match=r"holds results of a different config \(changed: training\)"):
        run_matrix_quiet(_config(max_steps=6, warmup_steps=3), out)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before


def run_matrix_quiet(config: dict, out: Path):
    from oelm.matrix import run_matrix

    return run_matrix(config_from_dict(config), out, log=lambda _: None)
