"""The ``oelm`` command line's parser: one sub-command per ``cmd_*`` (:mod:`oelm.cli.run`,
:mod:`oelm.cli.inspect`, :mod:`oelm.cli.starter`); building it loads none of their commands' modules."""

from __future__ import annotations

import argparse

from oelm.cli.console import version
from oelm.cli.inspect import cmd_inspect
from oelm.cli.run import cmd_bench, cmd_diagnose, cmd_env, cmd_export, cmd_monitor, cmd_plan, cmd_report, cmd_run, cmd_stop
from oelm.cli.starter import cmd_configs, cmd_init


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
    """plan, stop, monitor, report, diagnose, export: the commands around a matrix's output folder."""
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

    p = sub.add_parser("export", parents=[env], help="a finished run's best weights as a Hugging Face model folder "
                       "(method merged out, model card README.md) that a stock AutoModelFor...from_pretrained(OUT) "
                       "loads without oelm")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a finished run's folder: OUTPUT_DIR/runs/<run>")
    p.add_argument("out", metavar="OUT", help="a new (or empty) folder to write")
    p.set_defaults(func=cmd_export)


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
                   "inits that apply to --model, a fixed learning-rate grid, seeds, a targets example; oelm.config.suite)")
    p.add_argument("--model", help="--suite: an oelm GPT preset (from scratch: gpt-tiny) or a Hugging Face id / local "
                   "dir (pretrained: sentence-transformers/all-MiniLM-L6-v2)")
    p.add_argument("--task", help="--suite: a registered dataset (oelm.data.DATASETS: sst2, ag_news, imdb, xnli-en-dev, "
                   "tinystories, gutenberg, ...), or your own data as a config's task takes it: "
                   "'{dataset: NAME, source: {files: {train: FILE, validation: FILE}, text_columns: [COLUMN]}}' "
                   "inline or in a .yaml file")
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
