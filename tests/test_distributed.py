"""`oelm run` on two processes (torchrun, gloo on CPU) against one process with the same global batch.

Two ranks with micro-batch 4 see, per optimizer step, the same 8 sequences as one process with
batch 8 (Accelerate shards each epoch's batches over the ranks; DDP averages the gradients), so
their losses, validation perplexities and step counts agree to float tolerance. Only rank 0
writes files: one result.json per run, one comparison.json.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import oelm
from oelm.records.predictions import read_predictions

from _tiny_lm import tiny_lm_overrides

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(data_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(oelm.__file__).resolve().parents[1])
    env.update(PYTHONPATH=os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep), OMP_NUM_THREADS="1",
               OMP_WAIT_POLICY="PASSIVE", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OELM_DATA_DIR=str(data_dir))
    return env


def _overrides(batch_size: int) -> list[str]:
    return [*tiny_lm_overrides(max_steps=12, eval_every=6), "seeds=[0]", f"training.batch_size={batch_size}",
            "training.eval_batch_size=5", "training.timing_warmup_steps=1", "task.train_samples=60",
            "task.validation_samples=16"]


def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, f"{cmd[:6]} exited with {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def _results(out: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted((out / "runs").glob("*/result.json"))}


def _train_losses(out: Path, run: str) -> list[float]:
    lines = (out / "runs" / run / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r["type"] == "train"]


@pytest.mark.slow
def test_two_process_oelm_run_equals_one_process_with_the_same_global_batch(tmp_path, data_dir):
    env = _env(data_dir)
    config = str(ROOT / "configs" / "tinystories-tiny.yaml")
    one, two = tmp_path / "one", tmp_path / "two"
    _run([sys.executable, "-m", "oelm", "run", config, "--output-dir", str(one), *_overrides(8)], env)
    proc = _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
                 "-m", "oelm", "run", config, "--output-dir", str(two), *_overrides(4)], env)
    assert proc.stdout.count("oelm run: tinystories-tiny ->") == 1  # rank 0 alone prints

    single, double = _results(one), _results(two)
    assert sorted(single) == sorted(double) == ["baseline-seed0", "oelm_freeze-seed0"]
    for name in single:
        a, b = single[name], double[name]
        assert b["budget"]["num_processes"] == 2 and b["timing"]["num_processes"] == 2
        assert a["budget"]["global_batch_size"] == b["budget"]["global_batch_size"] == 8
        assert a["budget"]["steps"] == b["budget"]["steps"] == 12
        # The same examples per step: equal tokens over the run (rank 0 counts its half).
        assert a["budget"]["tokens"] == 2 * b["budget"]["tokens"]
        for key in ("best_validation", "final_validation", "final_train_loss"):
            assert math.isclose(a["performance"][key], b["performance"][key], rel_tol=2e-4), (name, key)
        la, lb = _train_losses(one, name), _train_losses(two, name)
        assert len(la) == len(lb) == 6 and all(math.isclose(x, y, rel_tol=2e-4) for x, y in zip(la, lb))
        # One writer: every metrics line once (no duplicate records from rank 1).
        steps = [json.loads(l)["step"] for l in (two / "runs" / name / "metrics.jsonl").read_text().splitlines()
                 if json.loads(l)["type"] == "train"]
        assert steps == sorted(set(steps))
        # The final run's per-document predictions, gathered over the ranks (the repeated examples that even out
        # the shards dropped): every document once, as one process saw them, reproducing the recorded perplexity.
        pa, pb = (read_predictions(out / "runs" / name, r).split("validation") for out, r in ((one, a), (two, b)))
        assert np.array_equal(pa["document"], pb["document"]) and np.array_equal(pa["tokens"], pb["tokens"])
        assert np.allclose(pa["loss"], pb["loss"], rtol=2e-4)
        ppl = math.exp(float(np.sum(pb["loss"] * pb["tokens"]) / pb["tokens"].sum()))
        assert math.isclose(ppl, b["performance"]["best_validation"], rel_tol=1e-5)
        # attention diagnostics: rank 0 alone computes them, from the same best weights as one process
        assert b["diagnostics"]["sites"] == ["0", "1"]
        assert math.isclose(a["diagnostics"]["mean"]["entropy"], b["diagnostics"]["mean"]["entropy"], rel_tol=1e-3)
    comparison = json.loads((two / "comparison.json").read_text())
    assert set(comparison["methods"]) == {"baseline", "oelm_freeze"}


@pytest.mark.slow
def test_two_process_fsdp_keeps_query_key_frozen_and_orthogonal(tmp_path, data_dir):
    """training.distributed=fsdp: Accelerate's FSDP plugin (use_orig_params) on 2 gloo ranks; the
    frozen Q/K of OELM-Freeze leave training with orthonormal head rows, the run finishes and
    rank 0 saves full (unsharded) weights."""
    from safetensors.torch import load_file

    from oelm.method.init import max_orthogonality_error

    out = tmp_path / "fsdp"
    overrides = [*_overrides(4), "training.distributed=fsdp", "training.save_best_checkpoint=true",
                 "methods=[{name: oelm_freeze, learning_rate: 3.0e-3}]"]
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
          "-m", "oelm", "run", str(ROOT / "configs" / "tinystories-tiny.yaml"), "--output-dir", str(out), *overrides],
         _env(data_dir))
    result = _results(out)["oelm_freeze-seed0"]
    assert result["status"] == "finished" and result["budget"]["num_processes"] == 2
    assert "oelm diagnose" in result["diagnostics"]["skipped"]  # sharded parameters: afterwards, from the weights
    weights = load_file(str(out / "runs" / "oelm_freeze-seed0" / "checkpoint" / "model.safetensors"))
    qk = [k for k in weights if k.endswith(("q_proj.weight", "k_proj.weight"))]
    assert len(qk) == 4 and all(weights[k].shape == (32, 32) for k in qk)
    assert max(max_orthogonality_error(weights[k], 2) for k in qk) < 1e-5



@pytest.mark.slow
def test_two_processes_stop_early_together(tmp_path, data_dir):
    """Early stopping on 2 gloo ranks: both count the same reduced validation values and stop
    after the same step (a rank left training would hang the other in its next collective).
    The validation at step 0 (eval_at_start) is the reference that no later one beats by 1e6, so
    with patience 2 the validations at steps 2 and 4 stop the run at step 4 of 12."""
    out = tmp_path / "es"
    overrides = [*_overrides(4), "methods=[{name: oelm_freeze, learning_rate: 3.0e-3}]", "training.eval_every=2",
                 "training.early_stopping_patience=2", "training.early_stopping_min_delta=1.0e6"]
    proc = _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
                 "-m", "oelm", "run", str(ROOT / "configs" / "tinystories-tiny.yaml"), "--output-dir", str(out),
                 *overrides], _env(data_dir))
    result = _results(out)["oelm_freeze-seed0"]
    assert result["budget"]["num_processes"] == 2 and result["performance"]["early_stopped"] is True
    assert result["budget"]["steps_run"] == 4 and result["budget"]["planned_steps"] == 12
    records = [json.loads(l) for l in (out / "runs" / "oelm_freeze-seed0" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["type"] == "eval"] == [0, 2, 4]
    assert [r["step"] for r in records if r["type"] == "early_stop"] == [4]  # written once (rank 0)
    assert proc.stdout.count("early stop at step 4 of 12") == 1


def _launch_resume_driver(run_dir: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           f"--master_port={_free_port()}", str(ROOT / "tests" / "_dist_resume_driver.py"), str(run_dir),
                           *args], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)


def _step_losses(run_dir: Path) -> list[tuple[int, float]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [(r["step"], r["loss"]) for r in map(json.loads, lines) if r["type"] == "train"]


@pytest.mark.slow
def test_two_process_resume_restores_each_ranks_own_rng_states(tmp_path, data_dir):
    """A 2-process gloo run stopped by SIGTERM after step 4 and resumed logs the same train loss at
    every step (log_every=1) as the uninterrupted run. The driver trains on SST-2 with dropout 0.1:
    each rank pads its batch to its own longest example, so the ranks' dropout draws different
    numbers of random values and their RNG states differ by the checkpoint (checked below); a
    resume that gave rank 1 rank 0's states would draw other dropout masks on rank 1 from step 5."""
    env = _env(data_dir)
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    proc = _launch_resume_driver(whole, env)
    assert proc.returncode == 0, proc.stderr[-6000:]
    proc = _launch_resume_driver(stopped, env, "--sigterm-at", "4")
    assert proc.returncode != 0 and proc.stdout.count("interrupted after step 4") == 2, proc.stderr[-6000:]
    ckpt = stopped / "checkpoints" / "step-4"
    saved = json.loads((ckpt / "trainer_state.json").read_text())
    shutil.copy(ckpt / "state.pt", tmp_path / "state.pt")  # the finished run removes its checkpoints
    proc = _launch_resume_driver(stopped, env)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert proc.stdout.count("started at steps [0, 4]") == 2  # both ranks resumed (not started over)

    reference, resumed = _step_losses(whole), _step_losses(stopped)
    assert [s for s, _ in reference] == list(range(1, 11))
    assert resumed == reference  # exact: CPU, fp32, gloo sums in a fixed order
    # One entry per rank in both files, rank 0's also where format-1 readers look, and the ranks'
    # torch states (dropout's generator) really differ by step 4.
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    assert len(saved["rng_ranks"]) == len(state["rng_ranks"]) == 2 and saved["rng_ranks"][0] == saved["rng"]
    assert torch.equal(state["rng_ranks"][0]["torch"], state["rng"]["torch"])
    assert not torch.equal(state["rng_ranks"][0]["torch"], state["rng_ranks"][1]["torch"])


def _engine(rank: int, world: int):
    from types import SimpleNamespace

    return SimpleNamespace(accelerator=SimpleNamespace(process_index=rank), world_size=world, is_main=rank == 0)


def test_each_rank_takes_its_own_rng_states_and_an_old_checkpoint_falls_back_to_rank_0s(tmp_path):
    from oelm.training.rng import rank_rng

    st = {"rng": "json0", "rng_ranks": ["json0", "json1"]}
    tensors = {"rng": "t0", "rng_ranks": ["t0", "t1"]}
    assert [rank_rng(_engine(r, 2), st, tensors, tmp_path) for r in (0, 1)] == [("json0", "t0"), ("json1", "t1")]
    assert rank_rng(_engine(0, 1), {"rng": "json0"}, {"rng": "t0"}, tmp_path) == ("json0", "t0")  # one process
    old_st, old_tensors = {"rng": "json0"}, {"rng": "t0"}  # several processes, before per-rank states
    with pytest.warns(RuntimeWarning, match="RNG states of rank 0 only .* ranks 1-1 resume with rank 0's"):
        assert rank_rng(_engine(0, 2), old_st, old_tensors, tmp_path) == ("json0", "t0")
    assert rank_rng(_engine(1, 2), old_st, old_tensors, tmp_path) == ("json0", "t0")  # rank 0 alone warns


def test_a_checkpoint_of_another_number_of_processes_is_refused():
    from oelm.training.checkpoint import identity_changes

    one = {"learning_rate": 1e-3, "steps_per_epoch": 6}
    two = one | {"gradient_accumulation_steps": 1, "num_processes": 2}
    assert identity_changes(one, dict(one)) == {} and identity_changes(two, dict(two)) == {}
    assert identity_changes(one, two) == {"num_processes": (1, 2)}
    assert identity_changes(two, one) == {"num_processes": (2, 1)}  # the entry left out for its default counts as 1
    assert identity_changes(one | {"gradient_accumulation_steps": 2, "num_processes": 1}, one) == {
        "gradient_accumulation_steps": (2, 1)}
