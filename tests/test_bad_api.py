"""The library API called with the wrong things (issue 26, item 4): ``apply_oelm(None)`` was an
AttributeError deep inside; a model name, a mapping or a method entry where a model or a config
belongs, a seed of the wrong type, an ``OELMConfig`` field of the wrong type. Each is one
TypeError / ConfigError line that names the argument, what it got and what to pass; nothing on
the model changes.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import oelm
from oelm.config import MethodEntry
from oelm.errors import ConfigError
from oelm.models.gpt import build_gpt, gpt_config


def _tiny():
    torch.manual_seed(0)
    return build_gpt(gpt_config("gpt-tiny", num_layers=1, hidden_size=32, num_heads=2, vocab_size=64), task="causal_lm")


def _one_line(info) -> str:
    msg = str(info.value)
    assert "\n" not in msg and msg
    return msg


@pytest.mark.parametrize("func", ["apply_oelm", "get_oelm_model"])
@pytest.mark.parametrize("model, got", [(None, "NoneType"), ("gpt2", "str"), (Path("models/gpt2"), "PosixPath"), (3, "int")])
def test_a_model_that_is_not_a_module_is_a_type_error(func, model, got):
    with pytest.raises(TypeError) as info:
        getattr(oelm, func)(model, "oelm_freeze")
    msg = _one_line(info)
    assert msg.startswith(f"oelm.{func} expects a torch.nn.Module (a transformers or oelm model), got {got}")
    if isinstance(model, (str, Path)):
        assert f"AutoModelForCausalLM.from_pretrained({str(model)!r}" in msg


@pytest.mark.parametrize("func", ["merge_and_unload", "parameter_report", "print_trainable_parameters"])
def test_other_model_functions_refuse_none(func):
    with pytest.raises(TypeError, match=r"expects a torch\.nn\.Module .*got NoneType"):
        getattr(oelm, func)(None)


@pytest.mark.parametrize("config, hint", [
    ({"method": "oelm_freeze"}, "for a mapping, pass OELMConfig(**mapping)"),
    (MethodEntry(name="oelm_freeze"), "for a config's method entry, pass entry.oelm_config()"),
    (3, "got int"),
    (None, "got NoneType"),
])
def test_a_config_of_the_wrong_type_is_a_type_error_and_the_model_is_untouched(config, hint):
    model = _tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(TypeError) as info:
        oelm.apply_oelm(model, config)
    msg = _one_line(info)
    assert "config must be an OELMConfig or a method name (baseline, oelm_freeze" in msg and hint in msg
    assert not hasattr(model, "oelm_config") and all(p.requires_grad for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_an_unknown_method_name_suggests_the_closest():
    with pytest.raises(ConfigError) as info:
        oelm.apply_oelm(_tiny(), "oelm_frozen")
    assert "unknown method 'oelm_frozen'; did you mean 'oelm_freeze'?" in _one_line(info)


def test_get_method_of_a_non_string_is_a_type_error():
    with pytest.raises(TypeError, match="a method name is a str .* got NoneType None"):
        oelm.get_method(None)


@pytest.mark.parametrize("seed", [True, -1, 1.5, "0", 2**63])
def test_a_bad_seed_is_refused_before_anything_changes(seed):
    model = _tiny()
    with pytest.raises(TypeError, match=r"seed must be None or an int in \[0, 2\*\*63\)"):
        oelm.apply_oelm(model, "oelm_random", seed=seed)
    assert not hasattr(model, "oelm_config")


@pytest.mark.parametrize("changes, field", [
    ({"normal_std": math.inf}, "normal_std"),
    ({"normal_std": True}, "normal_std"),
    ({"targets": "query"}, "targets"),
    ({"extra_frozen_groups": "ffn"}, "extra_frozen_groups"),
    ({"freeze": "yes"}, "freeze"),
    ({"freeze_bias": 1}, "freeze_bias"),
    ({"seed": -5}, "seed"),
    ({"method": ""}, "method"),
])
def test_oelm_config_fields_of_the_wrong_type_are_named(changes, field):
    with pytest.raises(ConfigError) as info:
        oelm.OELMConfig(**changes)
    assert _one_line(info).startswith(f"OELMConfig.{field} ")


def test_save_and_load_with_swapped_or_missing_arguments(tmp_path):
    model = _tiny()
    oelm.apply_oelm(model, "oelm_freeze", seed=0)
    with pytest.raises(TypeError, match=r"oelm\.save_pretrained\(model, directory\) expects a torch\.nn\.Module first, got PosixPath"):
        oelm.save_pretrained(tmp_path / "ckpt", model)
    with pytest.raises(TypeError, match="directory must be a non-empty path"):
        oelm.save_pretrained(model, "")
    oelm.save_pretrained(model, tmp_path / "ckpt", source="none")
    with pytest.raises(TypeError, match=r"the first argument is the checkpoint directory, got a GPTForCausalLM; call "
                                         r"load_oelm\(directory, base_model=model\)"):
        oelm.load_oelm(model, tmp_path / "ckpt")
    with pytest.raises(TypeError, match="base_model must be a torch.nn.Module or None, got str"):
        oelm.load_oelm(tmp_path / "ckpt", "gpt2")
    loaded = oelm.load_oelm(tmp_path / "ckpt", base_model=_tiny())  # the right order still works
    assert loaded.oelm_config.method == "oelm_freeze"


def test_a_model_on_the_meta_device_is_refused_naming_how_to_materialize_it():
    with torch.device("meta"):
        model = build_gpt(gpt_config("gpt-tiny", num_layers=1, hidden_size=32, num_heads=2, vocab_size=64), task="causal_lm")
    with pytest.raises(oelm.OELMError) as info:
        oelm.apply_oelm(model, "oelm_freeze")
    assert "has parameters on the meta device" in _one_line(info) and "to_empty" in str(info.value)
    assert not hasattr(model, "oelm_config")


def test_checkpoint_paths_that_are_wrong_are_named(tmp_path):
    import json

    from oelm.checkpoint import METADATA_NAME, CheckpointError

    model = _tiny()
    oelm.apply_oelm(model, "oelm_freeze", seed=0)
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(CheckpointError, match=f"{afile} is a file, not a directory"):
        oelm.save_pretrained(model, afile, source="none")
    with pytest.raises(CheckpointError, match=f"{tmp_path / 'missing'} does not exist"):
        oelm.load_oelm(tmp_path / "missing", base_model=_tiny())
    oelm.save_pretrained(model, tmp_path / "ckpt", source="none")
    meta = tmp_path / "ckpt" / METADATA_NAME
    data = json.loads(meta.read_text())
    data["oelm_config"]["init"] = "bogus"  # hand-edited
    meta.write_text(json.dumps(data))
    with pytest.raises(CheckpointError) as info:
        oelm.load_oelm(tmp_path / "ckpt", base_model=_tiny())
    assert _one_line(info).startswith(f"{meta}: its oelm_config is invalid (OELMConfig.init='bogus'")
