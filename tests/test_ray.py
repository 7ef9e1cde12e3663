"""The Ray executor (CPU, this machine): a matrix through Ray equals the local executor bit for bit;
a SIGKILLed Ray worker's run is retried and resumes from its checkpoint to the same result; a
two-node cluster joined by --address runs a matrix.

Ray stays on this machine: every test starts Ray only inside a network namespace it makes itself
(`unshare -n`, then `ip link set lo up`), where loopback is the only interface, and with usage
statistics off. Nothing can leave the machine from there.
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
# Every test that starts Ray stays in this file: `make test` hands a whole file to one worker
# (--dist loadfile), and `ray stop --force` and the "no raylet left" check below act on every Ray
# process of the machine, so no other Ray test may run beside these.
pytestmark = pytest.mark.slow

ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token", "PYTHONUNBUFFERED": "1"}


def _netns_works() -> bool:
    if not shutil.which("unshare") or not shutil.which("ip"):
        return False
    probe = subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up"], capture_output=True)
    return probe.returncode == 0


needs_netns = pytest.mark.skipif(not _netns_works(), reason="needs `unshare -n` (root) to keep Ray on a loopback-only network")


def _in_netns(script: str, **popen) -> subprocess.Popen:
    """Run shell ``script`` in a new network namespace whose only interface is loopback."""
    return subprocess.Popen(["unshare", "-n", "sh", "-c", "ip link set lo up && " + script],
                            env=os.environ | ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)


def _oelm(*args: str) -> str:
    return " ".join([sys.executable, "-m", "oelm", *map(str, args)])


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_dir):
    """The tiny matrix through the local executor with one thread a run, as the Ray runs have."""
    tmp = tmp_path_factory.mktemp("ray-reference")
    cfg = write_config(tmp)
    assert main(["run", str(cfg), "--output-dir", str(tmp / "out"), "--cpus-per-run", "1"]) == 0
    return cfg, tmp / "out"


@needs_netns
def test_a_matrix_on_a_local_ray_instance_equals_the_local_executor_bit_for_bit(reference, tmp_path):
    """2 CPUs, one per run: the 4 trained runs and the promotion through Ray tasks, side by side.
    Every run's performance, metrics log and best-weights sha256 equal the local executor's."""
    cfg, ref = reference
    out = tmp_path / "out"
    proc = _in_netns(_oelm("run", cfg, "--output-dir", out, "--executor", "ray", "--cpus-per-run", "1"))
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log
    assert f"ray: 1 node(s), {cpu_cores()} CPU" in log
    assert numbers(out) == numbers(ref)
    records = [json.loads(p.read_text()) for p in out.glob("runs/*/result.json")]
    assert {r["executor"]["name"] for r in records} == {"ray"}
    assert all(r["executor"]["node_id"] and r["executor"]["pid"] != proc.pid for r in records)
    for r in records:  # each run's console output, written by the Ray worker that trained it (no Ray prefix)
        lines = (out / "runs" / r["run_name"] / "train.log").read_text().splitlines()
        assert lines[0].endswith(f"(pid {r['executor']['pid']})") and f"training {r['run_name']} on" in lines[0]
        assert any(x.startswith(f"[{r['run_name']}] best validation") for x in lines), lines
    comparison = json.loads((out / "comparison.json").read_text())
    assert comparison["execution"]["executors"] == ["ray"]
    # the same folder reads the same way whichever executor wrote it
    assert main(["monitor", str(out), "--once"]) == 0


@needs_netns
def test_a_sigkilled_ray_worker_is_retried_and_its_run_resumes_to_the_same_result(reference, tmp_path):
    """One run at a time (--parallel 1), each long enough to be caught: once the first run has a
    checkpoint, its Ray worker process (the pid in its status.json) is SIGKILLed. Ray starts the
    task again in a new worker, which resumes from that checkpoint; the matrix equals the local
    executor's with the same settings."""
    longer = ["training.max_steps=240", "training.checkpoint_every=20", "training.eval_every=60"]
    cfg, _ = reference
    ref = tmp_path / "ref"
    assert main(["run", str(cfg), "--output-dir", str(ref), "--cpus-per-run", "1", *longer]) == 0
    out = tmp_path / "out"
    proc = _in_netns(_oelm("run", cfg, "--output-dir", out, "--executor", "ray", "--parallel", "1", "--cpus-per-run", "1",
                           *longer))
    first = out / "runs" / "baseline-lr0.0001-seed0"
    deadline = time.time() + 300
    killed = None
    while killed is None and time.time() < deadline and proc.poll() is None:
        status = first / "status.json"
        if list((first / "checkpoints").glob("step-*")) and status.exists():
            state = json.loads(status.read_text())
            if state.get("state") == "running" and not (first / "result.json").exists():
                os.kill(state["pid"], signal.SIGKILL)
                killed = state["pid"]
        time.sleep(0.02)
    log, _ = proc.communicate(timeout=600)
    assert killed is not None, f"the first run was never caught with a checkpoint:\n{log}"
    assert proc.returncode == 0, log
    assert "unfinished; continuing" in log
    result = json.loads((first / "result.json").read_text())
    assert result["executor"]["pid"] != killed
    assert numbers(out) == numbers(ref)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_netns
def test_a_two_node_cluster_on_this_machine_runs_a_matrix_through_address(reference, tmp_path):
    """`ray start --head` and a second `ray start --address` (1 CPU each, 127.0.0.2 inside the
    test's own network namespace), then `oelm run --executor ray --address`: the runs spread over
    both nodes, the numbers equal the local executor's, and the cluster is stopped after
    (`ray stop --force` stops every Ray process of this machine: no other Ray may run beside it)."""
    cfg, ref = reference
    out, port = tmp_path / "out", _free_port()
    ray = str(Path(sys.executable).with_name("ray"))
    temp = tempfile.mkdtemp(prefix="oelm-ray-")  # Ray's socket paths must stay under 108 bytes: not under tmp_path
    node = f"--node-ip-address=127.0.0.2 --num-cpus=1 --disable-usage-stats --temp-dir={temp}"
    script = (
        f"{ray} start --head --port={port} --include-dashboard=false {node} > {tmp_path / 'head.log'} 2>&1 && "
        f"{ray} start --address=127.0.0.2:{port} {node} > {tmp_path / 'node.log'} 2>&1 && "
        + _oelm("run", cfg, "--output-dir", out, "--executor", "ray", "--address", f"127.0.0.2:{port}", "--cpus-per-run", "1")
        + f"; rc=$?; {ray} stop --force > /dev/null 2>&1; exit $rc"
    )
    proc = _in_netns(script, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)
    assert proc.returncode == 0, log + "".join(p.read_text() for p in tmp_path.glob("*.log"))
    assert "ray: 2 node(s), 2 CPU" in log
    records = [json.loads(p.read_text()) for p in out.glob("runs/*/result.json")]
    assert len({r["executor"]["node_id"] for r in records}) == 2  # both nodes trained runs
    assert numbers(out) == numbers(ref)


@needs_netns
def test_sigterm_stops_a_ray_matrix_leaves_no_ray_process_and_a_rerun_continues(reference, tmp_path):
    """SIGTERM to the driving `oelm run` (its pid from the output folder's lock): exit status 130,
    the local Ray instance is stopped with it (no raylet left), and rerunning the same command
    continues the interrupted run from its checkpoint and finishes the matrix."""
    from oelm.lock import read_holder

    cfg, _ = reference
    out = tmp_path / "out"
    longer = ["training.max_steps=240", "training.checkpoint_every=20", "training.eval_every=60"]
    command = _oelm("run", cfg, "--output-dir", out, "--executor", "ray", "--parallel", "1", "--cpus-per-run", "1", *longer)
    proc = _in_netns(command)
    first = out / "runs" / "baseline-lr0.0001-seed0"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not list((first / "checkpoints").glob("step-*")):
        time.sleep(0.05)
    os.kill(read_holder(out)["pid"], signal.SIGTERM)
    log, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, log
    time.sleep(2)
    assert subprocess.run(["pgrep", "-f", "raylet"], capture_output=True).stdout == b"", "a Ray process outlived the driver"
    again = _in_netns(command)
    log, _ = again.communicate(timeout=600)
    assert again.returncode == 0, log
    assert "[baseline-lr0.0001-seed0] unfinished; continuing" in log
    assert json.loads((first / "result.json").read_text())["status"] == "finished"
