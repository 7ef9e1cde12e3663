"""The comparison protocol: sweep learning rates on validation, run every (method, seed), compare.

One experiment = one task, one model source, several methods, several seeds::

    outputs/<name>/
      .oelm.lock                       held (flock) while an `oelm run` uses the folder (oelm.lock)
      config.yaml, experiment.json     the resolved config and its fingerprint (resume check)
      plan.json                        every planned run (read by `oelm monitor`)
      runs/<method>[-lr<lr>]-seed<k>/  status.json, result.json, metrics.jsonl, tensorboard/, checkpoint/
      sweep.json                       the learning-rate sweep, the selected rates and which sit on
                                       an edge of their grid
      comparison.json, report.md       the final runs of each method against baseline

Rules kept here:
- the data (subsets, tokenization) is built once and shared by every run, so methods see
  exactly the same examples; each run's model is built fresh from its seed;
- every method gets the same training budget (epochs / max_steps, batch size) unless its
  ``training`` overrides say otherwise; each result records its budget (steps, samples, tokens);
- runs are interleaved in a balanced order (seed 0: A B C, seed 1: C B A, ...) in every stage,
  so slow drift of a shared machine hits every method alike;
- learning rates are selected on validation only (mean best validation over the sweep seeds);
  the test split, if configured, is evaluated once per final run with the selected learning rate
  and the best-on-validation weights, never in a run that was not selected;
- a finished or failed run (its ``result.json`` exists) is not recomputed; an unfinished one is
  continued; the only rewrite of a result is the promotion of the selected sweep run to a final
  run (adding its single test evaluation);
- every result file is written atomically.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import torch
import yaml
from torch.utils.data import DataLoader

from oelm.config import ExperimentConfig, MethodEntry, TrainingConfig
from oelm.data.prepare import PreparedData, make_loaders, prepare_data
from oelm.errors import ConfigError, OELMError, RecordedFileMissingError, RunFaultError, RunInterruptedError
from oelm.distributed import barrier, is_main_process, main_process_only
from oelm.io import read_json, write_json_atomic, write_text_atomic
from oelm.lock import claim_run, hold_output_lock, hold_state_lock, hold_worker_lock
from oelm.metrics import get_metric
from oelm.models.build import build_model, build_run_model, check_init_tokenizer, check_sequence_length, resolve_init_from
from oelm.report import write_comparison
from oelm.runs import (
    PlannedRun, checkpoint_record, format_rates, grid_edge, grid_edge_note, run_name, run_results, utc_now, verify_checkpoint,
)
from oelm.runs import write_status as _write_status_file

# Every process of a launched job runs the protocol; rank 0 alone writes its files.
_write_json = main_process_only(write_json_atomic)
_write_text = main_process_only(write_text_atomic)
write_status = main_process_only(_write_status_file)

__all__ = [
    "PreparedData",
    "prepare_data",
    "build_model",
    "run_order",
    "run_name",
    "plan_runs",
    "PlannedRun",
    "resolve_init_from",
    "run_experiment",
]


def run_order(methods: list, seeds: list[int]) -> list[tuple[Any, int]]:
    """Balanced interleaving: seed 0 runs A B C, seed 1 runs C B A, seed 2 A B C, ...

    ``methods`` may be any labels (method names, or (method, learning rate) pairs in a sweep)."""
    order = []
    for i, seed in enumerate(seeds):
        seq = methods if i % 2 == 0 else list(reversed(methods))
        order.extend((m, seed) for m in seq)
    return order


def _total_steps(training: TrainingConfig, train_loader: DataLoader) -> int:
    """Optimizer steps of a run (as :func:`oelm.train.train` computes them from the loader
    Accelerate shards over the processes)."""
    from oelm.distributed import num_processes
    from oelm.train import optimizer_steps_per_epoch, planned_total_steps

    per_process = math.ceil(len(train_loader) / num_processes())
    return planned_total_steps(training, optimizer_steps_per_epoch(per_process, training.gradient_accumulation_steps))



def _run_one(
    config: ExperimentConfig,
    entry: MethodEntry,
    run: PlannedRun,
    data: PreparedData,
    run_dir: Path,
    log: Callable[[str], None],
    *,
    evaluate_test: bool,
) -> dict:
    """Train one run; returns its result dict (status "finished"). Faults propagate."""
    from oelm.environment import capture_environment, probe_drift_percent
    from oelm.train import train

    device = "cuda" if torch.cuda.is_available() else "cpu"
    env_before = capture_environment(device, probe=True)
    model, oelm_cfg, report, init_info = build_run_model(config, entry, run.seed, data)
    log(f"[{run_dir.name}] {report}")
    training = config.training_for(entry)
    train_loader, val_loader, test_loader = make_loaders(data, training, run.seed)
    total_steps = _total_steps(training, train_loader)
    write_status(run_dir, run, "running", total_steps=total_steps)
    result = train(
        model,
        train_loader,
        val_loader,
        metric=data.metric,
        config=training,
        learning_rate=run.learning_rate,
        run_dir=run_dir,
        test_loader=test_loader if evaluate_test else None,
        description=run_dir.name,
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
    return {
        **_run_identity(config, run),
        "status": "finished",
        "config": config.model_dump(mode="json"),
        "method_config": oelm_cfg.to_dict() | {"learning_rate": run.learning_rate},
        "init_from": init_info,
        "tokenizer": data.tokenizer_record,
        "data": data.summary,
        "budget": {
            "steps": result.steps,
            "planned_steps": total_steps,
            "steps_run": result.steps,  # optimizer steps taken: fewer than planned_steps after an early stop
            "samples": result.timing.get("samples"),
            "tokens": result.timing.get("tokens"),
            "batch_size": training.batch_size,
            "gradient_accumulation_steps": training.gradient_accumulation_steps,
            "num_processes": result.timing.get("num_processes", 1),
            # examples per optimizer step over all processes (the batch the learning rate sees)
            "global_batch_size": training.batch_size * training.gradient_accumulation_steps
            * result.timing.get("num_processes", 1),
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
        },
        "timing": result.timing,
        # A SIGTERM/SIGINT that arrived during the final evaluation: the run is complete and kept,
        # but the matrix stops after recording it (see run_experiment).
        "stop_signal": result.stop_signal,
        # path, sha256 and size of the best weights train() wrote (rank 0): checked on every reuse
        "checkpoint": checkpoint_record(run_dir) if training.save_best_checkpoint and is_main_process() else None,
    }


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



def _failed_result(config: ExperimentConfig, run: PlannedRun, exc: RunFaultError) -> dict[str, Any]:
    return {
        **_run_identity(config, run),
        "selected": False,
        "status": "failed",
        "failure": {"kind": exc.kind, "message": str(exc), "step": exc.step},
        "config": config.model_dump(mode="json"),
    }


# Settings that change how a run is displayed, fed or saved, never its numbers.
_COSMETIC_TRAINING_KEYS = (
    "progress_bar", "tensorboard", "num_workers", "log_every", "checkpoint_every", "keep_checkpoints",
    "timing_warmup_passes",
)


def _config_fingerprint(config: ExperimentConfig) -> dict[str, Any]:
    """The parts of a config that make results comparable: task, model, training (display-only
    knobs excluded), init_from, the sweep seeds, and per method its OELM settings, learning-rate
    candidates and training overrides. Not: seeds (more may be added), the output dir, names,
    descriptions and references."""
    d = config.model_dump(mode="json")
    training = {k: v for k, v in d["training"].items() if k not in _COSMETIC_TRAINING_KEYS}
    methods = {
        m.name: {
            "oelm": m.oelm_config().to_dict(),
            "learning_rates": config.learning_rate_candidates(m),
            "training": {k: v for k, v in sorted(m.training.items()) if k not in _COSMETIC_TRAINING_KEYS},
        }
        for m in config.methods
    }
    return {
        "task": d["task"], "model": d["model"], "training": training, "init_from": config.init_from,
        "sweep_seeds": config.sweep_seed_list(), "methods": methods,
    }


def _methods_with_runs(out: Path) -> set[str]:
    """Methods that have a run folder with a status or result under ``out/runs``."""
    found = set()
    for p in list((out / "runs").glob("*/status.json")) + list((out / "runs").glob("*/result.json")):
        try:
            found.add(read_json(p)["method"])
        except (OSError, ValueError, KeyError):
            continue
    return found


def _grid_grew(previous: dict[str, Any], current: dict[str, Any]) -> bool:
    """True when a method's fingerprint ``current`` differs from ``previous`` only by a learning-rate
    grid that keeps every earlier rate and adds some, and the earlier grid was already a sweep
    (two or more rates: the runs of a single-rate method are named without a rate, so a later
    sweep could not reuse them)."""
    rest = {k: v for k, v in current.items() if k != "learning_rates"}
    if {k: v for k, v in previous.items() if k != "learning_rates"} != rest:
        return False
    old, new = set(previous.get("learning_rates") or []), set(current.get("learning_rates") or [])
    return len(old) > 1 and old < new


def _check_fingerprint(out: Path, fingerprint: dict[str, Any]) -> tuple[dict[str, Any], dict[str, tuple[list, list]]]:
    """Refuse to mix results of incompatible configs in ``out``; returns the fingerprint to store
    and the methods whose learning-rate grid grows (name -> (earlier grid, new grid)).

    A grid may grow: a method that already has runs may add learning rates to a sweep as long as
    it keeps every earlier rate and nothing else of it changes (its runs stay valid; the sweep
    runs the new rates and selects again). Use it when a selection sits on the edge of its grid.

    Raises:
        ConfigError: task/model/training/init_from/sweep seeds changed, or the settings of a
            method that already has runs changed otherwise (naming what changed).
    """
    path = out / "experiment.json"
    if not path.exists():
        return fingerprint, {}
    previous = read_json(path).get("fingerprint") or {}
    if isinstance(previous.get("training"), dict):  # keys added to TrainingConfig since: their defaults held
        defaults = {k: v for k, v in TrainingConfig().model_dump(mode="json").items() if k not in _COSMETIC_TRAINING_KEYS}
        previous = previous | {"training": {k: v for k, v in defaults.items() if k not in previous["training"]}
                               | previous["training"]}
    changed = [k for k in fingerprint if k != "methods" and k in previous and previous[k] != fingerprint[k]]
    prev_methods = previous.get("methods", {})
    with_runs = _methods_with_runs(out) if prev_methods else set()
    grown: dict[str, tuple[list, list]] = {}
    for name, settings in fingerprint["methods"].items():
        if name in prev_methods and prev_methods[name] != settings and name in with_runs:
            if _grid_grew(prev_methods[name], settings):
                grown[name] = (prev_methods[name]["learning_rates"], settings["learning_rates"])
                continue
            what = [k for k in settings if prev_methods[name].get(k) != settings[k]]
            hint = ""
            if what == ["learning_rates"]:
                hint = (" (a learning-rate grid may only grow: keep every earlier rate)"
                        if len(prev_methods[name]["learning_rates"]) > 1 else
                        " (its runs were trained without a sweep; a sweep needs another --output-dir)")
            changed.append(f"methods.{name} ({', '.join(what)}){hint}")
    if changed:
        raise ConfigError(
            f"output directory {out} holds results of a different config (changed: {', '.join(sorted(changed))}); "
            "use another --output-dir, or restore the original config to resume"
        )
    return fingerprint | {"methods": prev_methods | fingerprint["methods"]}, grown


def _tested_final_runs(out: Path, method: str) -> list[str]:
    """Run names of ``method``'s final runs under ``out`` that have evaluated the test split."""
    return [r.get("run_name") or run_dir.name for run_dir, r in run_results(out)
            if r.get("method") == method and r.get("stage") == "final" and (r.get("performance") or {}).get("test") is not None]


def _promote(config: ExperimentConfig, entry: MethodEntry, run: PlannedRun, data: PreparedData, run_dir: Path,
             result: dict, log: Callable[[str], None]) -> dict:
    """Make the finished sweep run at the selected learning rate a final run: evaluate the test
    split once, from its best-on-validation checkpoint, and mark it ``stage: final``,
    ``selected: true``. The run is not retrained (same seed, data order and budget as a fresh
    final run would have)."""
    from oelm.train import evaluate

    test_value = None
    if data.test is not None:
        ckpt = verify_checkpoint(run_dir, result, _retrain_hint(run_dir))
        if not ckpt.is_file():
            raise OELMError(f"{run_dir}: the selected sweep run has no checkpoint/model.safetensors to evaluate the test split with")
        from safetensors.torch import load_model

        model, _, _, _ = build_run_model(config, entry, run.seed, data)
        load_model(model, str(ckpt))
        training = config.training_for(entry)
        _, _, test_loader = make_loaders(data, training, run.seed)
        t0 = time.perf_counter()
        test_value = evaluate(model, test_loader, data.metric, training.mixed_precision)["value"]
        seconds = time.perf_counter() - t0
        if is_main_process():
            with (run_dir / "metrics.jsonl").open("a", encoding="utf-8") as fh:
                fh.write(json.dumps({"type": "test", "step": result["performance"]["best_step"], data.metric: test_value}) + "\n")
        result["timing"]["test_seconds"] = seconds
        log(f"[{run_dir.name}] selected; test {data.metric} {test_value:.4f} (evaluated once, best checkpoint)")
    result = dict(result)
    result["performance"] = dict(result["performance"], test=test_value)
    result.update(stage="final", selected=True, swept=True)
    _write_json(run_dir / "result.json", result)
    return result


def _promote_or_retrain(matrix: "_Matrix", run: PlannedRun, swept: dict) -> dict:
    """:func:`_promote` the finished sweep run ``swept`` to ``run`` (its final run); when its best
    weights are missing and the matrix allows that (``allow_missing_weights``), move the sweep
    run to ``runs/.weights-missing/`` and train ``run`` from scratch instead (test evaluated
    once, as for any final run), recording the lost run's best validation.

    Raises:
        RecordedFileMissingError: the weights are missing and ``allow_missing_weights`` is off.
        ChecksumError: the weights are there but do not match their recorded sha256.
    """
    run_dir = matrix.out / "runs" / run.name
    try:
        return _promote(matrix.config, matrix.entry(run.method), run, matrix.data, run_dir, swept, matrix.log)
    except RecordedFileMissingError as exc:
        if not matrix.allow_missing_weights:
            raise RecordedFileMissingError(f"{exc}; or rerun with --allow-missing-weights to train this selected run "
                                           "again for its test split") from None
    aside = _move_aside(matrix.out, run_dir, ".weights-missing")
    matrix.log(f"[{run.name}] selected, but its best weights are missing (the test split needs them): retraining it "
               f"as the final run (its sweep result moved to {aside})")
    result = _execute(matrix, run, evaluate_test=True)
    if result.get("status") == "finished":
        result = result | {"selected": True, "swept": True, "retrained_without_weights": {
            "sweep_best_validation": (swept.get("performance") or {}).get("best_validation"),
            "sweep_result": str(aside.relative_to(matrix.out) / "result.json")}}
        _write_json(run_dir / "result.json", result)
    return result


def _select(metric: str | None, by_lr: dict[float, list[float]]) -> float | None:
    """The learning rate with the best mean validation (ties: the first candidate)."""
    best_lr, best = None, None
    for lr, values in by_lr.items():
        if not values:
            continue
        mean = statistics.fmean(values)
        if best is None or get_metric(metric).better(mean, best):
            best_lr, best = lr, mean
    return best_lr


def plan_runs(config: ExperimentConfig, selected: dict[str, float] | None = None) -> list[PlannedRun]:
    """Every run of the matrix in execution order: the sweep stage (methods with several
    learning-rate candidates, on the sweep seeds), then the final stage (every method and seed at
    its selected learning rate; methods not yet selected are left out). Both stages use the
    balanced order of :func:`run_order`."""
    selected = selected or {}
    cands = {m.name: config.learning_rate_candidates(m) for m in config.methods}
    units = [(m.name, lr) for m in config.methods if len(cands[m.name]) > 1 for lr in cands[m.name]]
    plan = [
        PlannedRun(m, lr, seed, "sweep", run_name(m, seed, lr))
        for (m, lr), seed in run_order(units, config.sweep_seed_list())
    ]
    finals = [m.name for m in config.methods if len(cands[m.name]) == 1 or m.name in selected]
    for m, seed in run_order(finals, config.seeds):
        if len(cands[m]) == 1:
            plan.append(PlannedRun(m, cands[m][0], seed, "final", run_name(m, seed)))
        else:
            plan.append(PlannedRun(m, selected[m], seed, "final", run_name(m, seed, selected[m])))
    return plan


def _write_plan(out: Path, config: ExperimentConfig, selected: dict[str, float]) -> None:
    """``plan.json``: every planned run (for ``oelm monitor``), final runs of methods whose
    sweep is not done yet listed as pending without a learning rate."""
    runs = [{"name": r.name, "method": r.method, "seed": r.seed, "learning_rate": r.learning_rate, "stage": r.stage}
            for r in plan_runs(config, selected)]
    for m in config.methods:
        if len(config.learning_rate_candidates(m)) > 1 and m.name not in selected:
            runs += [{"name": None, "method": m.name, "seed": s, "learning_rate": None, "stage": "final"} for s in config.seeds]
    _write_json(out / "plan.json", {"name": config.name, "runs": runs})


def run_experiment(
    config: ExperimentConfig,
    output_dir: str | Path | None = None,
    log: Callable[[str], None] = print,
    *,
    retry_failed: bool = False,
    worker: bool = False,
    allow_missing_weights: bool = False,
) -> dict[str, Any] | None:
    """Run the whole matrix of ``config`` (what is not finished yet), then write the comparison.

    Protocol:

    1. **Sweep** (methods with several learning-rate candidates): each candidate on the sweep
       seeds, validation only (no test split is loaded into these runs).
    2. **Selection**: per method the candidate with the best mean ``best_validation`` over the
       sweep seeds (failed runs excluded); written to ``sweep.json``.
    3. **Final**: every seed at the selected learning rate; the test split (if configured) is
       evaluated once per final run with its best-on-validation weights. A sweep run at the
       selected rate is reused as that seed's final run: its test split is evaluated once from
       its best checkpoint (:func:`_promote`), never before selection.

    Runs of a stage follow :func:`run_order`. Every method trains on the same data with the same
    training settings (budget) unless its ``training`` overrides them. Rerunning on the same
    output directory skips finished (and failed, unless ``retry_failed``) runs and calls
    :func:`oelm.train.train` again on unfinished ones (which resumes from their checkpoints).

    **Workers** (``worker=True``, ``oelm run --worker``): several single-process ``oelm run``
    calls share one output directory and split its runs: each trains a run no other worker has
    claimed (:func:`oelm.lock.claim_run`), in the order above; a method's final runs start once
    its own sweep is complete (a worker waits, polling, while other workers train sweep runs it
    needs); the worker that finds every final run done writes the comparison, the others return
    None. Selection, test-once and every result are those of a single process: each run is
    seeded on its own, so which worker trains it does not change it (its timing does: runs of
    workers on one machine share it).

    **Results without weights** (``allow_missing_weights=True``, ``oelm run
    --allow-missing-weights``): finished runs whose best weights are missing, but whose
    ``result.json`` is there (an output directory restored from a copy that leaves weights out,
    such as ``scripts/collect_results.sh``'s, after the machine that held it was lost), are kept:
    their numbers count for selection and the comparison. Only a promotion needs the weights (the
    test split is evaluated with them): a selected sweep run without them is moved to
    ``runs/.weights-missing/`` and retrained from scratch as that seed's final run (same seed,
    data order and budget), its result recording the lost run's best validation
    (``retrained_without_weights``). Weights that are there but do not match their sha256 still
    raise ChecksumError.

    Returns:
        The comparison dict (``comparison.json``; ``report.md`` beside it) of the final runs;
        None for a worker that left the last runs to other workers.

    Raises:
        ConfigError: ``output_dir`` holds results of an incompatible config, cannot be created or
            is not writable; ``task.max_length`` / ``task.block_size`` exceeds the model's positions.
        ChecksumError: the best weights of a finished run that is kept, promoted or used by
            ``init_from`` do not match the sha256 its ``result.json`` records (names the file);
            :class:`~oelm.errors.RecordedFileMissingError` when they are missing (unless
            ``allow_missing_weights``, for a kept or promoted run).
        OutputLockedError: another ``oelm run`` is using ``output_dir`` (its ``.oelm.lock`` is
            held; see :mod:`oelm.lock`). The lock is released when this call returns or raises.
        RunInterruptedError: a run was interrupted (SIGTERM/SIGINT); its ``status.json`` says
            ``interrupted`` and rerunning continues it.
        OELMError subclasses: data or model problems, raised before any run starts.
        ConfigError: ``worker`` in a multi-process launch (a worker is one process).
    """
    out = Path(output_dir or config.output_dir or Path("outputs") / config.name)
    check_sequence_length(config)
    if worker:
        from oelm.distributed import num_processes

        if num_processes() > 1:
            raise ConfigError("oelm run --worker is one process: launch several workers (one per device) "
                              "instead of one multi-process job, or drop --worker")
    _open_output_dir(out)
    if worker:
        with hold_worker_lock(out):  # shared with other workers, never with a plain `oelm run`
            return _run_worker(config, out, log, retry_failed, allow_missing_weights)
    with hold_output_lock(out, enabled=is_main_process()):  # one `oelm run` per output directory
        return _run_matrix(config, out, log, retry_failed, allow_missing_weights)


def _run_matrix(config: ExperimentConfig, out: Path, log: Callable[[str], None], retry_failed: bool,
                allow_missing_weights: bool = False) -> dict[str, Any]:
    """The body of :func:`run_experiment`, run while the output directory's lock is held."""
    if not is_main_process():
        log = _quiet  # the other processes of a launched job run the same protocol silently
    _start_output(config, out, log)
    matrix = _Matrix(config, out, _prepare(config, out, log), log, retry_failed, allow_missing_weights)
    sweep_results = {(r.method, r.learning_rate, r.seed): _execute(matrix, r, evaluate_test=False)
                     for r in plan_runs(config) if r.stage == "sweep"}                       # 1. sweep
    selected = _select_learning_rates(matrix, sweep_results)                                 # 2. selection
    results = _final_runs(matrix, selected, sweep_results)                                   # 3. final runs
    if not any(r.get("status") == "finished" for runs in results.values() for r in runs):
        raise OELMError(f"no run of {config.name} finished (see the failures under {out / 'runs'})")
    barrier()  # every result.json and metrics.jsonl is on disk before the comparison reads them
    results = {m: r for m, r in results.items() if r}
    if not is_main_process():
        from oelm.report import compare_results

        return compare_results(config, results, out)
    return write_comparison(config, results, out)


#: Seconds a worker waits before looking again while other workers train sweep runs it needs.
WORKER_POLL_SECONDS = 30.0


def _result_of(out: Path, run: PlannedRun) -> dict | None:
    path = out / "runs" / run.name / "result.json"
    return read_json(path) if path.exists() else None


def _run_worker(config: ExperimentConfig, out: Path, log: Callable[[str], None], retry_failed: bool,
                allow_missing_weights: bool = False) -> dict[str, Any] | None:
    """The body of :func:`run_experiment` for a worker (its docstring): loop until no run is
    left that this process can start. Shared files are read and written under
    :func:`oelm.lock.hold_state_lock`; a run is trained or promoted only under its claim."""
    with hold_state_lock(out):
        _start_output(config, out, log)
    matrix = _Matrix(config, out, _prepare(config, out, log), log, retry_failed, allow_missing_weights)
    sweep_plan = [r for r in plan_runs(config) if r.stage == "sweep"]
    retried: set[str] = set()  # --retry-failed: each failed run once per worker, not again after it failed again
    selected: dict[str, float] = {}
    complete: set[str] = set()
    waiting = ""
    while True:
        if _claim_next(matrix, sweep_plan, retried, evaluate_test=False):         # 1. sweep
            continue
        sweep_results = {(r.method, r.learning_rate, r.seed): res for r in sweep_plan
                         if (res := _result_of(out, r)) is not None}
        now_complete = {m for m, _, _ in sweep_results} - {r.method for r in sweep_plan
                                                           if (r.method, r.learning_rate, r.seed) not in sweep_results}
        if now_complete != complete:                                                # 2. selection
            with hold_state_lock(out):
                selected = _select_learning_rates(matrix, sweep_results)
            complete = now_complete
        finals = [r for r in plan_runs(config, selected) if r.stage == "final"]
        if _claim_next_final(matrix, finals, sweep_results, retried):              # 3. final runs
            continue
        busy = [r.name for r in sweep_plan if (r.method, r.learning_rate, r.seed) not in sweep_results]
        if busy:
            if waiting != ", ".join(busy):
                waiting = ", ".join(busy)
                log(f"waiting for sweep runs other workers are training: {waiting}")
            time.sleep(WORKER_POLL_SECONDS)
            continue
        left = [r.name for r in finals if not _final_done(out, r, sweep_results)]
        if left:
            log(f"other workers are finishing {', '.join(left)}; the last one writes the comparison")
            return None
        with hold_state_lock(out):                                                  # 4. comparison
            results: dict[str, list[dict]] = {m.name: [] for m in config.methods}
            for r in finals:
                results[r.method].append(_result_of(out, r))
            if not any(x.get("status") == "finished" for runs in results.values() for x in runs):
                raise OELMError(f"no run of {config.name} finished (see the failures under {out / 'runs'})")
            return write_comparison(config, {m: x for m, x in results.items() if x}, out)


def _wants_run(matrix: _Matrix, result: dict | None, name: str, retried: set[str]) -> bool:
    """No result yet, or a failed one that --retry-failed retries (once per worker)."""
    return result is None or (matrix.retry_failed and result.get("status") == "failed" and name not in retried)


def _claim_next(matrix: _Matrix, runs: list[PlannedRun], retried: set[str], evaluate_test: bool) -> bool:
    """Train the first of ``runs`` that wants training and that no other worker holds; True if one ran."""
    for run in runs:
        if not _wants_run(matrix, _result_of(matrix.out, run), run.name, retried):
            continue
        with claim_run(matrix.out, run.name) as mine:
            result = _result_of(matrix.out, run) if mine else None  # re-read: another worker may have just finished it
            if not mine or not _wants_run(matrix, result, run.name, retried):
                continue
            if result is not None:
                retried.add(run.name)
            _execute(matrix, run, evaluate_test=evaluate_test)
            return True
    return False


def _final_done(out: Path, run: PlannedRun, sweep_results: dict[tuple[str, float, int], dict]) -> bool:
    swept = sweep_results.get((run.method, run.learning_rate, run.seed))
    if swept is None:
        return _result_of(out, run) is not None
    current = _result_of(out, run) or swept
    return current.get("status") != "finished" or current.get("stage") == "final"


def _claim_next_final(matrix: _Matrix, finals: list[PlannedRun], sweep_results: dict[tuple[str, float, int], dict],
                      retried: set[str]) -> bool:
    """Train or promote the first final run that is not done and that no other worker holds."""
    for run in finals:
        if (run.method, run.learning_rate, run.seed) not in sweep_results:
            if _claim_next(matrix, [run], retried, evaluate_test=True):
                return True
            continue
        if _final_done(matrix.out, run, sweep_results):
            continue
        with claim_run(matrix.out, run.name) as mine:
            if not mine or _final_done(matrix.out, run, sweep_results):
                continue
            _promote_or_retrain(matrix, run, _result_of(matrix.out, run))
            return True
    return False


@dataclass
class _Matrix:
    """What every run of one ``run_experiment`` call shares (fixed once the data is prepared)."""

    config: ExperimentConfig
    out: Path
    data: PreparedData
    log: Callable[[str], None]
    retry_failed: bool
    allow_missing_weights: bool = False

    def entry(self, method: str) -> MethodEntry:
        return next(m for m in self.config.methods if m.name == method)


_OUTPUT_FIX = "pass another --output-dir (or output_dir in the config)"


def _open_output_dir(out: Path) -> None:
    """Create ``out`` and check that files can be written in it, before any data or training work.

    Raises:
        ConfigError: ``out`` is a file, lies under a file, cannot be created (its parent is
            read-only, ...) or is not writable; one line naming the path and the fix.
    """
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output directory {out} is a file, not a directory; {_OUTPUT_FIX}, or move the file away")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        # The deepest path that exists is the one in the way: a file, or a directory we may not write in.
        blocker = next((p for p in [out, *out.parents] if p.exists() or p.is_symlink()), out)
        if blocker != out and not blocker.is_dir():
            raise ConfigError(
                f"output directory {out} lies under {blocker}, which is a file, not a directory; {_OUTPUT_FIX}"
            ) from None
        raise ConfigError(
            f"cannot create output directory {out}: {exc.strerror or exc} in {blocker}; "
            f"make {blocker} writable or {_OUTPUT_FIX}"
        ) from None
    try:  # a read-only directory (or file system) is only found out by writing in it
        fd, probe = tempfile.mkstemp(prefix=".oelm-write-test-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(
            f"output directory {out} is not writable ({exc.strerror or exc}); make it writable or {_OUTPUT_FIX}"
        ) from None


def _start_output(config: ExperimentConfig, out: Path, log: Callable[[str], None] | None = None) -> None:
    """Check run names and the fingerprint, then write experiment.json, config.yaml, plan.json.

    experiment.json keeps ``grid_growth``: per method every time its learning-rate grid grew
    (``from``, ``to``, ``at`` (UTC), and ``tested_final_runs``: its final runs that had already
    evaluated the test split then, so a reader sees whether the grid grew after the test was seen).

    Raises:
        ConfigError: two methods map to one run directory, or ``out`` holds another config's results.
    """
    safe = {}
    for m in config.methods:
        key = run_name(m.name, 0)
        if key in safe:
            raise ConfigError(f"methods {safe[key]!r} and {m.name!r} map to the same run directory name; rename one")
        safe[key] = m.name
    fingerprint, grown = _check_fingerprint(out, _config_fingerprint(config))
    growth = (read_json(out / "experiment.json").get("grid_growth") or {}) if (out / "experiment.json").exists() else {}
    for name, (old, new) in grown.items():
        tested = _tested_final_runs(out, name)
        growth = growth | {name: [*growth.get(name, []), {"from": old, "to": new, "at": utc_now(), "tested_final_runs": tested}]}
        (log or _quiet)(f"[{name}] learning-rate grid grows from {format_rates(old)} to {format_rates(new)}; its runs are kept, the new rates "
            "are swept and the rate is selected again"
            + (f" (already tested at the earlier selection: {', '.join(tested)})" if tested else ""))
    _write_json(out / "experiment.json", {"name": config.name, "fingerprint": fingerprint}
                | ({"grid_growth": growth} if growth else {}))
    _write_text(out / "config.yaml", yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    _write_plan(out, config, {})



def _prepare(config: ExperimentConfig, out: Path, log: Callable[[str], None]) -> PreparedData:
    """The shared data (with the pretrained model's tokenizer); every ``init_from`` checkpoint
    is resolved here, and its tokenizer checked against this one, so a missing or mismatched
    one is an error before any run starts. oelm's GPT's tokenizer is saved as
    ``<out>/tokenizer.json``, so that a fine-tuning config can name it (``task.tokenizer``)."""
    tokenizer = None
    if config.model.pretrained:
        from oelm.models.pretrained import load_tokenizer

        tokenizer = load_tokenizer(config.model.pretrained, trust_remote_code=config.model.trust_remote_code)
    log(f"preparing data: {config.task.dataset} ...")
    data = prepare_data(config, tokenizer)
    log(f"data: {data.summary}")
    unchecked = []
    for m in config.methods:
        for seed in config.seeds:
            checkpoint = resolve_init_from(config, m.name, seed)
            if checkpoint is not None and data.tokenizer_record and not check_init_tokenizer(checkpoint, data.tokenizer_record):
                unchecked.append(checkpoint)
    if unchecked:
        log(f"init_from: {len(unchecked)} checkpoint(s) (e.g. {unchecked[0]}) record no tokenizer (a bare safetensors file, "
            "or written by an oelm before it recorded one), so oelm cannot check that task.tokenizer is the pretraining's")
    if config.model.gpt and is_main_process() and not (out / "tokenizer.json").is_file():
        from oelm.data.lm import save_tokenizer

        save_tokenizer(data.tokenizer, out / "tokenizer.json")
    return data


def _reuse_or_clear(matrix: _Matrix, run: PlannedRun, run_dir: Path) -> dict | None:
    """The earlier result of ``run`` when it is to be kept; None when the run is to (re)start
    (a failed run under ``--retry-failed`` is moved to ``runs/.failed/`` first).

    Raises:
        ChecksumError: a finished run's ``checkpoint/model.safetensors`` does not match the
            sha256 in its ``result.json`` (or is missing); it is not retrained silently: the
            message says to delete the run's folder (``--retry-failed`` is for failed runs only).
    """
    result_path, log = run_dir / "result.json", matrix.log
    if not result_path.exists():
        if run_dir.exists():
            log(f"[{run.name}] unfinished; continuing in {run_dir}")
        return None
    previous = read_json(result_path)
    if previous.get("status") == "finished":
        try:
            verify_checkpoint(run_dir, previous, _retrain_hint(run_dir))
        except RecordedFileMissingError as exc:
            if not matrix.allow_missing_weights:
                raise RecordedFileMissingError(f"{exc}; or rerun with --allow-missing-weights to keep its result without "
                                               "them (a selected sweep run is then retrained for its test split)") from None
            log(f"[{run.name}] its best weights are missing; result kept without them (--allow-missing-weights)")
    if previous.get("status") != "failed" or not matrix.retry_failed:
        log(f"[{run.name}] {previous.get('status', 'finished')} earlier; kept ({result_path})")
        return previous
    aside = _move_aside(matrix.out, run_dir, ".failed")
    log(f"[{run.name}] failed earlier; retrying (old run moved to {aside})")
    return None


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


def _retrain_hint(run_dir: Path) -> str:
    return f"delete the folder {run_dir} and rerun the same command to train that run again"


def _execute(matrix: _Matrix, run: PlannedRun, evaluate_test: bool) -> dict:
    """Run (or continue, or keep) one cell of the matrix; returns its result (finished or failed).

    Raises:
        RunInterruptedError: SIGTERM/SIGINT (the run's status says ``interrupted``), or a signal
            during the last evaluation of a run that finished and was kept.
        Exception: anything else raised inside the run, after its status is set to ``failed``
            (``failure``: kind "error", the exception's type and message).
    """
    run_dir, log = matrix.out / "runs" / run.name, matrix.log
    previous = _reuse_or_clear(matrix, run, run_dir)
    if previous is not None:
        return previous
    run_dir.mkdir(parents=True, exist_ok=True)
    write_status(run_dir, run, "running")
    try:
        result = _run_one(matrix.config, matrix.entry(run.method), run, matrix.data, run_dir, log,
                          evaluate_test=evaluate_test)
    except RunInterruptedError as exc:
        write_status(run_dir, run, "interrupted", step=exc.step, signal=exc.signal_name)
        log(f"[{run.name}] interrupted ({exc.signal_name}) at step {exc.step}; rerun the same command to continue")
        raise
    except RunFaultError as exc:
        result = _failed_result(matrix.config, run, exc)
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
    _write_json(run_dir / "result.json", result)
    write_status(run_dir, run, "finished")
    perf = result["performance"]
    log(
        f"[{run.name}] best validation {perf['metric']} {perf['best_validation']:.4f} at step {perf['best_step']}, "
        f"{result['timing']['total_seconds']:.1f} s total"
    )
    if result.get("stop_signal"):
        raise RunInterruptedError(
            f"{result['stop_signal']} arrived during the last evaluation of {run.name}; that run finished and "
            "was kept, the matrix stops here; rerun the same command to continue with the next run",
            step=perf["steps"],
            signal_name=result["stop_signal"],
        )
    return result


def _select_learning_rates(matrix: _Matrix, sweep_results: dict[tuple[str, float, int], dict]) -> dict[str, float]:
    """Per swept method, the candidate with the best mean best-validation over the sweep seeds
    (failed runs excluded); writes ``sweep.json`` and the updated ``plan.json``.

    ``sweep.json`` lists swept methods only (two or more candidates); a method with one learning
    rate has no sweep and appears in none of its keys. ``selected_at_grid_edge``: per swept
    method ``"low"`` / ``"high"`` when the selected rate is the smallest / largest candidate (a
    wider grid could move the result), null when it is interior or nothing was selected (every
    sweep run failed); see :func:`oelm.runs.grid_edge`. ``grid_growth`` (only when a grid grew):
    ``experiment.json``'s record of it, for the report."""
    config, log = matrix.config, matrix.log
    selected: dict[str, float] = {}
    edges: dict[str, str | None] = {}
    sweep_summary: dict[str, list[dict]] = {}
    for m in config.methods:
        cands = config.learning_rate_candidates(m)
        if len(cands) == 1:
            continue
        if any((m.name, lr, s) not in sweep_results for lr in cands for s in config.sweep_seed_list()):
            continue  # its sweep is not complete yet (workers: other processes are training part of it)
        by_lr = {
            lr: [sweep_results[(m.name, lr, s)]["performance"]["best_validation"]
                 for s in config.sweep_seed_list() if sweep_results[(m.name, lr, s)].get("status") == "finished"]
            for lr in cands
        }
        choice = _select(matrix.data.metric, by_lr)
        if choice is None:
            log(f"[{m.name}] every sweep run failed; no learning rate selected, no final runs")
        else:
            selected[m.name] = choice
            log(f"[{m.name}] selected learning rate {choice:g} (mean best validation over seeds {config.sweep_seed_list()})")
        edges[m.name] = grid_edge(cands, choice)
        if edges[m.name]:
            log(f"[{m.name}] {grid_edge_note(cands, edges[m.name])}")
        sweep_summary[m.name] = [
            {"learning_rate": lr, "seed": s, "best_validation": (r.get("performance") or {}).get("best_validation"),
             "selected": lr == choice, "status": r.get("status")}
            for lr in cands for s in config.sweep_seed_list() for r in [sweep_results[(m.name, lr, s)]]
        ]
    before = read_json(matrix.out / "sweep.json").get("selected_learning_rates", {}) if (matrix.out / "sweep.json").exists() else {}
    for name, lr in selected.items():
        if name in before and not math.isclose(before[name], lr, rel_tol=1e-9):
            log(f"[{name}] selection moved from {before[name]:g} to {lr:g} (its grid grew): final runs at {before[name]:g} "
                "are superseded (kept on disk, left out of the comparison)")
    experiment = matrix.out / "experiment.json"
    growth = (read_json(experiment).get("grid_growth") or {}) if experiment.exists() else {}
    if sweep_summary:
        _write_json(matrix.out / "sweep.json", {
            "selection_metric": "best_validation",
            "selection_rule": "mean over sweep seeds; highest accuracy / lowest perplexity; ties: first candidate",
            "sweep_seeds": config.sweep_seed_list(),
            "selected_learning_rates": selected,
            "selected_at_grid_edge": edges,
            "methods": sweep_summary,
        } | ({"grid_growth": growth} if growth else {}))
    _write_plan(matrix.out, config, selected)
    return selected


def _final_runs(matrix: _Matrix, selected: dict[str, float],
                sweep_results: dict[tuple[str, float, int], dict]) -> dict[str, list[dict]]:
    """Every seed of every method at its selected learning rate: a sweep run at that rate is
    promoted (test evaluated once), any other final run is trained. Failed runs are kept in the
    results: the report flags and excludes them, so a failure is never silently dropped."""
    results: dict[str, list[dict]] = {m.name: [] for m in matrix.config.methods}
    for run in plan_runs(matrix.config, selected):
        if run.stage != "final":
            continue
        swept = sweep_results.get((run.method, run.learning_rate, run.seed))
        if swept is None:
            result = _execute(matrix, run, evaluate_test=True)
        elif swept.get("status") != "finished" or swept.get("stage") == "final":
            result = swept  # failed at the selected rate (not retried here), or promoted earlier
        else:
            result = _promote_or_retrain(matrix, run, swept)
        results[run.method].append(result)
    return results


def _quiet(message: str) -> None:
    """The log of every process but rank 0."""

