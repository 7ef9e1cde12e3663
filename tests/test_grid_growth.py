"""Grids that contain their optimum, on validation only (issue 49, item 2): while a swept method's
selected learning rate is on the edge of its grid, the plan adds the next rate beyond it (x2 above,
÷2 below), sweeps it and selects again, up to ``max_grid_growth`` rates, before any final run.

The plan is pure (oelm.matrix.plan): the tests play it with made-up sweep results (growth at either
edge, interior stop, the cap, failures, resume, a matrix already final), then run it end to end on
real TinyStories with a tiny GPT whose grid of very small rates puts the selection on its high edge:
the local executor and the `oelm plan` / `--only` / `--collect` loop grow the same grid to the cap,
and sweep.json, the run log and the report say so."""

from __future__ import annotations

import io
import json
import math
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from oelm.cli import main
from oelm.config import config_from_dict
from oelm.matrix.plan import marked_final, plan_runs, ready_runs, select_learning_rates, why_not_ready
from oelm.records import PlannedRun, RunRecord, run_name

OPTIMUM = 8e-4  # where the made-up validation curve peaks


def _config(cap: int, grid=(1e-4, 2e-4), test_split: str | None = "test", **extra):
    task = {"dataset": "sst2", **({"test_split": test_split} if test_split else {})}
    return config_from_dict({
        "name": "x", "task": task, "model": {"gpt": "gpt-tiny"}, "seeds": [0, 1], "sweep_seeds": [0, 1],
        "methods": [{"name": "baseline", "learning_rates": list(grid)}, {"name": "oelm_freeze", "learning_rate": 1e-3}],
        "max_grid_growth": cap, **extra})


def _peak(lr: float, seed: int) -> float:
    """Validation accuracy (%) that peaks at OPTIMUM, falling by a point per halving squared; seed 1 a
    little lower, so the mean over the sweep seeds is what selects."""
    return 90.0 - math.log2(lr / OPTIMUM) ** 2 - 0.5 * seed


def _record(run, stage: str, value: float | None) -> RunRecord:
    return RunRecord({"method": run.method, "learning_rate": run.learning_rate, "seed": run.seed, "stage": stage,
                      "status": "finished" if value is not None else "failed", "run_name": run.name,
                      "performance": {"best_validation": value} if value is not None else None})


def _play(config, value=_peak, results=None, rounds: int = 50):
    """Play the plan as a driver would: train every ready task (its best validation from ``value``;
    None: the run fails), promote, mark final, until nothing is ready. Returns the results, the last
    selection and the log of (task name, action, whether baseline's selection was final then)."""
    results, log = dict(results or {}), []
    for _ in range(rounds):
        ready, selection = ready_runs(config, "accuracy", results)
        for run in marked_final(config, selection, results):
            results[run.name] = _record(run, "final", results[run.name].best_validation)
        if not ready:
            return results, selection, log
        for task in ready:
            log.append((task.name, task.action, "baseline" in selection.complete))
            stage = "final" if task.action == "promote" or task.run.stage == "final" else "sweep"
            v = results[task.name].best_validation if task.action == "promote" else value(task.run.learning_rate, task.run.seed)
            results[task.name] = _record(task.run, stage, v)
    raise AssertionError("the plan did not settle")


def _sweep_results(grid, seeds=(0, 1), value=_peak) -> dict[str, RunRecord]:
    """Finished sweep runs of baseline at every rate of ``grid`` and seed."""
    return {run_name("baseline", s, lr): _record(PlannedRun("baseline", lr, s, "sweep", run_name("baseline", s, lr)),
                                                 "sweep", value(lr, s)) for lr in grid for s in seeds}


def test_the_grid_grows_at_the_high_edge_until_the_selection_is_interior():
    """[1e-4, 2e-4] on a curve peaking at 8e-4: 4e-4, 8e-4 and 1.6e-3 join the grid one by one, 8e-4
    is then interior and selected; every final run (here: the promotions) comes after the last growth."""
    c = _config(cap=5)
    results, selection, log = _play(c)
    assert selection.grids["baseline"] == [1e-4, 2e-4, 4e-4, 8e-4, 1.6e-3]
    assert selection.selected["baseline"] == 8e-4 and selection.edges["baseline"] is None
    growth = selection.growth["baseline"]
    assert [(g["from"], g["to"], g["edge"], g["selected"]) for g in growth] == [
        ([1e-4, 2e-4], [1e-4, 2e-4, 4e-4], "high", 2e-4),
        ([1e-4, 2e-4, 4e-4], [1e-4, 2e-4, 4e-4, 8e-4], "high", 4e-4),
        ([1e-4, 2e-4, 4e-4, 8e-4], [1e-4, 2e-4, 4e-4, 8e-4, 1.6e-3], "high", 8e-4)]
    # the validation values that triggered the last growth: per rate the mean over both sweep seeds
    assert growth[-1]["validation"][-1] == {"learning_rate": 8e-4, "best_validation": pytest.approx(89.75), "n": 2}
    assert all(g["automatic"] and g["tested_final_runs"] == [] and g["max_grid_growth"] == 5 for g in growth)
    names = [name for name, _, _ in log]
    last_sweep = max(i for i, n in enumerate(names) if n.startswith("baseline-lr0.0016"))
    promoted = [(i, final) for i, (name, action, final) in enumerate(log) if action == "promote" and name.startswith("baseline")]
    assert len(promoted) == 2 and all(final and i > last_sweep for i, final in promoted)
    assert {r.learning_rate for r in results.values() if r.method == "baseline" and r.is_final} == {8e-4}
    # every rate was swept once on each sweep seed, and nothing else of baseline trained
    assert sorted(n for n in results if n.startswith("baseline")) == sorted(
        run_name("baseline", s, lr) for lr in selection.grids["baseline"] for s in (0, 1))


def test_the_grid_grows_at_the_low_edge_and_stops_at_the_cap():
    """A curve peaking far below the grid: 5e-5 and 2.5e-5 join (cap 2); the selection is still on
    the low edge, so the growth stops there, the edge stays (the report's caveat), and the final
    runs train at the lowest rate."""
    c = _config(cap=2)
    results, selection, _ = _play(c, value=lambda lr, seed: 90.0 - math.log2(lr / 1e-6) ** 2)
    assert selection.grids["baseline"] == [1e-4, 2e-4, 5e-5, 2.5e-5]
    assert [g["edge"] for g in selection.growth["baseline"]] == ["low", "low"]
    assert selection.selected["baseline"] == 2.5e-5 and selection.edges["baseline"] == "low"
    assert selection.complete == {"baseline"}
    assert results["baseline-lr2.5e-05-seed0"].is_final and results["baseline-lr2.5e-05-seed1"].is_final


def test_no_growth_at_cap_zero_and_none_for_an_interior_selection():
    """max_grid_growth 0 (the default) is the plan as before: the edge is kept and reported; an
    interior selection never grows whatever the cap."""
    at_edge = _play(_config(cap=0))[1]
    assert at_edge.grids["baseline"] == [1e-4, 2e-4] and at_edge.growth == {} and at_edge.edges["baseline"] == "high"
    assert plan_runs(_config(cap=0), at_edge.selected, at_edge.grids) == plan_runs(_config(cap=0), at_edge.selected)
    interior = _play(_config(cap=3, grid=(4e-4, 8e-4, 1.6e-3)))[1]
    assert interior.grids["baseline"] == [4e-4, 8e-4, 1.6e-3] and interior.growth == {}
    assert interior.selected["baseline"] == 8e-4


def test_a_failed_new_rate_ends_the_growth_and_all_failed_selects_nothing():
    """Runs at the added rate diverge (failed): the old edge rate is now below a rate that was tried,
    so it is interior, selected, and the growth stops (a failed candidate is a grid point). When
    every run fails there is no selection, no growth and no final run."""
    c = _config(cap=3)
    results, selection, _ = _play(c, value=lambda lr, seed: None if lr > 3e-4 else _peak(lr, seed))
    assert selection.grids["baseline"] == [1e-4, 2e-4, 4e-4] and len(selection.growth["baseline"]) == 1
    assert selection.selected["baseline"] == 2e-4 and selection.edges["baseline"] is None
    assert results["baseline-lr0.0004-seed0"].failed and results["baseline-lr0.0002-seed1"].is_final
    failed = _play(c, value=lambda lr, seed: None)[1]
    assert failed.complete == {"baseline"} and "baseline" not in failed.selected and failed.growth == {}


def test_rerunning_continues_where_it_stopped_and_a_finished_plan_replays():
    """The grid is recomputed from the results alone: a plan stopped after a few rounds (the job was
    killed) continues to the same end as one played straight through; the finished matrix's results
    plan nothing more and give the same grids, growth and selection."""
    c = _config(cap=5)
    straight, done, _ = _play(c)
    stopped = _sweep_results([1e-4, 2e-4, 4e-4])  # the first growth's runs done, the second not started
    resumed, _, _ = _play(c, results=stopped)
    assert {n: (r.stage, r.best_validation) for n, r in resumed.items()} == \
        {n: (r.stage, r.best_validation) for n, r in straight.items()}
    assert done.selected == {"baseline": 8e-4} and len(done.grids["baseline"]) == 5
    ready, replay = ready_runs(c, "accuracy", straight)
    assert ready == [] and (replay.grids, replay.selected, replay.growth) == (done.grids, done.selected, done.growth)


def test_a_final_run_asked_for_before_the_grown_sweep_is_done_names_the_runs_left():
    c = _config(cap=2, sweep_seeds=[0])
    line = why_not_ready(c, "accuracy", _sweep_results([1e-4, 2e-4], seeds=(0,)), "baseline-lr0.0002-seed1")
    assert line == ("run baseline-lr0.0002-seed1 is not ready: it is a final run of baseline, whose learning-rate sweep is "
                    "not finished (runs left: baseline-lr0.0004-seed0); train those first (see `oelm plan`)")


def test_a_matrix_final_before_the_cap_was_raised_keeps_its_selection():
    """Final runs exist (their test may have been seen): raising max_grid_growth adds no rate, the
    selection and its edge stay as they were (the report keeps the caveat)."""
    results, before, _ = _play(_config(cap=0))
    ready, after = ready_runs(_config(cap=2), "accuracy", results)
    assert ready == [] and after.grids == {"baseline": [1e-4, 2e-4]} and after.growth == {}
    assert after.selected == before.selected and after.edges == {"baseline": "high"}


def test_a_busy_or_retried_sweep_run_holds_the_growth_back():
    """A sweep run still training (or a failed one being retried) leaves the grid's selection open:
    no rate is added, and no run of the method is ready; once it is done the grown rate's runs are."""
    c = _config(cap=2)
    results = _sweep_results([1e-4, 2e-4])
    ready, selection = ready_runs(c, "accuracy", results, busy={"baseline-lr0.0002-seed1"})
    assert selection.grids["baseline"] == [1e-4, 2e-4] and not any(t.name.startswith("baseline") for t in ready)
    results["baseline-lr0.0002-seed1"] = _record(PlannedRun("baseline", 2e-4, 1, "sweep", "baseline-lr0.0002-seed1"),
                                                 "sweep", None)
    ready, selection = ready_runs(c, "accuracy", results, retry={"baseline-lr0.0002-seed1"})
    assert selection.grids["baseline"] == [1e-4, 2e-4]
    assert [t.name for t in ready if t.name.startswith("baseline")] == ["baseline-lr0.0002-seed1"]
    results = _sweep_results([1e-4, 2e-4])
    ready, selection = ready_runs(c, "accuracy", results)
    assert selection.grids["baseline"] == [1e-4, 2e-4, 4e-4]
    assert [t.name for t in ready if t.name.startswith("baseline")] == ["baseline-lr0.0004-seed0", "baseline-lr0.0004-seed1"]
    assert select_learning_rates(c, "accuracy", results).grids == selection.grids  # what --collect and `oelm plan` call


RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


@pytest.mark.parametrize("name", sorted(p.parent.name for p in RESULTS.glob("*/plan.json")))
def test_committed_matrices_keep_their_plan(tmp_path, name):
    """Every committed matrix (the experiment's seeds for every method) plans today exactly the runs
    its plan.json lists: without growth where max_grid_growth is 0, with the automatic growth its
    sweep.json records where it is not."""
    from oelm.config import load_config
    from oelm.matrix.driver import task_metric
    from oelm.matrix.output import write_plan
    from oelm.records import MatrixFolder

    out = RESULTS / name
    config = load_config(out / "config.yaml")
    _, selection = ready_runs(config, task_metric(config), MatrixFolder(out).results())
    sweep = out / "sweep.json"
    recorded = (json.loads(sweep.read_text()).get("grid_growth") or {}) if sweep.is_file() else {}
    automatic = {m for m, steps in recorded.items() if any(step.get("automatic") for step in steps)}
    assert set(selection.growth) == automatic  # max_grid_growth's growth as its sweep.json records it, none elsewhere
    write_plan(tmp_path, config, selection)
    assert json.loads((tmp_path / "plan.json").read_text()) == json.loads((out / "plan.json").read_text())


# --- end to end, on real TinyStories -----------------------------------------------------------

TINY_GPT = "{gpt: gpt-tiny, gpt_overrides: {hidden_size: 32, num_layers: 2, num_heads: 2, intermediate_size: 64, dropout: 0.0}}"
GROW = (
    "name: grow-lm\n"
    "task: {dataset: tinystories, tokenizer: bpe-512, train_samples: 48, validation_samples: 12, block_size: 32}\n"
    f"model: {TINY_GPT}\n"
    # rates far too small to train in 4 steps: the largest always has the lowest perplexity
    "methods: [{name: baseline, learning_rates: [1.0e-6, 2.0e-6]}, {name: oelm_freeze, learning_rate: 2.0e-3}]\n"
    "seeds: [0]\nmax_grid_growth: 2\n"
    "training: {max_steps: 4, batch_size: 16, eval_every: 2, log_every: 2, timing_warmup_steps: 1, progress_bar: false, "
    "tensorboard: false}\n"
)


@pytest.fixture(scope="module")
def grown(tmp_path_factory, data_dir):
    tmp = tmp_path_factory.mktemp("grow")
    cfg = tmp / "grow.yaml"
    cfg.write_text(GROW)
    out = tmp / "out"
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["run", str(cfg), "--output-dir", str(out)]) == 0
    return cfg, out, buf.getvalue()


def test_a_tiny_gpt_grows_its_grid_to_the_cap_on_validation(grown):
    cfg, out, log = grown
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert runs == ["baseline-lr1e-06-seed0", "baseline-lr2e-06-seed0", "baseline-lr4e-06-seed0", "baseline-lr8e-06-seed0",
                    "oelm_freeze-seed0"]
    results = {p.parent.name: json.loads(p.read_text()) for p in (out / "runs").glob("*/result.json")}
    ppl = {r["learning_rate"]: r["performance"]["best_validation"] for n, r in results.items() if n.startswith("baseline")}
    assert ppl[8e-6] < ppl[4e-6] < ppl[2e-6] < ppl[1e-6]  # the forced edge: every larger rate is better
    assert results["baseline-lr8e-06-seed0"]["stage"] == "final"  # marked final after the last growth only
    assert all(r["stage"] == "sweep" for n, r in results.items() if n.startswith("baseline") and "8e-06" not in n)
    sweep = json.loads((out / "sweep.json").read_text())
    assert sweep["selected_learning_rates"] == {"baseline": 8e-6} and sweep["selected_at_grid_edge"] == {"baseline": "high"}
    growth = sweep["grid_growth"]["baseline"]
    assert [(g["from"], g["to"], g["edge"], g["automatic"]) for g in growth] == [
        ([1e-6, 2e-6], [1e-6, 2e-6, 4e-6], "high", True), ([1e-6, 2e-6, 4e-6], [1e-6, 2e-6, 4e-6, 8e-6], "high", True)]
    assert growth[0]["validation"] == [{"learning_rate": 1e-6, "best_validation": ppl[1e-6], "n": 1},
                                       {"learning_rate": 2e-6, "best_validation": ppl[2e-6], "n": 1}]
    assert "grid_growth" not in json.loads((out / "experiment.json").read_text())  # the config's grid never changed
    assert ("[baseline] selected learning rate 2e-06 is the highest of its grid [1e-06, 2e-06] (mean best validation over "
            f"seeds [0]: 1e-06: {ppl[1e-6]:.6g}, 2e-06: {ppl[2e-6]:.6g}): the grid grows to [1e-06, 2e-06, 4e-06] on validation, "
            "before any final run (1 of max_grid_growth 2)") in log
    assert "(2 of max_grid_growth 2)" in log and "after 2 automatic growth(s): max_grid_growth 2" in log
    # the run log says each growth as it happens, before the added rate trains
    assert log.index("the grid grows to [1e-06, 2e-06, 4e-06]") < log.index("[baseline-lr4e-06-seed0]")
    assert log.index("the grid grows to [1e-06, 2e-06, 4e-06, 8e-06]") < log.index("[baseline-lr8e-06-seed0]")
    c = json.loads((out / "comparison.json").read_text())
    assert c["methods"]["baseline"]["learning_rate_grid"] == [1e-6, 2e-6, 4e-6, 8e-6]
    edge = [w for w in c["warnings"] if w.startswith("baseline: selected learning rate")]
    assert edge == ["baseline: selected learning rate 8e-06 is the highest of its grid [1e-06, 2e-06, 4e-06, 8e-06]; a wider "
                    "grid could change the result (its grid grew 2 time(s) on validation and max_grid_growth 2 stopped it "
                    "at this edge)."]
    assert not any("grew from" in w for w in c["warnings"])  # an automatic growth is no caveat
    report = (out / "report.md").read_text()
    assert "baseline: the grid grew on validation from [1e-06, 2e-06] to [1e-06, 2e-06, 4e-06], before any final run" in report
    # rerunning the same command trains nothing and grows nothing more
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/result.json")}
    assert main(["run", str(cfg), "--output-dir", str(out)]) == 0
    assert {p: p.stat().st_mtime_ns for p in out.glob("runs/*/result.json")} == stamps
    assert json.loads((out / "sweep.json").read_text())["grid_growth"] == sweep["grid_growth"]


def _plan(cfg: Path, out: Path, capsys) -> tuple[list[dict], str]:
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["plan", str(cfg), "--output-dir", str(out)]) == 0
    return [json.loads(line) for line in buf.getvalue().splitlines()], capsys.readouterr().err


def test_plan_only_and_collect_grow_the_same_grid(grown, tmp_path, capsys):
    """A batch system's loop (`oelm plan`, `--only` per line, again) sees each grown rate once its
    grid's runs are done, prints one line per growth, and `--collect` equals the local executor."""
    from _tiny_matrix import numbers

    cfg, reference, _ = grown
    out = tmp_path / "out"
    rounds, errs = [], []
    while True:
        lines, err = _plan(cfg, out, capsys)
        errs.append(err)
        if not lines:
            break
        rounds.append([x["name"] for x in lines])
        for line in lines:
            assert main(["run", str(cfg), "--output-dir", str(out), "--only", line["name"]]) == 0
        assert len(rounds) < 6
    assert rounds == [["baseline-lr1e-06-seed0", "baseline-lr2e-06-seed0", "oelm_freeze-seed0"],
                      ["baseline-lr4e-06-seed0"], ["baseline-lr8e-06-seed0"]]
    assert errs[1].count("the grid grows to") == 1 and errs[-1].count("the grid grows to") == 2
    plan = json.loads((out / "plan.json").read_text())
    assert {r["name"] for r in plan["runs"]} == {p.name for p in (reference / "runs").iterdir()}
    assert main(["run", str(cfg), "--output-dir", str(out), "--collect"]) == 0
    assert numbers(out) == numbers(reference)
    assert json.loads((out / "sweep.json").read_text())["grid_growth"] == \
        json.loads((reference / "sweep.json").read_text())["grid_growth"]
