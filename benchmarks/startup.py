"""Fixed start-up of a short ``oelm run``: where the seconds outside the training steps go.

Runs ``oelm run`` (one method, one seed, ``--steps`` optimizer steps; the quickstart config by
default) in a fresh Python process whose oelm functions are wrapped to record wall-clock
timestamps, and splits the process's wall time into phases:

    imports       process start -> oelm's modules imported (cli, matrix, training, models, data)
    config        cli.main -> the matrix starts (config read, output folder, lock, plan)
    data          prepare_data (tokenizer, the token cache, the splits)
    probe_before  capture_environment before the run (matmul speed probe, library versions)
    model         build_run_model (weights load, the method applied)
    loaders       make_loaders
    engine        oelm.training.engine.setup (optimizer, schedule, Accelerate)
    warm_up       the timing warm-up passes
    steps+evals   the steps and validations (the run's ``train_seconds + validation_seconds``)
    loop_other    the rest of the loop's span (progress bar, telemetry, stop signals)
    finish        best weights saved, test split, metrics log closed
    mfu_peak      the run's timing summary (the measured matmul peak for MFU on a CPU)
    probe_after   capture_environment after the run
    result        result.json, status, the rest of run_one
    report        comparison.json, report.md, report.html and its plots
    cli_tail      the table, warnings and the final lines
    exit          main returned -> the process has exited (interpreter shutdown, atexit, threads)

``fixed`` = wall - steps+evals: the start-up the issue counts. With ``--reference old_tree``
the same job is run with the oelm of another source tree (a git worktree at an older commit)
interleaved with this one (old, new, old, new, ...), so both see the same machine load.

    OELM_DATA_DIR=/work/shared/data HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/startup.py \\
        --repeats 2 --reference /work/tmp/startup-base

``--typo`` times a config typo instead: ``oelm run CONFIG training.epoch=2`` from process start to
its one-line error and exit (``wall``), interleaved with ``--reference`` the same way.

``--hf`` also times ``benchmarks/startup_hf.py`` (the same job as a plain Hugging Face Trainer
script) in the same rotation. Prints a table of medians (seconds) and the 1-minute load average
at each run's start; ``--json`` writes every run's phases.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The child: wrap oelm's phase functions (each at the name its caller looks up), run the CLI, and
# write the timestamps to $OELM_STARTUP_TIMES. time.time() is shared with the parent process.
_CHILD = r"""
import json, os, sys, time
marks = []
def mark(name):
    marks.append((name, time.time()))
import oelm.cli, oelm.cli.parser, oelm.matrix.driver, oelm.matrix.output, oelm.matrix.run_one, oelm.training.loop
import oelm.training.engine, oelm.runtime.environment, oelm.report, oelm.train
mark("imports")

def wrap(owner, attr, begin, end):
    fn = getattr(owner, attr)
    def wrapped(*a, **k):
        mark(begin)
        try:
            return fn(*a, **k)
        finally:
            mark(end)
    setattr(owner, attr, wrapped)

wrap(oelm.matrix.output, "prepare_data", "data<", "data>")
wrap(oelm.matrix.run_one, "build_run_model", "model<", "model>")
wrap(oelm.matrix.run_one, "make_loaders", "loaders<", "loaders>")
wrap(oelm.matrix.run_one, "capture_environment", "probe<", "probe>")  # where run_one looks it up
wrap(oelm.training.loop, "setup", "engine<", "engine>")
wrap(oelm.training.loop, "warm_up", "warm_up<", "warm_up>")
wrap(oelm.training.loop, "finish", "finish<", "finish>")
wrap(oelm.report, "write_comparison", "report<", "report>")
wrap(oelm.cli.parser, "cmd_run", "cmd_run<", "cmd_run>")  # the parser hands it to main
import atexit
atexit.register(lambda: json.dump(marks, open(os.environ["OELM_STARTUP_TIMES"], "w")))
mark("main")
try:
    code = oelm.cli.main(sys.argv[1:])
finally:
    mark("main>")
sys.exit(code)
"""

PHASES = ("imports", "config", "data", "probe_before", "model", "loaders", "engine", "warm_up", "steps+evals",
          "loop_other", "finish", "mfu_peak", "probe_after", "result", "report", "cli_tail", "exit")


def phases_of(marks: list[tuple[str, float]], start: float, end: float, timing: dict) -> dict[str, float]:
    """Seconds per phase (``PHASES``) from the child's marks, the parent's process start/end
    times and the run's result.json ``timing`` block."""
    at: dict[str, list[float]] = {}
    for name, t in marks:
        at.setdefault(name, []).append(t)
    first = lambda name: at[name][0]  # noqa: E731
    steps_evals = timing["train_seconds"] + timing["validation_seconds"]
    loop = first("finish<") - first("warm_up>")
    return {
        "imports": first("imports") - start,
        "config": first("data<") - first("imports"),
        "data": first("data>") - first("data<"),
        "probe_before": at["probe>"][0] - at["probe<"][0],
        "model": first("model>") - first("model<"),
        "loaders": first("loaders>") - first("loaders<"),
        "engine": first("engine>") - first("engine<"),
        "warm_up": first("warm_up>") - first("warm_up<"),
        "steps+evals": steps_evals,
        "loop_other": loop - steps_evals,
        "finish": first("finish>") - first("finish<"),
        "mfu_peak": at["probe<"][-1] - first("finish>"),
        "probe_after": at["probe>"][-1] - at["probe<"][-1],
        "result": first("report<") - at["probe>"][-1],
        "report": first("report>") - first("report<"),
        "cli_tail": first("main>") - first("report>"),
        "exit": end - first("main>"),
        "wall": end - start,
        "fixed": end - start - steps_evals,
        "gaps": (first("probe<") - first("data>")) + (first("model<") - at["probe>"][0])
        + (first("engine<") - first("loaders>")),
    }


def run_oelm(tree: Path, python: str, config: str, steps: int, workdir: Path) -> dict[str, float]:
    """One ``oelm run`` of ``config`` (baseline only, seed 0, ``steps`` steps) with ``tree``'s
    oelm; returns its phases (seconds)."""
    out = Path(tempfile.mkdtemp(prefix="run-", dir=workdir))
    times = out / "marks.json"
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "OELM_STARTUP_TIMES": str(times)}
    args = [python, "-c", _CHILD, "run", config, "methods=[{name: baseline, learning_rate: 1.0e-4}]",
            "seeds=[0]", f"training.max_steps={steps}", "--output-dir", str(out / "out")]
    start = time.time()
    proc = subprocess.run(args, env=env, capture_output=True, text=True, cwd=tree)
    end = time.time()
    if proc.returncode != 0:
        sys.exit(f"oelm run failed in {tree} ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads((out / "out" / "runs" / "baseline-seed0" / "result.json").read_text())
    return phases_of(json.loads(times.read_text()), start, end, result["timing"])


def run_typo(tree: Path, python: str, config: str) -> dict[str, float]:
    """``oelm run config training.epoch=2`` (a key typo) with ``tree``'s oelm: seconds to the error."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    start = time.time()
    proc = subprocess.run([python, "-m", "oelm", "run", config, "training.epoch=2"], env=env, capture_output=True,
                          text=True, cwd=tree)
    wall = time.time() - start
    if proc.returncode != 2 or "training.epoch" not in proc.stderr:
        sys.exit(f"expected the one-line config error from {tree}, got ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"wall": wall, "fixed": wall}


def run_hf(python: str, steps: int, workdir: Path) -> dict[str, float]:
    """One run of ``benchmarks/startup_hf.py`` (the HF Trainer script); its wall time and the
    seconds its own steps and evaluations took (it prints them as JSON on its last line)."""
    out = Path(tempfile.mkdtemp(prefix="hf-", dir=workdir))
    start = time.time()
    proc = subprocess.run([python, str(ROOT / "benchmarks" / "startup_hf.py"), "--steps", str(steps),
                           "--output-dir", str(out)], capture_output=True, text=True)
    end = time.time()
    if proc.returncode != 0:
        sys.exit(f"startup_hf.py failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    inner = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"imports": inner["imported"] - start, "steps+evals": inner["steps_evals_seconds"],
            "wall": end - start, "fixed": end - start - inner["steps_evals_seconds"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="quickstart")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=1, help="rounds of the rotation (old, new[, hf])")
    p.add_argument("--reference", type=Path, help="another source tree (e.g. a git worktree of the old commit)")
    p.add_argument("--hf", action="store_true", help="also time benchmarks/startup_hf.py")
    p.add_argument("--typo", action="store_true", help="time a config typo's error instead of a run")
    p.add_argument("--json", type=Path, help="write every run's phases here")
    args = p.parse_args(argv)
    python = sys.executable
    workdir = Path(tempfile.mkdtemp(prefix="oelm-startup-"))
    sides = ([("old", args.reference)] if args.reference else []) + [("new", ROOT)] + ([("hf", None)] if args.hf else [])
    runs: dict[str, list[dict]] = {name: [] for name, _ in sides}
    for r in range(args.repeats):
        for name, tree in sides:
            load = os.getloadavg()[0]
            if args.typo and tree is not None:
                phases = run_typo(tree, python, args.config)
            else:
                phases = run_hf(python, args.steps, workdir) if tree is None else run_oelm(tree, python, args.config, args.steps, workdir)
            runs[name].append({**phases, "load1": load})
            print(f"round {r + 1} {name}: wall {phases['wall']:.1f} s, fixed {phases['fixed']:.1f} s (load {load:.1f})",
                  flush=True)
    names = [n for n, _ in sides]
    rows = [k for k in (*PHASES, "gaps", "fixed", "wall", "load1") if any(k in run for n in names for run in runs[n])]
    job = f"a config typo's error (oelm run {args.config} training.epoch=2)" if args.typo else \
        f"{args.steps} steps of {args.config} (baseline, seed 0)"
    print(f"\nmedian seconds over {args.repeats} round(s), {job}")
    print(f"{'phase':<14}" + "".join(f"{n:>10}" for n in names))
    for k in rows:
        cells = []
        for n in names:
            values = [run[k] for run in runs[n] if k in run]
            cells.append(f"{statistics.median(values):>10.2f}" if values else f"{'':>10}")
        print(f"{k:<14}" + "".join(cells))
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
