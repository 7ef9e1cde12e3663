"""The output-folder contract: every path of a matrix folder and of a run folder, and the typed
run record that every reader (selection, the plan, ``oelm monitor``, the report) uses.

A matrix's output folder (``--output-dir``)::

    <out>/
      .oelm.lock          held (flock) by the process driving the matrix (oelm.lock)
      config.yaml         the resolved config            experiment.json  its fingerprint (resume check)
      plan.json           every planned run (monitor)    sweep.json       selection on validation
      tokenizer.json      oelm GPT's tokenizer           comparison.json, report.md, report.html
      runs/<run name>/    one folder per run (:class:`RunFolder`)
      runs/.failed/, runs/.weights-missing/   runs moved aside before a retry

Only the driver (``oelm run``, ``oelm plan``, ``--collect``) writes the files of ``<out>``; a run
writes only its own ``runs/<run name>/``, whichever executor or machine trains it. That is what
lets runs train anywhere that sees the folder (a Ray cluster, a batch system's jobs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from oelm.io import read_json
from oelm.runs import BEST_CHECKPOINT, PlannedRun

__all__ = ["MatrixFolder", "RunFolder", "RunRecord"]


@dataclass(frozen=True)
class RunFolder:
    """``<out>/runs/<run name>/``: what one run writes about itself."""

    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def result(self) -> Path:
        """``result.json``: the :class:`RunRecord`, written once the run finished or failed."""
        return self.path / "result.json"

    @property
    def status(self) -> Path:
        """``status.json``: state, stage, total steps, pid, host, start/end times (oelm.runs.write_status)."""
        return self.path / "status.json"

    @property
    def metrics(self) -> Path:
        """``metrics.jsonl``: train / eval / test records, one JSON object a line."""
        return self.path / "metrics.jsonl"

    @property
    def best_weights(self) -> Path:
        """``checkpoint/model.safetensors``: the best-on-validation weights (sha256 in result.json)."""
        return self.path / BEST_CHECKPOINT

    @property
    def checkpoints(self) -> Path:
        """``checkpoints/step-<N>/``: resumable checkpoints, removed when the run finishes."""
        return self.path / "checkpoints"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    @property
    def lock(self) -> Path:
        """``.oelm.lock``: held while ``oelm run --only`` trains this run (oelm.lock)."""
        return self.path / ".oelm.lock"

    def read_result(self) -> "RunRecord | None":
        """The run's record, None when it has none yet. Raises what :func:`oelm.io.read_json`
        raises for an unreadable file (naming it)."""
        return RunRecord(read_json(self.result)) if self.result.exists() else None


@dataclass(frozen=True)
class MatrixFolder:
    """``<out>``: the files of one matrix (module docstring)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    experiment = property(lambda self: self.root / "experiment.json")
    config = property(lambda self: self.root / "config.yaml")
    plan = property(lambda self: self.root / "plan.json")
    sweep = property(lambda self: self.root / "sweep.json")
    comparison = property(lambda self: self.root / "comparison.json")
    report_md = property(lambda self: self.root / "report.md")
    report_html = property(lambda self: self.root / "report.html")
    tokenizer = property(lambda self: self.root / "tokenizer.json")
    runs = property(lambda self: self.root / "runs")

    def run(self, name: str) -> RunFolder:
        return RunFolder(self.runs / name)

    def read_result(self, run: PlannedRun | str) -> "RunRecord | None":
        return self.run(run if isinstance(run, str) else run.name).read_result()

    def results(self) -> dict[str, "RunRecord"]:
        """Every ``runs/<name>/result.json`` (moved-aside runs excluded), by run folder name."""
        return {d.name: r for d, r in self.iter_results()}

    def iter_results(self) -> Iterator[tuple[RunFolder, "RunRecord"]]:
        for path in sorted(self.runs.glob("*/result.json")):
            yield RunFolder(path.parent), RunRecord(read_json(path))


@dataclass(frozen=True)
class RunRecord:
    """A run's ``result.json``, typed (schema: :class:`oelm.runs.RunResult`).

    ``raw`` is the JSON object as written; the properties are what readers use: identity
    (``method``, ``seed``, ``learning_rate``, ``stage``, ``name``), ``status`` ("finished" |
    "failed"), the performance numbers (``best_validation``, ``test``: the metric's unit,
    accuracy % or perplexity), where it ran (``executor``) and the other sections (``timing``,
    ``environment``, ``parameters``, ``data``, ``config``, ``method_config``: ``{}`` when absent).
    """

    raw: dict[str, Any] = field(repr=False)

    method = property(lambda self: self.raw.get("method"))
    seed = property(lambda self: self.raw.get("seed"))
    learning_rate = property(lambda self: self.raw.get("learning_rate"))
    stage = property(lambda self: self.raw.get("stage"))
    name = property(lambda self: self.raw.get("run_name"))
    status = property(lambda self: self.raw.get("status", "finished"))
    finished = property(lambda self: self.status == "finished")
    failed = property(lambda self: self.status == "failed")
    is_final = property(lambda self: self.stage == "final")
    performance = property(lambda self: self.raw.get("performance") or {})
    best_validation = property(lambda self: self.performance.get("best_validation"))
    test = property(lambda self: self.performance.get("test"))
    metric = property(lambda self: self.performance.get("metric"))
    failure = property(lambda self: self.raw.get("failure"))
    executor = property(lambda self: self.raw.get("executor") or {})
    task = property(lambda self: self.raw.get("task"), doc="The dataset's name (None in older results).")
    config = property(lambda self: self.raw.get("config") or {}, doc="The resolved experiment config, as a dict.")
    method_config = property(lambda self: self.raw.get("method_config") or {}, doc="The method's config, as a dict.")
    data = property(lambda self: self.raw.get("data") or {},
                    doc="Per split sizes and label counts (majority_class_percent in %), num_labels.")
    parameters = property(lambda self: self.raw.get("parameters") or {},
                          doc="Parameter counts: total / trainable / frozen, trainable_percent (%), per group.")
    environment = property(lambda self: self.raw.get("environment") or {},
                           doc="Host, device, versions; the matmul speed probe (GFLOP/s) and its drift (%).")
    timing = property(lambda self: self.raw.get("timing") or {},
                      doc="Seconds (total_seconds, train_seconds, ...), step times (ms), tokens/s, MFU, GPU telemetry.")

    def key(self) -> tuple[str, float, int]:
        """``(method, learning rate, seed)``: the cell of the matrix this run fills."""
        return (self.method, self.learning_rate, self.seed)
