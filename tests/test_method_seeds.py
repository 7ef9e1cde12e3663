"""Per-method seeds (issue 49): a ``methods:`` entry may name its own ``seeds`` (a subset of the
experiment's, holding the sweep seeds when it is swept), fixed in the config before any run. The
plan, plan.json (the monitor), the fingerprint and the report use them, and every comparison with
baseline pairs over the seeds both ran and says n. Also the fingerprint of ``max_grid_growth``."""

from __future__ import annotations

import json
import statistics

import pytest

from oelm.cli import main
from oelm.config import config_from_dict
from oelm.errors import ConfigError
from oelm.matrix.output import config_fingerprint
from oelm.matrix.plan import plan_runs, ready_runs

BASE = {"name": "x", "task": {"dataset": "sst2"}, "model": {"gpt": "gpt-tiny"}, "seeds": [0, 1, 2, 3, 4]}


def _config(methods, **extra):
    return config_from_dict(BASE | {"methods": methods} | extra)


def test_a_method_runs_its_own_seeds_in_the_plan():
    """baseline and oelm_freeze on 5 seeds, oelm_random on 3: the final stage keeps the balanced
    order over the experiment's seeds, each method on its own; the sweep stays on the sweep seeds."""
    c = _config([{"name": "baseline"}, {"name": "oelm_freeze"}, {"name": "oelm_random", "seeds": [0, 1, 2]},
                 {"name": "oelm_global", "learning_rates": [1e-4, 2e-4], "seeds": [2, 0]}])
    assert c.seeds_of(c.methods[2]) == [0, 1, 2] and c.seeds_of("oelm_global") == [0, 2]  # the experiment's order
    plan = plan_runs(c, {"oelm_global": 2e-4})
    finals = [(r.method, r.seed) for r in plan if r.stage == "final"]
    assert finals == [("baseline", 0), ("oelm_freeze", 0), ("oelm_random", 0), ("oelm_global", 0),
                      ("oelm_random", 1), ("oelm_freeze", 1), ("baseline", 1),
                      ("baseline", 2), ("oelm_freeze", 2), ("oelm_random", 2), ("oelm_global", 2),
                      ("oelm_freeze", 3), ("baseline", 3), ("baseline", 4), ("oelm_freeze", 4)]
    assert [(r.method, r.seed) for r in plan if r.stage == "sweep"] == [("oelm_global", 0), ("oelm_global", 0)]
    ready, _ = ready_runs(c, "accuracy", {})
    assert sorted(t.name for t in ready if t.run.method == "oelm_random") == ["oelm_random-seed0", "oelm_random-seed1",
                                                                             "oelm_random-seed2"]


@pytest.mark.parametrize("methods, extra, message", [
    ([{"name": "baseline", "seeds": [0, 7]}], {}, "methods[baseline].seeds [0, 7] must be distinct members of seeds"),
    ([{"name": "baseline", "seeds": [1, 1]}], {}, "methods[baseline].seeds [1, 1] must be distinct members"),
    ([{"name": "baseline", "learning_rates": [1e-4, 2e-4], "seeds": [1, 2]}], {"sweep_seeds": [0, 1]},
     "methods[baseline].seeds [1, 2] must hold the sweep seeds [0, 1] (its learning rate is swept on them; missing [0])"),
    ([{"name": "baseline", "seeds": []}], {}, "methods.0.seeds"),
])
def test_seeds_outside_the_experiments_or_without_the_sweep_seeds_are_refused(methods, extra, message):
    with pytest.raises(ConfigError) as info:
        _config(methods, **extra)
    assert message in str(info.value)


def test_a_method_without_a_sweep_may_leave_the_sweep_seeds_out():
    c = _config([{"name": "baseline", "learning_rates": [1e-4, 2e-4]}, {"name": "oelm_freeze", "seeds": [3, 4]}])
    assert c.seeds_of("oelm_freeze") == [3, 4] and c.seeds_of("baseline") == [0, 1, 2, 3, 4]


def test_the_fingerprint_has_the_cap_only_when_set_and_never_a_methods_seeds():
    """Defaults leave the fingerprint as before (every committed matrix keeps its own, tests/
    test_config.py); max_grid_growth is in it when set; a method's seeds never are (like the
    experiment's seeds, they decide which runs exist, not what a run computes)."""
    plain = config_fingerprint(_config([{"name": "baseline"}]))
    assert "seeds" not in plain["methods"]["baseline"] and "max_grid_growth" not in plain
    set_ = config_fingerprint(_config([{"name": "baseline", "seeds": [2, 0]}], max_grid_growth=2))
    assert set_["methods"] == plain["methods"] and set_["max_grid_growth"] == 2


@pytest.mark.parametrize("change, refused", [
    # a method's seeds may change like the experiment's (a matrix trimmed to the seeds it has, or grown)
    ({"methods": [{"name": "baseline", "seeds": [0, 1]}, {"name": "oelm_freeze", "seeds": [0, 1]}]}, None),
    ({"methods": [{"name": "baseline", "seeds": [0, 1]}, {"name": "oelm_freeze"}]}, None),
    ({"max_grid_growth": 1}, "max_grid_growth (lowered from 2 to 1: the rates it added would leave their grids; it may only rise)"),
    ({"max_grid_growth": 0}, "max_grid_growth (lowered from 2 to 0"),
    ({"max_grid_growth": 3}, None),  # raising it is fine: more rates, on validation only
    ({"seeds": [0, 1, 2, 3, 4, 5]}, None),  # the experiment's seeds may grow; a method's own stay
])
def test_a_folder_with_results_takes_changed_method_seeds_and_refuses_a_lowered_cap(tmp_path, change, refused):
    from oelm.matrix.output import _check_fingerprint, start_output

    c = config_from_dict(BASE | {"max_grid_growth": 2, "methods": [
        {"name": "baseline", "seeds": [0, 1]}, {"name": "oelm_freeze", "seeds": [0]}]})
    start_output(c, tmp_path)
    for name in ("baseline-seed0", "oelm_freeze-seed0"):  # results exist for both methods
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "result.json").write_text(json.dumps(
            {"method": name.split("-")[0], "seed": 0, "stage": "final", "status": "finished", "run_name": name}))
    changed = config_from_dict(BASE | {"max_grid_growth": 2, "methods": c.model_dump()["methods"]} | change)
    if refused is None:
        _check_fingerprint(tmp_path, config_fingerprint(changed))
        return
    with pytest.raises(ConfigError, match="holds results of a different config") as info:
        _check_fingerprint(tmp_path, config_fingerprint(changed))
    assert refused in str(info.value)


# --- end to end, on real TinyStories: unequal seeds through the report ------------------------

TINY_GPT = "{gpt: gpt-tiny, gpt_overrides: {hidden_size: 32, num_layers: 2, num_heads: 2, intermediate_size: 64, dropout: 0.0}}"
UNEQUAL = (
    "name: seeds-lm\n"
    "task: {dataset: tinystories, tokenizer: bpe-512, train_samples: 48, validation_samples: 12, block_size: 32}\n"
    f"model: {TINY_GPT}\n"
    "methods: [{name: baseline, learning_rate: 3.0e-3}, {name: oelm_freeze, learning_rate: 3.0e-3, seeds: [0, 1]}]\n"
    "seeds: [0, 1, 2]\n"
    "targets: {oelm_freeze: {perplexity_ratio_max: 10.0}}\n"
    "training: {max_steps: 4, batch_size: 16, eval_every: 2, log_every: 2, timing_warmup_steps: 1, progress_bar: false, "
    "tensorboard: false}\n"
)


@pytest.fixture(scope="module")
def unequal(tmp_path_factory, data_dir):
    tmp = tmp_path_factory.mktemp("seeds")
    cfg = tmp / "seeds.yaml"
    cfg.write_text(UNEQUAL)
    out = tmp / "out"
    assert main(["run", str(cfg), "--output-dir", str(out)]) == 0
    return out


def test_unequal_seeds_train_only_their_runs_and_the_monitor_lists_those(unequal, capsys):
    assert sorted(p.name for p in (unequal / "runs").iterdir()) == [
        "baseline-seed0", "baseline-seed1", "baseline-seed2", "oelm_freeze-seed0", "oelm_freeze-seed1"]
    plan = json.loads((unequal / "plan.json").read_text())
    assert sorted(r["name"] for r in plan["runs"]) == sorted(p.name for p in (unequal / "runs").iterdir())
    capsys.readouterr()
    assert main(["monitor", str(unequal), "--once"]) == 0
    shown = capsys.readouterr().out
    assert "oelm_freeze-seed1" in shown and "oelm_freeze-seed2" not in shown


def test_the_report_keeps_each_methods_n_and_pairs_the_gap_over_common_seeds(unequal):
    """Means ± sd per method over its own seeds (3 and 2); the gap to baseline, the paired t-test,
    the seeds × examples interval and the target over the 2 common seeds, each saying n = 2."""
    c = json.loads((unequal / "comparison.json").read_text())
    base, freeze = c["methods"]["baseline"], c["methods"]["oelm_freeze"]
    assert base["included_seeds"] == [0, 1, 2] and freeze["included_seeds"] == [0, 1]
    assert c["method_seeds"] == {"oelm_freeze": [0, 1]}
    value = {(m, r["seed"]): r["best_validation"] for m in ("baseline", "oelm_freeze") for r in c["methods"][m]["runs"]}
    assert base["best_validation"]["n"] == 3 and freeze["best_validation"]["n"] == 2
    assert base["best_validation"]["mean"] == pytest.approx(statistics.fmean(value["baseline", s] for s in (0, 1, 2)))
    gap = c["vs_baseline"]["oelm_freeze"]
    common = statistics.fmean(value["oelm_freeze", s] - value["baseline", s] for s in (0, 1))
    assert gap["metric_gap"] == pytest.approx(common)  # not the 2-seed mean minus the 3-seed mean
    assert gap["metric_gap"] != pytest.approx(freeze["best_validation"]["mean"] - base["best_validation"]["mean"])
    assert gap["paired_metric"]["n"] == 2 and gap["paired_metric"]["seeds"] == [0, 1]
    u = c["uncertainty"]["methods"]["oelm_freeze"]
    assert u["seeds"] == [0, 1] and u["interval"] == "seeds × examples" and u["seed_only"]["n"] == 2
    assert c["targets"]["methods"]["oelm_freeze"]["n"] == 2 and c["targets"]["methods"]["oelm_freeze"]["seeds"] == [0, 1]
    report = (unequal / "report.md").read_text()
    assert "seeds [0, 1, 2]; oelm_freeze: seeds [0, 1]." in report
    row = next(line for line in report.splitlines() if line.startswith("| oelm_freeze | ") and "(n=2)" in line)
    assert f"{common:+.2f} (n=2)" in row and row.rstrip(" |").endswith("2/2")
    assert next(line for line in report.splitlines() if line.startswith("| baseline | ")).rstrip(" |").endswith("3/3")
