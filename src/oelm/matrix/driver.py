"""The driver: the plan (:mod:`oelm.matrix.plan`) run by an executor (:mod:`oelm.matrix.executors`),
and the primitives for clusters with their own batch system.

- :func:`run_matrix` (``oelm run``): the whole matrix; ready runs go to the executor as they become
  ready (every sweep run at once, a method's final runs once its selection is made), the selection
  and plan are written as they change, and the comparison is written once, at the end.
- :func:`plan_matrix` (``oelm plan``): the runs ready now, for a batch system to submit.
- :func:`run_only` (``oelm run --only NAME``): exactly that run, refusing one that is not ready.
- :func:`collect` (``oelm run --collect``): selection, comparison and report from what is finished.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

from oelm import report  # light: its statistics and plots load on first use
from oelm.config import ExecutorConfig, ExperimentConfig
from oelm.data.registry import get_dataset_spec
from oelm.errors import ConfigError, OELMError
from oelm.integrations.lora import lora_target_message, lora_target_problems
from oelm.integrations.trackers import check_installed
from oelm.matrix.model import check_sequence_length, skeleton_module_names
from oelm.runtime.distributed import barrier, is_main_process, num_processes
from oelm.runtime.environment import run_probes_wanted
from oelm.runtime.lock import hold_output_lock, hold_shared_lock
from oelm.training import check_warmup

from oelm.matrix.assemble import check_init_shapes
from oelm.matrix.executors import Executor, make_executor, torch_threads
from oelm.matrix.output import (
    _check_fingerprint, _experiment, _quiet, config_fingerprint, interruptible, open_output_dir, prepare_matrix_data, start_output,
    write_selection,
)
from oelm.matrix.plan import (
    RunTask, final_results, marked_final, plan_runs, ready_runs, unfinished_final_runs, why_not_ready,
)
from oelm.matrix.run_one import RunContext, mark_final, placement_record, train_planned_run, verify_kept
from oelm.records import MatrixFolder, RunRecord, time_split_text
from oelm.runtime.timing import PhaseTimer, process_age_seconds

__all__ = ["run_matrix", "plan_matrix", "run_only", "collect", "time_lines", "task_metric", "check_before_data",
           "check_lora_targets"]


def task_metric(config: ExperimentConfig) -> str:
    """The task's metric (``accuracy`` / ``perplexity``) from the dataset registry, no data loaded."""
    return get_dataset_spec(config.task.dataset).metric


def check_before_data(config: ExperimentConfig) -> None:
    """What a config can be refused for without its data, before the output folder is written:
    ``task.max_length`` / ``task.block_size`` against the model, the trackers of
    ``training.report_to``, each method's ``warmup_steps`` against ``max_steps`` when that fixes
    the run's length (an epoch-based length needs the data: checked when the run starts, and a
    folder whose runs hold no result is then taken over by the corrected config, see
    :func:`oelm.matrix.output.start_output`), each LoRA adapter's module names
    (:func:`check_lora_targets`), and every ``init_from`` checkpoint: there, and shaped like the
    model (:func:`oelm.matrix.assemble.check_init_shapes`); and ``$OELM_SPEED_PROBE``
    (:func:`oelm.runtime.environment.run_probes_wanted`) and ``$OELM_REPORT_PLOTS``
    (:func:`oelm.report.plots_wanted`), so that no value is found bad only at the report.

    Raises:
        ConfigError: one line naming the key (or variable), its value and the fix.
    """
    run_probes_wanted()
    report.plots_wanted()
    check_sequence_length(config)
    check_lora_targets(config)
    check_init_shapes(config)
    check_installed(n for m in config.methods for n in config.training_for(m).report_to)  # W&B, MLflow: before any data
    for m in config.methods:
        training = config.training_for(m)
        if training.max_steps is not None:
            overridden = {"warmup_steps", "max_steps"} & set(m.training)
            check_warmup(training, training.max_steps, f" of method {m.name}" if overridden else "")


def check_lora_targets(config: ExperimentConfig) -> None:
    """Refuse a method whose ``lora:`` names a module the model does not have
    (:func:`oelm.integrations.lora.lora_target_problems`, PEFT's matching rules), from the model's
    weightless skeleton, before any data is prepared. PEFT itself refuses only a ``target_modules``
    that matches nothing, so one typo in a list would train a different model than the config says.

    Raises:
        ConfigError: one line naming the method, the unmatched entries and the module names to use.
    """
    with_lora = [m for m in config.methods if m.lora is not None]
    names = skeleton_module_names(config) if with_lora else None
    if names is None:
        return
    model = config.model.pretrained or f"gpt {config.model.gpt!r}"
    for m in with_lora:
        problems = lora_target_problems(m.lora, names)
        if problems:
            raise ConfigError(f"method {m.name!r}: {lora_target_message(problems, names, model)}")


def _output_dir(config: ExperimentConfig, output_dir: str | Path | None) -> Path:
    return Path(output_dir or config.output_dir or Path("outputs") / config.name)


def run_matrix(config: ExperimentConfig, output_dir: str | Path | None = None, log: Callable[[str], None] = print, *,
               retry_failed: bool = False, allow_missing_weights: bool = False,
               executor: ExecutorConfig | None = None, phases: PhaseTimer | None = None) -> dict[str, Any]:
    """Run what is not finished of the matrix of ``config`` with ``executor`` (default: the config's
    ``executor``), then write the comparison (``comparison.json``, ``report.md``, ``report.html``).
    ``phases`` (when given) gets the seconds of the phases ``data`` (preparing it), ``runs`` (from
    the first run submitted to the last one back, the selection between them) and ``report`` (the
    comparison and its report), and when each began (``oelm run``'s closing line of where the time went).

    The protocol is :mod:`oelm.matrix.plan`'s. Rerunning on the same output directory keeps
    finished (and failed, unless ``retry_failed``) runs, checking the sha256 of their best weights,
    and continues unfinished ones from their checkpoints; a damaged ``result.json`` (hand-edited,
    cut short) has its run folder moved whole to ``runs/.damaged/`` and the run trained again.
    ``allow_missing_weights``: finished runs
    whose best weights are missing (a folder restored from a copy without them) count; a selected
    sweep run without them is retrained as that seed's final run.

    Returns:
        The comparison dict.

    Raises:
        ConfigError: what :func:`check_before_data` refuses (sequence length, a tracker of
            ``training.report_to`` not installed, warmup longer than ``max_steps``); the Ray executor
            in a multi-process launch; what the executor refuses (:mod:`oelm.matrix.executors`:
            threads or loader workers beyond the cores, Ray's address or resources); ``output_dir``
            cannot be created or is not writable (all before any data is prepared or the output
            folder is written); ``output_dir`` holds results of an incompatible config (a folder
            without results is taken over instead: :func:`oelm.matrix.output.start_output`).
        RunLostError: Ray lost a run's worker beyond its retries, or its node (one line naming it).
        ChecksumError: the best weights of a finished run that is kept, promoted or used by
            ``init_from`` do not match their recorded sha256 (``RecordedFileMissingError`` when
            missing, unless ``allow_missing_weights``).
        OutputLockedError: another ``oelm run`` is using ``output_dir`` (:mod:`oelm.runtime.lock`).
        RunInterruptedError: a run was interrupted (SIGTERM/SIGINT); rerunning continues it.
        OELMError subclasses: data or model problems, raised before any run starts; no run finished.
    """
    out = _output_dir(config, output_dir)
    executor = executor or config.executor
    check_before_data(config)
    if executor.name != "local":
        if num_processes() > 1:
            raise ConfigError(f"executor {executor.name} places whole runs on processes itself: launch `oelm run` "
                              "as one process, or use the local executor inside a multi-process launch")
    # checked (Ray: installed, joined, resources) before the output folder is touched or data prepared
    with make_executor(executor, config, log) as runner:
        open_output_dir(out)
        with hold_output_lock(out, enabled=is_main_process()):  # one driver per output directory
            return _drive(config, out, log, retry_failed, allow_missing_weights, runner, phases or PhaseTimer())


def _mark_finals(config: ExperimentConfig, out: Path, selection, results: dict[str, RunRecord],
                 log: Callable[[str], None]) -> None:
    """No test split: mark each selected sweep run final where it lies (:func:`~oelm.matrix.plan.marked_final`),
    updating ``results``; rank 0 writes."""
    for run in marked_final(config, selection, results):
        results[run.name] = mark_final(MatrixFolder(out), run, log)


def _check_kept(ctx: RunContext, results: dict[str, RunRecord], names: set[str]) -> None:
    """Check every earlier result the rerun keeps (:func:`oelm.matrix.run_one.verify_kept`)."""
    for name in sorted(names & set(results)):
        if not (results[name].failed and ctx.retry_failed):
            verify_kept(ctx, ctx.folder.run(name), results[name])


def _drive(config: ExperimentConfig, out: Path, log: Callable[[str], None], retry_failed: bool,
           allow_missing_weights: bool, executor: Executor, phases: PhaseTimer) -> dict[str, Any]:
    """The body of :func:`run_matrix`, run while the output directory's lock is held."""
    if not is_main_process():
        log = _quiet  # the other processes of a launched job run the same protocol silently
    MatrixFolder(out).set_aside_damaged(log)  # a damaged result.json: its run is trained again
    start_output(config, out, log)
    barrier()  # every process binds the data to the experiment.json rank 0 wrote (a folder taken over: afresh)
    with phases.measure("data"):
        data = prepare_matrix_data(config, out, log)
    ctx = RunContext(config, out, data, log, retry_failed, allow_missing_weights)
    results = MatrixFolder(out).results()
    retry = {n for n, r in results.items() if r.failed} if retry_failed else set()
    _, selection = ready_runs(config, ctx.data.metric, results)
    with interruptible("checking the finished runs' weights"):  # sha256 of every kept run: can take a while
        _check_kept(ctx, results, {r.name for r in plan_runs(config, selection.selected, selection.grids)})
    executor.bind(ctx)
    busy: dict[str, RunTask] = {}
    announced: set[str] = set()
    written = None
    with phases.measure("runs"), executor.running():
        while True:
            ready, selection = ready_runs(config, ctx.data.metric, results, retry=retry, busy=busy)
            state = (set(selection.complete), dict(selection.selected), {m: list(g) for m, g in selection.grids.items()})
            if written != state:  # a selection made, or a grid grown
                write_selection(out, config, selection, log, announced)
                written = state
            _mark_finals(config, out, selection, results, log)
            for task in ready:
                if executor.free_slots(len(busy)) <= 0:
                    break
                retry.discard(task.name)
                executor.submit(task)
                busy[task.name] = task
            if not busy:
                break
            for task, record in executor.wait():
                busy.pop(task.name)
                results[task.name] = record
    finals = {m: runs for m, runs in final_results(config, selection, results).items() if runs}
    if not any(r.finished for runs in finals.values() for r in runs):
        raise OELMError(f"no run of {config.name} finished (see the failures under {ctx.folder.runs})")
    barrier()  # every result.json and metrics.jsonl is on disk before the comparison reads them
    with phases.measure("report"):
        if not is_main_process():
            return report.compare_results(config, finals, out)  # the statistics (scipy) load here, after the runs
        return report.write_comparison(config, finals, out)


def time_lines(out: str | Path, phases: PhaseTimer, *, since_unix: float, command_started: float) -> list[str]:
    """``oelm run``'s closing lines: where the wall time went, for each run of ``out`` trained since
    ``since_unix`` (``time.time()``; its :attr:`~oelm.records.RunRecord.time_split`), then for
    this process: ``start-up`` (from the process's start to the data: imports, the config, the
    output folder), then ``data``, ``runs`` and ``report`` as :func:`run_matrix` measured them into
    ``phases``, and ``other`` (the rest: the table printed, the selection). Seconds, one decimal,
    adding up to each total (:func:`oelm.records.time_split_text`). ``command_started``
    (``time.perf_counter()``) stands for the process's start where that cannot be read (not Linux).

    Raises:
        DamagedFileError: a run's ``result.json`` is damaged.
    """
    lines = [f"time {name}: {time_split_text(r.time_split)}" for name, r in sorted(MatrixFolder(out).results().items())
             if r.time_split is not None and (r.started_unix or 0.0) >= since_unix]
    now = time.perf_counter()
    wall = process_age_seconds() or now - command_started
    if "data" not in phases.began:  # `oelm run --collect`: no data prepared, no run
        return lines + [f"oelm run took {wall:.1f} s (this process)"]
    parts = {"start-up": phases.began["data"] - (now - wall)} | {k: phases.seconds.get(k, 0.0) for k in ("data", "runs", "report")}
    parts["other"] = max(0.0, wall - sum(parts.values()))
    return lines + [f"oelm run took {time_split_text(parts)} (this process)"]


# --- primitives for batch systems: plan, --only, --collect -------------------------------------

def _check_started(config: ExperimentConfig, out: Path) -> None:
    """The output folder was started by ``oelm plan`` (or ``oelm run``) with a compatible config.

    Raises:
        ConfigError: no ``experiment.json`` there, or it records another config.
    """
    if not MatrixFolder(out).experiment.is_file():
        raise ConfigError(f"{out} has no experiment.json: run `oelm plan CONFIG --output-dir {out}` first")
    _, grown = _check_fingerprint(out, config_fingerprint(config))
    if grown:
        raise ConfigError(f"the learning-rate grid of {', '.join(sorted(grown))} grew: run `oelm plan CONFIG "
                          f"--output-dir {out}` first, so that the growth is recorded")


def _started_with(config: ExperimentConfig, out: Path) -> bool:
    """Whether ``out`` was started by exactly this config (same fingerprint, no grid grown): then
    planning rewrites only what its runs determine (``sweep.json``, ``plan.json``, sweep runs marked
    final), which ``--only`` jobs never write, so it may run beside them."""
    if not MatrixFolder(out).experiment.is_file():
        return False
    try:
        stored, grown = _check_fingerprint(out, config_fingerprint(config))
        return not grown and stored == _experiment(out).get("fingerprint")  # nothing for start_output to record
    except OELMError:  # another config, or a damaged experiment.json: start_output says so, exclusively
        return False


def plan_matrix(config: ExperimentConfig, output_dir: str | Path | None = None,
                log: Callable[[str], None] = print) -> list[RunTask]:
    """Start (or check) the output folder, write the selection state and ``plan.json``, and return
    the runs ready now (``oelm plan``: one JSON object a line). No data is prepared, nothing trains.

    A folder this config started already is planned under the shared lock, beside running
    ``oelm run --only`` jobs (a batch system plans the next runs while others still train); starting
    a folder, taking one over or recording a grown grid needs it exclusively.

    Raises:
        ConfigError, OutputLockedError: as :func:`run_matrix` (the latter also when the folder must
            be started or its grid grows while ``--only`` jobs hold it).
    """
    out = _output_dir(config, output_dir)
    check_before_data(config)
    open_output_dir(out)
    started = _started_with(config, out)
    with hold_shared_lock(out) if started else hold_output_lock(out):
        MatrixFolder(out).set_aside_damaged(log)
        if started:
            _check_started(config, out)  # again under the lock: a driver may have changed it since
        else:
            start_output(config, out, log)
        results = MatrixFolder(out).results()
        ready, selection = ready_runs(config, task_metric(config), results)
        write_selection(out, config, selection, log, set())
        _mark_finals(config, out, selection, results, log)
    return ready


def run_only(config: ExperimentConfig, output_dir: str | Path | None, name: str, log: Callable[[str], None] = print, *,
             retry_failed: bool = False, allow_missing_weights: bool = False, cpus_per_run: float | None = None) -> RunRecord:
    """Train exactly the planned run ``name`` in this process (``oelm run --only NAME``), for a
    batch system that runs each of ``oelm plan``'s lines as a job. Several ``--only`` processes may
    share an output folder (its lock in shared mode; never beside a driver), each run is locked
    while it trains (``runs/<name>/.oelm.lock``), and a run writes only its own folder.
    ``cpus_per_run`` (``--cpus-per-run``): torch threads for the run (None: this process's), as
    the executors set them, so a job given one core by its batch system trains on one thread.

    Returns:
        The run's :class:`~oelm.records.RunRecord`.

    Raises:
        ConfigError: the folder was not started by ``oelm plan`` (or holds another config), or
            ``name`` is not ready (finished, failed, a final run whose sweep is not finished, or no
            run of this matrix): one line saying which.
        OutputLockedError: a driver holds the folder, or another process trains ``name``.
    """
    out = _output_dir(config, output_dir)
    _check_started(config, out)
    check_before_data(config)
    with hold_shared_lock(out):
        MatrixFolder(out).set_aside_damaged(log)
        results = MatrixFolder(out).results()
        retry = {n for n, r in results.items() if r.failed} if retry_failed else set()
        ready, _ = ready_runs(config, task_metric(config), results, retry=retry)
        task = next((t for t in ready if t.name == name), None)
        if task is None:
            raise ConfigError(why_not_ready(config, task_metric(config), results, name))
        run_dir = MatrixFolder(out).run(name).path
        run_dir.mkdir(parents=True, exist_ok=True)
        with hold_output_lock(run_dir), torch_threads(cpus_per_run):
            job = {k: os.environ[k] for k in ("SLURM_JOB_ID", "SLURM_ARRAY_TASK_ID", "PBS_JOBID") if k in os.environ}
            placement = placement_record("only", **({"cpus_per_run": cpus_per_run} if cpus_per_run else {}),
                                         **({"job": job} if job else {}))
            return train_planned_run(config, out, task, retry_failed=retry_failed,
                                     allow_missing_weights=allow_missing_weights, placement=placement, log=log)


def collect(config: ExperimentConfig, output_dir: str | Path | None = None,
            log: Callable[[str], None] = print) -> tuple[dict[str, Any], list[str]]:
    """Selection state, comparison and report from the runs that are finished
    (``oelm run --collect``). Returns the comparison and the final runs not finished yet.

    Raises:
        ConfigError: the folder was not started by ``oelm plan`` / ``oelm run``, or holds another config.
        OELMError: no final run has finished yet.
    """
    out = _output_dir(config, output_dir)
    _check_started(config, out)
    with hold_output_lock(out):
        MatrixFolder(out).set_aside_damaged(log)
        results = MatrixFolder(out).results()
        _, selection = ready_runs(config, task_metric(config), results)
        write_selection(out, config, selection, log, set())
        _mark_finals(config, out, selection, results, log)
        finals = {m: runs for m, runs in final_results(config, selection, results).items() if runs}
        if not any(r.finished for runs in finals.values() for r in runs):
            raise OELMError(f"no final run of {config.name} has finished under {MatrixFolder(out).runs} yet; "
                            "train the runs `oelm plan` lists first")
        return report.write_comparison(config, finals, out), unfinished_final_runs(config, selection, results)
