"""Shared helpers of the reliability tests (resume, faults, determinism): run the tiny real
training of ``_train_driver.py`` in a fresh process or in this one, and compare runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "_train_driver.py"
sys.path.insert(0, str(HERE))

import _train_driver  # noqa: E402


def driver_env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(HERE.parent / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


def start(run_dir: Path, out_json: Path, *args: str) -> subprocess.Popen:
    """Start the driver in a new process (stdout/stderr captured)."""
    return subprocess.Popen([sys.executable, str(DRIVER), str(run_dir), str(out_json), *args],
                            env=driver_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run(run_dir: Path, out_json: Path, *args: str, timeout: float = 300) -> tuple[int, dict, str]:
    """Run the driver to its end: (exit code, its JSON, stderr)."""
    proc = start(run_dir, out_json, *args)
    _, err = proc.communicate(timeout=timeout)
    data = json.loads(out_json.read_text()) if out_json.exists() else {}
    return proc.returncode, data, err


def last_logged_step(run_dir: Path) -> int:
    """The step of the last complete line of metrics.jsonl (0 before any)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    lines = [l for l in path.read_text().split("\n")[:-1] if l]  # the last piece may be half-written
    return json.loads(lines[-1])["step"] if lines else 0


def wait_for_step(proc: subprocess.Popen, run_dir: Path, step: int, timeout: float = 240) -> int:
    """Poll metrics.jsonl until it shows ``step`` or later; returns the step seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = last_logged_step(run_dir)
        if seen >= step:
            return seen
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (exit {proc.returncode}) before step {step}: {proc.stderr.read()}")
        time.sleep(0.05)
    raise AssertionError(f"no progress to step {step} within {timeout} s")


def comparable(result: dict) -> dict:
    """What must be bit-identical between two runs: metrics, history, every weight's sha256."""
    return {k: result[k] for k in ("performance", "history", "saved_weights", "model_weights")}


def metrics_records(run_dir: Path) -> list[dict]:
    """metrics.jsonl without the wall-clock fields (which differ between runs)."""
    return [{k: v for k, v in json.loads(l).items() if k not in ("elapsed_seconds", "step_ms", "train_wall_seconds")}
            for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


def sigterm_at(step: int):
    """A forward hook (for :func:`in_process`) that sends this process SIGTERM during training
    step ``step`` (counting training-mode forwards: one per step without accumulation)."""
    calls = {"n": 0}

    def hook(module, args, kwargs, output):
        if module.training:
            calls["n"] += 1
            if calls["n"] == step:
                os.kill(os.getpid(), signal.SIGTERM)
    return hook


def in_process(run_dir: Path, *overrides: str, hook=None, pre_hook=None):
    """Build and train the driver's run in this process; returns (TrainResult, model, config).

    With a ``hook``/``pre_hook`` (which count training forwards to act at a chosen step), the
    engine's undone warm-up pass is switched off: it is a training-mode forward too, and would
    shift every count by one (``training.timing_warmup_passes=0``; results do not depend on it)."""
    from oelm.training import train

    if hook is not None or pre_hook is not None:
        overrides = ("training.timing_warmup_passes=0", *overrides)
    config, data, model, (train_loader, val_loader, _) = _train_driver.build(list(overrides))
    if hook is not None:
        model.register_forward_hook(hook, with_kwargs=True)
    if pre_hook is not None:
        model.register_forward_pre_hook(pre_hook, with_kwargs=True)
    result = train(model, train_loader, val_loader, metric=data.metric, config=config.training,
                   learning_rate=config.training.learning_rate, run_dir=run_dir)
    return result, model, config


def in_process_summary(result, model, run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return {
        "performance": {"best_validation": result.best_validation, "best_step": result.best_step,
                        "final_validation": result.final_validation, "final_train_loss": result.final_train_loss,
                        "steps": result.steps, "test": result.test},
        "history": [{k: v for k, v in r.items() if k not in ("elapsed_seconds", "step_ms", "train_wall_seconds")} for r in result.history],
        "saved_weights": _train_driver.tensor_digests(load_file(str(run_dir / "checkpoint" / "model.safetensors"))),
        "model_weights": _train_driver.tensor_digests(model.state_dict()),
    }
