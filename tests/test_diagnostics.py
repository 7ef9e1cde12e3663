"""Attention diagnostics (oelm.method.diagnostics, issue 36 item 6): the quantities on constructed cases
with known answers, the hooks against the model's own attention (output_attentions) and a hand
recomputation, every registered family, real MiniLM on the SST-2 validation batch (oelm_freeze keeps
the pretrained row space, oelm_random does not), a real short matrix that records them per final
run, ``oelm diagnose`` for a run that finished without them, and the report's section."""

from __future__ import annotations

import copy
import json
import math
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from _tiny_matrix import write_config
from oelm.architectures import find_attention_projections
from oelm.cli import main
from oelm.records import RunRecord
from oelm.method import apply_oelm
from oelm.method.diagnostics import (
    attention_diagnostics,
    attention_entropy,
    diagnostic_batch,
    effective_rank,
    qk_effective_rank,
    qk_weights,
    subspace_overlap,
    uniform_entropy,
)
from oelm.models.gpt import GPTConfig, GPTForCausalLM
from test_architectures import FAMILIES, build, randomize_

ROOT = Path(__file__).resolve().parents[1]


def _orthonormal_rows(k: int, d: int, g: torch.Generator) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(d, k, generator=g, dtype=torch.float64))
    return q.T  # (k, d)


# ----------------------------------------------------------------------- the quantities by hand


def test_entropy_of_uniform_is_log_keys_and_of_one_hot_zero():
    uniform = torch.full((2, 3, 4, 5), 1 / 5)
    assert attention_entropy(uniform).tolist() == pytest.approx([math.log(5)] * 3, abs=1e-7)
    one_hot = torch.nn.functional.one_hot(torch.randint(0, 5, (2, 3, 4)), 5).float()
    assert attention_entropy(one_hot).tolist() == [0.0, 0.0, 0.0]
    # rows of pads are left out, NaN rows (a softmax over nothing) included
    mixed = uniform.clone()
    mixed[0, :, 3] = float("nan")
    mask = torch.ones(2, 4, dtype=torch.bool)
    mask[0, 3] = False
    assert attention_entropy(mixed, mask).tolist() == pytest.approx([math.log(5)] * 3)
    allowed = torch.ones(1, 4, 4, dtype=torch.bool).tril()
    assert uniform_entropy(allowed) == pytest.approx(sum(math.log(n) for n in (1, 2, 3, 4)) / 4)


def test_effective_rank_of_known_spectra():
    assert effective_rank(torch.tensor([2.0, 2.0, 2.0, 0.0])) == pytest.approx(3.0)
    assert effective_rank(torch.tensor([5.0, 0.0])) == pytest.approx(1.0)
    assert effective_rank(torch.zeros(4)) == 0.0
    p = np.array([3.0, 1.0]) / 4
    assert effective_rank(torch.tensor([3.0, 1.0])) == pytest.approx(math.exp(-(p * np.log(p)).sum()))
    g = torch.Generator().manual_seed(0)
    # a rank-3 matrix with equal singular values: effective rank 3
    u, v = _orthonormal_rows(3, 20, g).T, _orthonormal_rows(3, 30, g)
    assert effective_rank(torch.linalg.svdvals(u @ (2.5 * v))) == pytest.approx(3.0)


def test_qk_effective_rank_is_that_of_the_full_bilinear_form():
    g = torch.Generator().manual_seed(1)
    w_q, w_k = torch.randn(8, 48, generator=g, dtype=torch.float64), torch.randn(8, 48, generator=g, dtype=torch.float64)
    full = torch.linalg.svdvals(w_q.T @ w_k)  # (48, 48), rank 8
    assert qk_effective_rank(w_q, w_k) == pytest.approx(effective_rank(full), rel=1e-9)
    w_k[4:] = 0  # rank 4 key: the form has rank 4
    assert qk_effective_rank(w_q, w_k) <= 4.0 + 1e-9
    # orthonormal query and key rows: every singular value of W_q^T W_k is 1 -> head_dim exactly
    assert qk_effective_rank(_orthonormal_rows(8, 48, g), _orthonormal_rows(8, 48, g)) == pytest.approx(8.0)


def test_subspace_overlap_same_unrelated_and_random():
    g = torch.Generator().manual_seed(2)
    a = torch.randn(8, 64, generator=g, dtype=torch.float64)
    mix = torch.randn(8, 8, generator=g, dtype=torch.float64)  # invertible: the same row space
    assert subspace_overlap(a, mix @ a) == pytest.approx(1.0, abs=1e-12)
    basis = _orthonormal_rows(16, 64, g)
    assert subspace_overlap(basis[:8], basis[8:]) == pytest.approx(0.0, abs=1e-12)
    draws = [subspace_overlap(a, torch.randn(8, 64, generator=g, dtype=torch.float64)) for _ in range(400)]
    assert np.mean(draws) == pytest.approx(8 / 64, abs=0.01)  # E ||P_a P_b||_F^2 / k = k / d
    with pytest.raises(ValueError, match="R\\^64 and R\\^32"):
        subspace_overlap(a, a[:, :32])


def test_per_head_overlaps_from_batched_bases_equal_one_subspace_overlap_per_head():
    """The record's per-head overlaps (one batched SVD per weight, the reference's kept across calls)
    carry the same bits as subspace_overlap head by head, also for a rank-deficient head and after
    another reference of the same shape was used (the cache keys on the tensor, not its shape)."""
    from oelm.method.diagnostics import _head_overlaps

    g = torch.Generator().manual_seed(5)
    w = torch.randn(4 * 8, 64, generator=g, dtype=torch.float64)
    w[8:16] = torch.randn(3, 64, generator=g, dtype=torch.float64).repeat(3, 1)[:8]  # head 1: rank 3
    refs = [torch.randn(4 * 8, 64, generator=g, dtype=torch.float64) for _ in range(2)]
    for ref in (refs[0], refs[1], refs[0]):
        want = [subspace_overlap(w[h * 8:(h + 1) * 8], ref[h * 8:(h + 1) * 8]) for h in range(4)]
        assert _head_overlaps(w, ref, 4, 8) == want
    assert _head_overlaps(w, refs[0][:16], 4, 8) is None  # another shape: no overlap

# ---------------------------------------------------------------------- constructed modules


def _tiny_gpt(**overrides) -> GPTForCausalLM:
    torch.manual_seed(0)
    return GPTForCausalLM(GPTConfig(**{**dict(vocab_size=50, context_length=16, num_layers=2, num_heads=2, hidden_size=16,
                                              intermediate_size=32), **overrides}))


def test_zero_query_key_attends_uniformly_over_real_earlier_tokens():
    """Q = K = 0: every score is 0, so each query spreads evenly over the keys it may attend:
    entropy = ln(#keys) per row, exactly the uniform reference, with causal and padding masks."""
    ids = torch.randint(1, 50, (3, 8))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    mask[2, 2:] = 0
    gpt = _tiny_gpt()
    bert = build("bert")
    for model in (gpt, bert):
        for s in find_attention_projections(model):
            for lin in (s.query, s.key):
                torch.nn.init.zeros_(lin.weight)
                torch.nn.init.zeros_(lin.bias)
    d_gpt = attention_diagnostics(gpt, {"input_ids": ids, "attention_mask": mask})
    causal = sum(math.log(i + 1) for n in (8, 5, 2) for i in range(n)) / 15  # rows: the 15 real tokens
    assert d_gpt["per_layer"]["uniform_entropy"] == pytest.approx([causal] * 2, abs=1e-5)
    assert d_gpt["per_head"]["entropy"] == [pytest.approx([causal] * 2, abs=1e-5)] * 2
    assert d_gpt["per_layer"]["logit_scale"] == [0.0, 0.0] and d_gpt["entropy_source"] == "recomputed"
    d_bert = attention_diagnostics(bert, {"input_ids": ids, "attention_mask": mask})
    both_ways = (8 * math.log(8) + 5 * math.log(5) + 2 * math.log(2)) / 15
    assert d_bert["mean"]["entropy"] == pytest.approx(both_ways, abs=1e-5) and d_bert["entropy_source"] == "model"
    assert d_bert["mean"]["normalized_entropy"] == pytest.approx(1.0, abs=1e-5)


def test_one_hot_fixed_map_has_zero_entropy():
    gpt = _tiny_gpt()
    apply_oelm(gpt, "fixed_attention", seed=0)
    for block in gpt.transformer.h:
        with torch.no_grad():
            block.attn.fixed_logits.copy_(torch.eye(16).expand(2, 16, 16) * 1e4)  # each query: itself only
    d = attention_diagnostics(gpt, {"input_ids": torch.randint(1, 50, (2, 10))})
    assert d["entropy_source"] == "fixed map"
    assert d["mean"]["entropy"] == pytest.approx(0.0, abs=1e-9)
    assert d["mean"]["logit_scale"] == pytest.approx(1e4 / 5.5)  # mean |R| over the 55 causal pairs of 10 rows: 10 x 1e4
    assert d["per_head"]["qk_effective_rank"] == [None, None] and d["mean"]["qk_effective_rank"] is None


def test_model_probabilities_equal_output_attentions_and_hand_recomputation():
    """BERT: the hooked probabilities are those output_attentions returns; oelm GPT (SDPA): the
    recomputed ones equal softmax(q k^T / sqrt(hd) + causal mask) from its own q_proj/k_proj."""
    ids = torch.randint(1, 100, (3, 9))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    bert = build("bert")
    randomize_(bert, 0.3)
    d = attention_diagnostics(bert, {"input_ids": ids, "attention_mask": mask})
    assert bert.config._attn_implementation != "eager"  # restored
    bert.set_attn_implementation("eager")
    bert.eval()  # as the diagnostics pass runs it: no attention dropout
    with torch.no_grad():
        attentions = bert(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    for layer, probs in enumerate(attentions):
        assert d["per_head"]["entropy"][layer] == pytest.approx(attention_entropy(probs, mask.bool()).tolist(), abs=1e-5)

    gpt = _tiny_gpt(num_heads=4)
    randomize_(gpt, 0.3)
    inputs = {}
    handles = [b.attn.register_forward_hook(lambda m, a, o, i=i: inputs.__setitem__(i, a[0])) for i, b in enumerate(gpt.transformer.h)]
    ids = torch.randint(1, 50, (2, 7))
    d = attention_diagnostics(gpt, {"input_ids": ids})
    for h in handles:
        h.remove()
    for i, block in enumerate(gpt.transformer.h):
        x = inputs[i]
        q = block.attn.q_proj(x).view(2, 7, 4, 4).transpose(1, 2)
        k = block.attn.k_proj(x).view(2, 7, 4, 4).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / 2.0
        causal = torch.ones(7, 7, dtype=torch.bool).tril()
        probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)
        assert d["per_head"]["entropy"][i] == pytest.approx(attention_entropy(probs).tolist(), abs=1e-5)
        expected_scale = (scores.abs() * causal).sum((0, 2, 3)) / (2 * causal.sum())
        assert d["per_head"]["logit_scale"][i] == pytest.approx(expected_scale.tolist(), rel=1e-4)


# ------------------------------------------------------------------------------ every family


def _family_batch(family: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    if FAMILIES[family][3] == "img":  # ViT: 16x16 RGB images, 2x2 patches of 8 pixels + [CLS] = 5 tokens
        return {"pixel_values": torch.randn(3, 3, 16, 16, generator=g)}
    ids = torch.randint(1, 100, (3, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 7:] = 0
    b = {"input_ids": ids, "attention_mask": mask}
    if FAMILIES[family][3] == "s2s":
        b["decoder_input_ids"] = torch.randint(1, 100, (3, 6), generator=g)
    if family == "bert-decoder-cross":
        b["encoder_hidden_states"] = torch.randn(3, 5, 32, generator=g)
    return b


@pytest.mark.parametrize("family", FAMILIES)
def test_every_registered_family(family):
    """Baseline and oelm_freeze on each family: one record per site with finite values, entropy at
    most the uniform one, oelm_freeze's form of full effective rank and its row spaces those of the
    model it started from (overlap 1); the model is left as it was (weights, mode, attention)."""
    reference = qk_weights(build(family))
    for method in ("baseline", "oelm_freeze"):
        model = build(family)
        apply_oelm(model, method, seed=0)
        model.train()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        impl = getattr(model.config, "_attn_implementation", None)
        d = attention_diagnostics(model, _family_batch(family), reference=reference)
        assert model.training and getattr(model.config, "_attn_implementation", None) == impl
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
        sites = find_attention_projections(model)
        assert len(d["sites"]) == len(sites) == len(d["per_head"]["entropy"])
        assert d["entropy_source"] == ("recomputed" if family == "oelm-gpt" else "model")
        for ent, uni, scale in zip(d["per_layer"]["entropy"], d["per_layer"]["uniform_entropy"], d["per_layer"]["logit_scale"]):
            assert 0 < ent <= uni + 1e-5 and scale > 0
        assert d["mean"]["overlap"] == pytest.approx(1.0, abs=1e-6)
        if method == "oelm_freeze":
            assert d["mean"]["qk_effective_rank"] == pytest.approx(d["head_dim"], abs=1e-6)
        assert all(len(row) == sites[0].num_kv_heads for row in d["per_head"]["overlap_key"])


def test_grouped_query_heads_read_their_own_key_head():
    """Llama with 4 query heads over 2 key/value heads: query head h pairs with key head h // 2, in
    the effective rank and in the logit scale (content logits, before the rotary embedding)."""
    model = build("llama")
    randomize_(model, 0.3)
    inputs = {}
    attn = model.model.layers[0].self_attn
    handle = attn.q_proj.register_forward_hook(lambda m, a, o: inputs.__setitem__("x", a[0]))
    ids = torch.randint(1, 100, (2, 6))
    d = attention_diagnostics(model, {"input_ids": ids})
    handle.remove()
    wq, wk = attn.q_proj.weight, attn.k_proj.weight  # (4*8, 32), (2*8, 32)
    assert d["per_head"]["qk_effective_rank"][0] == pytest.approx(
        [qk_effective_rank(wq[h * 8:(h + 1) * 8], wk[(h // 2) * 8:(h // 2 + 1) * 8]) for h in range(4)], abs=1e-5)
    with torch.no_grad():
        q = attn.q_proj(inputs["x"]).view(2, 6, 4, 8).transpose(1, 2)
        k = attn.k_proj(inputs["x"]).view(2, 6, 2, 8).transpose(1, 2)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    scale = [float((q[:, h] @ k[:, h // 2].transpose(-1, -2)).abs().div(math.sqrt(8))[:, causal].mean()) for h in range(4)]
    assert d["per_head"]["logit_scale"][0] == pytest.approx(scale, rel=1e-4)
    assert d["per_head"]["overlap_key"] == [None, None] and d["mean"]["overlap"] is None  # no reference given


# ------------------------------------------------------------- MiniLM on the SST-2 validation batch


@pytest.fixture(scope="module")
def minilm(data_dir):
    from oelm.config import load_config
    from oelm.matrix.output import prepare_matrix_data
    from oelm.matrix.model import build_model

    config = load_config(ROOT / "configs/quickstart.yaml")
    data = prepare_matrix_data(config, None, lambda s: None, save_tokenizer=False)
    batch = diagnostic_batch(data.validation, data.collate_fn)
    pretrained, _ = build_model(config, data)
    found = {}
    for method in ("baseline", "oelm_freeze", "oelm_random"):
        model, _ = build_model(config, data)
        apply_oelm(model, method, seed=0)
        found[method] = attention_diagnostics(model, batch, reference=qk_weights(pretrained))
    return found, batch


def test_minilm_freeze_keeps_the_pretrained_row_space_random_does_not(minilm):
    found, batch = minilm
    assert batch["input_ids"].shape[0] == 64 and batch["attention_mask"].sum() < batch["attention_mask"].numel()  # padded
    base, freeze, rand = found["baseline"], found["oelm_freeze"], found["oelm_random"]
    assert base["mean"]["overlap"] == pytest.approx(1.0, abs=1e-9)
    # head-wise QR: W_h^T = Q R, new rows Q^T span the same subspace as the pretrained rows
    assert min(min(r) for r in freeze["per_head"]["overlap_query"] + freeze["per_head"]["overlap_key"]) > 1 - 1e-6
    # a fresh random draw: the k/d = 32/384 of an unrelated subspace
    assert rand["mean"]["overlap"] == pytest.approx(32 / 384, abs=0.005)
    assert freeze["mean"]["qk_effective_rank"] == pytest.approx(32.0) and base["mean"]["qk_effective_rank"] < 32
    # the temperature: pretrained logits > orthonormal rows > N(0, 0.02^2) rows; entropy the other way
    assert base["mean"]["logit_scale"] > freeze["mean"]["logit_scale"] > 5 * rand["mean"]["logit_scale"]
    assert base["mean"]["entropy"] < freeze["mean"]["entropy"] < rand["mean"]["entropy"] <= rand["mean"]["uniform_entropy"]
    assert rand["mean"]["normalized_entropy"] > 0.99


# ------------------------------------------------------------------- a real matrix, oelm diagnose


@pytest.fixture(scope="module")
def tiny_matrix(tmp_path_factory, data_dir):
    """The tiny gpt-tiny SST-2 matrix (tests/_tiny_matrix.py) with the diagnostics pass slowed by
    1.5 s, as a large model's would be: it must appear in no timing figure."""
    import oelm.matrix.diagnose as diagnose

    tmp = tmp_path_factory.mktemp("diag")
    real, calls = diagnose.attention_diagnostics, []

    def slow(*args, **kwargs):
        calls.append(time.perf_counter())
        time.sleep(1.5)
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(diagnose, "attention_diagnostics", slow)
        assert main(["run", str(write_config(tmp)), "--output-dir", str(tmp / "out")]) == 0
    return tmp / "out", calls


def test_final_runs_record_diagnostics_outside_their_timings(tiny_matrix):
    out, calls = tiny_matrix
    results = {p.parent.name: json.loads(p.read_text()) for p in out.glob("runs/*/result.json")}
    finals = {n: r for n, r in results.items() if r["stage"] == "final"}
    assert len(finals) == 3 and len(calls) == 3  # the promoted baseline run too
    assert results["baseline-lr0.0001-seed0"]["diagnostics"] is None  # a sweep run
    for name, r in finals.items():
        d = r["diagnostics"]
        assert d["batch"]["examples"] == 32 and d["sites"] == ["0", "1"] and d["reference"] is None
        assert d["seconds"] >= 1.5 and d["mean"]["overlap"] is None  # its own time, the slow pass included
        timing = r["timing"]  # every figure but the run's wall time, whose "other" part holds the diagnostics
        assert all(v < 1.5 for k, v in timing.items() if k.endswith("seconds") and k != "wall_seconds"
                   and isinstance(v, float)), (name, timing)
        if "-lr" not in name:  # trained as a final run: its wall time holds the pass, in its "other" part
            assert RunRecord(r).time_split["other"] >= 1.5, (name, timing)  # (a promoted sweep run's wall is its training's)
    assert finals["oelm_freeze-seed0"]["diagnostics"]["mean"]["qk_effective_rank"] == pytest.approx(16.0)


def test_oelm_diagnose_writes_the_file_for_a_run_without_them(tiny_matrix, tmp_path):
    """A run that finished before oelm recorded diagnostics: `oelm diagnose` computes them from its
    best weights into diagnostics.json (equal to what the run would have recorded), never touches
    result.json, keeps the file on a second call, and the report reads it."""
    out = tmp_path / "out"
    shutil.copytree(tiny_matrix[0], out)
    path = out / "runs/oelm_freeze-seed0/result.json"
    r = json.loads(path.read_text())
    recorded = r.pop("diagnostics")
    path.write_text(json.dumps(r, indent=2))
    before = path.read_bytes()
    assert main(["diagnose", str(out)]) == 0
    written = json.loads((out / "runs/oelm_freeze-seed0/diagnostics.json").read_text())
    assert path.read_bytes() == before and not (out / "runs/oelm_random-seed0/diagnostics.json").exists()
    assert written["checkpoint_sha256"] == r["checkpoint"]["sha256"] and written["seed"] == 0
    got = written["diagnostics"]
    assert {k: v for k, v in got.items() if k != "seconds"} == {k: v for k, v in recorded.items() if k != "seconds"}
    stamp = (out / "runs/oelm_freeze-seed0/diagnostics.json").stat().st_mtime_ns
    assert main(["diagnose", str(out)]) == 0
    assert (out / "runs/oelm_freeze-seed0/diagnostics.json").stat().st_mtime_ns == stamp

    from oelm.records import RunRecord
    from oelm.report.diagnostics_summary import diagnostics_comparison

    comparison = {"methods": {"oelm_freeze": {"included_seeds": [0]}}}
    section = diagnostics_comparison(comparison, {"oelm_freeze": [RunRecord(r)]}, out)["diagnostics"]
    assert section["methods"]["oelm_freeze"]["entropy"]["mean"] == got["mean"]["entropy"]
    # weights trained again since: the file is stale, and says so instead of being used
    from oelm.errors import OELMError
    from oelm.records import RunFolder
    from oelm.report.diagnostics_summary import recorded_diagnostics

    r["checkpoint"]["sha256"] = "0" * 64
    with pytest.raises(OELMError, match="diagnostics.json was computed from other weights .* `oelm diagnose"):
        recorded_diagnostics(RunFolder(out / "runs/oelm_freeze-seed0"), RunRecord(r))
    assert diagnostics_comparison(comparison, {"oelm_freeze": [RunRecord(r)]}, out) == {}
    # ... and `oelm diagnose` computes such a file again (here: a file from other weights)
    file = out / "runs/oelm_freeze-seed0/diagnostics.json"
    file.write_text(json.dumps(written | {"checkpoint_sha256": "f" * 64}))
    assert main(["diagnose", str(out)]) == 0
    assert json.loads(file.read_text())["checkpoint_sha256"] == written["checkpoint_sha256"]


def test_oelm_diagnose_of_a_matrix_still_in_its_sweep_says_no_final_run_has_finished(tiny_matrix, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(tiny_matrix[0], out)
    for path in out.glob("runs/*/result.json"):
        if json.loads(path.read_text())["stage"] == "final":
            shutil.rmtree(path.parent)
    assert list(out.glob("runs/*/result.json"))  # the sweep runs are left
    capsys.readouterr()
    assert main(["diagnose", str(out)]) == 0
    assert f"nothing to do: no final run under {out} has finished yet" in capsys.readouterr().out
    assert not list(out.glob("runs/*/diagnostics.json"))


# ------------------------------------------------------------------------------------ the report


def _record(method: str, seed: int, entropy: float, rank: float, overlap: float | None) -> dict:
    layer = [entropy - 0.1, entropy + 0.1]
    return {"method": method, "seed": seed, "run_name": f"{method}-seed{seed}", "status": "finished", "stage": "final",
            "diagnostics": {"batch": {"split": "validation", "examples": 64, "rule": "the first 64 examples"},
                            "reference": "pretrained m", "sites": ["0", "1"], "entropy_source": "model", "head_dim": 32,
                            "mean": {"entropy": entropy, "uniform_entropy": 3.0, "normalized_entropy": entropy / 3,
                                     "logit_scale": 1.0 + seed, "qk_effective_rank": rank, "overlap": overlap},
                            "per_layer": {"entropy": layer, "uniform_entropy": [3.0, 3.0]}}}


def test_report_section_means_and_seed_spread(tmp_path, report_plots):
    from oelm.records import RunRecord
    from oelm.report.diagnostics_summary import diagnostics_blocks, diagnostics_comparison
    from oelm.report.render import Section, render_markdown

    runs = {"baseline": [_record("baseline", s, 2.0 + s / 10, 30.0, 1.0) for s in range(3)],
            "oelm_random": [_record("oelm_random", s, 2.9, 31.3, 0.08 + s / 100) for s in range(3)]}
    comparison = {"methods": {"baseline": {"included_seeds": [0, 1, 2]}, "oelm_random": {"included_seeds": [0, 1]}}}
    section = diagnostics_comparison(comparison, {m: [RunRecord(r) for r in rs] for m, rs in runs.items()}, tmp_path)
    d = section["diagnostics"]
    base = d["methods"]["baseline"]
    assert base["entropy"]["mean"] == pytest.approx(2.1) and base["entropy"]["std"] == pytest.approx(np.std([2.0, 2.1, 2.2], ddof=1))
    assert base["per_layer"]["entropy"] == pytest.approx([2.0, 2.2]) and base["per_layer"]["sites"] == ["0", "1"]
    rand = d["methods"]["oelm_random"]  # seed 2 is not a sound seed: left out
    assert rand["seeds"] == [0, 1] and rand["overlap"]["mean"] == pytest.approx(0.085) and rand["logit_scale"]["n"] == 2
    title, blocks = diagnostics_blocks({"diagnostics": d})[0]
    table = next(b[1] for b in blocks if b[0] == "table")
    assert table[1][0][:3] == ["baseline", "3", "2.100 ± 0.100"] and table[1][1][-2:] == ["31.30 ± 0.00 of 32", "0.085 ± 0.007"]
    image = next(b[1] for b in blocks if b[0] == "image")
    assert image[0] == "attention_entropy.png" and image[1][:8] == b"\x89PNG\r\n\x1a\n"
    md, images = render_markdown({"name": "x", "task": "sst2", "model": "m"}, [Section(title, blocks)])
    assert "## Attention diagnostics" in md and "report_files/attention_entropy.png" in images
    # a run without any diagnostics leaves the comparison as it was
    bare = copy.deepcopy(runs)
    for rs in bare.values():
        for r in rs:
            r.pop("diagnostics")
    assert diagnostics_comparison(comparison, {m: [RunRecord(r) for r in rs] for m, rs in bare.items()}, tmp_path) == {}
