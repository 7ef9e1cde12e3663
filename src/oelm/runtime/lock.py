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
``oelm run --only`` processes hold the same file in *shared* mode (:func:`hold_shared_lock`), and
each takes ``runs/<name>/.oelm.lock`` (this same exclusive lock) on the run it trains.

Limits: these are locks of one host, or of a file system whose POSIX locks work across hosts. On
NFS they hold only where the lock manager does (``nolock`` / ``local_lock`` mounts and Lustre's
``localflock`` make them per machine), a dead node's lock lingers until its lease expires, and
cached attributes can hide a result another node just wrote. So across machines oelm relies on
the engine that places the runs (Ray, or a batch system's job ids) never to start one run twice,
not on these files.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from oelm.errors import OELMError, OutputLockedError
from oelm.io import inside

__all__ = ["LOCK_NAME", "hold_output_lock", "hold_shared_lock", "acquire", "release", "read_holder", "pid_alive",
           "stop_holder"]

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


def pid_alive(pid: Any) -> bool:
    """Whether process ``pid`` (of this host) exists; False for anything that is not a positive int."""
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
        OutputLockedError: another live process holds it (named: pid, host, start time), the
            file names another host (whose process cannot be checked from here; the message says
            to delete the file if that run is gone), or ``.oelm.lock`` cannot be opened (a
            directory, not writable: named, with the fix).
    """
    path = inside(out, LOCK_NAME)  # a link planted as the lock: refused, never truncated through
    host = socket.gethostname()
    try:
        fd = _flock_current(path, fcntl.LOCK_EX)
    except OSError as exc:
        holder = read_holder(out)
        who = _describe(holder) if holder else "another process, or `oelm run --only` processes"
        busy = OutputLockedError(f"output directory {out} is in use by another oelm run ({who}); wait for it "
                                 "to finish or stop it, or use another --output-dir")
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise busy from None
        if not _fallback_free(path, host):  # no flock on this file system (ENOLCK): trust the pid
            raise busy from None
        fd = _open_lock_file(path)
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


def _open_lock_file(path: Path) -> int:
    """``os.open`` of the lock file (created if missing); a path that cannot be oelm's lock file (a
    directory, a file this user may not write) is an :class:`OutputLockedError` naming it."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except IsADirectoryError:
        raise OutputLockedError(f"{path} is a directory, not oelm's lock file; remove it (rm -r {path}) and rerun") from None
    except OSError as exc:
        raise OutputLockedError(
            f"cannot open the lock file {path} ({exc.strerror or exc}); the output directory must exist and be writable "
            f"by you (remove {path} if it is a leftover of another user's run)"
        ) from None


def _flock_current(path: Path, operation: int) -> int:
    """Open ``path`` (created if missing) and flock it with ``operation`` (``LOCK_EX`` /
    ``LOCK_SH``, not waiting); returns the descriptor once the lock is on the file that is at
    ``path`` now. An exclusive holder removes the file when it releases it: if that happened
    between our open and our lock, we would hold a lock on a removed file while a third process
    locks a new one, so we start over. Raises the ``OSError`` of a refused flock."""
    while True:
        fd = _open_lock_file(path)
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _fallback_free(path: Path, host: str) -> bool:
    """Without flock: free unless the file names a live process on this host."""
    holder = read_holder(path.parent)
    return not (holder and holder.get("host") == host and holder.get("pid") != os.getpid() and pid_alive(holder.get("pid")))


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


@contextlib.contextmanager
def hold_shared_lock(out: str | os.PathLike) -> Iterator[None]:
    """Hold ``out/.oelm.lock`` in shared mode for the ``with`` block: ``oelm run --only``
    processes (a batch system's jobs) may hold it together, a driver (``oelm run``, ``oelm plan``,
    ``--collect``) may not, and none starts while a driver holds it.

    Raises:
        OutputLockedError: a driver holds the directory (named when its record is readable), or
            the file system has no flock.
    """
    path = inside(out, LOCK_NAME)  # a link planted as the lock: refused, never truncated through
    try:
        fd = _flock_current(path, fcntl.LOCK_SH)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise OutputLockedError(
                f"output directory {out} is in use by an oelm run that drives the whole matrix "
                f"({_describe(read_holder(out))}); wait for it to finish or stop it, or use another --output-dir"
            ) from None
        raise OutputLockedError(f"oelm run --only needs flock on the file system of {out} ({exc}); "
                                "drive the matrix with one `oelm run` there instead") from None
    try:
        yield
    finally:
        os.close(fd)  # never unlinked: other --only processes may hold it


def _held(folder: Path) -> bool:
    """Whether an exclusive holder has ``folder``'s lock now (a shared probe is refused); a file
    left by a killed process is not held."""
    try:
        with hold_shared_lock(folder):
            return False
    except OutputLockedError:
        return True  # (or no flock on this file system: then the pid check alone decides)


def _only_jobs(run_dirs: list[Path]) -> list[tuple[Path, dict[str, Any]]]:
    """``(run folder, lock record)`` of every folder of ``run_dirs`` that an ``oelm run --only`` job
    trains now (it holds the folder's ``.oelm.lock``)."""
    return [(d, holder) for d in run_dirs
            if (d / LOCK_NAME).is_file() and _held(d) and (holder := read_holder(d))]


def _signal(pid: int, what: str) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass  # ended meanwhile
    except PermissionError:
        raise OELMError(f"pid {pid} ({what}) belongs to another user; ask them to stop it") from None


def _wait(pids: list[int], gone: Callable[[int], bool], wait: float) -> bool:
    """Poll until every pid is gone (``gone(pid)``), at most ``wait`` seconds; True when they all are."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if all(gone(pid) for pid in pids):
            return True
        time.sleep(0.2)
    return all(gone(pid) for pid in pids)


def _stop_only_jobs(out: Path, jobs: list[tuple[Path, dict[str, Any]]], wait: float, say: Callable[[str], None]) -> bool:
    """SIGTERM to each ``oelm run --only`` job of this host in ``jobs`` (by the pid its run's lock
    records), the jobs of other hosts named; then wait for them. True when they stopped."""
    here = socket.gethostname()
    folders = {d.name: d for d, _ in jobs}
    jobs = [(d.name, h) for d, h in jobs]
    local = [(name, h) for name, h in jobs if h.get("host") in (None, here) and pid_alive(h.get("pid"))]
    elsewhere = [(name, h) for name, h in jobs if h.get("host") not in (None, here)]
    for name, holder in local:
        _signal(holder["pid"], f"the `oelm run --only {name}` job")
    listed = ", ".join(f"{name} (pid {h['pid']})" for name, h in local) or "none on this host"
    remote = "; on other hosts (run `oelm stop` there, or cancel the jobs): " + ", ".join(
        f"{name} (host {h.get('host')}, pid {h.get('pid')})" for name, h in elsewhere) if elsewhere else ""
    say(f"oelm stop: {out} is used by `oelm run --only` jobs, not by one driver; sent SIGTERM to {len(local)} of "
        f"them: {listed}{remote}")
    pids = [h["pid"] for _, h in local]
    runs = {h["pid"]: folders[name] for name, h in local}
    if _wait(pids, lambda pid: not pid_alive(pid) or not _held(runs[pid]), wait):  # gone, or its run's lock given back
        say("oelm stop: they stopped; run the same `oelm run --only` commands again (or resubmit the jobs) to "
            "continue from their checkpoints")
        return True
    left = [str(pid) for pid in pids if pid_alive(pid) and _held(runs[pid])]
    say(f"oelm stop: pid(s) {', '.join(left)} still running after {wait:g} s (each saves a checkpoint first); wait")
    return False


def stop_holder(out: Path, wait: float, run_dirs: list[Path] = (), say: Callable[[str], None] = print) -> bool:
    """Stop what trains in ``out`` (``oelm stop``): SIGTERM to the pid its lock file records (the
    driving ``oelm run``), or to each ``oelm run --only`` job of this host that holds one of its
    runs (their shared hold on ``out/.oelm.lock`` records no pid); then wait up to ``wait``
    seconds for them to end. Never by name or pattern: only those processes. ``run_dirs``: the
    matrix's run folders (``MatrixFolder(out).run_folders()``), where such jobs hold their run's
    lock; none when only a driver is to be stopped. ``say`` gets one line per step. Returns True when they stopped (or nothing held the directory), False when one
    is still running after the wait.

    Raises:
        OELMError: no such directory, a lock of another host, a lock file without a pid and no
            job holding a run, or a process of a user we may not signal.
    """
    if not out.is_dir():
        raise OELMError(f"{out}: no such directory; pass the --output-dir of the `oelm run` to stop")
    if not (out / LOCK_NAME).exists():
        say(f"oelm stop: no run holds {out} (no {LOCK_NAME} there); nothing to stop")
        return True
    holder = read_holder(out)
    pid = holder.get("pid") if holder else None
    if holder and holder.get("host") not in (None, socket.gethostname()):
        raise OELMError(f"the run holding {out} is on host {holder.get('host')} (pid {pid}); run `oelm stop` there")
    if not _held(out) and (jobs := _only_jobs(list(run_dirs))):
        return _stop_only_jobs(out, jobs, wait, say)
    if holder is None:
        raise OELMError(f"{out / LOCK_NAME} names no pid (a run that is just starting, or a damaged file); retry in a "
                        f"moment, or delete it if no run uses {out}")
    if not _held(out) or not pid_alive(pid):
        say(f"oelm stop: no run holds {out} (its lock file names pid {pid}, which no longer holds it); nothing to stop")
        return True
    _signal(pid, f"the oelm run holding {out}")
    say(f"oelm stop: sent SIGTERM to pid {pid} (the oelm run holding {out}, started {holder.get('started_at')})")

    def gone(p: int) -> bool:
        now = read_holder(out)
        return not pid_alive(p) or not now or now.get("pid") != p

    if _wait([pid], gone, wait):
        say("oelm stop: it stopped; rerun the same `oelm run` command to continue from its checkpoints")
        return True
    say(f"oelm stop: pid {pid} still holds {out} after {wait:g} s (it saves a checkpoint first); "
        f"wait, or `kill -KILL {pid}` as a last resort")
    return False
