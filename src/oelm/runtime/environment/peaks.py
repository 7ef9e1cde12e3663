"""What a run's speed means: the peak FLOP/s of the machine and model FLOPs utilization
(:mod:`oelm.runtime.environment`).

Model FLOPs utilization, as in the PaLM paper (Chowdhery et al. 2022, appendix B)::

    mfu = flops_per_token * tokens_per_second / peak_flops

with ``peak_flops`` the accelerator's dense datasheet peak at the run's precision from
:func:`peak_flops` (BF16 / TF32 tensor cores or plain FP32), or, where there is none (a CPU, an
unknown GPU), the measured matmul peak of :func:`measured_peak_flops` (the best
:func:`oelm.runtime.environment.capture.matmul_probe` over sizes, cached per machine). :func:`mfu_record`
picks one and says which (``peak_source``); FLOPs per token come from :mod:`oelm.architectures.flops`.
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
import time

import torch

from oelm.io import cache_dir
from oelm.runtime.environment.capture import cpu_model, matmul_probe

__all__ = [
    "PEAK_CACHE_FILE",
    "PRECISIONS",
    "matmul_column",
    "measured_peak_flops",
    "mfu",
    "mfu_record",
    "peak_flops",
    "probe_peak",
]

# Dense (no 2:4 sparsity) peaks in FLOP/s, from NVIDIA's datasheets. Tensor-core figures
# (BF16, FP16, TF32) are quoted "with sparsity"; the dense peak is half of it. "fp32" is the
# plain (non-tensor-core) FP32 rate; "tf32" the TF32 tensor-core rate that FP32 matmuls get
# when torch allows TF32 (torch.backends.cuda.matmul.allow_tf32 / set_float32_matmul_precision).
#   H100 Tensor Core GPU datasheet: SXM  BF16 1,979, TF32 989, FP32 67 TFLOPS;
#                                   PCIe BF16 1,513, TF32 756, FP32 51; NVL BF16 1,671, TF32 835, FP32 60.
#   H200 Tensor Core GPU datasheet: SXM  BF16 1,979, TF32 989, FP32 67; NVL BF16 1,671, TF32 835, FP32 60.
#   A100 Tensor Core GPU datasheet: BF16 312 dense (624 sparse), TF32 156 (312 sparse), FP32 19.5
#                                   (SXM and PCIe alike).
# FP16 tensor-core peaks equal the BF16 ones on all of these, so "fp16" reads the "bf16" column.
# Checked in order; the first rule whose substrings all occur in the upper-cased device name wins.
_DATASHEET_PEAKS: tuple[tuple[tuple[str, ...], str, dict[str, float]], ...] = (
    (("H200", "NVL"), "H200 NVL", {"bf16": 835e12, "tf32": 417.5e12, "fp32": 60e12}),
    (("H200",), "H200 SXM", {"bf16": 989e12, "tf32": 494.5e12, "fp32": 67e12}),  # also GH200
    (("H100", "NVL"), "H100 NVL", {"bf16": 835e12, "tf32": 417.5e12, "fp32": 60e12}),
    (("H100", "PCIE"), "H100 PCIe", {"bf16": 756e12, "tf32": 378e12, "fp32": 51e12}),
    (("H100",), "H100 SXM", {"bf16": 989e12, "tf32": 494.5e12, "fp32": 67e12}),  # "NVIDIA H100 80GB HBM3"
    (("A100",), "A100", {"bf16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
)
PRECISIONS = ("bf16", "fp16", "tf32", "fp32")
# Names the training loop uses for its precision setting -> the peak column they run at.
_PRECISION_ALIASES = {"no": "fp32", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _precision_column(dtype: str) -> str:
    """The table column of a precision name (``fp16`` -> ``bf16``). Raises ValueError if unknown."""
    name = _PRECISION_ALIASES.get(str(dtype), str(dtype))
    if name not in PRECISIONS:
        raise ValueError(f"unknown precision {dtype!r}; use one of {', '.join(PRECISIONS)} (or 'no' for fp32)")
    return "bf16" if name == "fp16" else name


def _datasheet_entry(name: str, dtype: str = "bf16") -> tuple[str, float] | None:
    """``(label, dense peak FLOP/s)`` of a CUDA device name at ``dtype``; None when unknown or a MIG slice."""
    column = _precision_column(dtype)
    upper = name.upper()
    if "MIG" in upper:
        return None  # a slice of the GPU: the full-GPU peak does not apply
    for needles, label, peaks in _DATASHEET_PEAKS:
        if all(needle in upper for needle in needles):
            return label, peaks[column]
    return None


def _peak_flops_for_name(name: str, dtype: str = "bf16") -> float | None:
    """Dense peak FLOP/s of a CUDA device name at ``dtype``, or None when unknown (or a MIG slice)."""
    entry = _datasheet_entry(name, dtype)
    return entry[1] if entry is not None else None


def peak_flops(device: torch.device | str, dtype: str = "bf16") -> float | None:
    """Datasheet dense peak of ``device`` in FLOP/s at ``dtype``; None for CPU, MIG or unknown GPUs.

    Args:
        device: a CUDA device (anything else gives None).
        dtype: ``"bf16"`` (default; tensor cores), ``"fp16"`` (same as bf16 here), ``"tf32"``
            (FP32 matmuls on tensor cores) or ``"fp32"`` (non-tensor-core FP32).

    Known (dense, TFLOP/s): H100 SXM bf16 989 / tf32 494.5 / fp32 67; H100 PCIe 756 / 378 / 51;
    H100 NVL 835 / 417.5 / 60; H200 as H100 SXM, H200 NVL as H100 NVL; A100 312 / 156 / 19.5
    (NVIDIA datasheets; dense = half the "with sparsity" tensor-core figure).

    Raises:
        ValueError: an unknown ``dtype``.
    """
    _precision_column(dtype)
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return _peak_flops_for_name(torch.cuda.get_device_name(device), dtype)


_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32}
_measured_peaks: dict[tuple[str, str], dict] = {}  # (device, dtype) -> probe result; one probe per process
PEAK_CACHE_FILE = "matmul-peaks.json"  # under oelm.io.cache_dir(): measured peaks of this machine


def _peak_cache_key(device: torch.device, column: str) -> str:
    """What a measured peak depends on: host, processor (or GPU name), torch version, threads, precision."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (cpu_model() or "cpu")
    return "|".join((socket.gethostname(), device.type, name, torch.__version__, str(torch.get_num_threads()), column))


def _peak_cache_path():
    return cache_dir() / PEAK_CACHE_FILE


def _read_peak_cache() -> dict:
    """The machine's cached peaks ({key: probe result}); {} when absent or unreadable (it is re-measured)."""
    import json

    try:
        data = json.loads(_peak_cache_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_peak_cache(key: str, result: dict) -> None:
    """Add one measured peak to the cache file (atomically; a read-only cache is left as it is)."""
    from oelm.io import write_json_atomic

    try:
        write_json_atomic(_peak_cache_path(), {**_read_peak_cache(), key: result})
    except OSError:
        pass


def probe_peak(device: torch.device | str, dtype: str = "fp32", budget_seconds: float = 1.0) -> dict:
    """One measurement of the matmul peak, uncached: :func:`matmul_probe` at square sizes 256, 512,
    1024, ... (0.1 s each, the median of 3 windows) until one matmul takes over 0.1 s, ``budget_seconds`` have passed, or the
    size reaches 16384. Returns the best probe's record plus ``measured_utc`` and ``load_1min`` (the
    machine's 1-minute load average then, None where the OS has none): a peak taken under load is
    too low, and an MFU divided by it too high."""
    column = _precision_column(dtype)
    device = torch.device(device)
    best: dict | None = None
    start = time.perf_counter()
    size = 256
    while True:
        result = matmul_probe(device, size=size, dtype=_TORCH_DTYPES[column], min_seconds=0.1, repeats=3)
        if best is None or result["gflops"] > best["gflops"]:
            best = result
        one_matmul = result["seconds"] / result["matmuls"]
        if one_matmul > 0.1 or time.perf_counter() - start > budget_seconds or size >= 16384:
            break
        size *= 2
    return {**best, "measured_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "load_1min": _load_1min()}


def _load_1min() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def measured_peak_flops(device: torch.device | str, dtype: str = "fp32", budget_seconds: float = 1.0,
                        cache: bool = True, refresh: bool = False) -> float:
    """The best dense matmul throughput (FLOP/s) :func:`matmul_probe` reaches on ``device`` at ``dtype``.

    Square sizes 256, 512, 1024, ... are probed (0.1 s each) until one matmul takes over 0.1 s,
    ``budget_seconds`` have passed, or the size reaches 16384; the best throughput is the peak.
    Large enough matmuls run at the device's practical peak, so this is the reference for MFU
    where no datasheet figure applies (a CPU, an unknown GPU, a MIG slice). The result is
    cached per (device, dtype) for the process and, with ``cache``, on disk for the machine
    (``<cache_dir>/matmul-peaks.json``, keyed by host, processor or GPU name, torch version,
    torch threads and precision): later processes reuse the first measurement instead of
    spending a second or more on it, and every run of the machine divides by the same peak.
    Delete the file to measure again, or pass ``refresh``: the peak is measured now and the higher
    of it and the cached one kept (a peak measured while other work loaded the machine is too low;
    :func:`mfu_record` refreshes when a run beat it). On CUDA, ``"fp32"`` runs with whatever TF32
    setting torch has at the time of the first call.

    Raises:
        ValueError: an unknown ``dtype``.
    """
    column = _precision_column(dtype)
    device = torch.device(device)
    key = (str(device), column)
    if key not in _measured_peaks or refresh:
        disk_key = _peak_cache_key(device, column)
        cached = _read_peak_cache().get(disk_key) if cache and not refresh else None
        if isinstance(cached, dict) and isinstance(cached.get("gflops"), (int, float)) and cached["gflops"] > 0:
            _measured_peaks[key] = cached
            return cached["gflops"] * 1e9
        best = probe_peak(device, column, budget_seconds)
        if refresh:  # keep the higher of the new measurement and what was known before
            known = [_measured_peaks.get(key), _read_peak_cache().get(disk_key) if cache else None]
            best = max([best, *(k for k in known if isinstance(k, dict) and isinstance(k.get("gflops"), (int, float)))],
                       key=lambda r: r["gflops"])
        _measured_peaks[key] = best
        if cache:
            _write_peak_cache(disk_key, best)
    return _measured_peaks[key]["gflops"] * 1e9


def mfu(flops_per_token: float, tokens_per_second: float, peak: float | None) -> float | None:
    """Model FLOPs utilization as a fraction (0.4 means 40 %), or None when the peak is unknown.

    ``flops_per_token`` (FLOP per token, forward + backward, e.g. ``6 * N + 12 * L * H * Q * T``
    from PaLM appendix B) times ``tokens_per_second`` (tokens/s) over ``peak`` (FLOP/s).
    """
    if peak is None or peak <= 0:
        return None
    return flops_per_token * tokens_per_second / peak


def _tf32_enabled() -> bool:
    """Whether CUDA FP32 matmuls may run on TF32 tensor cores (``allow_tf32`` / float32 precision)."""
    return bool(torch.backends.cuda.matmul.allow_tf32)


def matmul_column(device: torch.device, precision: str) -> str:
    """The peak column (``"bf16"``, ``"tf32"`` or ``"fp32"``) a run's matmuls actually use at
    ``precision`` on ``device``: fp32 on a GPU with TF32 allowed runs on tf32; fp16 reads bf16.

    Raises:
        ValueError: an unknown ``precision``.
    """
    column = _precision_column(precision)
    if column == "fp32" and device.type == "cuda" and _tf32_enabled():
        return "tf32"
    return column


def mfu_record(
    flops_per_token: float,
    tokens_per_second: float | None,
    device: torch.device | str,
    precision: str,
    measure: bool = True,
    peak_record: dict | None = None,
) -> dict:
    """MFU with the peak it was measured against, for a result record (``timing.mfu``).

    The peak is the datasheet figure of the GPU (:func:`peak_flops`) at the precision the
    matmuls run in (``"bf16"``/``"fp16"``; ``"fp32"``/``"no"`` on a GPU that allows TF32 uses
    the TF32 peak, else plain FP32); where there is none (CPU, unknown GPU, MIG slice) the
    measured matmul peak of :func:`measured_peak_flops` (about a second, once per machine),
    unless ``measure`` is False. A run whose model FLOP/s reach that measured peak shows the peak
    was taken under load: it is measured again (``refresh``) and the higher figure used, so a
    stale peak cannot report MFU of 100% or more.

    Args:
        flops_per_token: model FLOPs per token (forward + backward), e.g.
            :func:`oelm.architectures.flops.model_flops_per_token`.
        tokens_per_second: training throughput (tokens/s); None gives ``mfu: None``.
        device: the device the run trained on.
        precision: ``"bf16"``, ``"fp16"``, ``"fp32"``, ``"tf32"`` or the engine's ``"no"`` (= fp32).
        measure: allow the matmul probe when no datasheet figure applies.
        peak_record: where no datasheet figure applies, a peak the caller measured beside the run
            (``oelm bench`` probes before and after its steps: :func:`probe_peak` records with
            ``gflops``); used instead of the machine's cached peak, as ``"measured-interleaved"``.

    Returns:
        ``{"mfu": fraction or None, "flops_per_token": float, "tokens_per_second": float or None,
        "peak_flops": FLOP/s or None, "peak_source": "datasheet:<GPU>" (e.g. "datasheet:H100 SXM")
        | "measured-probe" | "measured-interleaved" | None, "peak_precision": the column used ("bf16",
        "tf32", "fp32"), "precision": the precision given}``; with a measured peak also
        ``peak_measured_utc``, ``peak_age_s`` (seconds since it was measured), ``peak_load_1min``
        (the load average then) and ``load_1min`` (now): a cached peak from a loaded moment shows.

    Raises:
        ValueError: an unknown ``precision``.
    """
    device = torch.device(device)
    column = matmul_column(device, precision)
    peak, source = None, None
    if device.type == "cuda" and torch.cuda.is_available():
        entry = _datasheet_entry(torch.cuda.get_device_name(device), column)
        if entry is not None:
            peak, source = entry[1], f"datasheet:{entry[0]}"
    probe = None
    if peak is None and peak_record is not None:
        peak, source, probe = float(peak_record["gflops"]) * 1e9, "measured-interleaved", peak_record
    if peak is None and measure:
        peak, source = measured_peak_flops(device, column), "measured-probe"
        if tokens_per_second is not None and flops_per_token * tokens_per_second >= peak:
            # the run beat the "peak": it was measured while other work loaded the machine
            peak = measured_peak_flops(device, column, refresh=True)
        probe = _measured_peaks.get((str(device), column))
    value = mfu(flops_per_token, tokens_per_second, peak) if tokens_per_second is not None else None
    return {**(_peak_age(probe) if isinstance(probe, dict) else {}),
        "mfu": value,
        "flops_per_token": float(flops_per_token),
        "tokens_per_second": None if tokens_per_second is None else float(tokens_per_second),
        "peak_flops": peak,
        "peak_source": source,
        "peak_precision": column,
        "precision": precision,
    }


def _peak_age(probe: dict) -> dict:
    """When a measured peak was taken and how loaded the machine was then and now."""
    age = None
    try:
        age = round((_dt.datetime.now(_dt.timezone.utc) - _dt.datetime.fromisoformat(probe["measured_utc"])).total_seconds())
    except (KeyError, TypeError, ValueError):
        pass
    interleaved = {k: probe[k] for k in ("before_gflops", "after_gflops", "after_load_1min") if k in probe}
    return {"peak_measured_utc": probe.get("measured_utc"), "peak_age_s": age, "peak_load_1min": probe.get("load_1min"),
            "load_1min": _load_1min(), **interleaved}
