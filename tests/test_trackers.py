"""oelm.integrations.trackers: report_to names, the missing-package error, and real metrics logged through
Accelerate to TensorBoard, W&B (offline mode) and MLflow (a file store), read back from what each
wrote. W&B and MLflow tests skip, with the reason, when the optional package is not installed."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest

from oelm.errors import ConfigError
from oelm.integrations.trackers import TRACKERS, Trackers, check_installed, flatten_config, validate_report_to

CONFIG = {"name": "unit", "seeds": [0, 1], "training": {"learning_rate": 1e-3, "warmup_steps": None}}
LOSSES = [2.0, 1.25, 0.5]


def _log_three_steps(trackers: Trackers, run_dir: Path) -> None:
    trackers.start(run_dir, "baseline-seed0", CONFIG)
    for step, loss in enumerate(LOSSES, start=1):
        trackers.log_record({"type": "train", "step": step, "loss": loss, "lr": 1e-3, "note": "text is dropped"})
    trackers.log({"eval/accuracy": 0.75}, step=3)
    trackers.finish()
    trackers.finish()  # a second call is harmless


def test_report_to_names_are_validated():
    assert validate_report_to(["TensorBoard", "wandb", "tensorboard"]) == ["tensorboard", "wandb"]
    assert validate_report_to("mlflow") == ["mlflow"]
    assert validate_report_to("none") == validate_report_to([]) == validate_report_to(None) == []
    with pytest.raises(ConfigError, match=r"report_to: unknown tracker 'comet'; valid: tensorboard, wandb, mlflow"):
        validate_report_to(["comet"])
    with pytest.raises(ConfigError, match="report_to must be a list"):
        validate_report_to(3)
    assert TRACKERS == ("tensorboard", "wandb", "mlflow")


def test_a_missing_package_names_the_extra_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r'report_to: wandb needs the wandb package, which is not installed: '
                                          r'pip install "oelm\[wandb\]"'):
        Trackers(["tensorboard", "wandb"])
    check_installed(["tensorboard"])  # the others are fine


def test_config_is_flattened_to_scalars():
    assert flatten_config(CONFIG) == {"name": "unit", "seeds": "[0, 1]", "training.learning_rate": 1e-3,
                                      "training.warmup_steps": "None"}


def test_no_tracker_is_a_no_op(tmp_path):
    trackers = Trackers([])
    _log_three_steps(trackers, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_tensorboard_by_default_writes_the_logged_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trackers = Trackers(project="unit")
    assert trackers.names == ["tensorboard"]
    _log_three_steps(trackers, tmp_path / "run")
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard" / "unit")).Reload()
    assert [(s.step, s.value) for s in events.Scalars("train/loss")] == list(enumerate(LOSSES, start=1))
    assert [(s.step, round(s.value, 6)) for s in events.Scalars("eval/accuracy")] == [(3, 0.75)]
    assert "train/note" not in events.Tags()["scalars"]


def _wandb_records(path: Path):
    """The protobuf records of an offline ``run-*.wandb`` file (a LevelDB-style log: a 7-byte
    ``:W&B`` header, then 32 KiB blocks of chunks with a 7-byte header: crc32, length, type)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_wandb_offline_by_default_logs_config_and_metrics(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason='W&B is optional: pip install "oelm[wandb]"')
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    _log_three_steps(Trackers(["wandb"], project="unit", output_dir=tmp_path), tmp_path / "runs" / "baseline-seed0")
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")  # offline: nothing was sent
    deadline = time.monotonic() + 60  # wandb-core writes the file in the background, done moments after finish
    while "exit" not in [r.WhichOneof("record_type") for r in _wandb_records(run_file)]:
        assert time.monotonic() < deadline, f"{run_file} was not completed"
        time.sleep(0.1)
    history, config, run = [], {}, None
    for record in _wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})
        elif kind in ("run", "config"):
            updates = record.run.config.update if kind == "run" else record.config.update
            config.update({item.key: json.loads(item.value_json) for item in updates})
            run = record.run if kind == "run" else run
    assert (run.project, run.display_name) == ("unit", "baseline-seed0")
    assert [(h["_step"], h["train/loss"]) for h in history if "train/loss" in h] == list(enumerate(LOSSES, start=1))
    assert [(h["_step"], h["eval/accuracy"]) for h in history if "eval/accuracy" in h] == [(3, 0.75)]
    assert config["training.learning_rate"] == 1e-3 and config["seeds"] == "[0, 1]"


def test_mlflow_file_store_under_the_output_dir_holds_params_and_metrics(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason='MLflow is optional: pip install "oelm[mlflow]"')
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # what Trackers sets; restored after the test
    _log_three_steps(Trackers(["mlflow"], project="unit", output_dir=tmp_path), tmp_path / "runs" / "baseline-seed0")
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("unit")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "baseline-seed0" and run.info.status == "FINISHED"
    assert run.data.params["training.learning_rate"] == "0.001" and run.data.params["seeds"] == "[0, 1]"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == list(enumerate(LOSSES, start=1))
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "eval/accuracy")] == [(3, 0.75)]
