"""``runs/<name>/status.json``: what a run says about itself while it trains (state, stage, total
steps, the process and host that train it, start and end times); ``oelm monitor`` reads it, and a
run reads the others' to know which runs trained beside it."""

from __future__ import annotations

import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from oelm.errors import DamagedFileError
from oelm.io import read_json_object, write_json_atomic

from oelm.records.folder import PlannedRun, RunFolder

__all__ = ["read_status", "write_status", "utc_now", "STATUS_FIX"]

#: What to do about a damaged ``status.json`` (the run writes it again).
STATUS_FIX = "delete it: the run writes it again when it starts"


def utc_now() -> str:
    """The current UTC time, ISO 8601 to the second (``2026-11-23T16:40:00+00:00``)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def read_status(run_dir: Path | RunFolder) -> dict[str, Any]:
    """``run_dir/status.json`` ({} when absent).

    Raises:
        DamagedFileError: the file is damaged (names it)."""
    path = (run_dir if isinstance(run_dir, RunFolder) else RunFolder(run_dir)).status
    return read_json_object(path, STATUS_FIX) if path.exists() else {}


def write_status(run_dir: Path | RunFolder, run: PlannedRun, state: str, **fields: Any) -> None:
    """``runs/<name>/status.json``: what ``oelm monitor`` reads (state, stage, total steps, times).

    ``state`` "running" sets ``started_at`` (UTC; ``started_unix`` the same in seconds since the
    epoch) and clears ``finished_at`` and an earlier
    process's ``signal`` / ``failure`` (a resumed run is running, not interrupted); any other state
    sets ``finished_at``. ``fields`` are merged in (``total_steps``, ``failure``, ``signal``, ...).
    """
    folder = run_dir if isinstance(run_dir, RunFolder) else RunFolder(run_dir)
    try:
        status = read_status(folder)
    except DamagedFileError:
        status = {}  # a hand-damaged status: this write replaces it whole
    # a second "running" from the same process (total steps known) keeps its start time
    again = status.get("state") == "running" and status.get("pid") == os.getpid() and status.get("host") == platform.node()
    status.update(
        {"name": folder.name, "method": run.method, "seed": run.seed, "learning_rate": run.learning_rate,
         "stage": run.stage, "state": state, "pid": os.getpid(), "host": platform.node()}
    )
    if state == "running" and not again:
        status["started_at"] = utc_now()
        status["started_unix"] = time.time()  # seconds: overlaps between runs are computed from these
    if state == "running":
        for stale in ("finished_at", "finished_unix", "signal", "failure"):
            status.pop(stale, None)
    else:
        status["finished_at"] = utc_now()
        status["finished_unix"] = time.time()
    status.update(fields)
    write_json_atomic(folder.status, status)
