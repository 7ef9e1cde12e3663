"""What machine a run ran on, how fast it was at the time, and what that means for MFU.

Timings are only comparable between runs taken on the same, otherwise idle, machine. So every
run records :func:`capture_environment` (software versions, CPU/GPU, load average, memory,
thread settings, GPU occupancy) and a short :func:`matmul_probe` (achieved GFLOP/s of a dense
matmul). Probing before and after an experiment and comparing with :func:`probe_drift_percent`
shows whether the machine's speed changed under the runs (another job, thermal throttling).

Model FLOPs utilization, as in the PaLM paper (Chowdhery et al. 2022, appendix B)::

    mfu = flops_per_token * tokens_per_second / peak_flops

with ``peak_flops`` the accelerator's dense BF16 tensor-core peak from :func:`peak_flops`.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import shutil
import socket
import subprocess
import sys
import time

import torch

from oelm.timing import cuda_synchronize_if_needed

__all__ = [
    "capture_environment",
    "matmul_probe",
    "mfu",
    "peak_flops",
    "probe_drift_percent",
]

# Distributions whose versions change results or speed.
_PACKAGES = ("torch", "transformers", "accelerate", "datasets", "tokenizers", "numpy", "oelm")
# Environment variables that change speed or behaviour.
_ENV_VARS = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE")


# -- speed probe -------------------------------------------------------------------------------


def matmul_probe(
    device: torch.device | str = "cpu",
    size: int = 1024,
    dtype: torch.dtype = torch.float32,
    min_seconds: float = 0.2,
) -> dict:
    """Achieved dense matmul throughput (GFLOP/s) of ``size x size`` matrices on ``device``.

    One ``size x size`` by ``size x size`` matmul counts ``2 * size**3`` FLOPs. After one
    warm-up matmul, matmuls are repeated until at least ``min_seconds`` of wall time has
    passed; on CUDA they are issued in doubling batches with a synchronize after each batch,
    so launch and sync overhead stay small. Inputs come from a private generator: the global
    RNG state (and with it a run's seeding) is untouched. About 0.2-0.5 s on a small CPU.

    Returns:
        ``{"gflops": GFLOP/s, "size": n, "dtype": "float32", "device": "cpu",
        "seconds": timed wall seconds, "matmuls": count}``.
    """
    device = torch.device(device)
    generator = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    torch.matmul(a, b, out=out)  # warm-up: kernel selection, allocator, thread pool start
    cuda_synchronize_if_needed(device)

    batch = 1
    count = 0
    start = time.perf_counter()
    while True:
        for _ in range(batch):
            torch.matmul(a, b, out=out)
        cuda_synchronize_if_needed(device)
        count += batch
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            break
        if device.type != "cpu":
            batch *= 2  # asynchronous devices: amortize the synchronize
    return {
        "gflops": 2.0 * size**3 * count / elapsed / 1e9,
        "size": int(size),
        "dtype": str(dtype).removeprefix("torch."),
        "device": str(device),
        "seconds": elapsed,
        "matmuls": count,
    }


def probe_drift_percent(before_gflops: float, after_gflops: float) -> float:
    """Relative change of probe throughput in percent: ``(after - before) / before * 100``.

    Negative means the machine got slower between the two probes.
    """
    if before_gflops <= 0:
        raise ValueError(f"before_gflops must be positive, got {before_gflops}")
    return (after_gflops - before_gflops) / before_gflops * 100.0


# -- peak FLOPs and MFU ------------------------------------------------------------------------

# Dense (no 2:4 sparsity) BF16 tensor-core peaks, FLOP/s. NVIDIA datasheets quote BF16 "with
# sparsity"; the dense peak is half of it:
#   H100 Tensor Core GPU datasheet: H100 SXM 1,979 TFLOPS, H100 PCIe 1,513, H100 NVL 1,671.
#   H200 Tensor Core GPU datasheet: H200 SXM 1,979 TFLOPS, H200 NVL 1,671.
#   A100 Tensor Core GPU datasheet: A100 (SXM and PCIe) 312 TFLOPS dense, 624 with sparsity.
# Checked in order; the first rule whose substrings all occur in the upper-cased device name wins.
_BF16_DENSE_PEAKS: tuple[tuple[tuple[str, ...], float], ...] = (
    (("H200", "NVL"), 835e12),
    (("H200",), 989e12),  # also GH200 (same Hopper GPU as H100 SXM)
    (("H100", "NVL"), 835e12),
    (("H100", "PCIE"), 756e12),
    (("H100",), 989e12),  # SXM5, reported as e.g. "NVIDIA H100 80GB HBM3"
    (("A100",), 312e12),
)


def _peak_flops_for_name(name: str) -> float | None:
    """Dense BF16 peak FLOP/s for a CUDA device name, or None when unknown (or a MIG slice)."""
    upper = name.upper()
    if "MIG" in upper:
        return None  # a slice of the GPU: the full-GPU peak does not apply
    for needles, peak in _BF16_DENSE_PEAKS:
        if all(needle in upper for needle in needles):
            return peak
    return None


def peak_flops(device: torch.device | str) -> float | None:
    """Dense BF16 tensor-core peak of ``device`` in FLOP/s, for MFU; None for CPU or unknown GPUs.

    Known: H100 SXM 989e12, H100 PCIe 756e12, H100 NVL 835e12, H200 989e12, H200 NVL 835e12,
    A100 312e12 (NVIDIA datasheets, dense = half the "with sparsity" figure). The peak is a
    BF16 figure: MFU of an FP32 run against it is not meaningful.
    """
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return _peak_flops_for_name(torch.cuda.get_device_name(device))


def mfu(flops_per_token: float, tokens_per_second: float, peak: float | None) -> float | None:
    """Model FLOPs utilization as a fraction (0.4 means 40 %), or None when the peak is unknown.

    ``flops_per_token`` (FLOP per token, forward + backward, e.g. ``6 * N + 12 * L * H * Q * T``
    from PaLM appendix B) times ``tokens_per_second`` (tokens/s) over ``peak`` (FLOP/s).
    """
    if peak is None or peak <= 0:
        return None
    return flops_per_token * tokens_per_second / peak


# -- environment capture -----------------------------------------------------------------------


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


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
    run on), ``cpu_model``, ``load_average`` (1/5/15-minute, whole machine), ``memory_total_gib``,
    ``env`` (speed-relevant environment variables, None when unset), ``cuda_available``,
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
        "cpu_model": _cpu_model(),
        "load_average": _load_average(),
        "memory_total_gib": _memory_total_gib(),
        "env": {name: os.environ.get(name) for name in _ENV_VARS},
        "cuda_available": torch.cuda.is_available(),
        "cuda": _cuda_info() if device.type == "cuda" and torch.cuda.is_available() else None,
        "matmul_probe": matmul_probe(device) if probe else None,
    }


def mfu_record(flops_per_token, tokens_per_second, device, precision):  # TEMPORARY placeholder (branch i-bench)
    return None
