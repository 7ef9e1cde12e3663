"""One `oelm run` per output directory: a second one is refused naming the holder, a lock left by
a killed process is taken over, and the lock is released on every way out of run_experiment."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from oelm.cli import main
from oelm.config import load_config
from oelm.errors import OELMError, OutputLockedError, RunInterruptedError
import oelm.matrix as matrix
import oelm.matrix.driver as driver
from oelm.runtime.lock import LOCK_NAME, acquire, read_holder, release

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
HOLDER = (
    "import sys\n"
    "from oelm.runtime.lock import acquire\n"
    "acquire(sys.argv[1])\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"  # hold until the test closes stdin (or kills us)
)


def _hold_in_another_process(out: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "held", proc.stderr.read()
    return proc


def test_second_run_is_refused_naming_the_holder_then_a_killed_holders_lock_is_taken_over(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    proc = _hold_in_another_process(out)
    try:
        code = main(["run", str(QUICKSTART), "--output-dir", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and err.startswith("oelm: error: ")
        assert f"is in use by another oelm run (pid {proc.pid} on host {socket.gethostname()}, started " in err
        assert "use another --output-dir" in err and "Traceback" not in err
        assert not (out / "config.yaml").exists()  # refused before anything was written
    finally:
        proc.kill()  # SIGKILL: no cleanup, the lock file stays with the dead pid in it
        proc.wait()
    assert read_holder(out)["pid"] == proc.pid
    fd = acquire(out)  # the kernel released the dead process's flock: taken over
    try:
        assert read_holder(out)["pid"] == os.getpid()
    finally:
        release(fd, out)
    assert not (out / LOCK_NAME).exists()


def test_stale_lock_file_of_a_dead_pid_is_taken_over(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "started_at": "x"}))
    fd = acquire(tmp_path)
    try:
        assert read_holder(tmp_path)["pid"] == os.getpid()
        with pytest.raises(OutputLockedError, match=f"pid {os.getpid()} on host"):
            acquire(tmp_path)  # held now, even within one process
    finally:
        release(fd, tmp_path)


def test_lock_of_another_host_is_refused_with_how_to_remove_it(tmp_path):
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": 4242, "host": "node-17", "started_at": "2024-05-01T10:00:00+00:00"}))
    with pytest.raises(OutputLockedError) as info:
        acquire(tmp_path)
    msg = str(info.value)
    assert "another host (pid 4242 on host node-17, started 2024-05-01T10:00:00+00:00)" in msg
    assert f"delete {tmp_path / LOCK_NAME} and rerun" in msg
    assert (tmp_path / LOCK_NAME).exists()  # not removed: it is someone else's


@pytest.mark.parametrize("exc", [None, OELMError("boom"), RunInterruptedError("stopped", step=3)])
def test_lock_is_held_during_the_run_and_released_after_it(tmp_path, monkeypatch, exc):
    out = tmp_path / "out"
    seen = {}

    def fake_matrix(config, out_, log, retry_failed, allow_missing_weights, executor, phases):
        seen["holder"] = read_holder(out_)
        if exc is not None:
            raise exc
        return {"ok": True}

    monkeypatch.setattr(driver, "_drive", fake_matrix)
    config = load_config(QUICKSTART)
    if exc is None:
        assert matrix.run_matrix(config, out) == {"ok": True}
    else:
        with pytest.raises(type(exc)):
            matrix.run_matrix(config, out)
    assert seen["holder"]["pid"] == os.getpid()
    assert not (out / LOCK_NAME).exists()
    release(acquire(out), out)  # free again


def test_only_the_main_process_takes_the_lock(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(driver, "is_main_process", lambda: False)
    monkeypatch.setattr(driver, "_drive", lambda c, o, l, r, a, e, p: seen.setdefault("exists", (o / LOCK_NAME).exists()))
    matrix.run_matrix(load_config(QUICKSTART), tmp_path)
    assert seen["exists"] is False


def test_lock_path_that_is_a_directory_is_one_line_naming_it(tmp_path, capsys):
    """A `.oelm.lock` directory (made by hand or a sync tool) was an IsADirectoryError traceback."""
    from oelm.runtime.lock import hold_shared_lock

    out = tmp_path / "out"
    (out / LOCK_NAME).mkdir(parents=True)
    assert main(["run", str(QUICKSTART), "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"oelm: error: {out / LOCK_NAME} is a directory, not oelm's lock file; remove it (rm -r {out / LOCK_NAME})" in err
    with pytest.raises(OutputLockedError, match="is a directory, not oelm's lock file"):
        with hold_shared_lock(out):
            pass
    assert (out / LOCK_NAME).is_dir()  # left for the user to look at
