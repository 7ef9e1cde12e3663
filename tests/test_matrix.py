"""The protocol as a plan (pure functions), the output-folder contract, and the batch-system
primitives: `oelm plan`, `oelm run --only`, `oelm run --collect` give what the local executor gives."""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from _tiny_matrix import CONFIG, numbers, write_config
from oelm.cli import main
from oelm.config import config_from_dict
from oelm.matrix.plan import marked_final, ready_runs, select_learning_rates
from oelm.records import MatrixFolder, RunRecord, read_record, run_name, time_split_text
from oelm.runtime.lock import acquire, release

SWEPT = {
    "name": "x", "task": {"dataset": "sst2"}, "model": {"gpt": "gpt-tiny"}, "seeds": [0, 1],
    "methods": [{"name": "baseline", "learning_rates": [1e-4, 3e-4]}, {"name": "oelm_freeze", "learning_rate": 1e-3}],
}


def _record(method: str, lr: float, seed: int, stage: str, value: float | None, status: str = "finished") -> RunRecord:
    return RunRecord({"method": method, "learning_rate": lr, "seed": seed, "stage": stage, "status": status,
                      "run_name": run_name(method, seed, lr if method == "baseline" else None),
                      "performance": {"best_validation": value} if value is not None else None})


def _names(tasks) -> list[tuple[str, str]]:
    return [(t.name, t.action) for t in tasks]


def test_every_sweep_run_is_ready_at_once_and_a_methods_final_runs_once_it_is_selected():
    c = config_from_dict(SWEPT | {"task": {"dataset": "sst2", "test_split": "test"}})
    ready, selection = ready_runs(c, "accuracy", {})
    assert _names(ready) == [("baseline-lr0.0001-seed0", "train"), ("baseline-lr0.0003-seed0", "train"),
                             ("oelm_freeze-seed0", "train"), ("oelm_freeze-seed1", "train")]
    assert selection.selected == {} and selection.complete == set()
    # one sweep run done, the other training: baseline's final runs still wait
    results = {"baseline-lr0.0001-seed0": _record("baseline", 1e-4, 0, "sweep", 80.0)}
    ready, _ = ready_runs(c, "accuracy", results, busy={"baseline-lr0.0003-seed0"})
    assert _names(ready) == [("oelm_freeze-seed0", "train"), ("oelm_freeze-seed1", "train")]
    # the sweep complete: the winner (3e-4) is promoted for seed 0 and trained for seed 1
    results["baseline-lr0.0003-seed0"] = _record("baseline", 3e-4, 0, "sweep", 85.0)
    ready, selection = ready_runs(c, "accuracy", results)
    assert selection.selected == {"baseline": 3e-4}
    assert _names(ready) == [("baseline-lr0.0003-seed0", "promote"), ("oelm_freeze-seed0", "train"),
                             ("oelm_freeze-seed1", "train"), ("baseline-lr0.0003-seed1", "train")]
    assert all(t.evaluate_test == (t.run.stage == "final") for t in ready)
    assert marked_final(c, selection, results) == []  # with a test split the promote task does it
    # promoted: nothing left of seed 0's baseline
    results["baseline-lr0.0003-seed0"] = _record("baseline", 3e-4, 0, "final", 85.0)
    assert ("baseline-lr0.0003-seed0", "promote") not in _names(ready_runs(c, "accuracy", results)[0])


def test_without_a_test_split_no_task_promotes_or_evaluates_a_test_split():
    """No test split (issue 35, item 6): the plan lists no "promote" task and no task says
    ``evaluate_test: true``; the selected sweep run is marked final where it lies (marked_final)."""
    c = config_from_dict(SWEPT)
    results = {"baseline-lr0.0001-seed0": _record("baseline", 1e-4, 0, "sweep", 80.0),
               "baseline-lr0.0003-seed0": _record("baseline", 3e-4, 0, "sweep", 85.0)}
    ready, selection = ready_runs(c, "accuracy", results)
    assert _names(ready) == [("oelm_freeze-seed0", "train"), ("oelm_freeze-seed1", "train"),
                             ("baseline-lr0.0003-seed1", "train")]
    assert [t.to_dict()["evaluate_test"] for t in ready] == [False, False, False]
    assert [r.name for r in marked_final(c, selection, results)] == ["baseline-lr0.0003-seed0"]
    results["baseline-lr0.0003-seed0"] = _record("baseline", 3e-4, 0, "final", 85.0)
    assert marked_final(c, selection, results) == []


def test_a_failed_sweep_run_being_retried_holds_back_its_methods_selection():
    c = config_from_dict(SWEPT)
    results = {"baseline-lr0.0001-seed0": _record("baseline", 1e-4, 0, "sweep", 80.0),
               "baseline-lr0.0003-seed0": _record("baseline", 3e-4, 0, "sweep", None, status="failed")}
    assert select_learning_rates(c, "accuracy", results).selected == {"baseline": 1e-4}  # failed runs excluded
    ready, selection = ready_runs(c, "accuracy", results, retry={"baseline-lr0.0003-seed0"})
    assert ("baseline-lr0.0003-seed0", "train") in _names(ready)
    assert selection.selected == {} and not any(n.startswith("baseline-lr0.0001") for n, _ in _names(ready))
    # without a retry the failure stands: selection from the finished run, no rerun of the failed one
    ready, selection = ready_runs(c, "accuracy", results)
    assert selection.selected == {"baseline": 1e-4} and ("baseline-lr0.0003-seed0", "train") not in _names(ready)


def test_perplexity_selects_the_lowest():
    c = config_from_dict(SWEPT | {"task": {"dataset": "tinystories"}})
    results = {"baseline-lr0.0001-seed0": _record("baseline", 1e-4, 0, "sweep", 40.0),
               "baseline-lr0.0003-seed0": _record("baseline", 3e-4, 0, "sweep", 50.0)}
    assert select_learning_rates(c, "perplexity", results).selected == {"baseline": 1e-4}


def test_the_output_folder_contract_names_every_path(tmp_path):
    folder = MatrixFolder(tmp_path)
    run = folder.run("baseline-seed0")
    assert run.result == tmp_path / "runs" / "baseline-seed0" / "result.json"
    assert run.best_weights == tmp_path / "runs" / "baseline-seed0" / "checkpoint" / "model.safetensors"
    assert (folder.sweep, folder.plan, folder.comparison) == (tmp_path / "sweep.json", tmp_path / "plan.json",
                                                              tmp_path / "comparison.json")
    assert run.read_result() is None and folder.results() == {}
    run.path.mkdir(parents=True)
    run.result.write_text(json.dumps({"method": "baseline", "seed": 0, "stage": "final", "status": "failed",
                                      "run_name": "baseline-seed0", "failure": {"kind": "nan"}}))
    record = folder.results()["baseline-seed0"]
    assert record.failed and not record.finished and record.is_final and record.failure == {"kind": "nan"}
    assert record.best_validation is None and record.key() == ("baseline", None, 0)


# --- real runs ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def local(tmp_path_factory, data_dir):
    """The tiny matrix through the local executor (the reference every other way must equal)."""
    tmp = tmp_path_factory.mktemp("local")
    cfg = write_config(tmp)
    assert main(["run", str(cfg), "--output-dir", str(tmp / "out")]) == 0
    return cfg, tmp / "out"


def _plan(cfg: Path, out: Path) -> list[dict]:
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["plan", str(cfg), "--output-dir", str(out)]) == 0
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def test_a_loop_of_only_calls_then_collect_equals_the_local_executor(local, tmp_path, capsys):
    """What a batch system does: `oelm plan`, one `oelm run --only` per line, again until the plan is
    empty, then `--collect`. Same runs, numbers, metrics logs and weights as the local executor;
    same comparison means. Each job ends with where its run's wall time went (its result.json's)."""
    cfg, reference = local
    out = tmp_path / "out"
    rounds = []
    while lines := _plan(cfg, out):
        rounds.append([(x["name"], x["action"]) for x in lines])
        for line in lines:
            capsys.readouterr()
            assert main(["run", str(cfg), "--output-dir", str(out), "--only", line["name"]]) == 0
            record = read_record(out / "runs" / line["name"] / "result.json")
            assert capsys.readouterr().out.splitlines()[-1] == f"time {line['name']}: {time_split_text(record.time_split)}"
        assert len(rounds) < 5
    assert rounds == [
        [("baseline-lr0.0001-seed0", "train"), ("baseline-lr0.003-seed0", "train"), ("oelm_freeze-seed0", "train"),
         ("oelm_random-seed0", "train")],
        [("baseline-lr0.003-seed0", "promote")],
    ]
    capsys.readouterr()
    assert main(["run", str(cfg), "--output-dir", str(out), "--collect"]) == 0
    assert re.fullmatch(r"oelm run took \d+\.\d s \(this process\)", capsys.readouterr().out.splitlines()[-1])
    assert numbers(out) == numbers(reference)
    mine, theirs = (json.loads((d / "comparison.json").read_text()) for d in (out, reference))
    assert {m: v["test"]["mean"] for m, v in mine["methods"].items()} == {m: v["test"]["mean"] for m, v in theirs["methods"].items()}
    assert json.loads((out / "runs" / "oelm_freeze-seed0" / "result.json").read_text())["executor"]["name"] == "only"


def test_only_refuses_a_run_that_is_not_ready_with_one_line(local, tmp_path, capsys):
    cfg, _ = local
    out = tmp_path / "out"
    two_seeds = ["seeds=[0, 1]"]
    assert main(["run", str(cfg), "--output-dir", str(out), "--only", "oelm_freeze-seed0"]) == 2
    assert "run `oelm plan" in capsys.readouterr().err  # the folder was never started
    _plan(cfg, out)
    capsys.readouterr()
    for name, why in [("baseline-lr0.003-seed1", "whose learning-rate sweep is not finished (runs left: baseline-lr0.0001-seed0, "
                                                 "baseline-lr0.003-seed0)"),
                      ("nope-seed0", "is not a run of this matrix now")]:
        assert main(["run", str(cfg), "--output-dir", str(out), "--only", name, *two_seeds]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("oelm: error: run ") and why in err
    assert main(["run", str(cfg), "--output-dir", str(out), "--only", "oelm_random-seed0"]) == 0
    capsys.readouterr()
    assert main(["run", str(cfg), "--output-dir", str(out), "--only", "oelm_random-seed0"]) == 2
    assert "run oelm_random-seed0 is done (final run, finished" in capsys.readouterr().err


def test_only_trains_on_the_threads_cpus_per_run_gives_and_refuses_placement_flags(local, tmp_path, capsys):
    """A batch job given one core says --cpus-per-run 1: the run trains on 1 torch thread (its
    result records it), and this process's threads are as before afterwards. (85bc0d1's --only
    ignored the flag: two such jobs put 4 threads on 2 cores.) Flags that place runs elsewhere are
    one line each."""
    import torch

    cfg, _ = local
    out = tmp_path / "out"
    _plan(cfg, out)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert main(["run", str(cfg), "--output-dir", str(out), "--only", "oelm_random-seed0", "--cpus-per-run", "1"]) == 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    result = json.loads((out / "runs" / "oelm_random-seed0" / "result.json").read_text())
    assert result["environment"]["torch_num_threads"] == 1 and result["executor"]["cpus_per_run"] == 1
    capsys.readouterr()
    for flags in (["--parallel", "2"], ["--executor", "ray"], ["--gpus-per-run", "1"]):
        assert main(["run", str(cfg), "--output-dir", str(out), "--only", "oelm_freeze-seed0", *flags]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--only trains one run in this process" in err and flags[0] in err
    assert not (out / "runs" / "oelm_freeze-seed0" / "result.json").exists()


def test_only_never_trains_beside_a_driver(local, tmp_path, capsys):
    cfg, _ = local
    out = tmp_path / "out"
    _plan(cfg, out)
    fd = acquire(out)  # an `oelm run` driving this folder
    try:
        assert main(["run", str(cfg), "--output-dir", str(out), "--only", "oelm_random-seed0"]) == 2
        assert "in use by an oelm run that drives the whole matrix" in capsys.readouterr().err
    finally:
        release(fd, out)
    assert not (out / "runs" / "oelm_random-seed0" / "result.json").exists()


def test_plan_runs_beside_only_jobs_but_a_grown_grid_waits_for_them(local, tmp_path, capsys):
    """A batch system plans the next runs while earlier --only jobs still train (they hold the
    folder's shared lock): the same config plans beside them; a grown grid (experiment.json
    rewritten) and a driver still need the folder to themselves."""
    from oelm.runtime.lock import hold_shared_lock

    cfg, _ = local
    out = tmp_path / "out"
    first = _plan(cfg, out)
    with hold_shared_lock(out):  # what `oelm run --only NAME` holds while it trains
        assert _plan(cfg, out) == first
        grown = write_config(tmp_path, CONFIG.replace("learning_rates: [1.0e-4, 3.0e-3]", "learning_rates: [1.0e-4, 3.0e-3, 1.0e-2]"))
        capsys.readouterr()
        assert main(["plan", str(grown), "--output-dir", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is in use by another oelm run" in err and "--only` processes" in err
    experiment = json.loads((out / "experiment.json").read_text())
    assert "grid_growth" not in experiment  # the refused plan recorded nothing
    fd = acquire(out)  # an `oelm run` driving this folder
    try:
        assert main(["plan", str(cfg), "--output-dir", str(out)]) == 2
        assert "in use by an oelm run that drives the whole matrix" in capsys.readouterr().err
    finally:
        release(fd, out)
    assert "baseline-lr0.01-seed0" in {x["name"] for x in _plan(grown, out)}  # once the jobs are done, the grid grows


def test_results_record_their_executor_and_a_matrix_with_overlaps_is_not_timing_grade(local):
    """The local executor: each result says where it ran and that nothing overlapped it; the
    comparison is timing-grade. The same results marked as sharing their node (as runs of a
    parallel executor are) get the warning and lose the grade."""
    from oelm.config import load_config
    from oelm.report import compare_results

    cfg, out = local
    comparison = json.loads((out / "comparison.json").read_text())
    assert comparison["execution"]["timing_grade"] is True and comparison["execution"]["executors"] == ["local"]
    results: dict[str, list[RunRecord]] = {}
    for _, r in MatrixFolder(out).iter_results():
        assert r.executor["name"] == "local" and r.executor["overlapped"] == [] and r.executor["shared_node"] is False
        if r.is_final:
            shared = RunRecord(r.raw | {"executor": r.executor | {"shared_node": True, "overlapped": [{"run": "other", "node": r.executor["node"]}]}})
            results.setdefault(r.method, []).append(shared)
    shared = compare_results(load_config(cfg), results, out)
    assert shared["execution"]["timing_grade"] is False and shared["execution"]["most_overlapped_runs"] == 1
    assert any("trained beside other runs on the same machine" in w and "not speed evidence" in w for w in shared["warnings"])


def test_executor_settings_are_checked_with_one_line(tmp_path, capsys):
    """The local executor trains one run at a time; Ray settings without Ray are refused in the
    config; on the command line --parallel N / --address / --gpus-per-run imply --executor ray."""
    import argparse

    from oelm.cli.run import _executor_config
    from oelm.errors import ConfigError

    base = {"name": "x", "task": {"dataset": "sst2"}, "model": {"gpt": "gpt-tiny"}, "methods": [{"name": "baseline"}]}
    with pytest.raises(ConfigError, match=r"executor.parallel=2: the local executor trains one run at a time"):
        config_from_dict(base | {"executor": {"parallel": 2}})
    with pytest.raises(ConfigError, match="executor.address and executor.gpus_per_run are Ray settings"):
        config_from_dict(base | {"executor": {"address": "auto"}})
    c = config_from_dict(base)
    flags = dict(executor=None, address=None, parallel=None, cpus_per_run=None, gpus_per_run=None)
    assert _executor_config(c, argparse.Namespace(**flags)).name == "local"
    ray = _executor_config(c, argparse.Namespace(**flags | {"parallel": "3"}))
    assert (ray.name, ray.parallel) == ("ray", 3)
    assert _executor_config(c, argparse.Namespace(**flags | {"parallel": "auto"})).parallel == "auto"
    assert main(["run", str(write_config(tmp_path)), "--parallel", "two"]) == 2
    assert "--parallel takes a whole number of runs or 'auto', got 'two'" in capsys.readouterr().err


def test_the_ray_executor_defaults_to_one_lane_with_the_local_executors_threads(tmp_path):
    """Without --parallel / --cpus-per-run a Ray matrix trains one run at a time with the thread
    count the local executor uses (this process's torch setting), so both give the same numbers;
    each takes its settings from the command line when given. (No Ray instance is started.)"""
    import torch

    from oelm.config import ExecutorConfig, load_config
    from oelm.matrix.executors import LocalExecutor, RayExecutor

    config = load_config(write_config(tmp_path))
    ray = RayExecutor(ExecutorConfig(name="ray"), config)
    assert (ray.lanes, ray.cpus_per_run, ray.free_slots(0), ray.free_slots(1)) == (1, torch.get_num_threads(), 1, 0)
    assert LocalExecutor(ExecutorConfig(), config)._placement["cpus_per_run"] == ray.cpus_per_run
    chosen = RayExecutor(ExecutorConfig(name="ray", parallel=3, cpus_per_run=1), config)
    assert (chosen.lanes, chosen.cpus_per_run, chosen.free_slots(1)) == (3, 1, 2)


def test_both_executors_keep_the_executor_contract(tmp_path):
    """make_executor gives an object of the Executor protocol for each executor name, with every method
    of the protocol under the same parameters (the driver calls nothing else); an object missing one
    is not an Executor. (No Ray instance is started.)"""
    import inspect

    from oelm.config import ExecutorConfig, load_config
    from oelm.matrix.executors import Executor, LocalExecutor, RayExecutor, make_executor

    config = load_config(write_config(tmp_path))
    for name, cls in (("local", LocalExecutor), ("ray", RayExecutor)):
        executor = make_executor(ExecutorConfig(name=name), config)
        assert type(executor) is cls and isinstance(executor, Executor) and executor.name == name
        for method in ("__enter__", "__exit__", "bind", "running", "free_slots", "submit", "wait"):
            expected = list(inspect.signature(getattr(Executor, method)).parameters)
            assert list(inspect.signature(getattr(cls, method)).parameters) == expected, (cls, method)

    class NoWait:
        name = "local"

        def __enter__(self): return self
        def __exit__(self, *exc): pass
        def bind(self, ctx): pass
        def running(self): pass
        def free_slots(self, busy): return 1
        def submit(self, task): pass

    assert not isinstance(NoWait(), Executor)


def test_a_plan_without_a_test_split_marks_the_selected_sweep_run_final_without_a_task(tmp_path):
    """`oelm plan` / `--only` / `--collect` on the tiny matrix without its test split: the second
    plan is empty (no promote task), the selected sweep run's record says final, and the
    comparison counts it."""
    cfg = write_config(tmp_path, CONFIG.replace("test_split: test, ", ""))
    out = tmp_path / "out"
    first = _plan(cfg, out)
    assert [x["action"] for x in first] == ["train"] * 4 and not any(x["evaluate_test"] for x in first)
    for line in first:
        assert main(["run", str(cfg), "--output-dir", str(out), "--only", line["name"]]) == 0
    assert _plan(cfg, out) == []
    sweep = json.loads((out / "sweep.json").read_text())
    best = sweep["selected_learning_rates"]["baseline"]
    result = json.loads((out / "runs" / run_name("baseline", 0, best) / "result.json").read_text())
    assert (result["stage"], result["selected"], result["performance"]["test"]) == ("final", True, None)
    assert main(["run", str(cfg), "--output-dir", str(out), "--collect"]) == 0
    assert json.loads((out / "comparison.json").read_text())["methods"]["baseline"]["seeds"] == [0]


def test_each_run_keeps_its_console_output_in_train_log(local):
    """runs/<run>/train.log (issue 35, item 6): that run's console lines, with a header per
    process that worked on it; the promoted sweep run's log goes on with its promotion."""
    _, out = local
    runs = sorted(p.parent for p in (out / "runs").glob("*/result.json"))
    assert len(runs) == 4
    for run_dir in runs:
        lines = (run_dir / "train.log").read_text().splitlines()
        assert lines[0].startswith("=== ") and f" training {run_dir.name} on " in lines[0]
        assert any(x.startswith(f"[{run_dir.name}] best validation accuracy") for x in lines), lines
        assert not [x for x in lines if x.startswith("[") and not x.startswith(f"[{run_dir.name}]")]  # no other run's
    promoted = json.loads((out / "sweep.json").read_text())["selected_learning_rates"]["baseline"]
    log = (out / "runs" / run_name("baseline", 0, promoted) / "train.log").read_text()
    assert f" promoting {run_name('baseline', 0, promoted)} on " in log and "selected; test accuracy" in log


def test_train_log_keeps_what_the_terminal_shows_and_the_console_keeps_everything(tmp_path, capsys):
    """A tqdm bar redrawn with carriage returns is one line in train.log (its last state); stderr
    is copied too; the console still gets every write; an exception that ends the block is named
    in the log."""
    import sys

    from tqdm import tqdm

    from oelm.matrix.run_log import copy_console

    log = tmp_path / "train.log"
    with copy_console(log, "training r"):
        print("[r] a line")
        for _ in tqdm(range(3), desc="r", file=sys.stderr, mininterval=0):
            pass
        print("UserWarning: a warning", file=sys.stderr)  # as warnings.showwarning writes one
    with pytest.raises(RuntimeError), copy_console(log, "training r"):
        print("[r] again")
        raise RuntimeError("boom")
    print("after the block")
    lines = log.read_text().splitlines()
    assert "\r" not in log.read_text() and lines[1] == "[r] a line"
    bars = [x for x in lines if x.startswith("r: ")]
    assert len(bars) == 1 and "3/3" in bars[0]
    assert any("UserWarning: a warning" in x for x in lines)
    assert lines[-2] == "[r] again" and lines[-1].endswith("ended by RuntimeError: boom")
    assert sum(x.startswith("=== ") and "training r on" in x for x in lines) == 2
    assert "after the block" not in log.read_text()
    console = capsys.readouterr()
    assert "[r] a line" in console.out and "after the block" in console.out and "3/3" in console.err


def test_a_full_disk_stops_the_copy_not_the_run(capsys):
    """train.log on a full disk (/dev/full: every write fails with ENOSPC): the block's prints
    still reach the console and raise nothing; the run's own writes report disk faults."""
    from pathlib import Path as _Path

    from oelm.matrix.run_log import copy_console

    if not _Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    with copy_console("/dev/full", "training r"):
        for i in range(3):
            print(f"[r] line {i}")
    assert capsys.readouterr().out.splitlines() == ["[r] line 0", "[r] line 1", "[r] line 2"]
