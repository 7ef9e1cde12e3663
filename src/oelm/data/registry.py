"""Dataset registry: task name → where the data lives, how it is laid out, how it is scored.

Every task oelm can train on is one :class:`DatasetSpec` in :data:`DATASETS`. A spec says

* where each split lives under a *data dir* (a folder laid out like ``shared/data``, see its
  ``MANIFEST.md``) and, as a fallback, on the Hugging Face Hub;
* which columns hold the text and the label, and what the labels mean;
* the documented row counts, and the caveats of the local copies (partial samples, test sets
  whose labels come from elsewhere, ...).

Lookup order for one split (used by :mod:`oelm.data.classification` and :mod:`oelm.data.lm`):

1. the data dir: the ``data_dir`` argument, else ``$OELM_DATA_DIR`` (:func:`resolve_data_dir`);
   a data dir that is set but does not exist is an error, not a silent fall-through;
2. the Hub, ``datasets.load_dataset(hub_id, hub_config, split=hub_splits[split])``, unless the
   Hub is offline (``HF_HUB_OFFLINE=1``), which is checked first so the failure is immediate;
3. otherwise :class:`~oelm.errors.DataNotFoundError`, naming the local path(s) looked for and
   the Hub id, and how to fix it.

Splits without a published validation set (IMDB, AG News, OpenWebText) get one by holding out a
fixed fraction of train (:attr:`DatasetSpec.validation_holdout`, :func:`holdout_indices`): a seeded
permutation, so "train" and "validation" are disjoint and identical on every machine.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import numpy as np

from oelm.data.catalog import SHIPPED
from oelm.data.dataset_spec import DatasetSpec
from oelm.errors import ConfigError, DataFormatError, DataNotFoundError
from oelm.io import inside

__all__ = [
    "DATASETS",
    "DatasetSpec",
    "available_splits",
    "find_local_files",
    "get_dataset_spec",
    "holdout_indices",
    "hub_offline",
    "load_hub_split",
    "register_dataset",
    "resolve_data_dir",
    "resolve_split",
]

DATASETS: dict[str, DatasetSpec] = {}


def register_dataset(spec: DatasetSpec, *, overwrite: bool = False) -> None:
    """Add ``spec`` to :data:`DATASETS` under ``spec.name``.

    Raises:
        ConfigError: the name is taken by a different spec and ``overwrite`` is False.
    """
    old = DATASETS.get(spec.name)
    if old is not None and old != spec and not overwrite:
        raise ConfigError(f"dataset {spec.name!r} is already registered; pass overwrite=True to replace it")
    DATASETS[spec.name] = spec


for _spec in SHIPPED.values():  # the datasets oelm ships: DATASETS is full whenever the registry is imported
    register_dataset(_spec)


def get_dataset_spec(name: str) -> DatasetSpec:
    """The registered spec for ``name``.

    Raises:
        ConfigError: unknown name (the message lists the registered ones).
    """
    try:
        return DATASETS[name]
    except KeyError:
        raise ConfigError(f"unknown dataset {name!r}; registered datasets: {', '.join(sorted(DATASETS))}") from None


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The data dir to read local files from: ``data_dir`` if given, else ``$OELM_DATA_DIR``, else None.

    Only resolves the name; whether the folder exists is checked by :func:`find_local_files`.
    """
    if data_dir is not None and str(data_dir) != "":
        return Path(data_dir).expanduser()
    env = os.environ.get("OELM_DATA_DIR", "").strip()
    return Path(env).expanduser() if env else None


def available_splits(spec: DatasetSpec) -> list[str]:
    """Every split name :func:`resolve_split` accepts for ``spec``."""
    splits = list(dict.fromkeys([*spec.local_files, *spec.hub_splits]))
    if spec.validation_holdout is not None and "validation" not in splits:
        splits.insert(1 if splits and splits[0] == "train" else 0, "validation")
    return splits


def resolve_split(spec: DatasetSpec, split: str) -> tuple[str, Literal["train", "validation"] | None]:
    """Where ``split`` comes from: ``(stored split, part)``.

    ``part`` is None for a stored split, or "train" / "validation" when the spec holds validation
    out of train (then the stored split is "train" and the caller keeps the matching part).

    Raises:
        ConfigError: the split does not exist for this dataset (the message lists those that do).
    """
    if spec.validation_holdout is not None and split in ("train", "validation"):
        return "train", split  # type: ignore[return-value]
    if split in spec.local_files or split in spec.hub_splits:
        return split, None
    raise ConfigError(f"dataset {spec.name!r} has no split {split!r}; available: {', '.join(available_splits(spec))}")


def holdout_indices(n: int, fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Split ``range(n)`` into (train, validation) row indices, each sorted ascending.

    ``round(fraction * n)`` rows (at least 1) go to validation, chosen by a seeded permutation.
    ``numpy.random.RandomState`` is used on purpose: its stream is frozen across NumPy versions,
    so the same seed gives the same hold-out everywhere.
    """
    n_val = min(max(1, round(fraction * n)), n - 1) if n > 1 else 0
    perm = np.random.RandomState(seed).permutation(n)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def hub_offline() -> bool:
    """True when the Hugging Face Hub must not be contacted (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``).

    The environment is read directly (``huggingface_hub`` only reads it once, at import), so a
    test or a user can switch the Hub off after import.
    """
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return True
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return False
    return bool(getattr(constants, "HF_HUB_OFFLINE", False))


def _dir_origin(data_dir: str | os.PathLike | None) -> str:
    if data_dir is not None and str(data_dir) != "":
        return "the data_dir argument"
    return "$OELM_DATA_DIR"


def _layout_hint(spec: DatasetSpec, split: str) -> str:
    example = spec.local_files.get(split) or next(iter(spec.local_files.values()), ())
    path = f"<dir>/{example[0]}" if example else f"<dir>/{spec.name}/..."
    return f"set OELM_DATA_DIR or data_dir to a folder laid out like shared/data: {path}"


def _label(spec: DatasetSpec, split: str, requested: str | None) -> str:
    if requested and requested != split:
        return f"{spec.name}/{requested} (held out from {split})"
    return f"{spec.name}/{split}"


def find_local_files(
    spec: DatasetSpec, split: str, data_dir: str | os.PathLike | None = None, requested: str | None = None
) -> list[Path] | None:
    """The local files of a *stored* split, or None when they are not there (then try the Hub).

    ``requested``: the split the caller asked for, when it differs (a hold-out of train); used in
    messages only. A split whose paths are all absolute (your own data, ``task.source.files``) is
    read from there, whatever the data dir, and is never looked for on the Hub.

    Raises:
        DataNotFoundError: a data dir is set but is not a folder, or only some of the split's
            files exist (a half-copied split is never silently replaced by the Hub copy).
        DataFormatError: a split's file path is a directory (or another non-file).
        OutsideFolderError: a split's file in the data dir is a symbolic link that leads outside it
            (:func:`oelm.io.inside`; links within the data dir are followed).
    """
    own = [Path(p) for p in spec.local_files.get(split, ())]
    if own and all(p.is_absolute() for p in own):  # files named where they are: no data dir involved
        return _own_files(spec, split, own, requested)
    root = resolve_data_dir(data_dir)
    if root is None:
        return None
    if not root.is_dir():
        expected = ", ".join(str(root / p) for p in spec.local_files.get(split, ())) or str(root / spec.name)
        raise DataNotFoundError(
            f"{_label(spec, split, requested)}: data dir {root} (from {_dir_origin(data_dir)}) does not exist or is not a folder; "
            f"expected {expected}. Fix: {_layout_hint(spec, split)}, or unset it to use the Hugging Face Hub"
            + (f" ({spec.hub_id})" if spec.hub_id else "")
            + "."
        )
    rel = spec.local_files.get(split, ())
    paths = [inside(root, p, follow_links=True) for p in rel]  # a link leading out of the data dir: refused
    odd = [p for p in paths if p.exists() and not p.is_file()]
    if odd:  # not "not found": it is there, as the wrong kind of thing
        raise DataFormatError(f"{_label(spec, split, requested)}: {odd[0]} is a directory (or another non-file), not the "
                              f"{spec.local_format(split)} file of this split. Fix: replace it with the file from shared/data "
                              "(MANIFEST.md).")
    present = [p for p in paths if p.is_file()]
    if paths and len(present) == len(paths):
        return paths
    if present:
        missing = [str(p) for p in paths if not p.is_file()]
        raise DataNotFoundError(
            f"{_label(spec, split, requested)}: only {len(present)} of the {len(paths)} files of this split are under {root}; "
            f"missing: {', '.join(missing)}. Fix: copy the missing files (layout of shared/data, see its MANIFEST.md)."
        )
    return None


def _own_files(spec: DatasetSpec, split: str, paths: list[Path], requested: str | None) -> list[Path]:
    """``paths`` when every one is a file; else one line naming the first that is not."""
    for path in paths:
        if not path.is_file():
            what = "is a directory (or another non-file)" if path.exists() else "does not exist"
            error = DataFormatError if path.exists() else DataNotFoundError
            raise error(f"{_label(spec, split, requested)}: {path} {what}. Fix: correct the path in task.source.files "
                        f"(relative paths are resolved against the folder oelm runs in).")
    return paths


def _not_found(
    spec: DatasetSpec, split: str, data_dir: str | os.PathLike | None, why_not_hub: str, requested: str | None
) -> DataNotFoundError:
    root = resolve_data_dir(data_dir)
    rel = spec.local_files.get(split, ())
    hub = f"Hub {spec.hub_id}" + (f" (config {spec.hub_config})" if spec.hub_config else "") if spec.hub_id else "no Hub copy"
    if root is None and rel:  # the usual first miss (a plain shell): a short line, no notes
        return DataNotFoundError(
            f"{_label(spec, split, requested)}: no data dir is set; {hub}: {why_not_hub}. Fix: set OELM_DATA_DIR or "
            f"pass --data-dir DIR (oelm run/plan/inspect/report), a folder laid out like shared/data with <dir>/{rel[0]}."
        )
    if root is None:
        local = "no data dir is set (data_dir=None and $OELM_DATA_DIR is unset)"
    elif rel:
        local = f"not found under the data dir: {', '.join(str(root / p) for p in rel)}"
    else:
        local = f"this split is not stored locally in oelm's layout (data dir {root})"
    on_hub = bool(spec.hub_id) and split in spec.hub_splits
    if rel:
        fix = _layout_hint(spec, split) + (", or allow Hub access (oelm --online, or unset HF_HUB_OFFLINE; with network)" if on_hub else "")
    else:
        fix = "allow Hub access (oelm --online, or unset HF_HUB_OFFLINE; with network)" if on_hub else "use another split"
    note = f" Note: {spec.notes}" if spec.notes else ""
    return DataNotFoundError(f"{_label(spec, split, requested)}: {local}; {hub}: {why_not_hub}. Fix: {fix}.{note}")


def load_hub_split(spec: DatasetSpec, split: str, data_dir: str | os.PathLike | None = None, requested: str | None = None):
    """``datasets.load_dataset(spec.hub_id, spec.hub_config, split=spec.hub_splits[split])``.

    Call only when :func:`find_local_files` returned None. Returns a ``datasets.Dataset``.

    Raises:
        DataNotFoundError: no Hub copy of this split, the Hub is offline (checked before any
            network access, so this is immediate), or the download fails. The message names the
            local path(s) looked for, the Hub id and the fix.
    """
    if not spec.hub_id or split not in spec.hub_splits:
        why = "has no such split" if spec.hub_id else "not available"
        raise _not_found(spec, split, data_dir, why, requested)
    if hub_offline():
        raise _not_found(spec, split, data_dir, "not tried because the Hub is offline (HF_HUB_OFFLINE=1)", requested)
    hub_split = spec.hub_splits[split]
    try:
        import datasets

        return datasets.load_dataset(spec.hub_id, spec.hub_config, split=hub_split)
    except Exception as exc:  # network, auth, missing config, ... all mean: not available here
        why = f"download of split {hub_split!r} failed ({type(exc).__name__}: {exc})"
        raise _not_found(spec, split, data_dir, why, requested) from exc

