"""training.report_to wired into real runs: a tiny matrix logs to TensorBoard and an MLflow file
store (read back with MLflow's client, compared with metrics.jsonl), a tiny run to W&B offline, the
default config writes TensorBoard only, a killed and resumed run gives the trackers both halves,
and a tracker that is not installed stops a run before anything is written. Real data (SST-2 and
TinyStories, tiny GPTs): seconds per run."""

from __future__ import annotations

import importlib.util
import io
import json
import time
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from _reliability import in_process, sigterm_at
from _tiny_matrix import TINY_GPT, write_config
from oelm.cli import main
from oelm.config import TrainingConfig, config_from_dict, load_config
from oelm.errors import ConfigError, RunInterruptedError
from oelm.integrations.trackers import trainer_scalars

MATRIX = (
    "name: tracked\n"
    "task: {dataset: sst2, tokenizer: bpe-512, train_samples: 48, validation_samples: 32, max_length: 32}\n"
    f"model: {TINY_GPT}\n"
    "methods: [{name: oelm_freeze, learning_rate: 2.0e-3}]\n"
    "seeds: [0]\n"
    "training: {max_steps: 4, batch_size: 16, eval_every: 2, log_every: 1, timing_warmup_steps: 1, progress_bar: false,\n"
    "           report_to: [tensorboard, mlflow]}\n"
)
SHORT = ("training.max_steps=6", "training.eval_every=3", "training.log_every=1", "training.checkpoint_every=2")


@pytest.fixture
def mlflow_offline(monkeypatch):
    """MLflow with no tracking server configured (oelm then writes a file store); the variables
    Trackers sets are restored after the test."""
    pytest.importorskip("mlflow", reason='MLflow is optional: pip install "oelm[mlflow]"')
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


def _expected(run_dir: Path, after: int = -1, upto: int = 10**9) -> dict[str, list[tuple[int, float]]]:
    """Every numeric field of metrics.jsonl as tracker series, in Trainer's units (accuracy a fraction:
    :func:`trainer_scalars`): ``{"train/loss": [(step, value), ...]}``; train/epoch, which the trackers
    compute from the run's steps per epoch, is checked by test_tensorboard_conventions.py."""
    series: dict[str, list[tuple[int, float]]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if not after < r["step"] <= upto:
            continue
        for k, v in trainer_scalars(r).items():
            series.setdefault(k, []).append((r["step"], float(v)))
    return series


def _mlflow_series(client, run) -> dict[str, list[tuple[int, float]]]:
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
            for key in run.data.metrics if key != "train/epoch"}


def test_matrix_run_logs_to_tensorboard_once_and_to_an_mlflow_file_store(tmp_path, data_dir, mlflow_offline):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "out"
    with redirect_stdout(io.StringIO()):
        assert main(["run", str(write_config(tmp_path, MATRIX)), "--output-dir", str(out)]) == 0
    run_dir = out / "runs" / "oelm_freeze-seed0"
    expected = _expected(run_dir)
    assert {"train/loss", "train/learning_rate", "eval/accuracy"} <= set(expected)

    client = MlflowClient(tracking_uri=(out / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("tracked").experiment_id])
    assert run.info.run_name == "oelm_freeze-seed0" and run.info.status == "FINISHED"
    assert _mlflow_series(client, run) == expected  # every record metrics.jsonl got, nothing else
    params = run.data.params
    assert (params["run.method"], params["run.seed"], params["training.learning_rate"]) == ("oelm_freeze", "0", "0.002")

    # TensorBoard: the log's own writer, in the folder it always used; not a second copy per tracker
    assert [p.name for p in (run_dir / "tensorboard").iterdir() if p.is_dir()] == []
    events = EventAccumulator(str(run_dir / "tensorboard")).Reload()
    assert [(s.step, s.value) for s in events.Scalars("train/loss")] == [
        (step, pytest.approx(v, rel=1e-6)) for step, v in expected["train/loss"]]
    assert not (out / "wandb").exists()


def test_wandb_offline_run_holds_the_metrics_of_the_run(tmp_path, data_dir, monkeypatch):
    pytest.importorskip("wandb", reason='W&B is optional: pip install "oelm[wandb]"')
    from test_trackers import _wandb_records

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    in_process(run_dir, *SHORT, "training.report_to=[wandb]")
    (run_file,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")  # offline, under the run's folder
    deadline = time.monotonic() + 60  # wandb-core completes the file moments after the run finished
    while "exit" not in [r.WhichOneof("record_type") for r in _wandb_records(run_file)]:
        assert time.monotonic() < deadline, f"{run_file} was not completed"
        time.sleep(0.1)
    logged: dict[str, list] = {}
    for record in _wandb_records(run_file):
        if record.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            for k, v in items.items():
                if not k.startswith("_") and k != "train/epoch":
                    logged.setdefault(k, []).append((items["_step"], float(v)))
    assert logged == _expected(run_dir)
    assert not (run_dir / "tensorboard").exists() and not (run_dir / "mlruns").exists()


def test_default_config_writes_tensorboard_only(tmp_path, data_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert TrainingConfig().report_to == ["tensorboard"]
    run_dir = tmp_path / "run"
    _, _, config = in_process(run_dir, "training.max_steps=2", "training.eval_every=2", "training.log_every=1",
                              "training.tensorboard=true")  # the driver's base config turns it off
    assert config.training.report_to == ["tensorboard"]
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint", "metrics.jsonl", "tensorboard"]
    events = EventAccumulator(str(run_dir / "tensorboard")).Reload()
    assert [s.step for s in events.Scalars("train/loss")] == [1, 2]


def test_a_killed_and_resumed_run_gives_mlflow_both_halves(tmp_path, data_dir, mlflow_offline):
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    with pytest.raises(RunInterruptedError) as stopped:
        in_process(run_dir, *SHORT, "training.report_to=[mlflow]", hook=sigterm_at(3))
    step = stopped.value.step
    assert 3 <= step < 6
    in_process(run_dir, *SHORT, "training.report_to=[mlflow]")  # resumes from the checkpoint of `step`

    client = MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    runs = {r.info.status: r for r in client.search_runs([client.get_experiment_by_name("oelm").experiment_id])}
    assert sorted(runs) == ["FINISHED", "KILLED"] and {r.info.run_name for r in runs.values()} == {"run"}
    assert runs["FINISHED"].data.params["resumed_from_step"] == str(step)
    assert _mlflow_series(client, runs["KILLED"]) == _expected(run_dir, upto=step)
    assert _mlflow_series(client, runs["FINISHED"]) == _expected(run_dir, after=step)


def test_a_tracker_not_installed_stops_the_run_before_anything_is_written(tmp_path, monkeypatch):
    from oelm.training import train

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r'report_to: wandb needs the wandb package, which is not installed: '
                                          r'pip install "oelm\[wandb\]"'):
        train(None, None, None, metric="accuracy", config=TrainingConfig(report_to=["wandb"]), run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_oelm_run_names_the_missing_tracker_before_preparing_data(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    out = tmp_path / "out"
    assert main(["run", str(write_config(tmp_path, MATRIX)), "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == 'oelm: error: report_to: mlflow needs the mlflow package, which is not installed: pip install "oelm[mlflow]"'
    assert not (out / "runs").exists()  # nothing prepared, nothing trained, no run marked failed


def test_report_to_is_validated_and_tensorboard_false_still_turns_it_off(tmp_path):
    assert TrainingConfig(report_to="none").report_to == TrainingConfig(report_to=[]).report_to == []
    assert TrainingConfig(report_to=["MLflow", "mlflow"]).report_to == ["mlflow"]
    old = TrainingConfig(tensorboard=False, report_to=["tensorboard", "wandb"])
    assert (old.report_to, old.tensorboard) == (["wandb"], False)
    assert TrainingConfig(report_to=["mlflow"]).tensorboard is False  # what the metrics log reads
    cfg = write_config(tmp_path, MATRIX.replace("report_to: [tensorboard, mlflow]", "report_to: [tensorboard, comet]"))
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert "training.report_to.1: Input should be 'tensorboard', 'wandb' or 'mlflow' (got 'comet')" in str(err.value)


def test_report_to_does_not_change_the_fingerprint(tmp_path):
    from oelm.matrix.output import config_fingerprint

    base = load_config(write_config(tmp_path, MATRIX))
    for report_to in ([], ["wandb"], ["tensorboard"]):
        other = config_from_dict(base.model_dump(mode="json") | {
            "training": base.training.model_dump(mode="json") | {"report_to": report_to}})
        assert config_fingerprint(other) == config_fingerprint(base)
