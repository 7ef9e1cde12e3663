"""The output-folder contract: what a run is called, every path of a matrix folder and of a run
folder, and the listings of runs (their records, their folders).

A matrix's output folder (``--output-dir``)::

    <out>/
      .oelm.lock          held (flock) by the process driving the matrix (oelm.runtime.lock)
      config.yaml         the resolved config            experiment.json  its fingerprint (resume check)
      plan.json           every planned run (monitor)    sweep.json       selection on validation
      tokenizer.json      oelm GPT's tokenizer           comparison.json, report.md, report.html
      runs/<run name>/    one folder per run (:class:`RunFolder`)
      runs/.failed/, runs/.weights-missing/   runs moved aside before a retry
      runs/.damaged/      runs whose result.json was damaged, moved aside whole (trained again)

and a run's folder::

    runs/<run name>/
      status.json     state (running / finished / failed / interrupted), stage, total steps, pid, host, times
      result.json     a :class:`~oelm.records.result.RunRecord` once the run finished or failed
      metrics.jsonl   train / eval / test records (written by :mod:`oelm.training`)
      train.log       the console output while it trained (or was promoted), whichever process ran it
      checkpoint/model.safetensors   the best-on-validation weights; checkpoints/step-<N>/ while it trains
      predictions.npz per-example predictions of a final run (validation, test)
      diagnostics.json  attention diagnostics of a final run that finished without them (`oelm diagnose`)

Only the driver (``oelm run``, ``oelm plan``, ``--collect``) writes the files of ``<out>``; a run
writes only its own ``runs/<run name>/``, whichever executor or machine trains it. That is what
lets runs train anywhere that sees the folder (a Ray cluster, a batch system's jobs).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterator

from oelm.errors import ChecksumError, DamagedFileError, RecordedFileMissingError
from oelm.io import MANIFEST_NAME, inside, sha256_file

from oelm.records.result import DAMAGED_RESULT_FIX, RunRecord, read_record

__all__ = ["MatrixFolder", "RunFolder", "PlannedRun", "run_name", "step_checkpoints", "BEST_CHECKPOINT", "PREDICTIONS_FILE",
           "DIAGNOSTICS_FILE"]

#: The best-on-validation weights of a finished run, relative to its run folder.
BEST_CHECKPOINT = "checkpoint/model.safetensors"
#: A final run's per-example predictions (:mod:`oelm.records.predictions`), relative to its run folder.
PREDICTIONS_FILE = "predictions.npz"
#: What ``oelm diagnose`` writes into a run folder (:mod:`oelm.matrix.diagnose`): ``{"run_name",
#: "method", "seed", "checkpoint_sha256" (of the weights it read), "diagnostics"}``.
DIAGNOSTICS_FILE = "diagnostics.json"

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_STEP_DIR = re.compile(r"^step-(\d+)$")


def step_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step-<N>`` directory under ``root`` (a run's ``checkpoints/``),
    newest first; none when ``root`` is not a directory. Their contents are not checked here.

    Raises:
        OutsideFolderError: a ``step-<N>`` is a symbolic link (:func:`oelm.io.inside`)."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), inside(root, p.name)) for p in root.iterdir() if (m := _STEP_DIR.match(p.name))]
    found = [(step, p) for step, p in found if p.is_dir()]
    return sorted(found, reverse=True)


def run_name(method: str, seed: int, learning_rate: float | None = None) -> str:
    """Directory name of a run; user strings are sanitized so they cannot escape ``runs/``.

    ``learning_rate`` is part of the name for methods whose learning rate is swept
    (``oelm_freeze-lr0.001-seed0``), so every (method, learning rate, seed) has its own folder;
    methods with a single learning rate keep ``<method>-seed<k>``. A method name that is already
    safe (letters, digits, ``_ . -``, no leading dot) is kept as is; any other one (``"../x"``,
    ``"a/b"``, spaces, ...) is sanitized and gets 8 hex digits of the sha256 of the original name,
    so two different names never share a run directory.
    """
    safe = _SAFE.sub("_", method).strip("._")[:64] or "method"
    if safe != method:
        safe = f"{safe}-{hashlib.sha256(method.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"
    lr = "" if learning_rate is None else "-lr" + _SAFE.sub("_", f"{learning_rate:g}")
    return f"{safe}{lr}-seed{seed}"


@dataclass(frozen=True)
class PlannedRun:
    """One cell of the matrix: a method at one learning rate and seed, in a stage."""

    method: str
    learning_rate: float
    seed: int
    stage: str  # "sweep" | "final"
    name: str  # run directory under runs/


@dataclass(frozen=True)
class RunFolder:
    """``<out>/runs/<run name>/``: what one run writes about itself."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def result(self) -> Path:
        """``result.json``: the :class:`RunRecord`, written once the run finished or failed."""
        return inside(self.path, "result.json")

    @property
    def status(self) -> Path:
        """``status.json``: state, stage, total steps, pid, host, start/end times (:mod:`oelm.records.status`)."""
        return inside(self.path, "status.json")

    @property
    def metrics(self) -> Path:
        """``metrics.jsonl``: train / eval / test records, one JSON object a line."""
        return inside(self.path, "metrics.jsonl")

    @property
    def train_log(self) -> Path:
        """``train.log``: the console output of every process that trained or promoted this run
        (:mod:`oelm.matrix.run_log`)."""
        return inside(self.path, "train.log")

    @property
    def best_weights(self) -> Path:
        """``checkpoint/model.safetensors``: the best-on-validation weights (sha256 in result.json)."""
        return inside(self.path, BEST_CHECKPOINT)

    @property
    def predictions(self) -> Path:
        """``predictions.npz``: a final run's per-example predictions (sha256 in result.json; :mod:`oelm.records.predictions`)."""
        return inside(self.path, PREDICTIONS_FILE)

    @property
    def diagnostics(self) -> Path:
        """``diagnostics.json``: attention diagnostics ``oelm diagnose`` computed from the best weights
        of a final run that finished without them (the run's ``result.json`` is never rewritten)."""
        return inside(self.path, DIAGNOSTICS_FILE)

    @property
    def checkpoints(self) -> Path:
        """``checkpoints/step-<N>/``: resumable checkpoints, removed when the run finishes."""
        return inside(self.path, "checkpoints")

    @property
    def tensorboard(self) -> Path:
        return inside(self.path, "tensorboard")

    @property
    def lock(self) -> Path:
        """``.oelm.lock``: held while ``oelm run --only`` trains this run (oelm.runtime.lock)."""
        return inside(self.path, ".oelm.lock")

    def holds_results(self) -> bool:
        """Whether this run has produced something of its config: a ``result.json`` (finished or
        failed: a failure is a finding too) or a resumable checkpoint (a ``checkpoints/step-<N>/``
        whose manifest was written, i.e. one that was completed). A folder with only
        ``status.json`` / ``train.log`` (a run that stopped before its first checkpoint, say on a
        config error) holds none."""
        return self.result.exists() or any((p / MANIFEST_NAME).is_file() for _, p in step_checkpoints(self.checkpoints))

    def read_result(self) -> RunRecord | None:
        """The run's record, None when it has none yet.

        Raises:
            DamagedFileError: ``result.json`` is damaged (:func:`read_record`; names the file)."""
        return read_record(self.result) if self.result.exists() else None

    def checkpoint_record(self) -> dict | None:
        """``{"path": "checkpoint/model.safetensors", "sha256": <hex>, "bytes": <size>}`` of the best
        weights a finished run wrote here; None when it wrote none."""
        path = self.best_weights
        if not path.is_file():
            return None
        return {"path": BEST_CHECKPOINT, "sha256": sha256_file(path), "bytes": path.stat().st_size}

    def verify_weights(self, record: RunRecord, fix: str) -> Path:
        """The best-weights file of the finished run here, checked against the size and sha256
        its ``record`` holds. A record without them (written before oelm recorded them) is
        accepted unchecked.

        Args:
            fix: what the user should do if the file is corrupted (ends the error message).

        Raises:
            ChecksumError: the file's size or sha256 differs from the record (names the file and
                ``result.json``); :class:`~oelm.errors.RecordedFileMissingError`, a subclass, when
                the file is missing.
            OutsideFolderError: the recorded path leads outside the run folder, or through a
                symbolic link (:func:`oelm.io.inside`).
        """
        recorded = record.checkpoint
        if not isinstance(recorded, dict) or not recorded.get("sha256"):
            return self.best_weights
        path = inside(self.path, str(recorded.get("path", BEST_CHECKPOINT)), named_in=self.result)
        if not path.is_file():
            raise RecordedFileMissingError(f"{path} is missing, but {self.result} records it; {fix}")
        size = path.stat().st_size
        if size != recorded.get("bytes", size) or sha256_file(path) != recorded["sha256"]:
            raise ChecksumError(f"{path} is corrupted: its size or sha256 differs from the one recorded in {self.result}; {fix}")
        return path


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
class MatrixFolder:
    """``<out>``: the files of one matrix (module docstring)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    # Every path below goes through oelm.io.inside: a symbolic link planted in the folder is refused.
    experiment = property(lambda self: inside(self.root, "experiment.json"))
    config = property(lambda self: inside(self.root, "config.yaml"))
    plan = property(lambda self: inside(self.root, "plan.json"))
    sweep = property(lambda self: inside(self.root, "sweep.json"))
    comparison = property(lambda self: inside(self.root, "comparison.json"))
    original_layout = property(lambda self: inside(self.root, "original_layout.json"))
    report_md = property(lambda self: inside(self.root, "report.md"))
    report_html = property(lambda self: inside(self.root, "report.html"))
    tokenizer = property(lambda self: inside(self.root, "tokenizer.json"))
    runs = property(lambda self: inside(self.root, "runs"))

    def run(self, name: str) -> RunFolder:
        """The run folder ``runs/<name>``.

        Raises:
            OutsideFolderError: ``name`` leads outside ``runs/``, or the folder is a symbolic link."""
        return RunFolder(inside(self.runs, name))

    def aside(self, kind: str, name: str) -> Path:
        """``runs/<kind>/<name>-<local time>``: where a run's folder is moved before it starts
        afresh (``kind``: ``.failed`` before a retry, ``.weights-missing`` before a retrain)."""
        return self.runs / kind / f"{name}-{datetime.now():%Y%m%d-%H%M%S}"

    def run_folders(self) -> list[RunFolder]:
        """Every run folder under ``runs/`` (moved-aside ones, under hidden folders, excluded), by name."""
        if not self.runs.is_dir():
            return []
        return [self.run(p.name) for p in sorted(self.runs.iterdir()) if p.is_dir() and not p.name.startswith(".")]

    def runs_with_results(self) -> list[RunFolder]:
        """Every run folder that :meth:`RunFolder.holds_results`, under ``runs/`` and among the
        folders moved aside (``runs/.failed/``, ``.damaged/``, ``.weights-missing/``): what a
        different config must never take over (:func:`oelm.matrix.output.start_output`)."""
        if not self.runs.is_dir():
            return []
        aside = [p for d in sorted(self.runs.iterdir()) if d.is_dir() and d.name.startswith(".") for p in sorted(d.iterdir())]
        return [f for f in [*self.run_folders(), *map(RunFolder, aside)] if f.path.is_dir() and f.holds_results()]

    def metrics_of(self, name: str | None, method: str, seed: int, learning_rate: float | None = None) -> Path | None:
        """The ``metrics.jsonl`` of a run: in its folder ``name``; results written before run names
        existed are found under ``<method>-lr<lr>-seed<k>`` (swept methods) or ``<method>-seed<k>``.
        None when there is none."""
        names = [name] if name else []
        if learning_rate is not None:
            names.append(run_name(method, seed, learning_rate))
        names.append(run_name(method, seed))
        return next((self.run(n).metrics for n in names if self.run(n).metrics.exists()), None)

    def read_result(self, run: PlannedRun | str) -> RunRecord | None:
        return self.run(run if isinstance(run, str) else run.name).read_result()

    def results(self) -> dict[str, RunRecord]:
        """Every ``runs/<name>/result.json`` (moved-aside runs excluded), by run folder name.

        Raises:
            DamagedFileError: a ``result.json`` is damaged (see :meth:`set_aside_damaged`)."""
        return {d.name: r for d, r in self.iter_results()}

    def iter_results(self, fix: str = DAMAGED_RESULT_FIX) -> Iterator[tuple[RunFolder, RunRecord]]:
        """``(run folder, record)`` of every ``runs/*/result.json``, by folder name.

        Raises:
            DamagedFileError: a ``result.json`` is damaged (:func:`read_record`; ends with ``fix``)."""
        for path in sorted(self.runs.glob("*/result.json")):
            run = self.run(path.parent.name)  # a run folder or result.json that is a link: refused
            try:
                record = read_record(run.result, fix)
            except FileNotFoundError:
                continue  # a run folder moved away since the listing
            yield run, record

    def check_weights(self, records: list[RunRecord], fix: Callable[[RunFolder], str]) -> tuple[list[str], int]:
        """Every finished record's best weights here against the size and sha256 it records
        (:meth:`RunFolder.verify_weights`): one message per file that is there but does not match
        (ending with ``fix(run folder)``), and the number of recorded files that are not there at all
        (weights left out of committed results, say)."""
        problems, absent = [], 0
        for r in records:
            if r.finished and r.name:
                run = self.run(r.name)
                try:
                    run.verify_weights(r, fix(run))
                except RecordedFileMissingError:
                    absent += 1
                except ChecksumError as exc:
                    problems.append(str(exc))
        return problems, absent

    def set_aside_damaged(self, log: Callable[[str], None]) -> list[Path]:
        """Move the folder of every run whose ``result.json`` is damaged (:func:`read_record`
        refuses it) to ``runs/.damaged/<run name>-N``, whole (nothing is lost), so that the run
        counts as not done and is trained again; ``log`` one line per run. Returns the new paths.
        A folder another process moved first is skipped."""
        moved = []
        for found in sorted(self.runs.glob("*/result.json")):
            path = self.run(found.parent.name).result  # a link planted there: refused, never read
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
