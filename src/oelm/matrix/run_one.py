"""Train exactly one planned run: :func:`execute` does a :class:`~oelm.matrix.plan.RunTask` (train,
continue, keep, or promote one run) in this process and returns its result; it writes only that
run's folder. :func:`train_planned_run` is the same for a process that has nothing but the
config (a Ray task, ``oelm run --only``): it prepares the data itself (once per process).
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader

from oelm.config import ExperimentConfig, MethodEntry, TrainingConfig
from oelm.data.prepare import PreparedData, make_loaders
from oelm.distributed import barrier, is_main_process, main_process_only
from oelm.errors import OELMError, RecordedFileMissingError, RunFaultError, RunInterruptedError
from oelm.io import read_json, write_json_atomic
from oelm.lock import pid_alive
from oelm.metrics import get_metric
from oelm.models.build import build_run_model
from oelm.predictions import predictions_record
from oelm.runs import BEST_CHECKPOINT, PlannedRun, checkpoint_record, read_status, verify_checkpoint
from oelm.runs import write_status as _write_status_file
from oelm.trackers import TrackedRun

from oelm.matrix.output import bind_data
from oelm.matrix.plan import RunTask
from oelm.matrix.store import MatrixFolder

__all__ = ["RunContext", "execute", "train_planned_run", "placement_record", "verify_kept", "promote"]

# Every process of a launched job runs the protocol; rank 0 alone writes its files.
_write_json = main_process_only(write_json_atomic)
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


def placement_record(executor: str, **fields: Any) -> dict[str, Any]:
    """``{"name": executor, "node": <host name>, "pid": <this process>, ...fields}``: the
    ``executor`` block of a result (``fields``: ``node_id``, ``lanes``, ``cpus_per_run``,
    ``gpus_per_run``, ``attempt``)."""
    return {"name": executor, "node": platform.node(), "pid": os.getpid(), **fields}


def _total_steps(training: TrainingConfig, train_loader: DataLoader) -> int:
    """Optimizer steps of a run (as :func:`oelm.train.train` computes them from the loader
    Accelerate shards over the processes)."""
    from oelm.distributed import num_processes
    from oelm.train import optimizer_steps_per_epoch, planned_total_steps

    per_process = math.ceil(len(train_loader) / num_processes())
    return planned_total_steps(training, optimizer_steps_per_epoch(per_process, training.gradient_accumulation_steps))


def _run_identity(config: ExperimentConfig, run: PlannedRun) -> dict[str, Any]:
    return {
        "method": run.method,
        "seed": run.seed,
        "run_name": run.name,  # the folder under runs/ (readers find metrics.jsonl through it)
        "learning_rate": run.learning_rate,
        "stage": run.stage,
        "selected": run.stage == "final",
        "task": config.task.dataset,
        "model": config.model.display_name,
    }


def _train(ctx: RunContext, run: PlannedRun, run_dir: Path, *, evaluate_test: bool) -> dict:
    """Train one run; returns its result dict (status "finished"). Faults propagate."""
    from oelm.environment import capture_environment, probe_drift_percent
    from oelm.train import train

    config, data, log = ctx.config, ctx.data, ctx.log
    entry = ctx.entry(run.method)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    env_before = capture_environment(device, probe=True)
    model, oelm_cfg, report, init_info = build_run_model(config, entry, run.seed, data)
    log(f"[{run_dir.name}] {report}")
    training = config.training_for(entry)
    train_loader, val_loader, test_loader = make_loaders(data, training, run.seed)
    total_steps = _total_steps(training, train_loader)
    write_status(run_dir, run, "running", total_steps=total_steps)
    result = train(
        model, train_loader, val_loader, metric=data.metric, config=training, learning_rate=run.learning_rate,
        run_dir=run_dir, test_loader=test_loader if evaluate_test else None, description=run_dir.name,
        tracked=TrackedRun(config.name, {**config.model_dump(mode="json"), "run": _run_identity(config, run)}, ctx.out),
        predictions=evaluate_test,  # a final run: per-example predictions of its best weights (predictions.npz)
    )
    if result.early_stopped:
        metric = get_metric(result.metric)
        by = f" by more than {training.early_stopping_min_delta:g}" if training.early_stopping_min_delta else ""
        log(f"[{run_dir.name}] early stop at step {result.steps} of {total_steps}: no improvement{by} in "
            f"{training.early_stopping_patience} validations (best {metric.name} {metric.format(result.best_validation)} "
            f"at step {result.best_step})")
    env_after = capture_environment(device, probe=True)
    before = (env_before.get("matmul_probe") or {}).get("gflops")
    after = (env_after.get("matmul_probe") or {}).get("gflops")
    environment = dict(env_before)
    environment["matmul_probe_after"] = env_after.get("matmul_probe")
    environment["load_average_after"] = env_after.get("load_average")
    environment["matmul_probe_drift_percent"] = probe_drift_percent(before, after) if before and after else None
    processes = result.timing.get("num_processes", 1)
    # A batch larger than the training set is one batch of the whole set: record what ran.
    batch_size = min(training.batch_size, math.ceil(len(data.train) / processes))
    if batch_size < training.batch_size:
        log(f"[{run_dir.name}] training.batch_size={training.batch_size} is larger than the training set "
            f"({len(data.train)} examples): every step used all {batch_size}; result.json records batch_size={batch_size}")
    return {
        **_run_identity(config, run),
        "status": "finished",
        "config": config.model_dump(mode="json"),
        "method_config": oelm_cfg.to_dict() | {"learning_rate": run.learning_rate},
        "init_from": init_info,
        "tokenizer": data.tokenizer_record,
        "data": data.summary,
        "data_source": data.source,  # content hashes of the files each split was read from (oelm.data.identity)
        "budget": {
            "steps": result.steps,
            "planned_steps": total_steps,
            "steps_run": result.steps,  # optimizer steps taken: fewer than planned_steps after an early stop
            "samples": result.timing.get("samples"),
            "tokens": result.timing.get("tokens"),
            "batch_size": batch_size,  # examples per micro-batch as run (the configured one, capped at the training set)
            "batch_size_configured": training.batch_size,
            "gradient_accumulation_steps": training.gradient_accumulation_steps,
            "num_processes": processes,
            # examples per optimizer step over all processes (the batch the learning rate sees)
            "global_batch_size": batch_size * training.gradient_accumulation_steps * processes,
            "epochs": training.epochs,
            "max_steps": training.max_steps,
        },
        "environment": environment,
        "parameters": {
            "total": report.total,
            "trainable": report.trainable,
            "frozen": report.frozen,
            "trainable_percent": report.trainable_percent,
            "groups": report.groups,
        },
        "projections": report.projections,
        "performance": {
            "metric": result.metric,
            "best_validation": result.best_validation,
            "best_step": result.best_step,
            "final_validation": result.final_validation,
            "final_train_loss": result.final_train_loss,
            "test": result.test,
            "steps": result.steps,
            "early_stopped": result.early_stopped,
            "token_accuracy": result.token_accuracy,  # LM: next-token top-1 accuracy (%) at the best step, test; else None
        },
        "timing": result.timing,
        # A SIGTERM/SIGINT that arrived during the final evaluation: the run is complete and kept,
        # but the matrix stops after recording it (see execute).
        "stop_signal": result.stop_signal,
        # path, sha256 and size of the best weights train() wrote (rank 0): checked on every reuse
        "checkpoint": checkpoint_record(run_dir) if training.save_best_checkpoint and is_main_process() else None,
        # path, sha256 and size of the final run's per-example predictions (oelm.predictions); None for a sweep run
        "predictions": predictions_record(run_dir) if is_main_process() else None,
    }


def _failed_result(config: ExperimentConfig, run: PlannedRun, exc: RunFaultError) -> dict[str, Any]:
    return {
        **_run_identity(config, run),
        "selected": False,
        "status": "failed",
        "failure": {"kind": exc.kind, "message": str(exc), "step": exc.step},
        "config": config.model_dump(mode="json"),
    }


def _retrain_hint(run_dir: Path) -> str:
    return f"delete the folder {run_dir} and rerun the same command to train that run again"


def _move_aside(out: Path, run_dir: Path, folder: str) -> Path:
    """Move ``run_dir`` to ``out/runs/<folder>/<run name>-<local time>`` (rank 0, after every
    process has read its old result) so that the run starts afresh; returns the new place."""
    barrier()
    aside = out / "runs" / folder / f"{run_dir.name}-{datetime.now():%Y%m%d-%H%M%S}"
    if is_main_process():
        aside.parent.mkdir(parents=True, exist_ok=True)
        run_dir.rename(aside)
    barrier()
    return aside


def verify_kept(ctx: RunContext, run_dir: Path, previous: dict) -> None:
    """Check an earlier result that is kept: a finished run's best weights must match the sha256
    its ``result.json`` records; logs ``[run] finished earlier; kept (...)``.

    Raises:
        ChecksumError: the weights differ from the record; it is not retrained silently: the
            message says to delete the run's folder (``--retry-failed`` is for failed runs only).
        RecordedFileMissingError: they are missing, unless ``ctx.allow_missing_weights``.
    """
    if previous.get("status") == "finished":
        try:
            verify_checkpoint(run_dir, previous, _retrain_hint(run_dir))
        except RecordedFileMissingError as exc:
            if not ctx.allow_missing_weights:
                raise RecordedFileMissingError(f"{exc}; or rerun with --allow-missing-weights to keep its result without "
                                               "them (a selected sweep run is then retrained for its test split)") from None
            ctx.log(f"[{run_dir.name}] its best weights are missing; result kept without them (--allow-missing-weights)")
    ctx.log(f"[{run_dir.name}] {previous.get('status', 'finished')} earlier; kept ({run_dir / 'result.json'})")


def _reuse_or_clear(ctx: RunContext, run: PlannedRun, run_dir: Path) -> dict | None:
    """The earlier result of ``run`` when it is to be kept (:func:`verify_kept`); None when the
    run is to (re)start (a failed run under ``retry_failed`` is moved to ``runs/.failed/`` first)."""
    result_path = run_dir / "result.json"
    if not result_path.exists():
        if (run_dir / "status.json").exists():
            ctx.log(f"[{run.name}] unfinished; continuing in {run_dir}")
        return None
    previous = read_json(result_path)
    if previous.get("status") != "failed" or not ctx.retry_failed:
        verify_kept(ctx, run_dir, previous)
        return previous
    aside = _move_aside(ctx.out, run_dir, ".failed")
    ctx.log(f"[{run.name}] failed earlier; retrying (old run moved to {aside})")
    return None


def _overlaps(out: Path, me: str, since: float, until: float) -> list[dict[str, Any]]:
    """The other runs of the matrix that trained at some time in ``[since, until]`` (seconds since
    the epoch), from their ``status.json``: ``{"run", "node"}`` each. A run whose status says
    running on this host but whose process is gone is not counted."""
    found = []
    for status_path in sorted(MatrixFolder(out).runs.glob("*/status.json")):
        if status_path.parent.name == me:
            continue
        try:
            s = read_status(status_path.parent)
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
            found.append({"run": status_path.parent.name, "node": s.get("host")})
    return found


def _with_placement(ctx: RunContext, result: dict, run_dir: Path, started: float) -> dict:
    """``result`` with its ``executor`` block: where it trained, when (this process's start and
    end, seconds since the epoch), and the runs that trained beside it meanwhile."""
    finished = time.time()
    overlapped = _overlaps(ctx.out, run_dir.name, started, finished)
    same_node = [o for o in overlapped if o["node"] == platform.node()]
    return result | {"executor": ctx.placement | {
        "started_unix": started, "finished_unix": finished, "overlapped": overlapped,
        # runs that shared this machine's cores or GPUs: step times are not speed evidence
        "shared_node": bool(same_node),
    }}


def _train_cell(ctx: RunContext, run: PlannedRun, evaluate_test: bool) -> dict:
    """Run (or continue, or keep) one cell of the matrix; returns its result (finished or failed).

    Raises:
        RunInterruptedError: SIGTERM/SIGINT (the run's status says ``interrupted``), or a signal
            during the last evaluation of a run that finished and was kept.
        Exception: anything else raised inside the run, after its status is set to ``failed``
            (``failure``: kind "error", the exception's type and message).
    """
    run_dir, log = ctx.out / "runs" / run.name, ctx.log
    previous = _reuse_or_clear(ctx, run, run_dir)
    if previous is not None:
        return previous
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    write_status(run_dir, run, "running")
    try:
        result = _train(ctx, run, run_dir, evaluate_test=evaluate_test)
    except RunInterruptedError as exc:
        write_status(run_dir, run, "interrupted", step=exc.step, signal=exc.signal_name)
        log(f"[{run.name}] interrupted ({exc.signal_name}) at step {exc.step}; rerun the same command to continue")
        raise
    except RunFaultError as exc:
        result = _failed_result(ctx.config, run, exc)
        _write_json(run_dir / "result.json", result)
        write_status(run_dir, run, "failed", failure=result["failure"])
        log(f"[{run.name}] FAILED ({exc.kind} at step {exc.step}): {exc}; going on with the next run")
        return result
    except KeyboardInterrupt:  # outside the training loop's own signal handling (e.g. while building the model)
        write_status(run_dir, run, "interrupted", signal="SIGINT")
        raise
    except Exception as exc:
        # Not a fault the matrix can go on from (a bug, or a deliberate error inside the run): the
        # status says failed, so `oelm monitor` does not show the run as running forever, and the
        # exception propagates with its traceback. No result.json: rerunning retries the run.
        write_status(run_dir, run, "failed",
                     failure={"kind": "error", "type": type(exc).__name__, "message": str(exc), "step": None})
        raise
    result = _with_placement(ctx, result, run_dir, started)
    _write_json(run_dir / "result.json", result)
    write_status(run_dir, run, "finished")
    perf = result["performance"]
    log(f"[{run.name}] best validation {perf['metric']} {perf['best_validation']:.4f} at step {perf['best_step']}, "
        f"{result['timing']['total_seconds']:.1f} s total")
    if result.get("stop_signal"):
        raise RunInterruptedError(
            f"{result['stop_signal']} arrived during the last evaluation of {run.name}; that run finished and "
            "was kept, the matrix stops here; rerun the same command to continue with the next run",
            step=perf["steps"],
            signal_name=result["stop_signal"],
        )
    return result


def promote(config: ExperimentConfig, entry: MethodEntry, run: PlannedRun, data: PreparedData, run_dir: Path,
            result: dict, log: Callable[[str], None]) -> dict:
    """Make the finished sweep run at the selected learning rate a final run: evaluate the test
    split once, from its best-on-validation checkpoint, save its predictions (validation and test:
    :func:`~oelm.training.predictions.save_final_predictions`; none without best weights) and mark
    it ``stage: final``, ``selected: true``. The run is not retrained (same seed, data order and
    budget as a fresh final run would have).

    Raises:
        ChecksumError: its best weights do not match the sha256 its result records
            (:class:`~oelm.errors.RecordedFileMissingError` when they are missing).
    """
    from oelm.train import evaluate
    from oelm.training.evaluation import token_accuracy_fields
    from oelm.training.predictions import collector_for, save_final_predictions

    test_value, test_eval = None, {}
    if data.test is not None or (run_dir / BEST_CHECKPOINT).is_file():
        ckpt = verify_checkpoint(run_dir, result, _retrain_hint(run_dir))
        if not ckpt.is_file():
            raise OELMError(f"{run_dir}: the selected sweep run has no checkpoint/model.safetensors to evaluate the test split with")
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
                with (run_dir / "metrics.jsonl").open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"type": "test", "step": result["performance"]["best_step"], data.metric: test_value,
                                         **token_accuracy_fields(test_eval)}) + "\n")
            result["timing"]["test_seconds"] = seconds
            log(f"[{run_dir.name}] selected; test {data.metric} {test_value:.4f} (evaluated once, best checkpoint)")
        save_final_predictions(model, {"validation": val_loader, "test": test_loader}, data.metric, training.mixed_precision,
                               run_dir=run_dir, step=result["performance"]["best_step"], is_main=is_main_process(),
                               evaluated={"test": test_rows})
    result = dict(result)
    result["performance"] = dict(result["performance"], test=test_value)
    if "token_accuracy" in test_eval:
        result["performance"]["token_accuracy"] = dict(result["performance"].get("token_accuracy") or {},
                                                       test=test_eval["token_accuracy"])
    result.update(stage="final", selected=True, swept=True,
                  predictions=predictions_record(run_dir) if is_main_process() else None)
    _write_json(run_dir / "result.json", result)
    return result


def _promote_or_retrain(ctx: RunContext, run: PlannedRun) -> dict:
    """:func:`promote` the finished sweep run in ``run``'s folder to ``run`` (its final run); when
    its best weights are missing and ``allow_missing_weights``, move the sweep run to
    ``runs/.weights-missing/`` and train ``run`` from scratch instead (test evaluated once, as
    for any final run), recording the lost run's best validation.

    Raises:
        RecordedFileMissingError: the weights are missing and ``allow_missing_weights`` is off.
        ChecksumError: the weights are there but do not match their recorded sha256.
    """
    run_dir = ctx.out / "runs" / run.name
    swept = read_json(run_dir / "result.json")
    if swept.get("stage") == "final" or swept.get("status") != "finished":
        return swept  # promoted already (e.g. by an earlier attempt of this task), or failed
    try:
        return promote(ctx.config, ctx.entry(run.method), run, ctx.data, run_dir, swept, ctx.log)
    except RecordedFileMissingError as exc:
        if not ctx.allow_missing_weights:
            raise RecordedFileMissingError(f"{exc}; or rerun with --allow-missing-weights to train this selected run "
                                           "again for its test split") from None
    aside = _move_aside(ctx.out, run_dir, ".weights-missing")
    ctx.log(f"[{run.name}] selected, but its best weights are missing (the test split needs them): retraining it "
            f"as the final run (its sweep result moved to {aside})")
    result = _train_cell(ctx, run, evaluate_test=True)
    if result.get("status") == "finished":
        result = result | {"selected": True, "swept": True, "retrained_without_weights": {
            "sweep_best_validation": (swept.get("performance") or {}).get("best_validation"),
            "sweep_result": str(aside.relative_to(ctx.out) / "result.json")}}
        _write_json(run_dir / "result.json", result)
    return result


def execute(ctx: RunContext, task: RunTask) -> dict:
    """Do ``task`` in this process: train (continue, keep) its run or promote it; returns the
    run's result dict (finished or failed). Writes only ``runs/<task.name>/``.

    Raises:
        RunInterruptedError, ChecksumError and any exception of the run (see :func:`_train_cell`).
    """
    if task.action == "promote":
        return _promote_or_retrain(ctx, task.run)
    return _train_cell(ctx, task.run, evaluate_test=task.evaluate_test)


# --- a process that has only the config: a Ray task, `oelm run --only` -------------------------

_PREPARED: dict[str, PreparedData] = {}


def prepared_data(config: ExperimentConfig, log: Callable[[str], None] = print) -> PreparedData:
    """The matrix's shared data, prepared once per process and config (token caches make a
    second preparation on the same machine fast)."""
    from oelm.matrix.output import prepare_matrix_data

    key = json.dumps(config.model_dump(mode="json")["task"] | {"model": config.model.model_dump(mode="json")},
                     sort_keys=True)
    if key not in _PREPARED:
        _PREPARED.clear()  # one matrix at a time: do not keep another's tensors alive
        _PREPARED[key] = prepare_matrix_data(config, None, log, save_tokenizer=False)
    return _PREPARED[key]


def train_planned_run(config: dict[str, Any] | ExperimentConfig, out: str | Path, task: dict[str, Any] | RunTask, *,
                      retry_failed: bool = False, allow_missing_weights: bool = False,
                      placement: dict[str, Any] | None = None, threads: int | None = None,
                      log: Callable[[str], None] = print) -> dict:
    """Train exactly one planned run from nothing but its config: prepare the data (once per
    process), then :func:`execute`. What a Ray task and ``oelm run --only`` call.

    Args:
        config: the experiment config (or its ``model_dump(mode="json")``).
        out: the matrix's output folder (shared by every machine that trains its runs).
        task: a :class:`RunTask` (or its ``to_dict()``).
        threads: torch intra-op threads for this run (None: leave the process's setting).

    Returns:
        The run's result dict (``status`` finished or failed).
    """
    from oelm.config import config_from_dict

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
