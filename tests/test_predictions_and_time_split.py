"""Issue 48. A final run's predictions.npz comes from the evaluations the run makes anyway: the
best validation's per-example outcomes kept while it ran, the test split's from its one pass. On
real data with tiny models (SST-2 classification, TinyStories LM): the file equals, array by array
and dtype by dtype, the one an explicit evaluation of the saved best weights writes; no pass over
the validation split follows training; a run stopped after its best validation and resumed writes
that best step's predictions, bit-identical to an uninterrupted run's, from its checkpoint.
And where the time went: ``oelm run``'s closing lines and the report split each run's wall time
(result.json's timing) and the process's into parts that add up to it."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest

import oelm.training.evaluation
import oelm.training.loop
from _tiny_lm import tiny_lm_overrides
from oelm.cli import main
from oelm.config import load_config
from oelm.matrix.assemble import build_run_model
from oelm.matrix.data import make_loaders
from oelm.matrix.output import prepare_matrix_data
from oelm.records import RunRecord, round_parts, time_split_text
from oelm.records.predictions import PREDICTIONS_FILE, load_predictions_file
from oelm.training import evaluate
from oelm.training.evaluation import evaluate_predictions
from oelm.training.prediction_collector import BEST_PREDICTIONS_FILE, collector_for, write_final_predictions

ROOT = Path(__file__).resolve().parents[1]

# The flat SST-2 run of test_training_evaluation (learning rate 1e-7: validation accuracy flat from
# step 2 on, so the best validation is the first and the best weights are reloaded after training),
# with a 200-sentence test split.
FLAT_SST2 = (
    "name: flat\n"
    "task: {dataset: sst2, test_split: test, test_samples: 200, tokenizer: bpe-512, train_samples: 64,"
    " validation_samples: 48, max_length: 32}\n"
    "model: {gpt: gpt-tiny, gpt_overrides: {hidden_size: 32, num_layers: 2, num_heads: 2, intermediate_size: 64, dropout: 0.0}}\n"
    "methods: [{name: baseline, learning_rate: 1.0e-7}]\n"
    "seeds: [0]\n"
    "training: {max_steps: 12, batch_size: 16, eval_every: 2, log_every: 3, timing_warmup_steps: 1, progress_bar: false,"
    " tensorboard: false}\n"
)


def _run(out: Path, config: Path, *overrides: str) -> int:
    return main(["run", str(config), "--output-dir", str(out), *overrides])


def _explicit_predictions(out: Path, run: str, into: Path) -> Path:
    """Evaluate the best weights a finished run saved (``checkpoint/model.safetensors``) on its
    validation and test splits, from its config alone, and write them as predictions.npz in ``into``."""
    from safetensors.torch import load_model

    config = load_config(out / "config.yaml")
    result = json.loads((out / "runs" / run / "result.json").read_text())
    entry = next(m for m in config.methods if m.name == result["method"])
    data = prepare_matrix_data(config, None, lambda _: None, save_tokenizer=False)
    model = build_run_model(config, entry, result["seed"], data)[0]
    load_model(model, str(out / "runs" / run / "checkpoint" / "model.safetensors"))
    training = config.training_for(entry)
    _, val_loader, test_loader = make_loaders(data, training, result["seed"])
    step = result["performance"]["best_step"]
    splits = {"validation": evaluate_predictions(model, val_loader, data.metric, training.mixed_precision, step=step)}
    if test_loader is not None:
        rows = collector_for(test_loader, data.metric)
        evaluate(model, test_loader, data.metric, training.mixed_precision, predictions=rows)
        splits["test"] = rows.split(test_loader, step)
    into.mkdir(parents=True, exist_ok=True)
    write_final_predictions(into, data.metric, splits)
    return into / PREDICTIONS_FILE


def _assert_same_arrays(written: Path, expected: Path) -> None:
    """Every array of two predictions files equal, with its dtype, in the same order; the headers equal."""
    a, b = np.load(written, allow_pickle=False), np.load(expected, allow_pickle=False)
    assert a.files == b.files
    for key in a.files:
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        assert np.array_equal(a[key], b[key]), key
    assert json.loads(str(a["meta"])) == json.loads(str(b["meta"]))


@pytest.fixture(scope="module")
def flat_run(tmp_path_factory, data_dir):
    """The flat SST-2 run, uninterrupted, every call of evaluate() counted."""
    out = tmp_path_factory.mktemp("flat") / "out"
    config = out.parent / "flat.yaml"
    config.write_text(FLAT_SST2)
    calls = []
    real = oelm.training.evaluation.evaluate
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed):
        mp.setattr(oelm.training.evaluation, "evaluate", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
        mp.setenv("OELM_REPORT_PLOTS", "1")  # the suite's default is off (conftest): without plots the report's
        # part of the closing line can round to 0.0 s, and the test reads it as measured (> 0)
        assert _run(out, config) == 0
    return out, config, len(calls), printed.getvalue()


def test_classification_predictions_equal_an_explicit_evaluation_of_the_best_weights(flat_run, tmp_path):
    out, _, calls, _ = flat_run
    run = out / "runs" / "baseline-seed0"
    result = json.loads((run / "result.json").read_text())
    evals = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if '"eval"' in l]
    assert result["performance"]["best_step"] == 2 and evals[-1]["step"] == 12  # the best weights are an early step's
    assert calls == len(evals) + 1  # the validations and the one test pass: no pass after training
    _assert_same_arrays(run / PREDICTIONS_FILE, _explicit_predictions(out, "baseline-seed0", tmp_path / "explicit"))
    saved = load_predictions_file(run / PREDICTIONS_FILE)
    assert saved.meta["step"] == 2 and set(saved.splits) == {"validation", "test"}
    assert result["timing"]["predictions_seconds"] > 0


def test_lm_predictions_equal_an_explicit_evaluation_of_the_best_weights(tmp_path, data_dir):
    out = tmp_path / "lm"
    assert _run(out, ROOT / "configs/tinystories-tiny.yaml", *tiny_lm_overrides(6, 2), "task.test_split=validation",
                "task.test_samples=6", "seeds=[0]", "methods=[{name: baseline, learning_rate: 3.0e-3}]",
                "training.save_best_checkpoint=true") == 0
    run = out / "runs" / "baseline-seed0"
    assert load_predictions_file(run / PREDICTIONS_FILE).task_type == "language_modeling"
    _assert_same_arrays(run / PREDICTIONS_FILE, _explicit_predictions(out, "baseline-seed0", tmp_path / "explicit"))


def test_a_run_resumed_after_its_best_validation_writes_that_steps_predictions(flat_run, tmp_path, monkeypatch):
    """SIGTERM during step 5 (after the best validation, step 2): the checkpoint of step 5 carries
    step 2's predictions; the resumed run validates at 6..12 (none better) and writes them without
    evaluating the validation split again, bit-identical to the uninterrupted run's file."""
    reference, config, _, _ = flat_run
    out = tmp_path / "out"
    real_step = oelm.training.loop.optimizer_step

    def step_then_stop(engine, state, batch, it):
        real_step(engine, state, batch, it)
        time.sleep(0.3)  # the first process's run time: 1.5 s in all, well above the clocks' differences below
        if state.step == 5:
            os.kill(os.getpid(), signal.SIGTERM)  # the loop saves a checkpoint of step 5 and stops

    with monkeypatch.context() as mp:
        mp.setattr(oelm.training.loop, "optimizer_step", step_then_stop)
        assert _run(out, config) == 130  # interrupted
    checkpoint = out / "runs" / "baseline-seed0" / "checkpoints" / "step-5"
    assert json.loads(str(np.load(checkpoint / BEST_PREDICTIONS_FILE)["meta"]))["step"] == 2
    first_process = json.loads((checkpoint / "trainer_state.json").read_text())["elapsed_seconds"]  # its run time
    calls = []
    real = oelm.training.evaluation.evaluate
    monkeypatch.setattr(oelm.training.evaluation, "evaluate", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    assert _run(out, config) == 0
    run = out / "runs" / "baseline-seed0"
    result = json.loads((run / "result.json").read_text())
    assert result["timing"]["process_start_steps"] == [0, 5] and result["performance"]["best_step"] == 2
    assert len(calls) == 4 + 1  # validations at 6, 8, 10, 12 and the test pass: no validation pass for step 2
    _assert_same_arrays(run / PREDICTIONS_FILE, reference / "runs" / "baseline-seed0" / PREDICTIONS_FILE)
    # the wall time is the second process's time on the run plus the first one's run time, which the parts
    # (summed over both) need: its executor block says when the second one began and ended
    record = RunRecord(result)
    assert result["timing"]["resumed_seconds"] == pytest.approx(first_process) and first_process > 1.5
    here = record.executor["finished_unix"] - record.started_unix
    assert here - 0.25 < record.wall_seconds - first_process <= here
    assert sum(record.time_split.values()) == pytest.approx(record.wall_seconds) and record.time_split["other"] > 0


def _shown_parts(line: str) -> tuple[float, dict[str, float]]:
    """``"12.3 s = a 1.0 + b c 2.0 ..."`` -> (12.3, {"a": 1.0, "b c": 2.0, ...})."""
    total, parts = line.split(" s = ")
    return float(total), {m[1]: float(m[2]) for m in re.finditer(r"([a-z -]+?) (\d+\.\d)(?: \+ |$)", parts)}


def test_the_closing_lines_and_the_report_split_the_wall_time(flat_run):
    """One line per run trained (its result.json's wall time split: set-up, training, data wait,
    validation, test, predictions, checkpoints, other) and one for the process (start-up, data,
    runs, report, other): parts with one decimal that add up to the total shown; the report's
    table shows the run's line."""
    out, _, _, printed = flat_run
    record = RunRecord(json.loads((out / "runs" / "baseline-seed0" / "result.json").read_text()))
    split, timing = record.time_split, record.timing
    assert list(split) == ["setup", "training", "data_wait", "validation", "test", "predictions", "checkpoints", "other"]
    assert all(v >= 0 for v in split.values()) and sum(split.values()) == pytest.approx(record.wall_seconds)
    assert split["training"] == timing["train_seconds"] and split["validation"] == timing["validation_seconds"] > 0
    assert split["test"] == timing["test_seconds"] > 0 and split["setup"] > timing["warmup_seconds"] > 0
    assert split["checkpoints"] == timing["checkpoint_seconds"] + timing["best_weights_seconds"] > 0
    # the run's clock (total_seconds) lies inside its wall time, with the set-up before it
    assert record.wall_seconds > timing["total_seconds"] + timing["setup_seconds"] and timing["resumed_seconds"] == 0
    lines = printed.splitlines()
    run_line = next(l for l in lines if l.startswith("time baseline-seed0: "))
    assert run_line == f"time baseline-seed0: {time_split_text(split)}"
    total, shown = _shown_parts(run_line.split(": ", 1)[1])
    assert list(shown) == ["setup", "training", "data wait", "validation", "test", "predictions", "checkpoints", "other"]
    assert total == round(record.wall_seconds, 1) and round(sum(shown.values()), 1) == total
    process = lines[-1]
    assert process.startswith("oelm run took ") and process.endswith(" (this process)")
    total, shown = _shown_parts(process.removeprefix("oelm run took ").removesuffix(" (this process)"))
    assert list(shown) == ["start-up", "data", "runs", "report", "other"] and round(sum(shown.values()), 1) == total
    assert shown["runs"] >= round(round(record.wall_seconds, 1) - 0.1, 1) and shown["start-up"] > 0 and shown["report"] > 0
    report = (out / "report.md").read_text().split("## Where the time went", 1)[1]
    row = "| baseline | 0 | " + " | ".join(f"{v:.1f}" for v in [sum(round_parts(split).values()), *round_parts(split).values()])
    assert row in report


def test_rounded_parts_add_up_to_the_rounded_total_and_stay_non_negative():
    parts = {"a": 5.06, "b": 4.98, "c": 0.04, "d": 0.04, "e": 0.04}
    rounded = round_parts(parts)
    assert sum(rounded.values()) == pytest.approx(10.2) and all(v >= 0 for v in rounded.values())
    assert all(abs(rounded[k] - parts[k]) <= 0.1 for k in parts)
    assert time_split_text({"setup": 1.26, "data_wait": 0.0}) == "1.3 s = setup 1.3 + data wait 0.0"
