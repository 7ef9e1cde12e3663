"""scripts/evidence.sh runs its chain in the background priority it documents: nice 19 by default, and,
where the chain leads a session of its own (``setsid``), that session's autogroup nice too (Linux's
sched_autogroup shares the CPU between sessions before nice counts inside one); ``EVIDENCE_NICE=0``
keeps the caller's priority; a bad value is one line. The chain's Python is a stand-in that records the
priority it was started with, so no run trains here."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "evidence.sh"
AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")


def _autogroup_on() -> bool:
    try:
        return AUTOGROUP.read_text().strip() == "1" and Path("/proc/self/autogroup").is_file()
    except OSError:
        return False


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """An evidence folder shared by the tests (HEAD exported once) and a stand-in Python that appends
    the nice value and the autogroup of each call to the file named by $RECORD."""
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout: evidence.sh exports a commit")
    base = tmp_path_factory.mktemp("evidence")
    python = base / "python"
    python.write_text('#!/bin/sh\necho "$(ps -o ni= -p $$ | tr -d \' \')|$(cat /proc/self/autogroup 2>/dev/null)" >> "$RECORD"\n')
    python.chmod(0o755)
    return base, python


def _run(chain, tmp_path, *, setsid: bool, nice: str | None = None) -> tuple[subprocess.CompletedProcess, list[tuple[int, str]]]:
    base, python = chain
    record = tmp_path / "record.txt"
    env = {**os.environ, "EVIDENCE_DIR": str(base / "dir"), "PYTHON": str(python), "RECORD": str(record)}
    env.pop("EVIDENCE_NICE", None)
    if nice is not None:
        env["EVIDENCE_NICE"] = nice
    cmd = (["setsid", "-w"] if setsid else []) + [str(SCRIPT), "HEAD", "configs/quickstart.yaml"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    lines = record.read_text().splitlines() if record.is_file() else []
    calls = [(int(n), group) for n, group in (line.split("|", 1) for line in lines)]
    return res, calls


def test_the_chain_runs_at_nice_19_and_lowers_its_own_sessions_autogroup(chain, tmp_path):
    res, calls = _run(chain, tmp_path, setsid=True)
    assert res.returncode == 0, res.stderr
    assert len(calls) == 2  # the version line and `oelm run` of the one config, both from the stand-in
    assert all(n == 19 for n, _ in calls), calls
    if _autogroup_on():
        assert all(group.endswith("nice 19") for _, group in calls), calls
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    assert (chain[0] / "dir" / f"oelm-{sha}" / ".exported").is_file()  # the export, as before


def test_a_chain_in_the_callers_session_leaves_that_sessions_autogroup_alone(chain, tmp_path):
    before = Path("/proc/self/autogroup").read_text() if _autogroup_on() else None
    res, calls = _run(chain, tmp_path, setsid=False)
    assert res.returncode == 0, res.stderr
    assert calls and all(n == 19 for n, _ in calls), calls
    if before is not None:
        assert Path("/proc/self/autogroup").read_text() == before
        assert all(group == before.strip() for _, group in calls), (calls, before)


def test_evidence_nice_0_keeps_the_callers_priority_and_a_bad_value_is_one_line(chain, tmp_path):
    res, calls = _run(chain, tmp_path, setsid=True, nice="0")
    assert res.returncode == 0, res.stderr
    mine = os.nice(0)
    assert calls and all(n == mine for n, _ in calls), (calls, mine)
    if _autogroup_on():
        assert all(group.endswith("nice 0") for _, group in calls), calls  # a new session's default
    for bad in ("20", "-5", "low"):
        res, calls = _run(chain, tmp_path / bad, setsid=False, nice=bad)
        assert res.returncode == 2 and not calls
        assert res.stderr.count("\n") == 1 and "EVIDENCE_NICE must be a whole number from 0 to 19" in res.stderr
        assert f"got '{bad}'" in res.stderr
