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
      runs/.damaged/      runs whose result.json was damaged, moved aside whole (trained again)

Only the driver (``oelm run``, ``oelm plan``, ``--collect``) writes the files of ``<out>``; a run
writes only its own ``runs/<run name>/``, whichever executor or machine trains it. That is what
lets runs train anywhere that sees the folder (a Ray cluster, a batch system's jobs).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from oelm.errors import DamagedFileError
from oelm.io import read_json_object
from oelm.runs import BEST_CHECKPOINT, PlannedRun, RunResult

__all__ = ["MatrixFolder", "RunFolder", "RunRecord", "read_record", "DAMAGED_RESULT_FIX"]

#: What to do about a damaged ``result.json`` (ends the error of ``oelm report`` and readers).
DAMAGED_RESULT_FIX = ("restore it from a copy, or rerun `oelm run` with the same --output-dir: it moves the run's "
                      "folder to runs/.damaged/ and trains that run again")


@functools.lru_cache(maxsize=1)
def _result_schema():
    from pydantic import TypeAdapter

    return TypeAdapter(RunResult)


def read_record(path: str | os.PathLike, fix: str = DAMAGED_RESULT_FIX) -> "RunRecord":
    """The :class:`RunRecord` of the ``result.json`` at ``path``, its fields checked against
    :class:`oelm.runs.RunResult` (strict types: a number where a number belongs; unknown keys are
    free).

    Raises:
        DamagedFileError: the file does not parse, is not an object, or a field has the wrong
            type; one line naming the file, the field and its value, and ``fix``.
        OSError: the file cannot be read.
    """
    from pydantic import ValidationError

    raw = read_json_object(path, fix)
    try:
        _result_schema().validate_python(raw, strict=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise DamagedFileError(f"{path} is damaged: field {where} = {err.get('input')!r:.60} ({err['msg'].lower()}); "
                               f"{fix}") from None
    return RunRecord(raw)


def _set_aside(run_dir: Path) -> Path:
    """Move ``run_dir`` to the first free ``<runs>/.damaged/<run name>-N`` (N = 1, 2, ...)."""
    parent = run_dir.parent / ".damaged"
    parent.mkdir(exist_ok=True)
    n = 1
    while (aside := parent / f"{run_dir.name}-{n}").exists():
        n += 1
    os.rename(run_dir, aside)
    return aside


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
        """The run's record, None when it has none yet.

        Raises:
            DamagedFileError: ``result.json`` is damaged (:func:`read_record`; names the file)."""
        return read_record(self.result) if self.result.exists() else None


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
        """Every ``runs/<name>/result.json`` (moved-aside runs excluded), by run folder name.

        Raises:
            DamagedFileError: a ``result.json`` is damaged (see :meth:`set_aside_damaged`)."""
        return {d.name: r for d, r in self.iter_results()}

    def iter_results(self) -> Iterator[tuple[RunFolder, "RunRecord"]]:
        """``(run folder, record)`` of every ``runs/*/result.json``, by folder name.

        Raises:
            DamagedFileError: a ``result.json`` is damaged (:func:`read_record`)."""
        for path in sorted(self.runs.glob("*/result.json")):
            try:
                record = read_record(path)
            except FileNotFoundError:
                continue  # a dangling link, or a run folder moved away since the listing
            yield RunFolder(path.parent), record

    def set_aside_damaged(self, log: Callable[[str], None]) -> list[Path]:
        """Move the folder of every run whose ``result.json`` is damaged (:func:`read_record`
        refuses it) to ``runs/.damaged/<run name>-N``, whole (nothing is lost), so that the run
        counts as not done and is trained again; ``log`` one line per run. Returns the new paths.
        A folder another process moved first is skipped."""
        moved = []
        for path in sorted(self.runs.glob("*/result.json")):
            try:
                read_record(path)
            except DamagedFileError as exc:
                try:
                    aside = _set_aside(path.parent)
                except FileNotFoundError:
                    continue
                reason = str(exc).split(" is damaged: ", 1)[-1].split("; ", 1)[0]
                log(f"[{path.parent.name}] {path} is damaged ({reason}): the run folder is kept as {aside}; "
                    "the run is trained again")
                moved.append(aside)
            except FileNotFoundError:
                continue
        return moved


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
