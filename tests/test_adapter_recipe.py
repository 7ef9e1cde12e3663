"""Adapters carry what they were trained on (issue 46 item 3).

Real PEFT 0.21 and tiny GPT-2 / BERT models built from their configs, trained a few AdamW steps on
real TinyStories / SST-2 tokens, saved with ``save_pretrained`` and loaded with
``PeftModel.from_pretrained``:

* an OELM adapter whose ``frozen`` record was emptied or edited is refused on load (before: loaded
  unchecked, onto a base that regenerates other Q/K too); a malformed record or field is one
  ``ConfigError`` line naming the field (before: a bare ``TypeError`` from inside the check);
* an OELM+LoRA adapter (``oelm.peft.OELMLoraConfig``, the two-step recipe's step 2) records the
  base's OELM recipe; ``PeftModel.from_pretrained`` onto a fresh base applies it (GPT-2's ``c_attn``
  split again, so LoRA finds its ``value`` targets: the trained logits come back exactly) and refuses
  a base treated otherwise, with one line; a damaged record is one line too (before: a stock
  ``LoraConfig`` adapter loaded onto a base without ``apply_oelm``, a different model);
* ``import oelm`` alone (before or after ``import peft``) registers both PEFT types, so loading an
  adapter needs no ``import oelm.peft`` (before: a bare ``KeyError: 'OELM'``).
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers as T

peft = pytest.importorskip("peft")

import oelm  # noqa: E402
import oelm.peft  # noqa: E402  the documented name; registers OELM with PEFT
from oelm import CheckpointError, CheckpointMismatchError, ConfigError  # noqa: E402

LENGTH = 16


@pytest.fixture(scope="module")
def ids(data_dir) -> torch.Tensor:
    """``[4, LENGTH]`` real TinyStories token ids (GPT-2 BPE)."""
    tok = T.GPT2TokenizerFast.from_pretrained(str(data_dir / "tokenizers" / "gpt2"))
    with gzip.open(data_dir / "tinystories" / "validation_head_sample.txt.gz", "rt", encoding="utf-8") as fh:
        return torch.tensor(tok(fh.read(4000))["input_ids"][:4 * LENGTH]).view(4, LENGTH)


def gpt2(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return T.GPT2LMHeadModel(T.GPT2Config(vocab_size=50257, n_embd=32, n_layer=2, n_head=4, n_positions=64))


def train(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Three AdamW steps on ``ids``; the trained model's logits on them."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    return logits(model, ids)


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits


def edit_config(directory, **changes) -> None:
    path = directory / "adapter_config.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.fixture()
def oelm_adapter(ids, tmp_path):
    """An OELM adapter (oelm_freeze, seed 0) of a trained tiny GPT-2, saved under ``tmp_path``."""
    model = peft.get_peft_model(gpt2(), oelm.peft.OELMPeftConfig(method="oelm_freeze", seed=0, task_type="CAUSAL_LM"))
    train(model, ids)
    model.save_pretrained(tmp_path / "oelm")
    return tmp_path / "oelm"


# ---------------------------------------------------------------- an OELM adapter's frozen record


@pytest.mark.parametrize("record", ["emptied", "removed", "one entry dropped"])
def test_an_oelm_adapter_whose_frozen_record_was_emptied_is_refused(record, oelm_adapter):
    frozen = json.loads((oelm_adapter / "adapter_config.json").read_text())["frozen"]
    assert len(frozen) == 8  # 2 layers x Q/K x weight/bias
    edited = {"emptied": {}, "removed": None, "one entry dropped": dict(list(frozen.items())[1:])}[record]
    edit_config(oelm_adapter, frozen=edited)
    for base in (gpt2(), gpt2(seed=1)):  # the right base, and one that regenerates other Q/K
        with pytest.raises(CheckpointError, match=r"'frozen' record has .*save the adapter again") as info:
            peft.PeftModel.from_pretrained(base, oelm_adapter)
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("field, value, named", [
    ("frozen", {"transformer.h.0.attn.c_attn.query.weight": "abc"}, "frozen entry"),
    ("frozen", ["transformer.h.0.attn.c_attn.query.weight"], "frozen is a list"),
    ("frozen", {"transformer.h.0.attn.c_attn.query.weight": {"dtype": "torch.float32", "shape": [32, 32], "sha256": 7}},
     "frozen entry"),
    ("num_heads", "4", "num_heads"),
    ("target_modules", ["c_attn"], "target_modules"),
    ("method", 3, "method"),
    ("seed", "0", "seed"),
])
def test_a_malformed_oelm_adapter_config_is_one_line_naming_the_field(field, value, named, oelm_adapter):
    edit_config(oelm_adapter, **{field: value})
    with pytest.raises(ConfigError, match=rf"OELMPeftConfig\.{named}") as info:
        peft.PeftModel.from_pretrained(gpt2(), oelm_adapter)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------- OELM + LoRA


def oelm_plus_lora(method: str = "oelm_freeze", seed: int = 0) -> torch.nn.Module:
    """The two-step recipe on a tiny GPT-2: ``apply_oelm``, then LoRA on V and the attention output."""
    base = gpt2()
    oelm.apply_oelm(base, method, seed=seed)
    config = oelm.peft.OELMLoraConfig(r=4, lora_alpha=8, target_modules=["c_attn.value", "attn.c_proj"],
                                      task_type="CAUSAL_LM")
    return peft.get_peft_model(base, config)


def lora_modules(model: torch.nn.Module) -> list[str]:
    return sorted(n for n, m in model.named_modules() if isinstance(m, peft.tuners.lora.LoraLayer))


@pytest.fixture()
def lora_adapter(ids, tmp_path):
    """An OELM+LoRA adapter trained 3 steps on real tokens: (its folder, its logits, its LoRA modules)."""
    model = oelm_plus_lora()
    expected = train(model, ids)
    model.save_pretrained(tmp_path / "lora")
    return tmp_path / "lora", expected, lora_modules(model)


def test_an_oelm_lora_adapter_records_the_recipe_and_a_fresh_base_gets_it_applied(lora_adapter, ids):
    folder, expected, adapted = lora_adapter
    entry = json.loads((folder / "adapter_config.json").read_text())["oelm"]
    assert entry["module"] == "" and entry["recipe"]["method"] == "oelm_freeze" and entry["recipe"]["oelm_config"]["seed"] == 0
    assert len(entry["recipe"]["frozen"]) == 8 and set(entry["recipe"]["split"]) == {"transformer.h.0.attn.c_attn",
                                                                                    "transformer.h.1.attn.c_attn"}
    loaded = peft.PeftModel.from_pretrained(gpt2(), folder)  # a fresh base: no apply_oelm by the user
    assert len(adapted) == 4 and lora_modules(loaded) == adapted  # c_attn split again, so LoRA found its value targets
    assert torch.equal(logits(loaded, ids), expected)
    treated = gpt2()
    oelm.apply_oelm(treated, "oelm_freeze", seed=0)  # the docs' reload: the same step 1 by hand
    assert torch.equal(logits(peft.PeftModel.from_pretrained(treated, folder), ids), expected)


@pytest.mark.parametrize("method, seed, error, named", [
    ("oelm_freeze", 1, CheckpointError, r"'oelm_freeze' \(seed 0\) applied at ''.*'oelm_freeze' \(seed 1\) at ''"),
    ("oelm_random", 0, CheckpointError, r"'oelm_freeze' \(seed 0\).*'oelm_random'"),
])
def test_an_oelm_lora_adapter_refuses_a_base_treated_otherwise(method, seed, error, named, lora_adapter):
    base = gpt2()
    oelm.apply_oelm(base, method, seed=seed)
    with pytest.raises(error, match=named) as info:
        peft.PeftModel.from_pretrained(base, lora_adapter[0])
    assert "\n" not in str(info.value)


def test_an_oelm_lora_adapter_checks_the_frozen_tensors_it_regenerates(lora_adapter):
    folder = lora_adapter[0]
    data = json.loads((folder / "adapter_config.json").read_text())
    first = sorted(data["oelm"]["recipe"]["frozen"])[0]
    data["oelm"]["recipe"]["frozen"][first]["sha256"] = "0" * 64  # as another base or torch build would give
    (folder / "adapter_config.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointMismatchError, match=rf"{first}' regenerated by 'oelm_freeze'") as info:
        peft.PeftModel.from_pretrained(gpt2(), folder)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("edit, error, named", [
    ("emptied frozen", CheckpointError, r"no 'frozen' entry for 8 tensor\(s\) 'oelm_freeze' froze"),
    ("one entry dropped", CheckpointError, r"no 'frozen' entry for 1 tensor\(s\)"),
    ("no recipe", ConfigError, r"OELMLoraConfig\.oelm has no oelm-recipe 'recipe'"),
    ("not a mapping", ConfigError, r"OELMLoraConfig\.oelm is not a mapping"),
])
def test_a_damaged_oelm_lora_record_is_one_line(edit, error, named, lora_adapter):
    folder = lora_adapter[0]
    data = json.loads((folder / "adapter_config.json").read_text())
    if edit == "emptied frozen":
        data["oelm"]["recipe"]["frozen"] = {}
    elif edit == "one entry dropped":
        data["oelm"]["recipe"]["frozen"].pop(sorted(data["oelm"]["recipe"]["frozen"])[0])
    elif edit == "no recipe":
        del data["oelm"]["recipe"]
    else:
        data["oelm"] = "oelm_freeze"
    (folder / "adapter_config.json").write_text(json.dumps(data))
    treated = gpt2()
    oelm.apply_oelm(treated, "oelm_freeze", seed=0)
    for base in (gpt2(), treated):  # a fresh base (the recipe would be applied) and one treated by hand
        with pytest.raises(error, match=named) as info:
            peft.PeftModel.from_pretrained(base, folder)
        assert "save the adapter again" in str(info.value) and "\n" not in str(info.value)


def test_oelm_lora_config_on_a_model_without_oelm_is_refused():
    with pytest.raises(ConfigError, match=r"apply_oelm\(model, 'oelm_freeze', seed=0\) first") as info:
        peft.get_peft_model(gpt2(), oelm.peft.OELMLoraConfig(r=4, target_modules=["c_attn"]))
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------- registration at import oelm

_LOAD = """
import sys, torch, transformers as T
first = sys.argv[1]
if first == "oelm":
    import oelm
    from peft import PeftModel
else:
    from peft import PeftModel
    import oelm
for folder in sys.argv[2:]:
    torch.manual_seed(0)
    base = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=50257, n_embd=32, n_layer=2, n_head=4, n_positions=64))
    print(type(PeftModel.from_pretrained(base, folder).peft_config["default"]).__name__)
"""


@pytest.mark.parametrize("first", ["oelm", "peft"])
def test_import_oelm_alone_registers_both_peft_types(first, oelm_adapter, lora_adapter):
    src = str(Path(oelm.__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-c", _LOAD, first, str(oelm_adapter), str(lora_adapter[0])],
                         capture_output=True, text=True, env={"PYTHONPATH": src, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert out.returncode == 0 and out.stdout.split()[-2:] == ["OELMPeftConfig", "OELMLoraConfig"], out.stderr[-2000:]


def test_a_second_oelm_lora_adapter_records_the_same_recipe(ids):
    model = oelm_plus_lora()
    model.add_adapter("second", oelm.peft.OELMLoraConfig(r=2, target_modules=["attn.c_proj"], task_type="CAUSAL_LM"))
    first, second = model.peft_config["default"].oelm, model.peft_config["second"].oelm
    assert second == first and len(second["recipe"]["frozen"]) == 8  # not every base tensor LoRA has frozen since


def test_oelm_runs_lora_step_records_the_recipe_and_a_method_that_freezes_nothing_reloads(ids, tmp_path):
    """``add_lora`` (a method's ``lora:`` in an experiment) on a model that went through apply_oelm uses
    OELMLoraConfig; LoRA alone (the ``baseline`` method: nothing frozen, an empty record) reloads too."""
    from oelm.integrations.peft import add_lora

    for method, frozen in (("baseline", 0), ("oelm_freeze", 8)):
        model = gpt2()
        report = oelm.apply_oelm(model, method, seed=0)
        wrapped, _ = add_lora(model, {"r": 4, "target_modules": ["attn.c_proj"], "task_type": "CAUSAL_LM"}, report)
        assert isinstance(wrapped.peft_config["default"], oelm.peft.OELMLoraConfig)
        expected = train(wrapped, ids)
        wrapped.save_pretrained(tmp_path / method)
        recipe = json.loads((tmp_path / method / "adapter_config.json").read_text())["oelm"]["recipe"]
        assert recipe["method"] == method and len(recipe["frozen"]) == frozen
        assert torch.equal(logits(peft.PeftModel.from_pretrained(gpt2(), tmp_path / method), ids), expected)
