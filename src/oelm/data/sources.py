"""Your own data: a dataset a config names by its files or by a Hugging Face ``datasets`` id
(``task.source``), turned into a :class:`~oelm.data.registry.DatasetSpec` and registered under
``task.dataset``, so that it is loaded, checked and recorded exactly as a shipped dataset is.

    task:
      dataset: my-reviews                      # a name of your own (not a shipped dataset's)
      source:
        files: {train: reviews/train.csv, validation: reviews/dev.csv, test: reviews/test.csv}
        text_columns: [review]                 # or two columns: a sentence pair
        label_column: stars_binary             # integer ids 0..n-1, or the names in label_names
        label_names: [negative, positive]

File formats, by name: ``.csv``, ``.tsv``, ``.jsonl`` and ``.parquet`` are tables (one row per
example; :mod:`oelm.data.tables`); ``.txt`` and ``.txt.gz`` are plain UTF-8 text for language
modelling (documents separated by ``<|endoftext|>``; a file without it is one document). A dataset
of text files is a language-modelling task unless ``type`` says otherwise; tables are
classification unless ``type: language_modeling`` (then ``text_columns[0]`` holds the documents).
Paths are read where they point (:func:`~oelm.data.registry.find_local_files`: an absolute path
needs no data dir); the config resolves relative ones against the working directory.

The Hub form names ``hub`` (the ``datasets`` id), ``hub_config`` and ``hub_splits`` (our split ->
the Hub's; default train, validation and test as named) with the same columns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from oelm.data.registry import DATASETS, DatasetSpec, register_dataset
from oelm.errors import ConfigError

__all__ = ["FILE_FORMATS", "OWN_DATA", "file_format", "is_own_data", "register_source", "source_spec"]

#: file name endings -> DatasetSpec local format (tables: oelm.data.tables; eot_text: oelm.data.lm)
FILE_FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".parquet": "parquet",
                ".txt": "eot_text", ".txt.gz": "eot_text"}

#: DatasetSpec.source of every dataset registered from a config
OWN_DATA = "your own data (task.source of the config)"

_FROM_CONFIG: set[str] = set()  # names registered by register_source (a later config may replace them)


def file_format(path: str) -> str:
    """The local format of ``path`` from its name (:data:`FILE_FORMATS`).

    Raises:
        ConfigError: an unknown ending (names the file and the known endings).
    """
    name = Path(path).name.lower()
    for ending in sorted(FILE_FORMATS, key=len, reverse=True):  # .txt.gz before .gz-less endings
        if name.endswith(ending):
            return FILE_FORMATS[ending]
    raise ConfigError(f"task.source.files: {path}: unknown file type; use {', '.join(FILE_FORMATS)}")


def _split_formats(files: Mapping[str, Any]) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    local: dict[str, tuple[str, ...]] = {}
    formats: dict[str, str] = {}
    for split, paths in files.items():
        paths = (paths,) if isinstance(paths, str) else tuple(paths)
        if not paths:
            raise ConfigError(f"task.source.files.{split}: no file given; name one or more files")
        kinds = {file_format(p) for p in paths}
        if len(kinds) > 1:
            raise ConfigError(f"task.source.files.{split}: the files of one split must have one format, got "
                              f"{', '.join(sorted(kinds))}")
        local[split], formats[split] = paths, kinds.pop()
    return local, formats


def source_spec(name: str, source: Mapping[str, Any]) -> DatasetSpec:
    """The :class:`DatasetSpec` of ``task.source`` (the keys of :class:`oelm.config.DatasetSource`).

    Raises:
        ConfigError: neither or both of ``files`` and ``hub``; a file type not in
            :data:`FILE_FORMATS`; one split with several formats; text files for a
            classification task; ``label_names`` for language modelling.
    """
    files, hub = source.get("files"), source.get("hub")
    if bool(files) == bool(hub):
        raise ConfigError("task.source: give exactly one of files (local files) and hub (a Hugging Face datasets id)")
    local, formats = _split_formats(files) if files else ({}, {})
    text_only = bool(formats) and set(formats.values()) == {"eot_text"}
    task_type = source.get("type") or ("language_modeling" if text_only else "classification")
    lm = task_type == "language_modeling"
    if not lm and "eot_text" in formats.values():
        split = next(s for s, f in formats.items() if f == "eot_text")
        raise ConfigError(f"task.source.files.{split}: a classification dataset needs tables with text and label columns "
                          f"(.csv, .tsv, .jsonl, .parquet), not text files; for language modelling set "
                          "task.source.type: language_modeling")
    if lm and source.get("label_names"):
        raise ConfigError("task.source.label_names: labels belong to classification; remove them for language modelling")
    hub_splits = source.get("hub_splits") or ({"train": "train", "validation": "validation", "test": "test"} if hub else {})
    return DatasetSpec(
        name=name,
        task_type=task_type,
        metric="perplexity" if lm else "accuracy",
        hub_id=hub,
        hub_config=source.get("hub_config"),
        local_files=local,
        hub_splits=hub_splits,
        text_columns=tuple(source.get("text_columns") or ("text",)),
        label_column=None if lm else (source.get("label_column") or "label"),
        label_names=None if lm or not source.get("label_names") else tuple(source["label_names"]),
        validation_holdout=source.get("validation_holdout"),
        local_formats=formats,
        source=OWN_DATA,
    )


def register_source(name: str, source: Mapping[str, Any]) -> DatasetSpec:
    """Register :func:`source_spec` ``(name, source)`` under ``name`` and return it. A name an
    earlier config registered is replaced (the same process may read several configs).

    Raises:
        ConfigError: ``name`` is a shipped or library-registered dataset (name yours otherwise),
            or the source is invalid (:func:`source_spec`).
    """
    if name in DATASETS and name not in _FROM_CONFIG:
        raise ConfigError(f"task.dataset {name!r} is a registered dataset ({DATASETS[name].source or 'registered'}); give "
                          f"your own data another name (e.g. {name}-own)")
    spec = source_spec(name, source)
    register_dataset(spec, overwrite=True)
    _FROM_CONFIG.add(name)
    return spec


def is_own_data(spec: DatasetSpec) -> bool:
    """Whether ``spec`` came from a config's ``task.source`` (its messages then point there, not
    at shared/data)."""
    return spec.source == OWN_DATA
