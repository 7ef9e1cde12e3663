"""Tests for oelm.architectures.flops (PaLM FLOP count for any model) and the peak / MFU helpers of
oelm.runtime.environment: datasheet table, measured-probe fallback, mfu_record arithmetic."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel

from oelm import apply_oelm
from oelm.architectures.flops import count_matmul_parameters, executed_flops_per_token, model_flops_per_token
from oelm.models.gpt import GPTConfig, GPTForCausalLM
from oelm.runtime import environment
from oelm.runtime.environment import mfu_record, peak_flops, peaks

# ---------------------------------------------------------------------------------------------
# FLOPs per token, against hand counts


def _gpt_hand_n(V: int, C: int, L: int, F: int) -> int:
    """Matmul parameters of oelm's tied GPT LM: blocks + final norm + the tied lm_head (= wte)."""
    ln = 2 * C
    attn = 4 * (C * C + C)
    mlp = C * F + F + F * C + C
    return L * (2 * ln + attn + mlp) + ln + V * C  # wpe excluded; wte counted once, as lm_head


def test_gpt_flops_match_hand_count_and_generic_formula():
    V, C, L, F, T = 101, 32, 3, 80, 16
    model = GPTForCausalLM(GPTConfig(vocab_size=V, context_length=T, num_layers=L, num_heads=4, hidden_size=C, intermediate_size=F))
    n = _gpt_hand_n(V, C, L, F)
    assert count_matmul_parameters(model) == n
    expected = 6 * n + 12 * L * C * T
    assert model_flops_per_token(model, T) == expected
    assert model.flops_per_token(T) == model_flops_per_token(model, T)


def test_untied_gpt_counts_the_separate_head_but_not_the_table():
    V, C, L, F, T = 50, 16, 2, 32, 8
    model = GPTForCausalLM(GPTConfig(vocab_size=V, context_length=T, num_layers=L, num_heads=2, hidden_size=C,
                                     intermediate_size=F, tie_word_embeddings=False))
    assert count_matmul_parameters(model) == _gpt_hand_n(V, C, L, F)  # wte excluded, lm_head (same size) in
    assert model.flops_per_token(T) == model_flops_per_token(model, T)


def test_hf_gpt2_flops_hand_count():
    V, C, L, T, ctx = 97, 32, 2, 12, 64
    model = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=C, n_layer=L, n_head=4, n_positions=ctx))
    F = 4 * C  # GPT-2's n_inner default
    block = 2 * (2 * C) + (C * 3 * C + 3 * C) + (C * C + C) + (C * F + F) + (F * C + C)
    n = L * block + 2 * C + V * C  # + ln_f + tied lm_head; wpe (ctx x C) excluded
    assert count_matmul_parameters(model) == n
    assert model_flops_per_token(model, T) == 6 * n + 12 * L * C * T


def test_hf_bert_flops_hand_count():
    V, C, L, F, T = 120, 32, 2, 64, 10
    cfg = BertConfig(vocab_size=V, hidden_size=C, num_hidden_layers=L, num_attention_heads=4, intermediate_size=F,
                     max_position_embeddings=40, type_vocab_size=2)
    model = BertForMaskedLM(cfg)
    block = 4 * (C * C + C) + 2 * C + (C * F + F) + (F * C + C) + 2 * C  # attn + LN, FFN + LN
    embeddings_ln = 2 * C
    mlm_head = (C * C + C) + 2 * C + V * C + V  # transform dense + LN, tied decoder + its bias
    n = L * block + embeddings_ln + mlm_head  # word/position/token-type tables excluded
    assert count_matmul_parameters(model) == n
    assert model_flops_per_token(model, T) == 6 * n + 12 * L * C * T


def test_frozen_weights_count_as_model_flops_but_not_as_executed_weight_grads():
    T = 16
    kw = dict(vocab_size=64, context_length=T, num_layers=2, num_heads=4, hidden_size=32, intermediate_size=64)
    torch.manual_seed(0)
    base = GPTForCausalLM(GPTConfig(**kw))
    oelm = GPTForCausalLM(GPTConfig(**kw))
    apply_oelm(oelm, "oelm_freeze")
    assert model_flops_per_token(oelm, T) == model_flops_per_token(base, T)
    frozen = count_matmul_parameters(oelm, frozen=True)
    assert frozen == 2 * 2 * (32 * 32 + 32)  # q and k (weights + biases) in 2 layers
    assert count_matmul_parameters(oelm, frozen=False) + frozen == count_matmul_parameters(oelm)
    assert executed_flops_per_token(oelm, T) == model_flops_per_token(oelm, T) - 2 * frozen
    assert executed_flops_per_token(base, T) == model_flops_per_token(base, T)


def test_flops_errors():
    model = GPTForCausalLM(GPTConfig(vocab_size=64, context_length=8, num_layers=1, num_heads=2, hidden_size=16, intermediate_size=32))
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError):
            model_flops_per_token(model, bad)
    with pytest.raises(ValueError, match="no .config"):
        model_flops_per_token(torch.nn.Linear(4, 4), 8)


# ---------------------------------------------------------------------------------------------
# peaks


@pytest.mark.parametrize(
    "name, dtype, expected",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989e12),
        ("NVIDIA H100 80GB HBM3", "fp16", 989e12),
        ("NVIDIA H100 80GB HBM3", "tf32", 494.5e12),
        ("NVIDIA H100 80GB HBM3", "fp32", 67e12),
        ("NVIDIA H100 PCIe", "bf16", 756e12),
        ("NVIDIA H100 PCIe", "fp32", 51e12),
        ("NVIDIA H100 NVL", "bf16", 835e12),
        ("NVIDIA H100 NVL", "tf32", 417.5e12),
        ("NVIDIA H100 NVL", "fp32", 60e12),
        ("NVIDIA H200", "fp32", 67e12),
        ("NVIDIA H200 NVL", "bf16", 835e12),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312e12),
        ("NVIDIA A100 80GB PCIe", "tf32", 156e12),
        ("NVIDIA A100-SXM4-40GB", "fp32", 19.5e12),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "bf16", None),
        ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "fp32", None),
        ("NVIDIA A10", "bf16", None),
        ("NVIDIA GeForce RTX 4090", "fp32", None),
    ],
)
def test_datasheet_table(name, dtype, expected):
    assert peaks._peak_flops_for_name(name, dtype) == expected


def test_peak_flops_cpu_and_bad_dtype():
    assert peak_flops("cpu") is None and peak_flops("cpu", "fp32") is None
    with pytest.raises(ValueError, match="unknown precision"):
        peak_flops("cpu", "int8")


def test_measured_peak_is_positive_and_cached():
    first = environment.measured_peak_flops("cpu", "fp32", budget_seconds=0.3)
    assert first > 0
    assert environment.measured_peak_flops("cpu", "fp32") == first  # probed once per process


# ---------------------------------------------------------------------------------------------
# mfu_record


def test_mfu_record_arithmetic_against_the_measured_peak():
    peak = environment.measured_peak_flops("cpu", "fp32", budget_seconds=0.3)
    # 2e7 FLOPs x 10 tokens/s = 0.2 GFLOP/s: below any probe, even one taken on a loaded machine (a run
    # that beats the measured peak makes mfu_record measure it again, a different number)
    rec = mfu_record(2.0e7, 10.0, "cpu", "fp32")
    assert rec["peak_source"] == "measured-probe" and rec["peak_precision"] == "fp32"
    assert rec["peak_flops"] == peak
    assert rec["mfu"] == pytest.approx(2.0e7 * 10.0 / peak)
    assert rec["flops_per_token"] == 2.0e7 and rec["tokens_per_second"] == 10.0 and rec["precision"] == "fp32"
    # the engine's "no" means fp32
    assert mfu_record(2.0e7, 1000.0, "cpu", "no")["peak_precision"] == "fp32"


def test_mfu_record_without_probe_or_throughput():
    rec = mfu_record(1e9, 10.0, "cpu", "bf16", measure=False)
    assert rec["mfu"] is None and rec["peak_flops"] is None and rec["peak_source"] is None
    rec = mfu_record(1e9, None, "cpu", "fp32")
    assert rec["mfu"] is None and rec["peak_flops"] > 0


def test_mfu_record_uses_the_datasheet_on_a_known_gpu(monkeypatch):
    # Pretend to be an H100 SXM: the record must use its datasheet figure for the precision.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    rec = mfu_record(1e9, 98.9e3, "cuda:0", "bf16")
    assert rec["peak_source"] == "datasheet:H100 SXM" and rec["peak_flops"] == 989e12
    assert rec["mfu"] == pytest.approx(1e9 * 98.9e3 / 989e12)
    monkeypatch.setattr(peaks, "_tf32_enabled", lambda: False)
    assert mfu_record(1e9, 1.0, "cuda:0", "fp32")["peak_flops"] == 67e12
    monkeypatch.setattr(peaks, "_tf32_enabled", lambda: True)
    rec = mfu_record(1e9, 1.0, "cuda:0", "fp32")
    assert rec["peak_flops"] == 494.5e12 and rec["peak_precision"] == "tf32"


def test_layers_and_width_are_asked_of_the_registered_architecture(monkeypatch):
    """(L, H) come from the attributes the model's ArchitectureSpec names: a registered family
    whose config calls them ``depth`` / ``width`` is counted, an unregistered one is refused
    naming the attributes tried; oelm's GPT is found by its config's model_type."""
    from types import SimpleNamespace

    from oelm.architectures import ARCHITECTURES, architecture_from_dict, architecture_of, register_architecture
    from oelm.architectures.flops import model_layers_and_width

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = SimpleNamespace(model_type="tiny-depth-width", depth=3, width=16, num_heads=2)
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(3))

    with pytest.raises(ValueError, match="has none of num_layers, num_hidden_layers, n_layer"):
        model_layers_and_width(Tiny())
    monkeypatch.setitem(ARCHITECTURES, "tiny-depth-width", None)  # removed again after the test
    register_architecture(architecture_from_dict({
        "model_type": "tiny-depth-width", "attention_pattern": r"blocks\.(\d+)$", "query": "q", "key": "k",
        "num_heads": "num_heads", "num_layers": "depth", "hidden_size": "width"}))
    assert model_layers_and_width(Tiny()) == (3, 16)
    assert model_flops_per_token(Tiny(), 8) == 6 * (3 * (16 * 16 + 16)) + 12 * 3 * 16 * 8
    gpt = GPTForCausalLM(GPTConfig(vocab_size=64, context_length=16, num_layers=2, num_heads=2, hidden_size=8,
                                   intermediate_size=16))
    assert architecture_of(gpt).model_type == "oelm-gpt" and model_layers_and_width(gpt) == (2, 8)
