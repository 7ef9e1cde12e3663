"""Shared parts of oelm's lean checkpoints (:mod:`oelm.checkpoint`): the file names and format,
the errors, and the helpers :mod:`.save` and :mod:`.load` both use (tensor hashing, sizes,
config and class import)."""

from __future__ import annotations

import hashlib
import importlib
import json
import math
from typing import Any

import torch
from torch import nn

from oelm.errors import OELMError
from oelm.init import RANDOM_INITS  # noqa: F401 - re-exported: the init kinds that draw from the seed

CHECKPOINT_FORMAT = "oelm-lean-checkpoint"
FORMAT_VERSION = 1
WEIGHTS_NAME = "oelm_model.safetensors"
METADATA_NAME = "oelm_checkpoint.json"


class CheckpointError(OELMError, ValueError):
    """A checkpoint directory is missing, incomplete, of another format, or does not fit the model."""


class CheckpointMismatchError(CheckpointError):
    """A frozen tensor regenerated on load differs from the one the checkpoint was trained with.

    Attributes:
        tensor: the first parameter name whose sha256 (or dtype/shape) differs.
        mismatched: every parameter name that differs.
    """

    def __init__(self, message: str, *, tensor: str, mismatched: list[str]) -> None:
        super().__init__(message)
        self.tensor = tensor
        self.mismatched = mismatched


def tensor_sha256(tensor: torch.Tensor) -> str:
    """sha256 (hex) of the raw bytes of ``tensor`` as a contiguous CPU tensor (any dtype, any shape).

    Only the bytes are hashed; compare dtype and shape separately (the checkpoint stores both).
    """
    t = tensor.detach().cpu().contiguous().reshape(-1)
    return hashlib.sha256(t.view(torch.uint8).numpy()).hexdigest()


_ST_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}


def safetensors_size(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> int:
    """Size in bytes of the safetensors file that would hold ``tensors``, computed without writing it.

    A safetensors file is an 8-byte header length, a compact JSON header (``__metadata__`` first,
    then one entry ``{"dtype", "shape", "data_offsets"}`` per tensor in data order: larger
    element size first, then by name) padded with spaces to a multiple of 8, then the raw data.
    The result equals the written file's size byte for byte when all tensors have distinct element
    sizes or one dtype (checked in the tests against real files); otherwise the offsets' digit
    counts may differ by a few bytes in total.
    """
    order = sorted(tensors.items(), key=lambda kv: (-kv[1].element_size(), kv[0]))
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    for name, t in order:
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": _ST_DTYPES.get(t.dtype, "F32"), "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    n = len(json.dumps(header, separators=(",", ":")).encode("utf-8"))
    n = 8 * math.ceil(n / 8)
    return 8 + n + offset


def _unwrap(model: nn.Module) -> nn.Module:
    """The model inside DistributedDataParallel / DataParallel / torch.compile wrappers."""
    from accelerate.utils import extract_model_from_parallel

    return extract_model_from_parallel(model, keep_torch_compile=False)


def _persistent_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """Persistent buffers by state-dict name (non-persistent ones are not in the state dict)."""
    return {k: v for k, v in model.state_dict(keep_vars=True).items() if not isinstance(v, nn.Parameter)}


def _versions() -> dict[str, str | None]:
    import safetensors

    import oelm

    try:
        import transformers

        tf_version = transformers.__version__
    except ImportError:  # pragma: no cover - transformers is a dependency
        tf_version = None
    return {"oelm": oelm.__version__, "torch": torch.__version__, "transformers": tf_version, "safetensors": safetensors.__version__}


def _config_dict(model: nn.Module) -> tuple[str | None, dict[str, Any] | None]:
    config = getattr(model, "config", None)
    if config is None:
        return None, None
    cls = f"{type(config).__module__}.{type(config).__qualname__}"
    try:
        if hasattr(config, "to_json_string"):  # Hugging Face PretrainedConfig
            return cls, json.loads(config.to_json_string())
        if hasattr(config, "to_dict"):
            return cls, json.loads(json.dumps(config.to_dict()))
    except (TypeError, ValueError):
        pass
    return cls, None


#: Module prefixes whose classes a checkpoint's ``model_class`` / ``model_config_class`` may name
#: without the caller's opt-in (``load_oelm(..., allow_model_class=...)``).
TRUSTED_MODEL_CLASS_PREFIXES = ("oelm.", "transformers.")


def _import_object(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _import_class(dotted: Any, field: str, allowed: tuple[str, ...], ask: str) -> type:
    """Import the class a checkpoint names in ``field``, only under a trusted or opted-in module
    prefix: the metadata is data, and importing a module runs its code.

    Raises:
        CheckpointError: the name is outside ``allowed`` (names the class and the opt-in), cannot
            be imported, or is not a class.
    """
    if not isinstance(dotted, str) or not dotted.startswith(allowed):
        raise CheckpointError(
            f"the checkpoint's {field} {dotted!r} is not a class of {' or '.join(p.rstrip('.') for p in allowed)}; "
            f"refusing to import it. If you trust this checkpoint, pass allow_model_class=({dotted.rpartition('.')[0] + '.'!r},) "
            f"to oelm.load_oelm, or {ask[0].lower() + ask[1:]}"
        )
    try:
        obj = _import_object(dotted)
    except (ImportError, AttributeError, ValueError) as exc:
        raise CheckpointError(f"cannot import the recorded {field} {dotted!r} ({exc}). {ask}") from None
    if not isinstance(obj, type) or not (obj.__module__ + ".").startswith(allowed):
        raise CheckpointError(f"the recorded {field} {dotted!r} is not a class defined under {allowed}. {ask}")
    return obj


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"
