"""A holder's ``save_pretrained`` is stock-loadable when a module it holds went through ``apply_oelm``
(issue 46 item 4).

``apply_oelm(model.transformer)`` then ``model.save_pretrained(dir)`` runs transformers' method on the
holder, which runs no oelm code (PyTorch modules do not know their parents). Before the fix the
holder's file had GPT-2's split ``c_attn.query/key/value`` names, and a stock ``from_pretrained``
initialized ``c_attn`` at random (data loss). The treated module's ``state_dict`` post-hook
(:func:`oelm.method.checkpoint_record.stock_layout_when_held`) now writes the stock fused layout
whenever a holder gathers the state dict. Checked on tiny GPT-2 (fused ``c_attn``) and BERT
(separate Q/K) trained a few AdamW steps on real TinyStories / SST-2 tokens: a stock
``from_pretrained`` of the holder's folder loads every tensor (no missing, no unexpected key) and
reproduces the trained holder's logits; the holder's ``load_state_dict`` (Trainer's resume) and
``oelm.load_oelm`` still give the trained model back bit for bit.
"""

from __future__ import annotations

import gzip

import pytest
import torch
import transformers as T

import oelm
from oelm import apply_oelm
from oelm.data import load_classification

LENGTH = 16


@pytest.fixture(scope="module")
def tokens(data_dir) -> dict[str, torch.Tensor]:
    """``[4, LENGTH]`` real token ids per kind: TinyStories (GPT-2 BPE), SST-2 sentences (BERT WordPiece)."""
    gpt_tok = T.GPT2TokenizerFast.from_pretrained(str(data_dir / "tokenizers" / "gpt2"))
    with gzip.open(data_dir / "tinystories" / "validation_head_sample.txt.gz", "rt", encoding="utf-8") as fh:
        ids = gpt_tok(fh.read(4000))["input_ids"][:4 * LENGTH]
    bert_tok = T.BertTokenizerFast.from_pretrained(str(data_dir / "tokenizers" / "bert-base-uncased"))
    text = list(load_classification("sst2", "validation", data_dir).head(4)["text"])
    enc = bert_tok(text, padding="max_length", truncation=True, max_length=LENGTH, return_tensors="pt")
    return {"gpt2": torch.tensor(ids).view(4, LENGTH), "bert": enc["input_ids"]}


def _holder(kind: str) -> tuple[torch.nn.Module, str]:
    torch.manual_seed(0)
    if kind == "gpt2":
        return T.GPT2LMHeadModel(T.GPT2Config(vocab_size=50257, n_embd=32, n_layer=2, n_head=4, n_positions=64)), "transformer"
    return T.BertForSequenceClassification(T.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, num_labels=2)), "bert"


def _train(model: torch.nn.Module, ids: torch.Tensor, kind: str) -> None:
    """Three AdamW steps, so every trained tensor (V, O, the head) moves away from its init."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    labels = ids if kind == "gpt2" else torch.tensor([0, 1, 1, 0])
    for _ in range(3):
        model(input_ids=ids, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()


def _read(directory) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(directory / "model.safetensors"))


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits


def _treated(model: torch.nn.Module, backbone: str, held: bool) -> torch.nn.Module:
    return getattr(model, backbone) if held else model


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
@pytest.mark.parametrize("method", ["oelm_freeze", "oelm_random", "oelm_temperature"])
@pytest.mark.parametrize("held", [True, False], ids=["holder", "own"])
def test_a_stock_from_pretrained_of_a_holders_save_reproduces_its_logits(kind, method, held, tokens, tmp_path):
    """``held``: apply_oelm ran on the backbone and the holder saves (the case of issue 46); else
    on the model itself, whose own (oelm's) save_pretrained runs."""
    ids = tokens[kind]
    model, backbone = _holder(kind)
    apply_oelm(_treated(model, backbone, held), method, seed=1)
    tau = [p for n, p in model.named_parameters() if n.endswith("head_temperature")]
    assert bool(tau) == (method == "oelm_temperature")
    _train(model, ids, kind)
    assert all((t - 1).abs().max() > 1e-3 for t in tau)  # a temperature the stock model must see
    expected = _logits(model, ids)
    model.save_pretrained(tmp_path)  # transformers' own method on the holder, or oelm's on the treated model

    stock, info = type(model).from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"], info
    # beside the stock layout only a temperature's own tensors: tau and the exact (unfolded) query
    assert all(k.rpartition(".")[2] in ("head_temperature", "unfolded_weight", "unfolded_bias")
               for k in info["unexpected_keys"]), info
    assert len(info["unexpected_keys"]) == (3 * 2 if tau else 0)  # 2 layers: tau, weight, bias each
    assert not hasattr(stock, "oelm_config") and not hasattr(getattr(stock, backbone), "oelm_config")
    torch.testing.assert_close(_logits(stock, ids), expected, atol=1e-5, rtol=1e-5)

    trained = {n: p.detach().clone() for n, p in model.named_parameters()}
    resumed, resumed_backbone = _holder(kind)  # Trainer's resume: the holder's load_state_dict on a live OELM model
    apply_oelm(_treated(resumed, resumed_backbone, held), method, seed=1)
    result = resumed.load_state_dict(model.state_dict() if held else _read(tmp_path), strict=False)
    assert not result.unexpected_keys and set(result.missing_keys) <= {"lm_head.weight"}  # tied to wte, not saved
    loaded = oelm.load_oelm(tmp_path)
    for other in (resumed, loaded):
        params = dict(other.named_parameters())
        assert set(params) == set(trained) and all(torch.equal(params[n], t) for n, t in trained.items())


def test_the_treated_modules_own_state_dict_keeps_its_split_names(tokens):
    model, _ = _holder("gpt2")
    apply_oelm(model.transformer, "oelm_freeze", seed=0)
    own, held = model.transformer.state_dict(), model.state_dict()
    assert "h.0.attn.c_attn.query.weight" in own and "h.0.attn.c_attn.weight" not in own
    assert "transformer.h.0.attn.c_attn.weight" in held and "transformer.h.0.attn.c_attn.query.weight" not in held
    live = model.state_dict(keep_vars=True)  # the live parameters, as asked
    assert isinstance(live["transformer.h.0.attn.c_attn.query.weight"], torch.nn.Parameter)
    oelm.merge_and_unload(model)
    assert not model.transformer._state_dict_hooks  # the way out removes the hook with the rest


@pytest.mark.parametrize("where", ["transformer.h"])
def test_a_deeper_module_named_by_target_modules_saves_stock_too(where, tokens, tmp_path):
    """Whatever object apply_oelm got: here the layer list (a ModuleList), its projections named with
    target_modules (a single block is refused by apply_oelm: not inside a numbered layer)."""
    ids = tokens["gpt2"]
    model, _ = _holder("gpt2")
    apply_oelm(model.get_submodule(where), "oelm_freeze", seed=0,
               target_modules={"qkv": "c_attn", "layout": "qkv_conv1d"}, num_heads=4)
    _train(model, ids, "gpt2")
    expected = _logits(model, ids)
    model.save_pretrained(tmp_path)
    stock, info = type(model).from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    torch.testing.assert_close(_logits(stock, ids), expected, atol=1e-6, rtol=1e-6)
