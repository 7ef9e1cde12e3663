"""The GPU check's archives: reading them member by member (:func:`safe_extract`) and writing the
part's output folder as one (:func:`write_archive`), for scripts/offline_kit.py on both machines.

``safe_extract`` checks every member itself before extracting anything (a relative path, no
``..``, no link leaving the folder, no device file), on every Python, not only where tarfile's
``data`` filter exists. Every refusal is a :class:`KitError` of one line naming the file. Standard
library only: it runs on the GPU machine's own Python.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import time
import zlib
from pathlib import Path, PurePosixPath

# Left out of an archive, as scripts/collect_results.sh leaves them out of docs/results.
_SKIP_SUFFIXES = (".safetensors", ".pt", ".lock")
_SKIP_PARTS = ("checkpoints", "tensorboard")


class KitError(Exception):
    """A kit or archive that cannot be built, checked or used; the message names the file and the fix."""


def _safe_relative(name: str, what: str) -> PurePosixPath:
    """``name`` as a relative path inside its folder; KitError for an absolute path or ``..``."""
    path = PurePosixPath(name.replace("\\", "/"))
    if not name or "\0" in name or path.is_absolute() or (path.parts and ":" in path.parts[0]):
        raise KitError(f"{what} names {name!r}: an absolute path; refused (nothing extracted or used)")
    if ".." in path.parts:
        raise KitError(f"{what} names {name!r}: a path with '..' leaves the folder; refused (nothing extracted or used)")
    return path


def _keep(name: str) -> bool:
    parts = PurePosixPath(name).parts
    base = parts[-1]
    return not (name.endswith(_SKIP_SUFFIXES) or any(p in _SKIP_PARTS for p in parts) or base.startswith("events.out.tfevents")
                or (base == "tokenizer.json" and len(parts) == 2))  # a comparison's saved tokenizer (its sha256 is recorded)


def write_archive(out: Path, archive: Path, extra: dict) -> None:
    """``out`` as a tar.gz of regular files only (no weights, checkpoints, TensorBoard files), plus ``offline-kit.json``."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(out.rglob("*")) if out.is_dir() else []:
            rel = path.relative_to(out).as_posix()
            if path.is_file() and not path.is_symlink() and _keep(rel):
                tar.add(path, arcname=rel, recursive=False)
        raw = json.dumps(extra, indent=1).encode()
        info = tarfile.TarInfo("offline-kit.json")
        info.size, info.mtime = len(raw), int(time.time())
        tar.addfile(info, io.BytesIO(raw))


def check_members(tar: tarfile.TarFile, where: str) -> list[tarfile.TarInfo]:
    """Every member of ``tar``, after checking each one: a relative path without ``..``, a regular
    file or folder, or a link whose target stays inside (relative, no ``..``). The whole archive is
    refused (KitError, one line) before anything is extracted."""
    members = tar.getmembers()
    for m in members:
        _safe_relative(m.name, where)
        if m.issym() or m.islnk():
            target = PurePosixPath(m.linkname.replace("\\", "/"))
            if target.is_absolute() or ".." in target.parts or not m.linkname:
                raise KitError(f"{where} holds a link {m.name!r} -> {m.linkname!r} leaving the folder; refused (nothing extracted)")
        elif not (m.isfile() or m.isdir()):
            raise KitError(f"{where} holds {m.name!r}, a device file or pipe; refused (nothing extracted)")
    return members


def safe_extract(archive: Path, dest: Path) -> list[str]:
    """Extract ``archive`` into ``dest`` after :func:`check_members`; returns the member names.

    Raises:
        KitError: no such file, not a tar archive, cut short or damaged, or a member refused.
    """
    if not archive.is_file():
        raise KitError(f"{archive} does not exist")
    try:
        with tarfile.open(archive) as tar:
            members = check_members(tar, str(archive))
            for m in members:  # tarfile's own filter too, where this Python has it (3.12, 3.11.4+, 3.10.12+)
                tar.extract(m, dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    except tarfile.ReadError as exc:
        reason = (str(exc).splitlines() or ["?"])[0].rstrip(":")
        raise KitError(f"{archive} is not a (whole) tar archive ({reason}); bring it back again from the device's output") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise KitError(f"{archive} is cut short or damaged ({type(exc).__name__}: {exc}); bring it back again") from None
    except tarfile.TarError as exc:
        raise KitError(f"{archive} could not be extracted safely ({exc}); nothing of it was used") from None
    except OSError as exc:
        raise KitError(f"{archive} could not be extracted into {dest} ({exc})") from None
    return [m.name for m in members]
