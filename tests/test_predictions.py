"""Per-example predictions of final runs (oelm.training.prediction_collector, oelm.records.predictions): written by
real short runs (gpt-tiny on real SST-2 and TinyStories), checked against the numbers the runs
recorded, their checksums verified, a damaged file refused in one line; LM token accuracy against a
hand count on a tiny batch."""

from __future__ import annotations

import contextlib
import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from _tiny_lm import tiny_lm_overrides
from _tiny_matrix import write_config
from oelm.cli import main
from oelm.errors import ChecksumError, DamagedFileError, RecordedFileMissingError
from oelm.io import sha256_file
from oelm.records.predictions import PREDICTIONS_FILE, read_predictions
from oelm.training.evaluation import _gathered_sums, evaluate
from oelm.training.prediction_collector import PredictionCollector

ROOT = Path(__file__).resolve().parents[1]


def _result(run: Path) -> dict:
    return json.loads((run / "result.json").read_text())


@pytest.fixture(scope="module")
def cls_matrix(tmp_path_factory, data_dir):
    """The tiny SST-2 matrix: baseline swept over 2 rates (the selected sweep run is promoted),
    OELM-Freeze and OELM-Random trained as final runs; a test split."""
    out = tmp_path_factory.mktemp("preds_cls")
    assert main(["run", str(write_config(out)), "--output-dir", str(out / "m")]) == 0
    return out / "m"


def test_final_runs_save_predictions_that_reproduce_their_numbers(cls_matrix):
    finals = [p.parent for p in cls_matrix.glob("runs/*/result.json") if _result(p.parent)["stage"] == "final"]
    assert len(finals) == 3 and any(_result(r).get("swept") for r in finals)  # a promoted run among them
    for run in finals:
        result = _result(run)
        record = result["predictions"]
        assert record["sha256"] == sha256_file(run / PREDICTIONS_FILE) and record["bytes"] == (run / PREDICTIONS_FILE).stat().st_size
        p = read_predictions(run, result)
        assert p.task_type == "classification" and p.meta["step"] == result["performance"]["best_step"]
        for split, key, size in (("validation", "best_validation", 32), ("test", "test", 1821)):
            cols = p.split(split)
            assert sorted(cols["index"]) == list(range(size))  # every example once, by its row in the split
            assert 100 * np.mean(cols["label"] == cols["prediction"]) == pytest.approx(result["performance"][key], abs=1e-9)
            right = cols["label"] == cols["prediction"]
            assert np.all((cols["margin"] > 0) == right)  # the label's logit beats every other one exactly when right
            assert np.allclose(cols["loss"], np.log1p(np.exp(-cols["margin"])), atol=1e-5)  # two classes: CE = softplus(-margin)
            assert p.meta["splits"][split]["loss"] == pytest.approx(float(np.mean(cols["loss"])), rel=1e-5)
        counts = result["data"]["validation"]["label_counts"]
        assert sorted(np.bincount(p.split("validation")["label"]).tolist()) == sorted(counts.values())
    sweep_only = [p.parent for p in cls_matrix.glob("runs/*/result.json") if _result(p.parent)["stage"] == "sweep"]
    assert sweep_only and all(_result(r)["predictions"] is None and not (r / PREDICTIONS_FILE).exists() for r in sweep_only)


def test_methods_pair_by_example_index(cls_matrix):
    """Every final run labels the same examples with the same index (the report pairs on it)."""
    labels = []
    for run in sorted(cls_matrix.glob("runs/*/predictions.npz")):
        cols = read_predictions(run.parent, _result(run.parent)).split("test")
        order = np.argsort(cols["index"])
        labels.append(cols["label"][order])
    assert len(labels) == 3 and all(np.array_equal(labels[0], x) for x in labels[1:])


def test_a_damaged_predictions_file_is_refused_in_one_line(cls_matrix, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(next(cls_matrix.glob("runs/oelm_freeze-seed0")), run)
    result = _result(run)
    path = run / PREDICTIONS_FILE
    good = path.read_bytes()
    path.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # one bit flipped
    with pytest.raises(ChecksumError) as info:
        read_predictions(run, result)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and "is corrupted" in message and "result.json" in message
    path.unlink()
    with pytest.raises(RecordedFileMissingError, match="is missing, but .*result.json records it"):
        read_predictions(run, result)
    path.write_bytes(b"not a zip archive")  # matches a (rewritten) record, but is no predictions file
    result["predictions"] = result["predictions"] | {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    with pytest.raises(DamagedFileError) as info:
        read_predictions(run, result)
    assert "\n" not in str(info.value) and "is damaged" in str(info.value)
    assert read_predictions(run, {"predictions": None}) is None  # a run that saved none (older, or a sweep run)


@pytest.fixture(scope="module")
def lm_matrix(tmp_path_factory, data_dir):
    """The tiny TinyStories matrix, with a test split held out from the validation stories."""
    out = tmp_path_factory.mktemp("preds_lm")
    assert main(["run", str(ROOT / "configs/tinystories-tiny.yaml"), "--output-dir", str(out), *tiny_lm_overrides(6, 2),
                 "task.test_split=validation", "task.test_samples=6", "seeds=[0]"]) == 0
    return out


def test_lm_predictions_are_per_document_and_reproduce_perplexity_and_token_accuracy(lm_matrix):
    for run in sorted(lm_matrix.glob("runs/*-seed0")):
        result = _result(run)
        p = read_predictions(run, result)
        assert p.task_type == "language_modeling" and p.meta["eos_token_id"] is not None
        perf = result["performance"]
        for split, value, docs in (("validation", perf["best_validation"], 12), ("test", perf["test"], 6)):
            cols = p.split(split)
            tokens = result["data"][split]["tokens"]
            blocks = result["data"][split]["blocks"]
            assert cols["tokens"].sum() == tokens - blocks  # every token of a block but its first is predicted
            # one row per story (the packing cuts only the last one short): numbered 0..n-1 across blocks
            assert result["data"][split]["documents"] == docs
            assert cols["document"].tolist() == list(range(docs))
            ppl = math.exp(float(np.sum(cols["loss"] * cols["tokens"]) / cols["tokens"].sum()))
            assert ppl == pytest.approx(value, rel=1e-5)
            accuracy = 100 * cols["correct"].sum() / cols["tokens"].sum()
            assert accuracy == pytest.approx(perf["token_accuracy"]["best_validation" if split == "validation" else "test"])
        # the eval records carry the token accuracy beside perplexity, and the training progress of each validation
        evals = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if '"eval"' in l]
        assert all("token_accuracy" in e and e["train_tokens"] % 32 == 0 for e in evals)
        assert [e["train_tokens"] for e in evals] == sorted(e["train_tokens"] for e in evals) and evals[0]["train_wall_seconds"] == 0


# --- token accuracy by hand ---------------------------------------------------------------------

class _FixedLogits(torch.nn.Module):
    """A stand-in LM whose logits are given: forward returns them with the mean next-token NLL."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.logits = logits

    def forward(self, input_ids, labels):
        logits = self.logits[: input_ids.shape[0]]
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), labels[:, 1:], ignore_index=-100)
        return SimpleNamespace(logits=logits, loss=loss)


def test_token_accuracy_equals_a_hand_count():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    ids = torch.tensor([[1, 3, 0, 4, 2], [6, 0, 5, 5, 1]])
    labels = ids.clone()
    labels[1, 4] = -100  # an ignored position counts neither way
    hand_right, hand_n = 0, 0
    for b in range(2):
        for t in range(4):  # the logits at t predict the token at t + 1
            if labels[b, t + 1] == -100:
                continue
            hand_n += 1
            hand_right += int(max(range(7), key=lambda v: logits[b, t, v].item()) == labels[b, t + 1].item())
    loader = [{"input_ids": ids, "labels": labels}]
    result = evaluate(_FixedLogits(logits), loader, "perplexity")
    assert result["n"] == hand_n == 7 and result["token_accuracy"] == pytest.approx(100 * hand_right / hand_n)
    # the several-process path (sums gathered over processes) counts the same
    # (a stand-in accelerator: one process's gather returns its own rows)
    accelerator = SimpleNamespace(num_processes=2, device=torch.device("cpu"), gather_for_metrics=lambda x: x)
    _, n, right = _gathered_sums(_FixedLogits(logits), loader, False, contextlib.nullcontext, accelerator)
    assert (n, right) == (hand_n, hand_right)


def test_lm_collector_numbers_documents_across_blocks_by_hand():
    """Two consecutive blocks of one stream, end-of-text id 0: block 0 = [5 6 0 7], block 1 = [8 0 9 9].
    Targets (every token but a block's first): block 0 predicts 6 (doc 0), 0 (doc 0, its end), 7 (doc 1);
    block 1 predicts 0 (doc 1: it continues from block 0), 9 and 9 (doc 2)."""
    ids = torch.tensor([[5, 6, 0, 7], [8, 0, 9, 9]])
    logits = torch.zeros(2, 4, 10)
    logits[0, 0, 6] = logits[0, 1, 3] = logits[0, 2, 7] = 5.0  # right, wrong, right
    logits[1, 0, 0] = logits[1, 1, 9] = logits[1, 2, 1] = 5.0  # right, right, wrong
    c = PredictionCollector("language_modeling", eos_token_id=0)
    c.add({"input_ids": ids[1:], "labels": ids[1:]}, logits[1:])  # the loader may yield them in any order
    c.add({"input_ids": ids[:1], "labels": ids[:1]}, logits[:1])
    cols = c.columns([1, 0])
    assert cols["document"].tolist() == [0, 1, 2] and cols["tokens"].tolist() == [2, 2, 2]
    assert cols["correct"].tolist() == [1, 2, 1]
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 10), ids[:, 1:].reshape(-1), reduction="none").view(2, 3)
    assert cols["loss"] == pytest.approx([(nll[0, 0] + nll[0, 1]).item() / 2, (nll[0, 2] + nll[1, 0]).item() / 2,
                                          (nll[1, 1] + nll[1, 2]).item() / 2])
