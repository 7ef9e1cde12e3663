"""Train exactly one planned run: :func:`execute` does a :class:`~oelm.matrix.plan.RunTask` (train,
continue, keep, or promote one run) in this process and returns its record; it writes only that
run's folder (through :mod:`oelm.records`). :func:`train_planned_run` is the same for a process that has nothing but the
config (a Ray task, ``oelm run --only``): it prepares the data itself (once per process).
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader

from oelm.config import ExperimentConfig, MethodEntry, TrainingConfig, config_from_dict
from oelm.data.registry import resolve_data_dir
from oelm.errors import OELMError, RecordedFileMissingError, RunFaultError, RunInterruptedError
from oelm.integrations.trackers import TrackedRun
from oelm.matrix.data import PreparedData, make_loaders
from oelm.metrics import get_metric
from oelm.records import (
    MatrixFolder, PlannedRun, RunFolder, RunRecord, budget_record, failed_result, finished_result, read_record,
    read_status, run_identity, write_record,
)
from oelm.records import write_status as _write_status_file
from oelm.records.predictions import predictions_record
from oelm.runtime.distributed import barrier, is_main_process, main_process_only, num_processes
from oelm.runtime.environment import capture_environment, probe_drift_percent, run_probes_wanted
from oelm.runtime.lock import pid_alive
from oelm.training import evaluate, optimizer_steps_per_epoch, planned_total_steps, train
from oelm.training.evaluation import evaluate_predictions, token_accuracy_fields
from oelm.training.prediction_collector import collector_for, write_final_predictions

from oelm.matrix.assemble import build_run_model
from oelm.matrix.diagnose import run_diagnostics
from oelm.matrix.output import bind_data, prepare_matrix_data
from oelm.matrix.plan import RunTask
from oelm.matrix.run_log import copy_console

__all__ = ["RunContext", "execute", "train_planned_run", "placement_record", "verify_kept", "promote", "mark_final"]

# Every process of a launched job runs the protocol; rank 0 alone writes its files.
_write_record = main_process_only(write_record)
write_status = main_process_only(_write_status_file)


@dataclass
class RunContext:
    """What every run of one matrix shares (fixed once the data is prepared).

    Attributes:
        placement: where the run trains (:func:`placement_record`), copied into each result's
            ``executor`` with its start and end times and the runs it overlapped.
    """

    config: ExperimentConfig
    out: Path
    data: PreparedData
    log: Callable[[str], None]
    retry_failed: bool = False
    allow_missing_weights: bool = False
    placement: dict[str, Any] = field(default_factory=lambda: placement_record("local"))

    def entry(self, method: str) -> MethodEntry:
        return next(m for m in self.config.methods if m.name == method)

    @property
    def folder(self) -> MatrixFolder:
        return MatrixFolder(self.out)


def placement_record(executor: str, **fields: Any) -> dict[str, Any]:
    """``{"name": executor, "node": <host name>, "pid": <this process>, ...fields}``: the
    ``executor`` block of a result (``fields``: ``node_id``, ``lanes``, ``cpus_per_run``,
    ``gpus_per_run``, ``attempt``)."""
    return {"name": executor, "node": platform.node(), "pid": os.getpid(), **fields}


def _total_steps(training: TrainingConfig, train_loader: DataLoader) -> int:
    """Optimizer steps of a run (as :func:`oelm.training.train` computes them from the loader
    Accelerate shards over the processes)."""
    per_process = math.ceil(len(train_loader) / num_processes())
    return planned_total_steps(training, optimizer_steps_per_epoch(per_process, training.gradient_accumulation_steps))


def _identity(config: ExperimentConfig, run: PlannedRun) -> dict[str, Any]:
    return run_identity(run, config.task.dataset, config.model.display_name)


def _train(ctx: RunContext, run: PlannedRun, folder: RunFolder, *, evaluate_test: bool) -> RunRecord:
    """Train one run; returns its record (status "finished"). Faults propagate."""
    started = time.perf_counter()
    config, data, log = ctx.config, ctx.data, ctx.log
    entry = ctx.entry(run.method)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    probes = run_probes_wanted()  # $OELM_SPEED_PROBE
    env_before = capture_environment(device, probe=probes)
    model, oelm_cfg, report, init_info = build_run_model(config, entry, run.seed, data)
    log(f"[{folder.name}] {report}")
    training = config.training_for(entry)
    train_loader, val_loader, test_loader = make_loaders(data, training, run.seed)
    total_steps = _total_steps(training, train_loader)
    write_status(folder, run, "running", total_steps=total_steps)
    before_train = time.perf_counter()
    result = train(
        model, train_loader, val_loader, metric=data.metric, config=training, learning_rate=run.learning_rate,
        run_dir=folder.path, test_loader=test_loader if evaluate_test else None, description=folder.name,
        tracked=TrackedRun(config.name, {**config.model_dump(mode="json"), "run": _identity(config, run)}, ctx.out),
        predictions=run.stage == "final",  # a final run: per-example predictions of its best weights (predictions.npz)
    )
    if result.early_stopped:
        metric = get_metric(result.metric)
        by = f" by more than {training.early_stopping_min_delta:g}" if training.early_stopping_min_delta else ""
        log(f"[{folder.name}] early stop at step {result.steps} of {total_steps}: no improvement{by} in "
            f"{training.early_stopping_patience} validations (best {metric.name} {metric.format(result.best_validation)} "
            f"at step {result.best_step})")
    environment = _environment_around(env_before, capture_environment(device, probe=probes))
    # a final run's attention diagnostics of its best weights: after every timing and the speed probe
    diagnostics = run_diagnostics(model, config, data, log) if run.stage == "final" else None
    _time_outside_train(result.timing, before_train - started, started)
    return finished_result(
        _identity(config, run),
        config=config.model_dump(mode="json"),
        method_config=oelm_cfg.to_dict() | {"learning_rate": run.learning_rate},
        init_from=init_info,
        tokenizer=data.tokenizer_record,
        data=data.summary,
        data_source=data.source,  # content hashes of the files each split was read from (oelm.data.identity)
        budget=_budget(ctx, folder, training, result, total_steps),
        environment=environment,
        report=report,
        train=result,
        # path, sha256 and size of the best weights train() wrote (rank 0): checked on every reuse
        checkpoint=folder.checkpoint_record() if training.save_best_checkpoint and is_main_process() else None,
        # path, sha256 and size of the final run's per-example predictions (oelm.records.predictions); None for a sweep run
        predictions=predictions_record(folder.path) if is_main_process() else None,
        diagnostics=diagnostics,  # oelm.method.diagnostics on the fixed validation batch; None for a sweep run
    )


def _time_outside_train(timing: dict[str, Any], before_train: float, started: float) -> None:
    """Add to a run's ``timing`` what it spent outside :func:`oelm.training.train` in this process:
    ``setup_seconds`` gains the seconds before it (the speed probe, the model, the loaders), and
    ``wall_seconds`` is the run's wall time: this process's, from ``started`` (``time.perf_counter``)
    to now (the probe after the run and its diagnostics included), plus the run time of the
    earlier processes of a resumed run (``resumed_seconds``)."""
    timing["setup_seconds"] = timing.get("setup_seconds", 0.0) + before_train
    timing["wall_seconds"] = time.perf_counter() - started + timing.get("resumed_seconds", 0.0)


def _environment_around(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The environment before the run with the speed probe (GFLOP/s) and load after it, and the
    probe's drift over the run (%)."""
    gflops_before = (before.get("matmul_probe") or {}).get("gflops")
    gflops_after = (after.get("matmul_probe") or {}).get("gflops")
    return before | {
        "matmul_probe_after": after.get("matmul_probe"),
        "load_average_after": after.get("load_average"),
        "matmul_probe_drift_percent": (probe_drift_percent(gflops_before, gflops_after)
                                       if gflops_before and gflops_after else None),
    }


def _budget(ctx: RunContext, folder: RunFolder, training: TrainingConfig, result: Any, total_steps: int) -> dict[str, Any]:
    """The run's budget as it ran (:func:`oelm.records.budget_record`). A batch larger than the
    training set is one batch of the whole set: the result records what ran (and the log says so)."""
    processes = result.timing.get("num_processes", 1)
    batch_size = min(training.batch_size, math.ceil(len(ctx.data.train) / processes))
    if batch_size < training.batch_size:
        ctx.log(f"[{folder.name}] training.batch_size={training.batch_size} is larger than the training set "
                f"({len(ctx.data.train)} examples): every step used all {batch_size}; result.json records batch_size={batch_size}")
    return budget_record(
        steps=result.steps, planned_steps=total_steps, samples=result.timing.get("samples"),
        tokens=result.timing.get("tokens"), batch_size=batch_size, batch_size_configured=training.batch_size,
        gradient_accumulation_steps=training.gradient_accumulation_steps, num_processes=processes,
        epochs=training.epochs, max_steps=training.max_steps,
    )


def _failed(config: ExperimentConfig, run: PlannedRun, exc: RunFaultError) -> RunRecord:
    return failed_result(_identity(config, run), config=config.model_dump(mode="json"), kind=exc.kind, message=str(exc),
                         step=exc.step)


def _retrain_hint(run_dir: Path) -> str:
    return f"delete the folder {run_dir} and rerun the same command to train that run again"


def _move_aside(ctx: RunContext, folder: RunFolder, kind: str) -> Path:
    """Move ``folder`` to ``runs/<kind>/<run name>-<local time>`` (rank 0, after every process
    has read its old result) so that the run starts afresh; returns the new place."""
    barrier()
    aside = ctx.folder.aside(kind, folder.name)
    if is_main_process():
        aside.parent.mkdir(parents=True, exist_ok=True)
        folder.path.rename(aside)
    barrier()
    return aside


def verify_kept(ctx: RunContext, folder: RunFolder, previous: RunRecord) -> None:
    """Check an earlier result that is kept: a finished run's best weights must match the sha256
    its ``result.json`` records; logs ``[run] finished earlier; kept (...)``.

    Raises:
        ChecksumError: the weights differ from the record; it is not retrained silently: the
            message says to delete the run's folder (``--retry-failed`` is for failed runs only).
        RecordedFileMissingError: they are missing, unless ``ctx.allow_missing_weights``.
    """
    if previous.finished:
        try:
            folder.verify_weights(previous, _retrain_hint(folder.path))
        except RecordedFileMissingError as exc:
            if not ctx.allow_missing_weights:
                raise RecordedFileMissingError(f"{exc}; or rerun with --allow-missing-weights to keep its result without "
                                               "them (a selected sweep run is then retrained for its test split)") from None
            ctx.log(f"[{folder.name}] its best weights are missing; result kept without them (--allow-missing-weights)")
    ctx.log(f"[{folder.name}] {previous.status} earlier; kept ({folder.result})")


def _reuse_or_clear(ctx: RunContext, run: PlannedRun, folder: RunFolder) -> RunRecord | None:
    """The earlier result of ``run`` when it is to be kept (:func:`verify_kept`); None when the
    run is to (re)start (a failed run under ``retry_failed`` is moved to ``runs/.failed/`` first)."""
    previous = folder.read_result()
    if previous is None:
        if folder.status.exists():
            ctx.log(f"[{run.name}] unfinished; continuing in {folder.path}")
        return None
    if not previous.failed or not ctx.retry_failed:
        verify_kept(ctx, folder, previous)
        return previous
    aside = _move_aside(ctx, folder, ".failed")
    ctx.log(f"[{run.name}] failed earlier; retrying (old run moved to {aside})")
    return None


def _overlaps(matrix: MatrixFolder, me: str, since: float, until: float) -> list[dict[str, Any]]:
    """The other runs of the matrix that trained at some time in ``[since, until]`` (seconds since
    the epoch), from their ``status.json``: ``{"run", "node"}`` each. A run whose status says
    running on this host but whose process is gone is not counted."""
    found = []
    for other in matrix.run_folders():
        if other.name == me or not other.status.exists():
            continue
        try:
            s = read_status(other)
        except (OSError, ValueError):
            continue
        start, end = s.get("started_unix"), s.get("finished_unix")
        if not isinstance(start, (int, float)):
            continue
        if s.get("state") == "running":
            if s.get("host") == platform.node() and not pid_alive(s.get("pid")):
                continue
            end = until
        if isinstance(end, (int, float)) and start <= until and end >= since:
            found.append({"run": other.name, "node": s.get("host")})
    return found


def _with_placement(ctx: RunContext, record: RunRecord, folder: RunFolder, started: float) -> RunRecord:
    """``record`` with its ``executor`` block: where it trained, with how many torch threads
    (``threads``), when (this process's start and end, seconds since the epoch), and the runs that
    trained beside it meanwhile."""
    finished = time.time()
    overlapped = _overlaps(ctx.folder, folder.name, started, finished)
    same_node = [o for o in overlapped if o["node"] == platform.node()]
    return record.placed(ctx.placement | {
        "threads": torch.get_num_threads(),  # torch intra-op threads the run trained with
        "started_unix": started, "finished_unix": finished, "overlapped": overlapped,
        # runs that shared this machine's cores or GPUs: step times are not speed evidence
        "shared_node": bool(same_node),
    })


def _train_cell(ctx: RunContext, run: PlannedRun, evaluate_test: bool) -> RunRecord:
    """Run (or continue, or keep) one cell of the matrix; returns its record (finished or failed).

    Raises:
        RunInterruptedError: SIGTERM/SIGINT (the run's status says ``interrupted``), or a signal
            during the last evaluation of a run that finished and was kept.
        Exception: anything else raised inside the run, after its status is set to ``failed``
            (``failure``: kind "error", the exception's type and message).
    """
    folder = ctx.folder.run(run.name)
    previous = _reuse_or_clear(ctx, run, folder)
    if previous is not None:
        return previous
    folder.path.mkdir(parents=True, exist_ok=True)
    with copy_console(folder.train_log, f"training {run.name}", enabled=is_main_process()):
        return _train_fresh(ctx, run, folder, evaluate_test)


def _train_fresh(ctx: RunContext, run: PlannedRun, folder: RunFolder, evaluate_test: bool) -> RunRecord:
    """:func:`_train_cell` once the run is to (re)start or continue in ``folder``."""
    log = ctx.log
    started = time.time()
    write_status(folder, run, "running")
    try:
        record = _train(ctx, run, folder, evaluate_test=evaluate_test)
    except RunInterruptedError as exc:
        write_status(folder, run, "interrupted", step=exc.step, signal=exc.signal_name)
        log(f"[{run.name}] interrupted ({exc.signal_name}) at step {exc.step}; rerun the same command to continue")
        raise
    except RunFaultError as exc:
        record = _failed(ctx.config, run, exc)
        _write_record(folder.result, record)
        write_status(folder, run, "failed", failure=record.failure)
        log(f"[{run.name}] FAILED ({exc.kind} at step {exc.step}): {exc}; going on with the next run")
        return record
    except KeyboardInterrupt:  # outside the training loop's own signal handling (e.g. while building the model)
        write_status(folder, run, "interrupted", signal="SIGINT")
        raise
    except Exception as exc:
        # Not a fault the matrix can go on from (a bug, or a deliberate error inside the run): the
        # status says failed, so `oelm monitor` does not show the run as running forever, and the
        # exception propagates with its traceback. No result.json: rerunning retries the run.
        write_status(folder, run, "failed",
                     failure={"kind": "error", "type": type(exc).__name__, "message": str(exc), "step": None})
        raise
    record = _with_placement(ctx, record, folder, started)
    _write_record(folder.result, record)
    write_status(folder, run, "finished")
    log(f"[{run.name}] best validation {record.metric} {record.best_validation:.4f} at step {record.best_step}, "
        f"{record.total_seconds:.1f} s total")
    if record.stop_signal:
        raise RunInterruptedError(
            f"{record.stop_signal} arrived during the last evaluation of {run.name}; that run finished and "
            "was kept, the matrix stops here; rerun the same command to continue with the next run",
            step=record.steps,
            signal_name=record.stop_signal,
        )
    return record


def promote(config: ExperimentConfig, entry: MethodEntry, run: PlannedRun, data: PreparedData, run_dir: Path,
            result: RunRecord, log: Callable[[str], None]) -> RunRecord:
    """Make the finished sweep run at the selected learning rate a final run: evaluate the test
    split once, from its best-on-validation checkpoint, save its predictions (validation, evaluated
    once more with those weights: a sweep run keeps none, and test:
    :func:`~oelm.training.prediction_collector.write_final_predictions`; none without best weights) and mark
    it ``stage: final``, ``selected: true``. The run is not retrained (same seed, data order and
    budget as a fresh final run would have).

    Raises:
        ChecksumError: its best weights do not match the sha256 its result records
            (:class:`~oelm.errors.RecordedFileMissingError` when they are missing).
    """
    folder = RunFolder(run_dir)
    test_value, seconds, test_eval, diagnosed = None, None, {}, {}
    if data.test is not None or folder.best_weights.is_file():
        ckpt = folder.verify_weights(result, _retrain_hint(folder.path))
        if not ckpt.is_file():
            raise OELMError(f"{folder.path}: the selected sweep run has no checkpoint/model.safetensors to evaluate the "
                            "test split with")
        from safetensors.torch import load_model

        model, _, _, _ = build_run_model(config, entry, run.seed, data)
        load_model(model, str(ckpt))
        training = config.training_for(entry)
        _, val_loader, test_loader = make_loaders(data, training, run.seed)
        test_rows = collector_for(test_loader, data.metric) if test_loader is not None else None
        if test_loader is not None:
            t0 = time.perf_counter()
            test_eval = evaluate(model, test_loader, data.metric, training.mixed_precision, predictions=test_rows)
            test_value = test_eval["value"]
            seconds = time.perf_counter() - t0
            if is_main_process():
                with folder.metrics.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"type": "test", "step": result.best_step, data.metric: test_value,
                                         **token_accuracy_fields(test_eval)}) + "\n")
            log(f"[{folder.name}] selected; test {data.metric} {test_value:.4f} (evaluated once, best checkpoint)")
        splits = {"validation": evaluate_predictions(model, val_loader, data.metric, training.mixed_precision,
                                                     step=result.best_step)}
        if test_rows is not None:
            splits["test"] = test_rows.split(test_loader, result.best_step)
        write_final_predictions(folder.path, data.metric, splits, is_main=is_main_process())
        diagnosed = {"diagnostics": run_diagnostics(model, config, data, log)}  # now a final run
    promoted = result.promoted(test_value, seconds, token_accuracy_test=test_eval.get("token_accuracy"),
                               predictions=predictions_record(folder.path) if is_main_process() else None, **diagnosed)
    _write_record(folder.result, promoted)
    return promoted


def mark_final(matrix: MatrixFolder, run: PlannedRun, log: Callable[[str], None]) -> RunRecord:
    """Without a test split: the finished sweep run at the selected rate becomes ``run`` (its
    seed's final run) by its record alone, as :func:`promote` would make it but with nothing to
    evaluate (no data, no model, no task): ``stage: final``, ``selected``, ``swept``, test None.
    Returns the new record (written by rank 0)."""
    folder = matrix.run(run.name)
    with copy_console(folder.train_log, f"marking {run.name} final", enabled=is_main_process()):
        log(f"[{run.name}] selected; its sweep run is the final run (no test split to evaluate)")
    promoted = read_record(folder.result).promoted(None, None)
    _write_record(folder.result, promoted)
    return promoted


def _promote_or_retrain(ctx: RunContext, run: PlannedRun) -> RunRecord:
    """:func:`promote` the finished sweep run in ``run``'s folder to ``run`` (its final run); when
    its best weights are missing and ``allow_missing_weights``, move the sweep run to
    ``runs/.weights-missing/`` and train ``run`` from scratch instead (test evaluated once, as
    for any final run), recording the lost run's best validation.

    Raises:
        RecordedFileMissingError: the weights are missing and ``allow_missing_weights`` is off.
        ChecksumError: the weights are there but do not match their recorded sha256.
    """
    folder = ctx.folder.run(run.name)
    swept = read_record(folder.result)
    if swept.is_final or not swept.finished:
        return swept  # promoted already (e.g. by an earlier attempt of this task), or failed
    try:
        with copy_console(folder.train_log, f"promoting {run.name}", enabled=is_main_process()):
            return promote(ctx.config, ctx.entry(run.method), run, ctx.data, folder.path, swept, ctx.log)
    except RecordedFileMissingError as exc:
        if not ctx.allow_missing_weights:
            raise RecordedFileMissingError(f"{exc}; or rerun with --allow-missing-weights to train this selected run "
                                           "again for its test split") from None
    aside = _move_aside(ctx, folder, ".weights-missing")
    ctx.log(f"[{run.name}] selected, but its best weights are missing (the test split needs them): retraining it "
            f"as the final run (its sweep result moved to {aside})")
    record = _train_cell(ctx, run, evaluate_test=True)
    if record.finished:
        record = record.retrained_without_weights(swept, str(aside.relative_to(ctx.out) / folder.result.name))
        _write_record(folder.result, record)
    return record


def execute(ctx: RunContext, task: RunTask) -> RunRecord:
    """Do ``task`` in this process: train (continue, keep) its run or promote it; returns the
    run's record (finished or failed). Writes only ``runs/<task.name>/``.

    Raises:
        RunInterruptedError, ChecksumError and any exception of the run (see :func:`_train_cell`).
    """
    if task.action == "promote":
        return _promote_or_retrain(ctx, task.run)
    return _train_cell(ctx, task.run, evaluate_test=task.evaluate_test)


# --- a process that has only the config: a Ray task, `oelm run --only` -------------------------

_PREPARED: dict[str, PreparedData] = {}


def prepared_data(config: ExperimentConfig, log: Callable[[str], None] = print) -> PreparedData:
    """The matrix's shared data, prepared once per process, config and data dir (token caches make a
    second preparation on the same machine fast). The data dir is part of the key: the same config
    over another ``OELM_DATA_DIR`` is other data, bound and checked again (:func:`bind_data`)."""
    key = json.dumps(config.model_dump(mode="json")["task"] | {"model": config.model.model_dump(mode="json")}
                     | {"resolved_data_dir": str(resolve_data_dir(config.task.data_dir))}, sort_keys=True)
    if key not in _PREPARED:
        _PREPARED.clear()  # one matrix at a time: do not keep another's tensors alive
        _PREPARED[key] = prepare_matrix_data(config, None, log, save_tokenizer=False)
    return _PREPARED[key]


def train_planned_run(config: dict[str, Any] | ExperimentConfig, out: str | Path, task: dict[str, Any] | RunTask, *,
                      retry_failed: bool = False, allow_missing_weights: bool = False,
                      placement: dict[str, Any] | None = None, threads: int | None = None,
                      log: Callable[[str], None] = print) -> RunRecord:
    """Train exactly one planned run from nothing but its config: prepare the data (once per
    process), then :func:`execute`. What a Ray task and ``oelm run --only`` call.

    Args:
        config: the experiment config (or its ``model_dump(mode="json")``).
        out: the matrix's output folder (shared by every machine that trains its runs).
        task: a :class:`RunTask` (or its ``to_dict()``).
        threads: torch intra-op threads for this run (None: leave the process's setting).

    Returns:
        The run's :class:`~oelm.records.RunRecord` (``status`` finished or failed).
    """
    if not isinstance(config, ExperimentConfig):
        config = config_from_dict(config, source="(matrix config)")
    if not isinstance(task, RunTask):
        task = RunTask.from_dict(task)
    if threads:
        torch.set_num_threads(max(1, int(threads)))
    ctx = RunContext(config, Path(out), prepared_data(config, log), log, retry_failed, allow_missing_weights,
                     placement or placement_record("local"))
    bind_data(ctx.out, ctx.data)  # this machine's data is the data the matrix was trained on
    return execute(ctx, task)
