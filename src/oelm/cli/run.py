"""The commands that run a matrix or read what it wrote: ``oelm run | plan | stop | monitor | report |
diagnose``, and ``oelm env`` and ``oelm bench``. Each ``cmd_*`` imports what its command runs inside
the function, so that the parser (:mod:`oelm.cli.parser`) and ``oelm --help`` load no torch."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from oelm.cli.console import print_table
from oelm.configs import resolve_config
from oelm.errors import OELMError

EXIT_INTERRUPTED = 130  # `oelm run` stopped by SIGTERM/SIGINT; rerunning continues the matrix


def _output_dir(args: argparse.Namespace, config) -> Path:
    """``--output-dir``, else the config's ``output_dir``, else ``outputs/<name>``.

    Raises:
        OELMError: ``--output-dir ''`` (an empty value is refused, not read as the default).
    """
    if args.output_dir is not None and not args.output_dir.strip():
        raise OELMError("--output-dir is empty; give a directory, or leave the option out for the config's "
                        f"output_dir (else outputs/{config.name})")
    return Path(args.output_dir or config.output_dir or Path("outputs") / config.name)


def _launch_line() -> str:
    """``"2 processes on cpu (MULTI_CPU)"``: what Accelerate's state says this job runs on."""
    from accelerate import PartialState

    from oelm.runtime.distributed import cpu_only

    state = PartialState(cpu=cpu_only())
    n = state.num_processes
    kind = str(getattr(state.distributed_type, "value", state.distributed_type))
    line = f"{n} process{'es' if n != 1 else ''} on {state.device.type}" + (f" ({kind})" if n > 1 else "")
    if n == 1 and os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true":
        # accelerate launch --cpu uses its simple launcher: one process, whatever --num_processes says
        line += "; for N CPU processes: torchrun --nproc_per_node=N -m oelm run ..."
    return line


def _comparison_warnings(comparison: dict) -> list[str]:
    """The comparison's warnings (machine-speed drift, devices, collapses, ...), as `oelm report`
    prints them."""
    import oelm.report

    fn = getattr(oelm.report, "comparison_warnings", None)
    return list(fn(comparison) if fn is not None else comparison.get("warnings", []))


def _executor_config(config, args: argparse.Namespace):
    """The config's ``executor`` with the command line's ``--executor``, ``--address``,
    ``--parallel``, ``--cpus-per-run``, ``--gpus-per-run`` applied (validated as the config is)."""
    from pydantic import ValidationError

    from oelm.config import ExecutorConfig

    flags = {"name": args.executor, "address": args.address, "cpus_per_run": args.cpus_per_run,
             "gpus_per_run": args.gpus_per_run,
             "parallel": None if args.parallel is None else (args.parallel if args.parallel == "auto" else _int(args.parallel, "--parallel"))}
    changes = {k: v for k, v in flags.items() if v is not None}
    if (changes.get("address") or changes.get("gpus_per_run") or changes.get("parallel") not in (None, 1)) \
            and "name" not in changes and config.executor.name == "local":
        changes["name"] = "ray"  # --address / --gpus-per-run / --parallel N only mean something on Ray
    try:
        return ExecutorConfig.model_validate(config.executor.model_dump() | changes)
    except ValidationError as err:
        first = err.errors()[0]
        raise OELMError(f"executor: {first['msg'].removeprefix('Value error, ')}") from None


def _only_threads(config, args: argparse.Namespace) -> float | None:
    """``--cpus-per-run`` for ``--only`` (validated as for an executor); the flags that place runs
    elsewhere are refused in one line: an ``--only`` job trains in this process, where its batch
    system put it."""
    elsewhere = [flag for flag, value in (("--executor ray", args.executor == "ray"), ("--address", args.address),
                                          ("--parallel", args.parallel), ("--gpus-per-run", args.gpus_per_run)) if value]
    if elsewhere:
        raise OELMError(f"--only trains one run in this process: {', '.join(elsewhere)} do(es) not apply; "
                        "leave them out (the batch system places the job) and keep --cpus-per-run for its threads")
    return _executor_config(config, args).cpus_per_run if args.cpus_per_run is not None else None


def _int(value: str, flag: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise OELMError(f"{flag} takes a whole number of runs or 'auto', got {value!r}") from None


def cmd_run(args: argparse.Namespace) -> int:
    import time

    from oelm.config import load_config

    started = time.perf_counter()
    started_unix = time.time()  # runs that began since then trained in this process (time_lines)
    config = load_config(resolve_config(args.config), args.overrides)  # before torch loads: a typo fails at once
    from oelm.runtime.distributed import is_main_process
    from oelm.errors import RunInterruptedError
    from oelm.matrix import collect, run_matrix, run_only, time_lines
    from oelm.records import time_split_text
    from oelm.runtime.timing import PhaseTimer

    out = _output_dir(args, config)
    phases = PhaseTimer()
    if args.only and args.collect:
        raise OELMError("--only and --collect are two steps: train runs with --only, then collect once with --collect")
    main = is_main_process()  # launched on several processes, rank 0 alone prints
    try:
        if args.only:
            result = run_only(config, out, args.only, retry_failed=args.retry_failed,
                              allow_missing_weights=args.allow_missing_weights, cpus_per_run=_only_threads(config, args))
            print(f"oelm run --only {args.only}: {result.status}"
                  + (f", best validation {result.metric} {result.best_validation:.4f}" if result.best_validation is not None else "")
                  + (f", test {result.test:.4f}" if result.test is not None else ""))
            if result.time_split is not None:
                print(f"time {args.only}: {time_split_text(result.time_split)}")
            return 0
        if args.collect:
            comparison, missing = collect(config, out)
        else:
            executor = _executor_config(config, args)
            if main:
                print(f"oelm run: {config.name} -> {out} (executor {executor.name}; {_launch_line()})")
            comparison = run_matrix(config, out, retry_failed=args.retry_failed, executor=executor,
                                    allow_missing_weights=args.allow_missing_weights, phases=phases)
            missing = []
    except RunInterruptedError as exc:
        hint = "" if "rerun the same command" in str(exc) else "; rerun the same command to continue"
        if main:
            print(f"oelm: interrupted: {exc}{hint}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if not main:
        return 0
    from oelm.report import comparison_rows  # after the runs: scipy/matplotlib are not start-up cost

    header, rows = comparison_rows(comparison)
    print_table(f"{config.name}: {comparison['task']} / {comparison['model']}", header, rows)
    if missing:
        print(f"not finished yet (left out): {', '.join(missing)}")
    for w in _comparison_warnings(comparison):
        print(f"warning: {w}")
    print(f"report: {out / 'report.html'} (also report.md)  numbers: {out / 'comparison.json'}  "
          f"curves: tensorboard --logdir {out / 'runs'}")
    for line in time_lines(out, phases, since_unix=started_unix, command_started=started):
        print(line)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from oelm.config import load_config

    config = load_config(resolve_config(args.config), args.overrides)  # before torch loads: a typo fails at once
    from oelm.matrix import plan_matrix

    out = _output_dir(args, config)
    for task in plan_matrix(config, out, log=lambda m: print(m, file=sys.stderr)):
        print(json.dumps(task.to_dict()))
    return 0


def cmd_monitor(args: argparse.Namespace) -> int:
    from oelm.cli.monitor import monitor

    return monitor(Path(args.dir), once=args.once, interval=args.interval)


def cmd_report(args: argparse.Namespace) -> int:
    from oelm.config import load_config
    from oelm.records import MatrixFolder, RunRecord
    from oelm.report import comparison_rows, load_results, write_comparison

    out = Path(args.dir)
    folder = MatrixFolder(out)
    if not folder.config.is_file():
        raise OELMError(f"{out} is not an oelm output directory (no config.yaml); pass the --output-dir of `oelm run`")
    config = load_config(folder.config)  # a damaged config.yaml: one line naming it (not valid YAML, empty, ...)
    results: dict[str, list[RunRecord]] = {m.name: [] for m in config.methods}
    results.update(load_results(out))
    if not any(results.values()):
        if not (finished := folder.results()):
            raise OELMError(f"no runs under {folder.runs} (no runs/*/result.json); run `oelm run` with --output-dir {out} "
                            "first")
        # sweep runs only: a selected one becomes a final run (test split evaluated) once its method's sweep is chosen
        raise OELMError(f"no final runs yet under {folder.runs}: {len(finished)} sweep run(s) have a result, and the "
                        "comparison reads final runs (the selected learning rate's, test split evaluated); rerun "
                        f"`oelm run` with --output-dir {out} to finish the matrix (`oelm monitor {out}` shows what is left)")
    comparison = write_comparison(config, results, out)
    header, rows = comparison_rows(comparison)
    print_table(f"{config.name}", header, rows)
    corrupted, absent = folder.check_weights(
        [r for runs in results.values() for r in runs],
        lambda run: f"the numbers are reported, but delete {run.path} and rerun `oelm run` if you need these weights")
    for message in corrupted:
        print(f"oelm: warning: {message}", file=sys.stderr)
    if absent:
        print(f"oelm: {absent} finished run(s) have no best weights here (checkpoint/model.safetensors; committed "
              "results leave them out): the report reads result.json and metrics.jsonl only", file=sys.stderr)
    for w in comparison.get("warnings", []):
        print(f"warning: {w}")
    print(f"report: {folder.report_md}  {folder.report_html}  numbers: {folder.comparison}")
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    from oelm.matrix.diagnose import diagnose_output

    written = diagnose_output(Path(args.dir), force=args.force)
    print(f"diagnostics: {len(written)} run(s) written; `oelm report {args.dir}` puts them in the report")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """``oelm export RUN_DIR OUT``: :func:`oelm.matrix.export.export_run`."""
    from oelm.matrix.export import export_run

    export_run(Path(args.run_dir), Path(args.out))
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    """``oelm stop DIR``: :func:`oelm.runtime.lock.stop_holder`: the driving ``oelm run``, or each
    ``oelm run --only`` job of this host that holds one of its runs (exit 0 when they stopped or
    nothing held the directory, 1 when one still runs after ``--wait`` seconds)."""
    from oelm.runtime.lock import stop_holder
    from oelm.records import MatrixFolder

    out = Path(args.dir)
    runs = [run.path for run in MatrixFolder(out).run_folders()]
    return 0 if stop_holder(out, args.wait, runs) else 1


def cmd_env(args: argparse.Namespace) -> int:
    from oelm.runtime.environment import capture_environment

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(json.dumps(capture_environment(device, probe=not args.no_probe), indent=2))
    return 0


def _parse_set(items: list[str]) -> dict:
    """Bench overrides, ``oelm run``'s syntax: ``["num_layers=4", "model.gpt_overrides.dropout=0.1"]``
    -> ``{"num_layers": 4, "dropout": 0.1}`` (values read as YAML; see :func:`oelm.bench.parse_overrides`)."""
    from oelm.bench import parse_overrides

    return parse_overrides(items)


def cmd_bench(args: argparse.Namespace) -> int:
    from oelm.bench import BenchConfig, format_bench, run_bench

    config = BenchConfig(
        model=args.model, overrides=_parse_set([*args.overrides, *args.set]), batch_size=args.batch_size,
        seq_len=args.seq_len, vocab_size=args.vocab_size, steps=args.steps, warmup_steps=args.warmup_steps,
        methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()), device=args.device,
        precision=args.precision, compile=args.compile, compile_mode=args.compile_mode, data=args.data, seed=args.seed,
        plain=not args.no_plain, profile=not args.no_profile,
    )
    result = run_bench(config, progress=not args.no_progress)
    header, rows, lines = format_bench(result)
    m = result["model"]
    compiled = f", compiled ({config.compile_mode or 'default'})" if config.compile or config.compile_mode else ""
    print_table(f"oelm bench: {config.model} (batch {m['batch_size']} x {m['seq_len']} tokens, {config.precision}"
                 f"{compiled})", header, rows)
    for line in lines:
        print(line)
    if args.json:
        from oelm.io import write_json_atomic

        write_json_atomic(Path(args.json), result)
        print(f"figures: {args.json}")
    return 0
