"""The claims table (oelm.report.claims): its verdict rule, its measurements equal the committed
comparisons' paired statistics, and docs/results/README.md carries exactly the computed table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from oelm.report.claims import BEGIN, CLAIMS, END, Claim, claims_markdown, main, measure, update_readme, verdict

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


@pytest.mark.parametrize(("gap", "ci", "expected"), [
    (-1.84, [-3.0, -1.0], "reproduced"),
    (-1.84, [-0.9, -0.2], "direction reproduced, size smaller"),
    (-1.84, [-6.0, -4.0], "direction reproduced, size larger"),
    (7.14, [1.0, 3.0], "direction reproduced, size smaller"),
    (-1.84, [0.5, 2.0], "contradicted: opposite direction"),
    (7.14, [-1.0, 2.0], "contradicted: no effect of the claimed size"),
    (-1.84, [-2.5, 0.7], "inconclusive at n = 3"),
])
def test_verdict_rule(gap, ci, expected):
    assert verdict(gap, ci, 3) == expected


def test_verdict_needs_two_seeds():
    assert verdict(1.0, None, 1) == "not decidable (n = 1 seeds)"


@pytest.mark.parametrize("method", ["oelm_freeze", "oelm_random"])
def test_measure_equals_the_committed_paired_statistics(method):
    """On the committed cpu-sst2 comparison: the claim machinery's paired gap is the report's."""
    comparison = json.loads((RESULTS / "cpu-sst2" / "comparison.json").read_text())
    m = measure(Claim("x", "x", "x", -1.0, method=method, comparison="cpu-sst2"), RESULTS)
    paired = comparison["vs_baseline"][method]["paired_metric"]
    assert m["status"] == "measured" and m["n"] == 3 and m["seeds"] == [0, 1, 2]
    assert m["mean"] == pytest.approx(paired["mean"]) and m["ci95"] == pytest.approx(paired["ci95"])
    assert m["p_value"] == pytest.approx(paired["p_value"])
    assert m["method_mean"] == pytest.approx(comparison["methods"][method]["best_validation"]["mean"])
    assert m["verdict"] == verdict(-1.0, paired["ci95"], 3, "22.7M parameters")  # the scale: MiniLM's parameters
    assert m["interval"] == "seed-only interval"  # cpu-sst2's runs saved no predictions


def test_relative_perplexity_gap_is_per_seed_percent_of_the_reference():
    comparison = json.loads((RESULTS / "cpu-tinystories" / "comparison.json").read_text())
    runs = {m: {r["seed"]: r["best_validation"] for r in comparison["methods"][m]["runs"]}
            for m in ("baseline", "oelm_freeze")}
    expected = [100 * (runs["oelm_freeze"][s] / runs["baseline"][s] - 1) for s in (0, 1, 2)]
    m = measure(Claim("x", "x", "x", 9.84, comparison="cpu-tinystories", relative=True), RESULTS)
    assert m["mean"] == pytest.approx(sum(expected) / 3)


def test_untestable_and_pending_claims_say_why(tmp_path):
    untestable = next(c for c in CLAIMS if c.untestable)
    assert measure(untestable, tmp_path) == {"status": "untestable", "why": untestable.untestable}
    testable = next(c for c in CLAIMS if c.comparison)
    assert measure(testable, tmp_path) == {"status": "pending", "config": testable.config}
    for claim in CLAIMS:  # every config a claim names exists
        assert claim.untestable or (Path(__file__).resolve().parents[1] / claim.config).is_file(), claim.key


def test_readme_carries_the_computed_table():
    text = (RESULTS / "README.md").read_text()
    block = text[text.index(BEGIN) + len(BEGIN) + 1:text.index(END)]
    assert block == claims_markdown(RESULTS), "run: python -m oelm.report.claims docs/results --update docs/results/README.md"


def test_update_rewrites_only_the_block_and_names_a_file_without_markers(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\n{BEGIN}\nold table\n{END}\n\nafter\n")
    assert main([str(RESULTS), "--update", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# title\n\n" + BEGIN + "\n| original claim") and text.endswith(END + "\n\nafter\n")
    assert "old table" not in text and update_readme(readme, RESULTS) is False
    bare = tmp_path / "bare.md"
    bare.write_text("no markers\n")
    with pytest.raises(ValueError, match="bare.md: no claims block"):
        update_readme(bare, RESULTS)


def test_speed_claim_row_reads_the_committed_benchmark(tmp_path):
    data = json.loads((RESULTS / "bench-cpu" / "cpu-bench.json").read_text())
    ratio = data["ratios"]["oelm_freeze"]
    row = next(line for line in claims_markdown(RESULTS).splitlines() if "57% faster per step" in line)
    assert f"{100 * (1 - ratio['median']):.1f}% time saved per step" in row and f"{ratio['median']:.3f}" in row
    assert f"FLOP bound {100 * (1 - ratio['theory']):.1f}%" in row and "contradicted at this shape (4 layers × 256)" in row
    # without the benchmark the row says pending instead of inventing a number
    shutil.copytree(RESULTS, tmp_path / "results", ignore=shutil.ignore_patterns("bench-cpu"))
    row = next(line for line in claims_markdown(tmp_path / "results").splitlines() if "57% faster per step" in line)
    assert row.endswith("| pending |")


def test_speed_claim_has_a_row_per_committed_gpu_benchmark(tmp_path):
    """Each `bench-*.json` of a committed GPU check (docs/results/gpu-*/) adds a row with its own
    ratio, GPU name, precision and compile setting; without GPU checks there is no such row."""
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results, ignore=shutil.ignore_patterns("gpu-*"))
    assert not [line for line in claims_markdown(results).splitlines() if line.startswith("| …on a GPU |")]
    bench = json.loads((RESULTS / "bench-cpu" / "cpu-bench.json").read_text())
    ratios = {"compile": 0.902, "nocompile": 0.911}
    for flag, median in ratios.items():
        bench_gpu = bench | {"device": "cuda", "config": {"precision": "bf16", "compile": flag == "compile"},
                             "environment": {"cuda": {"name": "NVIDIA H100 80GB HBM3"}},
                             "ratios": {"oelm_freeze": {"median": median, "p10": 0.82, "p90": 1.08, "n": 50, "theory": 0.978}}}
        path = results / "gpu-20261124-h100" / f"bench-gpt-bf16-{flag}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(bench_gpu))
    rows = [line for line in claims_markdown(results).splitlines() if line.startswith("| …on a GPU |")]
    assert len(rows) == 2
    for row, (flag, median) in zip(rows, ratios.items()):
        assert f"{100 * (1 - median):.1f}% time saved per step" in row and f", {median:.3f};" in row
        assert "cuda (NVIDIA H100 80GB HBM3), bf16, torch.compile " + ("on" if flag == "compile" else "off") in row
        assert "FLOP bound 2.2%" in row and "| contradicted at this shape (4 layers × 256): measured " in row  # cpu-bench's shape
        assert "more than the 2.2% FLOP bound" in row


def test_trainable_percent_claim_is_recomputed():
    row = next(line for line in claims_markdown(RESULTS).splitlines() if "87.1% of its parameters" in line)
    assert "| 87.05% (95,310,339 of 109,484,547) |" in row and row.endswith("| reproduced |")


@pytest.mark.parametrize(("mean", "verdict_text"), [(90.3, "within 2 points"), (88.9, "outside 2 points: see below")])
def test_sst2_anchor_row_compares_baseline_with_the_published_minilm_figure(tmp_path, mean, verdict_text):
    folder = tmp_path / "evidence-sst2-minilm"
    folder.mkdir()
    stat = {"mean": mean, "std": 0.4, "n": 3}
    (folder / "comparison.json").write_text(json.dumps({"methods": {"baseline": {"best_validation": stat}}}))
    from oelm.report.claims_rows import PUBLISHED_MINILM_L6_SST2, anchor_row as _anchor_row

    row = _anchor_row(tmp_path)
    assert row[2].startswith(f"{mean:.2f} ± 0.40") and f"{mean - PUBLISHED_MINILM_L6_SST2:+.2f} points" in row[2]
    assert row[-1] == verdict_text


def test_a_verdict_carries_the_caveats_of_its_comparison(tmp_path):
    """cpu-sst2 standing in for the SST-2 evidence: every method's rate sits on an edge of its
    2-rate grid and some runs were best at their last step, so the OELM-Freeze row's verdict
    names both for baseline and oelm_freeze; an excluded (collapsed) run and a grid grown after
    test results existed are named too; a comparison without them has no caveat."""
    from oelm.report.claims import caveats

    shutil.copytree(RESULTS / "cpu-sst2", tmp_path / "evidence-sst2-minilm")
    row = next(l for l in claims_markdown(tmp_path).splitlines() if l.startswith("| BERT-base SST-2"))
    assert row.endswith("(caveat: baseline's learning rate is the lowest of its grid; "
                        "baseline still improving at its last evaluation in 2 seed(s); "
                        "oelm_freeze's learning rate is the highest of its grid; "
                        "oelm_freeze still improving at its last evaluation in 2 seed(s)) |")
    comparison = json.loads((RESULTS / "cpu-sst2" / "comparison.json").read_text())
    comparison["methods"]["oelm_random"]["excluded"] = [{"seed": 2, "reasons": ["x"]}]
    comparison["sweep"]["grid_growth"] = {"oelm_random": [{"from": [1, 2], "to": [1, 2, 3], "at": "t",
                                                           "tested_final_runs": ["oelm_random-lr1-seed0"]}]}
    assert caveats(comparison, ("oelm_random",)) == [
        "oelm_random's learning rate is the lowest of its grid", "oelm_random: 1 run(s) excluded as collapsed",
        "oelm_random still improving at its last evaluation in 1 seed(s)", "oelm_random's grid grew after test results existed"]
    for m in comparison["methods"].values():
        m["selected_at_grid_edge"], m["excluded"] = None, []
    comparison["best_at_last_step"] = {}
    comparison["sweep"]["grid_growth"]["oelm_random"][0]["tested_final_runs"] = []
    assert caveats(comparison, ("baseline", "oelm_freeze", "oelm_random")) == []


def test_an_mfu_in_a_verdict_names_the_peak_it_is_a_fraction_of():
    """The committed GPU rows quote the baseline's MFU: against the GPU's datasheet peak, said so."""
    rows = [line for line in claims_markdown(RESULTS).splitlines() if line.startswith("| …on a GPU |")]
    assert rows and all("% MFU (of the H100 SXM datasheet peak for bf16) " in row for row in rows)


def test_speed_row_reads_a_bert_bench_file():
    """A bench file of the BERT-sized shape (no gpt_config; num_layers/hidden_size for every family)
    gives a speed row naming an encoder, not a KeyError."""
    import json

    from oelm.report.claims_rows import bench_row as _bench_row

    bench = json.loads((RESULTS / "bench-cpu" / "cpu-bench.json").read_text())
    bench["model"] = {k: v for k, v in bench["model"].items() if k != "gpt_config"} | {
        "family": "bert", "num_layers": 12, "hidden_size": 768}
    row = _bench_row("claim", bench, gpu=False)
    assert "BERT-style encoder 12 layers × hidden 768" in row[3]
    gpt = json.loads((RESULTS / "bench-cpu" / "cpu-bench.json").read_text())
    assert _bench_row("claim", gpt, gpu=False)[3].startswith("oelm bench, GPT ")


# --- issue 36: scale, fragile intervals, hierarchical intervals, questions, the new seed claims ---------------

@pytest.mark.parametrize(("ci", "n", "p", "expected"), [
    ([-0.14, 1.64], 3, 0.068, ["n = 3 and the interval ends 0.14 from 0", "p = 0.068"]),  # the orthogonal row
    ([-2.53, -0.62], 3, 0.019, ["p = 0.019"]),
    ([0.1, 2.0], 5, 0.004, []),  # close to 0, but 5 seeds and p < 0.01
    ([-4.66, -3.98], 3, 0.0004, []),
])
def test_fragile_rule(ci, n, p, expected):
    from oelm.report.claims import fragile

    assert fragile({"ci95": ci, "n": n, "p_value": p}) == expected


def test_committed_fragile_row_says_so():
    row = next(l for l in claims_markdown(RESULTS).splitlines() if l.startswith("| …and orthogonality is what"))
    assert "fragile: n = 3 and the interval ends 0.14 from 0; p = 0.068)" in row
    assert "contradicted at 22.7M parameters: no effect of the claimed size" in row


@pytest.mark.parametrize(("ci", "higher", "expected"), [
    ([-0.5, 0.8], True, "no difference resolved at n = 5, 22.7M parameters"),
    ([0.2, 1.1], True, "differs at 22.7M parameters: m better than r"),
    ([0.2, 1.1], False, "differs at 22.7M parameters: m worse than r"),  # perplexity: higher is worse
    ([-3.0, -1.0], False, "differs at 22.7M parameters: m better than r"),
])
def test_difference_verdict_of_our_questions(ci, higher, expected):
    from oelm.report.claims import difference_verdict

    assert difference_verdict(ci, 5, "22.7M parameters", "m", "r", higher) == expected


def test_every_research_row_reads_the_folder_its_config_names_and_is_pending_without_it(tmp_path):
    """The research rows read docs/results/<the config's name:>/, and say pending (running in the
    background) while it is absent."""
    from oelm.config import load_config
    from oelm.report.claims import RESEARCH

    root = Path(__file__).resolve().parents[1]
    for claim in RESEARCH + tuple(c for c in CLAIMS if c.comparison and c.comparison.startswith("research-")):
        assert load_config(root / claim.config).name == claim.comparison, claim.key
        assert measure(claim, tmp_path) == {"status": "pending", "config": claim.config}
    table = claims_markdown(tmp_path)
    assert table.count("pending (running in the background): `configs/research/") == len(RESEARCH) + 2


@pytest.fixture(scope="module")
def stand_in_results(tmp_path_factory, data_dir):
    """A committed-style results folder: baseline and oelm_freeze with saved test predictions (the
    stand-ins of tests/test_uncertainty.py on the real SST-2 labels), oelm_random without."""
    from test_uncertainty import RATE, SEEDS, _sst2_labels, _write_run

    from oelm.config import config_from_dict
    from oelm.report import write_comparison

    results = tmp_path_factory.mktemp("results")
    out = results / "stand-in"
    labels = _sst2_labels(Path(data_dir))
    runs = {m: [_write_run(out, m, s, labels) for s in SEEDS] for m in RATE}
    runs["oelm_random"] = [_write_run(out, "oelm_random", s, None, test_accuracy=80.0 + s) for s in SEEDS]
    config = config_from_dict({"name": "stand-in", "task": {"dataset": "sst2", "test_split": "test"},
                               "model": {"gpt": "gpt-tiny"}, "methods": [{"name": m} for m in runs], "seeds": list(SEEDS)})
    return results, write_comparison(config, runs, out)


def test_a_comparison_with_predictions_gets_the_seeds_by_examples_interval(stand_in_results):
    """The claim's interval is the seeds × examples interval of the report's uncertainty section (the
    same estimate and interval, computed again from the committed predictions), and the row says so;
    a method without predictions keeps the seed-only interval."""
    results, comparison = stand_in_results
    claim = Claim("x", "stand-in claim", "x", -1.0, comparison="stand-in", field="test")
    m = measure(claim, results)
    u = comparison["uncertainty"]["methods"]["oelm_freeze"]
    assert m["interval"] == "seeds × examples interval" and u["interval"] == "seeds × examples"
    assert m["mean"] == pytest.approx(u["gap"]) and m["ci95"] == pytest.approx(u["ci95"])
    assert m["ci95"] != pytest.approx(comparison["vs_baseline"]["oelm_freeze"]["paired_test"]["ci95"])
    row = next(l for l in _rows_of((claim,), results).splitlines() if l.startswith("| stand-in claim"))
    assert "(test; seeds × examples interval)" in row
    seed_only = measure(Claim("y", "y", "y", -1.0, method="oelm_random", comparison="stand-in", field="test"), results)
    assert seed_only["interval"] == "seed-only interval"
    assert seed_only["ci95"] == pytest.approx(comparison["vs_baseline"]["oelm_random"]["paired_test"]["ci95"])


def _rows_of(claims, results):
    from oelm.report.claims import _row

    return "\n".join(_row(c, measure(c, results)) for c in claims)


def test_classification_versus_generation_row():
    from oelm.report.claims import task_kind_row

    def m(lo, hi, scale="1.3M parameters"):
        return {"status": "measured", "mean": (lo + hi) / 2, "ci95": [lo, hi], "scale": scale}

    suits = task_kind_row({"sst2": m(-0.5, 0.4), "imdb": m(0.5, 2.0), "ag_news": m(-1.0, 1.0), "tinystories": m(5.0, 9.0)})
    assert suits[-1] == "reproduced at 1.3M parameters: no classification task loses, generation does not suit it"
    mixed = task_kind_row({"sst2": m(-2.0, -1.0, "22.7M parameters"), "imdb": m(0.5, 2.0), "tinystories": m(-1.0, 2.0)})
    assert mixed[-1] == ("half reproduced at 1.3M parameters and 22.7M parameters: generation is not worse, but "
                         "classification does not suit it either: OELM-Freeze loses on 1 of 2 classification tasks and gains on 1")
    assert task_kind_row({"sst2": m(-2.0, -1.0)})[-1] == "pending"
    committed = next(l for l in claims_markdown(RESULTS).splitlines() if l.startswith('| "Classification suits OELM'))
    assert "loses on 2 of 3 classification tasks and gains on 0" in committed  # SST-2 and AG News intervals below 0


def test_bert_timing_rows_read_the_interleaved_minilm_benchmark(tmp_path):
    """The original's "+1.4% per step, no significant difference" and "CV 1.0% vs 9.9%" against the
    committed MiniLM-shape benchmark: time saved and its interval from the median ratio's 95% CI;
    the step-time CV and the Brown-Forsythe test recomputed here from the per-step times."""
    from scipy import stats

    from oelm.report.claims_rows import per_step_row, stability_row

    bench = json.loads((RESULTS / "bench-cpu" / "minilm-cls.json").read_text())
    ratio = bench["ratios"]["oelm_freeze"]
    row = per_step_row(RESULTS)
    assert f"{100 * (1 - ratio['median']):.1f}% time saved per step" in row[2]
    assert f"95% CI {ratio['ci95'][0]:.3f}–{ratio['ci95'][1]:.3f}" in row[2]
    inside = ratio["ci95"][0] <= 1 <= ratio["ci95"][1]
    assert row[-1].startswith("reproduced at the MiniLM-L6 shape" if inside else "contradicted at the MiniLM-L6 shape")
    times = {k: np.asarray(bench["runners"][k]["step_times_ms"]) for k in ("baseline", "oelm_freeze")}
    cv = {k: 100 * t.std(ddof=1) / t.mean() for k, t in times.items()}
    p = stats.levene(times["oelm_freeze"], times["baseline"], center="median").pvalue
    row = stability_row(RESULTS)
    assert f"step-time CV {cv['oelm_freeze']:.1f}% vs {cv['baseline']:.1f}%" in row[2] and f"p = {p:.2f}" in row[2]
    assert row[-1].startswith("not reproduced" if p >= 0.05 else ("direction reproduced" if cv["oelm_freeze"] < cv["baseline"]
                                                                  else "contradicted"))
    for make in (per_step_row, stability_row):  # without the benchmark: pending, no invented number
        assert make(tmp_path)[-1] == "pending"


def test_the_gpt_trainable_share_is_counted_on_the_original_gpt_shape():
    row = next(l for l in claims_markdown(RESULTS).splitlines() if l.startswith("| …and the GPT with Q/K frozen"))
    assert "| 92.98% (41,757,184 of 44,909,056) |" in row and "contradicted for this GPT (92.98%)" in row
