"""``oelm stop OUT``: SIGTERM to the processes that train in an output folder, by the pids their
lock files record (:mod:`oelm.lock`), never by name or pattern.

Whoever holds ``OUT``: the driving ``oelm run`` (``OUT/.oelm.lock``, exclusive), or a batch
system's ``oelm run --only`` jobs (each holds ``OUT/runs/<name>/.oelm.lock`` on the run it trains;
their shared hold on ``OUT/.oelm.lock`` records no pid). Each then finishes its step, saves a
checkpoint and exits; rerunning the same command continues it.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

from oelm.errors import OELMError, OutputLockedError
from oelm.lock import LOCK_NAME, hold_shared_lock, pid_alive, read_holder

__all__ = ["cmd_stop"]


def _held(folder: Path) -> bool:
    """Whether an exclusive holder has ``folder``'s lock now (a shared probe is refused); a file
    left by a killed process is not held."""
    try:
        with hold_shared_lock(folder):
            return False
    except OutputLockedError:
        return True  # (or no flock on this file system: then the pid check alone decides)


def _only_jobs(out: Path) -> list[tuple[str, dict[str, Any]]]:
    """``(run name, lock record)`` of every run of ``out`` that an ``oelm run --only`` job trains now."""
    runs = out / "runs"
    found = []
    for run_dir in sorted(runs.iterdir()) if runs.is_dir() else ():
        if (run_dir / LOCK_NAME).is_file() and _held(run_dir) and (holder := read_holder(run_dir)):
            found.append((run_dir.name, holder))
    return found


def _signal(pid: int, what: str) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass  # ended meanwhile
    except PermissionError:
        raise OELMError(f"pid {pid} ({what}) belongs to another user; ask them to stop it") from None


def _wait(pids: list[int], gone, wait: float) -> bool:
    """Poll until every pid is gone (``gone(pid)``), at most ``wait`` seconds; True when they all are."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if all(gone(pid) for pid in pids):
            return True
        time.sleep(0.2)
    return all(gone(pid) for pid in pids)


def _stop_only_jobs(out: Path, jobs: list[tuple[str, dict[str, Any]]], wait: float) -> int:
    here = socket.gethostname()
    local = [(name, h) for name, h in jobs if h.get("host") in (None, here) and pid_alive(h.get("pid"))]
    elsewhere = [(name, h) for name, h in jobs if h.get("host") not in (None, here)]
    for name, holder in local:
        _signal(holder["pid"], f"the `oelm run --only {name}` job")
    listed = ", ".join(f"{name} (pid {h['pid']})" for name, h in local) or "none on this host"
    remote = "; on other hosts (run `oelm stop` there, or cancel the jobs): " + ", ".join(
        f"{name} (host {h.get('host')}, pid {h.get('pid')})" for name, h in elsewhere) if elsewhere else ""
    print(f"oelm stop: {out} is used by `oelm run --only` jobs, not by one driver; sent SIGTERM to {len(local)} of "
          f"them: {listed}{remote}")
    pids = [h["pid"] for _, h in local]
    runs = {h["pid"]: out / "runs" / name for name, h in local}
    if _wait(pids, lambda pid: not pid_alive(pid) or not _held(runs[pid]), wait):  # gone, or its run's lock given back
        print("oelm stop: they stopped; run the same `oelm run --only` commands again (or resubmit the jobs) to "
              "continue from their checkpoints")
        return 0
    left = [str(pid) for pid in pids if pid_alive(pid) and _held(runs[pid])]
    print(f"oelm stop: pid(s) {', '.join(left)} still running after {wait:g} s (each saves a checkpoint first); wait")
    return 1


def cmd_stop(args: argparse.Namespace) -> int:
    """Stop what trains in ``args.dir``: SIGTERM to the pid its ``.oelm.lock`` records (the driving
    ``oelm run``), or to each ``oelm run --only`` job of this host that holds one of its runs; then
    wait up to ``args.wait`` seconds for them to end. Exit 0 when they stopped (or nothing held
    the directory), 1 when one still runs after the wait.

    Raises:
        OELMError: no such directory, a lock of another host, a lock file without a pid and no
            job holding a run, or a process of a user we may not signal.
    """
    out = Path(args.dir)
    if not out.is_dir():
        raise OELMError(f"{out}: no such directory; pass the --output-dir of the `oelm run` to stop")
    if not (out / LOCK_NAME).exists():
        print(f"oelm stop: no run holds {out} (no {LOCK_NAME} there); nothing to stop")
        return 0
    holder = read_holder(out)
    pid = holder.get("pid") if holder else None
    if holder and holder.get("host") not in (None, socket.gethostname()):
        raise OELMError(f"the run holding {out} is on host {holder.get('host')} (pid {pid}); run `oelm stop` there")
    if not _held(out) and (jobs := _only_jobs(out)):
        return _stop_only_jobs(out, jobs, args.wait)
    if holder is None:
        raise OELMError(f"{out / LOCK_NAME} names no pid (a run that is just starting, or a damaged file); retry in a "
                        f"moment, or delete it if no run uses {out}")
    if not _held(out) or not pid_alive(pid):
        print(f"oelm stop: no run holds {out} (its lock file names pid {pid}, which no longer holds it); nothing to stop")
        return 0
    _signal(pid, f"the oelm run holding {out}")
    print(f"oelm stop: sent SIGTERM to pid {pid} (the oelm run holding {out}, started {holder.get('started_at')})")

    def gone(p: int) -> bool:
        now = read_holder(out)
        return not pid_alive(p) or not now or now.get("pid") != p

    if _wait([pid], gone, args.wait):
        print("oelm stop: it stopped; rerun the same `oelm run` command to continue from its checkpoints")
        return 0
    print(f"oelm stop: pid {pid} still holds {out} after {args.wait:g} s (it saves a checkpoint first); "
          f"wait, or `kill -KILL {pid}` as a last resort")
    return 1
