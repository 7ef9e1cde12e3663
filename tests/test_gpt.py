"""Tests for oelm.models.gpt: config validation, presets, shapes, causality, padding, loss,
parameter/FLOP arithmetic, init, and that a tiny model learns."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from oelm.errors import ConfigError
from oelm.models.gpt import (
    PRESETS,
    GPTConfig,
    GPTForCausalLM,
    GPTForSequenceClassification,
    GPTModel,
    build_gpt,
    causal_lm_loss,
    gpt_config,
)

# A model small enough that every test runs in well under a second on 2 CPU cores.
TINY = dict(
    vocab_size=97,
    context_length=32,
    num_layers=2,
    num_heads=4,
    hidden_size=32,
    intermediate_size=64,
)


def tiny_config(**overrides) -> GPTConfig:
    return GPTConfig(**{**TINY, **overrides})


def make(cls, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return cls(tiny_config(**overrides)).eval()


def random_ids(B: int, T: int, vocab: int = TINY["vocab_size"], seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (B, T), generator=g)


def hand_count(V: int, C: int, ctx: int, L: int, F_: int, bias: bool = True) -> dict[str, int]:
    """Parameter counts of the tied causal LM derived from the architecture, term by term."""
    b = 1 if bias else 0
    ln = C + b * C  # weight (+ bias)
    attn = 4 * (C * C + b * C)  # q, k, v, o
    mlp = (C * F_ + b * F_) + (F_ * C + b * C)  # fc, proj
    block = 2 * ln + attn + mlp
    wte, wpe = V * C, ctx * C
    total = wte + wpe + L * block + ln  # + ln_f; tied lm_head adds nothing
    return {"total": total, "wte": wte, "wpe": wpe}


# ---------------------------------------------------------------------------------------------
# config and presets


def test_presets_have_exact_values():
    medium = PRESETS["gpt-medium-512"]
    assert (
        medium.hidden_size,
        medium.num_layers,
        medium.num_heads,
        medium.intermediate_size,
        medium.context_length,
    ) == (512, 6, 8, 2048, 512)
    tiny = PRESETS["gpt-tiny"]
    assert (
        tiny.hidden_size,
        tiny.num_layers,
        tiny.num_heads,
        tiny.intermediate_size,
        tiny.context_length,
    ) == (128, 4, 4, 512, 256)
    for cfg in PRESETS.values():
        assert cfg.vocab_size == 50304
        assert cfg.tie_word_embeddings is True
    assert medium.head_dim == 64 and tiny.head_dim == 32


def test_gpt_config_applies_overrides_on_a_copy():
    cfg = gpt_config("gpt-tiny", vocab_size=1000, num_labels=3)
    assert (cfg.vocab_size, cfg.num_labels, cfg.hidden_size) == (1000, 3, 128)
    assert PRESETS["gpt-tiny"].vocab_size == 50304  # preset untouched
    cfg.hidden_size = 64
    assert gpt_config("gpt-tiny").hidden_size == 128
    assert gpt_config("gpt-tiny") is not PRESETS["gpt-tiny"]


def test_config_replace_returns_a_validated_copy():
    base = tiny_config()
    cfg = base.replace(num_layers=3, dropout=0.1)
    assert (cfg.num_layers, cfg.dropout, cfg.hidden_size) == (3, 0.1, base.hidden_size)
    assert (base.num_layers, base.dropout) == (2, 0.0)  # the original is not modified
    with pytest.raises(ConfigError, match="n_layer"):
        base.replace(n_layer=3)
    with pytest.raises(ConfigError, match="num_layers"):
        base.replace(num_layers=0)


def test_hidden_not_divisible_by_heads_names_both_values():
    with pytest.raises(ConfigError, match=r"hidden_size=100.*num_heads=8") as info:
        GPTConfig(hidden_size=100, num_heads=8)
    assert isinstance(info.value, ValueError)
    with pytest.raises(ConfigError, match="hidden_size=130"):
        gpt_config("gpt-tiny", hidden_size=130)


def test_unknown_preset_lists_valid_names():
    with pytest.raises(ConfigError) as info:
        gpt_config("gpt-huge")
    msg = str(info.value)
    assert "gpt-huge" in msg
    for name in PRESETS:
        assert name in msg


def test_unknown_override_key_is_named():
    with pytest.raises(ConfigError, match="n_embd"):
        gpt_config("gpt-tiny", n_embd=64)
    with pytest.raises(ConfigError, match="n_layer"):
        build_gpt(tiny_config(), "causal_lm", n_layer=3)


@pytest.mark.parametrize(
    "field", ["vocab_size", "context_length", "num_layers", "num_heads", "hidden_size",
              "intermediate_size", "num_labels"]
)
@pytest.mark.parametrize("bad", [0, -4, 2.0, True])
def test_sizes_must_be_positive_ints(field, bad):
    with pytest.raises(ConfigError, match=field):
        tiny_config(**{field: bad})


@pytest.mark.parametrize(
    "overrides, name",
    [({"dropout": 1.0}, "dropout"), ({"dropout": -0.1}, "dropout"),
     ({"layer_norm_eps": 0.0}, "layer_norm_eps"), ({"pad_token_id": 97}, "pad_token_id"),
     ({"pad_token_id": -1}, "pad_token_id")],
)
def test_other_fields_are_validated(overrides, name):
    with pytest.raises(ConfigError, match=name):
        tiny_config(**overrides)


def test_to_dict_from_dict_round_trip():
    cfg = tiny_config(pad_token_id=0, dropout=0.1, bias=False)
    data = cfg.to_dict()
    assert data["hidden_size"] == 32 and data["pad_token_id"] == 0
    assert GPTConfig.from_dict(data) == cfg
    with pytest.raises(ConfigError, match="hiden_size"):
        GPTConfig.from_dict({**data, "hiden_size": 32})


def test_build_gpt_tasks():
    assert isinstance(build_gpt("gpt-tiny", "causal_lm", **TINY), GPTForCausalLM)
    clf = build_gpt(tiny_config(), "sequence_classification", num_labels=5)
    assert isinstance(clf, GPTForSequenceClassification)
    assert clf.score.out_features == 5
    with pytest.raises(ConfigError, match="causal_lm"):
        build_gpt("gpt-tiny", "translation")


# ---------------------------------------------------------------------------------------------
# architecture


def test_forward_shapes():
    ids = random_ids(3, 10)
    mask = torch.ones_like(ids)
    assert make(GPTModel)(ids).shape == (3, 10, 32)
    out = make(GPTForCausalLM)(ids, attention_mask=mask)
    assert out.logits.shape == (3, 10, 97) and out.loss is None
    out = make(GPTForSequenceClassification, num_labels=3)(ids, attention_mask=mask)
    assert out.logits.shape == (3, 3) and out.loss is None


def test_separate_qkvo_projections_in_every_block():
    model = make(GPTForCausalLM)
    C = model.config.hidden_size
    assert len(model.transformer.h) == model.config.num_layers
    for block in model.transformer.h:
        attn = block.attn
        weights = [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, attn.o_proj.weight]
        for w in weights:
            assert isinstance(w, torch.nn.Parameter) and w.shape == (C, C)
        assert len({w.data_ptr() for w in weights}) == 4  # four distinct tensors, not fused
        assert (attn.num_heads, attn.head_dim) == (4, 8)


def test_input_longer_than_context_raises():
    model = make(GPTForCausalLM)
    with pytest.raises(ValueError, match="context_length=32"):
        model(random_ids(1, 33))


@pytest.mark.parametrize("with_mask", [False, True])
def test_causality(with_mask):
    model = make(GPTForCausalLM)
    ids = random_ids(2, 16)
    mask = torch.ones_like(ids) if with_mask else None
    t = 7
    changed = ids.clone()
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 1 + random_ids(2, 16 - t - 1, seed=9)) % 97
    with torch.no_grad():
        a = model(ids, attention_mask=mask).logits
        b = model(changed, attention_mask=mask).logits
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :], atol=1e-3)  # later positions do see it


# ---------------------------------------------------------------------------------------------
# tied embeddings, parameter and FLOP counts


def test_tied_embeddings_are_shared_and_counted_once():
    model = make(GPTForCausalLM)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.get_input_embeddings() is model.transformer.wte
    expected = hand_count(97, 32, 32, 2, 64)
    assert model.num_parameters() == expected["total"]
    untied = make(GPTForCausalLM, tie_word_embeddings=False)
    assert untied.lm_head.weight is not untied.transformer.wte.weight
    assert untied.num_parameters() == expected["total"] + 97 * 32


def test_num_parameters_gpt_medium_512_matches_hand_count():
    V, C, ctx, L, F_ = 50304, 512, 512, 6, 2048
    with torch.device("meta"):  # shapes only: no 45M-parameter allocation or init
        model = build_gpt("gpt-medium-512", "causal_lm", vocab_size=V)
    expected = hand_count(V, C, ctx, L, F_)
    assert expected["total"] == 44_933_120  # pinned once, so the formula itself is checked too
    assert model.num_parameters() == expected["total"]
    # Excluding embeddings drops the position table only: the tied wte is the output matmul.
    assert model.num_parameters(exclude_embeddings=True) == expected["total"] - expected["wpe"]
    with torch.device("meta"):
        clf = build_gpt("gpt-medium-512", "sequence_classification", vocab_size=V, num_labels=2)
    non_emb = expected["total"] - expected["wte"] - expected["wpe"]
    assert clf.num_parameters() == expected["total"] + C * 2 + 2
    assert clf.num_parameters(exclude_embeddings=True) == non_emb + C * 2 + 2


def test_flops_per_token_formula():
    with torch.device("meta"):
        model = build_gpt("gpt-medium-512", "causal_lm")
    n = model.num_parameters(exclude_embeddings=True)
    for T in (1, 128, 512):
        assert model.flops_per_token(T) == 6 * n + 12 * 6 * 512 * T
    # attention term grows linearly in T
    assert model.flops_per_token(512) - model.flops_per_token(256) == 12 * 6 * 512 * 256
    with pytest.raises(ValueError):
        model.flops_per_token(513)
    with pytest.raises(ValueError):
        model.flops_per_token(0)


def test_gpt2_style_init():
    torch.manual_seed(0)
    model = GPTForCausalLM(gpt_config("gpt-tiny", vocab_size=512))  # C=128, L=4
    residual_std = 0.02 / math.sqrt(2 * 4)
    for block in model.transformer.h:
        for w in (block.attn.q_proj.weight, block.attn.k_proj.weight, block.mlp.fc.weight):
            assert w.std().item() == pytest.approx(0.02, rel=0.05)
        for w in (block.attn.o_proj.weight, block.mlp.proj.weight):
            assert w.std().item() == pytest.approx(residual_std, rel=0.05)
        for lin in (block.attn.q_proj, block.attn.o_proj, block.mlp.fc, block.mlp.proj):
            assert torch.all(lin.bias == 0)
    assert model.transformer.wte.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.transformer.wpe.weight.std().item() == pytest.approx(0.02, rel=0.05)


# ---------------------------------------------------------------------------------------------
# losses


def test_causal_lm_loss_is_shifted_cross_entropy():
    model = make(GPTForCausalLM)
    ids = random_ids(3, 12)
    labels = ids.clone()
    labels[0, -4:] = -100  # e.g. padding
    out = model(ids, labels=labels)
    V = model.config.vocab_size
    manual = F.cross_entropy(
        out.logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1), ignore_index=-100
    )
    torch.testing.assert_close(out.loss, manual)
    # Explicit per-token mean, independent of F.cross_entropy's reduction.
    logp = out.logits.log_softmax(-1)
    terms = [
        -logp[b, t - 1, labels[b, t]] for b in range(3) for t in range(1, 12) if labels[b, t] != -100
    ]
    torch.testing.assert_close(out.loss, torch.stack(terms).mean())
    # An unshifted loss would be different: guards against dropping the shift.
    unshifted = F.cross_entropy(out.logits.reshape(-1, V), ids.reshape(-1))
    assert not torch.isclose(out.loss, unshifted)


def _sliced_logits_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss as oelm computed it before shifting labels: slice (copy) the logits instead."""
    V = logits.size(-1)
    return F.cross_entropy(logits[:, :-1].reshape(-1, V).float(), labels[:, 1:].reshape(-1), ignore_index=-100)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_causal_lm_loss_equals_the_sliced_logits_formula_with_gradients(dtype):
    g = torch.Generator().manual_seed(3)
    B, T, V = 4, 17, 53
    logits = (3 * torch.randn(B, T, V, generator=g)).to(dtype).requires_grad_()
    labels = torch.randint(0, V, (B, T), generator=g)
    labels[1, :5] = -100  # left padding
    labels[2, -3:] = -100  # right padding
    new = causal_lm_loss(logits, labels)
    (grad_new,) = torch.autograd.grad(new, logits)
    old = _sliced_logits_loss(logits, labels)
    (grad_old,) = torch.autograd.grad(old, logits)
    assert new.dtype == torch.float32
    torch.testing.assert_close(new, old, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad_new, grad_old, rtol=1e-6, atol=1e-7)
    assert grad_new[:, -1].abs().max() == 0  # the last position predicts nothing


def test_causal_lm_loss_never_materializes_shifted_logits():
    from torch.profiler import ProfilerActivity, profile

    B, T, V = 2, 9, 31
    logits = torch.randn(B, T, V, requires_grad=True)
    labels = torch.randint(0, V, (B, T))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        causal_lm_loss(logits, labels).backward()
    shapes = [shape for e in prof.events() for shape in e.input_shapes]
    assert [B, T - 1, V] not in shapes  # no copy of logits[:, :-1] forward, no scatter into zeros backward
    # The check can fail: the sliced formula does touch a [B, T-1, V] tensor.
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        _sliced_logits_loss(logits, labels).backward()
    assert [B, T - 1, V] in [shape for e in prof.events() for shape in e.input_shapes]


@pytest.mark.parametrize("rows", [None, 5])  # one chunk; several, the last one short (34 rows)
def test_chunked_cross_entropy_equals_fp32_cross_entropy(rows):
    from oelm.models.loss import chunked_cross_entropy

    g = torch.Generator().manual_seed(4)
    N, V = 34, 97
    logits = (4 * torch.randn(N, V, generator=g)).requires_grad_()
    target = torch.randint(0, V, (N,), generator=g)
    target[::3] = -100
    ref = F.cross_entropy(logits, target, ignore_index=-100)
    (ref_grad,) = torch.autograd.grad(ref, logits)
    new = chunked_cross_entropy(logits, target, rows=rows)
    (new_grad,) = torch.autograd.grad(2.5 * new, logits)  # an upstream gradient other than 1 is applied
    torch.testing.assert_close(new, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(new_grad, 2.5 * ref_grad, rtol=1e-5, atol=1e-7)
    assert new_grad[::3].abs().max() == 0  # ignored rows get no gradient
    all_ignored = chunked_cross_entropy(logits, torch.full((N,), -100), rows=rows)
    assert torch.isnan(all_ignored) and torch.isnan(F.cross_entropy(logits, torch.full((N,), -100)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_lm_loss_equals_the_fp32_upcast(dtype):
    """bf16/fp16 logits: the loss equals F.cross_entropy(logits.float()) to 1e-6 (the same fp32 math
    on the same values), the gradient to one rounding of the logits' dtype."""
    from oelm.models.loss import chunked_cross_entropy

    g = torch.Generator().manual_seed(5)
    B, T, V = 3, 11, 101
    logits = (3 * torch.randn(B, T, V, generator=g)).to(dtype).requires_grad_()
    labels = torch.randint(0, V, (B, T), generator=g)
    labels[0, :4] = -100
    target = F.pad(labels[:, 1:], (0, 1), value=-100).reshape(-1)
    ref = F.cross_entropy(logits.float().reshape(-1, V), target, ignore_index=-100)
    (ref_grad,) = torch.autograd.grad(ref, logits)
    new = causal_lm_loss(logits, labels)
    (new_grad,) = torch.autograd.grad(new, logits)
    assert new.dtype == torch.float32 and new_grad.dtype == dtype
    torch.testing.assert_close(new, ref, rtol=1e-6, atol=1e-6)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(new_grad.float(), ref_grad.float(), rtol=eps, atol=eps * ref_grad.float().abs().max().item())
    chunked = chunked_cross_entropy(logits.reshape(-1, V), target, rows=4)  # several chunks: the same loss
    torch.testing.assert_close(chunked, ref, rtol=1e-6, atol=1e-6)


def test_bf16_lm_loss_never_copies_the_whole_logits_to_fp32():
    from torch.profiler import ProfilerActivity, profile

    from oelm.models.loss import chunked_cross_entropy

    N, V = 12, 29
    logits = torch.randn(N, V).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, V, (N,))

    def upcast_shapes(fn) -> list:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            fn().backward()
        return [e.input_shapes[0] for e in prof.events() if e.name == "aten::_to_copy"]

    chunked = upcast_shapes(lambda: chunked_cross_entropy(logits, target, rows=4))
    assert [4, V] in chunked and [N, V] not in chunked  # fp32 a chunk of rows at a time
    assert [N, V] in upcast_shapes(lambda: F.cross_entropy(logits.float(), target))  # the check can fail


def test_classification_loss_is_cross_entropy():
    model = make(GPTForSequenceClassification, num_labels=3)
    ids = random_ids(4, 9)
    labels = torch.tensor([0, 2, 1, 2])
    out = model(ids, labels=labels)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, labels))


# ---------------------------------------------------------------------------------------------
# classification pooling and padding


def test_classification_pools_last_non_pad_token_right_padding():
    model = make(GPTForSequenceClassification, num_labels=3)
    ids = random_ids(2, 8)
    with torch.no_grad():
        plain = model(ids, attention_mask=torch.ones_like(ids)).logits
        padded_ids = torch.cat([ids, torch.zeros(2, 5, dtype=torch.long)], dim=1)  # (2, 13)
        mask = torch.cat([torch.ones(2, 8), torch.zeros(2, 5)], dim=1).long()
        padded = model(padded_ids, attention_mask=mask).logits
        torch.testing.assert_close(padded, plain, atol=1e-5, rtol=0)
        # Any token in a pad slot changes nothing.
        other = padded_ids.clone()
        other[:, 8:] = random_ids(2, 5, seed=3)
        torch.testing.assert_close(model(other, attention_mask=mask).logits, padded, atol=1e-5, rtol=0)
        # ...but the last real token matters (so pooling is not on position 0 or a pad slot).
        last_changed = padded_ids.clone()
        last_changed[:, 7] = (last_changed[:, 7] + 1) % 97
        assert not torch.allclose(model(last_changed, attention_mask=mask).logits, padded, atol=1e-4)


def test_classification_rows_of_different_lengths_in_one_batch():
    model = make(GPTForSequenceClassification, num_labels=2)
    a, b = random_ids(1, 5, seed=4), random_ids(1, 9, seed=5)
    batch = torch.zeros(2, 9, dtype=torch.long)
    batch[0, :5], batch[1] = a[0], b[0]
    mask = torch.zeros(2, 9, dtype=torch.long)
    mask[0, :5], mask[1] = 1, 1
    with torch.no_grad():
        together = model(batch, attention_mask=mask).logits
        torch.testing.assert_close(together[0], model(a).logits[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(together[1], model(b).logits[0], atol=1e-5, rtol=0)


def test_classification_left_padding_matches_unpadded():
    model = make(GPTForSequenceClassification, num_labels=3)
    ids = random_ids(2, 8)
    left = torch.cat([torch.full((2, 4), 5, dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros(2, 4), torch.ones(2, 8)], dim=1).long()
    with torch.no_grad():
        plain = model(ids).logits
        padded = model(left, attention_mask=mask).logits
    assert torch.isfinite(padded).all()
    torch.testing.assert_close(padded, plain, atol=1e-5, rtol=0)


def test_left_padded_hidden_states_are_finite_and_match():
    model = make(GPTModel)
    ids = random_ids(1, 6)
    left = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        h = model(left, attention_mask=mask)
    assert torch.isfinite(h).all()  # pad queries with no real key must not produce NaN
    torch.testing.assert_close(h[:, 3:], model(ids), atol=1e-5, rtol=0)


def test_attention_mask_is_causal_padding_and_never_empty():
    from oelm.models.gpt import _attention_mask_4d

    pad = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    m = _attention_mask_4d(pad, 5)  # (B, 1, T, T)
    assert m.shape == (2, 1, 5, 5) and m.dtype == torch.bool
    assert m.any(dim=-1).all()  # every query row allows some key: no softmax over nothing
    i, j = torch.meshgrid(torch.arange(5), torch.arange(5), indexing="ij")
    expected = (j <= i) & (pad.bool()[:, None, None, :] | (i == j))
    assert torch.equal(m, expected)


def test_classification_uses_pad_token_id_without_mask():
    model = make(GPTForSequenceClassification, num_labels=2, pad_token_id=0)
    ids = torch.randint(1, 97, (2, 6), generator=torch.Generator().manual_seed(7))
    padded = torch.cat([ids, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded).logits, model(ids).logits, atol=1e-5, rtol=0)
    # Without pad_token_id or mask the last position is pooled, so trailing pads do matter.
    no_pad = make(GPTForSequenceClassification, num_labels=2)
    with torch.no_grad():
        assert not torch.allclose(no_pad(padded).logits, no_pad(ids).logits, atol=1e-4)


def test_mask_shape_mismatch_raises():
    model = make(GPTModel)
    with pytest.raises(ValueError, match="attention_mask"):
        model(random_ids(2, 5), attention_mask=torch.ones(2, 4))


# ---------------------------------------------------------------------------------------------
# training


def test_dropout_only_in_train_mode():
    model = make(GPTForCausalLM, dropout=0.5)
    ids = random_ids(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, model(ids).logits)
        model.train()
        assert not torch.allclose(model(ids).logits, model(ids).logits)


def test_a_few_optimizer_steps_reduce_loss():
    model = make(GPTForCausalLM).train()
    ids = random_ids(4, 16)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(10):
        loss = model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(97), rel=0.1)  # near-uniform at init
    assert losses[-1] < 0.8 * losses[0]


def test_classifier_trains_and_grads_reach_qk():
    model = make(GPTForSequenceClassification, num_labels=2).train()
    ids = random_ids(8, 10)
    labels = torch.tensor([0, 1] * 4)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(15):
        loss = model(ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        if first is None:
            first = loss.item()
            q_grad = model.transformer.h[0].attn.q_proj.weight.grad
            assert q_grad is not None and q_grad.abs().sum() > 0
        opt.step()
    assert loss.item() < 0.5 * first


# ---------------------------------------------------------------------------------------------
# a fixed attention map (the fixed_attention method: Synthesizer "Random", Tay et al. 2021)


def _fixed_attention_model(seed: int = 0) -> GPTForCausalLM:
    from oelm import apply_oelm

    model = make(GPTForCausalLM)
    apply_oelm(model, "fixed_attention", seed=seed)
    return model


def test_fixed_attention_map_does_not_depend_on_the_input_or_on_q_k():
    model = _fixed_attention_model()
    attn = model.transformer.h[0].attn
    assert attn.fixed_logits.shape == (4, 32, 32) and not attn.fixed_logits.requires_grad
    eye = torch.eye(32)
    with torch.no_grad():  # values and output = identity, so the module returns P @ x per head
        attn.v_proj.weight.copy_(eye), attn.v_proj.bias.zero_(), attn.o_proj.weight.copy_(eye), attn.o_proj.bias.zero_()
        T = 12
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        probs = torch.softmax(attn.fixed_logits[:, :T, :T].masked_fill(~causal, float("-inf")), dim=-1)  # (nh, T, T)
        for seed in (1, 2):  # two different inputs, one map
            x = torch.randn(2, T, 32, generator=torch.Generator().manual_seed(seed))
            heads = x.view(2, T, 4, 8).transpose(1, 2)  # (B, nh, T, hs)
            expected = (probs @ heads).transpose(1, 2).reshape(2, T, 32)
            torch.testing.assert_close(attn(x), expected, atol=1e-6, rtol=0)
            torch.testing.assert_close(attn(x, torch.ones(2, T, dtype=torch.long)), expected, atol=1e-6, rtol=0)
        y = attn(x)
        attn.q_proj.weight.normal_(), attn.k_proj.weight.normal_()  # Q/K are not used any more
        assert torch.equal(attn(x), y)


def test_fixed_attention_keeps_causality_trains_around_the_map_and_is_seeded():
    model = _fixed_attention_model()
    ids = random_ids(2, 16)
    changed = ids.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 97
    with torch.no_grad():
        a, b = model(ids).logits, model(changed).logits
    torch.testing.assert_close(a[:, :8], b[:, :8], atol=1e-6, rtol=0)
    model.train()
    model(ids, labels=ids).loss.backward()
    attn = model.transformer.h[1].attn
    assert attn.fixed_logits.grad is None and attn.q_proj.weight.grad is None and attn.k_proj.weight.grad is None
    assert attn.v_proj.weight.grad.abs().sum() > 0
    other = _fixed_attention_model(seed=0)
    assert torch.equal(other.transformer.h[1].attn.fixed_logits, attn.fixed_logits)
    assert not torch.equal(_fixed_attention_model(seed=1).transformer.h[1].attn.fixed_logits, attn.fixed_logits)


def test_fixed_attention_map_is_not_counted_as_matmul_parameters():
    from oelm.architectures.flops import count_matmul_parameters

    baseline, fixed = make(GPTForCausalLM), _fixed_attention_model()
    assert count_matmul_parameters(fixed) == count_matmul_parameters(baseline)
    assert fixed.num_parameters() == baseline.num_parameters() + 2 * 4 * 32 * 32  # the map is a (frozen) parameter
    assert fixed.oelm_report.groups["attention_map"] == {"total": 2 * 4 * 32 * 32, "trainable": 0, "frozen": 2 * 4 * 32 * 32}
