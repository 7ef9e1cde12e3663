"""Engine parts of oelm.training: torch.compile modes, the fused-AdamW choice, pinned host
loaders on CUDA, no host sync per step, warmup longer than the run refused, the end-of-training
validation never a second record of (nearly) the same weights, and a full disk while saving the
best weights ending that run as a failed result while the matrix goes on."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import oelm.training.checkpoint
from _reliability import in_process
from oelm.cli import main
from oelm.config import TrainingConfig
from oelm.errors import ConfigError, RunFaultError
from oelm.training import TrainState, build_engine, build_optimizer, make_scheduler, optimizer_step, use_fused_adamw
from oelm.training.engine import _host_loader, compile_mode
from oelm.training.metrics_log import log_train


class _Tiny(nn.Module):
    """forward(**batch) -> .loss/.logits, as the engine expects (input_ids are float features here)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor | None = None):
        logits = self.lin(input_ids)
        return SimpleNamespace(loss=F.cross_entropy(logits.float(), labels), logits=logits)


def _loader(n: int = 8, batch_size: int = 2) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randn(4, generator=g), "attention_mask": torch.ones(4, dtype=torch.long),
             "labels": torch.tensor(i % 3)} for i in range(n)]
    return torch.utils.data.DataLoader(rows, batch_size=batch_size)


def test_compile_accepts_torch_compile_modes():
    assert [compile_mode(TrainingConfig(compile=v)) for v in (False, True, "default", "reduce-overhead", "max-autotune")] == [
        None, "default", "default", "reduce-overhead", "max-autotune"]
    with pytest.raises(ValueError, match="compile"):
        TrainingConfig(compile="fastest")


def test_a_compile_mode_trains_a_tiny_model_on_cpu():
    torch.manual_seed(0)
    model, loader = _Tiny(), _loader()
    before = model.lin.weight.detach().clone()
    engine = build_engine(model, loader, config=TrainingConfig(max_steps=2, compile="reduce-overhead", warmup_steps=0))
    assert engine.compiled is not None
    state = TrainState()
    for batch in list(loader)[:2]:
        loss = optimizer_step(engine, state, batch, iter(()))
    assert state.step == 2 and torch.isfinite(loss) and not torch.equal(model.lin.weight.detach(), before)


def test_fused_adamw_where_the_parameters_go_to_cuda_or_stay_on_the_cpu():
    cpu = [nn.Parameter(torch.zeros(2, 2))]
    assert use_fused_adamw(cpu) and use_fused_adamw(cpu, "cpu")  # CPU: unchanged (fused)
    assert use_fused_adamw(cpu, torch.device("cuda"))  # built on the host, moved to CUDA by Accelerate
    assert not use_fused_adamw(cpu, "mps") and not use_fused_adamw([], "cuda")
    assert not use_fused_adamw([nn.Parameter(torch.zeros(2, device="meta"))], "cuda")
    assert build_optimizer(_Tiny(), 1e-3, TrainingConfig()).defaults["fused"] is True
    assert not build_optimizer(_Tiny(), 1e-3, TrainingConfig(), device="mps").defaults["fused"]


def test_host_loaders_pin_memory_only_when_the_device_is_cuda():
    def accelerator(kind):
        return SimpleNamespace(device=torch.device(kind), prepare_data_loader=lambda dl, device_placement: dl)

    cuda_loader, cpu_loader = _loader(), _loader()
    assert _host_loader(accelerator("cuda"), cuda_loader).pin_memory is True
    assert _host_loader(accelerator("cpu"), cpu_loader).pin_memory is False
    assert _host_loader(accelerator("cuda"), None) is None


@pytest.mark.parametrize("precision", ["no", "bf16", "fp16"])
def test_no_host_sync_between_log_steps(precision, monkeypatch):
    """Reading a tensor's value on the host (item, bool, float, int) is a device sync on a GPU.
    Between log steps the engine reads none, in any precision (fp16: the GradScaler hands its inf
    flag to the fused AdamW); the only reads are the host batch's token count. The log step reads
    the accumulators (shown, so the recorder is not blind)."""
    torch.manual_seed(0)
    loader = _loader()
    engine = build_engine(_Tiny(), loader, config=TrainingConfig(max_steps=4, mixed_precision=precision, warmup_steps=0))
    batches = list(loader)  # the loader's own seed draw is not the engine's
    reads: list[str] = []

    def recorder(name):
        real = getattr(torch.Tensor, name)

        def read(self, *a, **k):
            import sys

            reads.append(sys._getframe(1).f_code.co_name)
            return real(self, *a, **k)
        return read

    for name in ("item", "__bool__", "__float__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, recorder(name))
    state = TrainState()
    for batch in batches:
        optimizer_step(engine, state, batch, iter(()))
    assert state.step == 4 and set(reads) == {"count_tokens"}
    reads.clear()
    log_train(engine, state)
    assert "check_finite" in reads and "log_train" in reads


@pytest.mark.parametrize("precision", ["no", "fp16"])
def test_one_process_steps_with_torch_directly_and_the_same_arithmetic(precision, monkeypatch):
    """On one process the step bypasses Accelerate's backward, clipping and optimizer wrapper
    (their Python per step is most of the engine's overhead in a launch-bound step), and the
    weights after a few steps equal, bit for bit, those of Accelerate's path on the same batches."""
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer

    calls: list[str] = []

    def counted(real, name):
        def call(self, *a, **k):
            calls.append(name)
            return real(self, *a, **k)
        return call

    for cls, name in ((Accelerator, "backward"), (Accelerator, "clip_grad_norm_"), (AcceleratedOptimizer, "step"),
                      (AcceleratedOptimizer, "zero_grad")):
        monkeypatch.setattr(cls, name, counted(getattr(cls, name), name))

    def weights_after_steps(direct: bool) -> tuple[list[torch.Tensor], list[str]]:
        torch.manual_seed(0)
        loader = _loader()
        engine = build_engine(_Tiny(), loader, config=TrainingConfig(max_steps=4, mixed_precision=precision, warmup_steps=0))
        assert engine.direct  # one process, no sharding: the direct path is chosen
        engine.direct = direct
        calls.clear()
        state = TrainState()
        for batch in list(loader):
            optimizer_step(engine, state, batch, iter(()))
        return [p.detach().clone() for p in engine.unwrapped.parameters()], sorted(set(calls))

    torch.manual_seed(0)
    initial = _Tiny().lin.weight.detach().clone()
    direct, direct_calls = weights_after_steps(True)
    wrapped, wrapped_calls = weights_after_steps(False)
    assert direct_calls == []
    # fp16: the GradScaler steps the inner optimizer on either path
    assert wrapped_calls == sorted({"backward", "clip_grad_norm_", "zero_grad"} | ({"step"} if precision == "no" else set()))
    assert all(torch.equal(a, b) for a, b in zip(direct, wrapped)) and not torch.equal(direct[0], initial)


def test_warmup_longer_than_the_run_is_refused_before_the_first_step():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ConfigError, match=r"training.warmup_steps=50 is longer than the run's 20 planned optimizer steps"):
        make_scheduler(opt, TrainingConfig(warmup_steps=50), total_steps=20)
    make_scheduler(opt, TrainingConfig(warmup_steps=20), total_steps=20)  # as long as the run: allowed
    with pytest.raises(ConfigError, match="training.warmup_steps=9 .* 4 planned"):
        build_engine(_Tiny(), _loader(), config=TrainingConfig(max_steps=4, warmup_steps=9))


def test_the_end_of_training_validation_is_not_a_second_record_of_nearly_the_same_weights(tmp_path, data_dir):
    """41 steps, a validation every 20: the one scheduled at 40 would evaluate nearly the weights
    of the end-of-training one at 41; it is left to that one. 50 steps keep 40 (half an interval
    before the end). Every validated step has one record."""
    near, _, _ = in_process(tmp_path / "near", "training.max_steps=41", "training.checkpoint_every=null")
    far, _, _ = in_process(tmp_path / "far", "training.max_steps=50", "training.checkpoint_every=null")
    assert [r["step"] for r in near.history if r["type"] == "eval"] == [20, 41]
    assert [r["step"] for r in far.history if r["type"] == "eval"] == [20, 40, 50]
    assert near.final_validation == [r for r in near.history if r["type"] == "eval"][-1]["perplexity"]


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


def test_evaluate_reads_the_device_once_not_per_batch(monkeypatch):
    """The sums stay on the device (float64/int64) and are read once at the end: the same number
    of host reads for 2 batches as for 10, and the same value as the per-batch Python sum."""
    from oelm.training import evaluate

    torch.manual_seed(0)
    model = _Tiny()
    expected = {}
    for n in (4, 20):
        loader = _loader(n)
        with torch.no_grad():
            outs = [(model(**b), b["labels"]) for b in loader]
        loss = sum(float(o.loss) * len(y) for o, y in outs) / n
        correct = sum(int((o.logits.argmax(-1) == y).sum()) for o, y in outs)
        expected[n] = {"value": 100.0 * correct / n, "loss": loss, "n": n}
    reads = {}
    real = {name: getattr(torch.Tensor, name) for name in ("item", "__bool__", "__float__", "__int__")}
    for n in (4, 20):
        loader, count = _loader(n), []
        batches = list(loader)
        for name, fn in real.items():
            monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _fn=fn, **k: (count.append(1), _fn(self, *a, **k))[1])
        result = evaluate(model, batches, "accuracy")
        for name, fn in real.items():
            monkeypatch.setattr(torch.Tensor, name, fn)
        reads[n] = len(count)
        assert result == expected[n]
    assert reads[4] == reads[20] <= 3
