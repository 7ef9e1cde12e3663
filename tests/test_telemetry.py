"""GPU telemetry: unavailable without a GPU (no thread, no exception); with a scripted fake NVML,
the summary's min/median/max are the script's; an NVML error mid-run ends sampling quietly."""

from __future__ import annotations

import json
import statistics
import threading
import types

import pytest
import torch

from oelm.runtime import telemetry
from oelm.runtime.telemetry import METRICS, GPUTelemetry


class FakeNVMLError(Exception):
    pass


class FakeNotSupported(FakeNVMLError):
    pass


class FakeNVML:
    """Stands in for pynvml. Serves rows of ``script`` in order (cycling), one row per complete
    sample; ``fail_at`` (sample number) raises an NVML error instead; ``unsupported`` metrics
    raise NVMLError_NotSupported. Logs every complete row it served."""

    NVMLError = FakeNVMLError
    NVMLError_NotSupported = FakeNotSupported
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2

    def __init__(self, script, fail_at=None, unsupported=(), init_error=None):
        self.script = script
        self.fail_at = fail_at
        self.unsupported = set(unsupported)
        self.init_error = init_error
        self.served: list[dict] = []
        self.current: dict = {}
        self.handle_calls: list[tuple[str, object]] = []
        self.shutdowns = 0
        self.enough = threading.Event()  # set once every script row was served

    # lifecycle
    def nvmlInit(self):
        if self.init_error:
            raise FakeNVMLError(self.init_error)

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetHandleByPciBusId(self, bus_id):
        self.handle_calls.append(("pci", bus_id))
        return "handle"

    def nvmlDeviceGetHandleByIndex(self, index):
        self.handle_calls.append(("index", index))
        return "handle"

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.handle_calls.append(("uuid", uuid))
        return "handle"

    def nvmlDeviceGetName(self, handle):
        return b"Fake GPU 80GB"

    # readings: a new row starts at the utilization call, ends at the memory clock
    def _row(self):
        n = len(self.served)
        if self.fail_at is not None and n == self.fail_at:
            raise FakeNVMLError("GPU is lost")
        return self.script[n % len(self.script)]

    def _get(self, metric):
        if metric in self.unsupported:
            raise FakeNotSupported("Not Supported")
        value = self._row()[metric]
        self.current[metric] = value
        return value

    def nvmlDeviceGetUtilizationRates(self, handle):
        row = self._row()
        return types.SimpleNamespace(gpu=row["gpu_utilization_percent"], memory=row["memory_utilization_percent"])

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(used=int(self._get("memory_used_gib") * 2**30), total=80 * 2**30)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self._get("temperature_c")

    def nvmlDeviceGetPowerUsage(self, handle):
        return int(self._get("power_w") * 1000)  # milliwatts

    def nvmlDeviceGetClockInfo(self, handle, clock):
        if clock == self.NVML_CLOCK_SM:
            return self._get("sm_clock_mhz")
        value = self._get("memory_clock_mhz")  # the last reading of a sample
        self.served.append(dict(self._row()))
        if len(self.served) >= len(self.script):
            self.enough.set()
        return value


SCRIPT = [
    {"gpu_utilization_percent": 97, "memory_utilization_percent": 40, "memory_used_gib": 12.5,
     "temperature_c": 61, "power_w": 402.0, "sm_clock_mhz": 1980, "memory_clock_mhz": 2619},
    {"gpu_utilization_percent": 3, "memory_utilization_percent": 1, "memory_used_gib": 12.75,
     "temperature_c": 58, "power_w": 95.5, "sm_clock_mhz": 1755, "memory_clock_mhz": 2619},
    {"gpu_utilization_percent": 88, "memory_utilization_percent": 35, "memory_used_gib": 30.0,
     "temperature_c": 70, "power_w": 651.25, "sm_clock_mhz": 1410, "memory_clock_mhz": 1593},
    {"gpu_utilization_percent": 100, "memory_utilization_percent": 55, "memory_used_gib": 31.5,
     "temperature_c": 74, "power_w": 699.0, "sm_clock_mhz": 1500, "memory_clock_mhz": 2619},
    {"gpu_utilization_percent": 51, "memory_utilization_percent": 20, "memory_used_gib": 2.0,
     "temperature_c": 45, "power_w": 120.0, "sm_clock_mhz": 345, "memory_clock_mhz": 405},
]


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch says one CUDA GPU is there, at PCI address 0000:65:00.0."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    props = types.SimpleNamespace(name="Fake GPU 80GB", pci_domain_id=0, pci_bus_id=0x65, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)


def test_cpu_device_is_unavailable_without_thread():
    tel = GPUTelemetry("cpu", interval=0.01)
    with tel:
        assert not tel.running
    s = tel.summary()
    assert s["available"] is False and "not a CUDA device" in s["reason"]
    json.dumps(s)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_cuda_requested_without_gpu_is_unavailable():
    s = GPUTelemetry("cuda", interval=0.01).start().stop()
    assert s == {"available": False, "reason": s["reason"]}
    assert "CUDA is not available" in s["reason"]


def test_nvml_init_failure_is_unavailable(fake_cuda):
    fake = FakeNVML(SCRIPT, init_error="Driver Not Loaded")
    tel = GPUTelemetry("cuda", interval=0.01, nvml=fake).start()
    assert not tel.running
    s = tel.stop()
    assert s["available"] is False and "Driver Not Loaded" in s["reason"]


def test_summary_is_min_median_max_of_the_samples(fake_cuda):
    fake = FakeNVML(SCRIPT)
    with GPUTelemetry("cuda:0", interval=0.01, nvml=fake) as tel:
        assert fake.enough.wait(10), "the sampler never took len(SCRIPT) samples"
    assert not tel.running
    s = tel.summary()
    json.dumps(s)
    assert s["available"] is True and s["error"] is None and s["unsupported"] == []
    assert s["device"] == "Fake GPU 80GB" and s["interval_seconds"] == 0.01
    assert fake.handle_calls == [("pci", "00000000:65:00.0")]
    assert fake.shutdowns == 1
    served = fake.served  # at least the whole script, perhaps a few rows of a second pass
    assert s["samples"] == len(served) >= len(SCRIPT)
    for metric in METRICS:
        values = [row[metric] for row in served]
        got = s[metric]
        assert got["min"] == pytest.approx(min(values), abs=1e-6), metric
        assert got["max"] == pytest.approx(max(values), abs=1e-6), metric
        assert got["median"] == pytest.approx(statistics.median(values), abs=1e-6), metric
    # the first pass alone, by hand: SM clock 1980, 1755, 1410, 1500, 345 -> sorted median 1500
    if len(served) == len(SCRIPT):
        assert s["sm_clock_mhz"] == {"min": 345.0, "median": 1500.0, "max": 1980.0}


def test_nvml_error_mid_run_ends_sampling_and_is_recorded(fake_cuda):
    fake = FakeNVML(SCRIPT, fail_at=3)
    tel = GPUTelemetry("cuda", interval=0.01, nvml=fake).start()
    tel._thread.join(10)  # the sampler ends on its own after the error
    assert not tel.running
    s = tel.stop()  # no exception
    assert s["available"] is True and s["samples"] == 3
    assert "GPU is lost" in s["error"]
    assert s["gpu_utilization_percent"]["max"] == 97.0  # rows 0-2 only
    assert s["power_w"] == {"min": 95.5, "median": 402.0, "max": 651.25}


def test_unsupported_metric_is_left_out(fake_cuda):
    fake = FakeNVML(SCRIPT, unsupported={"power_w"})
    with GPUTelemetry("cuda", interval=0.01, nvml=fake) as tel:
        assert fake.enough.wait(10)
    s = tel.summary()
    assert s["error"] is None and s["unsupported"] == ["power_w"] and s["power_w"] is None
    assert s["temperature_c"]["max"] == 74.0


def test_stop_is_prompt_and_thread_ends(fake_cuda):
    fake = FakeNVML(SCRIPT)
    tel = GPUTelemetry("cuda", interval=30.0, nvml=fake).start()
    assert tel.running and tel._thread.daemon
    import time

    t0 = time.perf_counter()
    s = tel.stop()
    assert time.perf_counter() - t0 < 2.0, "stop() waited for the 30 s interval"
    assert not tel.running and not tel._thread.is_alive()
    assert s["samples"] == 1  # the first sample is taken at start


def test_cuda_visible_devices_mapping_without_pci_ids(monkeypatch):
    monkeypatch.setattr(telemetry, "_pci_bus_id", lambda index: None)
    fake = FakeNVML(SCRIPT)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    telemetry._nvml_handle(fake, 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8c1f2e7a-0000-1111-2222-333344445555")
    telemetry._nvml_handle(fake, 0)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    telemetry._nvml_handle(fake, 1)
    assert fake.handle_calls == [("index", 3), ("uuid", "GPU-8c1f2e7a-0000-1111-2222-333344445555"), ("index", 1)]


def test_interval_must_be_positive():
    with pytest.raises(ValueError):
        GPUTelemetry("cuda", interval=0)
