"""The Ray executor never hangs (issue 37, item 3): every setting it cannot honour ends the command
in one line naming the value and the fix, before the output folder is created or any data is
prepared. No Ray instance is started here: the refusals come before one would be, and the test
that joins an address talks to a plain TCP listener inside a loopback-only network namespace.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from _tiny_matrix import write_config
from oelm.cli import main
from oelm.matrix.executors import cpu_cores

pytest.importorskip("ray")
DRIVER = Path(__file__).with_name("_ray_connect_driver.py")


def _refused(capsys, tmp_path: Path, *args: str, env: dict | None = None) -> str:
    """``oelm run`` of the tiny matrix with ``args``: exit status 2, one ``oelm: error:`` line, and
    no output folder (nothing written, no data prepared). Returns that line."""
    out = tmp_path / "out"
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        assert main(["run", str(write_config(tmp_path)), "--output-dir", str(out), *args]) == 2
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("oelm: error: "), err
    assert not out.exists(), "the output folder was created before the refusal"
    return err[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU to give")
def test_gpus_per_run_on_a_machine_without_a_gpu_is_refused(capsys, tmp_path):
    line = _refused(capsys, tmp_path, "--executor", "ray", "--gpus-per-run", "1")
    assert "--gpus-per-run 1" in line and "has no GPU" in line and "leave --gpus-per-run out" in line


def test_more_cpus_per_run_than_the_machine_has_is_refused(capsys, tmp_path):
    line = _refused(capsys, tmp_path, "--executor", "ray", "--cpus-per-run", str(cpu_cores() + 1))
    assert f"--cpus-per-run {cpu_cores() + 1}" in line and f"use --cpus-per-run {cpu_cores()} or less" in line


def test_more_lanes_than_the_machine_fits_is_refused(capsys, tmp_path):
    line = _refused(capsys, tmp_path, "--parallel", str(cpu_cores() + 1), "--cpus-per-run", "1")
    assert f"--parallel {cpu_cores() + 1}" in line and f"use --parallel {cpu_cores()} or less" in line


@pytest.mark.parametrize("value", ["1000000", "99999999999999999999"])
def test_a_giant_parallel_is_refused_when_the_flags_are_read(capsys, tmp_path, value):
    line = _refused(capsys, tmp_path, "--parallel", value)
    assert f"executor.parallel={value}" in line and "give 1 to 4096 runs at once" in line


@pytest.mark.parametrize("address", ["not an address", "headnode", "10.0.0.1:99999", "http://10.0.0.1:6379"])
def test_an_unparsable_address_is_refused_when_the_flags_are_read(capsys, tmp_path, address):
    line = _refused(capsys, tmp_path, "--address", address)
    assert repr(address) in line and "HOST:PORT" in line


def test_an_address_with_nothing_listening_is_refused_at_once(capsys, tmp_path):
    port = _free_port()
    line = _refused(capsys, tmp_path, "--address", f"127.0.0.1:{port}")
    assert f"nothing listens at 127.0.0.1:{port}" in line and f"ray start --head --port={port}" in line


def test_address_auto_is_refused_unless_ray_address_is_set(capsys, tmp_path, monkeypatch):
    """Ray's own `auto` joins whichever instance was started last on this machine (another user's
    included); oelm's joins only the cluster RAY_ADDRESS names."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    line = _refused(capsys, tmp_path, "--address", "auto")
    assert "--address auto" in line and "RAY_ADDRESS is not set" in line
    port = _free_port()
    line = _refused(capsys, tmp_path, "--address", "auto", env={"RAY_ADDRESS": f"127.0.0.1:{port}"})
    assert f"RAY_ADDRESS=127.0.0.1:{port}: nothing listens" in line


def test_ray_missing_is_found_before_the_output_folder_or_the_data(tmp_path):
    """A Python whose `import ray` fails (a folder named ray that raises ImportError, first on the
    path): one line with the install command, and nothing written."""
    fake = tmp_path / "no-ray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named ray (this test hides it)')\n")
    out = tmp_path / "out"
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "oelm", "run", str(write_config(tmp_path)), "--output-dir", str(out),
                           "--executor", "ray"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == ["oelm: error: executor ray needs Ray: pip install 'oelm[ray]' (or pip "
                                                "install ray), or use the local executor"]
    assert not out.exists()


def _netns_works() -> bool:
    if not shutil.which("unshare") or not shutil.which("ip"):
        return False
    return subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _netns_works(), reason="needs `unshare -n` (root) to keep the connection on a loopback-only network")
def test_sigterm_while_joining_a_cluster_ends_the_command_at_once(tmp_path):
    """`--address` at a port that accepts and never answers (not a Ray head): Ray's connection
    waits ~40 s in C++, where Python's signal handlers do not run. SIGTERM meanwhile ends oelm
    within seconds: exit status 130, one line, no output folder."""
    out = tmp_path / "out"
    script = f"ip link set lo up && {sys.executable} {DRIVER} {write_config(tmp_path)} {out}"
    proc = subprocess.run(["unshare", "-n", "sh", "-c", script], capture_output=True, text=True, timeout=300,
                          env=os.environ | {"RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": str(tmp_path)})
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["connections"] >= 2, report  # oelm's probe, then Ray's own connection
    assert report["returncode"] == 130, report
    assert report["seconds"] < 10, report  # without the fix: ~40 s, until Ray gives up
    lines = [line for line in report["log"].splitlines() if line.startswith("oelm: ")]
    assert lines[-1].startswith("oelm: interrupted: SIGTERM while joining the Ray cluster at 127.0.0.1:"), report["log"]
    assert "Traceback" not in report["log"] and not out.exists()
