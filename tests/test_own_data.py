"""Your own data (issue 36, item 7): a config names a dataset by its files (CSV, TSV, JSON lines,
Parquet; .txt / .txt.gz for language modelling) or by a Hugging Face ``datasets`` id, with its
columns (``task.source``). It runs end to end like a shipped dataset, and it is checked like one:
a missing column, an empty split, labels out of range, a missing file are each one line.

Real data throughout: SST-2 sentences written as CSV, XNLI English pairs as JSON lines,
TinyStories stories as plain text, under tmp_path.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from oelm.cli import main
from oelm.config import config_from_dict
from oelm.data import get_dataset_spec, load_classification, load_documents
from oelm.data.lm import EOS_TOKEN
from oelm.errors import ConfigError

TINY_GPT = {"gpt": "gpt-tiny", "gpt_overrides": {"hidden_size": 32, "num_layers": 2, "num_heads": 2,
                                                 "intermediate_size": 64, "dropout": 0.0}}
TRAINING = {"max_steps": 3, "batch_size": 16, "eval_every": 3, "log_every": 3, "timing_warmup_steps": 1,
            "progress_bar": False, "tensorboard": False}


pytestmark = pytest.mark.usefixtures("forget_own_datasets")  # tests/conftest.py


@pytest.fixture(scope="module")
def sst2(data_dir):
    return {split: pd.read_parquet(data_dir / "sst2" / f"{split}.parquet") for split in ("train", "validation")}


def _config(tmp_path: Path, task: dict, name: str = "own") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps({"name": name, "task": task, "model": TINY_GPT,
                                "methods": [{"name": "baseline", "learning_rate": 2.0e-3},
                                            {"name": "oelm_freeze", "learning_rate": 2.0e-3}],
                                "seeds": [0], "training": TRAINING}))
    return path


def _run(config: Path, out: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["run", str(config), "--output-dir", str(out)])
    return code, capsys.readouterr().err


def test_a_config_with_your_own_csv_dataset_runs_end_to_end(sst2, tmp_path, monkeypatch, capsys):
    """Relative paths (resolved against the working directory), a sentence column of another name,
    test labels written as label names: the matrix trains, selects, tests and reports."""
    train = sst2["train"].iloc[:200].rename(columns={"text": "sentence"})
    dev = sst2["validation"].iloc[:64].rename(columns={"text": "sentence"})
    test = sst2["validation"].iloc[64:128].rename(columns={"text": "sentence"})
    (tmp_path / "reviews").mkdir()
    train.to_csv(tmp_path / "reviews" / "train.csv", index=False)
    dev.to_csv(tmp_path / "reviews" / "dev.csv", index=False)
    test.assign(label=test["label"].map({0: "negative", 1: "positive"})).to_csv(tmp_path / "reviews" / "test.csv", index=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OELM_DATA_DIR")  # your own files need no data dir
    config = _config(tmp_path, {
        "dataset": "my-reviews", "validation_split": "dev", "test_split": "test", "tokenizer": "bpe-512", "max_length": 32,
        "source": {"files": {"train": "reviews/train.csv", "dev": "reviews/dev.csv", "test": "reviews/test.csv"},
                   "text_columns": ["sentence"], "label_names": ["negative", "positive"]}})
    code, err = _run(config, tmp_path / "out", capsys)
    assert code == 0, err
    out = tmp_path / "out"
    comparison = json.loads((out / "comparison.json").read_text())
    assert set(comparison["methods"]) >= {"baseline", "oelm_freeze"} and (out / "report.md").is_file()
    for path in out.glob("runs/*/result.json"):
        result = json.loads(path.read_text())
        assert result["status"] == "finished" and result["task"] == "my-reviews"
        data = result["data"]
        assert (data["train"]["examples"], data["validation"]["examples"], data["test"]["examples"]) == (200, 64, 64)
        assert data["test"]["label_counts"] == {"negative": int((test["label"] == 0).sum()),
                                                "positive": int((test["label"] == 1).sum())}
        assert result["performance"]["test"] is not None and 0 <= result["performance"]["best_validation"] <= 100
        assert [f["path"] for f in result["data_source"]["splits"]["train"]["files"]] == [str(tmp_path / "reviews" / "train.csv")]
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["task"]["source"]["files"]["train"] == str(tmp_path / "reviews" / "train.csv")  # absolute once read


def test_language_modelling_text_files_run_end_to_end(data_dir, tmp_path, monkeypatch, capsys):
    """.txt (stories separated by <|endoftext|>) for train, .txt.gz for validation: a language
    modelling task without saying so; the documents are exactly the stories written."""
    stories = load_documents("tinystories", "train", data_dir)
    train, validation = stories[:60], stories[60:80]
    (tmp_path / "train.txt").write_text(f"\n{EOS_TOKEN}\n".join(train), encoding="utf-8")
    (tmp_path / "valid.txt.gz").write_bytes(gzip.compress(f"\n{EOS_TOKEN}\n".join(validation).encode("utf-8")))
    task = {"dataset": "my-stories", "tokenizer": "bpe-512", "block_size": 32,
            "source": {"files": {"train": str(tmp_path / "train.txt"), "validation": str(tmp_path / "valid.txt.gz")}}}
    config = config_from_dict({"name": "s", "task": task, "model": TINY_GPT, "methods": [{"name": "baseline"}]})
    assert get_dataset_spec("my-stories").task_type == "language_modeling" and config.task.source.type is None
    assert load_documents("my-stories", "train") == train and load_documents("my-stories", "validation") == validation
    code, err = _run(_config(tmp_path, task, "stories"), tmp_path / "out", capsys)
    assert code == 0, err
    result = json.loads(next((tmp_path / "out").glob("runs/baseline-*/result.json")).read_text())
    assert result["performance"]["metric"] == "perplexity" and result["data"]["train"]["documents"] == 60
    assert result["performance"]["best_validation"] > 1


def test_sentence_pairs_from_json_lines(data_dir, tmp_path):
    """XNLI's English validation pairs as JSON lines with their own column names and label names."""
    pairs = load_classification("xnli", "validation", data_dir).iloc[:50]
    names = ["entailment", "neutral", "contradiction"]
    with open(tmp_path / "pairs.jsonl", "w", encoding="utf-8") as f:
        for row in pairs.itertuples():
            f.write(json.dumps({"premise": row.sentence1, "hypothesis": row.sentence2, "gold": names[row.label]}) + "\n")
    config_from_dict({"name": "p", "model": TINY_GPT, "methods": [{"name": "baseline"}], "task": {
        "dataset": "my-pairs", "source": {"files": {"train": str(tmp_path / "pairs.jsonl")}, "validation_holdout": 0.2,
                                          "text_columns": ["premise", "hypothesis"], "label_column": "gold",
                                          "label_names": names}}})
    rows = load_classification("my-pairs", "train")
    held = load_classification("my-pairs", "validation")
    assert len(rows) == 40 and len(held) == 10 and list(rows.columns) == ["premise", "hypothesis", "label"]
    both = pd.concat([rows, held]).sort_values(["premise", "hypothesis"]).reset_index(drop=True)
    expected = pairs.rename(columns={"sentence1": "premise", "sentence2": "hypothesis"}).sort_values(["premise", "hypothesis"])
    assert both.values.tolist() == expected.reset_index(drop=True).values.tolist()


def test_a_hugging_face_datasets_id_with_its_config_and_columns(sst2, monkeypatch):
    """The Hub form: `hub`, `hub_config`, `hub_splits`, columns. The Hub is unreachable here, so
    ``datasets.load_dataset`` serves real SST-2 rows as the Hub would (GLUE's column names)."""
    import datasets

    import oelm.data.registry as registry

    calls = []

    def load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        frame = sst2["train" if split == "train" else "validation"].iloc[:30]
        return datasets.Dataset.from_dict({"sentence": frame["text"].tolist(), "label": frame["label"].tolist()})

    monkeypatch.setattr(registry, "hub_offline", lambda: False)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    config_from_dict({"name": "h", "model": TINY_GPT, "methods": [{"name": "baseline"}], "task": {
        "dataset": "glue-sst2", "source": {"hub": "nyu-mll/glue", "hub_config": "sst2", "text_columns": ["sentence"],
                                           "hub_splits": {"train": "train", "validation": "validation"}}}})
    frame = load_classification("glue-sst2", "validation")
    assert calls == [("nyu-mll/glue", "sst2", "validation")]
    assert frame["sentence"].tolist() == sst2["validation"]["text"].iloc[:30].tolist()


@pytest.mark.parametrize("case, expected", [
    ("missing column", r"my-data/train \(.*train\.csv\): missing column\(s\) \['label'\]; found \['text', 'stars'\]\. "
                       r"Expected columns \['text', 'label'\] \(set task\.source\.text_columns and task\.source\.label_column"),
    ("empty split", r"my-data/validation \(.*dev\.csv\): the split has no rows\. Fix: give a file with at least one example"),
    ("label out of range", r"my-data/train \(.*\): 1 label\(s\) out of range, e\.g\. \[2\]; labels must be 0\.\.1 "
                           r"\(negative, positive\)"),
    ("unknown label name", r"my-data/train \(.*\): column 'label' holds 'meh', which is neither a class id"),
    ("missing file", r"my-data/validation: .*dev\.csv does not exist\. Fix: correct the path in task\.source\.files"),
])
def test_bad_own_data_is_one_line(sst2, tmp_path, capsys, case, expected):
    """Each found when the data is prepared, before any run: exit 2, one `oelm: error:` line."""
    train = sst2["train"].iloc[:40].copy()
    dev = sst2["validation"].iloc[:20].copy()
    if case == "missing column":
        train = train.rename(columns={"label": "stars"})
    elif case == "empty split":
        dev = dev.iloc[:0]
    elif case == "label out of range":
        train.loc[train.index[7], "label"] = 2
    elif case == "unknown label name":
        train["label"] = train["label"].map({0: "negative", 1: "positive"})
        train.loc[train.index[3], "label"] = "meh"
    train.to_csv(tmp_path / "train.csv", index=False)
    if case != "missing file":
        dev.to_csv(tmp_path / "dev.csv", index=False)
    config = _config(tmp_path, {"dataset": "my-data", "tokenizer": "bpe-512", "source": {
        "files": {"train": str(tmp_path / "train.csv"), "validation": str(tmp_path / "dev.csv")},
        "label_names": ["negative", "positive"]}})
    code, err = _run(config, tmp_path / "out", capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("oelm: error: ")
    assert re.search(expected, lines[0]), lines[0]
    assert not list((tmp_path / "out").glob("runs/*/result.json"))


@pytest.mark.parametrize("source, expected", [
    ({"files": {"train": "a.xlsx"}}, r"task\.source\.files: .*a\.xlsx: unknown file type; use \.csv, \.tsv, \.jsonl"),
    ({"files": {"train": "a.txt", "validation": "b.txt"}, "type": "classification"},
     r"a classification dataset needs tables with text and label columns"),
    ({"files": {"train": ["a.csv", "b.parquet"], "validation": "c.csv"}}, r"the files of one split must have one format"),
    ({"files": {"train": "a.csv"}}, r"task\.validation_split: dataset 'mine' has no split 'validation'; available: train; "
                                    r"name its file in task\.source\.files\.validation or hold validation out of train"),
    ({"hub": "x/y", "files": {"train": "a.csv"}}, r"give exactly one of files .* and hub"),
    ({"files": {"train": "a.txt", "validation": "b.txt"}, "label_names": ["a", "b"]}, r"labels belong to classification"),
])
def test_a_bad_source_is_refused_when_the_config_is_read(source, expected):
    with pytest.raises(ConfigError, match=expected):
        config_from_dict({"name": "x", "model": TINY_GPT, "methods": [{"name": "baseline"}],
                          "task": {"dataset": "mine", "source": source}})


def test_a_shipped_dataset_name_cannot_be_taken():
    with pytest.raises(ConfigError, match=r"task\.dataset 'sst2' is a registered dataset .*; give your own data another name"):
        config_from_dict({"name": "x", "model": TINY_GPT, "methods": [{"name": "baseline"}],
                          "task": {"dataset": "sst2", "source": {"files": {"train": "a.csv", "validation": "b.csv"}}}})
    assert get_dataset_spec("sst2").local_files["train"] == ("sst2/train.parquet",)  # untouched
