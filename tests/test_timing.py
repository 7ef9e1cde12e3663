"""Timing must measure each step's own duration, keep data wait out of it, and never stall a GPU.

The original project's timer recorded, at step i, the duration of step i-1 and synchronized the
GPU every step; the tests below use workloads whose steps have known, different durations so
either mistake fails them.
"""

from __future__ import annotations

import json
import os
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from oelm.runtime import timing
from oelm.runtime.environment import capture, capture_environment, matmul_probe, mfu, peak_flops, peaks, probe_drift_percent
from oelm.runtime.timing import PhaseTimer, StepTimer, summarize_step_times

# Sleep never undershoots and overshoots by well under a millisecond on an idle Linux box; leave
# room for a busy one. Every data wait below is longer than this, so a leak into a step shows.
SLACK_MS = 10.0


class FakeClock:
    """A perf_counter that only moves when the test says so: exact arithmetic."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=fake.perf_counter))
    return fake


class FakeCudaEvents:
    """Stands in for torch.cuda.Event: stamps the fake clock on record, logs every read."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.reads: list[tuple[str, object]] = []  # ("synchronize" | "elapsed_time", event)
        self.recorded: list[object] = []

    def install(self, monkeypatch) -> None:
        owner = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing, "timing events need enable_timing=True"
                self.t = None

            def record(self, stream=None) -> None:
                self.t = owner.clock.perf_counter()
                owner.recorded.append(self)

            def query(self) -> bool:
                return True

            def synchronize(self) -> None:
                owner.reads.append(("synchronize", self))

            def elapsed_time(self, end) -> float:
                owner.reads.append(("elapsed_time", self))
                return (end.t - self.t) * 1000.0

        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)


def _run_steps(timer: StepTimer, step_seconds, data_seconds, advance, tokens=None) -> None:
    for i, (step, data) in enumerate(zip(step_seconds, data_seconds)):
        with timer.data_wait():
            advance(data)
        timer.start_step()
        advance(step)
        timer.end_step(tokens=tokens[i] if tokens else 0, samples=1)


# -- summarize_step_times ----------------------------------------------------------------------


def test_summarize_step_times_matches_numpy():
    values = [12.0, 3.0, 7.5, 40.0, 1.0, 9.0, 22.0]
    stats = summarize_step_times(values)
    assert stats["n"] == 7 and isinstance(stats["n"], int)
    assert stats["median"] == pytest.approx(9.0)
    assert stats["mean"] == pytest.approx(np.mean(values))
    assert stats["p10"] == pytest.approx(np.percentile(values, 10))
    assert stats["p90"] == pytest.approx(np.percentile(values, 90))
    # Linear interpolation, by hand: sorted [1, 3, 7.5, 9, 12, 22, 40], rank 0.6 and 5.4.
    assert stats["p10"] == pytest.approx(1.0 + 0.6 * 2.0)
    assert stats["p90"] == pytest.approx(22.0 + 0.4 * 18.0)
    assert all(isinstance(stats[k], float) for k in ("median", "mean", "p10", "p90"))


def test_summarize_step_times_empty():
    assert summarize_step_times([]) == {"median": None, "mean": None, "p10": None, "p90": None, "n": 0}


# -- StepTimer on CPU, real clock --------------------------------------------------------------


def test_each_step_records_its_own_duration_in_order():
    steps_ms = [10, 30, 20, 40, 15]
    data_ms = [25, 45, 30, 35, 25]  # a different pattern, so data leaking into steps shows up
    timer = StepTimer("cpu", warmup_steps=0)
    _run_steps(timer, [s / 1000 for s in steps_ms], [d / 1000 for d in data_ms], time.sleep)

    recorded = timer.step_times_ms
    assert len(recorded) == len(steps_ms)
    for i, (got, want) in enumerate(zip(recorded, steps_ms)):
        assert want - 0.5 <= got < want + SLACK_MS, f"step {i}: recorded {got:.1f} ms, slept {want} ms"
    assert timer.last_step_ms == recorded[-1]

    summary = timer.summary()
    assert summary["data_seconds"] == pytest.approx(sum(data_ms) / 1000, abs=len(data_ms) * SLACK_MS / 1000)
    assert summary["data_seconds"] >= sum(data_ms) / 1000 - 1e-3
    assert summary["train_step_seconds"] == pytest.approx(sum(recorded) / 1000)


def test_data_wait_inside_a_step_is_not_step_time():
    """Bounded by the test's own clock readings around the step and the wait, not by how long a
    sleep took, so a loaded machine (sleeps overshooting) cannot fail it: a wait counted as step
    time would make the step at least the whole span, 30 ms more than allowed here."""
    timer = StepTimer("cpu", warmup_steps=0)
    before = time.perf_counter()
    timer.start_step()
    time.sleep(0.010)
    with timer.data_wait():  # gradient accumulation: the next micro-batch
        time.sleep(0.030)
    time.sleep(0.010)
    timer.end_step(tokens=10)
    span_ms = (time.perf_counter() - before) * 1000
    (got,) = timer.step_times_ms
    assert 20 - 0.5 <= got <= span_ms - 30 + 0.5  # both 10 ms sleeps in it, the >= 30 ms wait not
    assert 0.030 - 1e-3 <= timer.summary()["data_seconds"] <= (span_ms - got) / 1000 + 1e-3


# -- StepTimer arithmetic, fake clock ------------------------------------------------------------


def test_warmup_steps_excluded_from_stats_but_in_total(clock):
    timer = StepTimer("cpu", warmup_steps=2)
    step_s = [0.500, 0.300, 0.010, 0.030, 0.020]
    _run_steps(timer, step_s, [0.0] * 5, clock.advance)
    summary = timer.summary()
    assert timer.step_times_ms == pytest.approx([s * 1000 for s in step_s])
    assert summary["per_step_ms"] == pytest.approx(summarize_step_times([10.0, 30.0, 20.0]))
    assert summary["per_step_ms"]["n"] == 3
    assert summary["train_step_seconds"] == pytest.approx(sum(step_s))
    assert summary["warmup_steps_excluded"] == 2
    assert summary["steps"] == 5


def test_only_warmup_steps_gives_empty_stats(clock):
    timer = StepTimer("cpu", warmup_steps=5)
    _run_steps(timer, [0.1, 0.2], [0.0, 0.0], clock.advance, tokens=[10, 10])
    summary = timer.summary()
    assert summary["per_step_ms"]["n"] == 0 and summary["per_step_ms"]["median"] is None
    assert summary["tokens_per_second"] is None and summary["samples_per_second"] is None
    assert summary["warmup_steps_excluded"] == 2
    assert summary["tokens"] == 20


def test_tokens_per_second_uses_step_plus_data_time_after_warmup(clock):
    timer = StepTimer("cpu", warmup_steps=1)
    # step 0 is warm-up: its 100 tokens and 3 s are in the totals, not in the rates.
    _run_steps(timer, [2.0, 1.5, 0.75], [1.0, 0.5, 0.25], clock.advance, tokens=[100, 300, 200])
    with timer.data_wait():  # a batch fetched after the last step: data time, but no step
        clock.advance(0.125)
    summary = timer.summary()
    assert summary["tokens"] == 600
    assert summary["samples"] == 3
    assert summary["train_step_seconds"] == pytest.approx(4.25)
    assert summary["data_seconds"] == pytest.approx(1.875)
    assert summary["measured_seconds"] == pytest.approx(1.5 + 0.5 + 0.75 + 0.25)
    assert summary["tokens_per_second"] == pytest.approx(500 / 3.0)
    assert summary["samples_per_second"] == pytest.approx(2 / 3.0)
    json.dumps(summary)


# -- StepTimer on CUDA, with fake events -------------------------------------------------------


def test_cuda_path_reads_events_only_at_flush_and_times_each_step(clock, monkeypatch):
    events = FakeCudaEvents(clock)
    events.install(monkeypatch)
    timer = StepTimer("cuda", warmup_steps=0)

    step_s = [0.010, 0.030, 0.020, 0.040]
    _run_steps(timer, step_s, [0.005, 0.025, 0.005, 0.015], clock.advance, tokens=[1, 2, 3, 4])
    # Per-step path: events recorded (2 per data wait, 2 per step), none read, none waited on.
    assert len(events.recorded) == 4 * len(step_s)
    assert events.reads == []
    assert timer.step_times_ms == [] and timer.last_step_ms is None
    assert timer.num_steps == 4

    timer.flush()
    syncs = [event for kind, event in events.reads if kind == "synchronize"]
    assert syncs == [events.recorded[-1]], "flush must wait on the last event only, once"
    assert timer.step_times_ms == pytest.approx([s * 1000 for s in step_s])

    # A step with a data wait inside it: the wait is subtracted from the step.
    timer.start_step()
    clock.advance(0.010)
    with timer.data_wait():
        clock.advance(0.050)
    clock.advance(0.005)
    timer.end_step(tokens=5)
    timer.flush()
    assert timer.last_step_ms == pytest.approx(15.0)
    assert timer.summary()["data_stall_seconds"] == pytest.approx(0.050 + 0.050)


# -- misuse ------------------------------------------------------------------------------------


def test_end_step_without_start_raises():
    timer = StepTimer("cpu")
    with pytest.raises(RuntimeError, match="without a matching start_step"):
        timer.end_step()


def test_double_start_raises():
    timer = StepTimer("cpu")
    timer.start_step()
    with pytest.raises(RuntimeError, match="twice"):
        timer.start_step()
    timer.end_step()  # the open step can still be closed
    assert timer.num_steps == 1


def test_nested_data_wait_raises():
    timer = StepTimer("cpu")
    with pytest.raises(RuntimeError, match="nested"):
        with timer.data_wait():
            with timer.data_wait():
                pass


def test_negative_warmup_rejected():
    with pytest.raises(ValueError):
        StepTimer("cpu", warmup_steps=-1)


# -- PhaseTimer --------------------------------------------------------------------------------


def test_phase_timer_accumulates(clock):
    phases = PhaseTimer("cpu")
    with phases.measure("validation"):
        clock.advance(1.5)
    with phases.measure("checkpoint"):
        clock.advance(0.25)
    with phases.measure("validation"):
        clock.advance(2.0)
    with pytest.raises(KeyError):
        with phases.measure("validation"):
            clock.advance(0.5)
            raise KeyError("boom")
    assert phases.seconds == pytest.approx({"validation": 4.0, "checkpoint": 0.25})
    assert phases.counts == {"validation": 3, "checkpoint": 1}


def test_phase_timer_synchronizes_cuda_at_boundaries(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    phases = PhaseTimer(torch.device("cuda"))
    with phases.measure("epoch"):
        assert len(calls) == 1
    assert len(calls) == 2


# -- environment -------------------------------------------------------------------------------


def test_matmul_probe_positive_gflops():
    result = matmul_probe("cpu", size=128, min_seconds=0.02)
    assert result["gflops"] > 0 and len(result["gflops_windows"]) == 5
    assert result["seconds"] >= 0.02
    assert result["size"] == 128 and result["dtype"] == "float32" and result["device"] == "cpu"
    assert result["gflops"] == pytest.approx(np.median(result["gflops_windows"]))
    slowest = 2 * 128**3 * result["matmuls"] / result["seconds"] / 1e9  # all windows as one mean: between min and max
    assert min(result["gflops_windows"]) <= slowest * (1 + 1e-9) and slowest <= max(result["gflops_windows"]) * (1 + 1e-9)
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        matmul_probe("cpu", size=16, repeats=0)


def test_a_stall_lands_in_one_probe_window_and_the_median_leaves_it_out():
    """A real stall: SIGALRM fires once inside the probe and its handler sleeps 150 ms (the
    process off the CPU, as when the scheduler runs something else). The window it lands in reads
    far slower than the others, and the probe reports the windows' median, not a mean over
    the whole time that would carry the stall."""
    import signal

    def stall(signum, frame):
        time.sleep(0.15)

    previous = signal.signal(signal.SIGALRM, stall)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.12)  # inside the third of five 50 ms windows
        result = matmul_probe("cpu", size=256, min_seconds=0.25)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    windows = result["gflops_windows"]
    # the stall was inside a timed window (which then ended at once: 150 ms is past its 50 ms)
    assert result["seconds"] >= 4 * 0.05 + 0.15
    assert min(windows) < 0.5 * float(np.median(windows))  # 150 ms of nothing in one window
    assert result["gflops"] == pytest.approx(float(np.median(windows))) and result["gflops"] > min(windows)


def test_matmul_probe_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    matmul_probe("cpu", size=32, min_seconds=0.0)
    assert torch.equal(torch.rand(3), expected)


def test_capture_environment_keys_and_json():
    env = capture_environment("cpu", probe=True)
    for key in (
        "timestamp_utc", "python", "platform", "hostname", "packages", "device", "device_type",
        "torch_num_threads", "cpu_count", "cpu_model", "load_average", "memory_total_gib",
        "env", "cuda", "matmul_probe",
    ):
        assert key in env, key
    assert env["device_type"] == "cpu" and env["cuda"] is None
    assert env["packages"]["torch"] is not None and env["packages"]["numpy"] is not None
    assert env["packages"]["oelm"] is not None
    assert set(env["env"]) == {"OMP_NUM_THREADS", "OMP_WAIT_POLICY", "CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE",
                               "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA"}
    assert env["timestamp_utc"].endswith("+00:00")
    assert env["matmul_probe"]["gflops"] > 0
    assert json.loads(json.dumps(env)) == env
    assert capture_environment("cpu", probe=False)["matmul_probe"] is None
    # which CPU generation and which kernels: "AMD EPYC" alone does not tell Zen 1 from Zen 5
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    if Path("/proc/cpuinfo").exists():
        family, model = env["cpu_family_model"].split("/")
        assert family.isdigit() and model.isdigit()


def test_the_record_names_the_instruction_set_caps_a_run_ran_under():
    """A run under ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` (the caps that make an AVX-512
    machine repeat an AVX2 machine's fp32 results bit for bit, docs/reliability.md) records both, and
    PyTorch's kernels really dispatch to AVX2 there: the record tells the two machines' runs apart."""
    import subprocess
    import sys

    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("an x86-64 CPU with AVX2 is needed to cap PyTorch's kernels at AVX2")
    code = ("import json; from oelm.runtime.environment import capture_environment; "
            "e = capture_environment('cpu', probe=False); print(json.dumps([e['cpu_capability'], e['env']]))")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    env.pop("MKL_ENABLE_INSTRUCTIONS", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    capability, recorded = json.loads(out.stdout.strip().splitlines()[-1])
    assert capability == "AVX2"
    assert (recorded["ATEN_CPU_CAPABILITY"], recorded["ONEDNN_MAX_CPU_ISA"], recorded["MKL_ENABLE_INSTRUCTIONS"]) == (
        "avx2", "AVX2", None)


def test_oelm_speed_probe_turns_the_probes_around_each_run_on_or_off(monkeypatch, tmp_path, data_dir, capsys):
    """$OELM_SPEED_PROBE: unset or 1, a run records both probes and their drift; 0, none of them
    (and nothing else of its record changes kind); another value is one line before any folder."""
    from _tiny_matrix import ONE_RUN, write_config
    from oelm.cli import main
    from oelm.runtime.environment import run_probes_wanted

    config = write_config(tmp_path, ONE_RUN)
    envs = {}
    for value in ("1", "0"):
        monkeypatch.setenv("OELM_SPEED_PROBE", value)
        assert main(["run", str(config), "--output-dir", str(tmp_path / value)]) == 0
        envs[value] = json.loads((tmp_path / value / "runs" / "baseline-seed0" / "result.json").read_text())["environment"]
    assert envs["1"]["matmul_probe"]["gflops"] > 0 and envs["1"]["matmul_probe_after"]["gflops"] > 0
    assert envs["1"]["matmul_probe_drift_percent"] is not None
    assert [envs["0"][k] for k in ("matmul_probe", "matmul_probe_after", "matmul_probe_drift_percent")] == [None] * 3
    assert set(envs["0"]) == set(envs["1"]) and envs["0"]["packages"] == envs["1"]["packages"]
    monkeypatch.delenv("OELM_SPEED_PROBE")
    assert run_probes_wanted()  # the default: probes on
    monkeypatch.setenv("OELM_SPEED_PROBE", "yes")
    capsys.readouterr()
    assert main(["run", str(config), "--output-dir", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "OELM_SPEED_PROBE='yes'" in err[0] and "use 1" in err[0], err
    assert not (tmp_path / "bad").exists()


def test_probe_drift_percent():
    assert probe_drift_percent(100.0, 90.0) == pytest.approx(-10.0)
    assert probe_drift_percent(50.0, 55.0) == pytest.approx(10.0)


def test_mfu_arithmetic():
    # 6 * 124M params per token at 100k tokens/s on an H100 SXM.
    assert mfu(6 * 124e6, 1e5, 989e12) == pytest.approx(6 * 124e6 * 1e5 / 989e12)
    assert mfu(1e9, 1e3, 1e12) == pytest.approx(1.0)
    assert mfu(1e9, 1e3, None) is None


def test_peak_flops_cpu_is_none_and_known_gpus():
    assert peak_flops("cpu") is None
    assert peak_flops(torch.device("cpu")) is None
    by_name = peaks._peak_flops_for_name
    assert by_name("NVIDIA H100 80GB HBM3") == 989e12
    assert by_name("NVIDIA H100 PCIe") == 756e12
    assert by_name("NVIDIA H100 NVL") == 835e12
    assert by_name("NVIDIA H200") == 989e12
    assert by_name("NVIDIA A100-SXM4-80GB") == 312e12
    assert by_name("NVIDIA A100 80GB PCIe") == 312e12
    assert by_name("NVIDIA A10") is None
    assert by_name("NVIDIA H20") is None
    assert by_name("NVIDIA H100 80GB HBM3 MIG 1g.10gb") is None


def test_oelm_version_is_recorded_when_it_is_not_installed(monkeypatch):
    """oelm run from a source tree on PYTHONPATH has no distribution metadata (the GPU machine's
    runs recorded ``oelm: null``): the version comes from ``oelm.__version__`` instead."""
    import importlib.metadata

    import oelm

    real = importlib.metadata.version

    def no_oelm(name):
        if name == "oelm":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", no_oelm)
    assert capture._package_version("oelm") == oelm.__version__
    assert capture._package_version("no-such-package-here") is None
