"""`oelm run --worker`: several processes share one matrix's output directory and split its runs;
the results are those of one process, every run is trained once, and a plain `oelm run` and
workers never share a directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from oelm.cli import main
from oelm.errors import ConfigError, OutputLockedError
from oelm.lock import acquire, claim_run, hold_worker_lock, release

CONFIG = (
    "name: workers\n"
    "task: {dataset: tinystories, tokenizer: bpe-512, train_samples: 40, validation_samples: 10, block_size: 32}\n"
    "model: {gpt: gpt-tiny, gpt_overrides: {hidden_size: 32, num_layers: 2, num_heads: 2, intermediate_size: 64}}\n"
    "methods: [{name: baseline, learning_rates: [1.0e-3, 3.0e-3]}, {name: oelm_freeze, learning_rate: 2.0e-3}]\n"
    "seeds: [0, 1]\n"
    "training: {max_steps: 4, batch_size: 8, eval_every: 2, log_every: 2, progress_bar: false, tensorboard: false}\n"
)
# sweep: baseline-lr0.001-seed0, baseline-lr0.003-seed0; final: oelm_freeze-seed0/1, baseline seed 1 (+ seed 0 promoted)


def _numbers(out: Path) -> dict[str, tuple]:
    """Per run folder: what its training computed (identical whichever process trained it)."""
    found = {}
    for p in sorted(out.glob("runs/*/result.json")):
        r = json.loads(p.read_text())
        perf = r["performance"]
        found[p.parent.name] = (r["stage"], perf["best_validation"], perf["final_train_loss"], perf["test"])
    return found


def _train_steps_increase(run_dir: Path) -> bool:
    """metrics.jsonl of a run trained once: its train records' steps strictly increase (a second
    training of the same run would append records from step 1 again)."""
    steps = [json.loads(l)["step"] for l in (run_dir / "metrics.jsonl").read_text().splitlines() if '"train"' in l]
    return steps == sorted(set(steps))


@pytest.fixture(scope="module")
def plain(tmp_path_factory, data_dir):
    tmp = tmp_path_factory.mktemp("plain")
    (tmp / "c.yaml").write_text(CONFIG)
    assert main(["run", str(tmp / "c.yaml"), "--output-dir", str(tmp / "out")]) == 0
    return tmp / "c.yaml", tmp / "out"


def test_a_worker_leaves_held_runs_to_their_holders_and_the_last_one_writes_the_comparison(plain, tmp_path, monkeypatch, capsys):
    """In one process, deterministically: a thread holds a sweep run's claim for 3 s (the worker
    trains what it can, then waits for it, then trains it once it is free), and a final run's
    claim is held while the worker runs (it leaves that run and returns without a comparison).
    A second worker then trains the last run and writes the comparison, equal to a plain run's."""
    import oelm.experiment

    monkeypatch.setattr(oelm.experiment, "WORKER_POLL_SECONDS", 0.2)
    cfg, reference = plain
    out = tmp_path / "out"
    out.mkdir()
    held_sweep, held_final = "baseline-lr0.003-seed0", "oelm_freeze-seed1"
    claimed = threading.Event()

    def hold_for_a_while():
        with claim_run(out, held_sweep) as mine:
            assert mine
            claimed.set()
            time.sleep(3.0)

    holder = threading.Thread(target=hold_for_a_while)
    holder.start()
    claimed.wait()
    with claim_run(out, held_final) as mine:
        assert mine
        assert main(["run", str(cfg), "--output-dir", str(out), "--worker"]) == 0
    holder.join()
    text = capsys.readouterr().out
    assert f"waiting for sweep runs other workers are training: {held_sweep}" in text
    assert f"other workers are finishing {held_final}; the last one writes the comparison" in text
    assert "this worker is done" in text
    assert not (out / "comparison.json").exists() and not (out / "runs" / held_final / "result.json").exists()
    assert (out / "runs" / held_sweep / "result.json").exists()  # trained after its claim was released
    assert main(["run", str(cfg), "--output-dir", str(out), "--worker"]) == 0
    assert _numbers(out) == _numbers(reference)
    assert all(_train_steps_increase(d) for d in (out / "runs").iterdir())
    mine, theirs = (json.loads((d / "comparison.json").read_text()) for d in (out, reference))
    assert mine["sweep"]["selected_learning_rates"] == theirs["sweep"]["selected_learning_rates"]
    for name, m in theirs["methods"].items():
        for key in ("best_validation", "final_validation", "test", "included_seeds", "learning_rate"):
            assert mine["methods"][name][key] == m[key], (name, key)
    assert mine["vs_baseline"]["oelm_freeze"]["paired_metric"] == theirs["vs_baseline"]["oelm_freeze"]["paired_metric"]


@pytest.mark.slow
def test_two_worker_processes_split_a_matrix_and_compute_what_one_process_does(plain, tmp_path):
    """Two `oelm run --worker` processes started together on one directory: every run is
    trained exactly once (by one of them), the numbers equal a plain run's, and the comparison
    exists when both have exited."""
    cfg, reference = plain
    out = tmp_path / "out"
    import torch

    # the thread count of the process that trained the reference: float sums in another order differ in the last bits
    env = os.environ | {"OMP_NUM_THREADS": str(torch.get_num_threads())}
    cmd = [sys.executable, "-m", "oelm", "run", str(cfg), "--output-dir", str(out), "--worker"]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    assert _numbers(out) == _numbers(reference)
    assert all(_train_steps_increase(d) for d in (out / "runs").iterdir())
    assert (out / "comparison.json").exists()
    assert sum("results:" in log for log in logs) >= 1  # the last one printed the comparison


def test_a_plain_run_and_workers_never_share_a_directory(plain, tmp_path, capsys):
    cfg, _ = plain
    out = tmp_path / "out"
    out.mkdir()
    with hold_worker_lock(out):  # a worker is running: a plain run refuses, another worker may start
        with pytest.raises(OutputLockedError, match="in use by another oelm run"):
            release(acquire(out), out)
        with hold_worker_lock(out):
            pass
    fd = acquire(out)  # a plain run is running: a worker refuses
    try:
        capsys.readouterr()
        assert main(["run", str(cfg), "--output-dir", str(out), "--worker"]) == 2
        assert "in use by an oelm run without --worker" in capsys.readouterr().err
    finally:
        release(fd, out)


def test_a_worker_is_one_process(plain, tmp_path, monkeypatch):
    import oelm.distributed
    from oelm.config import load_config
    from oelm.experiment import run_experiment

    monkeypatch.setattr(oelm.distributed, "num_processes", lambda: 2)
    with pytest.raises(ConfigError, match="--worker is one process"):
        run_experiment(load_config(plain[0]), tmp_path / "out", worker=True)
