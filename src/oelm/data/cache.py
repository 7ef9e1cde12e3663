"""Damaged cache files (:mod:`oelm.data.lm`'s token streams and trained tokenizers): a cache that
cannot be read back is named in a warning, deleted and built again, never a traceback and never
silently used."""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np

__all__ = ["drop_damaged_cache", "load_token_cache", "write_token_cache"]


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
    try:
        if path.exists() and not path.is_file():
            drop_damaged_cache(path, "a directory where the .npy file belongs")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-tokens-", suffix=".npy")
        try:
            with os.fdopen(fd, "wb") as f:
                np.save(f, stream)
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
    except OSError as exc:
        warnings.warn(f"cannot write the token cache {path} ({exc.strerror or exc}); going on without caching "
                      "(set OELM_CACHE_DIR to a writable folder)", stacklevel=3)
