"""Experiment trackers — TensorBoard, Weights & Biases, MLflow — through Accelerate's tracking API.

``report_to`` names them as Hugging Face ``Trainer`` and Accelerate do: ``["tensorboard"]`` (the
default), ``["tensorboard", "wandb", "mlflow"]``, or ``[]`` / ``"none"`` for none. A training loop
makes three calls on a :class:`Trackers` (rank 0 logs; the other processes' calls do nothing)::

    trackers = Trackers(["tensorboard", "wandb"], project="quickstart", output_dir=out)
    trackers.start(run_dir, "baseline-seed0", config_dict)   # once, before the first step
    trackers.log({"train/loss": 0.69, "train/lr": 1e-4}, step=10)  # any number of times
    trackers.finish()                                         # once, after the last record

(:meth:`Trackers.log_record` takes a ``metrics.jsonl`` record as it is: ``{"type": "train",
"step": 10, "loss": 0.69}`` -> ``train/loss`` at step 10; names and units as Hugging Face Trainer
logs them, :func:`trainer_scalars`: accuracy a fraction, ``train/epoch`` a float.)

Offline by default, as the rest of oelm: W&B runs in ``offline`` mode unless ``WANDB_MODE`` is set
(``wandb sync OUT/wandb/offline-run-*`` uploads them later) and writes under the output
directory (its service completes the run's file moments after :meth:`Trackers.finish`); MLflow writes a file store at ``OUT/mlruns`` unless ``MLFLOW_TRACKING_URI`` is set
(``mlflow ui --backend-store-uri OUT/mlruns`` shows it; MLflow 3 wants ``MLFLOW_ALLOW_FILE_STORE=true``
for a file store, which is set then unless already set). TensorBoard events go to
``RUN_DIR/tensorboard/<project>`` (a training run, :func:`oelm.training.train`, keeps its own
TensorBoard writer, ``RUN_DIR/tensorboard``, and hands only W&B and MLflow to this class). W&B and MLflow are optional: ``pip install "oelm[wandb]"`` /
``"oelm[mlflow]"``; asking for one that is not installed fails at :class:`Trackers` creation with
that command, before any training.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal

from oelm.errors import ConfigError

__all__ = ["TRACKERS", "PERCENT_FIELDS", "validate_report_to", "check_installed", "flatten_config", "trainer_scalars",
           "TrackedRun", "Trackers"]

TRACKERS = ("tensorboard", "wandb", "mlflow")
# tracker -> (module to import, how to install it)
_PACKAGES = {
    "tensorboard": ("tensorboard", "pip install tensorboard"),
    "wandb": ("wandb", 'pip install "oelm[wandb]"'),
    "mlflow": ("mlflow", 'pip install "oelm[mlflow]"'),
}


def validate_report_to(value: str | Iterable[str] | None) -> list[str]:
    """``report_to`` as a list of known tracker names, in order, without repeats.

    ``None``, ``"none"`` and ``[]`` mean no tracker; a single name may be given as a string.

    Raises:
        ConfigError: an unknown name (the message lists the valid ones), or not a string/list.
    """
    if value is None or value == "none":
        return []
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"report_to must be a list of tracker names ({', '.join(TRACKERS)}), got {value!r}")
    out: list[str] = []
    for name in names:
        key = name.strip().lower()
        if key not in TRACKERS:
            raise ConfigError(f"report_to: unknown tracker {name!r}; valid: {', '.join(TRACKERS)} (or [] for none)")
        if key not in out:
            out.append(key)
    return out


def check_installed(names: Iterable[str]) -> None:
    """Fail early, with the install command, when a tracker's package is missing.

    Raises:
        ConfigError: e.g. ``report_to: wandb needs the wandb package, which is not installed: pip install "oelm[wandb]"``.
    """
    for name in names:
        module, install = _PACKAGES[name]
        spec = importlib.util.find_spec(module)
        if spec is None:
            raise ConfigError(f"report_to: {name} needs the {module} package, which is not installed: {install}")
        if spec.origin is None:  # a namespace package: a plain folder of that name (W&B writes ./wandb/), no code
            where = ", ".join(str(p) for p in spec.submodule_search_locations or ())
            raise ConfigError(f"report_to: {name} needs the {module} package, which is not installed ({where} is a "
                              f"folder of that name, not the package): {install}")


def flatten_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested ``config`` as ``{"training.learning_rate": 1e-4, ...}`` with scalar values (lists,
    None and other objects as strings): what TensorBoard's hparams and MLflow's params accept."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_config(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = str(value)
    return flat


#: metrics.jsonl fields in percent that trackers get as a fraction (0-1), as Trainer logs ``evaluate``'s accuracy.
PERCENT_FIELDS = ("accuracy", "token_accuracy", "best_accuracy")


def trainer_scalars(record: dict[str, Any], steps_per_epoch: int | None = None) -> dict[str, Any]:
    """One ``metrics.jsonl`` record as the scalars Hugging Face Trainer's TensorBoard / W&B / MLflow
    callbacks log (``transformers.integrations.TensorBoardCallback`` with ``rewrite_logs``):
    ``<type>/<field>`` (``train/loss``, ``train/learning_rate``, ``eval/loss``, ``eval/accuracy``,
    ``test/accuracy``), accuracies (:data:`PERCENT_FIELDS`: % in metrics.jsonl) as fractions 0-1 as
    ``evaluate``'s accuracy is, and a train record's ``train/epoch`` as a float of epochs done
    (optimizer step / ``steps_per_epoch``: 0.5 half-way through the first epoch, as Trainer's
    ``state.epoch``); without ``steps_per_epoch`` the record's epoch is dropped (an epoch index is
    not Trainer's epoch). Fields that are not numbers are left out. metrics.jsonl keeps its own units."""
    kind = record["type"]
    out: dict[str, Any] = {}
    for key, value in record.items():
        if key in ("type", "step") or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if key == "epoch" and kind == "train":
            if steps_per_epoch:
                out["train/epoch"] = record["step"] / steps_per_epoch
            continue
        out[f"{kind}/{key}"] = value / 100 if key in PERCENT_FIELDS else value
    return out


@dataclass(frozen=True)
class TrackedRun:
    """What the trackers record about a run besides its metrics (:func:`oelm.training.train`'s
    ``tracked``): the ``project`` it belongs to (an experiment's name), its ``config`` (a nested
    dict, recorded flattened as hyperparameters) and the ``output_dir`` W&B and MLflow write under
    (a matrix's output folder; default: the run's folder)."""

    project: str = "oelm"
    config: dict[str, Any] | None = None
    output_dir: Path | None = None


class Trackers:
    """The trackers of one run: Accelerate's tracker classes (``accelerate.tracking``), the ones
    ``Accelerator(log_with=...)`` builds, started and fed here without an ``Accelerator`` (a
    training process has one already; a second could not change its distributed state).

    Args:
        report_to: tracker names (see :func:`validate_report_to`); default ``["tensorboard"]``.
        project: the project / experiment name the trackers group runs under (the config's
            ``name``): W&B project, MLflow experiment, TensorBoard sub-folder.
        output_dir: the matrix's output directory: W&B's files and the MLflow file store go
            there. Default: the ``run_dir`` given to :meth:`start`.

    Raises:
        ConfigError: unknown tracker name, or its package is not installed.
    """

    def __init__(self, report_to: str | Iterable[str] | None = ("tensorboard",), *, project: str = "oelm",
                 output_dir: str | os.PathLike | None = None) -> None:
        self.names = validate_report_to(report_to)
        check_installed(self.names)
        self.project = project
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.trackers: list = []  # accelerate.tracking.GeneralTracker, started

    def start(self, run_dir: str | os.PathLike, run_name: str, config: dict[str, Any] | None = None) -> None:
        """Start the trackers for one run and record its ``config`` (flattened) as hyperparameters.

        ``run_dir``: the run's folder (TensorBoard writes ``run_dir/tensorboard/<project>``);
        ``run_name``: its name in W&B and MLflow (``baseline-seed0``). A no-op without trackers.
        """
        if not self.names:
            return
        from accelerate.tracking import LOGGER_TYPE_TO_CLASS

        run_dir = Path(run_dir)
        out = self.output_dir or run_dir
        kwargs: dict[str, dict[str, Any]] = {}
        if "wandb" in self.names:
            out.mkdir(parents=True, exist_ok=True)
            kwargs["wandb"] = {"name": run_name, "dir": str(out)}
            if not os.environ.get("WANDB_MODE"):
                kwargs["wandb"]["mode"] = "offline"
        if "mlflow" in self.names:
            kwargs["mlflow"] = {"run_name": run_name}
            if not os.environ.get("MLFLOW_TRACKING_URI"):
                import mlflow

                # MLflow 3 keeps its file store in maintenance mode behind this opt-in; a database or
                # server needs more than mlflow-skinny, and a file store is what offline means here
                os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
                mlflow.set_tracking_uri((out / "mlruns").resolve().as_uri())
        for name in self.names:  # as Accelerator.init_trackers
            cls = LOGGER_TYPE_TO_CLASS[name]
            args = (self.project, str(run_dir / "tensorboard")) if cls.requires_logging_directory else (self.project,)
            tracker = cls(*args, **kwargs.get(name, {}))
            tracker.start()
            self.trackers.append(tracker)
        flat = flatten_config(config or {})
        for tracker in self.trackers:
            tracker.store_init_configuration(flat)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Log scalar ``metrics`` (name -> number; other values are dropped) at optimizer step ``step``."""
        values = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        for tracker in self.trackers if values else ():
            tracker.log(values, step=step)

    def log_record(self, record: dict[str, Any], steps_per_epoch: int | None = None) -> None:
        """Log one ``metrics.jsonl`` record under Trainer's names and units (:func:`trainer_scalars`):
        ``{"type": "eval", "step": 40, "accuracy": 81.0}`` -> ``eval/accuracy`` 0.81 at step 40."""
        self.log(trainer_scalars(record, steps_per_epoch), record["step"])

    def finish(self, status: Literal["FINISHED", "FAILED", "KILLED"] = "FINISHED") -> None:
        """End every tracker (flushes TensorBoard, closes the W&B and MLflow runs). Safe to call twice.

        ``status``: how the run ended, as MLflow records it (W&B: exit code 0 when finished, 1
        otherwise). This is ``Accelerator.end_training`` without its last step: that also
        destroys the torch process group, which a multi-process matrix still needs for its next run."""
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            if status != "FINISHED" and tracker.name == "mlflow":
                import mlflow

                mlflow.end_run(status=status)  # the tracker's own finish() then has no run left to end
            elif status != "FINISHED" and tracker.name == "wandb":
                tracker.run.finish(exit_code=1)
            tracker.finish()
