"""Operators per step: what a launch-bound step pays for, counted with ``torch.profiler``.

On a GPU whose step is bound by kernel launches (and on a CPU running a tiny model), step time
follows the number of operator calls, not the FLOPs. :func:`count_operators` runs one step under
the profiler and counts every ATen operator the dispatcher saw (``aten::*`` events, nested ones
included: ``aten::linear`` calling ``aten::addmm`` is two calls, as the dispatcher pays for two);
:func:`operator_diff` lists by name what one loop calls more (or less) often than another.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import Counter
from typing import Callable

__all__ = ["count_operators", "operator_diff"]


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 to /dev/null for the block (C++ logging bypasses sys.stderr)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def count_operators(step: Callable[[], object]) -> Counter:
    """Run ``step()`` once under ``torch.profiler`` (CPU activity) and count ``aten::`` calls by name.

    Returns:
        ``Counter`` name -> calls in that step (backward included: CPU autograd runs in the
        profiled thread; CUDA kernels are not counted, only the operators that launch them).
    """
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], record_shapes=False)
    with _quiet_stderr():  # some torch builds log "profiler_start" lines to fd 2 here
        prof.start()
    try:
        step()
    finally:
        with _quiet_stderr():
            prof.stop()
    counts = Counter()
    for event in prof.events():
        if event.name.startswith("aten::"):
            counts[event.name] += 1
    return counts


def operator_diff(engine: Counter, plain: Counter) -> dict:
    """``{"engine": total, "plain": total, "extra": {name: +n}, "fewer": {name: -n}}``: the
    operators the engine calls more (``extra``) and less (``fewer``) often per step than the plain
    loop, largest differences first."""
    diff = {name: engine.get(name, 0) - plain.get(name, 0) for name in set(engine) | set(plain)}
    ordered = sorted(diff.items(), key=lambda kv: (-abs(kv[1]), kv[0]))
    return {
        "engine": sum(engine.values()),
        "plain": sum(plain.values()),
        "extra": {k: v for k, v in ordered if v > 0},
        "fewer": {k: v for k, v in ordered if v < 0},
    }
