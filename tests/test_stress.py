"""Stress: a tiny real matrix (2 methods x 2 seeds, oelm GPT on TinyStories, dropout on) is started,
killed (SIGKILL / SIGTERM / SIGINT at points hypothesis draws) and restarted ten times in a row;
the finished matrix must equal an uninterrupted one bit for bit: every run's performance, its
metrics.jsonl records (wall-clock fields aside), the sha256 of every best-weights file, and the
comparison's metric values (CPU, fp32)."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from _reliability import driver_env
from _tiny_lm import tiny_lm_overrides

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "_matrix_driver.py"
OVERRIDES = [
    *tiny_lm_overrides(max_steps=30, eval_every=10),
    "training.save_best_checkpoint=true", "training.checkpoint_every=4",
    "model.gpt_overrides={dropout: 0.1, hidden_size: 32, num_layers: 2, num_heads: 2}",
]
TRAIN_RECORDS = 4 * 30 // 2  # 4 runs x 30 steps, a train record every 2 steps
KILL_SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)


def _start(out: Path, sleep: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(DRIVER), str(out), str(sleep), *OVERRIDES], env=driver_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _train_records(out: Path) -> int:
    n = 0
    for path in (out / "runs").glob("*/metrics.jsonl"):
        lines = path.read_text().split("\n")[:-1]  # the last piece may be half written
        n += sum('"type": "train"' in line for line in lines)
    return n


def _fingerprint(out: Path) -> dict:
    """What must be identical: performance, time-free metrics records, best-weights sha256, comparison values."""
    runs = {}
    for d in sorted((out / "runs").iterdir()):
        if not (d / "result.json").is_file():
            continue
        result = json.loads((d / "result.json").read_text())
        records = [{k: v for k, v in json.loads(l).items() if k not in ("elapsed_seconds", "step_ms", "train_wall_seconds")}
                   for l in (d / "metrics.jsonl").read_text().splitlines()]
        weights = hashlib.sha256((d / "checkpoint" / "model.safetensors").read_bytes()).hexdigest()
        runs[d.name] = {"status": result["status"], "performance": result["performance"], "records": records,
                        "weights": weights}
    comparison = json.loads((out / "comparison.json").read_text())
    values = {m: {k: v[k]["mean"] for k in ("best_validation", "final_validation")}
              for m, v in comparison["methods"].items()}
    return {"runs": runs, "comparison": values}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("stress-reference") / "out"
    proc = _start(out, 0.0)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return _fingerprint(out)


@pytest.mark.slow
# One example of ten processes is minutes long: no shrinking (Hypothesis prints the failing draw).
@settings(max_examples=1, deadline=None, suppress_health_check=list(HealthCheck), phases=[Phase.generate])
@given(kills=st.lists(st.tuples(st.sampled_from(KILL_SIGNALS), st.floats(0.0, 0.9)), min_size=10, max_size=10))
def test_ten_kills_and_restarts_of_a_matrix_end_bit_identical(reference, tmp_path_factory, kills):
    out = tmp_path_factory.mktemp("stress") / "out"
    done = []
    for k, (sig, offset) in enumerate(kills):
        # The k-th kill lands at a drawn point of the k-th tenth of the matrix's train records.
        target = max(1, int((k + offset) / 10 * TRAIN_RECORDS))
        proc = _start(out, 0.02)
        deadline = time.monotonic() + 300
        while proc.poll() is None and _train_records(out) < target and time.monotonic() < deadline:
            time.sleep(0.02)
        killed = proc.poll() is None
        if killed:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=300)
        done.append((signal.Signals(sig).name, target, killed, proc.returncode))
        # A kill never leaves a state that the next start refuses: every exit is a kill or a clean stop.
        assert proc.returncode in (0, 130, -signal.SIGKILL, -signal.SIGTERM, -signal.SIGINT), (done, err[-3000:])
    proc = _start(out, 0.0)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, (done, err[-3000:])
    assert _fingerprint(out) == reference, done
    # The kills really landed mid-matrix: most processes were stopped while running, and a run
    # was continued from a checkpoint in a later process.
    assert sum(k[2] for k in done) >= 5, done
    starts = [json.loads(p.read_text())["timing"]["process_start_steps"] for p in (out / "runs").glob("*/result.json")]
    assert any(len(s) > 1 for s in starts), (done, starts)
