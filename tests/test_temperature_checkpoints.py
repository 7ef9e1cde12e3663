"""Checkpoints of ``oelm_temperature`` models keep the learned per-head temperatures (:mod:`oelm.method.temperature`).

Lean (``oelm.save_pretrained`` / ``load_oelm``) on the real all-MiniLM-L6-v2 rebuilt from its recorded
source; Hugging Face layout (``model.save_pretrained``, ``Trainer`` checkpoints on real TinyStories text,
``resume_from_checkpoint``) on GPT-2's split ``c_attn`` and on BERT, and a GPT-2 whose backbone went
through ``apply_oelm``: ``oelm.load_oelm`` gives the trained model back bit for bit with and without a
base model; PEFT's adapter saves the temperatures, ``PeftModel.from_pretrained`` restores them and
``merge_and_unload`` folds them. (The lean round trip of tiny BERT, GPT-2, GPT-NeoX and oelm's GPT is in
tests/test_architectures.py.)
"""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest
import torch
import transformers as T
from safetensors import safe_open

import oelm
from oelm import apply_oelm
from oelm.checkpoint import WEIGHTS_NAME
from oelm.method.checkpoint_record import RECIPE_KEY
from oelm.method.temperature import TEMPERATURE_NAME
from test_hf_checkpoints import Blocks

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
BLOCK = 32


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_same(state, model) -> None:
    now = model.state_dict()
    assert set(now) == set(state)
    differ = [k for k in state if not torch.equal(now[k], state[k])]
    assert not differ, differ


def _temperatures(model) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if n.endswith(TEMPERATURE_NAME)}


def _adamw(model, batches, lr=1e-2):
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.1)
    for b in batches:
        model(**b).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()


def test_lean_checkpoint_of_real_minilm_stores_and_restores_the_temperatures(data_dir, tmp_path):
    from oelm.models.pretrained import load_pretrained

    frame = pd.read_parquet(data_dir / "sst2" / "train.parquet").head(16)
    torch.manual_seed(0)
    model, tokenizer = load_pretrained(MINILM, "sequence_classification", num_labels=2)
    apply_oelm(model, "oelm_temperature", seed=0)
    start = {n: t.detach().clone() for n, t in _temperatures(model).items()}
    batches = [dict(tokenizer(frame["text"].tolist()[i:i + 8], padding=True, return_tensors="pt"),
                    labels=torch.tensor(frame["label"].tolist()[i:i + 8])) for i in (0, 8)]
    _adamw(model, batches, lr=1e-3)
    assert all(not torch.equal(t, start[n]) for n, t in _temperatures(model).items())  # they trained
    report = oelm.save_pretrained(model, tmp_path / "lean")
    with safe_open(str(tmp_path / "lean" / WEIGHTS_NAME), "pt") as fh:
        assert set(_temperatures(model)) <= set(fh.keys())
    assert report.frozen_tensors == 6 * 4 and not report.frozen_stored
    loaded = oelm.load_oelm(tmp_path / "lean")  # the base rebuilt from the recorded source: biases divided again
    assert loaded.oelm_config == model.oelm_config
    _assert_same(_state(model), loaded)


# ---------------------------------------------------------------- Hugging Face layout


@pytest.fixture(scope="module")
def corpus(data_dir):
    tokenizer = T.GPT2TokenizerFast.from_pretrained(str(data_dir / "tokenizers" / "gpt2"))
    with gzip.open(data_dir / "tinystories" / "validation_head_sample.txt.gz", "rt", encoding="utf-8") as fh:
        ids = tokenizer(fh.read(12_000))["input_ids"]
    return [torch.tensor(ids[i:i + BLOCK]) for i in range(0, BLOCK * 16, BLOCK)], len(tokenizer)


def _gpt2(vocab: int, method: str | None = "oelm_temperature"):
    torch.manual_seed(0)
    model = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=64))
    with torch.no_grad():  # non-zero biases, so the bias division shows
        for name, p in model.named_parameters():
            if name.endswith("c_attn.bias"):
                p.copy_(torch.linspace(-0.5, 0.5, p.numel()))
    if method:
        apply_oelm(model, method, seed=0)
    return model


def _trainer(model, blocks, out, resume=None):
    args = T.TrainingArguments(
        output_dir=str(out), max_steps=4, per_device_train_batch_size=4, learning_rate=1e-2, weight_decay=0.1,
        save_strategy="steps", save_steps=2, logging_steps=1, report_to="none", use_cpu=True, disable_tqdm=True, seed=0,
    )
    trainer = T.Trainer(model=model, args=args, train_dataset=Blocks(blocks))
    trainer.train(resume_from_checkpoint=None if resume is None else str(resume))
    return trainer


def test_trainer_checkpoints_keep_the_temperatures_resume_bit_identical_and_load_oelm_restores_them(corpus, tmp_path):
    blocks, vocab = corpus
    model = _gpt2(vocab)
    start = {n: t.detach().clone() for n, t in _temperatures(model).items()}
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    trainer = _trainer(model, blocks, tmp_path / "full")  # AdamW, weight decay 0.1
    assert all(not torch.equal(t, start[n]) for n, t in _temperatures(model).items())
    params = dict(model.named_parameters())
    assert len(frozen) == 2 * 4 and all(params[n].numpy().tobytes() == b.numpy().tobytes() for n, b in frozen.items())
    assert not {id(params[n]) for n in frozen} & {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    full = _state(model)
    resumed = _gpt2(vocab)
    _trainer(resumed, blocks, tmp_path / "resumed", resume=tmp_path / "full" / "checkpoint-2")
    _assert_same(full, resumed)

    last = tmp_path / "full" / "checkpoint-4"
    with safe_open(str(last / "model.safetensors"), "pt") as fh:
        names = set(fh.keys())
    assert "transformer.h.0.attn.c_attn.weight" in names  # the stock layout, the temperatures beside it
    assert {f"transformer.h.{i}.attn.c_attn.query.{TEMPERATURE_NAME}" for i in range(2)} <= names
    recipe = json.loads((last / "config.json").read_text())[RECIPE_KEY]
    assert recipe["oelm_config"]["head_temperature"] == "norm_ratio"
    for loaded in (oelm.load_oelm(last), oelm.load_oelm(last, base_model=_gpt2(vocab, None))):
        assert loaded.oelm_config == model.oelm_config
        _assert_same(full, loaded)
        assert {n for n, p in loaded.named_parameters() if p.requires_grad} == {
            n for n, p in model.named_parameters() if p.requires_grad}


def test_hf_layout_of_bert_and_of_a_treated_backbone(corpus, tmp_path):
    _, vocab = corpus
    torch.manual_seed(0)
    bert = T.BertForSequenceClassification(T.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                        num_attention_heads=4, intermediate_size=64, num_labels=2))
    with torch.no_grad():
        for name, p in bert.named_parameters():
            if name.endswith(("query.bias", "key.bias")):
                p.normal_(0, 0.3)
    fresh = T.BertForSequenceClassification(bert.config)
    fresh.load_state_dict(bert.state_dict())
    apply_oelm(bert, "oelm_temperature")
    g = torch.Generator().manual_seed(0)
    _adamw(bert, [{"input_ids": torch.randint(0, 100, (4, 12), generator=g), "labels": torch.tensor([0, 1, 1, 0])}] * 2)
    bert.save_pretrained(tmp_path / "bert")
    for loaded in (oelm.load_oelm(tmp_path / "bert"), oelm.load_oelm(tmp_path / "bert", base_model=fresh)):
        _assert_same(_state(bert), loaded)

    holder = _gpt2(vocab, None)
    apply_oelm(holder.transformer, "oelm_temperature")  # the backbone, held by the LM: split names in the file
    _adamw(holder, [{"input_ids": corpus[0][0][None], "labels": corpus[0][0][None]}] * 2)
    holder.save_pretrained(tmp_path / "held")
    loaded = oelm.load_oelm(tmp_path / "held")
    _assert_same(_state(holder), loaded)
    assert _temperatures(loaded) and all(n.startswith("transformer.") for n in _temperatures(loaded))


# ---------------------------------------------------------------- PEFT


def test_peft_adapter_saves_restores_and_merges_the_temperatures(tmp_path):
    peft = pytest.importorskip("peft")
    import oelm.integrations.peft  # noqa: F401  registers OELM with PEFT

    def make():
        torch.manual_seed(0)
        model = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("c_attn.bias"):
                    p.copy_(torch.linspace(-0.5, 0.5, p.numel()))
        return model

    model = peft.get_peft_model(make(), oelm.integrations.peft.OELMPeftConfig(method="oelm_temperature", seed=0, task_type="CAUSAL_LM"))
    ids = torch.randint(0, 100, (2, 10), generator=torch.Generator().manual_seed(0))
    _adamw(model, [{"input_ids": ids, "labels": ids}] * 3)
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "adapter_model.safetensors"), "pt") as fh:
        saved = {k for k in fh.keys() if k.endswith(TEMPERATURE_NAME)}
    assert len(saved) == 2
    loaded = peft.PeftModel.from_pretrained(make(), tmp_path, is_trainable=True)
    assert all(torch.equal(a, b) for a, b in zip(_temperatures(loaded).values(), _temperatures(model).values()))
    with torch.no_grad():
        assert torch.equal(loaded.eval()(input_ids=ids).logits, expected)
    plain = loaded.merge_and_unload()
    assert not _temperatures(plain) and type(plain) is T.GPT2LMHeadModel
    with torch.no_grad():
        assert torch.allclose(plain.eval()(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-5)
