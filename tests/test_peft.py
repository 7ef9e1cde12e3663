"""OELM as a PEFT method (issue 35): ``get_peft_model(model, OELMPeftConfig(...))`` on BERT and GPT-2,
``PeftModel.save_pretrained`` / ``from_pretrained``, ``merge_and_unload``, Trainer checkpoints of
the PEFT model, and the two-step recipe frozen orthogonal Q/K + LoRA on V/O.

Tiny random-weight models from their configs (nothing downloaded), AdamW with weight decay 0.1.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers as T

peft = pytest.importorskip("peft")

import oelm  # noqa: E402
from oelm import CheckpointMismatchError, max_orthogonality_error  # noqa: E402
from oelm.architectures import SplitQKV, find_attention_projections  # noqa: E402
import oelm.integrations.peft  # noqa: E402  registers OELM with PEFT
from oelm.integrations.peft import OELMPeftConfig  # noqa: E402

VOCAB = 100


def bert(seed: int = 0):
    torch.manual_seed(seed)
    return T.BertForSequenceClassification(T.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, num_labels=2))


def gpt2(seed: int = 0):
    torch.manual_seed(seed)
    return T.GPT2LMHeadModel(T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                          bos_token_id=0, eos_token_id=0))


FAMILIES = {"bert": (bert, "SEQ_CLS"), "gpt2": (gpt2, "CAUSAL_LM")}


def batch(family: str, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (2, 10), generator=g)
    return {"input_ids": ids, "labels": torch.randint(0, 2, (2,), generator=g) if family == "bert" else ids}


def train_steps(model, family: str, steps: int = 3) -> None:
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    for step in range(steps):
        model(**batch(family, step)).loss.backward()
        opt.step()
        opt.zero_grad()


def logits(model, family: str) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=batch(family, 9)["input_ids"]).logits


def test_registered_with_peft_and_import_oelm_stays_without_it():
    from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING, PEFT_TYPE_TO_TUNER_MAPPING

    assert PEFT_TYPE_TO_CONFIG_MAPPING["OELM"] is OELMPeftConfig and PEFT_TYPE_TO_TUNER_MAPPING["OELM"] is oelm.integrations.peft.OELMModel
    src = str(Path(oelm.__file__).resolve().parents[1])
    probe = "import sys, oelm, oelm.method; print('peft' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env={"PYTHONPATH": src}, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr
    with pytest.raises(oelm.ConfigError, match="oelm_freeze"):
        OELMPeftConfig(method="oelm_froze")


@pytest.mark.parametrize("family", FAMILIES)
def test_get_peft_model_trains_all_but_frozen_qk_and_round_trips(family, tmp_path):
    make, task = FAMILIES[family]
    model = peft.get_peft_model(make(), OELMPeftConfig(method="oelm_freeze", seed=0, task_type=task))
    inner = model.get_base_model()
    assert inner.oelm_report.method == "oelm_freeze"
    sites = find_attention_projections(inner)
    assert all(max_orthogonality_error(s.query.weight, 4) < 1e-5 for s in sites)
    trainable, total = model.get_nb_trainable_parameters()
    assert (trainable, total) == (inner.oelm_report.trainable, inner.oelm_report.total)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    assert len(frozen) == 8  # 2 layers x Q/K x weight/bias
    train_steps(model, family)
    params = dict(model.named_parameters())
    assert all(params[n].detach().numpy().tobytes() == b.numpy().tobytes() for n, b in frozen.items())
    expected = logits(model, family)

    model.save_pretrained(tmp_path)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "adapter_model.safetensors"), "pt") as fh:
        saved = set(fh.keys())
    assert saved and not saved & set(frozen)  # only what trained
    own = {n for n, _ in model.named_parameters(remove_duplicate=False)} | {n for n, _ in model.named_buffers()}
    assert saved <= own  # under the model's own names: not the stock fused c_attn a holder's state dict has
    assert set(json.loads((tmp_path / "adapter_config.json").read_text())["frozen"]) == set(frozen)

    loaded = peft.PeftModel.from_pretrained(make(), tmp_path, is_trainable=True)
    assert torch.equal(logits(loaded, family), expected)
    assert {n for n, p in loaded.named_parameters() if not p.requires_grad} == set(frozen)
    inference = peft.PeftModel.from_pretrained(make(), tmp_path)
    assert not any(p.requires_grad for p in inference.parameters()) and torch.equal(logits(inference, family), expected)

    merged = loaded.merge_and_unload()
    assert type(merged) is type(make()) and not any(isinstance(m, SplitQKV) for m in merged.modules())
    merged.save_pretrained(tmp_path / "merged")
    stock = T.AutoConfig.from_pretrained(tmp_path / "merged")
    reloaded = type(merged).from_pretrained(tmp_path / "merged", config=stock)
    assert torch.allclose(logits(reloaded, family), expected, atol=1e-5, rtol=0)


def test_loading_onto_another_base_is_refused_naming_the_tensor(tmp_path):
    peft.get_peft_model(gpt2(), OELMPeftConfig(seed=0, task_type="CAUSAL_LM")).save_pretrained(tmp_path)
    with pytest.raises(CheckpointMismatchError, match=r"c_attn\.(query|key)\.weight' regenerated by 'oelm_freeze'") as info:
        peft.PeftModel.from_pretrained(gpt2(seed=1), tmp_path)
    assert "\n" not in str(info.value)


def test_unload_and_disable_are_refused_clearly():
    model = peft.get_peft_model(bert(), OELMPeftConfig(task_type="SEQ_CLS"))
    with pytest.raises(ValueError, match="keeps no copy of the original"):
        model.unload()
    with pytest.raises(ValueError, match="cannot be disabled"):
        model.disable_adapter_layers()
    with pytest.raises(ValueError, match="No adapter layers"):  # PEFT's own refusal: OELM replaces no layer
        with model.disable_adapter():
            pass


def test_trainer_checkpoints_of_the_peft_model_resume_bit_identical(tmp_path):
    def run(out, resume=None):
        model = peft.get_peft_model(gpt2(), OELMPeftConfig(seed=0, task_type="CAUSAL_LM"))
        args = T.TrainingArguments(output_dir=str(out), max_steps=4, per_device_train_batch_size=2, learning_rate=1e-3,
                                   weight_decay=0.1, save_strategy="steps", save_steps=2, report_to="none", use_cpu=True,
                                   disable_tqdm=True, seed=0, logging_steps=10)
        data = [batch("gpt2", i) for i in range(4)]
        examples = [{k: v[j] for k, v in b.items()} for b in data for j in range(2)]
        T.Trainer(model=model, args=args, train_dataset=examples).train(resume_from_checkpoint=resume)
        return {n: t.clone() for n, t in model.state_dict().items()}

    full = run(tmp_path / "full")
    assert (tmp_path / "full" / "checkpoint-2" / "adapter_model.safetensors").is_file()
    resumed = run(tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-2"))
    assert set(full) == set(resumed) and all(torch.equal(full[n], resumed[n]) for n in full)


# ---------------------------------------------------------------- frozen orthogonal Q/K + LoRA on V/O

LORA_TARGETS = {
    "bert": dict(target_modules=["value", "attention.output.dense"], modules_to_save=["classifier"], task_type="SEQ_CLS"),
    # c_attn.value: an nn.Linear once apply_oelm split c_attn; attn.c_proj: GPT-2's Conv1D (PEFT sets
    # fan_in_fan_out per module, with a warning)
    "gpt2": dict(target_modules=["c_attn.value", "attn.c_proj"], task_type="CAUSAL_LM"),
}


def oelm_plus_lora(family: str):
    base = FAMILIES[family][0]()
    oelm.apply_oelm(base, "oelm_freeze", seed=0)  # step 1
    return peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, **copy.deepcopy(LORA_TARGETS[family])))  # step 2


@pytest.mark.parametrize("family", FAMILIES)
def test_oelm_freeze_plus_lora_two_step_recipe(family, tmp_path):
    model = oelm_plus_lora(family)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or "classifier" in n for n in trainable)
    adapted = {n.split(".lora_")[0] for n in trainable if "lora_" in n}
    assert len(adapted) == 4  # V and O of 2 layers
    qk = {n: p.detach().clone() for n, p in model.named_parameters() if (".query." in n or ".key." in n) and "lora_" not in n}
    assert qk and not any(model.get_parameter(n).requires_grad for n in qk)
    train_steps(model, family)
    assert all(model.get_parameter(n).detach().numpy().tobytes() == b.numpy().tobytes() for n, b in qk.items())
    expected = logits(model, family)
    model.save_pretrained(tmp_path)

    fresh = FAMILIES[family][0]()
    oelm.apply_oelm(fresh, "oelm_freeze", seed=0)  # the same step 1 regenerates the frozen Q/K
    loaded = peft.PeftModel.from_pretrained(fresh, tmp_path)
    assert torch.equal(logits(loaded, family), expected)

    plain = oelm.merge_and_unload(loaded.merge_and_unload())  # LoRA into V (and O), then Q/K/V fused back
    assert type(plain) is type(FAMILIES[family][0]()) and torch.allclose(logits(plain, family), expected, atol=1e-5, rtol=0)


# ---------------------------------------------------------------- LoRA methods in an experiment config


def test_research_lora_config_and_its_lora_step():
    from oelm.config import config_from_dict, load_config
    from oelm.integrations.peft import add_lora

    config = load_config(Path(__file__).resolve().parents[1] / "configs" / "research" / "lora_sst2.yaml")
    entries = {m.name: m for m in config.methods}
    assert set(entries) == {"baseline", "lora", "oelm_freeze_lora", "oelm_freeze"} and entries["oelm_freeze"].lora is None
    assert entries["lora"].lora == entries["oelm_freeze_lora"].lora
    assert entries["lora"].oelm_config().method == "lora" and not entries["lora"].oelm_config().targets
    for name in ("lora", "oelm_freeze_lora"):  # what build_run_model does for these entries, on a tiny BERT
        model = bert()
        report = oelm.apply_oelm(model, entries[name].oelm_config(), seed=0)
        wrapped, report = add_lora(model, entries[name].lora, report)
        trainable = {n for n, p in wrapped.named_parameters() if p.requires_grad}
        assert trainable and all("lora_" in n or "classifier" in n for n in trainable)
        assert report.trainable == sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
        assert len(report.projections) == (4 if name == "oelm_freeze_lora" else 0)

    with pytest.raises(oelm.ConfigError, match=r"lora needs target_modules and takes only"):
        config_from_dict({"name": "x", "task": {"dataset": "sst2"},
                          "methods": [{"name": "l", "base": "baseline", "lora": {"rank": 8, "target_modules": ["value"]}}]})


# ---------------------------------------------------------------- LoRA module names checked, not left to PEFT


def test_peft_alone_accepts_a_typo_beside_a_valid_target():
    """Why oelm checks every name: PEFT refuses only a target_modules that matches nothing, so a
    list with one typo trains LoRA on fewer modules than the config says, silently."""
    model = peft.get_peft_model(bert(), peft.LoraConfig(r=4, target_modules=["valu", "attention.output.dense"]))
    adapted = {n.split(".lora_")[0] for n, p in model.named_parameters() if "lora_" in n}
    assert adapted and not any(n.endswith(".value") for n in adapted)


@pytest.mark.parametrize("family", FAMILIES)
def test_add_lora_refuses_a_name_that_matches_no_module(family):
    from oelm.integrations.peft import add_lora

    good = {k: v for k, v in LORA_TARGETS[family].items() if k != "task_type"}
    model = FAMILIES[family][0]()
    report = oelm.apply_oelm(model, "oelm_freeze", seed=0)  # gpt2: c_attn split, so c_attn.value exists now
    wrapped, _ = add_lora(model, {"r": 4, **good}, report)
    assert any("lora_" in n for n, _ in wrapped.named_parameters())

    typo = {**good, "target_modules": [good["target_modules"][0] + "x", *good["target_modules"][1:]]}
    model = FAMILIES[family][0]()
    oelm.apply_oelm(model, "oelm_freeze", seed=0)
    with pytest.raises(oelm.ConfigError, match=rf"lora.target_modules: '{good['target_modules'][0]}x' names no module of ") as info:
        add_lora(model, {"r": 4, **typo})
    hint = str(info.value).split("leaf modules end with")[1]  # the names to choose from, the intended one among them
    intended = good["target_modules"][0].split(".")[-1]
    assert "\n" not in str(info.value) and any(item.strip().split(".")[-1] == intended for item in hint.split(","))
    assert not any("lora_" in n for n, _ in model.named_parameters())  # refused before PEFT touched the model
    with pytest.raises(oelm.ConfigError, match=r"lora.modules_to_save: 'classifer' names no module"):
        add_lora(model, {"r": 4, **good, "modules_to_save": ["classifer"]})
    with pytest.raises(oelm.ConfigError, match=r"lora.target_modules: the regex '\.\*nothing' matches no module name"):
        add_lora(model, {"r": 4, "target_modules": ".*nothing"})


def test_add_lora_leaves_the_callers_mapping_as_it_was():
    """PEFT extends a SEQ_CLS config's modules_to_save list in place (classifier, score); a matrix
    builds every run of a method from one ``lora:`` mapping, so add_lora must hand PEFT a copy."""
    from oelm.integrations.peft import add_lora

    lora = {"r": 4, "target_modules": ["value"], "modules_to_save": ["classifier"], "task_type": "SEQ_CLS"}
    for seed in (0, 1):
        model = bert(seed)
        add_lora(model, lora, oelm.apply_oelm(model, "oelm_freeze", seed=seed))
        assert lora["modules_to_save"] == ["classifier"]


def test_lora_typo_in_a_config_is_refused_before_data(tmp_path, monkeypatch):
    """`oelm run` on the shipped LoRA matrix with one misspelt target: one line naming the method and
    the name, from the model's weightless skeleton, before any data is read or the folder written."""
    import yaml

    from oelm.config import config_from_dict
    from oelm.matrix.driver import run_matrix

    source = Path(__file__).resolve().parents[1] / "configs" / "research" / "lora_sst2.yaml"
    raw = yaml.safe_load(source.read_text())
    oelm_lora = next(m for m in raw["methods"] if m["name"] == "oelm_freeze_lora")
    oelm_lora["lora"] = {**oelm_lora["lora"], "target_modules": ["value", "attention.output.dens"]}
    monkeypatch.setenv("OELM_DATA_DIR", str(tmp_path / "no-data-here"))  # data read first would fail differently
    out = tmp_path / "out"
    with pytest.raises(oelm.ConfigError) as info:
        run_matrix(config_from_dict(raw), out, log=lambda _: None)
    msg = str(info.value)
    assert msg.startswith("method 'oelm_freeze_lora': lora.target_modules: 'attention.output.dens' names no module of "
                          "sentence-transformers/all-MiniLM-L6-v2; fix the name(s)")
    assert "output.dense" in msg and "\n" not in msg and not out.exists()


def test_skeleton_names_include_the_split_children_of_a_fused_module(tmp_path):
    """GPT-2's c_attn is split by every method (split_fused), so a LoRA on ``c_attn.value`` is valid
    before data although the checkpoint's own module tree has no such name."""
    from oelm.config import config_from_dict
    from oelm.matrix.driver import check_lora_targets
    from oelm.matrix.model import skeleton_module_names

    gpt2().save_pretrained(tmp_path / "gpt2")
    base = {"name": "x", "task": {"dataset": "tinystories", "block_size": 32}, "model": {"pretrained": str(tmp_path / "gpt2")}}
    good = {"name": "l", "base": "oelm_freeze", "lora": {"r": 4, "target_modules": ["c_attn.value", "attn.c_proj"]}}
    config = config_from_dict({**base, "methods": [good]})
    names = skeleton_module_names(config)
    assert "transformer.h.1.attn.c_attn.value" in names and "transformer.h.1.attn.c_attn" in names
    assert "transformer.h.1.attn.c_proj.value" not in names  # only fused modules get split children
    check_lora_targets(config)
    bad = {**good, "lora": {"r": 4, "target_modules": ["c_attn.values"]}}
    with pytest.raises(oelm.ConfigError, match=r"method 'l': lora.target_modules: 'c_attn.values' names no module"):
        check_lora_targets(config_from_dict({**base, "methods": [bad]}))
