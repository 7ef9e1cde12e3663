"""Pretrained-model directories that cannot be a model (issue 26, item 4): each is one line naming
the directory, what is missing or damaged, what it holds, and the fix, before transformers is
asked. Before, an empty directory was told to install sentencepiece, one without tokenizer files
got a tokenizer with no vocabulary and then "the validation split has fewer tokens than one
block", and a truncated model.safetensors was a SafetensorError traceback.

The models are tiny GPT-2s built offline; the tokenizer is the real GPT-2 one from the data dir.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import transformers as T

from oelm.errors import DataFormatError
from oelm.models.pretrained import load_pretrained, load_tokenizer

TINY_GPT2 = dict(vocab_size=50257, n_embd=32, n_layer=1, n_head=2, n_positions=64)


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory, data_dir) -> Path:
    """A complete tiny GPT-2 checkpoint: config.json, model.safetensors, tokenizer files."""
    folder = tmp_path_factory.mktemp("models") / "gpt2"
    torch.manual_seed(0)
    T.GPT2LMHeadModel(T.GPT2Config(**TINY_GPT2)).save_pretrained(folder)
    T.GPT2TokenizerFast.from_pretrained(str(data_dir / "tokenizers" / "gpt2")).save_pretrained(folder)
    return folder


def _copy_without(good: Path, tmp: Path, *drop: str) -> Path:
    folder = tmp / "model"
    shutil.copytree(good, folder)
    for name in drop:
        for p in folder.glob(name):
            p.unlink()
    return folder


def _one_line(info) -> str:
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_the_complete_directory_loads(good_dir):
    model, tokenizer = load_pretrained(str(good_dir), "causal_lm")
    assert tokenizer("Once upon a time")["input_ids"] == [7454, 2402, 257, 640]
    assert model.config.model_type == "gpt2"


def test_directory_without_a_model_says_so_and_lists_it(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "README.md").write_text("my experiment notes\n")
    with pytest.raises(DataFormatError) as info:
        load_pretrained(str(folder), "causal_lm")
    msg = _one_line(info)
    assert f"the directory {folder} holds no model: it has no config.json (it holds README.md)" in msg
    assert "sentencepiece" not in msg


def test_directory_without_tokenizer_files_is_refused_before_a_vocabulary_less_tokenizer(good_dir, tmp_path):
    folder = _copy_without(good_dir, tmp_path, "tokenizer*", "vocab*", "merges*", "special_tokens_map.json")
    with pytest.raises(DataFormatError) as info:
        load_tokenizer(str(folder))
    msg = _one_line(info)
    assert f"the directory {folder} has no tokenizer files" in msg and "config.json, generation_config.json, model.safetensors" in msg
    assert f"tokenizer.save_pretrained('{folder}')" in msg


def test_directory_without_weights_is_refused(good_dir, tmp_path):
    folder = _copy_without(good_dir, tmp_path, "model.safetensors")
    with pytest.raises(DataFormatError) as info:
        load_pretrained(str(folder), "causal_lm")
    assert f"the directory {folder} holds no weights (none of model.safetensors" in _one_line(info)


def test_truncated_safetensors_is_named_not_a_traceback(good_dir, tmp_path):
    folder = _copy_without(good_dir, tmp_path)
    weights = folder / "model.safetensors"
    full = weights.stat().st_size
    with open(weights, "r+b") as f:
        f.truncate(full // 2)  # a copy cut short
    with pytest.raises(DataFormatError) as info:
        load_pretrained(str(folder), "causal_lm")
    msg = _one_line(info)
    assert f"the weights file {weights} is damaged: its header describes {full:,} bytes, the file has {full // 2:,}" in msg


def test_model_type_transformers_does_not_know_is_named(good_dir, tmp_path):
    folder = _copy_without(good_dir, tmp_path)
    config = folder / "config.json"
    config.write_text(config.read_text().replace('"model_type": "gpt2"', '"model_type": "my-gpt"'))
    with pytest.raises(DataFormatError) as info:
        load_pretrained(str(folder), "causal_lm")
    msg = _one_line(info)
    assert f"the directory {folder} has model_type 'my-gpt', which transformers {T.__version__} does not know" in msg


def test_model_type_oelm_has_no_architecture_for_says_how_to_add_it(tmp_path, data_dir, capsys):
    """A model transformers knows and oelm does not (BLOOM): the run stops naming the type, the
    registered families and both ways to add one, not with a data error."""
    from oelm.cli import main

    folder = tmp_path / "bloom"
    torch.manual_seed(0)
    T.BloomForCausalLM(T.BloomConfig(vocab_size=50257, hidden_size=32, n_layer=1, n_head=2)).save_pretrained(folder)
    T.GPT2TokenizerFast.from_pretrained(str(data_dir / "tokenizers" / "gpt2")).save_pretrained(folder)
    cfg = tmp_path / "bloom.yaml"
    cfg.write_text(
        "name: bloom\ntask: {dataset: tinystories, train_samples: 8, validation_samples: 4, block_size: 32}\n"
        f"model: {{pretrained: {folder}}}\nmethods: [{{name: oelm_freeze}}]\nseeds: [0]\n"
        "training: {max_steps: 1, batch_size: 2, progress_bar: false, tensorboard: false}\n")
    code = main(["run", str(cfg), "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert code == 2 and line.startswith("oelm: error: oelm does not know where the attention query/key projections")
    assert "model_type='bloom'" in line and "gpt2, gpt_neox" in line and "register_architecture" in line
    assert "model: {architecture:" in line and "fewer tokens than one block" not in err


def test_tokenizer_without_vocabulary_is_named_not_fewer_tokens_than_a_block(data_dir):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from oelm.config import config_from_dict
    from oelm.matrix.data import prepare_data

    backend = Tokenizer(models.BPE())  # no vocabulary, no merges: every text encodes to []
    backend.pre_tokenizer = pre_tokenizers.ByteLevel()
    empty = T.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<eos>")
    config = config_from_dict({
        "name": "no-vocab", "task": {"dataset": "tinystories", "train_samples": 4, "validation_samples": 4, "block_size": 16},
        "model": {"pretrained": "some/model"}, "methods": [{"name": "baseline"}]})
    with pytest.raises(DataFormatError) as info:
        prepare_data(config, tokenizer=empty)
    msg = _one_line(info)
    assert "turns text into no tokens at all" in msg and "-> []" in msg and "fewer tokens than one block" not in msg


def test_a_tokenizer_larger_than_the_embedding_is_refused_before_training(good_dir, tmp_path):
    """GPT-2's 50,257-id tokenizer beside a model with vocab_size 100: an IndexError traceback at
    the first training step before."""
    folder = tmp_path / "small-vocab"
    torch.manual_seed(0)
    T.GPT2LMHeadModel(T.GPT2Config(**(TINY_GPT2 | {"vocab_size": 100}))).save_pretrained(folder)
    for f in good_dir.glob("tokenizer*"):
        shutil.copyfile(f, folder / f.name)
    with pytest.raises(DataFormatError) as info:
        load_pretrained(str(folder), "causal_lm")
    assert "its tokenizer has 50,257 ids but the model's input embedding has 100 rows" in _one_line(info)
