"""A run's TensorBoard events follow Hugging Face Trainer's conventions (issue 46, item 7), as
``transformers.integrations.TensorBoardCallback`` writes them: Trainer's names (train/loss,
train/learning_rate, eval/loss, eval/accuracy), accuracy as a fraction 0-1 (``evaluate``'s
accuracy), ``train/epoch`` a float of epochs done, and the run's arguments recorded (the ``args``
text and TensorBoard's hparams plugin). metrics.jsonl keeps its own units (accuracy %). A tiny
real run (gpt-tiny on SST-2 sentences): seconds."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pytest

from _tiny_matrix import TINY_GPT, write_config
from oelm.cli import main

MATRIX = (
    "name: tb\n"
    "task: {dataset: sst2, tokenizer: bpe-512, train_samples: 48, validation_samples: 32, max_length: 32}\n"
    f"model: {TINY_GPT}\n"
    "methods: [{name: oelm_freeze, learning_rate: 2.0e-3}]\n"
    "seeds: [0]\n"
    "training: {max_steps: 5, batch_size: 16, eval_every: 2, log_every: 1, timing_warmup_steps: 1, progress_bar: false}\n"
)
STEPS_PER_EPOCH = 3  # 48 training sentences in batches of 16


def test_tensorboard_events_are_trainer_s(tmp_path, data_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    out = tmp_path / "out"
    with redirect_stdout(io.StringIO()):
        assert main(["run", str(write_config(tmp_path, MATRIX)), "--output-dir", str(out)]) == 0
    run_dir = out / "runs" / "oelm_freeze-seed0"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0}).Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"train/loss", "train/learning_rate", "train/epoch", "eval/loss", "eval/accuracy"} <= scalars

    # accuracy: a fraction in TensorBoard, the same number in percent in metrics.jsonl
    evals = [(r["step"], r["accuracy"]) for r in records if r["type"] == "eval"]
    assert evals and any(0 < a < 100 for _, a in evals)
    assert [(s.step, s.value) for s in events.Scalars("eval/accuracy")] == [
        (step, pytest.approx(a / 100, abs=1e-6)) for step, a in evals]
    assert all(0 <= s.value <= 1 for s in events.Scalars("eval/accuracy"))

    # train/epoch: epochs done as a float (step 1 of 3 per epoch: 0.333...), not the epoch's index
    trains = [r["step"] for r in records if r["type"] == "train"]
    assert [(s.step, s.value) for s in events.Scalars("train/epoch")] == [
        (step, pytest.approx(step / STEPS_PER_EPOCH, rel=1e-6)) for step in trains]
    assert any(not float(s.value).is_integer() for s in events.Scalars("train/epoch"))

    # the run's arguments: as text ("args") and in the hparams plugin's table with its metrics
    assert "args/text_summary" in events.Tags()["tensors"]
    args = json.loads(events.Tensors("args/text_summary")[0].tensor_proto.string_val[0].decode())
    assert args["training"]["learning_rate"] == 2.0e-3 and args["run"]["method"] == "oelm_freeze"
    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["training.learning_rate"].number_value == pytest.approx(2.0e-3)
    assert start.hparams["run.method"].string_value == "oelm_freeze"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert {m.name.tag for m in experiment.metric_infos} == {"eval/accuracy", "eval/loss"}
