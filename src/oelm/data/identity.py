"""What data an experiment read, bound to its content: per split, the sha256 of the bytes of every
file it was read from (or, for a Hub copy, the Hub id, config and split).

    split_source(spec, "train", data_dir, cache)  → {"split": "train", "sha256": ..., "files": [{path, bytes, sha256}]}
    data_source(task, spec, tokenizer_record, cache)
                                                  → {"dataset", "splits": {train, validation, test}, "tokenizer"}
    source_change(recorded, current)              → None, or the one line that says what changed

A matrix records :func:`data_source` in ``experiment.json`` (``data``) and in every run's
``result.json`` (``data_source``); a rerun compares it before training (:mod:`oelm.matrix.output`),
so a matrix continued with other data (another ``OELM_DATA_DIR``, other text under the same file
names, another tokenizer) is refused with one line. Paths are shown, not compared: the same bytes
under another data dir are the same data.

Hashing is cheap (the files are read anyway) and cached: a file's sha256 is remembered under
``cache/<sha256 of its absolute path>.json`` with its size and modification time
(``st_mtime_ns``), and recomputed when either changes.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

from oelm.data.cache import linked_entry, write_text_cache
from oelm.errors import DataFormatError
from oelm.data.registry import DatasetSpec, find_local_files, resolve_split

__all__ = ["file_sha256", "split_source", "data_source", "source_change", "split_file_problem"]

#: (absolute path, size, mtime_ns) -> sha256, for this process
_FILE_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str | os.PathLike, cache: str | os.PathLike | None = None) -> str:
    """The sha256 (hex) of the bytes of ``path``, remembered by (absolute path, size, mtime) in
    this process and, with ``cache``, in ``cache/<key>.json`` (an entry that does not parse or
    describes another file or state is recomputed and rewritten; a cache that cannot be written
    is a warning, :func:`oelm.data.cache.write_text_cache`).

    Raises:
        OSError: ``path`` cannot be read.
    """
    file = Path(path).absolute()
    stat = file.stat()
    state = (str(file), stat.st_size, stat.st_mtime_ns)
    if state in _FILE_DIGESTS:
        return _FILE_DIGESTS[state]
    entry = Path(cache) / f"{hashlib.sha256(str(file).encode()).hexdigest()[:24]}.json" if cache is not None else None
    if entry is not None and linked_entry(entry):
        entry = None  # a link planted in the cache: neither read nor written through
    digest = None
    if entry is not None:
        try:
            found = json.loads(entry.read_text(encoding="utf-8"))
            if [found.get("path"), found.get("bytes"), found.get("mtime_ns")] == list(state):
                digest = found.get("sha256") if isinstance(found.get("sha256"), str) else None
        except (OSError, ValueError, AttributeError):  # absent, damaged or not an object: hash the file again
            digest = None
    if digest is None:
        h = hashlib.sha256()
        with open(file, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        digest = h.hexdigest()
        if entry is not None:
            record = {"path": state[0], "bytes": state[1], "mtime_ns": state[2], "sha256": digest}
            write_text_cache(entry, json.dumps(record), "file hash cache")
    _FILE_DIGESTS[state] = digest
    return digest


def split_source(spec: DatasetSpec, split: str, data_dir: str | os.PathLike | None = None,
                 cache: str | os.PathLike | None = None) -> dict[str, Any]:
    """Where ``spec``'s ``split`` is read from, by content: ``{"split", "sha256", "files": [{path,
    bytes, sha256}]}`` for local files (``sha256`` over the files' hashes in order; a split held out
    of train also has ``"held_out_of": "train"``), or ``{"split", "hub": {id, config, split}}``
    when the split comes from the Hub (its content is not hashed).

    Raises:
        ConfigError / DataNotFoundError / DataFormatError: as :func:`~oelm.data.registry.find_local_files`.
    """
    stored, part = resolve_split(spec, split)
    paths = find_local_files(spec, stored, data_dir, split)
    record: dict[str, Any] = {"split": split}
    if part is not None:
        record["held_out_of"] = stored
    if paths is None:
        return record | {"hub": {"id": spec.hub_id, "config": spec.hub_config, "split": spec.hub_splits.get(stored)}}
    files = [{"path": str(p), "bytes": p.stat().st_size, "sha256": file_sha256(p, cache)} for p in paths]
    combined = hashlib.sha256("|".join(f["sha256"] for f in files).encode()).hexdigest()
    return record | {"sha256": combined, "files": files}


def _roles(task: Any, spec: DatasetSpec) -> dict[str, tuple[str, str]]:
    """role (train, validation, test) -> (the split the task names for it, the stored split it reads)."""
    roles = {"train": task.train_split, "validation": task.validation_split, "test": task.test_split}
    return {role: (split, resolve_split(spec, split)[0]) for role, split in roles.items() if split}


def _shared(files: Mapping[str, list[tuple[Any, str]]], stored: Mapping[str, str]) -> str | None:
    """The first file (``(key, path)`` per role, equal keys: the same file) that two roles reading
    different stored splits share, as the refusal line; None when they share none."""
    seen: dict[Any, tuple[str, str]] = {}
    for role, entries in files.items():
        for key, path in entries:
            first = seen.setdefault(key, (role, path))
            if first[0] != role and stored[first[0]] != stored[role]:
                same = "" if first[1] == path else f" (as {path})"
                return (f"the file {first[1]} is both the {first[0]} split and the {role} split{same}: a model would be "
                        f"scored on rows it trained or was selected on; give the {role} split its own file")
    return None


def split_file_problem(task: Any, spec: DatasetSpec) -> str | None:
    """Why ``task`` (a :class:`~oelm.config.TaskConfig`) reads one file as two of its splits (train,
    validation, test), by path: the same file, a link to it or a hard link; None when it does not.
    Files not there yet are left to the data's own checks (the same file copied under another name
    is found by its sha256 in :func:`data_source`)."""
    roles = _roles(task, spec)
    files: dict[str, list[tuple[Any, str]]] = {}
    for role, (split, stored) in roles.items():
        try:
            paths = find_local_files(spec, stored, task.data_dir, split) or []
        except OSError:  # DataNotFoundError: named when the data is read
            return None
        files[role] = [((p.stat().st_dev, p.stat().st_ino), str(p)) for p in paths if p.is_file()]
    return _shared(files, {role: stored for role, (_, stored) in roles.items()})


def data_source(task: Any, spec: DatasetSpec, tokenizer_record: Mapping[str, Any] | None,
                cache: str | os.PathLike | None = None) -> dict[str, Any]:
    """The data one experiment reads (``task``: its :class:`~oelm.config.TaskConfig`):
    ``{"dataset", "splits": {"train": ..., "validation": ..., "test": ...}, "tokenizer": {spec,
    sha256}}``, each split a :func:`split_source` of the split the task names for that role.

    Raises:
        DataFormatError: two roles that name different splits read a file of the same content (the
            same sha256: a copy of one file under two names), one line naming it."""
    roles = _roles(task, spec)
    splits = {role: split_source(spec, split, task.data_dir, cache) for role, (split, _) in roles.items()}
    problem = _shared({role: [(f["sha256"], f["path"]) for f in s.get("files", [])] for role, s in splits.items()},
                      {role: stored for role, (_, stored) in roles.items()})
    if problem:
        raise DataFormatError(f"{spec.name}: {problem.replace('the file', 'the content of', 1)}")
    tokenizer = {k: tokenizer_record[k] for k in ("spec", "sha256") if k in tokenizer_record} if tokenizer_record else None
    return {"dataset": spec.name, "splits": splits, "tokenizer": tokenizer}


def _content(split: Mapping[str, Any]) -> Any:
    return split.get("sha256") or split.get("hub")


def _where(split: Mapping[str, Any]) -> str:
    if split.get("files"):
        return ", ".join(f["path"] for f in split["files"])
    hub = split.get("hub") or {}
    return f"Hub {hub.get('id')} ({hub.get('config') or 'default'}, split {hub.get('split')})"


def _short(split: Mapping[str, Any]) -> str:
    return f"sha256 {split['sha256'][:12]}" if split.get("sha256") else "its Hub copy"


def source_change(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> str | None:
    """None when ``current`` (:func:`data_source`) reads the same data as ``recorded``: the same
    content for every split both name and the same tokenizer sha256; else what changed, in one
    line, e.g. ``sst2/train: /data/sst2/train.parquet has sha256 1a2b3c4d5e6f, the runs here read
    sha256 9f8e7d6c5b4a (/old/sst2/train.parquet)``. Parts that ``recorded`` lacks are not compared."""
    dataset = current.get("dataset")
    for role, split in (current.get("splits") or {}).items():
        before = (recorded.get("splits") or {}).get(role)
        if before and _content(before) != _content(split):
            return (f"{dataset}/{split.get('split')} ({role}): {_where(split)} has {_short(split)}, the runs here read "
                    f"{_short(before)} ({_where(before)})")
    old, new = recorded.get("tokenizer") or {}, current.get("tokenizer") or {}
    if old.get("sha256") and new.get("sha256") and old["sha256"] != new["sha256"]:
        return (f"tokenizer {new.get('spec')}: sha256 {new['sha256'][:12]}, the runs here used {old.get('spec')} with "
                f"sha256 {old['sha256'][:12]}")
    return None
