"""Any architecture by name (issue 35): ``apply_oelm(model, method, target_modules=...)`` for models
no registry entry knows, and per-kind head counts (BART's encoder and decoder).

Tiny random-weight models built from their configs (nothing downloaded): GPT-J (not in the
registry: ``h.N.attn.q_proj/k_proj``, heads in ``config.n_head``), GPT-2 with its registry entry
removed (fused ``c_attn`` named by layout), and a plain ``nn.Module`` decoder without any config
(grouped-query attention read from the projections' shapes). Checked as for registered families:
orthogonal frozen Q/K, bytes unchanged by AdamW with weight decay, lean and Hugging Face-layout
checkpoints that ``load_oelm`` restores bit for bit (it finds the projections from the recorded
names), and clear refusals that leave the model unchanged.
"""

from __future__ import annotations

import pytest
import torch
import transformers as T
from torch import nn

import oelm
from oelm import ARCHITECTURES, ConfigError, UnsupportedModelError, apply_oelm, max_orthogonality_error
from oelm.architectures import ARCHITECTURE_ATTRIBUTE, SplitQKV, find_attention_projections
from oelm.config import TrainingConfig
from oelm.train import build_optimizer

VOCAB, LAYERS, HEADS = 100, 2, 4
TARGETS = {"query": "q_proj", "key": "k_proj"}


def gptj():
    torch.manual_seed(0)
    return T.GPTJForCausalLM(T.GPTJConfig(vocab_size=VOCAB, n_embd=32, n_layer=LAYERS, n_head=HEADS, rotary_dim=4, n_positions=64))


def ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(seed))


def train_steps(model, loss_of, steps: int = 3) -> None:
    opt = build_optimizer(model, 1e-2, TrainingConfig(weight_decay=0.1))
    model.train()
    for step in range(steps):
        loss_of(model, ids(step)).backward()
        opt.step()
        opt.zero_grad()


def lm_loss(model, x):
    return model(input_ids=x, labels=x).loss


def state(model) -> dict[str, bytes]:
    return {k: v.detach().contiguous().numpy().tobytes() for k, v in model.state_dict().items()}


@pytest.fixture
def restore_registry():
    saved = dict(ARCHITECTURES)
    yield
    ARCHITECTURES.clear()
    ARCHITECTURES.update(saved)


def test_gptj_by_target_modules_freezes_orthogonal_qk_and_round_trips(tmp_path):
    assert "gptj" not in ARCHITECTURES
    with pytest.raises(UnsupportedModelError, match="target_modules="):  # the error names the way out
        apply_oelm(gptj(), "oelm_freeze")
    model = gptj()
    report = apply_oelm(model, "oelm_freeze", seed=0, target_modules=TARGETS)
    sites = find_attention_projections(model)
    assert len(sites) == LAYERS and {s.kind for s in sites} == {"transformer.h.N.attn"}
    assert all(s.num_heads == HEADS and s.head_dim == 8 for s in sites)  # heads from config.n_head
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    assert set(frozen) == {f"transformer.h.{i}.attn.{w}_proj.weight" for i in range(LAYERS) for w in "qk"}
    assert all(p["max_orthogonality_error"] < 1e-5 for p in report.projections) and len(report.projections) == 2 * LAYERS
    assert not hasattr(gptj(), ARCHITECTURE_ATTRIBUTE) and "gptj" not in ARCHITECTURES  # this instance only

    train_steps(model, lm_loss)
    params = dict(model.named_parameters())
    assert all(params[n].detach().numpy().tobytes() == b.numpy().tobytes() for n, b in frozen.items())
    model.eval()
    oelm.save_pretrained(model, tmp_path / "lean")
    assert state(oelm.load_oelm(tmp_path / "lean", base_model=gptj())) == state(model)  # names from the record
    model.save_pretrained(tmp_path / "hf")
    loaded = oelm.load_oelm(tmp_path / "hf")
    assert state(loaded) == state(model) and {n for n, p in loaded.named_parameters() if not p.requires_grad} == set(frozen)

    oelm.merge_and_unload(model)
    assert not hasattr(model, ARCHITECTURE_ATTRIBUTE)


def test_fused_layout_by_name_matches_the_registry_entry(restore_registry):
    def gpt2():
        torch.manual_seed(0)
        return T.GPT2LMHeadModel(T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=LAYERS, n_head=HEADS, n_positions=64))

    registered = gpt2()
    apply_oelm(registered, "oelm_freeze", seed=0)
    del ARCHITECTURES["gpt2"]
    named = gpt2()
    apply_oelm(named, "oelm_freeze", seed=0, target_modules={"qkv": "attn.c_attn", "layout": "qkv_conv1d"})
    assert sum(isinstance(m, SplitQKV) for m in named.modules()) == LAYERS
    assert state(named) == state(registered)
    assert {n for n, p in named.named_parameters() if not p.requires_grad} == \
        {n for n, p in registered.named_parameters() if not p.requires_grad}


class Decoder(nn.Module):
    """No config at all: 4 query heads, 2 key/value heads of size 8, numbered blocks."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, 32)
        self.blocks = nn.ModuleList(nn.ModuleDict({"wq": nn.Linear(32, 32), "wk": nn.Linear(32, 16), "wv": nn.Linear(32, 16)})
                                    for _ in range(LAYERS))
        self.out = nn.Linear(32, VOCAB)

    def forward(self, x):
        h = self.embed(x)
        B, L, _ = h.shape
        for b in self.blocks:
            q = b["wq"](h).view(B, L, 4, 8).transpose(1, 2)  # (B, 4, L, 8)
            k, v = (b[n](h).view(B, L, 2, 8).transpose(1, 2) for n in ("wk", "wv"))  # (B, 2, L, 8)
            h = h + nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2).reshape(B, L, 32)
        return self.out(h)


def test_a_model_without_config_needs_num_heads_and_gets_kv_heads_from_shapes():
    model = Decoder()
    before = state(model)
    with pytest.raises(UnsupportedModelError, match=r"num_heads=N"):
        apply_oelm(model, "oelm_freeze", target_modules={"query": "wq", "key": "wk"})
    assert state(model) == before and not hasattr(model, ARCHITECTURE_ATTRIBUTE)
    apply_oelm(model, "oelm_freeze", target_modules={"query": r"blocks\.\d+\.wq", "key": ["wk"]}, num_heads=4)  # regex and suffix
    for s in find_attention_projections(model):
        assert (s.num_heads, s.num_kv_heads, s.head_dim) == (4, 2, 8)
        assert max_orthogonality_error(s.query.weight, 4) < 1e-5 and max_orthogonality_error(s.key.weight, 2) < 1e-5
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    train_steps(model, lambda m, x: nn.functional.cross_entropy(m(x).flatten(0, 1), x.flatten()))
    assert all(dict(model.named_parameters())[n].detach().numpy().tobytes() == b.numpy().tobytes() for n, b in frozen.items())


@pytest.mark.parametrize(
    "targets, error, match",
    [
        ("q_proj", ConfigError, "must be a mapping"),
        ({"query": "q_proj"}, ConfigError, "give 'query' and 'key'"),
        ({"query": "q_proj", "key": "k_proj["}, ConfigError, "not a valid regex"),
        ({"qkv": "c_attn", "layout": "kqv"}, ConfigError, "not one of"),
        ({"query": "nothing_here", "key": "k_proj"}, UnsupportedModelError, "no query sibling|no key sibling"),
        ({"query": "wq", "key": "wk"}, UnsupportedModelError, "no module of GPTJForCausalLM matched"),
    ],
)
def test_bad_target_modules_are_refused_before_anything_changes(targets, error, match):
    model = gptj()
    before = state(model)
    with pytest.raises(error, match=match):
        apply_oelm(model, "oelm_freeze", target_modules=targets)
    assert state(model) == before and not hasattr(model, "oelm_config") and not hasattr(model, ARCHITECTURE_ATTRIBUTE)


def test_bart_encoder_and_decoder_keep_their_own_head_counts():
    torch.manual_seed(0)
    model = T.BartForConditionalGeneration(T.BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_attention_heads=4,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64))
    apply_oelm(model, "oelm_freeze", seed=0)
    heads = {(s.kind, s.num_heads, s.head_dim) for s in find_attention_projections(model)}
    assert heads == {("encoder.self", 4, 8), ("decoder.self", 2, 16), ("decoder.cross", 2, 16)}
    for s in find_attention_projections(model):
        assert max_orthogonality_error(s.query.weight, s.num_heads) < 1e-5
        assert max_orthogonality_error(s.key.weight, s.num_kv_heads) < 1e-5
    x = ids()
    assert torch.isfinite(model(input_ids=x, labels=x).loss)


def test_every_registered_spec_reads_back_from_its_dict_form():
    """Checkpoints record a spec as data (architecture_to_dict); reading it back must give the same spec."""
    from oelm.architectures import architecture_from_dict, architecture_to_dict

    fields = ("attention", "num_heads", "num_kv_heads", "head_dim", "group_patterns", "model_class")
    for model_type, spec in ARCHITECTURES.items():
        again = architecture_from_dict(architecture_to_dict(spec), source=model_type)
        assert [getattr(again, f) for f in fields] == [getattr(spec, f) for f in fields], model_type
    bart = architecture_to_dict(ARCHITECTURES["bart"])
    assert [a.get("num_heads") for a in bart["attention"]] == ["encoder_attention_heads", "decoder_attention_heads",
                                                                 "decoder_attention_heads"]
