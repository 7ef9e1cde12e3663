"""GPU telemetry sampled in the background while a run trains.

A step time says how long a step took; it does not say why. :class:`GPUTelemetry` samples the
run's GPU through NVML (the library behind ``nvidia-smi``; Python binding ``pynvml`` from the
``nvidia-ml-py`` distribution) every ``interval`` seconds on a daemon thread and summarizes what
it saw, so a result records whether the GPU was busy, throttled (clocks), hot or power-limited
during the run::

    with GPUTelemetry(device, interval=1.0) as tel:
        ...  # training
    timing["gpu_telemetry"] = tel.summary()

Each sample reads (NVML call -> unit):

* ``gpu_utilization_percent`` / ``memory_utilization_percent`` — ``nvmlDeviceGetUtilizationRates``:
  percent of the last sample period (1/6 s to 1 s, driver-defined) in which a kernel ran / the
  memory controller was busy. Utilization is *occupancy in time*, not FLOP efficiency (see MFU).
* ``memory_used_gib`` — ``nvmlDeviceGetMemoryInfo().used`` / 2**30, every process on the GPU
  (not only this one; torch's own peak is in ``torch.cuda.max_memory_allocated``).
* ``temperature_c`` — ``nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)``, °C.
* ``power_w`` — ``nvmlDeviceGetPowerUsage`` (milliwatts) / 1000, W, board power.
* ``sm_clock_mhz`` / ``memory_clock_mhz`` — ``nvmlDeviceGetClockInfo(NVML_CLOCK_SM / NVML_CLOCK_MEM)``, MHz.

The summary gives ``{"min", "median", "max"}`` of each over the samples (median: the middle value,
or the mean of the two middle values for an even count). A metric the GPU does not report
(``NVMLError_NotSupported``, e.g. power on some boards) is listed under ``unsupported`` and
left out; any other NVML error ends sampling and is recorded as ``error`` — telemetry never
raises into training.

Which GPU: the CUDA device index (``cuda:1``) counts the GPUs *visible to this process*
(``CUDA_VISIBLE_DEVICES``), while NVML counts every physical GPU. The index is mapped through
the device's PCI bus id (``torch.cuda.get_device_properties(i).pci_domain_id/pci_bus_id/
pci_device_id``) when torch reports it, else through the ``CUDA_VISIBLE_DEVICES`` entry at that
index (an integer -> NVML index, ``GPU-...``/``MIG-...`` -> UUID), else the index itself.

Cost on the step path: none by construction — the step never waits on the sampler; the thread
wakes once per ``interval`` and ctypes releases the GIL during each NVML call (~tens of µs).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from typing import Any

__all__ = ["GPUTelemetry", "METRICS"]

#: The summary's metric names, in reading order.
METRICS = (
    "gpu_utilization_percent",
    "memory_utilization_percent",
    "memory_used_gib",
    "temperature_c",
    "power_w",
    "sm_clock_mhz",
    "memory_clock_mhz",
)

_GIB = 2**30


def _cuda_index(device: Any) -> int | None:
    """The CUDA device index of ``device`` (``"cuda"``, ``"cuda:1"``, ``torch.device``, int), or
    None when it is not a CUDA device. ``"cuda"`` without an index is the current device."""
    import torch

    if device is None:
        device = "cuda"
    if isinstance(device, int):
        return device
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        return None
    if device.type != "cuda":
        return None
    if device.index is not None:
        return device.index
    return torch.cuda.current_device() if torch.cuda.is_available() else 0


def _pci_bus_id(index: int) -> str | None:
    """NVML's form of the PCI address of CUDA device ``index`` (``"00000000:65:00.0"``), or None
    when this torch does not report PCI ids."""
    import torch

    try:
        props = torch.cuda.get_device_properties(index)
        domain, bus, dev = props.pci_domain_id, props.pci_bus_id, props.pci_device_id
    except (AttributeError, AssertionError, RuntimeError):
        return None
    if not all(isinstance(v, int) for v in (domain, bus, dev)):
        return None
    return f"{domain:08X}:{bus:02X}:{dev:02X}.0"


def _nvml_handle(nvml: Any, index: int) -> tuple[Any, str]:
    """(NVML handle, how it was found) for CUDA device ``index``; see the module docstring."""
    bus_id = _pci_bus_id(index)
    if bus_id is not None:
        return nvml.nvmlDeviceGetHandleByPciBusId(bus_id), f"pci_bus_id {bus_id}"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        if index < len(entries):
            entry = entries[index]
            if entry.isdigit():
                return nvml.nvmlDeviceGetHandleByIndex(int(entry)), f"CUDA_VISIBLE_DEVICES[{index}] = NVML index {entry}"
            if entry.startswith(("GPU-", "MIG-")):
                return nvml.nvmlDeviceGetHandleByUUID(entry), f"CUDA_VISIBLE_DEVICES[{index}] = {entry}"
    return nvml.nvmlDeviceGetHandleByIndex(index), f"NVML index {index}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


class GPUTelemetry:
    """Samples one GPU through NVML on a daemon thread; see the module docstring.

    Args:
        device: the run's device (``"cuda"``, ``"cuda:1"``, ``torch.device``, a CUDA index); a
            non-CUDA device gives an unavailable summary. Default ``"cuda"`` (current device).
        interval: seconds between samples (default 1.0; must be > 0). The first sample is taken
            at :meth:`start`.
        nvml: the NVML binding (default: ``import pynvml``); tests pass a fake.

    Use as a context manager or call :meth:`start` / :meth:`stop`. Nothing here raises on a
    missing GPU, a missing ``pynvml`` or an NVML failure: :meth:`summary` then returns
    ``{"available": False, "reason": ...}`` and no thread is started.
    """

    def __init__(self, device: Any = "cuda", interval: float = 1.0, *, nvml: Any = None) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        self.device = device
        self.interval = float(interval)
        self._nvml = nvml
        self._handle: Any = None
        self._name: str | None = None
        self._mapping: str | None = None
        self._reason: str | None = None  # why telemetry is unavailable
        self._error: str | None = None  # NVML error that ended sampling
        self._unsupported: set[str] = set()
        self._values: dict[str, list[float]] = {m: [] for m in METRICS}
        self._samples = 0
        self._started_at: float | None = None
        self._stopped_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> GPUTelemetry:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> GPUTelemetry:
        """Open NVML for the device and start sampling; on any failure record why and return."""
        if self._thread is not None or self._reason is not None:
            return self
        try:
            self._open()
        except Exception as exc:  # never raise into training: record why and run without telemetry
            self._reason = f"{type(exc).__name__}: {exc}"
        return self

    def _open(self) -> None:
        """Resolve the device, initialize NVML, find the handle, start the thread; sets
        ``_reason`` instead when one of them is not possible."""
        index = _cuda_index(self.device)
        if index is None:
            self._reason = f"device {self.device!s} is not a CUDA device"
            return
        import torch

        if not torch.cuda.is_available():
            self._reason = f"CUDA is not available (torch {torch.__version__}, torch.version.cuda={torch.version.cuda})"
            return
        if self._nvml is None:
            try:
                import pynvml
            except ImportError as exc:
                self._reason = f"pynvml is not importable ({exc}); pip install nvidia-ml-py"
                return
            self._nvml = pynvml
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError (no driver, no permission) or a broken binding
            self._reason = f"nvmlInit failed: {type(exc).__name__}: {exc}"
            return
        try:
            self._handle, self._mapping = _nvml_handle(nvml, index)
            self._name = _text(nvml.nvmlDeviceGetName(self._handle))
        except Exception as exc:
            self._reason = f"no NVML handle for CUDA device {index}: {type(exc).__name__}: {exc}"
            self._shutdown()
            return
        self._started_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="oelm-gpu-telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, Any]:
        """Stop sampling (returns within about one NVML call) and return :meth:`summary`."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._stop.set()
            thread.join(timeout=max(5.0, 2 * self.interval))
            if thread.is_alive() and self._error is None:
                self._error = "sampler thread did not stop within its join timeout (an NVML call hung)"
        if thread is not None and self._stopped_at is None:
            self._stopped_at = time.monotonic()
            if not thread.is_alive():
                self._shutdown()
        return self.summary()

    @property
    def running(self) -> bool:
        """True while the sampler thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    # -- sampling -------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            if not self._sample():
                return
            if self._stop.wait(self.interval):
                return

    def _read(self, metric: str) -> float:
        nvml, h = self._nvml, self._handle
        if metric == "gpu_utilization_percent":
            return float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)
        if metric == "memory_utilization_percent":
            return float(nvml.nvmlDeviceGetUtilizationRates(h).memory)
        if metric == "memory_used_gib":
            return nvml.nvmlDeviceGetMemoryInfo(h).used / _GIB
        if metric == "temperature_c":
            return float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))
        if metric == "power_w":
            return nvml.nvmlDeviceGetPowerUsage(h) / 1000.0  # milliwatts
        if metric == "sm_clock_mhz":
            return float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
        if metric == "memory_clock_mhz":
            return float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM))
        raise KeyError(metric)

    def _sample(self) -> bool:
        """Read every supported metric once; False (and ``error`` set) when sampling must end.

        A sample is stored only when complete, so every metric has the same sample count."""
        not_supported = getattr(self._nvml, "NVMLError_NotSupported", None)
        row: dict[str, float] = {}
        for metric in METRICS:
            if metric in self._unsupported:
                continue
            try:
                row[metric] = self._read(metric)
            except Exception as exc:
                if not_supported is not None and isinstance(exc, not_supported):
                    self._unsupported.add(metric)
                    continue
                self._error = f"{metric}: {type(exc).__name__}: {exc}"
                return False
        for metric, value in row.items():
            self._values[metric].append(value)
        self._samples += 1
        return True

    def _shutdown(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # shutting down is best effort; the numbers are already taken
            pass

    # -- result ---------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """JSON-serializable summary (also while running: the samples so far).

        Unavailable: ``{"available": False, "reason": str}``. Otherwise ``{"available": True,
        "device": GPU name, "nvml_device": how the NVML handle was found, "interval_seconds",
        "samples", "seconds" (sampling wall time), "error": str | None, "unsupported": [metric],
        <metric>: {"min", "median", "max"} | None}`` for every metric in :data:`METRICS`
        (None: no sample, or the GPU does not report it).
        """
        if self._reason is not None:
            return {"available": False, "reason": self._reason}
        if self._started_at is None:
            return {"available": False, "reason": "telemetry was not started"}
        end = self._stopped_at if self._stopped_at is not None else time.monotonic()
        out: dict[str, Any] = {
            "available": True,
            "device": self._name,
            "nvml_device": self._mapping,
            "interval_seconds": self.interval,
            "samples": self._samples,
            "seconds": end - self._started_at,
            "error": self._error,
            "unsupported": sorted(self._unsupported),
        }
        for metric in METRICS:
            out[metric] = _spread(list(self._values[metric]))
        return out
