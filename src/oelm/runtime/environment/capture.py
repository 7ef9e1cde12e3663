"""What machine a run ran on and how fast it was at the time (:mod:`oelm.runtime.environment`).

Timings are only comparable between runs taken on the same, otherwise idle, machine. So every
run records :func:`capture_environment` (software versions, CPU/GPU, load average, memory,
thread settings, GPU occupancy) and a short :func:`matmul_probe` (achieved GFLOP/s of a dense
matmul). Probing before and after an experiment and comparing with :func:`probe_drift_percent`
shows whether the machine's speed changed under the runs (another job, thermal throttling).
What that speed means for MFU is :mod:`oelm.runtime.environment.peaks`.
"""

from __future__ import annotations

import datetime as _dt
import functools
import importlib.metadata
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time

import torch

from oelm._version import __version__
from oelm.runtime.timing import cuda_synchronize_if_needed

__all__ = ["SPEED_PROBE_ENV", "capture_environment", "cpu_model", "matmul_probe", "probe_drift_percent", "run_probes_wanted"]

#: Environment variable: ``0`` turns off the matmul probes ``oelm run`` takes before and after each run.
SPEED_PROBE_ENV = "OELM_SPEED_PROBE"

# Distributions whose versions change results or speed.
_PACKAGES = ("torch", "transformers", "accelerate", "datasets", "tokenizers", "numpy", "pydantic", "oelm")
# Environment variables that change speed or behaviour. The last three cap the vector instruction set
# of PyTorch's own CPU kernels, MKL's and oneDNN's, which decide the last bits of fp32 results
# (docs/reliability.md, "Determinism": with PyTorch's and oneDNN's at AVX2 an AVX-512 machine repeats an
# AVX2 machine's AG News and IMDB runs bit for bit; with either alone it does not).
_ENV_VARS = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE",
             "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


# -- speed probe -------------------------------------------------------------------------------


def matmul_probe(
    device: torch.device | str = "cpu",
    size: int = 1024,
    dtype: torch.dtype = torch.float32,
    min_seconds: float = 0.2,
    repeats: int = 5,
) -> dict:
    """Achieved dense matmul throughput (GFLOP/s) of ``size x size`` matrices on ``device``: the
    median of ``repeats`` timed windows.

    One ``size x size`` by ``size x size`` matmul counts ``2 * size**3`` FLOPs. After one
    warm-up matmul, each window repeats matmuls until ``min_seconds / repeats`` of wall time has
    passed; on CUDA they are issued in doubling batches with a synchronize after each batch,
    so launch and sync overhead stay small. A stall confined to one window (the scheduler handing
    the core to another process for a moment, a cold thread pool in the first window) does not
    move the median of the windows' rates, where one mean over the whole time read a 50 ms stall
    in a 0.2 s probe as a 20% slower machine. Load that lasts the whole probe still shows, as it
    should. Inputs come from a private generator: the global RNG state (and with it a run's
    seeding) is untouched. About 0.2-0.5 s on a small CPU.

    Returns:
        ``{"gflops": median GFLOP/s, "gflops_windows": [GFLOP/s of each window], "size": n,
        "dtype": "float32", "device": "cpu", "seconds": timed wall seconds (all windows),
        "matmuls": count (all windows)}``.

    Raises:
        ValueError: ``repeats`` below 1.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    device = torch.device(device)
    generator = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    torch.matmul(a, b, out=out)  # warm-up: kernel selection, allocator, thread pool start
    cuda_synchronize_if_needed(device)

    windows: list[tuple[int, float]] = []  # (matmuls, seconds) per window
    for _ in range(repeats):
        batch, count = 1, 0
        start = time.perf_counter()
        while True:
            for _ in range(batch):
                torch.matmul(a, b, out=out)
            cuda_synchronize_if_needed(device)
            count += batch
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds / repeats:
                break
            if device.type != "cpu":
                batch *= 2  # asynchronous devices: amortize the synchronize
        windows.append((count, elapsed))
    rates = [2.0 * size**3 * count / seconds / 1e9 for count, seconds in windows]
    return {
        "gflops": statistics.median(rates),
        "gflops_windows": rates,
        "size": int(size),
        "dtype": str(dtype).removeprefix("torch."),
        "device": str(device),
        "seconds": sum(seconds for _, seconds in windows),
        "matmuls": sum(count for count, _ in windows),
    }


def run_probes_wanted() -> bool:
    """Whether ``oelm run`` probes the matmul speed before and after each run: ``$OELM_SPEED_PROBE``
    unset or ``1`` (the default) yes, ``0`` no.

    Without the probes a run's ``environment.matmul_probe``, ``matmul_probe_after`` and
    ``matmul_probe_drift_percent`` are None, so the report has no machine-speed drift to warn about;
    nothing else changes (CPU MFU divides by the peak measured once per machine, not by these).
    Two probes are ~0.4 s of every run on a small CPU, most of a run of a few steps of a tiny
    model: the test suite turns them off (tests/conftest.py) except where it checks them.

    Raises:
        ConfigError: any other value, in one line naming the variable and the two it takes.
    """
    from oelm.errors import env_switch

    return env_switch(SPEED_PROBE_ENV, "probe the matmul speed before and after each run, the default",
                      "no probes: no drift check")


def probe_drift_percent(before_gflops: float, after_gflops: float) -> float:
    """Relative change of probe throughput in percent: ``(after - before) / before * 100``.

    Negative means the machine got slower between the two probes.
    """
    if before_gflops <= 0:
        raise ValueError(f"before_gflops must be positive, got {before_gflops}")
    return (after_gflops - before_gflops) / before_gflops * 100.0


# -- environment capture -----------------------------------------------------------------------


@functools.lru_cache(maxsize=None)  # read once per process: a run captures the environment twice
def _package_version(name: str) -> str | None:
    """The installed distribution's version; for oelm run from a source tree on ``PYTHONPATH``
    (not installed, as on a machine without its venv) the version its ``__init__`` declares."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        if name == "oelm":
            return __version__
        return None


def cpu_model() -> str | None:
    """The processor's name: ``model name`` of /proc/cpuinfo, else ``platform.processor()``; None
    when neither says (recorded by :func:`capture_environment`, part of a measured peak's cache key)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _cpu_family_model() -> str | None:
    """``"<cpu family>/<model>"`` from /proc/cpuinfo (e.g. ``"26/2"``: AMD Zen 5; ``"23/1"``: Zen 1),
    which tells CPU generations apart where ``model name`` is only ``"AMD EPYC"`` (virtual machines);
    None where /proc/cpuinfo is absent."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        return None
    if "cpu family" not in fields or "model" not in fields:
        return None
    return f"{fields['cpu family']}/{fields['model']}"


def _cpu_capability() -> str | None:
    """The vector instruction set PyTorch's CPU kernels dispatch to (``"AVX2"``, ``"AVX512"``,
    ...; ``torch.backends.cpu.get_cpu_capability``): fp32 kernels, and so speed and the last bits
    of results, differ between them."""
    try:
        return torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):
        return None


def _memory_total_gib() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (AttributeError, ValueError, OSError):
        return None


def _load_average() -> dict | None:
    try:
        one, five, fifteen = os.getloadavg()
    except (AttributeError, OSError):
        return None
    return {"1min": one, "5min": five, "15min": fifteen}


def _cpu_affinity_count() -> int | None:
    try:
        return len(os.sched_getaffinity(0))  # what this process may use (containers, taskset)
    except (AttributeError, OSError):
        return None


def _nvidia_smi() -> dict | None:
    """Driver version and per-GPU occupancy from ``nvidia-smi``, or None when unavailable.

    ``gpus`` lists the *physical* GPUs (nvidia-smi ignores CUDA_VISIBLE_DEVICES); memory in use
    and utilization at capture time show whether someone else is using a GPU.
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    fields = "index,uuid,name,driver_version,utilization.gpu,memory.used,memory.total"
    try:
        result = subprocess.run(
            [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=15, check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = []
    for line in result.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 7:
            continue
        index, uuid, name, driver, util, used, total = parts

        def number(text: str) -> float | None:
            try:
                return float(text)
            except ValueError:  # "[N/A]", "[Not Supported]"
                return None

        gpus.append({
            "index": int(index) if index.isdigit() else index,
            "uuid": uuid,
            "name": name,
            "driver_version": driver,
            "utilization_percent": number(util),
            "memory_used_mib": number(used),
            "memory_total_mib": number(total),
        })
    driver = gpus[0]["driver_version"] if gpus else None
    return {"driver_version": driver, "gpus": gpus}


def _cuda_info() -> dict:
    devices = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        devices.append({
            "index": i,
            "name": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "total_memory_gib": props.total_memory / 2**30,
            "multiprocessors": props.multi_processor_count,
        })
    smi = _nvidia_smi()
    return {
        "device_count": len(devices),
        "devices": devices,
        "name": devices[0]["name"] if devices else None,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "driver_version": smi["driver_version"] if smi else None,
        "nvidia_smi_gpus": smi["gpus"] if smi else None,
    }


def capture_environment(device: torch.device | str = "cpu", probe: bool = True) -> dict:
    """A JSON-serializable record of the software and hardware a run uses.

    Keys: ``timestamp_utc`` (ISO 8601), ``python``, ``platform``, ``hostname``, ``packages``
    (distribution -> version or None), ``device``, ``device_type``, ``torch_num_threads``,
    ``cpu_count`` (logical CPUs of the machine), ``cpu_affinity_count`` (CPUs this process may
    run on), ``cpu_model``, ``cpu_family_model`` (``"family/model"``, /proc/cpuinfo),
    ``cpu_capability`` (PyTorch's CPU kernel instruction set, e.g. ``"AVX512"``), ``load_average`` (1/5/15-minute, whole machine), ``memory_total_gib``,
    ``env`` (environment variables that change speed or the last bits of results, None when unset:
    threads, visible GPUs, and the instruction-set caps ``ATEN_CPU_CAPABILITY``,
    ``MKL_ENABLE_INSTRUCTIONS``, ``ONEDNN_MAX_CPU_ISA``), ``cuda_available``,
    ``cuda`` (None unless ``device`` is CUDA: GPU name, count, compute capability, total memory
    in GiB, driver version via nvidia-smi, ``torch.version.cuda``, cuDNN version, and current
    memory use / utilization of every physical GPU), and ``matmul_probe`` (see
    :func:`matmul_probe`; None when ``probe`` is False).
    """
    device = torch.device(device)
    return {
        "timestamp_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "packages": {name: _package_version(name) for name in _PACKAGES},
        "device": str(device),
        "device_type": device.type,
        "torch_num_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity_count": _cpu_affinity_count(),
        "cpu_model": cpu_model(),
        "cpu_family_model": _cpu_family_model(),
        "cpu_capability": _cpu_capability(),
        "load_average": _load_average(),
        "memory_total_gib": _memory_total_gib(),
        "env": {name: os.environ.get(name) for name in _ENV_VARS},
        "cuda_available": torch.cuda.is_available(),
        "cuda": _cuda_info() if device.type == "cuda" and torch.cuda.is_available() else None,
        "matmul_probe": matmul_probe(device) if probe else None,
    }

