"""What machine a run ran on, how fast it was at the time, and what that means for MFU.

Two modules, re-exported here (import from ``oelm.runtime.environment``):

- :mod:`oelm.runtime.environment.capture`: :func:`capture_environment` (software versions, CPU/GPU, load
  average, memory, thread settings, GPU occupancy), the :func:`matmul_probe` (achieved GFLOP/s of
  a dense matmul) and :func:`probe_drift_percent` (whether the machine's speed changed under the
  runs).
- :mod:`oelm.runtime.environment.peaks`: the peak FLOP/s (:func:`peak_flops` from the datasheet,
  :func:`measured_peak_flops` measured and cached per machine, :func:`probe_peak`) and model
  FLOPs utilization (:func:`mfu`, :func:`mfu_record`; PaLM, Chowdhery et al. 2022, appendix B).
"""

from oelm.runtime.environment.capture import capture_environment, matmul_probe, probe_drift_percent, run_probes_wanted
from oelm.runtime.environment.peaks import (PEAK_CACHE_FILE, PRECISIONS, matmul_column, measured_peak_flops, mfu, mfu_record,
                                    peak_flops, probe_peak)

__all__ = [
    "PRECISIONS",
    "capture_environment",
    "matmul_probe",
    "measured_peak_flops",
    "mfu",
    "mfu_record",
    "peak_flops",
    "probe_drift_percent",
    "run_probes_wanted",
]
# Also importable from here, outside __all__ (as PEAK_CACHE_FILE and probe_peak were): matmul_column.
