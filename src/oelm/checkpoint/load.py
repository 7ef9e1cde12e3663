"""``load_oelm``: rebuild the frozen tensors on a fresh base model, check them against their
sha256 and load the stored ones strictly (see :mod:`oelm.checkpoint`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from oelm.errors import ConfigError
from oelm.io import read_json, sha256_file
from oelm.checkpoint.common import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    CheckpointMismatchError,
    FORMAT_VERSION,
    METADATA_NAME,
    TRUSTED_MODEL_CLASS_PREFIXES,
    _import_class,
    _persistent_buffers,
    _unwrap,
    tensor_sha256,
)


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
    if config.draws_random:
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
