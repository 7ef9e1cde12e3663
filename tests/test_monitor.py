"""`oelm monitor DIR --once` on real tiny matrices: finished, partly finished, and one running."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from oelm.cli import main
from oelm.cli.monitor import collect_runs, snapshot_text

CONFIG = (
    "name: mon\n"
    "task: {dataset: tinystories, tokenizer: bpe-512, train_samples: 40, validation_samples: 10, block_size: 32}\n"
    "model: {gpt: gpt-tiny, gpt_overrides: {hidden_size: 32, num_layers: 2, num_heads: 2, intermediate_size: 64}}\n"
    "methods: [{name: baseline, learning_rates: [1.0e-3, 3.0e-3]}, {name: oelm_freeze, learning_rate: 2.0e-3}]\n"
    "seeds: [0, 1]\n"
    "training: {max_steps: 4, batch_size: 8, eval_every: 2, log_every: 2, progress_bar: false, tensorboard: false}\n"
)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_dir):
    tmp = tmp_path_factory.mktemp("mon")
    (tmp / "c.yaml").write_text(CONFIG)
    assert main(["run", str(tmp / "c.yaml"), "--output-dir", str(tmp / "out")]) == 0
    return tmp


def test_once_on_a_finished_matrix(finished, capsys):
    assert main(["monitor", str(finished / "out"), "--once"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[1].split()[:3] == ["run", "stage", "state"]
    rows = collect_runs(finished / "out")
    # 2 sweep runs + oelm_freeze x 2 seeds + baseline seed 1 (seed 0 is the selected sweep run)
    assert len(rows) == 5 and {r["state"] for r in rows} == {"finished"}
    assert "5 runs: 0 pending, 0 running, 5 finished, 0 failed, 0 interrupted" in text
    for r in rows:
        assert r["step"] == 4 and r["total_steps"] == 4 and r["metric"] == "perplexity" and r["validation"] > 1
        assert r["name"] in text and r["elapsed_seconds"] is not None and r["eta_seconds"] is None
        # the best so far is the run's result (what selection uses), beside the latest validation
        best = json.loads((finished / "out" / "runs" / r["name"] / "result.json").read_text())["performance"]["best_validation"]
        assert r["best_validation"] == best <= r["validation"]
        assert f"perplexity {best:.3f} ({r['validation']:.3f})" in text
    stages = {r["name"]: r["stage"] for r in rows}
    selected = json.loads((finished / "out" / "sweep.json").read_text())["selected_learning_rates"]["baseline"]
    assert stages[f"baseline-lr{selected:g}-seed0"] == "final"
    assert list(stages.values()).count("sweep") == 1


def test_once_on_a_partly_finished_matrix(finished, tmp_path, monkeypatch, capsys):
    """The first final run is interrupted: the sweep is done, one run interrupted, the rest pending."""
    import oelm.matrix.run_one
    import oelm.training
    from oelm.errors import RunInterruptedError

    real_train, calls = oelm.training.train, []

    def stop_at_first_final_run(*args, **kwargs):
        calls.append(kwargs["run_dir"].name)
        if len(calls) == 3:
            raise RunInterruptedError("SIGTERM", step=2)
        return real_train(*args, **kwargs)

    monkeypatch.setattr(oelm.matrix.run_one, "train", stop_at_first_final_run)
    (tmp_path / "c.yaml").write_text(CONFIG)
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "c.yaml"), "--output-dir", str(out)]) == 130
    rows = {r["name"]: r for r in collect_runs(out)}
    assert rows[calls[2]]["state"] == "interrupted"
    assert [r["state"] for r in rows.values()].count("finished") == 2  # the sweep
    assert [r["state"] for r in rows.values()].count("pending") == 2
    capsys.readouterr()
    assert main(["monitor", str(out), "--once"]) == 0
    text = capsys.readouterr().out
    assert "2 finished" in text and "1 interrupted" in text and "2 pending" in text

    # A run that is running now (this process): progress and ETA come from its metrics.jsonl.
    src = finished / "out" / "runs" / "oelm_freeze-seed1"
    live = out / "runs" / "oelm_freeze-seed1"
    live.mkdir(parents=True, exist_ok=True)
    first_train = next(l for l in (src / "metrics.jsonl").read_text().splitlines() if '"train"' in l)
    (live / "metrics.jsonl").write_text(first_train + "\n")
    status = json.loads((src / "status.json").read_text())
    status.update(state="running", pid=os.getpid(), finished_at=None)
    (live / "status.json").write_text(json.dumps(status))
    row = {r["name"]: r for r in collect_runs(out)}["oelm_freeze-seed1"]
    assert row["state"] == "running" and row["step"] == 2 and row["total_steps"] == 4
    assert row["eta_seconds"] == pytest.approx(json.loads(first_train)["elapsed_seconds"], rel=1e-6)  # 2 of 4 steps left
    assert "oelm_freeze-seed1" in snapshot_text(out)


def test_final_runs_that_exist_are_not_also_pending_after_a_restart(finished, tmp_path, capsys):
    """A restarted matrix (e.g. a method added to a finished one) writes plan.json before it has
    selected any rate again: a swept method's finals are placeholders there. Where those final
    runs exist, the monitor shows them and no pending twin (nor counts the twins in its ETA)."""
    out = tmp_path / "out"
    shutil.copytree(finished / "out", out)
    plan = json.loads((out / "plan.json").read_text())
    kept = [e for e in plan["runs"] if e["stage"] == "sweep" or e["method"] != "baseline"]
    placeholders = [{"name": None, "method": "baseline", "seed": s, "learning_rate": None, "stage": "final"} for s in (0, 1)]
    (out / "plan.json").write_text(json.dumps({"name": plan["name"], "runs": kept + placeholders}))
    rows = collect_runs(out)
    assert len(rows) == 5 and {r["state"] for r in rows} == {"finished"} and all(r["name"] for r in rows)
    assert main(["monitor", str(out), "--once"]) == 0
    assert "5 runs: 0 pending" in capsys.readouterr().out
    # without baseline's seed-1 final run, its placeholder is the one pending row
    selected = json.loads((out / "sweep.json").read_text())["selected_learning_rates"]["baseline"]
    shutil.rmtree(out / "runs" / f"baseline-lr{selected:g}-seed1")
    pending = [r for r in collect_runs(out) if r["state"] == "pending"]
    assert [(r["name"], r["method"], r["seed"]) for r in pending] == [(None, "baseline", 1)]


def test_mid_sweep_a_sweep_seed_has_no_pending_final_placeholder(finished, tmp_path, capsys):
    """Before selection, plan.json lists a swept method's finals as placeholders for every seed,
    but the sweep seed's final run will be its sweep run at the selected rate: only the other
    seeds' finals are runs still to do (a SST-2 matrix mid-sweep showed 5 phantom runs and an ETA
    5 runs too long)."""
    out = tmp_path / "out"
    shutil.copytree(finished / "out", out)
    plan = json.loads((out / "plan.json").read_text())
    sweep = [e for e in plan["runs"] if e["stage"] == "sweep"]
    kept = [e for e in plan["runs"] if e["stage"] == "sweep" or e["method"] != "baseline"]
    placeholders = [{"name": None, "method": "baseline", "seed": s, "learning_rate": None, "stage": "final"} for s in (0, 1)]
    (out / "plan.json").write_text(json.dumps({"name": plan["name"], "runs": kept + placeholders}))
    # mid-sweep: one sweep run finished (still a sweep run: nothing selected yet), the other not started
    selected = json.loads((out / "sweep.json").read_text())["selected_learning_rates"]["baseline"]
    shutil.rmtree(out / "runs" / f"baseline-lr{selected:g}-seed1")
    other = next(e["name"] for e in sweep if e["learning_rate"] != selected)
    shutil.rmtree(out / "runs" / other)
    result_path = out / "runs" / f"baseline-lr{selected:g}-seed0" / "result.json"
    result = json.loads(result_path.read_text())
    result.update(stage="sweep", selected=False)
    result_path.write_text(json.dumps(result))
    (out / "sweep.json").unlink()
    pending = [(r["name"], r["method"], r["seed"]) for r in collect_runs(out) if r["state"] == "pending"]
    assert sorted(pending, key=str) == sorted([(other, "baseline", 0), (None, "baseline", 1)], key=str)
    assert main(["monitor", str(out), "--once"]) == 0
    assert "5 runs: 2 pending, 0 running, 3 finished" in capsys.readouterr().out


def test_monitor_on_a_non_output_dir_is_a_clear_error(tmp_path, capsys):
    assert main(["monitor", str(tmp_path), "--once"]) == 2
    assert "not an oelm run output directory" in capsys.readouterr().err


def test_a_resumed_run_no_longer_reports_the_signal_that_stopped_its_last_process(tmp_path):
    """status.json after SIGTERM says interrupted + signal; once the run resumes, it is running and
    the old signal and failure are gone (they described the earlier process)."""
    from oelm.records import PlannedRun, read_status, write_status

    run = PlannedRun(method="baseline", seed=0, learning_rate=1e-4, stage="final", name="baseline-seed0")
    write_status(tmp_path, run, "interrupted", signal="SIGTERM", step=706, failure="x")
    assert read_status(tmp_path)["signal"] == "SIGTERM" and "finished_at" in read_status(tmp_path)
    write_status(tmp_path, run, "running", total_steps=2105)
    status = read_status(tmp_path)
    assert status["state"] == "running" and status["step"] == 706 and status["total_steps"] == 2105
    assert not {"signal", "failure", "finished_at"} & set(status)


def test_elapsed_counts_every_process_of_a_resumed_run(finished, tmp_path):
    """A resume rewrites status.json's started_at, so the time since it covers only the last
    process: a finished run shows its result's total_seconds, an interrupted one its logged
    elapsed_seconds (cumulative over processes), and the matrix ETA's mean uses them."""
    out = tmp_path / "out"
    shutil.copytree(finished / "out", out)
    run = out / "runs" / "oelm_freeze-seed1"
    status = json.loads((run / "status.json").read_text())
    status.update(started_at="2026-01-01T00:00:00+00:00", finished_at="2026-01-01T00:00:01+00:00")  # a 1 s last process
    (run / "status.json").write_text(json.dumps(status))
    result = json.loads((run / "result.json").read_text())
    result["timing"]["total_seconds"] = 3600.0
    (run / "result.json").write_text(json.dumps(result))
    assert {r["name"]: r for r in collect_runs(out)}["oelm_freeze-seed1"]["elapsed_seconds"] == 3600.0
    (run / "result.json").unlink()  # now an interrupted run whose earlier process logged 900 s
    status.update(state="interrupted")
    (run / "status.json").write_text(json.dumps(status))
    records = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    last = next(r for r in reversed(records) if r["type"] == "train")
    last["elapsed_seconds"] = 900.0
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records + [last]) + "\n")
    row = {r["name"]: r for r in collect_runs(out)}["oelm_freeze-seed1"]
    assert row["state"] == "interrupted" and row["elapsed_seconds"] == 900.0


def test_matrix_eta_shares_the_runs_left_among_the_runs_running_now():
    """With one run running, the runs left follow it one by one; with two runs training side by side, the
    runs left go to whichever is free first (the matrix ends when the last lane ends)."""
    from oelm.cli.monitor import matrix_eta_seconds

    assert matrix_eta_seconds([100.0], 3, 600.0) == 100.0 + 3 * 600.0
    assert matrix_eta_seconds([], 2, 600.0) == 1200.0  # nothing running: one lane
    assert matrix_eta_seconds([100.0, 500.0], 4, 600.0) == 500.0 + 2 * 600.0  # lanes end at 1300 and 1700
    assert matrix_eta_seconds([100.0, 500.0], 1, 600.0) == 700.0
    assert matrix_eta_seconds([100.0, 500.0], 0, 600.0) == 500.0


def test_not_on_a_terminal_monitor_prints_plain_lines_and_ends_when_nothing_is_left(finished):
    """`oelm monitor DIR` with its output in a pipe: the table and summary as plain lines (no ANSI
    control codes, which a live view would write), and it returns once every run is done."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "oelm", "monitor", str(finished / "out"), "--interval", "0.1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and proc.stdout.strip()
    lines = proc.stdout.splitlines()
    assert lines[0] == f"oelm monitor: {finished / 'out'}" and lines[1].split()[:3] == ["run", "stage", "state"]
    assert "5 runs: 0 pending, 0 running, 5 finished" in proc.stdout


def test_plain_lines_report_each_change_once(finished, tmp_path):
    """A run that is running when the view starts and finishes during it: one stamped line for the
    change and one for the new summary, nothing for refreshes where nothing changed."""
    import platform

    from oelm.cli.monitor import watch_lines

    out = tmp_path / "out"
    shutil.copytree(finished / "out", out)
    run = out / "runs" / "oelm_freeze-seed1"
    result = (run / "result.json").read_bytes()
    (run / "result.json").unlink()
    status = json.loads((run / "status.json").read_text())
    (run / "status.json").write_text(json.dumps(status | {"state": "running", "pid": os.getpid(), "host": platform.node()}))
    lines, sleeps = [], []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 3:  # the run finishes between the 2nd and 3rd refresh
            (run / "result.json").write_bytes(result)
            (run / "status.json").write_text(json.dumps(status))

    assert watch_lines(out, interval=5, write=lines.append, sleep=sleep, max_refreshes=10) == 0
    assert len(sleeps) == 3 and set(sleeps) == {5}  # ended once no run was left
    table = lines[:-2]  # the header, the table and the summary when the view started; no line for unchanged refreshes
    assert len(table) == 1 + 1 + 5 + 1 and "5 runs: 0 pending, 1 running, 4 finished" in table[-1]
    changed = lines[-2:]
    assert re.fullmatch(r"\d\d:\d\d:\d\d oelm_freeze-seed1: finished, step 4/4, .*", changed[0])
    assert re.fullmatch(r"\d\d:\d\d:\d\d 5 runs: 0 pending, 0 running, 5 finished.*", changed[1])
    assert not any("\x1b" in l for l in lines)


def test_odd_values_in_hand_edited_files_do_not_break_the_view(finished, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(finished / "out", out)
    run = out / "runs" / "oelm_freeze-seed1"
    (run / "result.json").unlink()
    (run / "status.json").write_text(json.dumps({"state": "interrupted", "started_at": 5, "total_steps": "four"}))
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write(json.dumps({"type": "train", "step": "x", "loss": "nan?", "elapsed_seconds": "long"}) + "\n")
    plan = json.loads((out / "plan.json").read_text())
    plan["runs"][0]["learning_rate"] = "fast"
    (out / "plan.json").write_text(json.dumps(plan))
    rows = {r["name"]: r for r in collect_runs(out)}
    assert rows["oelm_freeze-seed1"]["state"] == "interrupted" and rows["oelm_freeze-seed1"]["step"] is None
    assert "oelm_freeze-seed1" in snapshot_text(out)


def test_a_run_folder_with_nothing_in_it_is_pending_not_running(tmp_path):
    (tmp_path / "runs" / "baseline-seed0").mkdir(parents=True)
    (tmp_path / "runs" / "notes.txt").write_text("not a run")
    rows = collect_runs(tmp_path)
    assert [(r["name"], r["state"]) for r in rows] == [("baseline-seed0", "pending")]


@pytest.mark.parametrize("interval", ["-1", "0", "nan", "inf"])
def test_an_interval_that_is_not_a_positive_number_is_one_line(tmp_path, capsys, interval):
    (tmp_path / "runs").mkdir()
    assert main(["monitor", str(tmp_path), "--interval", interval]) == 2
    assert capsys.readouterr().err.strip() == f"oelm: error: --interval must be a positive number of seconds, got {float(interval)!r}"
