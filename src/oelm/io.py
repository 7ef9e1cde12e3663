"""Files: atomic writes (a reader sees the old file, or directory, or the new one, never half of one),
reads that name a damaged file in one line, and the header check of a safetensors file
(:func:`safetensors_problem`: an ``init_from`` file, a local model's weights)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

__all__ = ["as_disk_full", "disk_writes", "atomic_path", "write_text_atomic", "write_bytes_atomic", "write_json_atomic", "read_json", "read_json_object", "read_jsonl", "sha256_file", "write_dir_atomic", "verify_dir", "json_value", "cache_dir", "safetensors_problem",
           "inside", "check_format"]


def _umask() -> int:
    """The process umask, read without changing it where Linux shows it (``/proc/self/status``);
    elsewhere set and restored at once (``os.umask`` has no read-only form)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def _plain_mode(path: Path, base: int) -> int:
    """The permission bits a plain ``open(path, "w")`` (``base`` 0o666) or ``mkdir`` (0o777) would
    leave: an existing file keeps its own, a new one gets ``base & ~umask``."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return base & ~_umask()


#: How the Rust libraries (safetensors, tokenizers) word a full disk or quota inside their own errors.
_FULL_DISK_WORDS = {errno.ENOSPC: ("No space left on device", "os error 28"),
                    errno.EDQUOT: ("Disk quota exceeded", "os error 122")}
#: A torch.save that fails with less than this free on its file system failed for want of space.
_NEARLY_FULL_BYTES = 1 << 20


def as_disk_full(exc: BaseException, path: str | os.PathLike | None = None) -> OSError | None:
    """``exc`` as the ``OSError`` (ENOSPC / EDQUOT) of a full disk it stands for, or None.

    An ``OSError`` is one when its errno says so. safetensors (``SafetensorError``) and tokenizers
    (a bare ``Exception``) carry the OS message in their own types ("... No space left on device
    (os error 28)"); torch.save's zip writer names no errno at all ("PytorchStreamWriter failed
    writing file", "[enforce fail at inline_container.cc ...]"), so a ``RuntimeError`` of it counts
    when the file system of ``path`` has less than 1 MiB free at that moment (measured on a real
    full tmpfs, tests/test_faults.py)."""
    if isinstance(exc, OSError):
        return exc if exc.errno in (errno.ENOSPC, errno.EDQUOT) else None
    text = str(exc)
    for code, words in _FULL_DISK_WORDS.items():
        if any(w in text for w in words):
            return OSError(code, os.strerror(code), str(path) if path is not None else None)
    if isinstance(exc, RuntimeError) and path is not None and ("PytorchStreamWriter" in text or "inline_container" in text):
        where = Path(path)
        while not where.exists() and where != where.parent:
            where = where.parent
        with contextlib.suppress(OSError):
            if shutil.disk_usage(where).free < _NEARLY_FULL_BYTES:
                return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return None


@contextlib.contextmanager
def disk_writes(path: str | os.PathLike) -> Iterator[None]:
    """Writes to ``path`` (a file or folder) inside the block: a library's own error for a full disk
    is raised as the ``OSError`` (ENOSPC / EDQUOT) it stands for (:func:`as_disk_full`), chained
    to the original, so callers handle one kind of error."""
    try:
        yield
    except Exception as exc:
        full = as_disk_full(exc, path)
        if full is None or full is exc:
            raise
        raise full from exc


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write into; on success fsync it, rename it over
    ``path`` and fsync the directory (so the rename survives a crash). On an exception the
    temporary file is removed and ``path`` is untouched.

    The new file gets the permissions a plain ``open(path, "w")`` would give it (an existing
    file's own, else ``0o666 & ~umask``), not the ``0o600`` of the temporary file.

    Example::

        with atomic_path(out / "weights.safetensors") as tmp:
            save_file(tensors, str(tmp))
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, _plain_mode(path, 0o666))
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def inside(root: str | os.PathLike, relative: str | os.PathLike = ".", *, named_in: str | os.PathLike | None = None,
           follow_links: bool = False) -> Path:
    """``root / relative``, checked to stay inside ``root``, the folder a command owns (its output
    folder, a run folder, the cache or the data folder): every path oelm reads or writes there goes
    through this, so that nothing is read or written elsewhere.

    ``relative`` must be a relative path without ``..``, and no part of it below ``root`` that exists
    may be a symbolic link (a link planted in the folder could lead anywhere: an append to
    ``train.log`` would write through it, a recorded ``predictions.npz`` would read another
    matrix's file). ``root`` itself may be a link: the user chose that folder.

    Args:
        named_in: the file that named ``relative`` (a ``result.json``), for the message.
        follow_links: a link is accepted when what it resolves to is inside ``root`` (resolved
            too): the data dir, whose files a user may link within it.

    Raises:
        OutsideFolderError: one line naming the path, where it leads and the fix.
    """
    from oelm.errors import OutsideFolderError

    root, rel = Path(root), Path(relative)
    source = f" (named in {named_in})" if named_in is not None else ""
    if rel.is_absolute() or ".." in rel.parts:
        raise OutsideFolderError(f"{rel}{source} leads outside {root}: oelm reads and writes only inside the folders a "
                                 f"command owns; name the file relative to {root}, without '..'")
    if follow_links:
        resolved = (root / rel).resolve()
        if resolved.is_relative_to(root.resolve()):
            return root / rel
        raise OutsideFolderError(f"{root / rel}{source} leads outside {root} (to {resolved}, through a symbolic link): "
                                 f"oelm reads only files inside {root}; copy the file there instead of linking it")
    path = root
    for part in rel.parts:
        path = path / part
        if path.is_symlink():
            raise OutsideFolderError(
                f"{path}{source} is a symbolic link (to {os.readlink(path)}): oelm reads and writes only real files "
                f"inside {root}; replace the link with a copy of what it points to, or delete it")
    return root / rel


def check_format(path: str | os.PathLike, found: Any, reads: int, *, older: str, absent_is: int | None = None) -> None:
    """Check the layout version ``found`` of the file at ``path`` (its ``format`` field, None when
    it has none) against ``reads``, the one this oelm reads: every versioned file oelm writes is
    checked with this on read.

    Args:
        older: the fix for a file of an older or no version (ends the message; e.g. "delete it,
            `oelm run` writes it again").
        absent_is: the version a file without one is read as (files written before oelm
            versioned them: ``result.json`` and ``sweep.json`` are read as version 1); None: a file
            without one is refused.

    Raises:
        FileFormatError: one line naming the file, its version and this oelm's, and the fix
            (upgrade oelm for a newer file; ``older`` otherwise).
    """
    from oelm.errors import FileFormatError

    if found is None and absent_is is not None:
        found = absent_is
    if found == reads and not isinstance(found, bool):
        return
    if isinstance(found, int) and not isinstance(found, bool) and found > reads:
        raise FileFormatError(f"{path} has format {found}, newer than this oelm reads ({reads}): a newer oelm wrote it; "
                              "upgrade oelm (pip install -U oelm) to read it")
    shown = "no format" if found is None else f"format {found!r}"
    raise FileFormatError(f"{path} has {shown}, but this oelm reads format {reads}; {older}")


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None  # JSON has no NaN/Inf
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def json_value(obj: Any) -> Any:
    """``obj`` as :func:`write_json_atomic` writes it: NaN/Inf as None, tuples as lists, keys as strings."""
    return _jsonable(obj)


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Atomically write ``obj`` as indented JSON (NaN/Inf become null)."""
    write_text_atomic(path, json.dumps(_jsonable(obj), indent=2, sort_keys=False) + "\n")


_DEFAULT_FIX = "restore it from a copy, or delete it if oelm can write it again"


def read_json(path: str | os.PathLike, fix: str = _DEFAULT_FIX) -> Any:
    """The JSON value in ``path``.

    Args:
        fix: what the user should do when the file is damaged (ends the error message).

    Raises:
        DamagedFileError: the file is not valid UTF-8 JSON (a hand edit, a copy cut short), or is
            a directory; one line naming the file, where it stops parsing, and ``fix``.
        OELMError: the file may not be read (permissions).
        OSError: the file cannot be opened otherwise (FileNotFoundError when it is missing).
    """
    from oelm.errors import DamagedFileError, OELMError

    try:
        fh = open(path, encoding="utf-8")
    except IsADirectoryError:
        raise DamagedFileError(f"{path} is damaged: it is a directory, not a file; {fix}") from None
    except PermissionError as exc:
        raise OELMError(f"cannot read {path} ({exc.strerror}); make it readable by this user") from None
    with fh:
        try:
            return json.load(fh)
        except json.JSONDecodeError as exc:
            raise DamagedFileError(f"{path} is damaged: not valid JSON ({exc.msg}: line {exc.lineno}, "
                                   f"column {exc.colno}); {fix}") from None
        except UnicodeDecodeError:
            raise DamagedFileError(f"{path} is damaged: not UTF-8 text; {fix}") from None


def read_json_object(path: str | os.PathLike, fix: str = _DEFAULT_FIX) -> dict[str, Any]:
    """:func:`read_json` for a file that holds one JSON object (every file oelm writes).

    Raises:
        DamagedFileError: as :func:`read_json`, or the file holds another JSON value (a list, null, ...).
    """
    from oelm.errors import DamagedFileError

    value = read_json(path, fix)
    if not isinstance(value, dict):
        kind = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(type(value), "null")
        raise DamagedFileError(f"{path} is damaged: it holds a JSON {kind}, not an object; {fix}")
    return value


# --------------------------------------------------------------------------------------------
# Directories written as a whole (checkpoints): temp dir, fsync, manifest last, rename
# --------------------------------------------------------------------------------------------

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Records of a JSON-lines file such as ``metrics.jsonl``: a missing file gives ``[]``, and a
    line that does not parse (a run killed mid-write leaves half a line; bytes that are not UTF-8)
    or is not a JSON object (a hand edit) is skipped."""
    try:
        text = Path(path).read_bytes().decode("utf-8", errors="replace")  # bytes that are not UTF-8: lines that do not parse
    except (FileNotFoundError, IsADirectoryError):
        return []
    records = []
    for line in text.splitlines():
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


def sha256_file(path: str | os.PathLike, chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()


def _fsync_path(path: Path) -> None:
    """fsync a file or directory (directories: best effort, some filesystems refuse)."""
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if path.is_dir() else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        if path.is_dir():
            return
        raise
    try:
        os.fsync(fd)
    except OSError as exc:
        if not path.is_dir() or exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise
    finally:
        os.close(fd)


def write_dir_atomic(path: str | os.PathLike, fill: Callable[[Path], None], extra: dict[str, Any] | None = None) -> Path:
    """Create directory ``path`` whole or not at all.

    ``fill(tmp_dir)`` writes the files into a temporary sibling directory; then every file is
    fsynced, ``manifest.json`` (format, ``extra``, and the size and sha256 of every file) is
    written *last*, the temporary directory is renamed to ``path`` and the parent directory is
    fsynced. A reader that finds ``path`` with a manifest whose checksums match (see
    :func:`verify_dir`) therefore sees a complete directory. On any exception (including
    ``OSError`` ENOSPC from a full disk) the temporary directory is removed and the exception
    re-raised; an existing ``path`` is never touched until the final rename.

    Raises:
        FileExistsError: ``path`` already exists.
        OSError / whatever ``fill`` raises.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        raise FileExistsError(f"{path} already exists")
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{path.name}-", dir=path.parent))
    try:
        fill(tmp)
        files = {}
        for f in sorted(p for p in tmp.rglob("*") if p.is_file()):
            _fsync_path(f)
            files[f.relative_to(tmp).as_posix()] = {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
        manifest = {"format": MANIFEST_FORMAT, **(extra or {}), "files": files}
        with open(tmp / MANIFEST_NAME, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(manifest, indent=1) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp made it 0o700; a plain mkdir would not
        _fsync_path(tmp)
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_path(path.parent)
    return path


def verify_dir(path: str | os.PathLike) -> str | None:
    """Check a directory written by :func:`write_dir_atomic` against its manifest.

    Returns:
        None when the manifest exists and every listed file has its recorded size and sha256;
        otherwise a short reason (missing manifest, missing/truncated file, checksum mismatch).
    """
    path = Path(path)
    try:
        manifest = read_json(path / MANIFEST_NAME)
        files = manifest["files"]
    except FileNotFoundError:
        return "no manifest.json (the directory was not finished)"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"unreadable manifest.json ({exc})"
    for name, meta in files.items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != meta.get("bytes"):
            return f"{name} has {f.stat().st_size} bytes, the manifest says {meta.get('bytes')} (truncated?)"
        if sha256_file(f) != meta.get("sha256"):
            return f"{name} does not match its sha256 in the manifest (corrupted)"
    return None


def cache_dir() -> Path:
    """Tokenizer and token caches: ``$OELM_CACHE_DIR``, default ``~/.cache/oelm``: ``tokenizers/``
    (trained BPEs), ``tokens/`` (LM token streams), ``encodings/`` (classification encodings),
    ``tokenizer-hashes/`` (:func:`oelm.data.lm.tokenizer_record` hashes), ``file-hashes/``
    (:func:`oelm.data.identity.file_sha256`)."""
    return Path(os.environ.get("OELM_CACHE_DIR", Path.home() / ".cache" / "oelm"))


def safetensors_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole safetensors file (a phrase), or None when it reads as one.

    A safetensors file is an 8-byte little-endian header length N, N bytes of JSON (tensor name ->
    dtype, shape, data_offsets), then the tensor bytes; only the header is read, and the file's
    size must be the one the header's offsets give (a truncated copy is caught)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            size = path.stat().st_size
            if len(head) < 8:
                return f"is {size} bytes, too short for a safetensors header"
            n = int.from_bytes(head, "little")
            if n < 2 or 8 + n > size or n > 100_000_000:
                return "does not start with a safetensors header (the first 8 bytes give no valid header length)"
            header = f.read(n)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    try:
        entries = json.loads(header)
        ends = [int(v["data_offsets"][1]) for k, v in entries.items() if k != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return "does not start with a safetensors header (no JSON table of tensors after the first 8 bytes)"
    if 8 + n + max(ends, default=0) != size:
        return (f"is damaged: its header describes {8 + n + max(ends, default=0):,} bytes, the file has {size:,} "
                "(truncated copy or download?)")
    return None
