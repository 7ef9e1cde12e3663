"""`make gpu-check` (scripts/gpu_check.sh + scripts/gpu_summary.py), checked without a GPU: it
stops with one clear line when torch sees no CUDA GPU; with a stand-in python whose every step
fails it still runs every step, records each exit status and writes SUMMARY.md; the summary
copies the numbers of result.json / bench JSON files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _gpu_check_fakes import fake_gpu_python as _fake_gpu_python

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
STEPS = ["env", "nvidia-smi", "pytest-cuda", "bench-gpt2-124m", "bench-gpt2-124m-compile", "bench-gpt2-124m-reduce-overhead",
         "bench-minilm", "bench-minilm-reduce-overhead", "bench-proxy", "bench-proxy-reduce-overhead", "tinystories",
         "tinystories-reduce-overhead", "imdb", "bench-compile", "bench-nocompile", "bench-bert-base", "bench-bert-base-compile",
         "sst2", "sst2-reduce-overhead"]
SPEED = STEPS[:STEPS.index("imdb")]  # issue 33's part speed, in its priority order
SCALE = ["env", "nvidia-smi", "imdb"]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _run(env: dict[str, str], timeout: int = 120, part: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *([part] if part else [])], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=timeout, cwd=ROOT)


def test_script_syntax():
    out = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the check would really run")
def test_cpu_torch_stops_with_one_clear_line(tmp_path):
    out_dir = tmp_path / "out"
    res = _run({"PYTHON": sys.executable, "OUT": str(out_dir)})
    assert res.returncode == 3, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-check: no CUDA GPU: torch.cuda.is_available() is False")
    assert "index-url https://download.pytorch.org/whl/" in lines[0]  # how to get a CUDA torch
    assert not out_dir.exists()  # nothing written


def test_torch_that_does_not_import_stops_with_one_clear_line(tmp_path):
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('libcudart.so.12: cannot open shared object file')\n")
    res = _run({"PYTHON": sys.executable, "PYTHONPATH": str(fake.parent), "OUT": str(tmp_path / "out")})
    assert res.returncode == 3
    assert res.stderr.startswith("gpu-check: no CUDA GPU: torch does not import (ImportError: libcudart.so.12")


def test_every_step_runs_and_failures_are_recorded(tmp_path):
    """A stand-in python says a GPU is there, then fails every oelm/pytest step with status 7;
    nvidia-smi (a stand-in too) succeeds. The real python writes the summary."""
    bin_dir = tmp_path / "bin"
    fake_python = _fake_gpu_python(bin_dir, 'echo "fake python: $* (OELM_TEST_DEVICE=${OELM_TEST_DEVICE:-})"\nexit 7')
    out_dir = tmp_path / "out"
    res = _run({"PYTHON": str(fake_python), "OUT": str(out_dir), "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert res.returncode == 1, res.stdout + res.stderr
    rows = [line.split("\t") for line in (out_dir / "steps.tsv").read_text().splitlines()[1:]]
    assert [r[0] for r in rows] == STEPS
    assert {r[0]: r[1] for r in rows} == {s: ("0" if s == "nvidia-smi" else "7") for s in STEPS}
    assert (out_dir / "nvidia-smi.txt").read_text().startswith("fake nvidia-smi")
    logs = {s: (out_dir / "logs" / f"{s}.log").read_text() for s in STEPS}
    assert "bench --model gpt-medium-512 --precision bf16 --device cuda --compile --no-progress --json" in logs["bench-compile"]
    assert f"{out_dir}/bench-gpt-medium-512-bf16-nocompile.json" in logs["bench-nocompile"] and "--no-compile" in logs["bench-nocompile"]
    assert "run configs/tinystories-tiny.yaml" in logs["tinystories"] and "training.max_steps=200" in logs["tinystories"]
    assert "run configs/quickstart.yaml" in logs["sst2"] and "training.mixed_precision=bf16" in logs["sst2"]
    assert "bench --model dispatch-proxy --precision fp32 --device cuda --no-compile --no-progress --json" in logs["bench-proxy"]
    assert "--compile-mode reduce-overhead" in logs["bench-proxy-reduce-overhead"]
    assert f"{out_dir}/bench-gpt2-124m-bf16-reduce-overhead.json" in logs["bench-gpt2-124m-reduce-overhead"]
    assert "--model gpt2-124m --precision bf16 --device cuda --compile --no-progress --json" in logs["bench-gpt2-124m-compile"]
    assert all("--batch-size 16" in logs[s] for s in STEPS if s.startswith("bench-gpt2-124m"))  # fixed: no batch search
    assert "--model minilm-cls --precision bf16 --device cuda --no-compile" in logs["bench-minilm"]
    assert "--model minilm-cls" in logs["bench-minilm-reduce-overhead"] and "--compile-mode reduce-overhead" in logs["bench-minilm-reduce-overhead"]
    assert (f"scripts/gpu_lanes.py scripts/gpu_scale_imdb.yaml --output-dir {out_dir}/imdb --lanes auto"
            in logs["imdb"])
    assert "--model bert-base-cls --precision bf16 --device cuda --no-compile" in logs["bench-bert-base"]
    for name, config in (("tinystories", "tinystories-tiny"), ("sst2", "quickstart")):
        log = logs[f"{name}-reduce-overhead"]
        assert f"run configs/{config}.yaml --output-dir {out_dir}/{name}-reduce-overhead" in log
        assert "training.compile=reduce-overhead" in log and "seeds=[0]" in log
        assert "reduce-overhead" not in logs[name]  # the eager single run stays eager
    pytest_log = (out_dir / "pytest-cuda.log").read_text()
    assert "-m pytest -q -p no:cacheprovider tests/test_cuda.py (OELM_TEST_DEVICE=cuda)" in pytest_log
    summary = (out_dir / "SUMMARY.md").read_text()
    assert summary.count("**FAILED** (exit 7)") == len(STEPS) - 1 and "| nvidia-smi | ok |" in summary


def _write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_summary_copies_the_numbers(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_summary
    finally:
        sys.path.pop(0)
    (tmp_path / "steps.tsv").write_text("step\texit_status\tseconds\tlog\nsst2\t0\t95\tlogs/sst2.log\n")
    _write(tmp_path / "env.json", {"packages": {"torch": "2.13.0+cu128"}, "cuda": {"name": "NVIDIA H100 80GB HBM3", "driver_version": "570.1"}})
    runner = {"per_step_ms": {"median": 16.31, "p10": 14.12, "p90": 20.88}, "tokens_per_second": 247088.2,
              "mfu": {"mfu": 0.0717}, "peak_step_memory_mib": 1747.1, "compile_seconds": 3.25, "frozen_bit_identical": True}
    _write(tmp_path / "bench-gpt-medium-512-bf16-compile.json", {
        "tokens_per_second": 81234.5, "per_step_ms": {"median": 50.25}, "runners": {"baseline": runner},
        "ratios": {"oelm_freeze": {"median": 0.902, "p10": 0.8226, "p90": 1.0836, "n": 50, "theory": 0.978}},
        "engine_plain": {"median": 1.049, "p10": 0.6956, "p90": 1.7013, "n": 300, "best": 1.0394, "ci95": [1.0312, 1.0688],
                         "target": 1.03, "verdict": "misses"},
        "operators": {"engine": 1362, "plain": 1352, "extra": {"aten::div": 2, "aten::to": 2}, "fewer": {}}})
    telemetry = {"available": True, "gpu_utilization_percent": {"min": 3, "median": 96.5, "max": 100},
                 "memory_used_gib": {"min": 1.0, "median": 9.0, "max": 11.25}, "power_w": {"min": 90, "median": 512.4, "max": 690},
                 "temperature_c": {"min": 40, "median": 60, "max": 71}, "sm_clock_mhz": {"min": 1400, "median": 1980, "max": 1980}}
    _write(tmp_path / "sst2" / "runs" / "baseline-seed0" / "result.json", {
        "status": "finished", "performance": {"metric": "accuracy", "best_validation": 84.5},
        "timing": {"tokens_per_second": 250123.4, "per_step_ms": {"median": 11.37}, "mfu": {"mfu": 0.0312}, "gpu_telemetry": telemetry}})
    _write(tmp_path / "sst2" / "runs" / "oelm_freeze-seed0" / "result.json", {
        "status": "failed", "timing": {"gpu_telemetry": {"available": False, "reason": "pynvml is not importable"}}})
    assert gpu_summary.main([str(tmp_path)]) == 0
    text = (tmp_path / "SUMMARY.md").read_text()
    assert "| sst2 | ok | 95 |" in text and "NVIDIA H100 80GB HBM3 (driver 570.1" in text
    assert "| tokens_per_second | 81,234.500 |" in text and "| per_step_ms | median 50.250 |" in text
    assert "| baseline | 16.31 | 14.12 | 20.88 | 247,088 | 7.2% | 1,747 | 3.2 | True |" in text
    assert ("oelm_freeze / baseline step time: median 0.902 of 50 interleaved per-step ratios "
            "(p10 0.823, p90 1.084); FLOP theory 0.978") in text
    assert ("engine / plain loop (same math): median 1.049 of 300 per-step ratios (p10 0.696, p90 1.701; best steps 1.039); "
            "95% CI 1.031-1.069: misses <= 1.03") in text
    assert "operators per step: engine 1362, plain 1352; engine extra: aten::div +2, aten::to +2" in text
    assert ("| sst2 | baseline-seed0 | finished | accuracy 84.500 | – | 250,123 | 11.37 | 3.1% | 96 | 11.25 | 512 | 71 | 1,980 |") in text
    assert "| sst2 | oelm_freeze-seed0 | failed |" in text and "n/a (pynvml is not importable)" in text


def test_summary_shows_a_matrix_beside_the_published_figures_and_its_lanes(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_summary
    finally:
        sys.path.pop(0)
    test = {"mean": 84.1234, "ci95": [83.0, 85.25], "n": 3}
    _write(tmp_path / "imdb" / "comparison.json", {
        "model": "oelm-gpt-medium-512", "metric": "accuracy", "reference": {"baseline": 78.56, "oelm_freeze": 85.7},
        "execution": {"timing_grade": False}, "warnings": ["runs overlapped: step times are not speed evidence"],
        "methods": {"baseline": {"seeds": [0, 1, 2], "test": test, "best_validation": {"mean": 84.5}},
                    "oelm_random": {"seeds": [0, 1, 2], "test": {"mean": None, "ci95": None, "n": 0}}}})
    _write(tmp_path / "imdb" / "lanes.json", {"lanes": 3, "measurement": {"predictions": [
        {"lanes": 1, "steps_per_s": 40.0}, {"lanes": 3, "steps_per_s": 95.5}]},
        "runs": [{"name": "baseline-seed0", "exit_status": 0, "seconds": 61.2}]})
    text = "\n".join(gpu_summary.matrix_lines(tmp_path))
    assert "**imdb** (oelm-gpt-medium-512, accuracy; timing-grade: False)" in text
    assert "| baseline | 84.12 | 83.00-85.25 | 3 of 3 | 84.50 | 78.56 |" in text
    assert "| oelm_random | – | – | 0 of 3 | – | – |" in text
    assert "Runs side by side: 3 lane(s) (measured: 1 lane(s) 40.00 steps/s; 3 lane(s) 95.50 steps/s); baseline-seed0 exit 0 in 61 s" in text
    assert "Warning: runs overlapped" in text


def test_the_steps_list_is_the_scripts():
    text = SCRIPT.read_text()
    listed = text.split("ALL_STEPS=(", 1)[1].split(")", 1)[0].split()
    called = [line.split()[1] for line in text.splitlines() if line.startswith("step ")]
    assert listed == called == STEPS
    assert text.split("SPEED_STEPS=(", 1)[1].split(")", 1)[0].split() == SPEED
    assert text.split("SCALE_STEPS=(", 1)[1].split(")", 1)[0].split() == SCALE


@pytest.mark.parametrize("part, expected", [("speed", SPEED), ("scale", SCALE)])
def test_a_part_runs_its_steps_in_priority_order(tmp_path, part, expected):
    fake = _fake_gpu_python(tmp_path / "bin", "echo ran; exit 0")
    out_dir = tmp_path / "out"
    res = _run({"PYTHON": str(fake), "OUT": str(out_dir), "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}, part=part)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [line.split("\t") for line in (out_dir / "steps.tsv").read_text().splitlines()[1:]]
    assert [r[0] for r in rows] == expected and all(r[1] == "0" for r in rows)
    assert f"gpu-check: {part} on Fake GPU 80GB HBM3" in res.stdout


@pytest.mark.parametrize("env, part, message", [
    ({}, "fast", "gpu-check: unknown part 'fast'; use speed, scale or all"),
    ({"GPU_CHECK_DEADLINE": "5"}, None, "GPU_CHECK_DEADLINE=5 is not a Unix time between 2020 and 2100"),
    ({"GPU_CHECK_DEADLINE": "99999999999999999999"}, None, "GPU_CHECK_DEADLINE=99999999999999999999 is out of range"),
    ({"GPU_CHECK_STEP_TIMEOUT": "100000"}, None, "GPU_CHECK_STEP_TIMEOUT=100000 is over a day (86400 s)"),
    ({"GPU_CHECK_STEP_TIMEOUT": "-5"}, None, "GPU_CHECK_STEP_TIMEOUT must be a whole number of seconds, got '-5'"),
    ({"GPU_CHECK_DRY_RUN": "yes"}, None, "GPU_CHECK_DRY_RUN must be 0 or 1, got 'yes'"),
])
def test_hostile_settings_are_refused_in_one_line_before_anything_runs(tmp_path, env, part, message):
    fake = _fake_gpu_python(tmp_path / "bin", "exit 0")
    res = _run({"PYTHON": str(fake), "OUT": str(tmp_path / "out"), **env}, part=part)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and message in res.stderr, res.stderr
    assert not (tmp_path / "out").exists()


def test_selected_steps_only_in_the_scripts_order(tmp_path):
    fake = _fake_gpu_python(tmp_path / "bin", "echo ran; exit 0")
    out_dir = tmp_path / "out"
    res = _run({"PYTHON": str(fake), "OUT": str(out_dir), "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
                "GPU_CHECK_STEPS": "sst2 bench-proxy env"})
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [line.split("\t") for line in (out_dir / "steps.tsv").read_text().splitlines()[1:]]
    assert [r[0] for r in rows] == ["env", "bench-proxy", "sst2"] and all(r[1] == "0" for r in rows)
    assert not (out_dir / "logs" / "pytest-cuda.log").exists()


def test_an_unknown_step_is_refused_before_anything_runs(tmp_path):
    fake = _fake_gpu_python(tmp_path / "bin", "exit 0")
    res = _run({"PYTHON": str(fake), "OUT": str(tmp_path / "out"), "GPU_CHECK_STEPS": "env bench-gpt3"})
    assert res.returncode == 2
    assert res.stderr.startswith("gpu-check: GPU_CHECK_STEPS names an unknown step 'bench-gpt3'; the steps are: env nvidia-smi")
    assert not (tmp_path / "out").exists()
    res = _run({"PYTHON": str(fake), "OUT": str(tmp_path / "out"), "GPU_CHECK_DEADLINE": "soon"})
    assert res.returncode == 2 and "GPU_CHECK_DEADLINE must be a whole number of seconds, got 'soon'" in res.stderr


def test_a_step_past_its_time_is_stopped_and_the_rest_skipped(tmp_path):
    """Every oelm call sleeps 60 s: with 6 s left the first such step is stopped (exit 124) and the
    ones after the deadline are recorded as skipped; the summary says so."""
    fake = _fake_gpu_python(tmp_path / "bin", "sleep 60")
    out_dir = tmp_path / "out"
    start = time.monotonic()
    res = _run({"PYTHON": str(fake), "OUT": str(out_dir), "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
                "GPU_CHECK_STEPS": "nvidia-smi bench-proxy sst2 tinystories",
                "GPU_CHECK_DEADLINE": str(int(time.time()) + 6)})
    assert time.monotonic() - start < 40, "the sleeping step was not stopped at the deadline"
    assert res.returncode == 1
    rows = {r[0]: r[1] for r in (line.split("\t") for line in (out_dir / "steps.tsv").read_text().splitlines()[1:])}
    assert rows == {"nvidia-smi": "0", "bench-proxy": "124", "sst2": "skipped", "tinystories": "skipped"}
    assert "stopped after its" in (out_dir / "logs" / "bench-proxy.log").read_text()
    summary = (out_dir / "SUMMARY.md").read_text()
    assert "| bench-proxy | **FAILED** (exit 124: time limit) |" in summary and "| sst2 | skipped (time limit) | – | – |" in summary


def test_a_step_timeout_bounds_each_step(tmp_path):
    fake = _fake_gpu_python(tmp_path / "bin", 'if [[ "$*" == *dispatch-proxy* ]]; then sleep 60; fi; exit 0')
    out_dir = tmp_path / "out"
    res = _run({"PYTHON": str(fake), "OUT": str(out_dir), "GPU_CHECK_STEPS": "bench-proxy env", "GPU_CHECK_STEP_TIMEOUT": "2"})
    rows = {r[0]: r[1] for r in (line.split("\t") for line in (out_dir / "steps.tsv").read_text().splitlines()[1:])}
    assert rows == {"env": "0", "bench-proxy": "124"} and res.returncode == 1
