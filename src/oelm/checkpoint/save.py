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

from oelm.errors import ConfigError
from oelm.io import atomic_path, sha256_file, write_json_atomic
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
    frozen_stored = config.seed is None and config.draws_random and bool(frozen)
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
