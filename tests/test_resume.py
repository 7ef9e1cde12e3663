"""Kill-and-resume on a real tiny run (oelm GPT, TinyStories, dropout on): SIGKILL at random
steps, SIGTERM graceful stop, corrupted checkpoints. Every resumed run must end bit-identical
(metrics, metrics.jsonl, every weight) to an uninterrupted run (CPU, fp32)."""

from __future__ import annotations

import json
import os
import random
import signal

import pytest
import torch

from _reliability import (comparable, in_process, in_process_summary, metrics_records, run, sigterm_at, start,
                          wait_for_step)
from oelm.errors import RunInterruptedError
from oelm.io import verify_dir

TOTAL_STEPS = 90  # _train_driver.BASE: 90 steps over 2 epochs, checkpoint every 7, log every 3
SLOW = ("--step-sleep", "0.03")  # throttle so kills land on chosen steps; changes no number


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_dir):
    """One uninterrupted run in a fresh process."""
    d = tmp_path_factory.mktemp("reference")
    code, result, err = run(d / "run", d / "out.json")
    assert code == 0, err
    return result, metrics_records(d / "run")


@pytest.mark.slow
def test_sigkill_at_random_steps_then_resume_is_bit_identical(tmp_path, reference):
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)  # the seed is in every failure message, to replay the kill steps
    run_dir, out = tmp_path / "run", tmp_path / "out.json"
    kills = []
    for _ in range(3):
        # The kill lands on the first logged step >= target (logs every 3 steps), so it can pass
        # the target; stop choosing once no step >= 4 past the last kill is left before the end.
        low, high = (kills[-1] + 4 if kills else 5), TOTAL_STEPS - 8
        if low > high:
            break
        proc = start(run_dir, out, *SLOW)
        kills.append(wait_for_step(proc, run_dir, rng.randint(low, high)))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    code, result, err = run(run_dir, out)
    assert code == 0, f"killed at steps {kills} (rng seed {seed}): {err}"
    assert len(result["timing"]["process_start_steps"]) >= 2, (kills, seed)  # it really resumed
    assert comparable(result) == comparable(reference[0]), f"killed at steps {kills} (rng seed {seed})"
    assert metrics_records(run_dir) == reference[1]  # nothing lost, nothing repeated
    assert not (run_dir / "checkpoints").exists()  # removed once finished


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_exits_nonzero_and_resumes_identically(tmp_path, reference):
    run_dir, out = tmp_path / "run", tmp_path / "out.json"
    proc = start(run_dir, out, *SLOW)
    wait_for_step(proc, run_dir, 25)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err  # the driver's exit code for RunInterruptedError
    stopped = json.loads(out.read_text())["interrupted"]
    assert stopped["signal"] == "SIGTERM" and 25 <= stopped["step"] < TOTAL_STEPS
    ckpt = run_dir / "checkpoints" / f"step-{stopped['step']}"
    assert ckpt.is_dir() and verify_dir(ckpt) is None
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == sorted(  # keep_checkpoints=2
        p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step-"))
    assert len(list((run_dir / "checkpoints").iterdir())) == 2
    out.unlink()
    code, result, err = run(run_dir, out)
    assert code == 0, err
    assert result["timing"]["process_start_steps"] == [0, stopped["step"]]
    assert comparable(result) == comparable(reference[0])
    assert metrics_records(run_dir) == reference[1]


def _corrupt(ckpt, how: str) -> None:
    if how == "flip_byte":
        path = ckpt / "model.safetensors"
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    elif how == "truncate":
        path = ckpt / "state.pt"
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:  # a checkpoint whose manifest was never written
        (ckpt / "manifest.json").unlink()


@pytest.mark.parametrize("how", ["flip_byte", "truncate", "no_manifest"])
def test_corrupted_newest_checkpoint_is_skipped_for_the_previous_one(tmp_path, reference, how):
    run_dir = tmp_path / "run"
    with pytest.raises(RunInterruptedError) as info:
        in_process(run_dir, hook=sigterm_at(31))
    assert info.value.step == 31 and info.value.signal_name == "SIGTERM"
    ckpts = sorted((run_dir / "checkpoints").iterdir())
    assert [p.name for p in ckpts] == ["step-28", "step-31"]
    _corrupt(run_dir / "checkpoints" / "step-31", how)
    assert verify_dir(run_dir / "checkpoints" / "step-31") is not None
    with pytest.warns(RuntimeWarning, match="step-31 failed its integrity check"):
        result, model, _ = in_process(run_dir)
    assert result.timing["process_start_steps"] == [0, 28]  # resumed from the previous good one
    assert in_process_summary(result, model, run_dir) == comparable(reference[0])
    assert metrics_records(run_dir) == reference[1]


@pytest.mark.parametrize("written", [0, 2, None])
def test_a_checkpoint_of_another_format_is_refused_in_one_line(tmp_path, data_dir, monkeypatch, written):
    """A checkpoint written by an older or a newer oelm (another trainer_state format, intact
    manifest) is refused on resume with one line naming it, both formats and the fix; nothing of
    the run is removed. ``None``: a trainer_state.json without a format."""
    import oelm.training.checkpoint as checkpoint
    from oelm.errors import ConfigError

    run_dir = tmp_path / "run"
    monkeypatch.setattr(checkpoint, "CHECKPOINT_FORMAT", written)  # what the other oelm writes
    with pytest.raises(RunInterruptedError):
        in_process(run_dir, hook=sigterm_at(10))
    monkeypatch.undo()
    ckpt = max((run_dir / "checkpoints").iterdir(), key=lambda p: int(p.name.split("-")[1]))  # step-10: the SIGTERM
    assert verify_dir(ckpt) is None and json.loads((ckpt / "trainer_state.json").read_text())["format"] == written
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    with pytest.raises(ConfigError) as info:
        in_process(run_dir)
    message = str(info.value)
    age = "a newer" if written == 2 else "an older"
    assert message == (f"the checkpoint {ckpt} has format {written!r}, but this oelm reads format 1 (it was written by "
                       f"{age} oelm); set training.resume=false to start this run over, or resume it with the oelm that "
                       "wrote it")
    assert "\n" not in message and sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before


def test_resume_false_starts_over(tmp_path, reference):
    run_dir = tmp_path / "run"
    with pytest.raises(RunInterruptedError):
        in_process(run_dir, hook=sigterm_at(10))
    result, model, _ = in_process(run_dir, "training.resume=false")
    assert result.timing["process_start_steps"] == [0]
    assert in_process_summary(result, model, run_dir) == comparable(reference[0])


def test_checkpoint_layout_and_weights_only_loading(tmp_path, data_dir):
    run_dir = tmp_path / "run"
    with pytest.raises(RunInterruptedError):
        in_process(run_dir, hook=sigterm_at(23))  # after the validation at 20 and the checkpoint at 21
    ckpt = run_dir / "checkpoints" / "step-23"
    names = sorted(p.name for p in ckpt.iterdir())
    assert names == ["best.safetensors", "manifest.json", "model.safetensors", "state.pt", "trainer_state.json"]
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert manifest["step"] == 23 and set(manifest["files"]) == set(names) - {"manifest.json"}
    state = torch.load(ckpt / "state.pt", weights_only=True)  # no pickle code execution needed
    assert {"optimizer", "scheduler", "scaler", "rng", "running_loss", "timer"} <= set(state)
    trainer = json.loads((ckpt / "trainer_state.json").read_text())
    assert trainer["step"] == 23 and trainer["best_step"] == 20 and trainer["epoch"] == 0
    assert trainer["batches_in_epoch"] == 23 and len(trainer["rng"]["numpy"][1]) == 624
    assert trainer["metrics_offset"] == (run_dir / "metrics.jsonl").stat().st_size
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))


def test_resuming_over_a_shortened_metrics_log_never_pads_it(tmp_path, data_dir):
    """metrics.jsonl cut short after a checkpoint (a copy cut mid-line, a hand edit): the resume
    keeps its whole records, warns in one line that records were lost, and appends after them.
    Never the NUL bytes a truncate() to the checkpoint's larger offset would write."""
    run_dir = tmp_path / "run"
    with pytest.raises(RunInterruptedError):
        in_process(run_dir, hook=sigterm_at(23))
    log = run_dir / "metrics.jsonl"
    text = log.read_bytes()
    cut = len(text) // 2
    log.write_bytes(text[:cut])  # mid-record
    kept = text[: text.rindex(b"\n", 0, cut) + 1]
    with pytest.warns(RuntimeWarning, match=r"metrics.jsonl is shorter \(\d+ bytes\) than its checkpoint recorded"):
        result, _, _ = in_process(run_dir)
    assert result.timing["process_start_steps"] == [0, 23]
    data = log.read_bytes()
    assert b"\0" not in data and data.startswith(kept)
    records = [json.loads(line) for line in data.decode().splitlines()]  # every line a whole record
    assert records[-1]["step"] == TOTAL_STEPS
