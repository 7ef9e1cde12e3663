"""One ``oelm run`` per output directory: an exclusive lock on ``<out>/.oelm.lock``.

The lock is ``fcntl.flock`` on the open file, so the kernel releases it when the holder exits in
any way (return, exception, SIGKILL, crash): a lock left by a dead process is never in the way.
The file also holds ``{"pid", "host", "started_at"}`` of the holder so that a refusal can name
it. The file is removed on a normal release; one left behind by a killed process is taken over
(the flock proves its holder is gone) by the next run on the same host.

A file naming another host is refused even when the flock is free: flock on a network file
system may not see the other host's lock, and its pid cannot be checked from here. Delete the
file by hand when that run is known to be gone.

Only the main process of a multi-process launch takes the lock (``run_experiment`` does this).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from oelm.errors import OutputLockedError

__all__ = ["LOCK_NAME", "hold_output_lock", "acquire", "release", "read_holder"]

LOCK_NAME = ".oelm.lock"


def read_holder(out: str | os.PathLike) -> dict[str, Any] | None:
    """The ``{"pid", "host", "started_at"}`` written in ``out/.oelm.lock``; None when the file is
    missing, empty or not JSON (e.g. a holder that has not written it yet)."""
    try:
        holder = json.loads((Path(out) / LOCK_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def _describe(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "another process (it has not written its pid yet)"
    return f"pid {holder.get('pid')} on host {holder.get('host')}, started {holder.get('started_at')}"


def _pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def acquire(out: str | os.PathLike) -> int:
    """Take the lock of output directory ``out`` (which must exist); returns the open file
    descriptor that holds it (pass it to :func:`release`).

    Raises:
        OutputLockedError: another live process holds it (named: pid, host, start time), or the
            file names another host (whose process cannot be checked from here; the message says
            to delete the file if that run is gone).
    """
    path = Path(out) / LOCK_NAME
    host = socket.gethostname()
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise OutputLockedError(
                    f"output directory {out} is in use by another oelm run ({_describe(read_holder(out))}); wait for it "
                    f"to finish or stop it, or use another --output-dir"
                ) from None
            if not _fallback_free(path, host):  # no flock on this file system (ENOLCK): trust the pid
                raise OutputLockedError(
                    f"output directory {out} is in use by another oelm run ({_describe(read_holder(out))}); wait for it "
                    f"to finish or stop it, or use another --output-dir"
                ) from None
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            break
        # The holder before us may have removed the file after we opened it: then we hold a lock
        # on an unlinked file while a third process may create and lock a new one. Start over.
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    previous = read_holder(out)
    if previous and previous.get("host") not in (None, host):
        release(fd, out, remove=False)
        raise OutputLockedError(
            f"output directory {out} is locked by an oelm run on another host ({_describe(previous)}), which cannot be "
            f"checked from {host}; if that run is gone, delete {path} and rerun"
        )
    record = {"pid": os.getpid(), "host": host, "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    os.fsync(fd)
    return fd


def _fallback_free(path: Path, host: str) -> bool:
    """Without flock: free unless the file names a live process on this host."""
    holder = read_holder(path.parent)
    return not (holder and holder.get("host") == host and holder.get("pid") != os.getpid() and _pid_alive(holder.get("pid")))


def release(fd: int, out: str | os.PathLike, *, remove: bool = True) -> None:
    """Give the lock back: remove ``out/.oelm.lock`` (while still holding it, so no one else's
    lock file is removed) and close ``fd``."""
    try:
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(Path(out) / LOCK_NAME)
    finally:
        os.close(fd)


@contextlib.contextmanager
def hold_output_lock(out: str | os.PathLike, *, enabled: bool = True) -> Iterator[None]:
    """Hold the lock of ``out`` for the ``with`` block, released on any exit (exceptions and
    :class:`~oelm.errors.RunInterruptedError` included). ``enabled=False`` (the other processes
    of a launched job) takes no lock.

    Raises:
        OutputLockedError: see :func:`acquire`.
    """
    if not enabled:
        yield
        return
    fd = acquire(out)
    try:
        yield
    finally:
        release(fd, out)
