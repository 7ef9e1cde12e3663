"""The learned per-head temperature (``oelm_temperature``, :mod:`oelm.method.temperature`) on every registered family.

Step 0 computes ``oelm_rescaled``'s outputs on pretrained weights with biases (the real all-MiniLM-L6-v2
on real SST-2 sentences, and every tiny family with random non-zero biases) and ``oelm_freeze``'s from
scratch (``head_temperature=1.0``); the frozen Q/K weights are ``oelm_freeze``'s bytes and stay so
through AdamW with weight decay while the temperatures train; grouped-query attention pairs each
query head with its key head; a query norm is refused; pickling, diagnostics, the parameter report,
``merge_and_unload`` back to a stock model, and the experiment config's choice of the start.
Checkpoints (lean, Hugging Face layout, Trainer resume, PEFT): tests/test_temperature_checkpoints.py.
"""

from __future__ import annotations

import copy
import pickle

import pandas as pd
import pytest
import torch
import transformers as T
from test_architectures import FAMILIES, HEADS, LAYERS, batch, build, randomize_

from oelm import METHODS, ConfigError, UnsupportedModelError, apply_oelm, merge_and_unload
from oelm.architectures import find_attention_projections
from oelm.config import TrainingConfig
from oelm.method.temperature import TEMPERATURE_NAME, scale_query_heads
from oelm.training import build_optimizer

# DeBERTa-v2 adds position terms made with its own pos_key_proj / pos_query_proj (share_att_key false, the
# default): the temperature does not scale them as oelm_rescaled's norms do; with share_att_key the same
# query/key projections make them, and step 0 is oelm_rescaled again.
EXACT = {f: {"share_att_key": True} if f == "deberta-v2" else {} for f in FAMILIES}


def _inputs(family: str, seed: int = 0) -> dict[str, torch.Tensor]:
    b = {k: v for k, v in batch(family, seed).items() if k != "labels"}
    if FAMILIES[family][3] == "s2s":
        b["decoder_input_ids"] = b["input_ids"][:, :5]
    return b


def _outputs(family: str, method, std: float = 0.3, **overrides) -> tuple[torch.nn.Module, torch.Tensor]:
    """A family's tiny model with every parameter (biases too) random, ``method`` applied, and its logits."""
    model = build(family, **overrides)
    randomize_(model, std)
    apply_oelm(model, method)
    model.eval()
    with torch.no_grad():
        return model, model(**_inputs(family)).logits


def _temperatures(model) -> list[torch.Tensor]:
    return [getattr(s.query, TEMPERATURE_NAME) for s in find_attention_projections(model)]


@pytest.mark.parametrize("family", FAMILIES)
def test_step_zero_is_oelm_rescaled_with_oelm_freezes_frozen_weights(family):
    tempered, got = _outputs(family, "oelm_temperature", **EXACT[family])
    _, rescaled = _outputs(family, "oelm_rescaled", **EXACT[family])
    freeze, frozen_logits = _outputs(family, "oelm_freeze", **EXACT[family])
    assert torch.allclose(got, rescaled, atol=2e-5 * rescaled.abs().max().item(), rtol=0), (got - rescaled).abs().max()
    assert not torch.allclose(got, frozen_logits, atol=1e-3, rtol=0)  # the temperature is not 1 here
    for t, f in zip(find_attention_projections(tempered), find_attention_projections(freeze)):
        for target in ("query", "key"):
            assert t.module(target).weight.numpy().tobytes() == f.module(target).weight.numpy().tobytes()
            assert not t.module(target).weight.requires_grad
        tau = getattr(t.query, TEMPERATURE_NAME)
        assert tau.shape == (t.num_heads,) and tau.requires_grad and not torch.allclose(tau, torch.ones_like(tau))
    report = tempered.oelm_report
    assert report.groups["attention_query"]["trainable"] == sum(t.numel() for t in _temperatures(tempered))
    assert report.trainable == freeze.oelm_report.trainable + LAYERS * FAMILIES[family][4] * HEADS


@pytest.mark.parametrize("family", FAMILIES)
def test_from_scratch_it_starts_at_one_and_is_oelm_freeze_then_trains_with_frozen_bytes_kept(family):
    model, got = _outputs(family, METHODS["oelm_temperature"].replace(head_temperature=1.0))
    _, frozen_logits = _outputs(family, "oelm_freeze")
    assert torch.equal(got, frozen_logits)  # x * 1.0 is exact
    assert all(torch.equal(t, torch.ones_like(t)) for t in _temperatures(model))
    model.train()
    params = dict(model.named_parameters())
    frozen = {n: p.detach().clone() for n, p in params.items() if not p.requires_grad}
    taus = {n: p.detach().clone() for n, p in params.items() if n.endswith(TEMPERATURE_NAME)}
    opt = build_optimizer(model, 1e-2, TrainingConfig(weight_decay=0.1))
    decay = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert len(taus) == LAYERS * FAMILIES[family][4] and all(decay[id(params[n])] == 0 for n in taus)  # 1-D: no decay
    for step in range(2):
        model(**batch(family, seed=step)).loss.backward()
        opt.step()
        opt.zero_grad()
    assert all(params[n].detach().numpy().tobytes() == b.numpy().tobytes() for n, b in frozen.items())
    assert all(not torch.equal(params[n].detach(), before) for n, before in taus.items())


@pytest.mark.parametrize("num_kv_heads", [1, 2])
def test_grouped_query_attention_multiplies_each_query_heads_ratio_by_its_key_heads(num_kv_heads):
    model = build("llama", num_key_value_heads=num_kv_heads, attention_bias=True)
    randomize_(model, 0.3)
    sites = find_attention_projections(model)
    before = [(s.query.weight.detach().double().clone(), s.key.weight.detach().double().clone(),
               s.query.bias.detach().double().clone(), s.key.bias.detach().double().clone()) for s in sites]
    apply_oelm(model, "oelm_temperature")
    hd, group = 8, HEADS // num_kv_heads
    for s, (wq, wk, bq, bk) in zip(sites, before):
        a = torch.linalg.matrix_norm(wq.view(HEADS, hd, -1)) / hd ** 0.5  # orthonormal rows: ||W_h||_F / sqrt(head_dim)
        b = torch.linalg.matrix_norm(wk.view(num_kv_heads, hd, -1)) / hd ** 0.5
        expected = torch.stack([a[h] * b[h // group] for h in range(HEADS)])
        assert torch.allclose(getattr(s.query, TEMPERATURE_NAME).double(), expected, rtol=1e-6)
        assert torch.allclose(s.query.bias.double(), bq / a.repeat_interleave(hd), rtol=1e-6)
        assert torch.allclose(s.key.bias.double(), bk / b.repeat_interleave(hd), rtol=1e-6)
    _, rescaled = _outputs("llama", "oelm_rescaled", num_key_value_heads=num_kv_heads, attention_bias=True)
    model.eval()
    with torch.no_grad():
        assert torch.allclose(model(**_inputs("llama")).logits, rescaled, atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def minilm_and_sentences(data_dir):
    from oelm.models.pretrained import load_pretrained

    texts = pd.read_parquet(data_dir / "sst2" / "validation.parquet")["text"].tolist()[:8]
    _, tokenizer = load_pretrained("sentence-transformers/all-MiniLM-L6-v2", "sequence_classification", num_labels=2)
    return tokenizer(texts, padding=True, return_tensors="pt"), tokenizer


def _minilm(method, tokenizer):
    from oelm.models.pretrained import load_pretrained

    torch.manual_seed(0)  # the same fresh classifier head for every method
    model, _ = load_pretrained("sentence-transformers/all-MiniLM-L6-v2", "sequence_classification", num_labels=2,
                               tokenizer=tokenizer)
    apply_oelm(model, method)
    return model.eval()


def test_real_minilm_with_biases_step_zero_equals_oelm_rescaled(minilm_and_sentences):
    inputs, tokenizer = minilm_and_sentences
    models = {m: _minilm(m, tokenizer) for m in ("oelm_temperature", "oelm_rescaled", "oelm_freeze")}
    sites = {m: find_attention_projections(model) for m, model in models.items()}
    assert all(s.query.bias.abs().max() > 0.01 for s in sites["oelm_rescaled"])  # MiniLM's biases are not zero
    with torch.no_grad():
        hidden = {m: model.bert(**inputs).last_hidden_state for m, model in models.items()}
    scale = hidden["oelm_rescaled"].abs().max().item()
    assert torch.allclose(hidden["oelm_temperature"], hidden["oelm_rescaled"], atol=1e-5 * scale, rtol=0)
    assert (hidden["oelm_freeze"] - hidden["oelm_rescaled"]).abs().max() > 0.1 * scale  # QR alone differs
    taus = torch.cat([getattr(s.query, TEMPERATURE_NAME).detach() for s in sites["oelm_temperature"]])
    assert taus.numel() == 6 * 12 and taus.min() > 1.5  # MiniLM's rows have norm ~3 (docs/architectures.md)


def test_a_query_norm_is_refused_before_anything_changes():
    model = build("phi", qk_layernorm=True)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(UnsupportedModelError, match=r"layers\.0\.self_attn\.q_layernorm normalizes the query") as err:
        apply_oelm(model, "oelm_temperature")
    assert "\n" not in str(err.value)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items()) and not hasattr(model, "oelm_config")
    apply_oelm(model, "oelm_freeze")  # the other methods are fine


@pytest.mark.parametrize("value, match", [(-1.0, "positive number"), ("norm", "positive number"), (True, "positive"),
                                          (float("inf"), "positive number")])
def test_bad_head_temperature_values_are_refused(value, match):
    with pytest.raises(ConfigError, match=match):
        METHODS["oelm_temperature"].replace(head_temperature=value)


def test_head_temperature_needs_query_and_key_and_a_used_query():
    with pytest.raises(ConfigError, match=r"targets must be \('query', 'key'\)"):
        METHODS["oelm_temperature"].replace(targets=("query",))
    with pytest.raises(ConfigError, match="fixed_attention"):
        METHODS["oelm_temperature"].replace(fixed_attention=True, init="none")
    assert "head_temperature" not in METHODS["oelm_freeze"].to_dict()  # earlier methods keep their recorded form
    assert METHODS["oelm_temperature"].to_dict()["head_temperature"] == "norm_ratio"


def test_pickles_and_deep_copies_with_its_hook():
    model, expected = _outputs("gpt2", "oelm_temperature")
    with torch.no_grad():
        for site in find_attention_projections(model):
            getattr(site.query, TEMPERATURE_NAME).mul_(1.5)
        expected = model(**_inputs("gpt2")).logits
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        with torch.no_grad():
            assert torch.equal(other(**_inputs("gpt2")).logits, expected)


@pytest.mark.parametrize("family", ["bert", "oelm-gpt"])
def test_diagnostics_see_the_temperature(family):
    """Logit scale from the model's own attention (BERT, eager) and recomputed from the projections (oelm's GPT, SDPA)."""
    from oelm.method.diagnostics import attention_diagnostics

    tempered, _ = _outputs(family, "oelm_temperature")
    rescaled, _ = _outputs(family, "oelm_rescaled")
    inputs = _inputs(family)
    a, b = attention_diagnostics(tempered, inputs), attention_diagnostics(rescaled, inputs)
    for key in ("logit_scale", "entropy"):  # per head, rounded to 5 decimals in the record
        flat = [v for site in a["per_head"][key] for v in site]
        assert flat == pytest.approx([v for site in b["per_head"][key] for v in site], abs=2e-5), key
    with torch.no_grad():
        for tau in _temperatures(tempered):
            tau.mul_(2.0)
    again = attention_diagnostics(tempered, inputs)
    doubled = again["per_head"]["logit_scale"][0]  # layer 0: the same inputs
    assert doubled == pytest.approx([2 * v for v in a["per_head"]["logit_scale"][0]], abs=3e-5)
    # each head's learned tau is recorded where the model has one (and only there), [site][head]
    taus = [t.tolist() for t in _temperatures(tempered)]
    assert again["per_head"]["head_temperature"] == [pytest.approx(t, abs=1e-5) for t in taus]
    assert a["per_head"]["head_temperature"] == [pytest.approx([v / 2 for v in t], abs=1e-5) for t in taus]
    assert "head_temperature" not in b["per_head"] and set(a["mean"]) == set(b["mean"])


def _train(model, family: str, steps: int = 3) -> None:
    model.train()
    opt = build_optimizer(model, 1e-2, TrainingConfig(weight_decay=0.1))
    for step in range(steps):
        model(**batch(family, seed=step)).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_merge_and_unload_folds_the_temperature_and_a_stock_model_reproduces_the_logits(family, tmp_path):
    model, _ = _outputs(family, "oelm_temperature")
    _train(model, family)
    with torch.no_grad():
        expected = model(**_inputs(family, 5)).logits
    merge_and_unload(model)
    assert not any(TEMPERATURE_NAME in n for n, _ in model.named_parameters())
    assert not any(scale_query_heads in m._forward_hooks.values() for m in model.modules())
    with torch.no_grad():
        assert torch.allclose(model(**_inputs(family, 5)).logits, expected, atol=1e-5, rtol=1e-5)
    model.save_pretrained(tmp_path)
    auto = T.AutoModelForCausalLM if family == "gpt2" else T.AutoModelForSequenceClassification
    stock, info = auto.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        assert torch.allclose(stock.eval()(**_inputs(family, 5)).logits, expected, atol=1e-5, rtol=1e-5)


def test_merge_refuses_a_users_hook_on_a_split_projection_before_folding():
    from oelm import OELMError

    model, _ = _outputs("gpt2", "oelm_temperature")
    handle = model.transformer.h[0].attn.c_attn.value.register_forward_hook(lambda m, i, o: None)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(OELMError, match=r"c_attn\.value .*forward_hooks"):
        merge_and_unload(model)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())  # tau not folded
    handle.remove()
    merge_and_unload(model)


# ---------------------------------------------------------------- the experiment config


def _config(model: dict, **extra):
    from oelm.config import config_from_dict

    return config_from_dict({"name": "t", "task": {"dataset": "tinystories", "block_size": 16}, "model": model,
                             "methods": [{"name": "oelm_temperature"}, {"name": "set", "base": "oelm_polar",
                                                                          "head_temperature": "norm_ratio"}], **extra})


def test_the_config_starts_at_one_from_scratch_and_at_the_norm_ratio_when_pretrained():
    scratch = _config({"gpt": "gpt-tiny"})
    assert scratch.methods[0].head_temperature == 1.0 and scratch.methods[0].oelm_config().head_temperature == 1.0
    assert scratch.methods[1].oelm_config().head_temperature == "norm_ratio"  # set in the entry: kept
    assert scratch.methods[1].oelm_config().init == "polar"
    from oelm.matrix.output import config_fingerprint

    assert config_fingerprint(scratch)["methods"]["oelm_temperature"]["oelm"]["head_temperature"] == 1.0
    pretrained = _config({"pretrained": "sentence-transformers/all-MiniLM-L6-v2"})
    assert pretrained.methods[0].oelm_config().head_temperature == "norm_ratio"
    with pytest.raises(ConfigError, match="head_temperature"):
        _config({"gpt": "gpt-tiny"}, methods=[{"name": "oelm_temperature", "head_temperature": -2}])


def test_init_from_continues_the_pretraining_runs_temperatures(tmp_path):
    from safetensors.torch import save_model

    from oelm.matrix.assemble import build_run_model

    model = {"gpt": "gpt-tiny", "gpt_overrides": {"vocab_size": 100, "num_layers": 2}}
    pretraining = _config(model)
    trained, cfg, _, _ = build_run_model(pretraining, pretraining.methods[0], 0, None)
    assert cfg.head_temperature == 1.0
    with torch.no_grad():
        for i, tau in enumerate(_temperatures(trained)):
            tau.copy_(torch.linspace(0.5, 2.0, tau.numel()) + i)
    save_model(trained, str(tmp_path / "model.safetensors"))
    finetune = _config(model, init_from=str(tmp_path / "model.safetensors"))
    tuned, cfg, _, info = build_run_model(finetune, finetune.methods[0], 0, None)
    assert cfg.init == "none" and cfg.head_temperature == 1.0
    assert all(torch.equal(a, b) for a, b in zip(_temperatures(tuned), _temperatures(trained)))
    assert info["loaded"] == len(trained.state_dict())


# ---------------------------------------------------------------- the temperatures' own learning rate


def test_head_temperature_lr_scale_moves_the_temperatures_at_scale_times_the_rate_through_the_schedule():
    """Adam's first step moves every parameter by about its group's rate (|m / sqrt(v)| = 1): with
    head_temperature_lr_scale=100 the temperatures move ~100x the other weights' step, and the schedule
    keeps the two rates in that ratio; at 1 they share the no-decay group (the optimizer of earlier runs)."""
    from oelm.training.engine import make_scheduler

    model, _ = _outputs("bert", "oelm_temperature")
    lr, scale = 1e-3, 100.0
    shared = build_optimizer(model, lr, TrainingConfig())
    assert len(shared.param_groups) == 2 and sum(len(g["params"]) for g in shared.param_groups) == sum(
        p.requires_grad for p in model.parameters())
    config = TrainingConfig(head_temperature_lr_scale=scale, warmup_steps=2, max_steps=10)
    opt = build_optimizer(model, lr, config)
    taus = [p for n, p in model.named_parameters() if n.endswith(TEMPERATURE_NAME)]
    tau_group = [g for g in opt.param_groups if any(p is taus[0] for p in g["params"])]
    assert len(tau_group) == 1 and len(tau_group[0]["params"]) == len(taus) and tau_group[0]["weight_decay"] == 0.0
    schedule = make_scheduler(opt, config, total_steps=10)
    before = [t.detach().clone() for t in taus]
    classifier_before = model.classifier.weight.detach().clone()
    model.train()
    for step in range(4):
        model(**batch("bert", seed=step)).loss.backward()
        opt.step()
        opt.zero_grad()
        schedule.step()
        rates = {id(g): g["lr"] for g in opt.param_groups}
        assert rates[id(tau_group[0])] == pytest.approx(scale * opt.param_groups[0]["lr"], rel=1e-12), step
    moved = torch.cat([(t.detach() - b).abs() for t, b in zip(taus, before)])
    other = (model.classifier.weight.detach() - classifier_before).abs().max()
    # 4 steps of warmup-then-decay: each move is at most the summed rates (5e-4 + 1e-3 + 8.75e-4 + 7.5e-4) x scale
    assert moved.max() <= 3.2e-3 * scale * 1.01 and moved.median() > 0.1 * scale * other


def test_head_temperature_lr_scale_on_a_method_without_temperatures_is_one_line_before_any_data():
    from oelm.config import config_from_dict

    base = {"name": "t", "task": {"dataset": "tinystories", "block_size": 16}, "model": {"gpt": "gpt-tiny"}}
    ok = config_from_dict({**base, "methods": [
        {"name": "baseline"},
        {"name": "tau100", "base": "oelm_temperature", "training": {"head_temperature_lr_scale": 100}}]})
    assert ok.training_for(ok.methods[1]).head_temperature_lr_scale == 100.0
    assert ok.training_for(ok.methods[0]).head_temperature_lr_scale == 1.0
    with pytest.raises(ConfigError, match=r"methods\[oelm_freeze\]\.training\.head_temperature_lr_scale=10, but method "
                                          r"'oelm_freeze' learns no head temperature") as err:
        config_from_dict({**base, "methods": [
            {"name": "oelm_freeze", "training": {"head_temperature_lr_scale": 10}}]})
    named = [line for line in str(err.value).splitlines() if "head_temperature_lr_scale" in line]
    assert len(named) == 1 and named[0].endswith("drop it there, or base the method on oelm_temperature")  # field, method, fix
    with pytest.raises(ConfigError, match=r"  - training\.head_temperature_lr_scale=10, but method 'baseline' .*; set it "
                                          r"under the training: of the methods that learn one \(methods\[NAME\]\.training\)"):
        config_from_dict({**base, "training": {"head_temperature_lr_scale": 10},
                          "methods": [{"name": "baseline"}, {"name": "oelm_temperature"}]})
    with pytest.raises(ConfigError, match="head_temperature_lr_scale"):
        config_from_dict({**base, "methods": [{"name": "oelm_temperature", "training": {"head_temperature_lr_scale": 0}}]})
    # the optimizer refuses too, for a model built outside a config
    model, _ = _outputs("bert", "oelm_freeze")
    with pytest.raises(ConfigError, match="no trainable head_temperature"):
        build_optimizer(model, 1e-3, TrainingConfig(head_temperature_lr_scale=10))
