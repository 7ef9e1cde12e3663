"""Step, data and phase timing that is correct on CPU and never stalls a GPU.

What is measured, and how
-------------------------
A *step* is one optimizer step: everything between ``timer.start_step()`` and
``timer.end_step()`` of **that same step** (forward, backward, clipping, ``optimizer.step()``,
scheduler, zero_grad). Waiting for the data loader is measured separately with
``timer.data_wait()`` and is never part of a step time, even when it happens inside a step
(gradient accumulation loading several micro-batches); such a wait is subtracted.

* On CUDA each ``start_step`` / ``end_step`` records a ``torch.cuda.Event`` on the current
  stream. Events are only *read* in :meth:`StepTimer.flush` (call it at log intervals), which
  waits for the most recent event once and then converts every pending pair to milliseconds.
  Nothing in the per-step path synchronizes, so the host keeps queueing work ahead of the GPU.
  A step's time is the GPU-timeline interval from the moment the GPU reaches the step's
  start event (after finishing the previous step's work) to the moment it finishes the step's
  last queued kernel. Consecutive steps therefore tile the GPU timeline without overlap, and
  host launch overhead that leaves the GPU idle inside a step is counted, as it should be.
* On CPU (and other devices) the clock is :func:`time.perf_counter` on the host. For devices
  whose kernels run asynchronously but have no events here (Apple ``mps``), ``start_step`` and
  ``end_step`` synchronize, which is correct but slower.

The original research code recorded, for step *i*, the duration of step *i-1* and synchronized
the GPU every step; both mistakes are impossible by construction here and tested in
``tests/test_timing.py``.

Data time comes in two flavours:

* ``data_seconds``: host wall time spent inside ``data_wait()`` (perf_counter), all of it.
* ``data_stall_seconds``: the part of it during which the device sat idle. On CPU it equals the
  host wait. On CUDA an event pair around the wait measures it on the GPU timeline: if the GPU
  was still busy with queued work during the wait, the stall is (correctly) close to zero.

Throughput, over the steps after warm-up only::

    tokens_per_second = sum(tokens of steps k..n-1)
                        / sum(step_seconds + data_stall_seconds of steps k..n-1)

where ``k = warmup_steps`` and a step's data stall is the stall of the waits since the end of
the previous step (the waits that fetched this step's batch). On CPU this is exactly
tokens / (step + data seconds); on CUDA it is tokens over the GPU-timeline span of those steps,
with no time counted twice. Time outside steps and data waits (validation, checkpointing,
logging) is not in the denominator: measure it with :class:`PhaseTimer`.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = [
    "PhaseTimer",
    "StepTimer",
    "cuda_synchronize_if_needed",
    "process_age_seconds",
    "summarize_step_times",
]


def cuda_synchronize_if_needed(device: torch.device | str) -> None:
    """Wait for all queued kernels on ``device`` when it runs asynchronously (CUDA, MPS).

    A no-op on CPU. Use it at coarse boundaries only (phases, end of training), never per step.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def summarize_step_times(ms: Sequence[float]) -> dict:
    """Median, mean, 10th and 90th percentile (ms) and count of step times given in ms.

    Percentiles use numpy's default linear interpolation between closest ranks. An empty
    sequence gives ``None`` for every statistic and ``n == 0``.
    """
    values = np.asarray(list(ms), dtype=np.float64)
    if values.size == 0:
        return {"median": None, "mean": None, "p10": None, "p90": None, "n": 0}
    p10, median, p90 = np.percentile(values, [10, 50, 90], method="linear")
    return {
        "median": float(median),
        "mean": float(values.mean()),
        "p10": float(p10),
        "p90": float(p90),
        "n": int(values.size),
    }


# A "mark" is a point in time: a perf_counter float (host clock) or a recorded CUDA event.
Mark = Any


@dataclass
class _Wait:
    """One ``data_wait()`` block: host seconds, and the marks that bound it on the device clock."""

    begin: Mark
    end: Mark
    host_seconds: float
    inside_step: bool


@dataclass
class _PendingStep:
    start: Mark
    end: Mark
    waits: list[_Wait]  # the waits since the previous step ended, including those inside it
    tokens: int
    samples: int


@dataclass
class _Step:
    """A finished, converted step. ``ms`` excludes any data wait inside the step."""

    ms: float
    data_seconds: float  # host wait attributed to this step
    stall_seconds: float  # device idle time attributed to this step's data waits
    tokens: int
    samples: int
    warmup: bool = False  # among the first ``warmup_steps`` steps of its process


_STATE_COLUMNS = ("ms", "data_seconds", "stall_seconds", "tokens", "samples", "warmup")


class StepTimer:
    """Per-optimizer-step wall time (ms), data-loader wait (s) and throughput (tokens/s).

    Usage::

        timer = StepTimer(device, warmup_steps=5)
        for step in range(max_steps):
            with timer.data_wait():
                batch = next(it)
            timer.start_step()
            ...  # forward / backward / optimizer.step()
            timer.end_step(tokens=n_tokens, samples=n_samples)
            if step % log_interval == 0:
                timer.flush()  # CUDA: one wait on the latest event, then read all pending pairs
                log(timer.last_step_ms)
        result = timer.summary()

    Args:
        device: the device the steps run on; ``cuda`` uses CUDA events, anything else the host
            clock (``time.perf_counter``).
        warmup_steps: the first ``warmup_steps`` steps (compilation, allocator and cuDNN warm-up)
            are left out of ``per_step_ms`` and the throughput, but included in
            ``train_step_seconds``. Default 5.

    See the module docstring for the exact interval measured and the tokens/s definition.

    Resuming: :meth:`state_dict` / :meth:`load_state_dict` carry the flushed steps across
    processes. The first ``warmup_steps`` steps *of each process* are warm-up (a resumed
    process warms up its allocator and caches again), so after ``load_state_dict`` the next
    ``warmup_steps`` steps are excluded too.
    """

    def __init__(self, device: torch.device | str = "cpu", warmup_steps: int = 5) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.device = torch.device(device)
        self.warmup_steps = int(warmup_steps)
        self._use_events = self.device.type == "cuda"
        self._sync_each_mark = self.device.type == "mps"
        self._steps: list[_Step] = []  # flushed, in step order
        self._pending: list[_PendingStep] = []  # ended, not yet converted
        self._waits: list[_Wait] = []  # waits since the last end_step
        self._step_start: Mark | None = None
        self._in_wait = False
        self._last_mark: Mark | None = None  # most recent event recorded (CUDA)
        self._warmup_until = self.warmup_steps  # steps with index below this are warm-up
        self._carried_data_seconds = 0.0  # trailing data wait of an earlier process (resume)

    # -- clock -------------------------------------------------------------------------------

    def _mark(self) -> Mark:
        """Record "now" on the device clock, without waiting for the device."""
        if self._use_events:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            self._last_mark = event
            return event
        if self._sync_each_mark:
            cuda_synchronize_if_needed(self.device)
        return time.perf_counter()

    def _elapsed_ms(self, begin: Mark, end: Mark) -> float:
        if self._use_events:
            return float(begin.elapsed_time(end))
        return (end - begin) * 1000.0

    # -- the per-step API --------------------------------------------------------------------

    @contextlib.contextmanager
    def data_wait(self) -> Iterator[None]:
        """Time the block as data-loader wait, not as step time (allowed inside a step too)."""
        if self._in_wait:
            raise RuntimeError("StepTimer.data_wait() blocks cannot be nested")
        self._in_wait = True
        begin = self._mark()
        host_begin = time.perf_counter()
        try:
            yield
        finally:
            host_seconds = time.perf_counter() - host_begin
            end = self._mark()
            self._in_wait = False
            self._waits.append(_Wait(begin, end, host_seconds, self._step_start is not None))

    def start_step(self) -> None:
        """Mark the start of an optimizer step. Raises RuntimeError if a step is already open."""
        if self._step_start is not None:
            raise RuntimeError(
                "StepTimer.start_step() called twice without end_step(): "
                "call end_step() to close the current step first"
            )
        if self._in_wait:
            raise RuntimeError("StepTimer.start_step() called inside a data_wait() block")
        self._step_start = self._mark()

    def end_step(self, tokens: int = 0, samples: int = 0) -> None:
        """Mark the end of the step opened by the last ``start_step()``.

        Args:
            tokens: tokens processed by this step (all micro-batches), for tokens/s.
            samples: samples (sequences / examples) processed by this step, for samples/s.
        """
        if self._step_start is None:
            raise RuntimeError(
                "StepTimer.end_step() called without a matching start_step(): "
                "call start_step() before the forward pass of each step"
            )
        if self._in_wait:
            raise RuntimeError("StepTimer.end_step() called inside a data_wait() block")
        end = self._mark()
        self._pending.append(
            _PendingStep(self._step_start, end, self._waits, int(tokens), int(samples))
        )
        self._step_start = None
        self._waits = []
        if not self._use_events:
            self.flush()  # host clock: already final, nothing to wait for

    def flush(self) -> None:
        """Convert every ended step to milliseconds.

        On CUDA this waits for the most recently recorded event (the last ``end_step`` or data
        wait), which implies all earlier events on the same stream are done, then reads each
        pair. Call it at log intervals, not every step. On CPU it is free.
        """
        if not self._pending:
            return
        if self._use_events:
            self._last_mark.synchronize()
        for pending in self._pending:
            if self._use_events:
                # Events recorded on another stream are not ordered after _last_mark.
                marks = [pending.start, pending.end]
                marks += [m for w in pending.waits for m in (w.begin, w.end)]
                for event in marks:
                    if not event.query():
                        event.synchronize()
            inner_stall_ms = sum(
                self._elapsed_ms(w.begin, w.end) for w in pending.waits if w.inside_step
            )
            stall_ms = sum(self._elapsed_ms(w.begin, w.end) for w in pending.waits)
            step_ms = self._elapsed_ms(pending.start, pending.end) - inner_stall_ms
            self._steps.append(
                _Step(
                    ms=max(step_ms, 0.0),
                    data_seconds=sum(w.host_seconds for w in pending.waits),
                    stall_seconds=stall_ms / 1000.0,
                    tokens=pending.tokens,
                    samples=pending.samples,
                    warmup=len(self._steps) < self._warmup_until,
                )
            )
        self._pending = []

    # -- resume ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Flush, then return the finished steps as a float64 tensor ``[steps, 6]`` (columns
        ms, data_seconds, stall_seconds, tokens, samples, warmup) plus the trailing data wait
        (seconds). Loadable with ``torch.load(..., weights_only=True)``."""
        self.flush()
        rows = [[s.ms, s.data_seconds, s.stall_seconds, s.tokens, s.samples, float(s.warmup)] for s in self._steps]
        steps = torch.tensor(rows, dtype=torch.float64).reshape(len(rows), len(_STATE_COLUMNS))
        return {"steps": steps, "trailing_data_seconds": sum(w.host_seconds for w in self._waits)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the steps of :meth:`state_dict` (from an earlier process); the next
        ``warmup_steps`` steps of this process count as warm-up.

        Raises:
            RuntimeError: steps were already timed by this timer.
        """
        if self._steps or self._pending or self._step_start is not None:
            raise RuntimeError("StepTimer.load_state_dict() must be called before any step is timed")
        self._steps = [
            _Step(ms=r[0], data_seconds=r[1], stall_seconds=r[2], tokens=int(r[3]), samples=int(r[4]), warmup=bool(r[5]))
            for r in state["steps"].tolist()
        ]
        self._carried_data_seconds = float(state.get("trailing_data_seconds", 0.0))
        self._warmup_until = len(self._steps) + self.warmup_steps

    # -- results -----------------------------------------------------------------------------

    @property
    def step_times_ms(self) -> list[float]:
        """Time of each flushed step in ms, in step order (warm-up included)."""
        return [s.ms for s in self._steps]

    @property
    def measured_step_times_ms(self) -> list[float]:
        """Time of each flushed non-warm-up step in ms, in step order (what ``per_step_ms`` summarizes)."""
        return [s.ms for s in self._steps if not s.warmup]

    @property
    def last_step_ms(self) -> float | None:
        """Time of the most recent flushed step in ms, or None before any."""
        return self._steps[-1].ms if self._steps else None

    @property
    def num_steps(self) -> int:
        """Steps ended so far, flushed or not."""
        return len(self._steps) + len(self._pending)

    def summary(self) -> dict:
        """Flush, then summarize all steps (JSON-serializable).

        Keys: ``per_step_ms`` (:func:`summarize_step_times` of the steps after warm-up),
        ``train_step_seconds`` (sum of all step times, warm-up included), ``data_seconds``
        (all host data wait, including waits after the last step), ``data_stall_seconds``
        (device idle time due to data, all steps), ``tokens`` / ``samples`` (totals, all steps),
        ``measured_seconds`` (the tokens/s denominator: step + data stall seconds of the
        steps after warm-up), ``tokens_per_second`` / ``samples_per_second`` (steps after
        warm-up; None when there are none), ``steps``, ``warmup_steps_excluded`` (how many
        steps were actually left out: ``min(warmup_steps, steps)`` per process).
        """
        self.flush()
        measured = [s for s in self._steps if not s.warmup]
        measured_seconds = sum(s.ms / 1000.0 + s.stall_seconds for s in measured)

        def rate(count: int) -> float | None:
            return count / measured_seconds if measured and measured_seconds > 0 else None

        trailing_data = sum(w.host_seconds for w in self._waits) + self._carried_data_seconds
        return {
            "per_step_ms": summarize_step_times([s.ms for s in measured]),
            "train_step_seconds": sum(s.ms for s in self._steps) / 1000.0,
            "data_seconds": sum(s.data_seconds for s in self._steps) + trailing_data,
            "data_stall_seconds": sum(s.stall_seconds for s in self._steps),
            "tokens": sum(s.tokens for s in self._steps),
            "samples": sum(s.samples for s in self._steps),
            "measured_seconds": measured_seconds,
            "tokens_per_second": rate(sum(s.tokens for s in measured)),
            "samples_per_second": rate(sum(s.samples for s in measured)),
            "steps": len(self._steps),
            "warmup_steps_excluded": len(self._steps) - len(measured),
        }


@dataclass
class PhaseTimer:
    """Accumulated wall seconds per named phase (validation, checkpoint, epoch, ...).

    Usage::

        phases = PhaseTimer(device)
        with phases.measure("validation"):
            evaluate(model)
        phases.seconds["validation"]  # seconds, summed over every time the phase ran
        phases.counts["validation"]   # how many times it ran
        phases.began["validation"]    # time.perf_counter() when it first began (this process)

    Phases are coarse, so on CUDA/MPS the device is synchronized on entry and exit: the time
    includes all the work queued inside the phase and none queued before it. The clock is
    ``time.perf_counter``. A phase that raises is still counted up to the exception.
    """

    device: torch.device | str = "cpu"
    seconds: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    began: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def measure(self, name: str) -> Iterator[None]:
        cuda_synchronize_if_needed(self.device)
        begin = time.perf_counter()
        self.began.setdefault(name, begin)
        try:
            yield
        finally:
            cuda_synchronize_if_needed(self.device)
            elapsed = time.perf_counter() - begin
            self.seconds[name] = self.seconds.get(name, 0.0) + elapsed
            self.counts[name] = self.counts.get(name, 0) + 1


def process_age_seconds() -> float | None:
    """Seconds since this process started, interpreter start-up and imports included (Linux: its
    start time in ``/proc/self/stat``, in clock ticks since boot, against ``CLOCK_BOOTTIME``; 10 ms
    resolution); None where that cannot be read (another system)."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            after_name = fh.read().rsplit(b")", 1)[1].split()  # the name may hold spaces: fields from "state" on
        start_ticks = int(after_name[19])  # field 22, starttime (proc(5))
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
