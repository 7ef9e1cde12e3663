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


# --- a real full disk: a small tmpfs (issue 37, item 5) ------------------------------------------

def _tmpfs_works() -> bool:
    import shutil
    import subprocess

    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt && umount /mnt"],
                           capture_output=True)
    return probe.returncode == 0


needs_tmpfs = pytest.mark.skipif(not _tmpfs_works(), reason="cannot mount a tmpfs in a private mount namespace "
                                 "(`unshare -m` + `mount -t tmpfs` need root or user namespaces)")

#: Fill a tmpfs at argv[1] to the last byte, then write with each library through oelm.io.disk_writes;
#: print what each raised. Run in its own mount namespace, so the tmpfs vanishes with it.
_FILL_AND_WRITE = r"""
import json, sys, torch
from pathlib import Path
from safetensors.torch import save_file
from tokenizers import Tokenizer, models
from oelm.data.tokenizers import save_tokenizer
from transformers import PreTrainedTokenizerFast
from oelm.io import disk_writes

mnt = Path(sys.argv[1])
with open(mnt / "filler", "wb", buffering=0) as fh:
    try:
        while True:
            fh.write(b"\0" * 4096)
    except OSError:
        pass
big = {"w": torch.ones(256, 1024)}
vocab = {f"word{i:06d}" * 4: i for i in range(5000)}
tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="word000000" * 4)))
found = {}
for name, write in [("safetensors", lambda: save_file(big, str(mnt / "w.safetensors"))),
                    ("torch.save", lambda: torch.save(big, mnt / "w.pt")),
                    ("tokenizers", lambda: save_tokenizer(tok, mnt / "tokenizer.json"))]:
    try:
        with disk_writes(mnt):
            write()
        found[name] = "written"
    except OSError as exc:
        found[name] = exc.errno
    except Exception as exc:
        found[name] = type(exc).__name__
print(json.dumps(found))
"""


@needs_tmpfs
def test_safetensors_torch_and_tokenizers_errors_on_a_real_full_disk_are_enospc(tmp_path):
    """On a real full file system, safetensors (SafetensorError), torch.save (a RuntimeError of
    its zip writer, no errno) and tokenizers (a bare Exception) each raise their own type; inside
    oelm.io.disk_writes every one is the OSError ENOSPC that oelm's faults handle."""
    import json
    import subprocess
    import sys

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = tmp_path / "fill_and_write.py"
    script.write_text(_FILL_AND_WRITE)
    proc = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=256k tmpfs {mnt} && "
                           f"{sys.executable} {script} {mnt}"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
        "safetensors": errno.ENOSPC, "torch.save": errno.ENOSPC, "tokenizers": errno.ENOSPC}


@needs_tmpfs
def test_a_real_full_disk_fails_the_run_as_disk_full_in_one_line_and_the_matrix_goes_on(tmp_path, data_dir):
    """The output folder on a 2 MiB tmpfs: the config, tokenizer, logs and results fit, a checkpoint
    of this 1.7M-parameter model (~20 MB with its optimizer state) does not. The run that checkpoints
    fails on safetensors' own error and is recorded `failed` with kind `disk_full` and one log line;
    the matrix goes on, the run that writes no checkpoint finishes, and the comparison is written."""
    import json
    import subprocess
    import sys

    from _tiny_matrix import CONFIG, write_config

    text = (CONFIG.replace("hidden_size: 32, num_layers: 2, num_heads: 2, intermediate_size: 64",
                           "hidden_size: 256, num_layers: 2, num_heads: 2, intermediate_size: 1024")
            .replace("methods: [{name: baseline, learning_rates: [1.0e-4, 3.0e-3]}, {name: oelm_freeze, learning_rate: 2.0e-3},\n"
                     "          {name: oelm_random, learning_rate: 2.0e-3}]",
                     "methods: [{name: baseline, learning_rate: 1.0e-4, training: {checkpoint_every: 1000, "
                     "save_best_checkpoint: false}},\n          {name: oelm_freeze, learning_rate: 2.0e-3}]"))
    assert "hidden_size: 256" in text and "checkpoint_every: 1000" in text
    cfg = write_config(tmp_path, text)
    out, kept = tmp_path / "out", tmp_path / "kept"
    # the tmpfs lives in the command's own mount namespace; the records are copied out before it ends
    command = (f"mount -t tmpfs -o size=2m tmpfs {out} && {sys.executable} -m oelm run {cfg} --output-dir {out}; "
               f"rc=$?; mkdir -p {kept} && cp -r {out}/runs {kept}/; cp {out}/comparison.json {kept}/; exit $rc")
    out.mkdir()
    proc = subprocess.run(["unshare", "-m", "sh", "-c", command], capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert "Traceback" not in log, log
    failed = json.loads((kept / "runs" / "oelm_freeze-seed0" / "result.json").read_text())
    assert failed["status"] == "failed" and failed["failure"]["kind"] == "disk_full", failed
    assert "No space left on device" in failed["failure"]["message"], failed
    assert json.loads((kept / "runs" / "oelm_freeze-seed0" / "status.json").read_text())["state"] == "failed"
    lines = [line for line in log.splitlines() if line.startswith("[oelm_freeze-seed0] FAILED")]
    assert len(lines) == 1 and "(disk_full at step" in lines[0] and lines[0].endswith("going on with the next run"), log
    assert json.loads((kept / "runs" / "baseline-seed0" / "result.json").read_text())["status"] == "finished"
    assert (kept / "comparison.json").is_file()
