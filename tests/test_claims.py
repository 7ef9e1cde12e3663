"""The claims table (oelm.report.claims): its verdict rule, its measurements equal the committed
comparisons' paired statistics, and docs/results/README.md carries exactly the computed table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

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
    assert m["verdict"] == verdict(-1.0, paired["ci95"], 3)


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
    assert f"{100 * (1 / ratio['median'] - 1):.1f}% faster" in row and f"{ratio['median']:.3f}" in row
    assert f"FLOP bound {100 * (1 / ratio['theory'] - 1):.1f}%" in row and "contradicted" in row
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
        assert f"{100 * (1 / median - 1):.1f}% faster" in row and f", {median:.3f};" in row
        assert "cuda (NVIDIA H100 80GB HBM3), bf16, torch.compile " + ("on" if flag == "compile" else "off") in row
        assert "FLOP bound 2.2%" in row and "| contradicted: measured " in row and "more than the 2.2% FLOP bound" in row


def test_trainable_percent_claim_is_recomputed():
    row = next(line for line in claims_markdown(RESULTS).splitlines() if "87.1% of its parameters" in line)
    assert "| 87.05% (95,310,339 of 109,484,547) |" in row and row.endswith("| reproduced |")


@pytest.mark.parametrize(("mean", "verdict_text"), [(90.3, "within 2 points"), (88.9, "outside 2 points: see below")])
def test_sst2_anchor_row_compares_baseline_with_the_published_minilm_figure(tmp_path, mean, verdict_text):
    folder = tmp_path / "evidence-sst2-minilm"
    folder.mkdir()
    stat = {"mean": mean, "std": 0.4, "n": 3}
    (folder / "comparison.json").write_text(json.dumps({"methods": {"baseline": {"best_validation": stat}}}))
    from oelm.report.claims import PUBLISHED_MINILM_L6_SST2, _anchor_row

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

    from oelm.report.claims import _bench_row

    bench = json.loads((RESULTS / "bench-cpu" / "cpu-bench.json").read_text())
    bench["model"] = {k: v for k, v in bench["model"].items() if k != "gpt_config"} | {
        "family": "bert", "num_layers": 12, "hidden_size": 768}
    row = _bench_row("claim", bench, gpu=False)
    assert "BERT-style encoder 12 layers × hidden 768" in row[3]
    gpt = json.loads((RESULTS / "bench-cpu" / "cpu-bench.json").read_text())
    assert _bench_row("claim", gpt, gpu=False)[3].startswith("oelm bench, GPT ")
