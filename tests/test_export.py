"""``oelm export RUN_DIR OUT`` (issue 46, item 6): a real finished run (MiniLM on SST-2, a few
steps) exported and reloaded by a stock ``AutoModelForSequenceClassification.from_pretrained`` in a
process that never imports oelm reproduces the run's validation metric exactly, example by
example; the model card's metadata names the run's numbers; oelm's GPT and bad folders are refused
in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from oelm.cli import main
from oelm.config import load_config
from oelm.data import load_classification, subsample

ROOT = Path(__file__).resolve().parents[1]
TINY_SST2 = [
    "task.train_samples=64", "task.validation_samples=40", "task.test_split=test", "task.test_samples=24",
    "training.max_steps=6", "training.batch_size=16",
    "training.eval_every=3", "training.log_every=3", "training.timing_warmup_steps=1", "training.progress_bar=false",
    "methods=[{name: oelm_freeze, learning_rate: 3.0e-4}]",
]

# The stock side: transformers only. It prints the logits' margins and predictions of the exported
# model on the texts it is given, and whether anything of oelm was imported.
STOCK = r"""
import json, sys
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
job = json.load(open(sys.argv[1]))
model = AutoModelForSequenceClassification.from_pretrained(sys.argv[2]).eval()
tok = AutoTokenizer.from_pretrained(sys.argv[2])
predictions, margins = [], []
with torch.no_grad():
    for text, label in zip(job["texts"], job["labels"]):
        enc = tok(text, truncation=True, max_length=job["max_length"], return_tensors="pt")
        logits = model(**enc).logits[0]
        others = torch.cat([logits[:label], logits[label + 1:]])
        predictions.append(int(logits.argmax()))
        margins.append(float(logits[label] - others.max()))
print(json.dumps({"predictions": predictions, "margins": margins, "id2label": model.config.id2label,
                  "oelm_imported": sorted(m for m in sys.modules if m == "oelm" or m.startswith("oelm."))}))
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("export")
    assert main(["run", str(ROOT / "configs/quickstart.yaml"), "--output-dir", str(out / "matrix"), *TINY_SST2]) == 0
    run_dir = out / "matrix" / "runs" / "oelm_freeze-seed0"
    assert main(["export", str(run_dir), str(out / "hf")]) == 0
    return run_dir, out / "hf"


def test_a_stock_loader_reproduces_the_run_s_validation_metric_example_by_example(exported, tmp_path):
    run_dir, hf = exported
    result = json.loads((run_dir / "result.json").read_text())
    config = load_config(run_dir.parents[1] / "config.yaml")
    task = config.task
    # the validation examples the run saw, in its order (predictions.npz's index is the row here)
    frame = subsample(load_classification(task.dataset, task.validation_split, task.data_dir),
                      task.validation_samples, task.subset_seed)
    kept = np.load(run_dir / "predictions.npz")
    order = kept["validation/index"]
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"texts": frame["text"].iloc[order].tolist(), "labels": kept["validation/label"].tolist(),
                               "max_length": task.max_length}))
    done = subprocess.run([sys.executable, "-c", STOCK, str(job), str(hf)], capture_output=True, text=True,
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    stock = json.loads(done.stdout.strip().splitlines()[-1])
    assert stock["oelm_imported"] == []
    assert stock["predictions"] == kept["validation/prediction"].tolist()  # same examples, same answers
    np.testing.assert_allclose(stock["margins"], kept["validation/margin"], atol=1e-4)
    accuracy = 100 * float(np.mean(np.array(stock["predictions"]) == kept["validation/label"]))
    assert accuracy == result["performance"]["best_validation"]
    assert stock["id2label"] == {"0": "negative", "1": "positive"}


def test_the_model_card_names_the_run_s_numbers(exported):
    from huggingface_hub import ModelCard  # the Hub's own reader of a card's metadata

    run_dir, hf = exported
    performance = json.loads((run_dir / "result.json").read_text())["performance"]
    card = ModelCard.load(hf / "README.md")
    meta = card.data
    assert meta.library_name == "transformers" and meta.pipeline_tag == "text-classification"
    assert meta.base_model == "sentence-transformers/all-MiniLM-L6-v2" and meta.datasets == ["nyu-mll/glue"]
    results = {r.dataset_split: r for r in meta.eval_results}
    assert set(results) == {"validation", "test"}
    for split, value in (("validation", performance["best_validation"]), ("test", performance["test"])):
        r = results[split]
        assert (r.task_type, r.dataset_type, r.dataset_name, r.dataset_config, r.metric_type) == (
            "text-classification", "nyu-mll/glue", "sst2", "sst2", "accuracy")
        assert r.metric_value == round(value / 100, 6)  # a fraction, as evaluate's accuracy
        assert f"{value:.4f}%" in card.text  # the run's own unit in the table
    text = card.text
    assert "oelm run oelm_config.yaml --output-dir reproduce --only oelm_freeze-seed0" in text
    result = json.loads((run_dir / "result.json").read_text())
    assert f"torch {result['environment']['packages']['torch']}" in text
    assert "init: orthogonalize" in text  # the method's settings
    assert (hf / "oelm_config.yaml").read_text() == (run_dir.parents[1] / "config.yaml").read_text()
    assert "oelm" not in json.loads((hf / "config.json").read_text())  # no recipe left for a stock loader


def test_bad_folders_are_refused_in_one_line(exported, tmp_path, capsys):
    run_dir, hf = exported
    cases = [
        ([str(run_dir), str(hf)], "is not an empty folder"),                       # never over an existing export
        ([str(run_dir.parents[1]), str(tmp_path / "a")], "give one run's folder"),  # the matrix, not a run
        ([str(tmp_path), str(tmp_path / "b")], "not an oelm run folder"),
        ([str(run_dir), str(tmp_path / "link")], "is a symbolic link"),            # never where a link points
    ]
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    for argv, message in cases:
        capsys.readouterr()
        assert main(["export", *argv]) == 2  # oelm's error exit
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and not any((tmp_path / "empty").iterdir())


def test_oelm_s_gpt_is_refused_with_what_to_use(tmp_path, capsys):
    run = tmp_path / "m" / "runs" / "baseline-seed0"
    run.mkdir(parents=True)
    (tmp_path / "m" / "config.yaml").write_text(
        "name: g\ntask: {dataset: tinystories}\nmodel: {gpt: gpt-tiny}\nmethods: [{name: baseline}]\nseeds: [0]\n")
    (run / "result.json").write_text(json.dumps({"run_name": "baseline-seed0", "method": "baseline", "seed": 0,
                                                 "status": "finished"}))
    assert main(["export", str(run), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "oelm's own GPT" in err and "trust_remote_code" in err and "load_model" in err
    assert not (tmp_path / "out").exists()
