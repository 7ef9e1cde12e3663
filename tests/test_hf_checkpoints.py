"""Hugging Face checkpoints of OELM models whose fused Q/K/V ``apply_oelm`` split (issue 35).

A tiny GPT-2 (``c_attn``: Conv1D) and GPT-NeoX (``query_key_value``: per-head rows), built from
their configs (nothing downloaded), go through ``apply_oelm("oelm_freeze", seed=0)`` and train
with Hugging Face ``Trainer(save_strategy="steps")`` on real TinyStories text (GPT-2 BPE). Checked:
a checkpoint every N steps in the stock layout with the recipe in ``config.json``; a second run
resumed from the first checkpoint ends bit-identical to the uninterrupted run; a stock
``from_pretrained`` of a checkpoint loads every tensor and gives the trained model's logits;
``oelm.load_oelm`` rebuilds the OELM model from it (with and without a base model); a checkpoint
of another seed is refused before anything is loaded.
"""

from __future__ import annotations

import gzip
import json

import pytest
import torch
import transformers as T

import oelm
from oelm import CheckpointError, CheckpointMismatchError, apply_oelm
from oelm.architectures import SplitQKV
from oelm.method.checkpoint_record import RECIPE_KEY

BLOCK, BLOCKS = 32, 24
FAMILIES = {
    "gpt2": (T.GPT2Config, T.GPT2LMHeadModel, dict(n_embd=32, n_layer=2, n_head=4, n_positions=64)),
    "gpt_neox": (T.GPTNeoXConfig, T.GPTNeoXForCausalLM,
                 dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                      max_position_embeddings=64, attention_bias=True)),
}


@pytest.fixture(scope="module")
def corpus(data_dir):
    """``BLOCKS`` blocks of ``BLOCK`` GPT-2 tokens of real TinyStories text, and the vocabulary size."""
    tokenizer = T.GPT2TokenizerFast.from_pretrained(str(data_dir / "tokenizers" / "gpt2"))
    with gzip.open(data_dir / "tinystories" / "validation_head_sample.txt.gz", "rt", encoding="utf-8") as fh:
        ids = tokenizer(fh.read(20_000))["input_ids"]
    assert len(ids) >= BLOCK * BLOCKS
    return [torch.tensor(ids[i:i + BLOCK]) for i in range(0, BLOCK * BLOCKS, BLOCK)], len(tokenizer)


class Blocks(torch.utils.data.Dataset):
    def __init__(self, blocks):
        self.blocks = blocks

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


def base(family: str, vocab: int):
    config_cls, model_cls, kwargs = FAMILIES[family]
    torch.manual_seed(0)
    return model_cls(config_cls(vocab_size=vocab, **kwargs))


def oelm_model(family: str, vocab: int, method: str = "oelm_freeze", seed: int = 0):
    model = base(family, vocab)
    apply_oelm(model, method, seed=seed)
    return model


def train(model, blocks, out, resume=None, max_steps=6):
    args = T.TrainingArguments(
        output_dir=str(out), max_steps=max_steps, per_device_train_batch_size=4, learning_rate=1e-3, weight_decay=0.1,
        save_strategy="steps", save_steps=3, logging_steps=1, report_to="none", use_cpu=True, disable_tqdm=True, seed=0,
    )
    trainer = T.Trainer(model=model, args=args, train_dataset=Blocks(blocks))
    trainer.train(resume_from_checkpoint=None if resume is None else str(resume))
    return trainer


def snapshot(model):
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def assert_bit_identical(state, model):
    now = model.state_dict()
    assert set(now) == set(state)
    differ = [n for n in state if not torch.equal(now[n], state[n])]
    assert not differ, differ


@pytest.mark.parametrize("family", FAMILIES)
def test_trainer_checkpoints_resume_bit_identical_and_load_stock(family, corpus, tmp_path):
    blocks, vocab = corpus
    model = oelm_model(family, vocab)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    splits = [m for m in model.modules() if isinstance(m, SplitQKV)]
    trainer = train(model, blocks, tmp_path / "full")
    assert trainer.state.global_step == 6
    assert sorted(p.name for p in (tmp_path / "full").glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]
    # the live model kept its split modules and its frozen values; its config carries no recipe
    assert [m for m in model.modules() if isinstance(m, SplitQKV)] == splits and len(splits) == 2
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    assert not hasattr(model.config, RECIPE_KEY)
    full = snapshot(model)

    resumed = oelm_model(family, vocab)
    train(resumed, blocks, tmp_path / "resumed", resume=tmp_path / "full" / "checkpoint-3")
    assert_bit_identical(full, resumed)

    last = tmp_path / "full" / "checkpoint-6"
    recipe = json.loads((last / "config.json").read_text())[RECIPE_KEY]
    assert recipe["method"] == "oelm_freeze" and recipe["oelm_config"]["seed"] == 0
    assert set(recipe["frozen"]) == set(frozen) and len(recipe["split"]) == 2
    stock, info = T.AutoModelForCausalLM.from_pretrained(last, output_loading_info=True)
    assert type(stock) is type(model)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ids = blocks[0][None]
    model.eval()
    with torch.no_grad():
        assert torch.allclose(stock.eval()(ids).logits, model(ids).logits, atol=1e-5, rtol=0)

    for loaded in (oelm.load_oelm(last), oelm.load_oelm(last, base_model=base(family, vocab))):
        assert loaded.oelm_config == model.oelm_config
        assert_bit_identical(full, loaded)
        assert {n for n, p in loaded.named_parameters() if not p.requires_grad} == set(frozen)


@pytest.mark.parametrize("family", FAMILIES)
def test_resume_into_a_model_of_another_seed_is_refused_before_loading(family, corpus, tmp_path):
    blocks, vocab = corpus
    train(oelm_model(family, vocab), blocks, tmp_path / "run", max_steps=3)
    other = oelm_model(family, vocab, "oelm_random", seed=3)
    before = snapshot(other)
    with pytest.raises(CheckpointMismatchError, match=r"would change the frozen tensor .*'oelm_random' \(seed 3\)") as info:
        train(other, blocks, tmp_path / "other", resume=tmp_path / "run" / "checkpoint-3")
    assert "\n" not in str(info.value) and "query.weight" in info.value.tensor
    assert_bit_identical(before, other)  # refused before any tensor was loaded


def test_save_pretrained_keeps_the_live_model_and_writes_the_stock_layout(corpus, tmp_path):
    _, vocab = corpus
    model = oelm_model("gpt2", vocab)
    params = dict(model.named_parameters())
    state = snapshot(model)
    model.save_pretrained(tmp_path / "hf")
    assert dict(model.named_parameters()) == params  # the same parameter objects: an optimizer's stay valid
    assert_bit_identical(state, model)
    assert not hasattr(model.config, RECIPE_KEY)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as fh:
        names = set(fh.keys())
    assert "transformer.h.0.attn.c_attn.weight" in names and not any(".c_attn.query." in n for n in names)
    # a stock model with the recipe on its config saves a checkpoint without a stale one after merging
    stock = T.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert getattr(stock.config, RECIPE_KEY)["method"] == "oelm_freeze"
    oelm.merge_and_unload(stock)
    assert not hasattr(stock.config, RECIPE_KEY)


def test_load_oelm_refuses_a_weights_file_that_no_longer_fits_its_recipe(corpus, tmp_path):
    from safetensors.torch import load_file, save_file

    _, vocab = corpus
    oelm_model("gpt_neox", vocab).save_pretrained(tmp_path / "hf")
    weights = tmp_path / "hf" / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["gpt_neox.layers.1.attention.query_key_value.weight"][0, 0] += 1.0  # row 0: head 0's query
    save_file(tensors, str(weights), metadata={"format": "pt"})
    with pytest.raises(CheckpointMismatchError, match=r"layers\.1\.attention\.query_key_value\.query\.weight' loaded for"):
        oelm.load_oelm(tmp_path / "hf")

    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config[RECIPE_KEY]["format_version"] = 99
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="format_version 99.*upgrade oelm"):
        oelm.load_oelm(tmp_path / "hf")
