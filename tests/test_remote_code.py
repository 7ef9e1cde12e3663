"""Code shipped with a checkpoint never runs unless the user asks (issue 26).

A config.json may carry an ``auto_map`` naming Python files of the checkpoint directory; with
``trust_remote_code`` left unset, transformers asks on stdin ("Do you wish to run the custom
code? [y/N]") or runs nothing, depending on the case. oelm passes ``trust_remote_code=False``
to every loader unless the user's config says otherwise, so ``oelm inspect`` never prompts and
never imports the files; the test files below leave a marker if they are ever imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers as T

import oelm
from oelm.errors import DataFormatError

PROMPT = "Do you wish to run the custom code"
EVIL = """from pathlib import Path
Path({marker!r}).write_text("custom code ran")
from transformers import PretrainedConfig, PreTrainedModel


class EvilConfig(PretrainedConfig):
    model_type = "evil"


class EvilModel(PreTrainedModel):
    config_class = EvilConfig
"""
TINY_GPT2 = dict(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0)


def custom_code_dir(tmp_path: Path, model_type: str) -> tuple[Path, Path]:
    """A checkpoint directory whose config.json asks for its own code (``auto_map``); returns it
    and the marker file that importing that code would create."""
    folder, marker = tmp_path / "ckpt", tmp_path / "imported.marker"
    folder.mkdir()
    config = {
        **TINY_GPT2,
        "model_type": model_type,
        "architectures": ["EvilModel"],
        "auto_map": {"AutoConfig": "configuration_evil.EvilConfig", "AutoModel": "modeling_evil.EvilModel",
                     "AutoModelForCausalLM": "modeling_evil.EvilModel"},
    }
    (folder / "config.json").write_text(json.dumps(config))
    for name in ("configuration_evil.py", "modeling_evil.py"):
        (folder / name).write_text(EVIL.format(marker=str(marker)))
    return folder, marker


def oelm_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m oelm ARGS`` with empty stdin, offline, with transformers' module cache in tmp_path."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "hf-modules"),
           "TRANSFORMERS_VERBOSITY": "error"}
    return subprocess.run([sys.executable, "-m", "oelm", *args], input="", capture_output=True, text=True,
                          timeout=300, env=env)


def test_inspect_config_only_of_a_known_type_with_auto_map_uses_transformers_own_class(tmp_path):
    """model_type gpt2 is one transformers has: with trust_remote_code=False it builds its own
    GPT-2 (the auto_map and the unknown architectures name are ignored), no prompt, no import."""
    folder, marker = custom_code_dir(tmp_path, "gpt2")
    result = oelm_cli(tmp_path, "inspect", str(folder), "--config-only", "--method", "oelm_freeze")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert PROMPT not in out and not marker.exists()
    assert "GPT2Model (model_type='gpt2', random weights from config.json)" in result.stdout
    assert "h.1.attn.c_attn" in result.stdout and "/ oelm_freeze" in result.stdout


def test_inspect_config_only_of_an_unknown_type_with_auto_map_is_one_error_line(tmp_path):
    """model_type evil exists only in the directory's code: transformers cannot build it without
    running that code, so oelm stops with one line that says why and how to opt in."""
    folder, marker = custom_code_dir(tmp_path, "evil")
    result = oelm_cli(tmp_path, "inspect", str(folder), "--config-only")
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert PROMPT not in out and not marker.exists() and "Traceback" not in out
    errors = [line for line in result.stderr.splitlines() if line.startswith("oelm: error:")]
    assert len(errors) == 1 and result.stderr.rstrip().splitlines()[-1] == errors[0], result.stderr
    assert f"the directory {folder} has a config.json whose model_type 'evil'" in errors[0]
    assert "auto_map" in errors[0] and "model.trust_remote_code: true" in errors[0]
    assert "not a local directory" not in errors[0]


@pytest.fixture
def spy_loaders(monkeypatch):
    """Every trust_remote_code that reaches transformers' config/model loaders ("<not passed>" if absent)."""
    seen: list[tuple[str, object]] = []

    def spy(owner, name):
        real = getattr(owner, name).__func__

        def wrapper(cls, *args, **kwargs):
            seen.append((f"{cls.__name__}.{name}", kwargs.get("trust_remote_code", "<not passed>")))
            return real(cls, *args, **kwargs)

        monkeypatch.setattr(owner, name, classmethod(wrapper))

    spy(T.AutoConfig, "from_pretrained")
    spy(T.AutoModel, "from_config")
    spy(T.AutoModel, "from_pretrained")
    spy(T.PreTrainedModel, "from_pretrained")
    return seen


def test_every_loader_call_says_trust_remote_code_false(tmp_path, spy_loaders, capsys):
    from oelm.cli import main

    torch.manual_seed(0)
    source = tmp_path / "gpt2"
    T.GPT2LMHeadModel(T.GPT2Config(**TINY_GPT2)).save_pretrained(source)
    assert main(["inspect", str(source), "--config-only", "--method", "baseline"]) == 0
    assert main(["inspect", str(source), "--method", "baseline"]) == 0  # checkpoint weights: GPT2LMHeadModel.from_pretrained
    capsys.readouterr()

    model = T.GPT2LMHeadModel.from_pretrained(source, trust_remote_code=False)
    oelm.apply_oelm(model, "oelm_freeze", seed=0)
    oelm.save_pretrained(model, tmp_path / "lean", source=str(source))
    spy_loaders.clear()
    oelm.load_oelm(tmp_path / "lean")  # rebuilds the base from the recorded source
    calls = spy_loaders
    assert calls and all(value is False for _, value in calls), calls


def test_an_existing_directory_is_described_not_called_missing(tmp_path, capsys):
    from oelm.cli import main
    from oelm.models.pretrained import load_pretrained

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["inspect", str(empty), "--config-only"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("oelm: error: ") and "\n" not in err
    assert f"the directory {empty} has no config.json (it holds nothing)" in err and "not a local directory" not in err

    torch.manual_seed(0)
    T.GPT2Config(**TINY_GPT2).save_pretrained(tmp_path / "no-weights")  # config.json only
    assert main(["inspect", str(tmp_path / "no-weights")]) == 2
    err = capsys.readouterr().err.strip()
    assert "the directory" in err and "cannot be loaded by transformers" in err and "model.safetensors" in err
    assert "not a local directory" not in err

    (tmp_path / "bad-json").mkdir()
    (tmp_path / "bad-json" / "config.json").write_text("{not json")
    assert main(["inspect", str(tmp_path / "bad-json"), "--config-only"]) == 2
    assert "has a config.json that is not valid JSON" in capsys.readouterr().err

    # the library path gives the same description (the tokenizer is passed in: the model load is what fails)
    with pytest.raises(DataFormatError, match=r"the directory .*no-weights holds no weights \(none of model\.safetensors"):
        load_pretrained(str(tmp_path / "no-weights"), "causal_lm", tokenizer=SimpleNamespace(pad_token_id=None))
