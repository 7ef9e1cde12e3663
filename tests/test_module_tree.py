"""``apply_oelm`` sees the whole module tree (issue 37 item 6).

PyTorch modules do not know their parents, so the marks go down the tree (:mod:`oelm.method.marks`):
the module ``apply_oelm`` ran on carries ``oelm_config``, each of its submodules ``oelm_part_of``.
Checked here, on tiny BERT and GPT-2 models built from their configs (nothing downloaded):

* a task model whose base model went through ``apply_oelm`` (``apply_oelm(model.bert)``) saves
  with its own ``save_pretrained`` (transformers', through ``Trainer`` on real SST-2 / TinyStories
  text): the recipe is in its ``config.json``, ``Trainer``'s resume and ``oelm.load_oelm`` give
  the trained model back bit for bit; the checkpoint is the stock layout (a stock
  ``from_pretrained`` loads every tensor; GPT-2's split ``c_attn`` is fused by the backbone's
  state-dict hook, issue 46);
* one application per tree: the holder after its backbone, the backbone after the holder, a layer
  of a treated model, and a deep copy of one are refused with one line, nothing changed;
* ``merge_and_unload`` of a DistributedDataParallel (a real one-process gloo group on loopback)
  or ``torch.compile`` wrapper is refused with the unwrap hint, nothing changed;
* forward hooks: on a fused module they move to its split stand-in and back; on a split query
  projection ``merge_and_unload`` refuses, naming it; on BERT's query they keep firing.
"""

from __future__ import annotations

import copy
import gzip
import json
import pickle
import socket

import pytest
import torch
import torch.distributed as dist
import transformers as T
from safetensors import safe_open
from torch import nn

import oelm
from oelm import ConfigError, OELMError, apply_oelm, merge_and_unload
from oelm.architectures import SplitQKV
from oelm.data import load_classification
from oelm.method.checkpoint_record import RECIPE_KEY
from oelm.method.marks import PART_OF_ATTRIBUTE

N, LENGTH = 24, 32


def tiny_bert(vocab: int = 100) -> nn.Module:
    torch.manual_seed(0)
    return T.BertForSequenceClassification(T.BertConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, num_labels=2))


def tiny_gpt2(vocab: int = 100) -> nn.Module:
    torch.manual_seed(0)
    return T.GPT2LMHeadModel(T.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                          bos_token_id=0, eos_token_id=0))


HOLDERS = {"bert": (tiny_bert, "bert"), "gpt2": (tiny_gpt2, "transformer")}


def holder_with_treated_backbone(kind: str, vocab: int = 100, seed: int = 0) -> nn.Module:
    make, backbone = HOLDERS[kind]
    model = make(vocab)
    apply_oelm(getattr(model, backbone), "oelm_freeze", seed=seed)
    return model


@pytest.fixture(scope="module")
def examples(data_dir):
    """``N`` real training examples per kind: SST-2 sentences with their labels (BERT uncased
    WordPiece), TinyStories blocks of ``LENGTH`` GPT-2 tokens; and each kind's vocabulary size."""
    bert_tok = T.BertTokenizerFast.from_pretrained(str(data_dir / "tokenizers" / "bert-base-uncased"))
    sst2 = load_classification("sst2", "validation", data_dir).head(N)
    enc = bert_tok(list(sst2["text"]), padding="max_length", truncation=True, max_length=LENGTH, return_tensors="pt")
    bert = [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i],
             "labels": torch.tensor(int(sst2["label"][i]))} for i in range(N)]
    gpt_tok = T.GPT2TokenizerFast.from_pretrained(str(data_dir / "tokenizers" / "gpt2"))
    with gzip.open(data_dir / "tinystories" / "validation_head_sample.txt.gz", "rt", encoding="utf-8") as fh:
        ids = gpt_tok(fh.read(20_000))["input_ids"]
    gpt2 = [{"input_ids": torch.tensor(ids[i:i + LENGTH]), "labels": torch.tensor(ids[i:i + LENGTH])}
            for i in range(0, LENGTH * N, LENGTH)]
    return {"bert": (bert, len(bert_tok)), "gpt2": (gpt2, len(gpt_tok))}


def train(model, rows, out, resume=None):
    args = T.TrainingArguments(
        output_dir=str(out), max_steps=6, per_device_train_batch_size=4, learning_rate=1e-3, weight_decay=0.1,
        save_strategy="steps", save_steps=3, report_to="none", use_cpu=True, disable_tqdm=True, seed=0,
    )
    T.Trainer(model=model, args=args, train_dataset=rows).train(resume_from_checkpoint=None if resume is None else str(resume))


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def assert_bit_identical(state: dict[str, torch.Tensor], model: nn.Module) -> None:
    now = model.state_dict()
    assert set(now) == set(state)
    assert not [n for n in state if not torch.equal(now[n], state[n])]


def attributes(model: nn.Module) -> dict[str, set[str]]:
    return {name: set(vars(m)) for name, m in model.named_modules()}


# ---------------------------------------------------------------- a holder's own save_pretrained


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_a_holder_of_a_treated_backbone_saves_the_recipe_and_reloads_bit_exactly(kind, examples, tmp_path):
    rows, vocab = examples[kind]
    model = holder_with_treated_backbone(kind, vocab)
    backbone = getattr(model, HOLDERS[kind][1])
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen and not hasattr(model, "oelm_config")  # the holder itself carries nothing of oelm
    train(model, rows, tmp_path / "full")
    full = snapshot(model)

    last = tmp_path / "full" / "checkpoint-6"
    recipe = json.loads((last / "config.json").read_text())[RECIPE_KEY]  # written by transformers' own method
    assert recipe["applied_to"] == type(backbone).__name__ and recipe["oelm_config"]["seed"] == 0
    prefix = HOLDERS[kind][1] + "."
    assert {prefix + n for n in recipe["frozen"]} == frozen
    with safe_open(str(last / "model.safetensors"), "pt") as fh:
        names = set(fh.keys())
    # the stock layout (GPT-2's c_attn fused by the backbone's state-dict hook): a stock from_pretrained loads every tensor
    assert "transformer.h.0.attn.c_attn.query.weight" not in names
    stock, info = type(model).from_pretrained(last, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert_bit_identical(full, stock)

    resumed = holder_with_treated_backbone(kind, vocab)  # Trainer's resume: load_state_dict on the live model
    train(resumed, rows, tmp_path / "resumed", resume=tmp_path / "full" / "checkpoint-3")
    assert_bit_identical(full, resumed)
    make = HOLDERS[kind][0]
    for loaded in (oelm.load_oelm(last), oelm.load_oelm(last, base_model=make(vocab))):
        assert type(loaded) is type(model) and getattr(loaded, HOLDERS[kind][1]).oelm_config == backbone.oelm_config
        assert_bit_identical(full, loaded)
        assert {n for n, p in loaded.named_parameters() if not p.requires_grad} == frozen
        assert len([m for m in loaded.modules() if isinstance(m, SplitQKV)]) == (2 if kind == "gpt2" else 0)

    # oelm's own lean save names the module that went through apply_oelm
    with pytest.raises(ConfigError, match=rf"its '{HOLDERS[kind][1]}' did: save that module") as info:
        oelm.save_pretrained(model, tmp_path / "lean")
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------- one application per module tree


CASES = {
    "holder after backbone": (lambda m: apply_oelm(m.bert, "oelm_random", seed=1), lambda m: m,
                              r"BertForSequenceClassification\.bert \(BertModel\) already went through apply_oelm \('oelm_random'\)"),
    "backbone after holder": (lambda m: apply_oelm(m, "oelm_random", seed=1), lambda m: m.bert,
                              r"BertModel is part of a model that went through apply_oelm \('oelm_random'\), as its 'bert'"),
    "a layer of a treated model": (lambda m: apply_oelm(m.bert, "oelm_random", seed=1), lambda m: m.bert.encoder.layer[1],
                                   r"BertLayer is part of a model that went through apply_oelm \('oelm_random'\), as its 'encoder.layer.1'"),
    "a layer of a deep copy": (lambda m: apply_oelm(m, "oelm_random", seed=1),
                               lambda m: copy.deepcopy(m).bert.encoder.layer[0],
                               r"BertLayer is part of .*apply_oelm \('oelm_random'\), as its 'bert.encoder.layer.0'"),
    "a layer of a pickled copy": (lambda m: apply_oelm(m.bert, "oelm_random", seed=1),
                                  lambda m: pickle.loads(pickle.dumps(m)).bert.encoder.layer[0].attention,
                                  r"BertAttention is part of .*apply_oelm \('oelm_random'\), as its 'encoder.layer.0.attention'"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_second_apply_oelm_anywhere_in_a_treated_tree_is_refused_before_anything_changes(case):
    first, second_target, message = CASES[case]
    model = tiny_bert()
    first(model)
    target = second_target(model)
    state, flags, attrs = snapshot(target), {n: p.requires_grad for n, p in target.named_parameters()}, attributes(target)
    with pytest.raises(OELMError, match=message) as info:
        apply_oelm(target, "oelm_freeze", seed=0)
    text = str(info.value)
    assert "\n" not in text and "Fix: start from a fresh model" in text and "merge" in text
    assert_bit_identical(state, target)
    assert {n: p.requires_grad for n, p in target.named_parameters()} == flags and attributes(target) == attrs


def test_merge_of_a_holder_unloads_its_treated_backbone_and_a_part_is_refused(tmp_path):
    model = holder_with_treated_backbone("gpt2")
    with pytest.raises(OELMError, match=r"GPT2Block is part of .*as its 'h.1': oelm.merge_and_unload on a part") as info:
        merge_and_unload(model.transformer.h[1])
    assert "\n" not in str(info.value) and isinstance(model.transformer.h[1].attn.c_attn, SplitQKV)
    merge_and_unload(model)
    assert not [m for m in model.modules() if isinstance(m, SplitQKV) or PART_OF_ATTRIBUTE in vars(m)]
    assert not hasattr(model.transformer, "oelm_config") and not hasattr(model.config, RECIPE_KEY)
    assert all(p.requires_grad for p in model.parameters())
    model.save_pretrained(tmp_path / "merged")  # a plain model again: the stock layout, no recipe
    stock, info = T.GPT2LMHeadModel.from_pretrained(tmp_path / "merged", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not hasattr(stock.config, RECIPE_KEY)
    apply_oelm(model, "oelm_freeze", seed=0)  # and a method may be applied again, to the holder this time
    assert model.oelm_config.method == "oelm_freeze"


# ---------------------------------------------------------------- merge_and_unload of a wrapper


@pytest.fixture
def gloo_group():
    """A real one-process gloo group on loopback (what torchrun sets up, with world size 1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("wrap", ["ddp", "compile"])
def test_merge_and_unload_refuses_a_wrapped_model_with_the_unwrap_hint(wrap, request):
    model = tiny_gpt2()
    apply_oelm(model, "oelm_freeze", seed=0)
    if wrap == "ddp":
        request.getfixturevalue("gloo_group")
        wrapped, inner = nn.parallel.DistributedDataParallel(model), "model.module"
    else:
        wrapped, inner = torch.compile(model), "model._orig_mod"
    state, splits = snapshot(model), [m for m in model.modules() if isinstance(m, SplitQKV)]
    with pytest.raises(OELMError, match="unwrap it first: model.module / model._orig_mod") as info:
        merge_and_unload(wrapped)
    assert "\n" not in str(info.value) and f"(here {inner})" in str(info.value)
    assert [m for m in model.modules() if isinstance(m, SplitQKV)] == splits and len(splits) == 2
    assert model.oelm_config.method == "oelm_freeze"
    assert_bit_identical(state, model)
    merge_and_unload(getattr(wrapped, "module", None) or wrapped._orig_mod)  # unwrapped, it merges
    assert not [m for m in model.modules() if isinstance(m, SplitQKV)]


# ---------------------------------------------------------------- forward hooks


def test_a_hook_on_a_fused_module_moves_to_its_split_stand_in_and_back():
    model = tiny_gpt2().eval()
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    seen: list[tuple[str, torch.Tensor]] = []
    c_attn = model.transformer.h[0].attn.c_attn
    handle = c_attn.register_forward_hook(lambda m, args, out: seen.append((type(m).__name__, out.detach().clone())))
    with torch.no_grad():
        model(ids)
    apply_oelm(model, "baseline")  # splits c_attn, changes no value
    assert isinstance(model.transformer.h[0].attn.c_attn, SplitQKV)
    with torch.no_grad():
        model(ids)
    merge_and_unload(model)
    with torch.no_grad():
        model(ids)
    assert [name for name, _ in seen] == ["Conv1D", "SplitQKV", "Conv1D"]
    assert torch.allclose(seen[1][1], seen[0][1], atol=1e-6) and torch.allclose(seen[2][1], seen[0][1], atol=1e-6)
    handle.remove()  # the user's handle still removes it
    with torch.no_grad():
        model(ids)
    assert len(seen) == 3


def test_a_hook_on_a_split_query_is_refused_by_merge_and_a_bert_query_hook_keeps_firing():
    model = tiny_gpt2()
    apply_oelm(model, "oelm_freeze", seed=0)
    query = model.transformer.h[1].attn.c_attn.query  # exists only while c_attn is split
    handle = query.register_forward_hook(lambda *a: None)
    state = snapshot(model)
    with pytest.raises(OELMError, match=r"transformer\.h\.1\.attn\.c_attn\.query \(Linear\) has forward_hooks") as info:
        merge_and_unload(model)
    assert "\n" not in str(info.value) and "handle.remove()" in str(info.value) and "nothing was changed" in str(info.value)
    assert model.transformer.h[1].attn.c_attn.query is query and model.oelm_config.method == "oelm_freeze"
    assert_bit_identical(state, model)
    handle.remove()
    merge_and_unload(model)

    bert = tiny_bert()
    apply_oelm(bert, "oelm_freeze", seed=0)
    fired = []
    bert.bert.encoder.layer[0].attention.self.query.register_forward_hook(lambda *a: fired.append(1))
    merge_and_unload(bert)  # BERT's query stays the same module: its hook stays with it
    with torch.no_grad():
        bert(torch.tensor([[1, 2, 3]]))
    assert fired == [1]


def test_a_state_dict_hook_on_a_fused_module_is_refused_by_apply_before_anything_changes():
    model = tiny_gpt2()
    model.transformer.h[1].attn.c_attn.register_state_dict_post_hook(lambda *a: None)
    state = snapshot(model)
    with pytest.raises(OELMError, match=r"transformer\.h\.1\.attn\.c_attn \(Conv1D\) has state_dict_hooks") as info:
        apply_oelm(model, "oelm_freeze", seed=0)
    assert "\n" not in str(info.value)
    assert not [m for m in model.modules() if isinstance(m, SplitQKV)] and not hasattr(model, "oelm_config")
    assert_bit_identical(state, model)
