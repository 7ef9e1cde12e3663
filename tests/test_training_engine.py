"""The engine of oelm.training and its step: gradient accumulation, the schedules (WSD, warmup
longer than the run refused), the undone timing warm-up, torch.compile and its modes, the
fused-AdamW choice, pinned host loaders on CUDA, no host sync per step and the direct step's
arithmetic; on the tiny real TinyStories run of _train_driver (oelm GPT, BPE-384, 40 stories) and
a tiny model (_tiny_model)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from _reliability import in_process, in_process_summary
from _tiny_model import Tiny, tiny_loader
from oelm.config import TrainingConfig
from oelm.errors import ConfigError
from oelm.training import (
    TrainState, build_engine, build_optimizer, make_scheduler, optimizer_step, optimizer_steps_per_epoch, use_fused_adamw,
)
from oelm.training.engine import _host_loader, compile_mode
from oelm.training.metrics_log import log_train


NO_DROPOUT = "model.gpt_overrides={hidden_size: 32, num_layers: 2, num_heads: 2, intermediate_size: 64, dropout: 0.0}"


SHORT = ["training.max_steps=12", "training.eval_every=6", "training.checkpoint_every=null", NO_DROPOUT]


def _train_losses(result) -> list[float]:
    return [r["loss"] for r in result.history if r["type"] == "train"]


def test_accumulation_of_two_micro_batches_of_4_equals_one_batch_of_8(tmp_path, data_dir):
    """The same 8 sequences per optimizer step (the loader order is the sampler's, batched in 4s),
    the mean of two micro-batch means = the mean of 8 equal-length blocks: same training to float
    tolerance; an accumulation of 2 with batch 8 (16 per step) is a different run."""
    one, _, _ = in_process(tmp_path / "one", *SHORT, "training.batch_size=8")
    acc, _, _ = in_process(tmp_path / "acc", *SHORT, "training.batch_size=4", "training.gradient_accumulation_steps=2")
    big, _, _ = in_process(tmp_path / "big", *SHORT, "training.batch_size=8", "training.gradient_accumulation_steps=2")
    assert one.steps == acc.steps == big.steps == 12
    assert one.timing["samples"] == acc.timing["samples"] == 12 * 8 and big.timing["samples"] == 12 * 16
    assert acc.timing["gradient_accumulation_steps"] == 2
    for a, b in zip(_train_losses(one), _train_losses(acc)):
        assert math.isclose(a, b, rel_tol=1e-5)
    assert math.isclose(one.final_validation, acc.final_validation, rel_tol=1e-5)
    assert not math.isclose(one.final_validation, big.final_validation, rel_tol=1e-3)


def test_accumulation_larger_than_an_epoch_is_a_config_error():
    with pytest.raises(ConfigError, match="gradient_accumulation_steps=8 is more than the 5 batches"):
        optimizer_steps_per_epoch(5, 8)
    assert optimizer_steps_per_epoch(10, 3) == 3  # the remainder micro-batch is left out


def test_wsd_schedule_warms_up_holds_then_decays_over_the_last_fifth():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    cfg = TrainingConfig(schedule="wsd", warmup_steps=10, decay_ratio=0.2)
    sched = make_scheduler(opt, cfg, total_steps=100)
    lrs = []
    for _ in range(100):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == 0.0 and lrs[5] == pytest.approx(0.5)  # linear warmup
    assert all(lr == pytest.approx(1.0) for lr in lrs[10:80])  # stable
    assert lrs[81] < 1.0 and lrs[99] < 0.01 and all(a >= b for a, b in zip(lrs[80:], lrs[81:]))  # decay to ~0


def test_warmup_pass_is_undone_results_bit_identical_and_time_reported(tmp_path, data_dir):
    """The warm-up pass (dropout on, so it draws random numbers) changes no number of the run."""
    with_warmup = in_process(tmp_path / "w", "training.max_steps=10", "training.timing_warmup_passes=2")
    without = in_process(tmp_path / "n", "training.max_steps=10", "training.timing_warmup_passes=0")
    a = in_process_summary(with_warmup[0], with_warmup[1], tmp_path / "w")
    b = in_process_summary(without[0], without[1], tmp_path / "n")
    assert a == b
    assert with_warmup[0].timing["warmup_seconds"] > 0 and without[0].timing["warmup_seconds"] == 0.0
    assert with_warmup[0].timing["compile_seconds"] is None


@pytest.mark.slow
def test_compile_trains_the_same_model_and_reports_compile_seconds(tmp_path, data_dir):
    eager, _, _ = in_process(tmp_path / "e", *SHORT)
    compiled, model, _ = in_process(tmp_path / "c", *SHORT, "training.compile=true")
    assert compiled.timing["compile"] is True and compiled.timing["compile_seconds"] > 0
    assert compiled.steps == eager.steps
    assert math.isclose(compiled.final_validation, eager.final_validation, rel_tol=1e-3)
    assert not any(k.startswith("_orig_mod") for k in model.state_dict())  # the saved names are the model's own


def test_compile_accepts_torch_compile_modes():
    assert [compile_mode(TrainingConfig(compile=v)) for v in (False, True, "default", "reduce-overhead", "max-autotune")] == [
        None, "default", "default", "reduce-overhead", "max-autotune"]
    with pytest.raises(ValueError, match="compile"):
        TrainingConfig(compile="fastest")


def test_a_compile_mode_trains_a_tiny_model_on_cpu():
    torch.manual_seed(0)
    model, loader = Tiny(), tiny_loader()
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
    assert build_optimizer(Tiny(), 1e-3, TrainingConfig()).defaults["fused"] is True
    assert not build_optimizer(Tiny(), 1e-3, TrainingConfig(), device="mps").defaults["fused"]


def test_host_loaders_pin_memory_only_when_the_device_is_cuda():
    def accelerator(kind):
        return SimpleNamespace(device=torch.device(kind), prepare_data_loader=lambda dl, device_placement: dl)

    cuda_loader, cpu_loader = tiny_loader(), tiny_loader()
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
    loader = tiny_loader()
    engine = build_engine(Tiny(), loader, config=TrainingConfig(max_steps=4, mixed_precision=precision, warmup_steps=0))
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
        loader = tiny_loader()
        engine = build_engine(Tiny(), loader, config=TrainingConfig(max_steps=4, mixed_precision=precision, warmup_steps=0))
        assert engine.direct  # one process, no sharding: the direct path is chosen
        engine.direct = direct
        calls.clear()
        state = TrainState()
        for batch in list(loader):
            optimizer_step(engine, state, batch, iter(()))
        return [p.detach().clone() for p in engine.unwrapped.parameters()], sorted(set(calls))

    torch.manual_seed(0)
    initial = Tiny().lin.weight.detach().clone()
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
        build_engine(Tiny(), tiny_loader(), config=TrainingConfig(max_steps=4, warmup_steps=9))
