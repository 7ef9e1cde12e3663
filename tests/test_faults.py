"""Faults inside a real tiny run: NaN loss, out of memory, full disk. Each stops the run with
RunFaultError of the right kind, and the last good checkpoint stays intact and loadable."""

from __future__ import annotations

import errno
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_model

import oelm.training.checkpoint
from _reliability import _train_driver, in_process
from oelm.cli import main
from oelm.errors import RunFaultError
from oelm.io import verify_dir
from oelm.training import TrainingDivergedError


def _training_call_counter(step: int, action):
    calls = {"n": 0}

    def hook(module, args, kwargs, *output):
        if module.training:
            calls["n"] += 1
            if calls["n"] >= step:
                return action(*output)
    return hook


def _checkpoints(run_dir):
    return sorted((run_dir / "checkpoints").iterdir(), key=lambda p: int(p.name.split("-")[1]))


def _assert_loadable_and_finite(ckpt):
    assert verify_dir(ckpt) is None
    config, data, model, _ = _train_driver.build([])
    load_model(model, str(ckpt / "model.safetensors"))
    assert all(torch.isfinite(p).all() for p in model.state_dict().values())


def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, data_dir):
    from transformers.modeling_outputs import CausalLMOutput

    def nan_loss(output):
        return CausalLMOutput(loss=output.loss * float("nan"), logits=output.logits)

    run_dir = tmp_path / "run"
    with pytest.raises(TrainingDivergedError) as info:  # NaN loss from step 17 on
        in_process(run_dir, hook=_training_call_counter(17, nan_loss))
    err = info.value
    assert isinstance(err, RunFaultError) and err.kind == "nan"
    assert 17 <= err.step < 17 + 3  # detected at the next log interval (log_every=3)
    assert "learning rate" in str(err)
    ckpts = _checkpoints(run_dir)
    assert [p.name for p in ckpts] == ["step-7", "step-14"]  # no checkpoint of the NaN weights
    _assert_loadable_and_finite(ckpts[-1])


def test_nan_gradient_with_finite_loss_is_caught(tmp_path, data_dir):
    """A NaN that reaches only the gradients (here: a hook on one weight's grad)."""
    run_dir = tmp_path / "run"
    calls = {"n": 0}

    def poison(module, args, kwargs):
        if module.training:
            calls["n"] += 1
            if calls["n"] == 10:
                p = next(q for q in module.parameters() if q.requires_grad)
                p.register_hook(lambda g: g * float("nan"))
    with pytest.raises(RunFaultError) as info:
        in_process(run_dir, "training.max_grad_norm=null", pre_hook=poison)
    assert info.value.kind == "nan" and 10 <= info.value.step <= 12
    assert [p.name for p in _checkpoints(run_dir)] == ["step-7"]
    _assert_loadable_and_finite(_checkpoints(run_dir)[-1])


@pytest.mark.parametrize("error", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough memory: you tried to allocate; out of memory"),
])
def test_out_of_memory_names_the_batch_size(tmp_path, data_dir, error):
    def boom(module, args, kwargs):
        if module.training:
            boom.calls += 1
            if boom.calls == 12:
                raise error
    boom.calls = 0
    run_dir = tmp_path / "run"
    with pytest.raises(RunFaultError) as info:
        in_process(run_dir, pre_hook=boom)
    err = info.value
    assert err.kind == "oom" and err.step == 12
    assert "training.batch_size=8" in str(err) and "8 sequences x 32 tokens" in str(err)
    assert "lower training.batch_size" in str(err)
    _assert_loadable_and_finite(_checkpoints(run_dir)[-1])


def test_disk_full_while_checkpointing_keeps_the_previous_checkpoint(tmp_path, data_dir, monkeypatch):
    real_save_model = oelm.training.checkpoint.save_model
    calls = {"n": 0}

    def save_model_disk_full(model, filename, *a, **k):
        calls["n"] += 1
        if calls["n"] == 2:  # the second checkpoint: half a file, then the disk is full
            with open(filename, "wb") as fh:
                fh.write(b"\0" * 1000)
            raise OSError(errno.ENOSPC, "No space left on device", filename)
        return real_save_model(model, filename, *a, **k)

    monkeypatch.setattr(oelm.training.checkpoint, "save_model", save_model_disk_full)
    run_dir = tmp_path / "run"
    with pytest.raises(RunFaultError) as info:
        in_process(run_dir)
    err = info.value
    assert err.kind == "disk_full" and err.step == 14 and "No space left" in str(err)
    left = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert left == ["step-7"]  # the partial step-14 temp dir was removed; step-7 intact
    _assert_loadable_and_finite(run_dir / "checkpoints" / "step-7")

    monkeypatch.setattr(oelm.training.checkpoint, "save_model", real_save_model)  # space freed: the rerun resumes
    result, _, _ = in_process(run_dir)
    assert result.timing["process_start_steps"] == [0, 7] and result.steps == 90
    assert math.isfinite(result.final_train_loss)


def test_saving_the_best_weights_is_atomic_a_failed_rename_keeps_the_previous_file(tmp_path, monkeypatch):
    """``checkpoint/model.safetensors`` (the best weights a finished run keeps) is written to a
    temporary file, fsynced and renamed over the old one: when the rename fails (a crash or a full
    disk at that moment) the file already there stays byte for byte and no temporary file is
    left; when it succeeds the file holds the model's weights."""
    import os

    from safetensors.torch import load_file

    from oelm.config import TrainingConfig
    from oelm.training import TrainState, build_engine
    from oelm.training.loop import finish
    from oelm.training.metrics_log import MetricsLog

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    loader = torch.utils.data.DataLoader([{"x": torch.zeros(4)}] * 4, batch_size=2)
    engine = build_engine(model, loader, config=TrainingConfig(max_steps=2), learning_rate=1e-3, run_dir=tmp_path)
    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"the previous best weights")

    real_replace = os.replace

    def failing_replace(src, dst):
        raise OSError(errno.EIO, "Input/output error", str(dst))

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="Input/output error"):
        finish(engine, TrainState(), None)
    assert (ckpt / "model.safetensors").read_bytes() == b"the previous best weights"
    assert sorted(p.name for p in ckpt.iterdir()) == ["model.safetensors"]

    monkeypatch.setattr(os, "replace", real_replace)
    engine.log = MetricsLog(tmp_path, False, enabled=False)  # the failed call closed it
    finish(engine, TrainState(), None)
    saved = load_file(str(ckpt / "model.safetensors"))
    assert sorted(p.name for p in ckpt.iterdir()) == ["model.safetensors"]
    assert all(torch.equal(saved[k], v.cpu()) for k, v in model.state_dict().items()) and len(saved) == 2  # the engine may have moved the model to a GPU


SST2_TWO = (
    "name: full\n"
    "task: {dataset: sst2, tokenizer: bpe-512, train_samples: 32, validation_samples: 16, max_length: 32}\n"
    "model: {gpt: gpt-tiny, gpt_overrides: {hidden_size: 32, num_layers: 2, num_heads: 2, intermediate_size: 64}}\n"
    "methods: [{name: baseline}, {name: oelm_freeze}]\n"
    "seeds: [0]\n"
    "training: {max_steps: 4, batch_size: 8, eval_every: 2, progress_bar: false, tensorboard: false}\n"
)


def test_disk_full_while_saving_the_best_weights_fails_that_run_and_the_matrix_goes_on(tmp_path, data_dir, monkeypatch,
                                                                                         capsys):
    real_save_model = oelm.training.checkpoint.save_model

    def save_model(model, filename, *a, **k):
        path = Path(filename)
        if path.parent.name == "checkpoint" and path.parent.parent.name == "baseline-seed0":
            raise OSError(errno.ENOSPC, "No space left on device", filename)
        return real_save_model(model, filename, *a, **k)

    monkeypatch.setattr(oelm.training.checkpoint, "save_model", save_model)
    cfg = tmp_path / "full.yaml"
    cfg.write_text(SST2_TWO)
    out = tmp_path / "out"
    main(["run", str(cfg), "--output-dir", str(out)])
    failed = json.loads((out / "runs" / "baseline-seed0" / "result.json").read_text())
    finished = json.loads((out / "runs" / "oelm_freeze-seed0" / "result.json").read_text())
    assert failed["status"] == "failed" and failed["failure"]["kind"] == "disk_full"
    target = out / "runs" / "baseline-seed0" / "checkpoint" / "model.safetensors"
    assert str(target) in failed["failure"]["message"] and "free disk space then rerun" in failed["failure"]["message"]
    assert finished["status"] == "finished"
    assert not list(target.parent.glob(".*.tmp"))  # no half-written temporary file left
    assert "Traceback" not in capsys.readouterr().err
