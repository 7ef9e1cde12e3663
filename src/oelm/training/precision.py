"""The one carrier of a run's numeric precision: autocast and the fp16 gradient scaler.

``training.mixed_precision`` is read here only. Mixed precision is done with PyTorch's autocast
per run rather than Accelerate's process-wide state, so runs with different precisions can
follow each other in one process.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

__all__ = ["Precision", "autocast_context"]

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Precision:
    """``mode`` (``"no"``, ``"bf16"`` or ``"fp16"``) on ``device``.

    Raises:
        ValueError: an unknown ``mode`` (the config refuses it before this is built).
    """

    mode: str
    device: torch.device

    def __post_init__(self) -> None:
        if self.mode != "no" and self.mode not in _DTYPES:
            raise ValueError(f"mixed precision {self.mode!r} is not one of 'no', 'bf16', 'fp16'")

    @property
    def dtype(self) -> torch.dtype | None:
        """The autocast dtype, or None in full precision."""
        return _DTYPES.get(self.mode)

    def autocast(self) -> contextlib.AbstractContextManager:
        """A fresh ``torch.autocast`` context (a no-op context in full precision)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """fp16 needs loss scaling against gradient underflow; bf16 has fp32's exponent range and
        does not: a ``GradScaler`` for fp16, else None."""
        return torch.amp.GradScaler(self.device.type) if self.mode == "fp16" else None


def autocast_context(device: torch.device, mixed_precision: str):
    """A factory of ``torch.autocast`` contexts for ``"bf16"``/``"fp16"``; a no-op for ``"no"``
    (:meth:`Precision.autocast`, for callers that hold a device and a mode string)."""
    return Precision(mixed_precision, torch.device(device)).autocast
