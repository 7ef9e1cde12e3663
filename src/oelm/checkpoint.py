"""Lean OELM checkpoints: store only what trained, regenerate the frozen Q/K on load.

An OELM model's frozen tensors (the attention query/key projections, plus whatever else the
method froze) never change during training, and they are a deterministic function of the base
model and the method: ``oelm_freeze`` orthogonalizes the base weights per head (a QR
decomposition), the random ablations draw from ``OELMConfig.seed``. So a checkpoint needs only
the trained tensors and enough metadata to rebuild the rest, in the spirit of PEFT's
``save_pretrained`` / ``PeftModel.from_pretrained(base, dir)``::

    report = oelm.save_pretrained(model, "runs/sst2-oelm")     # SaveReport: bytes, % saved
    model = oelm.load_oelm("runs/sst2-oelm", base_model=fresh)  # fresh = built like the original base

A checkpoint directory holds two files:

``oelm_model.safetensors``
    every trainable parameter (``requires_grad=True``; a tied weight once, under the name
    ``named_parameters()`` gives it) and every *persistent* buffer (buffers are stored whole:
    they are small, and some, like BatchNorm running statistics, change in training without
    being parameters). Frozen parameters are left out, except in the one case below.
``oelm_checkpoint.json``
    the method (:meth:`OELMConfig.to_dict`), its seed, the source checkpoint id
    (``model.config._name_or_path`` or ``source=``), the model and config classes and the model
    config, the oelm/torch/transformers/safetensors versions, the sha256 (with dtype and shape)
    of every frozen tensor, and the weights file's size and sha256. It is written last, so a
    directory with a JSON always has the weights that JSON describes (a weights file from an
    interrupted later save is detected by its sha256).

Loading applies the recorded method with the recorded seed to a fresh base model, checks every
regenerated frozen tensor against its sha256 (:class:`CheckpointMismatchError` names the first
tensor that differs and the likely causes), then loads the stored tensors strictly (a missing or
unexpected name, shape or dtype -> :class:`CheckpointError`). Since ``apply_oelm`` runs on the
fresh base before any tensor is restored, a method that restructures modules (e.g. splits a
fused QKV projection into separate q/k/v linears) is reproduced first, and the names match.

Seed ``None`` with a random initialization (``init`` in :data:`RANDOM_INITS`): the draw came
from torch's global random state and cannot be regenerated, so :func:`save_pretrained` stores the
frozen tensors too (with a :class:`UserWarning`), records ``"frozen_tensors_stored": true``, and
the checkpoint is then about as large as a full one. Pass a seed to ``apply_oelm`` to stay lean.

Parameters the user froze beyond the method (e.g. embeddings frozen by hand) are recorded as
frozen; on load they are frozen again and checked against the base model's values like the rest.

All writes are atomic: a temporary file beside the target, fsync, rename, fsync of the directory.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from oelm.errors import ConfigError, OELMError
from oelm.io import atomic_path, read_json, sha256_file, write_json_atomic

__all__ = [
    "CHECKPOINT_FORMAT",
    "WEIGHTS_NAME",
    "METADATA_NAME",
    "RANDOM_INITS",
    "CheckpointError",
    "CheckpointMismatchError",
    "SaveReport",
    "save_pretrained",
    "load_oelm",
    "tensor_sha256",
    "safetensors_size",
]

CHECKPOINT_FORMAT = "oelm-lean-checkpoint"
FORMAT_VERSION = 1
WEIGHTS_NAME = "oelm_model.safetensors"
METADATA_NAME = "oelm_checkpoint.json"
#: ``OELMConfig.init`` values that draw random numbers (from ``OELMConfig.seed``).
RANDOM_INITS = frozenset({"random_orthogonal", "normal"})


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


# --------------------------------------------------------------------------------------------
# Small helpers: hashing, sizes, atomic files
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# save_pretrained
# --------------------------------------------------------------------------------------------


@dataclass
class SaveReport:
    """What :func:`save_pretrained` wrote and how much it saved.

    Attributes:
        directory: the checkpoint directory.
        files: file name -> size in bytes, for the files written (weights + JSON metadata).
        bytes_written: sum of ``files`` (bytes).
        full_bytes: bytes of a plain safetensors checkpoint of the same model (every parameter,
            a tied one once, plus persistent buffers; metadata ``{"format": "pt"}`` as Hugging
            Face writes), computed with :func:`safetensors_size` without writing it.
        saved_percent: ``100 * (1 - bytes_written / full_bytes)`` (%).
        stored_numel / total_numel: scalars stored / in the full checkpoint.
        frozen_tensors: number of frozen parameters recorded by sha256.
        frozen_stored: True when the frozen tensors were stored as well (seed None with a random
            initialization; see the module docstring).
    """

    directory: Path
    files: dict[str, int]
    bytes_written: int
    full_bytes: int
    saved_percent: float
    stored_numel: int
    total_numel: int
    frozen_tensors: int
    frozen_stored: bool = False
    metadata: dict[str, Any] = field(default_factory=dict, repr=False)

    def __str__(self) -> str:
        return (
            f"lean checkpoint {self.directory}: {_mb(self.bytes_written)} written vs {_mb(self.full_bytes)} "
            f"for a full safetensors checkpoint ({self.saved_percent:.2f}% saved; "
            f"{self.frozen_tensors} frozen tensors {'stored' if self.frozen_stored else 'regenerated on load'})"
        )


def save_pretrained(model: nn.Module, directory: str | os.PathLike, *, source: str | None = None) -> SaveReport:
    """Save a lean OELM checkpoint of ``model`` (which went through :func:`oelm.apply_oelm`).

    Stores every trainable parameter and persistent buffer as safetensors, and the metadata that
    :func:`load_oelm` needs to regenerate and verify the frozen tensors (see the module
    docstring for the exact contents). DistributedDataParallel / DataParallel / ``torch.compile``
    wrappers are unwrapped; in a DDP job call it on rank 0 only.

    Args:
        model: a model on which ``apply_oelm`` ran (``model.oelm_config`` is set); any device.
        directory: created if missing; an older checkpoint there is replaced file by file.
        source: id of the base checkpoint the model was built from (a Hub id, a local directory,
            or an oelm packaged alias); default ``model.config._name_or_path``. Recorded so that
            ``load_oelm(directory)`` can rebuild the base without ``base_model``.

    Returns:
        :class:`SaveReport` with the bytes written and the % saved against a full checkpoint.

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` or ``directory`` not a path.
        ConfigError: ``model`` has no ``oelm_config`` (``apply_oelm`` was never called; use the
            ``"baseline"`` method to save an unmodified model this way).

    Warns:
        UserWarning: seed None with a random initialization; frozen tensors are stored too.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"oelm.save_pretrained(model, directory) expects a torch.nn.Module first, got {type(model).__name__}")
    if not isinstance(directory, (str, os.PathLike)) or not str(directory).strip():
        raise TypeError(f"oelm.save_pretrained: directory must be a non-empty path (str or Path), got {directory!r}")
    model = _unwrap(model)
    config = getattr(model, "oelm_config", None)
    if config is None or not hasattr(config, "to_dict"):
        raise ConfigError(
            f"{type(model).__name__} has no oelm_config: call oelm.apply_oelm(model, method, seed=...) before "
            "oelm.save_pretrained (apply_oelm(model, 'baseline') saves an unmodified model)"
        )
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise CheckpointError(f"oelm.save_pretrained: {directory} is a file, not a directory; give a directory path "
                              "(created if missing)")
    if source is None:
        source = getattr(getattr(model, "config", None), "_name_or_path", None) or None

    params = dict(model.named_parameters())  # a tied weight once
    trainable = {n: p for n, p in params.items() if p.requires_grad}
    frozen = {n: p for n, p in params.items() if not p.requires_grad}
    buffers = _persistent_buffers(model)
    frozen_stored = config.seed is None and config.init in RANDOM_INITS and bool(frozen)
    if frozen_stored:
        warnings.warn(
            f"oelm.save_pretrained: method {config.method!r} drew its frozen Q/K (init={config.init!r}) from torch's "
            "global random state (seed None), which cannot be regenerated; the frozen tensors are stored too, so the "
            "checkpoint is not lean. Pass seed=... to apply_oelm to store only what trains.",
            UserWarning,
            stacklevel=2,
        )

    stored: dict[str, torch.Tensor] = {}
    seen_storages: set[int] = set()
    for name, t in [*trainable.items(), *buffers.items(), *(frozen.items() if frozen_stored else ())]:
        t = t.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen_storages and t.numel():  # safetensors refuses tensors that share memory
            t = t.clone()
        seen_storages.add(t.untyped_storage().data_ptr())
        stored[name] = t

    weights_path = directory / WEIGHTS_NAME
    with atomic_path(weights_path) as tmp:
        from safetensors.torch import save_file

        save_file(stored, str(tmp), metadata={"format": "pt", "oelm_format": CHECKPOINT_FORMAT})
        weights_sha = sha256_file(tmp)
        weights_bytes = tmp.stat().st_size

    config_cls, config_dict = _config_dict(model)
    full_tensors = {n: p for n, p in params.items()} | buffers
    full_bytes = safetensors_size(full_tensors, {"format": "pt"})
    metadata: dict[str, Any] = {
        "format": CHECKPOINT_FORMAT,
        "format_version": FORMAT_VERSION,
        "method": config.method,
        "seed": config.seed,
        "oelm_config": config.to_dict(),
        "source": source,
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "model_config_class": config_cls,
        "model_config": config_dict,
        "dtype": str(next(iter(params.values())).dtype) if params else None,
        "versions": _versions(),
        "frozen_tensors_stored": frozen_stored,
        "weights": {
            "file": WEIGHTS_NAME,
            "bytes": weights_bytes,
            "sha256": weights_sha,
            "trainable": sorted(trainable),
            "buffers": sorted(buffers),
        },
        "frozen": {
            n: {"dtype": str(p.dtype), "shape": list(p.shape), "sha256": tensor_sha256(p)} for n, p in frozen.items()
        },
        "sizes": {
            "weights_bytes": weights_bytes,
            "full_safetensors_bytes": full_bytes,
            "stored_numel": sum(t.numel() for t in stored.values()),
            "total_numel": sum(t.numel() for t in full_tensors.values()),
        },
    }
    metadata_path = directory / METADATA_NAME
    write_json_atomic(metadata_path, metadata)

    files = {WEIGHTS_NAME: weights_bytes, METADATA_NAME: metadata_path.stat().st_size}
    written = sum(files.values())
    return SaveReport(
        directory=directory,
        files=files,
        bytes_written=written,
        full_bytes=full_bytes,
        saved_percent=100.0 * (1.0 - written / full_bytes) if full_bytes else 0.0,
        stored_numel=metadata["sizes"]["stored_numel"],
        total_numel=metadata["sizes"]["total_numel"],
        frozen_tensors=len(frozen),
        frozen_stored=frozen_stored,
        metadata=metadata,
    )


# --------------------------------------------------------------------------------------------
# load_oelm
# --------------------------------------------------------------------------------------------


def _read_metadata(directory: Path) -> dict[str, Any]:
    meta_path = directory / METADATA_NAME
    if not directory.exists():
        raise CheckpointError(f"{directory} does not exist; give the directory oelm.save_pretrained(model, directory) wrote")
    if not meta_path.is_file():
        raise CheckpointError(
            f"{directory} is not an oelm checkpoint: {METADATA_NAME} is missing. Save one with "
            "oelm.save_pretrained(model, directory)."
        )
    try:
        meta = read_json(meta_path)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {meta_path}: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{meta_path} is not an {CHECKPOINT_FORMAT} file (format={meta.get('format') if isinstance(meta, dict) else None!r})")
    if meta.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointError(
            f"{meta_path} has format_version {meta['format_version']}, newer than this oelm reads "
            f"({FORMAT_VERSION}); upgrade oelm"
        )
    return meta


def _oelm_config_from(meta: dict[str, Any], where: str = METADATA_NAME):
    from oelm.method import OELMConfig

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


def _build_base(meta: dict[str, Any], directory: Path, allowed: tuple[str, ...] = TRUSTED_MODEL_CLASS_PREFIXES) -> nn.Module:
    """Rebuild the base model from the recorded source, offline only; else a clear error. The
    recorded classes are imported only from module prefixes in ``allowed``, and no code shipped
    with the source checkpoint runs (``trust_remote_code=False``)."""
    from oelm.models.pretrained import _directory_problem, resolve_pretrained

    source = meta.get("source")
    ask = (
        f"Pass base_model=<a fresh model built the same way as the original base> to oelm.load_oelm("
        f"{str(directory)!r}, base_model=...)"
    )
    if not source:
        raise CheckpointError(
            f"cannot rebuild the base model of {directory}: no source checkpoint was recorded (the model was built "
            f"from a config, e.g. random weights, model class {meta.get('model_class')}). {ask}, e.g. built from the "
            "same config with the same torch.manual_seed."
        )
    model_cls = _import_class(meta.get("model_class"), "model_class", allowed, ask)
    config_cls = _import_class(meta["model_config_class"], "model_config_class", allowed, ask) if meta.get("model_config_class") else None
    if not hasattr(model_cls, "from_pretrained"):
        raise CheckpointError(f"the recorded model class {meta['model_class']} has no from_pretrained. {ask}")
    location = resolve_pretrained(source)
    kwargs: dict[str, Any] = {}
    if config_cls is not None and meta.get("model_config") and hasattr(config_cls, "from_dict"):
        kwargs["config"] = config_cls.from_dict(meta["model_config"])
    if (meta.get("dtype") or "").startswith("torch."):
        kwargs["dtype"] = getattr(torch, meta["dtype"].removeprefix("torch."))
    if not Path(location).is_dir():
        kwargs["local_files_only"] = True  # never download: only a copy already in the HF cache
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "newly initialized head" is expected: the head is in the checkpoint
    try:
        # a concrete class runs no auto_map code, but its from_pretrained passes trust_remote_code on
        # (e.g. to a custom generate function shipped with the checkpoint): never
        return model_cls.from_pretrained(location, trust_remote_code=False, **kwargs)
    except (OSError, ValueError) as exc:
        if Path(location).is_dir():
            raise CheckpointError(
                f"cannot rebuild the base model from the recorded source {source!r}: the directory {location} "
                f"{_directory_problem(Path(location), exc)}. {ask}"
            ) from None
        raise CheckpointError(
            f"cannot rebuild the base model from the recorded source {source!r} offline (not a local directory, not "
            f"an oelm packaged checkpoint, not in the Hugging Face cache: {type(exc).__name__}). {ask}"
        ) from None
    finally:
        hf_logging.set_verbosity(verbosity)


def _mismatch_causes(meta: dict[str, Any], config) -> str:
    causes = []
    if meta.get("source"):
        causes.append(f"the base model was not built from the recorded source {meta['source']!r}")
    else:
        causes.append("the base model was not built the same way (same config and torch.manual_seed) as the original")
    if config.init in RANDOM_INITS:
        causes.append(f"a different seed (the checkpoint records seed={config.seed})")
    recorded = meta.get("versions", {})
    if recorded.get("torch") != torch.__version__:
        causes.append(f"a different torch version (saved with {recorded.get('torch')}, now {torch.__version__})")
    else:
        causes.append("a different torch/BLAS build, device or dtype than when it was saved")
    return "; ".join(causes)


def load_oelm(directory: str | os.PathLike, base_model: nn.Module | None = None, *,
              allow_model_class: str | tuple[str, ...] = ()) -> nn.Module:
    """Rebuild a trained OELM model from a lean checkpoint written by :func:`save_pretrained`.

    Steps: read the metadata; take ``base_model`` (or rebuild the base from the recorded source
    when it is available offline); apply the recorded OELM method with the recorded seed
    (``apply_oelm``: pretrained Q/K are orthogonalized again, random draws repeated from the
    seed, fused projections split as at save time); freeze parameters the user had frozen
    beyond the method; check every frozen tensor's dtype, shape and sha256 against the record;
    then copy the stored tensors in, strictly.

    Args:
        directory: a directory written by :func:`save_pretrained`.
        base_model: a fresh model built the same way as the original base (same checkpoint, or
            same config and ``torch.manual_seed``), on any device; modified in place and returned.
            None: rebuilt from the recorded ``source`` (a local directory, an oelm packaged
            checkpoint such as ``sentence-transformers/all-MiniLM-L6-v2``, or a copy in the Hugging
            Face cache) with the recorded model class, config and dtype; never downloaded.
        allow_model_class: module prefixes (e.g. ``"mypkg."``) whose classes the checkpoint's
            ``model_class`` / ``model_config_class`` may also name when the base is rebuilt.
            Without it only oelm's own and ``transformers`` classes are imported: the metadata
            is data, and importing a module it names would run that module's code.

    Returns:
        The model in eval mode (as ``from_pretrained`` returns one; call ``.train()`` to go on
        training), with ``model.oelm_config`` / ``model.oelm_report`` set as by ``apply_oelm``.

    Raises:
        TypeError: ``directory`` is not a path (a model passed first, say) or ``base_model`` not
            an ``nn.Module``.
        CheckpointError: not an oelm checkpoint, weights file missing or not the one the metadata
            describes (sha256), base not rebuildable offline (asks for ``base_model``), a recorded
            class outside ``oelm.``/``transformers.``/``allow_model_class`` (names it), a stored
            tensor missing from or unexpected in the model, or a shape/dtype that differs.
        CheckpointMismatchError: a regenerated frozen tensor differs from the recorded one; the
            message names the tensor and the likely causes (different base checkpoint, seed or
            torch version).
    """
    from safetensors.torch import load_file

    from oelm.method import apply_oelm

    if isinstance(directory, nn.Module):
        raise TypeError(f"oelm.load_oelm(directory, base_model=None): the first argument is the checkpoint directory, got a "
                        f"{type(directory).__name__}; call load_oelm(directory, base_model=model)")
    if not isinstance(directory, (str, os.PathLike)) or not str(directory).strip():
        raise TypeError(f"oelm.load_oelm: directory must be a non-empty path (str or Path), got {directory!r}")
    if base_model is not None and not isinstance(base_model, nn.Module):
        raise TypeError(f"oelm.load_oelm: base_model must be a torch.nn.Module or None, got {type(base_model).__name__}")
    directory = Path(directory)
    meta = _read_metadata(directory)
    weights_path = directory / meta["weights"]["file"]
    if not weights_path.is_file():
        raise CheckpointError(f"{directory}: the weights file {weights_path.name} is missing; the checkpoint is incomplete")
    if weights_path.stat().st_size != meta["weights"]["bytes"] or sha256_file(weights_path) != meta["weights"]["sha256"]:
        raise CheckpointError(
            f"{weights_path} is not the file {METADATA_NAME} describes (size or sha256 differs): the checkpoint was "
            "modified or a later save was interrupted. Save it again."
        )
    config = _oelm_config_from(meta, str(directory / METADATA_NAME))
    frozen_stored = bool(meta.get("frozen_tensors_stored"))
    if base_model is not None:
        model = _unwrap(base_model)
        if getattr(model, "oelm_config", None) is not None:
            raise CheckpointError(
                f"base_model ({type(model).__name__}) already went through apply_oelm ({model.oelm_config.method!r}); "
                "pass a fresh base model: load_oelm applies the recorded method itself"
            )
    else:
        if isinstance(allow_model_class, str):
            allow_model_class = (allow_model_class,)
        model = _build_base(meta, directory, TRUSTED_MODEL_CLASS_PREFIXES + tuple(allow_model_class))

    # The recorded method, with its seed; when the frozen draw was not reproducible (seed None),
    # only the freezing (and any restructuring) is repeated and the stored frozen tensors are used.
    apply_oelm(model, config.replace(init="none") if frozen_stored else config)
    params = dict(model.named_parameters())
    frozen_meta: dict[str, dict[str, Any]] = meta["frozen"]
    recorded_trainable = set(meta["weights"]["trainable"])
    recorded = set(frozen_meta) | recorded_trainable
    not_in_ckpt, not_in_model = sorted(set(params) - recorded), sorted(recorded - set(params))
    if not_in_ckpt or not_in_model:
        raise CheckpointError(
            f"the checkpoint does not fit the model: parameter(s) of the model not in the checkpoint {not_in_ckpt[:5]}"
            f"{' ...' if len(not_in_ckpt) > 5 else ''}; parameter(s) of the checkpoint not in the model "
            f"{not_in_model[:5]}{' ...' if len(not_in_model) > 5 else ''}. Build base_model as "
            f"{meta.get('model_class')} from {meta.get('source') or 'the same config'}."
        )
    for name in frozen_meta:  # frozen by the user beyond the method
        params[name].requires_grad_(False)
    extra_frozen = sorted(n for n, p in params.items() if not p.requires_grad and n not in frozen_meta)
    if extra_frozen:
        raise CheckpointError(
            f"applying the recorded method {config.method!r} froze {extra_frozen[:5]}, which the checkpoint records as "
            f"trained: the oelm version differs from the one that saved it ({meta.get('versions', {}).get('oelm')})"
        )

    stored = load_file(str(weights_path))
    buffers = _persistent_buffers(model)
    expected = recorded_trainable | set(meta["weights"]["buffers"]) | (set(frozen_meta) if frozen_stored else set())
    if set(stored) != expected:
        raise CheckpointError(f"{weights_path} holds other tensors than {METADATA_NAME} lists; save the checkpoint again")
    missing_buffers = sorted(set(meta["weights"]["buffers"]) ^ set(buffers))
    if missing_buffers:
        raise CheckpointError(
            f"persistent buffer(s) {missing_buffers[:5]} are in only one of the model and the checkpoint; build "
            f"base_model as {meta.get('model_class')} from {meta.get('source') or 'the same config'}"
        )
    targets: dict[str, torch.Tensor] = dict(params) | buffers
    for name, value in stored.items():
        target = targets[name]
        if target.shape != value.shape or target.dtype != value.dtype:
            raise CheckpointError(
                f"tensor {name!r}: the checkpoint has {value.dtype} {list(value.shape)}, the model "
                f"{target.dtype} {list(target.shape)}; build base_model with the same config and dtype"
            )

    if frozen_stored:
        with torch.no_grad():
            for name in frozen_meta:
                params[name].copy_(stored[name])
    bad = []
    for name, rec in frozen_meta.items():
        p = params[name]
        if str(p.dtype) != rec["dtype"] or list(p.shape) != rec["shape"] or tensor_sha256(p) != rec["sha256"]:
            bad.append(name)
    if bad:
        p, rec = params[bad[0]], frozen_meta[bad[0]]
        detail = (
            f"{p.dtype} {list(p.shape)} vs recorded {rec['dtype']} {rec['shape']}"
            if str(p.dtype) != rec["dtype"] or list(p.shape) != rec["shape"]
            else "sha256 differs"
        )
        raise CheckpointMismatchError(
            f"frozen tensor {bad[0]!r} regenerated by {config.method!r} does not match the checkpoint ({detail}; "
            f"{len(bad)} of {len(frozen_meta)} frozen tensors differ). Likely causes: {_mismatch_causes(meta, config)}.",
            tensor=bad[0],
            mismatched=bad,
        )

    with torch.no_grad():
        for name, value in stored.items():
            if name not in frozen_meta:
                targets[name].copy_(value)
    return model.eval()
