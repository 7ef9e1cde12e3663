"""DDP: ``torchrun --nproc_per_node=2`` on CPU (gloo) trains an OELM model without
``find_unused_parameters``; ranks end with identical parameters, frozen tensors bit-identical.

The worker is examples/ddp_train.py (real SST-2 sentences, real tokenizers, DistributedSampler);
it does the cross-rank comparison itself (all-gathered sha256 per parameter) and writes a JSON
summary, which this test reads. Each run starts three Python processes: ~30 s on 2 busy cores.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import oelm
from oelm.checkpoint import tensor_sha256

WORKER = Path(__file__).resolve().parents[1] / "examples" / "ddp_train.py"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torchrun(tmp_path: Path, data_dir: Path, *args: str) -> dict:
    src = str(Path(oelm.__file__).resolve().parents[1])
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        OMP_NUM_THREADS="1",  # the workers must also run with OpenMP limited to one thread
        OMP_WAIT_POLICY="PASSIVE",
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        OELM_DATA_DIR=str(data_dir),
    )
    summary = tmp_path / "summary.json"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
        str(WORKER), "--summary", str(summary), *args,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"torchrun exited with {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(summary.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("model", ["bert", "gpt"])
def test_ddp_two_ranks_stay_in_sync_with_frozen_qk(tmp_path, data_dir, model):
    ckpt = tmp_path / "ckpt"
    s = run_torchrun(tmp_path, data_dir, "--model", model, "--method", "oelm_freeze", "--steps", "10",
                     "--train-size", "320", "--save-dir", str(ckpt))

    assert s["ok"] and s["failures"] == []  # ranks identical, frozen unchanged, trainable changed, disjoint shards
    assert s["world_size"] == 2 and s["backend"] == "gloo" and s["find_unused_parameters"] is False
    assert s["steps"] == 10 and len(s["losses"]) == 10 and all(math.isfinite(x) for x in s["losses"])
    assert s["examples_per_rank"] == [160, 160] and s["unk_share"] < 0.05
    assert len(s["frozen_tensors"]) == 2 * 4  # 2 layers x (Q, K) x (weight, bias)

    # The lean checkpoint rank 0 saved from the DDP-wrapped model reloads onto a fresh base to
    # exactly the parameters every rank ended with.
    spec = importlib.util.spec_from_file_location("ddp_train", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    base, _ = worker.build_model_and_tokenizer(model, 0, str(data_dir))
    loaded = oelm.load_oelm(ckpt, base_model=base)
    assert {n: tensor_sha256(p) for n, p in loaded.named_parameters()} == s["final_sha256"]
