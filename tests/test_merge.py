"""The way out of OELM (issue 26): ``merge_and_unload``, ``model.save_pretrained`` of a split model in
the stock layout (issue 35), ``model.print_trainable_parameters()``, and no second ``apply_oelm`` on one
model.

For every registered family with a fused Q/K/V layout (GPT-2 ``c_attn``: Conv1D, weight
``[in, 3*out]``; GPT-NeoX ``query_key_value``: rows ``[num_heads, 3, head_dim]``) a tiny
random-weight model (nothing downloaded) goes through ``apply_oelm("oelm_freeze")`` (and the research
methods that restructure nothing else: oelm_rescaled, oelm_mimetic, reservoir), a few AdamW
steps, ``merge_and_unload`` and ``save_pretrained``; a stock ``AutoModelForCausalLM.from_pretrained``
must then load every tensor (no missing or unexpected key) and give the merged model's logits.
"""

from __future__ import annotations

import copy
import json
import pickle

import pytest
import torch
import transformers as T
from torch import nn

import oelm
from oelm import ARCHITECTURES, OELMError, apply_oelm, merge_and_unload, parameter_report
from oelm.architectures import SplitQKV, find_attention_projections, split_fused_projections
from oelm.checkpoint import METADATA_NAME
from oelm.method import OELM_ATTRIBUTES

VOCAB = 100

# model_type -> (config class, causal-LM class, tiny config)
BUILDERS = {
    "gpt2": (T.GPT2Config, T.GPT2LMHeadModel,
             dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0)),
    "gpt_neox": (T.GPTNeoXConfig, T.GPTNeoXForCausalLM,
                 dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                      max_position_embeddings=64, attention_bias=True)),
}
# read from the registry at import time, before any test registers architectures of its own
FUSED_FAMILIES = sorted(t for t, spec in ARCHITECTURES.items() if any(a.fused is not None for a in spec.attention))


def build(family: str) -> nn.Module:
    config_cls, model_cls, kwargs = BUILDERS[family]
    torch.manual_seed(0)
    return model_cls(config_cls(**kwargs))


def tiny_bert() -> nn.Module:
    torch.manual_seed(0)
    return T.BertForSequenceClassification(T.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, num_labels=2))


def randomize_(model: nn.Module, std: float = 0.1) -> None:
    """Every parameter, biases too, to non-zero random values, so that a bias in the wrong place shows."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)


def token_ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(seed))


def train_a_few_steps(model: nn.Module, steps: int = 3) -> None:
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    for step in range(steps):
        ids = token_ids(step)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def assert_same_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    now = model.state_dict()
    assert set(now) == set(state)
    assert all(torch.equal(now[n], state[n]) for n in state), [n for n in state if not torch.equal(now[n], state[n])]


def stock_reload(directory):
    model, info = T.AutoModelForCausalLM.from_pretrained(directory, output_loading_info=True)
    return model.eval(), info


def test_every_fused_family_in_the_registry_is_covered():
    """A newly registered fused family fails here until it gets a builder (and so the round trip)."""
    assert FUSED_FAMILIES and set(FUSED_FAMILIES) <= set(BUILDERS), FUSED_FAMILIES


# ---------------------------------------------------------------- SplitQKV.fuse


@pytest.mark.parametrize(
    "layout, kv_heads",
    [("qkv_conv1d", 4), ("qkv_per_head", 4), ("qkv", 4), ("qkv", 1)],  # ("qkv", 1): multi-query, K/V narrower
)
@pytest.mark.parametrize("bias", [True, False])
def test_fuse_is_the_exact_inverse_of_from_fused(layout, kv_heads, bias):
    from transformers.pytorch_utils import Conv1D

    heads, head_dim, hidden = 4, 8, 32
    out = heads * head_dim + 2 * kv_heads * head_dim
    torch.manual_seed(0)
    if layout == "qkv_conv1d":
        fused = Conv1D(out, hidden)
        if not bias:
            fused.bias = None
    else:
        fused = nn.Linear(hidden, out, bias=bias)
    with torch.no_grad():
        for p in fused.parameters():
            p.normal_()
    split = SplitQKV.from_fused(fused, layout, heads, kv_heads, head_dim)
    again = split.fuse()
    assert type(again) is type(fused)
    assert again.weight.shape == fused.weight.shape and torch.equal(again.weight, fused.weight)
    if bias:
        assert torch.equal(again.bias, fused.bias)
    elif layout == "qkv_conv1d":  # a Conv1D always has a bias: zeros stand in for none
        assert torch.equal(again.bias, torch.zeros(out))
    else:
        assert again.bias is None
    assert all(p.requires_grad for p in again.parameters())
    x = torch.randn(3, 5, hidden)
    with torch.no_grad():
        assert torch.allclose(again(x), split(x), atol=1e-5, rtol=0)


# ---------------------------------------------------------------- the round trip


@pytest.mark.parametrize("method", ["oelm_freeze", "oelm_rescaled", "oelm_mimetic", "reservoir"])
@pytest.mark.parametrize("family", FUSED_FAMILIES)
def test_merge_and_unload_round_trips_through_stock_from_pretrained(family, method, tmp_path):
    stock = build(family)
    fused_names = [s.fused_name for s in find_attention_projections(stock)]
    model = build(family)
    randomize_(model)
    apply_oelm(model, method, seed=0)
    assert sum(isinstance(m, SplitQKV) for m in model.modules()) == len(fused_names) == 2
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train_a_few_steps(model)
    params = dict(model.named_parameters())
    assert any(not torch.equal(p, before[n]) for n, p in params.items() if p.requires_grad), "training moved nothing"
    frozen = {n: p.detach().clone() for n, p in params.items() if not p.requires_grad}
    assert frozen and all(torch.equal(frozen[n], before[n]) for n in frozen)
    model.eval()
    ids = token_ids(7)
    with torch.no_grad():
        split_logits = model(input_ids=ids).logits

    merged = merge_and_unload(model)

    assert merged is model
    assert not any(isinstance(m, SplitQKV) for m in merged.modules())
    modules, stock_modules = dict(merged.named_modules()), dict(stock.named_modules())
    assert all(type(modules[n]) is type(stock_modules[n]) for n in fused_names)
    assert {n: t.shape for n, t in merged.state_dict().items()} == {n: t.shape for n, t in stock.state_dict().items()}
    assert all(p.requires_grad for p in merged.parameters())  # a plain model again (see merge_and_unload)
    assert not set(OELM_ATTRIBUTES) & set(vars(merged))
    assert merged.save_pretrained.__func__ is type(merged).save_pretrained  # the class's own method is back
    with torch.no_grad():
        merged_logits = merged(input_ids=ids).logits
    assert torch.allclose(merged_logits, split_logits, atol=1e-6, rtol=0)

    merged.save_pretrained(tmp_path / "hf")
    reloaded, info = stock_reload(tmp_path / "hf")
    assert type(reloaded) is type(stock)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    with torch.no_grad():
        assert torch.allclose(reloaded(input_ids=ids).logits, merged_logits, atol=1e-6, rtol=0)
    # the frozen Q/K the model trained with (every layer's, or a reservoir layer's) are what the stock checkpoint holds
    split_fused_projections(reloaded)
    checked = 0
    for site in find_attention_projections(reloaded):
        for target in ("query", "key"):
            name = site.query_name if target == "query" else site.key_name
            if f"{name}.weight" in frozen:
                assert torch.equal(site.module(target).weight, frozen[f"{name}.weight"]), name
                assert torch.equal(site.module(target).bias, frozen[f"{name}.bias"]), name
                checked += 1
    assert checked == (2 if method == "reservoir" else 4)  # reservoir: layer 1 of 2


def test_merge_and_unload_leaves_a_model_oelm_never_touched_alone():
    model = tiny_bert()
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)  # the user's own choice
    state, attributes = snapshot(model), set(vars(model))
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    assert merge_and_unload(model) is model
    assert_same_state(model, state)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert set(vars(model)) == attributes


def test_merge_and_unload_of_a_model_without_fused_modules(tmp_path):
    """BERT keeps its modules and names; only OELM's attributes and freezing go."""
    model = tiny_bert()
    names = set(model.state_dict())
    apply_oelm(model, "oelm_freeze", seed=0)
    assert "save_pretrained" in vars(model)  # nothing to fuse; it adds the recipe to config.json
    state = snapshot(model)
    merge_and_unload(model)
    assert set(model.state_dict()) == names
    assert_same_state(model, state)
    assert all(p.requires_grad for p in model.parameters())
    assert not set(OELM_ATTRIBUTES) & set(vars(model))
    model.save_pretrained(tmp_path)
    reloaded, info = T.AutoModelForSequenceClassification.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert_same_state(reloaded, state)


# ---------------------------------------------------------------- model.save_pretrained of a split model


@pytest.mark.parametrize("family", FUSED_FAMILIES)
def test_save_pretrained_of_a_split_model_writes_the_stock_layout(family, tmp_path):
    model = build(family)
    randomize_(model)
    apply_oelm(model, "oelm_freeze", seed=0)
    train_a_few_steps(model)
    state = snapshot(model)
    model.save_pretrained(tmp_path / "hf")
    assert_same_state(model, state)  # saved from a fused copy: the model keeps its split modules
    assert sum(isinstance(m, SplitQKV) for m in model.modules()) == 2
    assert "save_pretrained" not in vars(build(family))  # on this instance only, the class is untouched

    reloaded, info = stock_reload(tmp_path / "hf")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ids = token_ids(7)
    with torch.no_grad():
        assert torch.allclose(reloaded(input_ids=ids).logits, model.eval()(input_ids=ids).logits, atol=1e-6, rtol=0)
    recipe = json.loads((tmp_path / "hf" / "config.json").read_text())["oelm"]
    assert recipe["method"] == "oelm_freeze" and set(recipe["frozen"]) == {n for n, p in model.named_parameters() if not p.requires_grad}

    # the lean OELM checkpoint is unaffected
    oelm.save_pretrained(model, tmp_path / "lean")
    base = build(family)
    randomize_(base)
    assert_same_state(oelm.load_oelm(tmp_path / "lean", base_model=base), state)


def test_trainer_save_model_writes_a_checkpoint_stock_transformers_loads(tmp_path):
    pytest.importorskip("accelerate")
    model = build("gpt2")
    apply_oelm(model, "oelm_freeze", seed=0)
    args = T.TrainingArguments(output_dir=str(tmp_path / "trainer"), report_to="none", save_strategy="no",
                               use_cpu=True, disable_tqdm=True)
    trainer = T.Trainer(model=model, args=args)
    trainer.save_model(str(tmp_path / "saved"))
    _, info = stock_reload(tmp_path / "saved")
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert oelm.load_oelm(tmp_path / "saved").oelm_config == model.oelm_config


# ---------------------------------------------------------------- model.print_trainable_parameters()


def test_print_trainable_parameters_is_a_method_of_the_model(capsys, tmp_path):
    model = build("gpt2")
    report = apply_oelm(model, "oelm_freeze", seed=0)
    model.print_trainable_parameters()
    assert capsys.readouterr().out == f"{report}\n"
    model.transformer.wte.weight.requires_grad_(False)  # it counts the model as it is now
    model.print_trainable_parameters()
    now = capsys.readouterr().out
    assert now == f"{parameter_report(model)}\n" and now != f"{report}\n"

    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):  # bound to the copy, not the original
        clone.transformer.wpe.weight.requires_grad_(False)
        clone.print_trainable_parameters()
        assert capsys.readouterr().out == f"{parameter_report(clone)}\n" != now
        clone.save_pretrained(tmp_path / "clone")  # bound to the clone: its own frozen wpe is in the recipe
        recipe = json.loads((tmp_path / "clone" / "config.json").read_text())["oelm"]
        assert {"transformer.wte.weight", "transformer.wpe.weight"} <= set(recipe["frozen"])


# ---------------------------------------------------------------- one OELM application per model


@pytest.mark.parametrize("make", [lambda: build("gpt2"), tiny_bert], ids=["gpt2", "bert"])
def test_a_second_apply_oelm_is_refused_before_anything_changes(make, tmp_path):
    model = make()
    randomize_(model)
    apply_oelm(model, "oelm_random", seed=1)
    state = snapshot(model)
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    for second in (lambda: apply_oelm(model, "oelm_freeze"), lambda: oelm.get_oelm_model(model, "baseline")):
        with pytest.raises(OELMError) as info:
            second()
        message = str(info.value)
        assert "\n" not in message and "already went through apply_oelm ('oelm_random')" in message
        assert "fresh model" in message and "oelm.merge_and_unload" in message
    assert_same_state(model, state)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert model.oelm_config.method == "oelm_random"

    # the lean checkpoint records the one method applied, and restores the model from it
    oelm.save_pretrained(model, tmp_path / "lean")
    assert json.loads((tmp_path / "lean" / METADATA_NAME).read_text())["method"] == "oelm_random"
    base = make()
    randomize_(base)
    assert_same_state(oelm.load_oelm(tmp_path / "lean", base_model=base), state)

    # after merge_and_unload the model is plain again, and a method may be applied to it
    merge_and_unload(model)
    report = apply_oelm(model, "oelm_freeze")
    assert model.oelm_config.method == "oelm_freeze"
    assert all(p["frozen"] and p["max_orthogonality_error"] < 1e-5 for p in report.projections)
