"""The CUDA subset: what only a GPU can show, in about a minute (part ``speed`` of scripts/gpu_check.sh
runs this file first). Every test skips where torch sees no CUDA GPU, so on CPU-only CI the file
costs nothing; the checks themselves are the GPU paths the rest of the suite reaches only through
stand-ins (tests/test_timing.py's fake events, tests/test_telemetry.py's fake NVML):

* the engine's step on CUDA in bf16: frozen Q/K byte-identical after AdamW, finite losses, the
  allocator's peak memory recorded;
* CUDA graphs (``torch.compile`` mode ``reduce-overhead``) give the eager losses;
* CUDA events time a kernel of known length (``torch.cuda._sleep``) as longer than a shorter one;
* a real ``oelm run`` on TinyStories: pinned batches, the GPU's NVML telemetry and MFU against the
  card's datasheet peak in ``result.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from _tiny_lm import tiny_lm_overrides

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (part speed of scripts/gpu_check.sh)")


def _bench(**knobs) -> dict:
    from oelm.bench import BenchConfig, run_bench

    return run_bench(BenchConfig(model="dispatch-proxy", device="cuda", steps=4, warmup_steps=2, data="random",
                                 profile=False, **knobs), progress=False)


def test_engine_step_in_bf16_keeps_frozen_weights_and_records_memory():
    result = _bench(precision="bf16")
    for name, r in result["runners"].items():
        assert r["frozen_bit_identical"], f"{name}: a frozen tensor changed on CUDA"
        assert r["final_loss"] is not None and torch.isfinite(torch.tensor(r["final_loss"])), name
        assert r["peak_step_memory_mib"] is not None and r["peak_step_memory_mib"] > 0, name
    assert result["runners"]["oelm_freeze"]["frozen_tensors"] > 0
    assert not result["grad_nonfinite"] and result["device"].startswith("cuda")


def test_cuda_graphs_give_the_eager_losses():
    eager = _bench(precision="fp32")
    graphs = _bench(precision="fp32", compile_mode="reduce-overhead")
    for name in ("baseline", "oelm_freeze"):
        a, b = eager["runners"][name]["final_loss"], graphs["runners"][name]["final_loss"]
        assert abs(a - b) <= 1e-3 * max(1.0, abs(a)), f"{name}: eager {a} vs reduce-overhead {b}"
        assert graphs["runners"][name]["frozen_bit_identical"]


def test_cuda_events_time_kernels_of_known_length():
    from oelm.runtime.timing import StepTimer

    timer = StepTimer("cuda", warmup_steps=0)
    for cycles in (1_000_000, 20_000_000):  # ~0.5 ms and ~10 ms at ~2 GHz
        timer.start_step()
        torch.cuda._sleep(cycles)
        timer.end_step(tokens=1)
    timer.flush()
    short, long = timer.step_times_ms
    assert 0 < short < long and long > 3.0, timer.step_times_ms


def test_a_run_on_cuda_records_gpu_telemetry_and_a_datasheet_mfu(tmp_path):
    from oelm.cli import main

    out = tmp_path / "run"
    overrides = [*tiny_lm_overrides(max_steps=12, eval_every=6), "seeds=[0]", "training.mixed_precision=bf16"]
    assert main(["run", str(ROOT / "configs" / "tinystories-tiny.yaml"), "--output-dir", str(out), *overrides]) == 0
    results = sorted(out.glob("runs/*/result.json"))
    assert len(results) == 2
    for path in results:
        timing = json.loads(path.read_text())["timing"]
        assert timing["gpu_telemetry"]["available"], timing["gpu_telemetry"]
        name = torch.cuda.get_device_name(0)
        source = timing["mfu"]["peak_source"]
        # a card in the datasheet table (H100, H200, A100, ...) is divided by its datasheet peak
        assert source.startswith("datasheet:") or source == "measured-probe", (name, source)
        assert timing["num_workers"] >= 0 and timing["per_step_ms"]["median"] > 0
