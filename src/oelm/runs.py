"""The run record: what one run of a matrix is called, and what it writes about itself.

This is the ground floor shared by the writer (:mod:`oelm.experiment`) and the readers
(:mod:`oelm.report`, :mod:`oelm.monitor`); it imports nothing of theirs, so they never import
each other. An experiment's output folder::

    outputs/<name>/runs/<run name>/
      status.json     state (running / finished / failed / interrupted), stage, total steps, pid, host, times
      result.json     a :class:`RunResult` once the run finished or failed
      metrics.jsonl   train / eval / test records (written by :mod:`oelm.train`)
"""

from __future__ import annotations

import hashlib
import math
import os
import platform
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Literal

from typing_extensions import TypedDict  # pydantic validates it (typing.TypedDict only from Python 3.12)

from oelm.errors import ChecksumError, DamagedFileError, RecordedFileMissingError
from oelm.io import read_json_object, sha256_file, write_json_atomic

if TYPE_CHECKING:
    from oelm.matrix.store import RunRecord

__all__ = [
    "DRIFT_WARNING_PERCENT",
    "SWEEP_FIX",
    "read_sweep",
    "grid_edge",
    "grid_edge_note",
    "format_rates",
    "is_superseded",
    "superseded_final_runs",
    "PlannedRun",
    "RunResult",
    "Performance",
    "run_name",
    "read_status",
    "write_status",
    "utc_now",
    "BEST_CHECKPOINT",
    "checkpoint_record",
    "verify_checkpoint",
]

#: The best-on-validation weights of a finished run, relative to its run folder.
BEST_CHECKPOINT = "checkpoint/model.safetensors"

#: What to do about a damaged ``sweep.json`` (derived from the runs' results, so it can be rewritten).
SWEEP_FIX = "delete it: `oelm run --collect` (or `oelm run`) with the same --output-dir writes it again from the runs"

# Change of the matmul speed probe between the start and the end of a run (%) beyond which the
# report says the run's timings are suspect (the machine's speed drifted).
DRIFT_WARNING_PERCENT = 10.0

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def grid_edge(learning_rates: Iterable[float], selected: float | None) -> str | None:
    """Where ``selected`` sits in the learning-rate grid it was chosen from: ``"low"`` (the
    smallest candidate), ``"high"`` (the largest) or None (an interior candidate, no selection,
    or a grid of fewer than 2 distinct rates, i.e. no sweep). A selection on an edge means the
    best rate may lie outside the grid, so a wider grid could change the result.

    ``learning_rates`` is every candidate tried, whatever its runs' status (the writer passes
    the configured grid; the report the rates of ``sweep.json``'s entries)."""
    grid = sorted({float(lr) for lr in learning_rates if lr is not None})
    if selected is None or len(grid) < 2:
        return None
    if math.isclose(selected, grid[0], rel_tol=1e-9):
        return "low"
    if math.isclose(selected, grid[-1], rel_tol=1e-9):
        return "high"
    return None


def format_rates(learning_rates: Iterable[float]) -> str:
    """A learning-rate grid as the reader sees it: sorted, distinct, ``[0.0005, 0.001, 0.002]``."""
    return "[" + ", ".join(f"{x:g}" for x in sorted({float(lr) for lr in learning_rates if lr is not None})) + "]"


def grid_edge_note(learning_rates: Iterable[float], edge: str) -> str:
    """The reader's note for a selection on ``edge`` (``"low"`` / ``"high"``, from :func:`grid_edge`)
    of ``learning_rates``: "selected learning rate 0.0001 is the lowest of its grid [0.0001, 0.0002];
    a wider grid could change the result" (no trailing period; the run log and the report's
    warnings prefix the method)."""
    grid = sorted({float(lr) for lr in learning_rates if lr is not None})
    lr, word = (grid[0], "lowest") if edge == "low" else (grid[-1], "highest")
    return (f"selected learning rate {lr:g} is the {word} of its grid {format_rates(grid)}; "
            "a wider grid could change the result")


def is_superseded(record: RunRecord, selected: dict[str, float]) -> bool:
    """Whether ``record`` is a final run of a swept method at a learning rate other than the one
    ``selected`` (``sweep.json``'s ``selected_learning_rates``) names now, in a run folder named
    for its rate (:func:`run_name` with a learning rate). That happens only when
    the method's learning-rate grid grew after its final runs had started and the new sweep moved
    the selection (``grid_growth`` in ``experiment.json``): such runs are kept on disk and left
    out of every comparison."""
    chosen = selected.get(record.method)
    lr = record.learning_rate
    if chosen is None or lr is None or not record.is_final:
        return False
    swept_run = record.name == run_name(record.method, record.seed, lr)  # named for its rate
    return swept_run and not math.isclose(float(lr), float(chosen), rel_tol=1e-9)


def run_results(out: str | Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every ``runs/<name>/result.json`` under the output directory ``out``, sorted by run folder
    name: ``(run folder, parsed result)``. Raises what :func:`oelm.io.read_json_object` raises for an
    unreadable file (it names the file)."""
    for path in sorted(Path(out).glob("runs/*/result.json")):
        yield path.parent, read_json_object(path, "restore it from a copy, or rerun `oelm run` with that --output-dir "
                                                  "to train the run again")


def superseded_final_runs(out: str | Path) -> list[dict[str, Any]]:
    """The superseded final runs under ``out`` (:func:`is_superseded` against ``out/sweep.json``),
    sorted by run name: ``method``, ``seed``, ``run_name``, ``learning_rate`` and ``test`` (its
    test value if it evaluated the test split, else None). Empty without a ``sweep.json``."""
    from oelm.matrix.store import MatrixFolder  # the store imports this module

    folder = MatrixFolder(out)
    if not folder.sweep.exists():
        return []
    selected = read_sweep(folder.sweep).get("selected_learning_rates") or {}
    found = []
    for run_dir, r in folder.iter_results():
        if is_superseded(r, selected):
            found.append({"method": r.method, "seed": r.seed, "run_name": r.name or run_dir.name,
                          "learning_rate": r.learning_rate, "test": r.test})
    return found


class SweepEntry(TypedDict, total=False):
    """One sweep run in ``sweep.json``'s ``methods``: its rate, seed, best validation and status."""

    learning_rate: float | None
    seed: int | None
    best_validation: float | None
    selected: bool
    status: str | None


class GridGrowth(TypedDict, total=False):
    """One growth of a method's learning-rate grid (``grid_growth`` in experiment.json / sweep.json)."""

    to: list[float]
    at: str | None
    tested_final_runs: list[str]


class SweepFile(TypedDict, total=False):
    """The parts of ``sweep.json`` that readers use (written by the matrix driver)."""

    selected_learning_rates: dict[str, float]
    selected_at_grid_edge: dict[str, str | None]
    sweep_seeds: list[int]
    methods: dict[str, list[SweepEntry]]
    grid_growth: dict[str, list[GridGrowth]]


def read_sweep(path: str | Path) -> dict[str, Any]:
    """``sweep.json`` at ``path``, its fields checked (:class:`SweepFile`, strict types).

    Raises:
        DamagedFileError: the file does not parse or a field has the wrong type; names the file,
            the field and the fix (:data:`SWEEP_FIX`: it is derived from the runs, so it can be rewritten).
    """
    from pydantic import TypeAdapter, ValidationError

    sweep = read_json_object(path, SWEEP_FIX)
    try:
        TypeAdapter(SweepFile).validate_python(sweep, strict=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise DamagedFileError(f"{path} is damaged: field {where} = {err.get('input')!r:.60} ({err['msg'].lower()}); "
                               f"{SWEEP_FIX}") from None
    return sweep


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


class Performance(TypedDict, total=False):
    """``result["performance"]``: metric values in the metric's unit (accuracy %, perplexity);
    None where a value was not finite (JSON has no NaN)."""

    metric: str
    best_validation: float | None
    best_step: int | None
    final_validation: float | None
    final_train_loss: float | None
    test: float | None
    steps: int | None  # optimizer steps taken
    early_stopped: bool  # training.early_stopping_patience ended it before budget.planned_steps (absent in older results)


class Timing(TypedDict, total=False):
    """The parts of ``result["timing"]`` the readers use (seconds, ms, tokens/s; the rest is free)."""

    device: str | None
    mixed_precision: str | None
    total_seconds: float | None
    train_seconds: float | None
    tokens_per_second: float | None
    compile_seconds: float | None
    timing_warmup_steps_excluded: int | None
    per_step_ms: dict[str, Any] | None  # median, mean, p10, p90 (ms), n
    step_ms: list[float | None] | None  # every measured step
    mfu: dict[str, Any] | None  # mfu (a fraction), peak_source, peak_precision, ...
    gpu_telemetry: dict[str, Any] | None


class Environment(TypedDict, total=False):
    """The parts of ``result["environment"]`` the readers use."""

    hostname: str | None
    device: str | None
    cpu_model: str | None
    python: str | None
    platform: str | None
    torch_num_threads: int | None
    packages: dict[str, Any] | None
    cuda: dict[str, Any] | None
    matmul_probe: dict[str, Any] | None  # gflops (GFLOP/s) before the run
    matmul_probe_after: dict[str, Any] | None
    matmul_probe_drift_percent: float | None


class Parameters(TypedDict, total=False):
    """``result["parameters"]``: counts of the model's parameters."""

    total: int | None
    trainable: int | None
    frozen: int | None
    trainable_percent: float | None
    groups: dict[str, Any] | None


class Data(TypedDict, total=False):
    """The parts of ``result["data"]`` the readers use: per split sizes and label counts."""

    num_labels: int | None
    train: dict[str, Any] | None
    validation: dict[str, Any] | None
    test: dict[str, Any] | None


class RunResult(TypedDict, total=False):
    """The schema of ``runs/<name>/result.json`` (a plain JSON object on disk).

    Identity: ``method``, ``seed``, ``run_name``, ``learning_rate``, ``stage`` ("sweep" |
    "final"), ``selected``, ``task``, ``model``. ``status`` is "finished" or "failed"; a failed
    run has ``failure`` {kind, message, step} and no numbers. A finished run has ``config``,
    ``method_config``, ``init_from``, ``tokenizer`` ({spec, vocab_size, sha256}:
    :func:`oelm.data.lm.tokenizer_record`; absent in older results), ``data`` (per split sizes,
    label counts), ``budget``
    (steps and steps_run: taken, planned_steps; samples, tokens, batch sizes, accumulation, world
    size), ``environment``,
    ``parameters`` (total / trainable / frozen, per group), ``projections``, ``performance``
    (:class:`Performance`), ``timing`` (see :func:`oelm.train.train`) and ``stop_signal``,
    and (with ``training.save_best_checkpoint``) ``checkpoint`` {path (relative to the run
    folder), sha256 (hex), bytes} of its best weights (:func:`checkpoint_record`), checked by
    :func:`verify_checkpoint` whenever those weights are reused.
    """

    method: str
    seed: int
    run_name: str
    learning_rate: float
    stage: Literal["sweep", "final"] | None
    selected: bool
    swept: bool
    task: str
    model: str
    status: Literal["finished", "failed"]
    failure: dict[str, Any]
    config: dict[str, Any]
    method_config: dict[str, Any]
    init_from: dict[str, Any] | None
    tokenizer: dict[str, Any] | None
    data: Data
    budget: dict[str, Any]
    environment: Environment
    parameters: Parameters
    projections: list[dict[str, Any]]
    performance: Performance
    timing: Timing
    stop_signal: str | None
    checkpoint: dict[str, Any] | None
    executor: dict[str, Any]  # where it trained: name, node, threads (torch's), shared_node, overlapped


def utc_now() -> str:
    """The current UTC time, ISO 8601 to the second (``2026-11-23T16:40:00+00:00``)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def read_status(run_dir: Path) -> dict[str, Any]:
    """``run_dir/status.json`` ({} when absent).

    Raises:
        DamagedFileError: the file is damaged (names it)."""
    path = Path(run_dir) / "status.json"
    return read_json_object(path, "delete it: the run writes it again when it starts") if path.exists() else {}


def write_status(run_dir: Path, run: PlannedRun, state: str, **fields: Any) -> None:
    """``runs/<name>/status.json``: what ``oelm monitor`` reads (state, stage, total steps, times).

    ``state`` "running" sets ``started_at`` (UTC; ``started_unix`` the same in seconds since the
    epoch) and clears ``finished_at`` and an earlier
    process's ``signal`` / ``failure`` (a resumed run is running, not interrupted); any other state
    sets ``finished_at``. ``fields`` are merged in (``total_steps``, ``failure``, ``signal``, ...).
    """
    path = Path(run_dir) / "status.json"
    try:
        status = read_status(run_dir)
    except DamagedFileError:
        status = {}  # a hand-damaged status: this write replaces it whole
    # a second "running" from the same process (total steps known) keeps its start time
    again = status.get("state") == "running" and status.get("pid") == os.getpid() and status.get("host") == platform.node()
    status.update(
        {"name": Path(run_dir).name, "method": run.method, "seed": run.seed, "learning_rate": run.learning_rate,
         "stage": run.stage, "state": state, "pid": os.getpid(), "host": platform.node()}
    )
    if state == "running" and not again:
        status["started_at"] = utc_now()
        status["started_unix"] = time.time()  # seconds: overlaps between runs are computed from these
    if state == "running":
        for stale in ("finished_at", "finished_unix", "signal", "failure"):
            status.pop(stale, None)
    else:
        status["finished_at"] = utc_now()
        status["finished_unix"] = time.time()
    status.update(fields)
    write_json_atomic(path, status)


def checkpoint_record(run_dir: Path) -> dict[str, Any] | None:
    """``{"path": "checkpoint/model.safetensors", "sha256": <hex>, "bytes": <size>}`` of the best
    weights a finished run wrote in ``run_dir``; None when it wrote none."""
    path = Path(run_dir) / BEST_CHECKPOINT
    if not path.is_file():
        return None
    return {"path": BEST_CHECKPOINT, "sha256": sha256_file(path), "bytes": path.stat().st_size}


def verify_checkpoint(run_dir: Path, result: dict[str, Any], fix: str) -> Path:
    """The best-weights file of the finished run in ``run_dir``, checked against the size and
    sha256 its ``result`` records. A result without a record (written before oelm recorded
    them) is accepted unchecked.

    Args:
        fix: what the user should do if the file is corrupted (ends the error message).

    Raises:
        ChecksumError: the file's size or sha256 differs from the record (names the file and
            ``result.json``); :class:`~oelm.errors.RecordedFileMissingError`, a subclass, when
            the file is missing.
    """
    run_dir = Path(run_dir)
    record = result.get("checkpoint")
    if not isinstance(record, dict) or not record.get("sha256"):
        return run_dir / BEST_CHECKPOINT
    path = run_dir / record.get("path", BEST_CHECKPOINT)
    if not path.is_file():
        raise RecordedFileMissingError(f"{path} is missing, but {run_dir / 'result.json'} records it; {fix}")
    size = path.stat().st_size
    if size != record.get("bytes", size) or sha256_file(path) != record["sha256"]:
        raise ChecksumError(
            f"{path} is corrupted: its size or sha256 differs from the one recorded in {run_dir / 'result.json'}; {fix}"
        )
    return path
