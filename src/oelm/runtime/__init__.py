"""What a run stands on, below everything that knows about models or records: the step and phase
clocks (:mod:`~oelm.runtime.timing`), GPU telemetry (:mod:`~oelm.runtime.telemetry`), the process
group helpers (:mod:`~oelm.runtime.distributed`), the output folder's lock (:mod:`~oelm.runtime.lock`)
and the machine record with its speed (:mod:`~oelm.runtime.environment`). These modules import only
each other and :mod:`oelm.errors`, :mod:`oelm.io`, :mod:`oelm._version`."""
