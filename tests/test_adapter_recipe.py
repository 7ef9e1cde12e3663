"""Adapters carry what they were trained on (issue 46 item 3).

Real PEFT 0.21 and tiny GPT-2 / BERT models built from their configs, trained a few AdamW steps on
real TinyStories / SST-2 tokens, saved with ``save_pretrained`` and loaded with
``PeftModel.from_pretrained``:

* an OELM adapter whose ``frozen`` record was emptied or edited is refused on load (before: loaded
  unchecked, onto a base that regenerates other Q/K too); a malformed record or field is one
  ``ConfigError`` line naming the field (before: a bare ``TypeError`` from inside the check);
"""

from __future__ import annotations

import gzip
import json

import pytest
import torch
import transformers as T

peft = pytest.importorskip("peft")

import oelm  # noqa: E402
import oelm.peft  # noqa: E402  the documented name; registers OELM with PEFT
from oelm import CheckpointError, ConfigError  # noqa: E402

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
    model.save_pretrained(tmp_path)
    return tmp_path


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
