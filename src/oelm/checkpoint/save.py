"""``save_pretrained``: write the trained tensors and the metadata that regenerates the frozen ones
(see :mod:`oelm.checkpoint`)."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from oelm.architectures import ARCHITECTURE_ATTRIBUTE, architecture_to_dict
from oelm.checkpoint.common import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    FORMAT_VERSION,
    METADATA_NAME,
    WEIGHTS_NAME,
    _config_dict,
    _mb,
    _persistent_buffers,
    _unwrap,
    _versions,
    safetensors_size,
    tensor_sha256,
)
from oelm.errors import ConfigError
from oelm.io import atomic_path, sha256_file, write_json_atomic
from oelm.method.marks import treated_modules


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
    model, config, directory = _checked_arguments(model, directory)
    if source is None:
        source = getattr(getattr(model, "config", None), "_name_or_path", None) or None
    params = dict(model.named_parameters())  # a tied weight once
    trainable = {n: p for n, p in params.items() if p.requires_grad}
    frozen = {n: p for n, p in params.items() if not p.requires_grad}
    buffers = _persistent_buffers(model)
    frozen_stored = _frozen_must_be_stored(config, bool(frozen))
    stored = _tensors_to_store({**trainable, **buffers, **(frozen if frozen_stored else {})})
    weights = _write_weights(directory / WEIGHTS_NAME, stored)
    weights.update(trainable=sorted(trainable), buffers=sorted(buffers))
    full_tensors = dict(params) | buffers
    metadata = _metadata(model, config, source, frozen_stored, weights, frozen)
    metadata["sizes"] = {
        "weights_bytes": weights["bytes"],
        "full_safetensors_bytes": safetensors_size(full_tensors, {"format": "pt"}),
        "stored_numel": sum(t.numel() for t in stored.values()),
        "total_numel": sum(t.numel() for t in full_tensors.values()),
    }
    metadata_path = directory / METADATA_NAME
    write_json_atomic(metadata_path, metadata)
    return _report(directory, metadata, metadata_path.stat().st_size, len(frozen))


def _checked_arguments(model: Any, directory: Any) -> tuple[nn.Module, Any, Path]:
    """The unwrapped model, its ``oelm_config`` and the directory, or one clear error."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"oelm.save_pretrained(model, directory) expects a torch.nn.Module first, got {type(model).__name__}")
    if not isinstance(directory, (str, os.PathLike)) or not str(directory).strip():
        raise TypeError(f"oelm.save_pretrained: directory must be a non-empty path (str or Path), got {directory!r}")
    model = _unwrap(model)
    config = getattr(model, "oelm_config", None)
    held = [name for name, _ in treated_modules(model) if name]
    if (config is None or not hasattr(config, "to_dict")) and held:
        raise ConfigError(
            f"{type(model).__name__} did not go through apply_oelm itself, its {held[0]!r} did: save that module, "
            f"oelm.save_pretrained(model.{held[0]}, directory)"
        )
    if config is None or not hasattr(config, "to_dict"):
        raise ConfigError(
            f"{type(model).__name__} has no oelm_config: call oelm.apply_oelm(model, method, seed=...) before "
            "oelm.save_pretrained (apply_oelm(model, 'baseline') saves an unmodified model)"
        )
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise CheckpointError(f"oelm.save_pretrained: {directory} is a file, not a directory; give a directory path "
                              "(created if missing)")
    return model, config, directory


def _frozen_must_be_stored(config: Any, any_frozen: bool) -> bool:
    """True (with a warning) when the frozen tensors came from an unseeded random draw."""
    stored = config.seed is None and config.draws_random and any_frozen
    if stored:
        warnings.warn(
            f"oelm.save_pretrained: method {config.method!r} drew its frozen Q/K (init={config.init!r}) from torch's "
            "global random state (seed None), which cannot be regenerated; the frozen tensors are stored too, so the "
            "checkpoint is not lean. Pass seed=... to apply_oelm to store only what trains.",
            UserWarning,
            stacklevel=3,
        )
    return stored


def _tensors_to_store(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU copies-or-views; a tensor sharing memory with an earlier one is cloned
    (safetensors refuses tensors that share memory)."""
    stored: dict[str, torch.Tensor] = {}
    seen_storages: set[int] = set()
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        if t.untyped_storage().data_ptr() in seen_storages and t.numel():
            t = t.clone()
        seen_storages.add(t.untyped_storage().data_ptr())
        stored[name] = t
    return stored


def _write_weights(path: Path, stored: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Write ``stored`` atomically as safetensors; the record ``{"file", "bytes", "sha256"}``."""
    from safetensors.torch import save_file  # safetensors' torch half imports only on save

    with atomic_path(path) as tmp:
        save_file(stored, str(tmp), metadata={"format": "pt", "oelm_format": CHECKPOINT_FORMAT})
        return {"file": path.name, "bytes": tmp.stat().st_size, "sha256": sha256_file(tmp)}


def _metadata(model: nn.Module, config: Any, source: str | None, frozen_stored: bool, weights: dict[str, Any],
              frozen: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The JSON record of a lean checkpoint (see the module docstring), without ``sizes``."""
    config_cls, config_dict = _config_dict(model)
    first = next(iter(model.parameters()), None)
    return {
        "format": CHECKPOINT_FORMAT,
        "format_version": FORMAT_VERSION,
        "method": config.method,
        "seed": config.seed,
        "oelm_config": config.to_dict(),
        "source": source,
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "model_config_class": config_cls,
        "model_config": config_dict,
        "dtype": str(first.dtype) if first is not None else None,
        "versions": _versions(),
        "frozen_tensors_stored": frozen_stored,
        "weights": weights,
        "frozen": {n: {"dtype": str(p.dtype), "shape": list(p.shape), "sha256": tensor_sha256(p)} for n, p in frozen.items()},
        **_architecture_record(model),
    }


def _architecture_record(model: nn.Module) -> dict[str, Any]:
    """``{"architecture": ...}`` when ``apply_oelm`` got ``target_modules`` (the loader needs the
    names to find the projections again), else ``{}``."""
    own = vars(model).get(ARCHITECTURE_ATTRIBUTE)
    return {"architecture": architecture_to_dict(own)} if own is not None else {}


def _report(directory: Path, metadata: dict[str, Any], metadata_bytes: int, frozen_tensors: int) -> SaveReport:
    sizes = metadata["sizes"]
    files = {WEIGHTS_NAME: sizes["weights_bytes"], METADATA_NAME: metadata_bytes}
    written, full = sum(files.values()), sizes["full_safetensors_bytes"]
    return SaveReport(
        directory=directory,
        files=files,
        bytes_written=written,
        full_bytes=full,
        saved_percent=100.0 * (1.0 - written / full) if full else 0.0,
        stored_numel=sizes["stored_numel"],
        total_numel=sizes["total_numel"],
        frozen_tensors=frozen_tensors,
        frozen_stored=bool(metadata["frozen_tensors_stored"]),
        metadata=metadata,
    )
