"""Shared parts of oelm's checkpoints (:mod:`oelm.checkpoint`): the file names and format, the
errors (defined in :mod:`oelm.errors`), :func:`regenerate` (a recipe applied to a fresh base), and
the helpers the savers and loaders share (tensor hashing, sizes, config and class import)."""

from __future__ import annotations

import importlib
import json
import math
from typing import Any

import torch
from torch import nn

from oelm._version import __version__
from oelm.architectures import architecture_from_dict, set_architecture
from oelm.errors import CheckpointError, CheckpointMismatchError, ConfigError, UnsupportedModelError
from oelm.method.apply import apply_oelm
from oelm.method.checkpoint_record import keep_recipe_on_config, tensor_sha256
from oelm.method.config import OELMConfig

__all__ = [
    "CHECKPOINT_FORMAT", "FORMAT_VERSION", "WEIGHTS_NAME", "METADATA_NAME", "CheckpointError",
    "CheckpointMismatchError", "tensor_sha256", "safetensors_size", "regenerate", "reapply", "oelm_config_from",
    "refreeze", "check_frozen", "mismatch_causes",
]

CHECKPOINT_FORMAT = "oelm-lean-checkpoint"
FORMAT_VERSION = 1
WEIGHTS_NAME = "oelm_model.safetensors"
METADATA_NAME = "oelm_checkpoint.json"


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


def _set_recorded_architecture(model: nn.Module, architecture: dict[str, Any] | None, where: str) -> None:
    """Put a recorded architecture spec (``apply_oelm(..., target_modules=...)``) back on ``model``."""
    if architecture is None:
        return
    try:
        set_architecture(model, architecture_from_dict(architecture, source=f"{where}: architecture"))
    except (ConfigError, UnsupportedModelError) as exc:
        raise CheckpointError(f"{exc}; build base_model as the checkpoint's architecture") from None


def regenerate(model: nn.Module, config: Any, architecture: dict[str, Any] | None = None, where: str = "checkpoint") -> None:
    """Apply the recorded method ``config`` (an ``OELMConfig``, with its seed) to the fresh base
    ``model`` (with its recorded ``architecture`` spec, if any): the one place a loader
    regenerates frozen tensors from a recipe."""
    _set_recorded_architecture(model, architecture, where)
    apply_oelm(model, config)


def _unwrap(model: nn.Module) -> nn.Module:
    """The model inside DistributedDataParallel / DataParallel / torch.compile wrappers."""
    from accelerate.utils import extract_model_from_parallel  # accelerate only when a wrapped model is saved/loaded

    return extract_model_from_parallel(model, keep_torch_compile=False)


def _fresh_base(base_model: nn.Module) -> nn.Module:
    """The unwrapped ``base_model``, refused when ``apply_oelm`` already ran on it."""
    model = _unwrap(base_model)
    if getattr(model, "oelm_config", None) is not None:
        raise CheckpointError(
            f"base_model ({type(model).__name__}) already went through apply_oelm ({model.oelm_config.method!r}); "
            "pass a fresh base model: load_oelm applies the recorded method itself"
        )
    return model


def _persistent_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """Persistent buffers by state-dict name (non-persistent ones are not in the state dict)."""
    return {k: v for k, v in model.state_dict(keep_vars=True).items() if not isinstance(v, nn.Parameter)}


def _versions() -> dict[str, str | None]:
    import safetensors

    try:
        import transformers

        tf_version = transformers.__version__
    except ImportError:  # pragma: no cover - transformers is a dependency
        tf_version = None
    return {"oelm": __version__, "torch": torch.__version__, "transformers": tf_version, "safetensors": safetensors.__version__}


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


def oelm_config_from(meta: dict[str, Any], where: str = METADATA_NAME) -> OELMConfig:
    """The :class:`~oelm.method.OELMConfig` a checkpoint records under ``"oelm_config"`` (a lean
    checkpoint's metadata or a recipe), or a :class:`CheckpointError` naming ``where``."""
    d = dict(meta["oelm_config"])
    d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}  # JSON lists -> tuple fields
    # Checkpoints written before OELMConfig.split_fused existed: methods without Q/K targets kept
    # fused Q/K/V modules fused, so their parameter names only fit split_fused=False.
    d.setdefault("split_fused", False)
    try:
        return OELMConfig(**d)
    except ConfigError as exc:  # a hand-edited field: name the file it came from
        raise CheckpointError(f"{where}: its oelm_config is invalid ({exc}); save the checkpoint again") from None
    except TypeError as exc:
        raise CheckpointError(
            f"the checkpoint's oelm_config {meta['oelm_config']} does not fit this oelm's OELMConfig ({exc}); it was "
            f"written by oelm {meta.get('versions', {}).get('oelm')}"
        ) from None


def reapply(model: nn.Module, config: Any, architecture: dict[str, Any] | None = None, where: str = "checkpoint") -> None:
    """Apply the recorded method to a model that already holds the trained tensors, frozen ones
    included: split and freeze as ``config`` says without initializing anything
    (``init="none"``, no mimetic value/output draw over the trained V/O, a head temperature at 1
    with the biases kept: the caller loads the trained one); ``model.oelm_config`` is then the
    recorded config, so a later save records the same recipe."""
    _set_recorded_architecture(model, architecture, where)
    temperature = None if config.head_temperature is None else 1.0
    apply_oelm(model, config.replace(init="none", mimetic_value_output=False, head_temperature=temperature))
    model.oelm_config = config
    keep_recipe_on_config(model)  # a base model's config carries the recorded config, not init="none"


def refreeze(params: dict[str, nn.Parameter], frozen: dict[str, Any], config: Any, written_by: Any) -> None:
    """Freeze the recorded frozen parameters the method did not freeze (frozen by the user beyond
    the method), and refuse a parameter the method froze that the record lists as trained."""
    for name in frozen:
        params[name].requires_grad_(False)
    extra = sorted(n for n, p in params.items() if not p.requires_grad and n not in frozen)
    if extra:
        raise CheckpointError(
            f"applying the recorded method {config.method!r} froze {extra[:5]}, which the checkpoint records as "
            f"trained: the oelm version differs from the one that saved it ({written_by})"
        )


def mismatch_causes(source: str | None, config: Any, saved_torch: str | None) -> str:
    """The likely causes of a frozen tensor that differs from its record, as one clause list."""
    causes = []
    if source:
        causes.append(f"the base model was not built from the recorded source {source!r}")
    else:
        causes.append("the base model was not built the same way (same config and torch.manual_seed) as the original")
    if config.draws_random:
        causes.append(f"a different seed (the checkpoint records seed={config.seed})")
    if saved_torch != torch.__version__:
        causes.append(f"a different torch version (saved with {saved_torch}, now {torch.__version__})")
    else:
        causes.append("a different torch/BLAS build, device or dtype than when it was saved")
    return "; ".join(causes)


def check_frozen(params: dict[str, nn.Parameter], frozen: dict[str, dict[str, Any]], config: Any, causes: str,
                 origin: str = "regenerated by") -> None:
    """Every recorded frozen tensor has its recorded dtype, shape and sha256. ``origin`` says where
    the tensors came from in the message (``"regenerated by"`` the method, ``"loaded for"`` it).

    Raises:
        CheckpointMismatchError: names the first tensor that differs, how, and ``causes``.
    """
    bad = [
        n for n, rec in frozen.items()
        if str(params[n].dtype) != rec["dtype"] or list(params[n].shape) != rec["shape"] or tensor_sha256(params[n]) != rec["sha256"]
    ]
    if not bad:
        return
    p, rec = params[bad[0]], frozen[bad[0]]
    if str(p.dtype) != rec["dtype"] or list(p.shape) != rec["shape"]:
        detail = f"{p.dtype} {list(p.shape)} vs recorded {rec['dtype']} {rec['shape']}"
    else:
        detail = "sha256 differs"
    raise CheckpointMismatchError(
        f"frozen tensor {bad[0]!r} {origin} {config.method!r} does not match the checkpoint ({detail}; "
        f"{len(bad)} of {len(frozen)} frozen tensors differ). Likely causes: {causes}.",
        tensor=bad[0],
        mismatched=bad,
    )
