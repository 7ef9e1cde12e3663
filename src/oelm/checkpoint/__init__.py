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

Seed ``None`` with a random draw (``OELMConfig.draws_random``: an init kind of
:data:`RANDOM_INITS`, read from the init table :data:`oelm.method.config.INIT_KINDS`, or reservoir layers, or a
fixed attention map, which are drawn from the seed as well and so regenerated and checked the same
way): the draw came
from torch's global random state and cannot be regenerated, so :func:`save_pretrained` stores the
frozen tensors too (with a :class:`UserWarning`), records ``"frozen_tensors_stored": true``, and
the checkpoint is then about as large as a full one. Pass a seed to ``apply_oelm`` to stay lean.

Parameters the user froze beyond the method (e.g. embeddings frozen by hand) are recorded as
frozen; on load they are frozen again and checked against the base model's values like the rest.

All writes are atomic: a temporary file beside the target, fsync, rename, fsync of the directory.

Hugging Face-layout checkpoints (``config.json`` with the recipe under ``"oelm"``, weights in the
stock layout: what ``model.save_pretrained`` of an OELM model and ``Trainer`` write, see
:mod:`oelm.method.checkpoint_record`) load through the same ``load_oelm`` (:mod:`.stock`).

Layout: :mod:`.common` (file names, errors, the recipe checks and :func:`regenerate`, the one call
that applies a recorded method to a fresh base), :mod:`.save`, :mod:`.load` (lean), :mod:`.stock`
(Hugging Face layout); every public name is importable from ``oelm.checkpoint``.
"""

from oelm.checkpoint.common import (
    CHECKPOINT_FORMAT,
    WEIGHTS_NAME,
    METADATA_NAME,
    CheckpointError,
    CheckpointMismatchError,
    regenerate,
    tensor_sha256,
    safetensors_size,
)
from oelm.checkpoint.load import load_oelm
from oelm.checkpoint.save import SaveReport, save_pretrained
from oelm.method.config import RANDOM_INITS

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
    "regenerate",
]
