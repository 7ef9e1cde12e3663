"""Which process this is, when ``oelm run`` is launched on several (Accelerate underneath).

``accelerate launch -m oelm run CONFIG`` and ``torchrun --nproc_per_node=N -m oelm run CONFIG``
start N processes that each run the whole protocol in lockstep (the same runs in the same
order; the collectives inside :func:`oelm.training.train` keep them together). Rank 0 (the main
process) alone writes files and prints; the others compute the same records and discard them.
All of it comes from :class:`accelerate.PartialState`, which reads the launcher's environment
(``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...); nothing here communicates on its own.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

__all__ = ["cpu_only", "is_main_process", "num_processes", "barrier", "main_process_only"]

F = TypeVar("F", bound=Callable[..., Any])


def cpu_only() -> bool:
    """True without a CUDA device: Accelerate then needs ``cpu=True`` to treat a torchrun launch
    as a multi-process CPU job (gloo) instead of N independent processes."""
    import torch

    return not torch.cuda.is_available()


def _state():
    from accelerate import PartialState

    return PartialState(cpu=cpu_only())


def is_main_process() -> bool:
    """True in a single process, and on global rank 0 of a launched job."""
    return _state().is_main_process


def num_processes() -> int:
    """Processes of the job (1 when not launched by a distributed launcher)."""
    return _state().num_processes


def barrier() -> None:
    """Wait until every process gets here (a no-op in a single process)."""
    state = _state()
    if state.num_processes > 1:
        state.wait_for_everyone()


def main_process_only(fn: F) -> F:
    """``fn`` runs on the main process only; elsewhere the call returns None."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs) if is_main_process() else None

    return wrapper  # type: ignore[return-value]
