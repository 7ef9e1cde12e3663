"""Damaged cache files (:mod:`oelm.data.lm`'s token streams and trained tokenizers,
:mod:`oelm.data.classification`'s encodings): a cache that cannot be read back is named in a
warning, deleted and built again, never a traceback and never silently used."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np

__all__ = [
    "drop_damaged_cache",
    "load_array_cache",
    "load_digest_cache",
    "load_token_cache",
    "write_array_cache",
    "write_text_cache",
    "write_token_cache",
]


def drop_damaged_cache(path: Path, problem: str) -> None:
    """Warn that the cache file (or folder) ``path`` is damaged and remove it, so that it is rebuilt."""
    warnings.warn(f"oelm cache {path} is damaged ({problem}); deleting it and building it again", stacklevel=3)
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def load_token_cache(path: Path, dtype: np.dtype, vocab_size: int) -> np.ndarray | None:
    """The cached token stream at ``path``, or None (after a warning, the file deleted) when it is
    damaged: unreadable or truncated ``.npy``, not a 1-D array of ``dtype``, or ids outside the
    vocabulary."""
    try:
        stream = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        drop_damaged_cache(path, f"{type(exc).__name__}: {exc}")
        return None
    if stream.ndim != 1 or stream.dtype != dtype:
        drop_damaged_cache(path, f"holds a {stream.dtype} array of shape {stream.shape}, expected 1-D {dtype}")
        return None
    if stream.size and int(stream.max()) >= vocab_size:
        drop_damaged_cache(path, f"holds id {int(stream.max())}, outside the tokenizer's {vocab_size} ids")
        return None
    return stream


def write_token_cache(path: Path, stream: np.ndarray) -> None:
    """Write ``stream`` to ``path`` atomically (a concurrent reader sees nothing or the whole file).
    A directory in the way is removed as damaged; a cache folder that cannot be written (a file,
    no permission, disk full) is a warning and no cache: the stream is already computed."""
    _write_atomically(path, ".npy", lambda f: np.save(f, stream), "token cache")


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
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        drop_damaged_cache(path, f"{type(exc).__name__}: {exc}")
        return None


def _write_atomically(path: Path, suffix: str, write: Callable, what: str) -> None:
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
