"""``oelm init --suite --task`` with your own data (issue 46, item 7): ``--task`` takes a data spec
as a config's ``task:`` does (``{dataset: NAME, source: {files: ...}}``, inline or in a YAML file),
not only a registered dataset's name. The written config reads your files (real SST-2 sentences
written as CSV here), holds their test split, and trains; a bad spec is one line naming the key."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import yaml

from oelm.cli import main
from oelm.config import load_config
from oelm.data import load_classification


@pytest.fixture
def own_csv(tmp_path, data_dir) -> dict[str, Path]:
    """Real SST-2 sentences as three CSV files of your own (review, stars columns)."""
    files = {}
    for split, n in (("train", 48), ("validation", 24), ("test", 24)):
        frame = load_classification("sst2", split, str(data_dir)).head(n).rename(columns={"text": "review", "label": "stars"})
        files[split] = tmp_path / "mine" / f"{split}.csv"
        files[split].parent.mkdir(exist_ok=True)
        frame[["review", "stars"]].to_csv(files[split], index=False)
    return files


def _spec(files: dict[str, Path], relative_to: Path | None = None) -> dict:
    paths = {k: str(p.relative_to(relative_to) if relative_to else p) for k, p in files.items()}
    return {"dataset": "my-reviews", "source": {"files": paths, "text_columns": ["review"], "label_column": "stars",
                                                "label_names": ["negative", "positive"]}}


def test_an_inline_data_spec_writes_a_suite_over_your_files_that_trains(tmp_path, own_csv, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths resolve against the working directory, as in a config
    spec = json.dumps(_spec(own_csv, relative_to=tmp_path))
    path = tmp_path / "own-suite.yaml"
    assert main(["init", str(path), "--suite", "frozen-attention", "--model", "gpt-tiny", "--task", spec]) == 0
    config = load_config(path)
    assert config.task.dataset == "my-reviews" and config.task.test_split == "test"
    assert config.task.source.files == {k: str(p) for k, p in own_csv.items()}  # absolute in the file
    assert config.task.source.text_columns == ["review"] and config.task.source.label_column == "stars"
    assert config.targets["oelm_freeze"].accuracy_gap_min == -2.0  # a classification task's target
    assert "my-reviews (your own data)" in path.read_text()
    out = tmp_path / "out"
    with redirect_stdout(io.StringIO()):
        assert main(["run", str(path), "--output-dir", str(out), "training.max_steps=2", "seeds=[0]", "learning_rates=[1e-3]",
                     "methods=[{name: baseline}, {name: oelm_freeze}]", "training.progress_bar=false",
                     "task.tokenizer=bpe-300"]) == 0
    result = json.loads((out / "runs" / "oelm_freeze-seed0" / "result.json").read_text())
    assert result["task"] == "my-reviews" and result["data"]["train"]["examples"] == 48
    assert result["performance"]["test"] is not None  # your test file, evaluated once


def test_a_yaml_file_holding_the_task_is_a_data_spec_too(tmp_path, own_csv):
    spec_file = tmp_path / "data.yaml"
    spec_file.write_text(yaml.safe_dump({"task": _spec(own_csv)}))
    path = tmp_path / "s.yaml"
    assert main(["init", str(path), "--suite", "frozen-attention", "--model", "sentence-transformers/all-MiniLM-L6-v2",
                 "--task", str(spec_file)]) == 0
    config = load_config(path)
    assert config.task.source.files["test"] == str(own_csv["test"]) and config.model.pretrained


@pytest.mark.parametrize(("task", "needle"), [
    ("{dataset: x, source: {files: {train: a.csv}, text_colums: [t]}}", "task.source.text_colums: Extra inputs"),
    ("{dataset: x}", "give a registered dataset's name, or your own data as"),
    ("{dataset: x, source: {files: {train: a.csv}}, max_length: 64}", "max_length: the suite writes the task's other keys"),
    ("{dataset: x, source: {files: {train: a.csv]}", "not valid YAML"),
    ("missing.yaml", "--task missing.yaml: cannot read it"),
])
def test_a_bad_data_spec_is_one_line(tmp_path, capsys, monkeypatch, task, needle):
    monkeypatch.chdir(tmp_path)
    assert main(["init", "x.yaml", "--suite", "frozen-attention", "--model", "gpt-tiny", "--task", task]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "x.yaml").exists()
