"""Damaged cache files (:mod:`oelm.data.lm`'s token streams and trained tokenizers,
:mod:`oelm.data.classification`'s encodings): a cache that cannot be read back is named in a
warning, deleted and built again, never a traceback and never silently used.

Each cache file also carries the *identity* of what it encodes (:func:`identity_problem`): the
content hash of its documents or texts, the tokenizer, the lengths, and a label such as
``sst2/validation``. A file whose identity is not the one asked for (another split's cache copied
over this name) is named in a warning and rebuilt, never used. In a cache folder that cannot be
written (read-only), a damaged or foreign entry is a warning and the data is built again without
the cache.

A cache entry that is a symbolic link, or sits in a linked folder of the cache, is never read or
written through (:func:`linked_entry`, :func:`oelm.io.inside`): a warning, the link itself removed,
and the data built again."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from oelm.errors import OutsideFolderError
from oelm.io import inside

__all__ = [
    "FOREIGN",
    "linked_entry",
    "drop_damaged_cache",
    "identity_array",
    "identity_problem",
    "read_identity",
    "load_array_cache",
    "load_digest_cache",
    "load_token_cache",
    "write_array_cache",
    "write_text_cache",
    "write_token_cache",
]


def drop_damaged_cache(path: Path, problem: str, state: str = "is damaged") -> None:
    """Warn that the cache file (or folder) ``path`` is damaged (or, ``state="holds other data"``,
    encodes other data: :func:`identity_problem`) and remove it, so that it is rebuilt. Where it
    cannot be removed (a read-only cache folder), the warning says so and the caller builds the
    data again without that cache entry."""
    try:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    except OSError as exc:
        warnings.warn(f"oelm cache {path} {state} ({problem}) and cannot be deleted ({exc.strerror or exc}); "
                      "building it again without the cache (set OELM_CACHE_DIR to a writable folder)", stacklevel=3)
        return
    warnings.warn(f"oelm cache {path} {state} ({problem}); deleting it and building it again", stacklevel=3)


def linked_entry(path: Path, depth: int = 2) -> bool:
    """Whether the cache entry ``path`` may not be used because it, or one of the ``depth - 1``
    folders above it inside the cache (``tokens/``, ``tokenizers/<key>/``, ...), is a symbolic link
    (:func:`oelm.io.inside` from the cache's root): then a warning names it, the link is removed when
    the entry itself is one (never what it points to), and the caller builds the data without it."""
    root = path.parents[depth - 1]
    try:
        inside(root, path.relative_to(root))
    except OutsideFolderError as exc:
        where, link = str(exc).split(": oelm reads", 1)[0], path.is_symlink()
        if link:
            path.unlink(missing_ok=True)
        warnings.warn(f"oelm cache {where}: a cache entry is never read or written through a link; "
                      f"{'removed the link, ' if link else ''}building the data again", stacklevel=3)
        return True
    return False


#: drop_damaged_cache's state for an entry whose identity is not the one asked for
FOREIGN = "holds other data"


def identity_array(identity: Mapping[str, Any]) -> np.ndarray:
    """``identity`` as a 0-d unicode array (JSON), to be stored beside the data in an ``.npz``."""
    return np.array(json.dumps(dict(identity), sort_keys=True))


def read_identity(arrays: Mapping[str, np.ndarray]) -> dict[str, Any] | None:
    """The identity stored by :func:`identity_array` under ``arrays["identity"]``, or None."""
    raw = arrays.get("identity")
    if raw is None or raw.shape != () or raw.dtype.kind != "U":
        return None
    try:
        found = json.loads(str(raw))
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def identity_problem(found: Mapping[str, Any] | None, expected: Mapping[str, Any]) -> str | None:
    """None when ``found`` agrees with ``expected`` on every key of ``expected`` except ``what``;
    else the first difference in words, e.g. ``encodes sst2/train (texts sha256 1a2b3c4d5e6f),
    not sst2/validation (texts sha256 9f8e7d6c5b4a)``. ``what`` (a label such as
    ``sst2/validation``) is shown, never compared: the same texts under another name are the same
    cache."""
    if found is None:
        return "carries no identity of what it encodes"
    for key, value in expected.items():
        if key != "what" and found.get(key) != value:
            def shown(record: Mapping[str, Any]) -> str:
                v = record.get(key)
                v = f"{v[:12]}" if isinstance(v, str) and len(v) > 12 else v
                return f"{record.get('what') or '?'} ({key.replace('_', ' ')} {v})"
            return f"encodes {shown(found)}, not {shown(expected)}"
    return None


def load_token_cache(path: Path, dtype: np.dtype, vocab_size: int,
                     identity: Mapping[str, Any] | None = None) -> np.ndarray | None:
    """The cached token stream at ``path`` (an ``.npz`` of ``tokens`` and ``identity``), or None
    (after a warning, the file deleted) when it is damaged: unreadable or truncated, not a 1-D
    array of ``dtype``, ids outside the vocabulary, or (``identity`` given) the stream of other
    documents or another tokenizer (:func:`identity_problem`)."""
    arrays = load_array_cache(path)
    if arrays is None:
        return None
    stream = arrays.get("tokens")
    if stream is None:
        drop_damaged_cache(path, f"holds arrays {sorted(arrays)}, expected tokens and identity")
        return None
    if stream.ndim != 1 or stream.dtype != dtype:
        drop_damaged_cache(path, f"holds a {stream.dtype} array of shape {stream.shape}, expected 1-D {dtype}")
        return None
    if stream.size and int(stream.max()) >= vocab_size:
        drop_damaged_cache(path, f"holds id {int(stream.max())}, outside the tokenizer's {vocab_size} ids")
        return None
    if identity is not None:
        found = read_identity(arrays)
        problem = identity_problem(found, identity)
        if problem is not None:
            drop_damaged_cache(path, problem, FOREIGN)
            return None
        if found.get("tokens") != len(stream):
            drop_damaged_cache(path, f"holds {len(stream)} tokens, its identity says {found.get('tokens')}")
            return None
    return stream


def write_token_cache(path: Path, stream: np.ndarray, identity: Mapping[str, Any] | None = None) -> None:
    """Write ``stream`` (and its ``identity``, with ``tokens`` = its length) to the ``.npz``
    ``path`` atomically (a concurrent reader sees nothing or the whole file). A directory in the
    way is removed as damaged; a cache folder that cannot be written (a file, no permission,
    read-only, disk full) is a warning and no cache: the stream is already computed."""
    arrays = {"tokens": stream, "identity": identity_array({**(identity or {}), "tokens": int(len(stream))})}
    _write_atomically(path, ".npz", lambda f: np.savez(f, **arrays), "token cache")


def write_array_cache(path: Path, arrays: dict[str, np.ndarray], what: str = "cache") -> None:
    """Write named arrays to ``path`` as an uncompressed ``.npz``, atomically and with the same
    failure rules as :func:`write_token_cache` (a warning, no cache, when it cannot be written)."""
    _write_atomically(path, ".npz", lambda f: np.savez(f, **arrays), what)


def write_text_cache(path: Path, text: str, what: str = "cache") -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically, with the failure rules of :func:`write_token_cache`."""
    _write_atomically(path, path.suffix, lambda f: f.write(text.encode("utf-8")), what)


def load_digest_cache(path: Path) -> str | None:
    """The sha256 hex digest stored at ``path``; None when there is none yet (or its folder is
    a file: writing then warns), and None after a warning, the file deleted, when it holds
    anything else."""
    if linked_entry(path):
        return None
    try:
        text = path.read_text(encoding="ascii")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, UnicodeDecodeError) as exc:
        drop_damaged_cache(path, f"{type(exc).__name__}: {exc}")
        return None
    if not re.fullmatch(r"[0-9a-f]{64}", text):
        drop_damaged_cache(path, f"holds {text[:40]!r}, not a sha256 hex digest")
        return None
    return text


def load_array_cache(path: Path) -> dict[str, np.ndarray] | None:
    """The named arrays of the ``.npz`` at ``path``, or None (after a warning, the file deleted)
    when it cannot be read: truncated, not a zip, or an array that does not load without pickle.
    The caller checks the arrays' meaning (and calls :func:`drop_damaged_cache` if it objects)."""
    if linked_entry(path):
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        drop_damaged_cache(path, f"{type(exc).__name__}: {exc}")
        return None


def _write_atomically(path: Path, suffix: str, write: Callable, what: str) -> None:
    if path.parent.is_symlink() and linked_entry(path):  # a linked folder: no cache (a link as the entry is replaced)
        return
    try:
        if path.exists() and not path.is_file():
            drop_damaged_cache(path, f"a directory where the {suffix} file belongs")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-cache-", suffix=suffix)
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
    except OSError as exc:
        warnings.warn(f"cannot write the {what} {path} ({exc.strerror or exc}); going on without caching "
                      "(set OELM_CACHE_DIR to a writable folder)", stacklevel=4)
