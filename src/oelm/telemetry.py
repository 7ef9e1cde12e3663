"""TEMPORARY placeholder until the NVML sampler lands (branch i-telemetry)."""


class GPUTelemetry:
    def __init__(self, device, interval=1.0):
        self.device = device

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def summary(self):
        return {"available": False, "reason": "placeholder"}
