"""``metrics.jsonl`` (one JSON object per line) mirrored to TensorBoard and to the run's other
trackers (``training.report_to``: W&B, MLflow), and the train log line."""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oelm.errors import RunInterruptedError
from oelm.integrations.trackers import TrackedRun, Trackers, flatten_config, trainer_scalars
from oelm.records import RunFolder
from oelm.training.faults import DISK_FULL, check_finite, disk_full_error

if TYPE_CHECKING:
    from oelm.training.engine import Engine
    from oelm.training.state import TrainState

__all__ = ["MetricsLog", "log_train", "start_trackers"]


class MetricsLog:
    """Appends JSON lines to ``metrics.jsonl`` and mirrors scalars to TensorBoard and to
    ``trackers`` (set by :func:`start_trackers`; finished by :meth:`close`).

    ``offset`` (bytes) is where a resumed run cuts the file, so no record is lost or repeated;
    TensorBoard events at or after ``purge_step`` are hidden for the same reason. A file shorter
    than ``offset`` (cut since the checkpoint) is continued after its last whole record, with a
    warning, never padded.
    """

    trackers: "Trackers | None" = None

    def __init__(self, run_dir: Path, tensorboard: bool, offset: int = 0, purge_step: int | None = None,
                 enabled: bool = True, steps_per_epoch: int | None = None) -> None:
        folder = RunFolder(run_dir)
        self.path = folder.metrics
        self.enabled = enabled  # False on every process but rank 0: nothing is written
        self.steps_per_epoch = steps_per_epoch  # the trackers' train/epoch is step / steps_per_epoch
        self._offset = offset
        self._tb = None
        if not enabled:
            return
        self._fh = self.path.open("a+b")
        size = self._fh.seek(0, os.SEEK_END)
        if size < offset:  # cut short since the checkpoint: truncate(offset) would pad it with NUL bytes
            self._fh.seek(0)
            offset = self._fh.read(size).rfind(b"\n") + 1  # after its last whole record
            warnings.warn(f"{self.path} is shorter ({size} bytes) than its checkpoint recorded ({self._offset} bytes): "
                          f"the records after byte {offset} are lost; the run continues after its last whole record",
                          RuntimeWarning, stacklevel=2)
            self._offset = offset
        self._fh.truncate(offset)
        self._fh.seek(offset)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(folder.tensorboard), purge_step=purge_step)

    @property
    def offset(self) -> int:
        return self._fh.tell() if self.enabled else self._offset

    def write(self, record: dict[str, Any]) -> None:
        """Append one record. Raises RunFaultError(kind="disk_full") when the disk is full."""
        if not self.enabled:
            return
        try:
            self._fh.write((json.dumps(record) + "\n").encode("utf-8"))
            self._fh.flush()
        except OSError as exc:
            if exc.errno in DISK_FULL:
                raise disk_full_error(exc, self.path.name, record.get("step", 0)) from exc
            raise
        if self._tb is not None:  # Trainer's names and units: accuracy a fraction, train/epoch a float
            for name, value in trainer_scalars(record, self.steps_per_epoch).items():
                self._tb.add_scalar(name, value, record["step"])
        if self.trackers is not None:
            self.trackers.log_record(record, self.steps_per_epoch)

    def write_hparams(self, config: dict[str, Any], metric: str) -> None:
        """Record the run's ``config`` in TensorBoard as Trainer's TensorBoardCallback does: the
        whole of it as text (``args``, JSON) and, flattened (:func:`flatten_config`), in the hparams
        plugin's table (HPARAMS tab) with the run's validation metric and loss as its metrics
        (``eval/<metric>``, ``eval/loss``), in the run's own event file."""
        if self._tb is None:
            return
        from torch.utils.tensorboard.summary import hparams  # with the writer: torch's TensorBoard support

        self._tb.add_text("args", json.dumps(config, indent=2, default=str))
        for summary in hparams(flatten_config(config), {f"eval/{metric}": 0.0, "eval/loss": 0.0}):
            self._tb.file_writer.add_summary(summary)

    def sync(self) -> None:
        """Make the records written so far durable (called before a checkpoint refers to them)."""
        if not self.enabled:
            return
        self._fh.flush()
        os.fsync(self._fh.fileno())
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        """Close the file and TensorBoard's writer, and finish the trackers (the run ended)."""
        self.end_trackers()
        if not self.enabled:
            return
        self._fh.close()
        if self._tb is not None:
            self._tb.close()

    def end_trackers(self, error: BaseException | None = None) -> None:
        """Finish the trackers: as failed when ``error`` ended the run (killed for a stop signal
        or Ctrl-C), else as finished. Safe to call more than once."""
        trackers, self.trackers = self.trackers, None
        if trackers is not None:
            killed = isinstance(error, (RunInterruptedError, KeyboardInterrupt))
            trackers.finish("KILLED" if killed else "FAILED" if error is not None else "FINISHED")


def start_trackers(engine: "Engine", run_name: str, tracked: "TrackedRun | None", resumed_step: int) -> float:
    """Record the run's config in TensorBoard's hparams (a fresh start; :meth:`MetricsLog.write_hparams`)
    and start the run's W&B / MLflow trackers (``training.report_to``; TensorBoard is the log's own
    writer, so its events are written once) on rank 0 and have ``engine.log`` feed them every
    record from now on. A resumed run is a new tracker run that logs from ``resumed_step`` on
    (recorded as ``resumed_from_step``). ``tracked``: project, config and output folder
    (default: project ``oelm``, the run's training config, the run's folder). Returns the
    seconds it took (a W&B start-up takes seconds), which the run's clock leaves out.

    Raises:
        ConfigError: a tracker's package is not installed (names ``pip install "oelm[...]"``).
    """
    started = time.perf_counter()
    tracked = tracked or TrackedRun()
    config = {**(tracked.config or {}), "training": engine.config.model_dump(mode="json")}  # the run's own rate
    if not resumed_step:  # a resumed run's event file has them from its first start
        engine.log.write_hparams(config, engine.metric.name)
    names = [n for n in engine.config.report_to if n != "tensorboard"]
    if not names or not engine.is_main:
        return time.perf_counter() - started
    if resumed_step:
        config["resumed_from_step"] = resumed_step
    trackers = Trackers(names, project=tracked.project, output_dir=tracked.output_dir)
    trackers.start(engine.run_dir, run_name, config)
    engine.log.trackers = trackers
    return time.perf_counter() - started


def log_train(engine: "Engine", state: "TrainState") -> None:
    """Flush the timer, check for NaN/Inf and write the mean training loss since the last line
    (averaged over processes). The one place the step's device accumulators are read (a sync)."""
    engine.timer.flush()
    check_finite(engine, state.step)
    loss_sum = engine.running_loss if engine.world_size == 1 else engine.accelerator.reduce(engine.running_loss.clone(), "mean")
    state.last_loss = float(loss_sum) / state.running_n
    engine.running_loss.zero_()
    state.running_n = 0
    record = {"type": "train", "step": state.step, "epoch": state.epoch, "loss": state.last_loss,
              "learning_rate": engine.scheduler.get_last_lr()[0],
              "step_ms": engine.timer.last_step_ms, "elapsed_seconds": time.perf_counter() - engine.t_start}
    engine.log.write(record)
    state.history.append(record)
