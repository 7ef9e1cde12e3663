"""The Ray executor (CPU, this machine): a matrix through Ray equals the local executor bit for bit
at both executors' default settings; a SIGKILLed Ray worker's run is retried and resumes from its
checkpoint to the same result; a killed raylet (a lost node) stops the matrix with one line and a
rerun finishes it; a two-node cluster joined by --address runs a matrix.

Ray stays on this machine: every test starts Ray only inside a network namespace it makes itself
(`unshare -n`, then `ip link set lo up`), where loopback is the only interface, and with usage
statistics off. Nothing can leave the machine from there.

Each test stops only what it started: its Ray instance lives in a temp folder of its own
(``RAY_TMPDIR``, ``ray start --temp-dir``), and its processes are found by that folder (in their
command line or environment) and stopped by PID. Never by name: a Ray cluster of someone else on
this machine (an experiment, another test run) is left alone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from _tiny_matrix import CONFIG, numbers, write_config
from oelm.cli import main
from oelm.matrix.executors import cpu_cores

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token", "PYTHONUNBUFFERED": "1"}
#: Long enough runs (about 7 s each here) to be caught with a checkpoint.
LONGER = ["training.max_steps=160", "training.checkpoint_every=20", "training.eval_every=40"]
#: The kill tests' matrix: the tiny matrix with baseline at one learning rate instead of its sweep,
#: three runs (baseline, OELM-Freeze, OELM-Random): a finished run, one training and one still to
#: come (the raylet test needs a run after the one caught: the worker may outlive its raylet long
#: enough to finish it); the sweep and its promotion through Ray are the bit-for-bit test's
#: (``reference``).
SWEEP = "learning_rates: [1.0e-4, 3.0e-3]"
assert SWEEP in CONFIG
LONGER_CONFIG = CONFIG.replace(SWEEP, "learning_rate: 3.0e-3")


def _netns_works() -> bool:
    if not shutil.which("unshare") or not shutil.which("ip"):
        return False
    probe = subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up"], capture_output=True)
    return probe.returncode == 0


needs_netns = pytest.mark.skipif(not _netns_works(), reason="needs `unshare -n` (root) to keep Ray on a loopback-only network")


def own_processes(temp: str) -> list[tuple[int, str]]:
    """(pid, name) of every process that belongs to the Ray instance in ``temp``: ``temp`` in its
    command line (gcs_server, raylet, Ray's agents) or as its ``RAY_TMPDIR`` (the drivers and
    workers, which inherit the test's environment). This process excluded."""
    found, marker = [], f"RAY_TMPDIR={temp}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
            name = (entry / "comm").read_text().strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if temp.encode() in cmdline or marker in environ.split(b"\0"):
            found.append((int(entry.name), name))
    return found


def stop_own_processes(temp: str) -> None:
    """SIGTERM, then after 5 s SIGKILL, to each process of the instance in ``temp``, by PID."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        for pid, _ in own_processes(temp):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + wait
        while own_processes(temp) and time.time() < deadline:
            time.sleep(0.1)


@pytest.fixture
def own_ray():
    """A temp folder of this test's own for Ray (its socket paths must stay under 108 bytes: not
    under tmp_path); every process of the instance in it is stopped after the test."""
    temp = tempfile.mkdtemp(prefix="oelm-ray-", dir="/tmp")
    try:
        yield temp
    finally:
        stop_own_processes(temp)
        shutil.rmtree(temp, ignore_errors=True)


def _in_netns(script: str, temp: str, **popen) -> subprocess.Popen:
    """Run shell ``script`` in a new network namespace whose only interface is loopback, with Ray's
    temp folder ``temp``."""
    return subprocess.Popen(["unshare", "-n", "sh", "-c", "ip link set lo up && " + script],
                            env=os.environ | ENV | {"RAY_TMPDIR": temp}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **popen)


def _oelm(*args: str) -> str:
    return " ".join([sys.executable, "-m", "oelm", *map(str, args)])


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_dir):
    """The tiny matrix through the local executor at its default settings (this process's threads)."""
    tmp = tmp_path_factory.mktemp("ray-reference")
    cfg = write_config(tmp)
    assert main(["run", str(cfg), "--output-dir", str(tmp / "out")]) == 0
    return cfg, tmp / "out"


@pytest.fixture(scope="module")
def longer_reference(tmp_path_factory, data_dir):
    """The kill tests' matrix (``LONGER_CONFIG``) with runs long enough to be caught mid-way
    (``LONGER``), local executor."""
    tmp = tmp_path_factory.mktemp("ray-longer")
    cfg = write_config(tmp, LONGER_CONFIG)
    assert main(["run", str(cfg), "--output-dir", str(tmp / "out"), *LONGER]) == 0
    assert sorted(p.name for p in (tmp / "out" / "runs").iterdir()) == ["baseline-seed0", "oelm_freeze-seed0", "oelm_random-seed0"]
    return cfg, tmp / "out"


@needs_netns
def test_a_matrix_on_a_local_ray_instance_equals_the_local_executor_bit_for_bit(reference, own_ray, tmp_path):
    """Both executors at their default settings (no --parallel, no --cpus-per-run): Ray trains one
    run at a time with the local executor's thread count, so every run's performance, metrics log
    and best-weights sha256 equal the local executor's, and each result records the same threads."""
    import torch

    cfg, ref = reference
    out = tmp_path / "out"
    proc = _in_netns(_oelm("run", cfg, "--output-dir", out, "--executor", "ray"), own_ray)
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log
    assert f"ray: 1 node(s), {cpu_cores()} CPU" in log and "at most 1 at a time" in log
    assert numbers(out) == numbers(ref)
    records = [json.loads(p.read_text()) for p in out.glob("runs/*/result.json")]
    local = [json.loads(p.read_text()) for p in ref.glob("runs/*/result.json")]
    assert {r["executor"]["name"] for r in records} == {"ray"}
    assert {r["executor"]["threads"] for r in records} == {r["executor"]["threads"] for r in local} \
        == {torch.get_num_threads()}
    assert all(r["executor"]["node_id"] and r["executor"]["pid"] != proc.pid for r in records)
    for r in records:  # each run's console output, written by the Ray worker that trained it (no Ray prefix)
        lines = (out / "runs" / r["run_name"] / "train.log").read_text().splitlines()
        assert lines[0].endswith(f"(pid {r['executor']['pid']})") and f"training {r['run_name']} on" in lines[0]
        assert any(x.startswith(f"[{r['run_name']}] best validation") for x in lines), lines
    comparison = json.loads((out / "comparison.json").read_text())
    assert comparison["execution"]["executors"] == ["ray"]
    # the same folder reads the same way whichever executor wrote it
    assert main(["monitor", str(out), "--once"]) == 0


def _caught(out: Path, proc: subprocess.Popen, want, seconds: float = 300):
    """Poll the runs' status files until ``want(run_dir, status)`` returns something (or the driver
    ends, or ``seconds`` pass); returns that."""
    deadline = time.time() + seconds
    while time.time() < deadline and proc.poll() is None:
        for status in out.glob("runs/*/status.json"):
            try:
                state = json.loads(status.read_text())
            except (OSError, ValueError):
                continue  # being replaced
            found = want(status.parent, state)
            if found:
                return found
        time.sleep(0.02)
    return None


def _training_with_a_checkpoint(run_dir: Path, state: dict):
    if state.get("state") == "running" and list((run_dir / "checkpoints").glob("step-*")) \
            and not (run_dir / "result.json").exists():
        return run_dir, state
    return None


@needs_netns
def test_a_sigkilled_ray_worker_is_retried_and_its_run_resumes_to_the_same_result(longer_reference, own_ray, tmp_path):
    """Once the first run has a checkpoint, its Ray worker process (the pid in its status.json) is
    SIGKILLed. Ray starts the task again in a new worker, which resumes from that checkpoint; the
    matrix equals the local executor's with the same settings."""
    cfg, ref = longer_reference
    out = tmp_path / "out"
    proc = _in_netns(_oelm("run", cfg, "--output-dir", out, "--executor", "ray", *LONGER), own_ray)
    caught = _caught(out, proc, _training_with_a_checkpoint)
    if caught:
        os.kill(caught[1]["pid"], signal.SIGKILL)
    log, _ = proc.communicate(timeout=600)
    assert caught is not None, f"no run was caught with a checkpoint:\n{log}"
    run_dir, state = caught
    assert proc.returncode == 0, log
    assert f"[{run_dir.name}] unfinished; continuing" in log
    result = json.loads((run_dir / "result.json").read_text())
    assert result["executor"]["pid"] != state["pid"]
    assert numbers(out) == numbers(ref)


@needs_netns
def test_a_worker_killed_beyond_its_retries_is_one_line_naming_the_run(longer_reference, own_ray, tmp_path):
    """`executor.max_retries=0`: the training run's Ray worker SIGKILLed once is a run Ray gives up
    on. The driver ends with exit status 2 and one line naming that run, the retries and "rerun the
    same command to continue"; no traceback."""
    cfg, _ = longer_reference
    out = tmp_path / "out"
    proc = _in_netns(_oelm("run", cfg, "--output-dir", out, "--executor", "ray", "executor.max_retries=0", *LONGER),
                     own_ray)
    caught = _caught(out, proc, _training_with_a_checkpoint)
    if caught:
        os.kill(caught[1]["pid"], signal.SIGKILL)
    log, _ = proc.communicate(timeout=300)
    assert caught is not None, f"no run was caught with a checkpoint:\n{log}"
    assert proc.returncode == 2, log
    assert "Traceback" not in log, log
    assert [line for line in log.splitlines() if line.startswith("oelm: error: ")] == [
        f"oelm: error: run {caught[0].name} was interrupted: its Ray worker process died 1 time(s) "
        "(executor.max_retries=0); the finished runs are kept: rerun the same command to continue"], log


@needs_netns
def test_a_killed_raylet_stops_the_matrix_with_one_line_and_a_rerun_finishes_it(longer_reference, own_ray, tmp_path):
    """A lost node, for real: once one run has finished and another is training, the raylet of the
    Ray instance this test started (found by its own temp folder) is SIGKILLed. The driver ends with
    a non-zero status and one line naming a run of the matrix and "rerun the same command to
    continue", no traceback; the finished run is kept as it was, and rerunning the same command
    finishes the matrix with the local executor's numbers."""
    cfg, ref = longer_reference
    out = tmp_path / "out"
    command = _oelm("run", cfg, "--output-dir", out, "--executor", "ray", *LONGER)
    proc = _in_netns(command, own_ray)

    def second_run_training(run_dir: Path, state: dict):
        if list(out.glob("runs/*/result.json")):
            return _training_with_a_checkpoint(run_dir, state)
        return None

    caught = _caught(out, proc, second_run_training)
    raylets = [pid for pid, name in own_processes(own_ray) if name == "raylet"]
    finished = {p: p.read_bytes() for p in out.glob("runs/*/result.json")}
    for pid in raylets:
        os.kill(pid, signal.SIGKILL)
    log, _ = proc.communicate(timeout=300)
    assert caught is not None and len(raylets) == 1, f"no second run caught training, or raylets {raylets}:\n{log}"
    assert proc.returncode == 2, log
    assert "Traceback" not in log, log
    lines = [line for line in log.splitlines() if line.startswith("oelm: error: run ")]
    assert len(lines) == 1 and lines[0].endswith("rerun the same command to continue"), log
    # the run the driver was waiting for: the one training, or the next (the worker may outlive its
    # raylet long enough to finish the run it had)
    assert lines[0].split()[3] in {p.name for p in ref.glob("runs/*")}, lines[0]
    assert all(p.read_bytes() == data for p, data in finished.items())  # the finished run kept as it was
    again = _in_netns(command, own_ray)
    log, _ = again.communicate(timeout=600)
    assert again.returncode == 0, log
    assert numbers(out) == numbers(ref)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_netns
def test_a_two_node_cluster_on_this_machine_runs_a_matrix_through_address(reference, own_ray, tmp_path):
    """`ray start --head` and a second `ray start --address` (1 CPU each, 127.0.0.2 inside the
    test's own network namespace, the test's own temp folder), then `oelm run --executor ray
    --address ... --parallel 2 --cpus-per-run 1`: the runs spread over both nodes, the numbers
    equal the local executor's with one thread a run, and the cluster's processes are stopped
    after by PID (found by the temp folder; `ray stop` would stop every Ray of this machine)."""
    cfg, _ = reference
    ref = tmp_path / "ref"
    assert main(["run", str(cfg), "--output-dir", str(ref), "--cpus-per-run", "1"]) == 0
    out, port = tmp_path / "out", _free_port()
    ray = str(Path(sys.executable).with_name("ray"))
    node = f"--node-ip-address=127.0.0.2 --num-cpus=1 --disable-usage-stats --temp-dir={own_ray}"
    script = (
        f"{ray} start --head --port={port} --include-dashboard=false {node} > {tmp_path / 'head.log'} 2>&1 && "
        f"{ray} start --address=127.0.0.2:{port} {node} > {tmp_path / 'node.log'} 2>&1 && "
        + _oelm("run", cfg, "--output-dir", out, "--executor", "ray", "--address", f"127.0.0.2:{port}",
                "--parallel", "2", "--cpus-per-run", "1")
    )
    proc = _in_netns(script, own_ray)
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log + "".join(p.read_text() for p in tmp_path.glob("*.log"))
    assert "ray: 2 node(s), 2 CPU" in log
    records = [json.loads(p.read_text()) for p in out.glob("runs/*/result.json")]
    assert len({r["executor"]["node_id"] for r in records}) == 2  # both nodes trained runs
    assert numbers(out) == numbers(ref)


@needs_netns
def test_sigterm_stops_a_ray_matrix_leaves_no_ray_process_and_a_rerun_continues(longer_reference, own_ray, tmp_path):
    """SIGTERM to the driving `oelm run` (its pid from the output folder's lock): exit status 130,
    the local Ray instance it started is stopped with it (no process of it left), and rerunning
    the same command continues the interrupted run from its checkpoint and finishes the matrix."""
    from oelm.runtime.lock import read_holder

    cfg, _ = longer_reference
    out = tmp_path / "out"
    command = _oelm("run", cfg, "--output-dir", out, "--executor", "ray", *LONGER)
    proc = _in_netns(command, own_ray)
    caught = _caught(out, proc, _training_with_a_checkpoint)
    os.kill(read_holder(out)["pid"], signal.SIGTERM)
    log, _ = proc.communicate(timeout=120)
    assert caught is not None, log
    assert proc.returncode == 130, log
    deadline = time.time() + 10
    while own_processes(own_ray) and time.time() < deadline:
        time.sleep(0.2)
    assert own_processes(own_ray) == [], "a process of the driver's Ray instance outlived it"
    again = _in_netns(command, own_ray)
    log, _ = again.communicate(timeout=600)
    assert again.returncode == 0, log
    assert f"[{caught[0].name}] unfinished; continuing" in log
    assert json.loads((caught[0] / "result.json").read_text())["status"] == "finished"
