"""Command line: ``oelm run | plan | stop | monitor | inspect | report | diagnose | configs | init | bench | env``.

Every deliberate error (bad config, missing data, unsupported model) is printed as one line
``oelm: error: ...`` with exit status 2; anything else is a bug and keeps its traceback.

The Hugging Face Hub is off unless asked for (``--online``, or ``HF_HUB_OFFLINE`` set in the
environment): a missing dataset or model then fails at once with one line instead of retrying
the network. ``--data-dir DIR`` sets ``OELM_DATA_DIR`` for the process (and the runs it starts).

Each ``cmd_*`` imports what its command runs inside the function: ``oelm --help`` and the parser
load no torch, transformers or scipy (``tests/test_imports.py`` checks it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from oelm.cli_inspect import cmd_configs, cmd_init, cmd_inspect, print_table, version  # inspect, configs, init, the table printer
from oelm.configs import resolve_config
from oelm.errors import OELMError  # importing oelm sets OMP_WAIT_POLICY before torch loads

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


def _apply_environment(args: argparse.Namespace) -> None:
    """``--data-dir`` -> ``OELM_DATA_DIR``; the Hub offline (``HF_HUB_OFFLINE=1``) unless
    ``--online`` or the environment already says. Done before anything imports
    huggingface_hub, which reads these once; Ray workers and launched processes inherit them.

    Raises:
        OELMError: ``--data-dir`` is not an existing directory.
    """
    data_dir = getattr(args, "data_dir", None)
    if data_dir is not None:
        path = Path(data_dir).expanduser()
        if not path.is_dir():
            raise OELMError(f"--data-dir {data_dir}: no such directory; give a folder laid out like shared/data "
                            "(see its MANIFEST.md)")
        os.environ["OELM_DATA_DIR"] = str(path.resolve())
    if getattr(args, "online", False):
        os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "0"
    else:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _launch_line() -> str:
    """``"2 processes on cpu (MULTI_CPU)"``: what Accelerate's state says this job runs on."""
    from accelerate import PartialState

    from oelm.distributed import cpu_only

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
    from oelm.distributed import is_main_process
    from oelm.errors import RunInterruptedError
    from oelm.matrix import collect, run_matrix, run_only, time_lines
    from oelm.records import time_split_text
    from oelm.timing import PhaseTimer

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
    from oelm.monitor import monitor

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


def cmd_stop(args: argparse.Namespace) -> int:
    """``oelm stop DIR``: :func:`oelm.lock.stop_holder`: the driving ``oelm run``, or each
    ``oelm run --only`` job of this host that holds one of its runs (exit 0 when they stopped or
    nothing held the directory, 1 when one still runs after ``--wait`` seconds)."""
    from oelm.lock import stop_holder
    from oelm.records import MatrixFolder

    out = Path(args.dir)
    runs = [run.path for run in MatrixFolder(out).run_folders()]
    return 0 if stop_holder(out, args.wait, runs) else 1


def cmd_env(args: argparse.Namespace) -> int:
    from oelm.environment import capture_environment

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


def build_parser() -> argparse.ArgumentParser:
    """The ``oelm`` parser: one sub-command per ``cmd_*`` (``--help`` loads none of their modules)."""
    parser = argparse.ArgumentParser(
        prog="oelm", description="Orthogonal ELM transformer training and comparisons.",
        epilog="The Hugging Face Hub is off unless --online is given (or HF_HUB_OFFLINE is set): data and models "
               "come from --data-dir / OELM_DATA_DIR and local directories.")
    parser.add_argument("--version", action="version", version=f"oelm {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    env = argparse.ArgumentParser(add_help=False)  # run, plan, report, inspect
    env.add_argument("--data-dir", metavar="DIR",
                     help="folder of local data laid out like shared/data (sets OELM_DATA_DIR for this command and its runs)")
    env.add_argument("--online", action="store_true",
                     help="allow downloads from the Hugging Face Hub (default: offline unless HF_HUB_OFFLINE is set)")
    _add_run(sub, env)
    _add_matrix_tools(sub, env)
    _add_inspect(sub, env)
    _add_bench(sub)

    p = sub.add_parser("env", help="print the environment record (versions, device, matmul speed probe)")
    p.add_argument("--no-probe", action="store_true", help="skip the matrix-multiply speed probe (a few seconds)")
    p.set_defaults(func=cmd_env)
    return parser


def _add_run(sub, env: argparse.ArgumentParser) -> None:
    p = sub.add_parser("run", parents=[env], help="run every method x seed of an experiment config, then compare")
    p.add_argument("config", help="experiment YAML, or a shipped config's name (quickstart; `oelm configs` lists them)")
    p.add_argument("--output-dir", help="default: the config's output_dir, else outputs/<name>")
    p.add_argument("--retry-failed", action="store_true", help="rerun runs that failed earlier (NaN, OOM, ...) instead of keeping their failure")
    p.add_argument("--executor", choices=["local", "ray"],
                   help="where runs train: local (default: this process, one run after another) or ray "
                        "(each run a Ray task: a local Ray instance, or the cluster at --address)")
    p.add_argument("--address", help="ray: join the cluster at 'auto' or HOST:PORT instead of starting a local instance")
    p.add_argument("--parallel", metavar="N|auto",
                   help="ray: at most N runs at once (default 1); 'auto': one per GPU on a cluster with GPUs, else 1")
    p.add_argument("--cpus-per-run", type=float,
                   help="CPU cores and torch threads per run, --only jobs too (default: this process's torch threads)")
    p.add_argument("--gpus-per-run", type=float, help="ray: GPUs per run; fractions share a GPU (0.125: 8 runs per GPU)")
    p.add_argument("--only", metavar="RUN_NAME",
                   help="train exactly this run of the plan (`oelm plan` lists the ready ones), for a batch system's jobs; "
                        "refused when it is not ready")
    p.add_argument("--collect", action="store_true",
                   help="write the selection, comparison and report from the runs that are finished (after --only jobs)")
    p.add_argument("--allow-missing-weights", action="store_true",
                   help="keep finished runs whose best weights are missing (an output directory restored from a copy "
                        "without weights): their numbers count; a selected sweep run without them is retrained for its test split")
    p.add_argument("overrides", nargs="*", default=[],
                   help="optional key=value overrides with dotted keys, e.g. training.epochs=2 seeds=[0,1,2]")
    p.set_defaults(func=cmd_run)


def _add_matrix_tools(sub, env: argparse.ArgumentParser) -> None:
    """plan, stop, monitor, report, diagnose: the commands around a matrix's output folder."""
    p = sub.add_parser("plan", parents=[env],
                       help="the runs of a matrix that are ready to train now, one JSON object a line (for batch systems)")
    p.add_argument("config", help="experiment YAML, or a shipped config's name")
    p.add_argument("--output-dir", help="default: the config's output_dir, else outputs/<name>")
    p.add_argument("overrides", nargs="*", default=[], help="optional key=value overrides, as for `oelm run`")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("stop", help="stop the `oelm run` holding an output directory (SIGTERM to the pid in its .oelm.lock)")
    p.add_argument("dir", help="the run's output directory")
    p.add_argument("--wait", type=float, default=60.0,
                   help="seconds to wait for it to save and exit (default 60; 0: send the signal and return)")
    p.set_defaults(func=cmd_stop)

    p = sub.add_parser("monitor", help="live view of a running or finished `oelm run` output directory")
    p.add_argument("dir", help="an `oelm run` output directory")
    p.add_argument("--once", action="store_true", help="print one plain snapshot and exit")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default 2)")
    p.set_defaults(func=cmd_monitor)

    p = sub.add_parser("report", parents=[env], help="write comparison.json, original_layout.json, report.md and report.html (plots in report_files/) from the runs")
    p.add_argument("dir", help="an `oelm run` output directory")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("diagnose", parents=[env], help="attention diagnostics (entropy, logit scale, effective rank, "
                       "overlap) of finished final runs that lack them, from their best weights: runs/<run>/diagnostics.json")
    p.add_argument("dir", help="an `oelm run` output directory")
    p.add_argument("--force", action="store_true", help="recompute diagnostics.json files that exist")
    p.set_defaults(func=cmd_diagnose)


def _add_inspect(sub, env: argparse.ArgumentParser) -> None:
    """inspect, configs, init: looking at models and configs before a run."""
    p = sub.add_parser("inspect", parents=[env], help="show where Q/K projections are and the parameter table per method")
    p.add_argument(
        "target", nargs="?", metavar="MODEL_OR_CONFIG",
        help="a Hugging Face model (Hub id, local dir, or sentence-transformers/all-MiniLM-L6-v2), "
        "or an experiment YAML or shipped config name such as quickstart (its model and methods)",
    )
    p.add_argument("--config-only", action="store_true", help="MODEL: random weights from its config.json, no weight loading")
    p.add_argument("--model", help="Hugging Face id or local dir, built as a sequence classifier")
    p.add_argument("--gpt", help="oelm GPT preset (gpt-tiny, gpt-medium-512)")
    p.add_argument("--method", action="append", help="method name (repeatable); default: every named method (MODEL) or the config's methods")
    p.add_argument("--num-labels", type=int, default=2, help="classifier labels of the built model (default 2)")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("configs", help="list the shipped experiment configs (for `oelm run NAME`, `oelm init --template NAME`)")
    p.set_defaults(func=cmd_configs)

    p = sub.add_parser("init", help="write a starter experiment config to edit, from a shipped one")
    p.add_argument("path", nargs="?", default="experiment.yaml", help="file to write (default experiment.yaml)")
    p.add_argument("--template", help="shipped config to start from (default quickstart)")
    p.add_argument("--suite", help="a research suite instead of a template: frozen-attention (the Q/K controls and "
                   "inits that apply to --model, a fixed learning-rate grid, seeds, a targets example; oelm.suite)")
    p.add_argument("--model", help="--suite: an oelm GPT preset (from scratch: gpt-tiny) or a Hugging Face id / local "
                   "dir (pretrained: sentence-transformers/all-MiniLM-L6-v2)")
    p.add_argument("--task", help="--suite: a registered dataset (oelm.data.DATASETS: sst2, ag_news, imdb, xnli-en-dev, tinystories, gutenberg, ...)")
    p.add_argument("--seeds", type=int, help="--suite: seeds per method (default 5, at least 3)")
    p.add_argument("--force", action="store_true", help="overwrite PATH if it exists")
    p.set_defaults(func=cmd_init)


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="interleaved step timing of methods vs baseline vs a plain PyTorch loop: ms/step, tokens/s, MFU, ratio")
    p.add_argument("--model", default="cpu-bench", help="a shape: cpu-bench (issue 12's), dispatch-proxy (a dispatch-bound "
                   "tiny step), gpt2-124m, bert-base-cls, minilm-cls (the demo model's shape); or an oelm GPT preset: gpt-tiny, gpt-medium-512")
    p.add_argument("overrides", nargs="*", help="model config overrides as for `oelm run`, e.g. num_layers=4 "
                   "(or model.gpt_overrides.num_layers=4)")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="the same overrides (an alias)")
    p.add_argument("--batch-size", type=int, help="sequences per step (default: the shape's; gpt2-124m and bert-base-cls: "
                   "the largest power of two that fits on the GPU, 1 on a CPU; else 8)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence / block (default: the shape's, else the context length)")
    p.add_argument("--vocab-size", type=int, help="vocabulary size (default: the shape's / preset's)")
    p.add_argument("--steps", type=int, default=50, help="timed steps per runner (default 50)")
    p.add_argument("--warmup-steps", type=int, default=5, help="untimed steps per runner first (default 5)")
    p.add_argument("--methods", default="baseline,oelm_freeze", help="comma-separated, must include baseline (default baseline,oelm_freeze)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="fp32 (default) or bf16 autocast")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False, help="torch.compile each model copy (compile time reported apart)")
    p.add_argument("--compile-mode", choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
                   help="torch.compile mode for every model copy (implies --compile; reduce-overhead = CUDA graphs)")
    p.add_argument("--data", default="auto", help="auto (TinyStories when available), tinystories or random")
    p.add_argument("--seed", type=int, default=0, help="seed of the model init and the data order (default 0)")
    p.add_argument("--no-plain", action="store_true", help="skip the plain PyTorch reference loop")
    p.add_argument("--no-profile", action="store_true", help="skip the torch.profiler operator count of one engine and one plain step")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", metavar="PATH", help="write every figure (and per-step times) as JSON")
    p.set_defaults(func=cmd_bench)


def _skip_final_collection() -> None:
    """At interpreter exit, after every exit handler registered later (trackers, writers, threads)
    has run, freeze the heap: the final garbage collection then skips torch's and transformers'
    objects, which cost 1.5-5 s per ``oelm`` command (issue 25, item 5). Registered once."""
    import atexit
    import gc

    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # Overrides may come before or after options (`oelm run C --output-dir D a=1 b=2`); argparse
    # stops filling a positional list at the first option, so collect the rest here.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if getattr(args, "command", None) in ("run", "plan", "bench") and all("=" in e and not e.startswith("-") for e in extra):
            args.overrides = list(args.overrides) + extra
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    _skip_final_collection()
    try:
        _apply_environment(args)
        return args.func(args)
    except OELMError as exc:
        print(f"oelm: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("oelm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `oelm configs | head`: the reader left; no traceback, no second error at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
