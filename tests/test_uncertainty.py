"""Uncertainty over seeds x test examples (oelm.report.uncertainty), checked against independent
computation: a 2-method x 3-seed comparison on the real SST-2 validation sentences (872) with saved
predictions, its hierarchical bootstrap interval against a brute-force bootstrap written here, and
McNemar against scipy.stats and a hand count.

The predictions are deterministic STAND-INS derived from the real labels, not a trained model's:
per (method, seed) a fixed random generator decides which examples are right (an example-level
difficulty shared by all runs, a seed effect, a method effect), and the prediction is the label
or the other class. What is tested is the statistics and the file path they read, not a model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from oelm.config import config_from_dict
from oelm.records import RunRecord
from oelm.records.predictions import predictions_record, write_predictions
from oelm.report import compare_results, write_comparison
from oelm.report.uncertainty import hierarchical_bootstrap, mcnemar, seeds_needed

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SEEDS = (0, 1, 2)
RATE = {"baseline": 0.86, "oelm_freeze": 0.83}  # mean accuracy of each stand-in method
SEED_SHIFT = {0: 0.0, 1: 0.015, 2: -0.01}


def _sst2_labels(data_dir: Path) -> np.ndarray:
    frame = pd.read_parquet(data_dir / "sst2" / "validation.parquet")
    assert len(frame) == 872 and set(frame["label"]) == {0, 1}
    return frame["label"].to_numpy(np.int64)


def _stand_in(labels: np.ndarray, method: str, seed: int) -> dict[str, np.ndarray]:
    """Deterministic predictions of one (method, seed) on ``labels`` (see the module docstring)."""
    difficulty = np.random.default_rng(7).normal(0.0, 1.0, len(labels))  # the same for every run: examples are crossed with seeds
    p_right = 1 / (1 + np.exp(-(math.log(RATE[method] / (1 - RATE[method])) + 4 * SEED_SHIFT[seed] - 1.2 * difficulty)))
    rng = np.random.default_rng(1000 * list(RATE).index(method) + seed)
    right = rng.random(len(labels)) < p_right
    margin = np.where(right, 1, -1) * rng.uniform(0.05, 3.0, len(labels))
    order = rng.permutation(len(labels))  # saved in a loader order, not the dataset's: the reader must align by index
    cols = {"index": np.arange(len(labels)), "label": labels, "prediction": np.where(right, labels, 1 - labels),
            "margin": margin, "loss": np.log1p(np.exp(-margin))}
    return {k: v[order] for k, v in cols.items()}


def _write_run(out: Path, method: str, seed: int, labels: np.ndarray | None, test_accuracy: float | None = None) -> RunRecord:
    """A finished final run's folder: result.json and, with ``labels``, predictions.npz of its test split."""
    run = out / "runs" / f"{method}-seed{seed}"
    run.mkdir(parents=True)
    if labels is not None:
        test = _stand_in(labels, method, seed)
        valid = {k: v[:100] for k, v in test.items()}  # the validation split is not what this file tests
        write_predictions(run, "classification", {"validation": valid, "test": test},
                          {"metric": "accuracy", "step": 10, "splits": {}})
        test_accuracy = 100 * float(np.mean(test["label"] == test["prediction"]))
    result = {"method": method, "seed": seed, "run_name": run.name, "stage": "final", "status": "finished",
              "task": "sst2", "model": "stand-in",
              "data": {"num_labels": 2, "validation": {"majority_class_percent": 50.92}},
              "performance": {"metric": "accuracy", "best_validation": test_accuracy, "final_validation": test_accuracy,
                              "test": test_accuracy, "best_step": 10, "steps": 10, "final_train_loss": 0.3},
              "timing": {"total_seconds": 10.0}, "predictions": predictions_record(run)}
    (run / "result.json").write_text(json.dumps(result))
    return RunRecord(result)


def _config(methods):
    return config_from_dict({"name": "stand-in", "task": {"dataset": "sst2", "test_split": "test"},
                             "model": {"gpt": "gpt-tiny"}, "methods": [{"name": m} for m in methods],
                             "seeds": list(SEEDS)})


@pytest.fixture(scope="module")
def matrix(tmp_path_factory, data_dir):
    """baseline and oelm_freeze with saved predictions (3 seeds each); oelm_random without any."""
    out = tmp_path_factory.mktemp("uncertainty")
    labels = _sst2_labels(Path(data_dir))
    results = {m: [_write_run(out, m, s, labels) for s in SEEDS] for m in RATE}
    results["oelm_random"] = [_write_run(out, "oelm_random", s, None, test_accuracy=80.0 + s) for s in SEEDS]
    return out, labels, results


def _correct(out: Path, labels: np.ndarray, method: str, seed: int) -> np.ndarray:
    """Right/wrong per example in dataset order, from the raw file (not through oelm's reader)."""
    with np.load(out / "runs" / f"{method}-seed{seed}" / "predictions.npz") as z:
        index, label, pred = z["test/index"], z["test/label"], z["test/prediction"]
    right = np.empty(len(labels), dtype=bool)
    right[index] = label == pred
    assert np.array_equal(np.sort(index), np.arange(len(labels))) and np.array_equal(label, labels[index])
    return right


def test_interval_matches_an_independent_computation_and_the_bootstrap_a_brute_force_one(matrix):
    out, labels, results = matrix
    c = compare_results(_config(list(results)), results, out)
    u = c["uncertainty"]
    assert u["split"] == "test" and u["example_draw"] == "shared"
    freeze = u["methods"]["oelm_freeze"]
    assert freeze["interval"] == "seeds × examples" and freeze["seeds"] == [0, 1, 2] and freeze["examples"] == 872

    base = {s: _correct(out, labels, "baseline", s) for s in SEEDS}
    other = {s: _correct(out, labels, "oelm_freeze", s) for s in SEEDS}
    gaps = [100 * (other[s].mean() - base[s].mean()) for s in SEEDS]
    assert freeze["gap"] == pytest.approx(np.mean(gaps), abs=1e-9)

    # brute force, written from the definition: draw 3 seeds with replacement, then 872 examples with
    # replacement (one draw for every seed and both methods), average the drawn seeds' accuracy gaps
    rng = np.random.default_rng(12345)
    reps, test_reps = [], []
    for _ in range(3000):
        seeds = rng.integers(0, 3, 3)
        rows = rng.integers(0, 872, 872)
        reps.append(np.mean([100 * (other[s][rows].mean() - base[s][rows].mean()) for s in seeds]))
        test_reps.append(np.mean([100 * (other[s][rows].mean() - base[s][rows].mean()) for s in SEEDS]))
    low, high = np.percentile(reps, [2.5, 97.5])
    se = np.std(reps, ddof=1)
    assert freeze["bootstrap"]["se"] == pytest.approx(se, rel=0.08)
    assert abs(freeze["bootstrap"]["ci95"][0] - low) < 0.25 * se and abs(freeze["bootstrap"]["ci95"][1] - high) < 0.25 * se
    # the reported interval: each source with its own Student-t factor, in quadrature
    test_se = np.std(test_reps, ddof=1) * math.sqrt(872 / 871)
    assert freeze["test_se"] == pytest.approx(test_se, rel=0.08)
    seed_half = stats.t.ppf(0.975, 2) * stats.sem(gaps)
    half = math.sqrt(seed_half ** 2 + (stats.t.ppf(0.975, 871) * test_se) ** 2)
    assert freeze["ci95"][0] == pytest.approx(np.mean(gaps) - half, abs=0.05 * half)
    assert freeze["ci95"][1] == pytest.approx(np.mean(gaps) + half, abs=0.05 * half)
    # the seed-only interval leaves the test set out: the Student-t interval over the 3 per-seed gaps,
    # and the seeds × examples interval contains it
    t_low, t_high = stats.t.interval(0.95, 2, loc=np.mean(gaps), scale=stats.sem(gaps))
    assert freeze["seed_only"]["ci95"] == pytest.approx([t_low, t_high], abs=1e-9)
    assert freeze["ci95"][0] <= t_low and freeze["ci95"][1] >= t_high


def test_the_interval_is_the_seed_t_interval_without_test_noise_and_wide_on_two_documents():
    """No spread across examples: the interval is exactly the Student-t interval over seeds. Two
    test documents: the test set's part carries t(0.975, 1) = 12.7, not a normal 1.96."""
    from oelm.report.uncertainty import paired_interval

    per_seed = np.array([1.0, 2.5, 0.4])
    flat = np.repeat(per_seed[:, None], 50, axis=1)  # every example of a seed has the same gap
    got = paired_interval(flat, replicates=2000)
    assert got["test_se"] == pytest.approx(0.0, abs=1e-12)
    assert got["ci"] == pytest.approx(list(stats.t.interval(0.95, 2, loc=per_seed.mean(), scale=stats.sem(per_seed))))

    two_docs = np.array([[0.30, 0.10], [0.28, 0.12], [0.31, 0.09]])  # summed NLL differences of 2 books, 3 seeds
    tokens = np.array([1000.0, 1000.0])
    got = paired_interval(two_docs, tokens, transform="ratio", replicates=4000)
    gaps = np.exp(two_docs.sum(1) / tokens.sum())
    assert got["estimate"] == pytest.approx(gaps.mean())
    assert got["test_half_width"] == pytest.approx(stats.t.ppf(0.975, 1) * got["test_se"])
    assert got["ci"][1] - got["ci"][0] > 10 * (got["bootstrap"]["ci"][1] - got["bootstrap"]["ci"][0]) / 2


def test_a_bootstrap_over_three_seeds_can_be_narrower_than_their_t_interval_and_the_reported_one_is_not():
    """Why the report does not use the seed-resampling bootstrap as its interval: from 3 seeds it
    draws 10 distinct seed sets and comes out narrower than the plain Student-t interval over them."""
    from oelm.report.uncertainty import paired_interval

    rng = np.random.default_rng(3)
    per_seed = np.array([-6.0, -3.0, -1.5])
    numerators = per_seed[:, None] / 100 + rng.normal(0, 0.3, size=(3, 800))  # accuracy-like gaps, a little test noise
    got = paired_interval(numerators, transform="points", replicates=4000)
    gaps = np.array(got["seed_gaps"])
    t_low, t_high = stats.t.interval(0.95, 2, loc=gaps.mean(), scale=stats.sem(gaps))
    boot_low, boot_high = got["bootstrap"]["ci"]
    assert boot_high - boot_low < t_high - t_low
    assert got["ci"][0] <= t_low and got["ci"][1] >= t_high


def test_per_seed_example_draws_match_their_brute_force_and_are_narrower(matrix):
    """The nested variant (a fresh example draw per drawn seed) against its own brute force; with a
    test set shared by every run it understates the test set's share, so its interval is narrower."""
    out, labels, _ = matrix
    base = np.stack([_correct(out, labels, "baseline", s) for s in SEEDS]).astype(float)
    other = np.stack([_correct(out, labels, "oelm_freeze", s) for s in SEEDS]).astype(float)
    nested = hierarchical_bootstrap(other - base, transform="points", replicates=6000, example_draw="per_seed")
    rng = np.random.default_rng(99)
    reps = [np.mean([100 * (other[s][r] - base[s][r]).mean() for s in rng.integers(0, 3, 3)
                     for r in [rng.integers(0, 872, 872)]]) for _ in range(3000)]
    se = np.std(reps, ddof=1)
    assert nested["se"] == pytest.approx(se, rel=0.08)
    assert abs(nested["ci"][0] - np.percentile(reps, 2.5)) < 0.25 * se
    shared = hierarchical_bootstrap(other - base, transform="points", replicates=6000)
    assert shared["se"] > nested["se"]
    # reproducible: the same seed gives the same replicates
    assert hierarchical_bootstrap(other - base, transform="points", replicates=500) == \
        hierarchical_bootstrap(other - base, transform="points", replicates=500)


def _gathered(num: np.ndarray, den: np.ndarray | None, replicates: int, chunk: int = 256) -> tuple[list[float], float]:
    """The shared-draw bootstrap written by gathering each replicate's N drawn columns and summing
    them (the definition), with the draws hierarchical_bootstrap makes (same generator, same order)."""
    rng, (k, n), reps = np.random.default_rng(0), num.shape, []
    for start in range(0, replicates, chunk):
        b = min(chunk, replicates - start)
        seeds, picks = rng.integers(0, k, size=(b, k)), rng.integers(0, n, size=(b, n))
        per_seed = 100.0 * (num[:, picks].sum(axis=2).T / (n if den is None else den[:, picks].sum(axis=2).T))
        reps.extend(np.take_along_axis(per_seed, seeds, axis=1).mean(axis=1))
    return [float(x) for x in np.percentile(reps, [2.5, 97.5])], float(np.std(reps, ddof=1))


def test_integer_data_is_summed_from_draw_counts_to_the_same_bits_as_gathering_the_draws():
    """A classifier's correct_m − correct_b (and token counts) are integers: their sums are exact in
    any order, so the bootstrap sums them from how often each example was drawn, and its interval
    and SE equal the gathered definition's bit for bit; non-integer data takes the gathering path."""
    rng = np.random.default_rng(3)
    correct = rng.integers(-1, 2, size=(5, 1821)).astype(np.float64)
    tokens = rng.integers(20, 400, size=(5, 300)).astype(np.float64)
    nll = rng.normal(0, 1, size=(5, 300)) * tokens
    for num, den in ((correct, None), (rng.integers(-3, 4, size=(5, 300)).astype(np.float64), tokens), (nll, tokens)):
        got = hierarchical_bootstrap(num, den, transform="points", replicates=1000)
        assert (got["ci"], got["se"]) == _gathered(num, den, 1000)

def test_mcnemar_matches_scipy_and_a_hand_count(matrix):
    out, labels, results = matrix
    c = compare_results(_config(list(results)), results, out)
    rows = c["uncertainty"]["methods"]["oelm_freeze"]["mcnemar"]
    assert [r["seed"] for r in rows] == [0, 1, 2]
    for r in rows:
        base, other = _correct(out, labels, "baseline", r["seed"]), _correct(out, labels, "oelm_freeze", r["seed"])
        b = sum(1 for x, y in zip(base, other) if x and not y)  # counted by hand, one example at a time
        cc = sum(1 for x, y in zip(base, other) if y and not x)
        n = b + cc
        assert (r["b"], r["c"], r["n_discordant"]) == (b, cc, n) and n > 25
        assert r["p_exact"] == pytest.approx(stats.binomtest(cc, n, 0.5).pvalue, rel=1e-12)
        exact = min(1.0, 2 * sum(math.comb(n, i) for i in range(min(b, cc) + 1)) / 2 ** n)  # the textbook formula
        assert r["p_exact"] == pytest.approx(exact, rel=1e-9)
        chi2 = (abs(b - cc) - 1) ** 2 / n
        assert r["chi2_cc"] == pytest.approx(chi2) and r["p_chi2_cc"] == pytest.approx(stats.chi2.sf(chi2, 1))
    assert mcnemar([True, False], [True, False]) == {"b": 0, "c": 0, "n_discordant": 0, "p_exact": 1.0,
                                                     "chi2_cc": 0.0, "p_chi2_cc": 1.0}


def test_runs_without_predictions_get_a_seed_only_interval_in_the_same_table(matrix):
    out, _, results = matrix
    c = write_comparison(_config(list(results)), results, out)
    rnd = c["uncertainty"]["methods"]["oelm_random"]
    assert rnd["interval"] == "seed-only interval" and "no saved test predictions" in rnd["reason"]
    base = [r.test for r in results["baseline"]]
    gaps = [80.0 + s - base[s] for s in SEEDS]
    assert rnd["gap"] == pytest.approx(np.mean(gaps))
    assert rnd["ci95"] == pytest.approx(list(stats.t.interval(0.95, 2, loc=np.mean(gaps), scale=stats.sem(gaps))))
    md = (out / "report.md").read_text()
    section = md.split("## Uncertainty over seeds × test examples", 1)[1].split("\n## ", 1)[0]
    assert next(l for l in section.splitlines() if l.startswith("| oelm_random |")).count("seed-only interval") == 1
    freeze_row = next(l for l in section.splitlines() if l.startswith("| oelm_freeze |"))
    lo, hi = c["uncertainty"]["methods"]["oelm_freeze"]["ci95"]
    assert "seeds × examples" in freeze_row and f"[{lo:+.2f}, {hi:+.2f}]" in freeze_row


def test_a_damaged_predictions_file_is_one_note_and_a_seed_only_interval(matrix, tmp_path):
    import shutil

    out, _, results = matrix
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    path = copy / "runs" / "oelm_freeze-seed1" / "predictions.npz"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a flipped byte, as a bad disk or copy leaves it
    path.write_bytes(bytes(data))
    c = compare_results(_config(list(results)), results, copy)
    freeze = c["uncertainty"]["methods"]["oelm_freeze"]
    assert freeze["interval"] == "seed-only interval" and "seed(s) 1" in freeze["reason"]
    (note,) = c["uncertainty"]["notes"]
    assert "\n" not in note and str(path) in note and "is corrupted" in note and "result.json" in note


def test_seeds_needed_is_the_smallest_n_whose_t_interval_fits():
    s, x = 1.2, 1.0
    n = seeds_needed(s, x)
    assert n == next(k for k in range(2, 100) if stats.t.ppf(0.975, k - 1) * s / math.sqrt(k) <= x)
    assert stats.t.ppf(0.975, n - 2) * s / math.sqrt(n - 1) > x
    # the test set's own error is a floor that more seeds cannot lower
    with_test = seeds_needed(s, x, test_se=0.3, test_examples=872)
    test_half = stats.t.ppf(0.975, 871) * 0.3
    assert with_test == next(k for k in range(2, 100) if math.hypot(stats.t.ppf(0.975, k - 1) * s / math.sqrt(k), test_half) <= x)
    assert with_test > n
    assert seeds_needed(s, x, test_se=x / 1.9) is None and seeds_needed(None, x) is None
    assert seeds_needed(s, x, test_se=0.1, test_examples=2) is None  # 12.7 x 0.1 > 1: two documents cannot get there


def _p_by_hand(gap: float, seed_std: float, k: int, test_se: float, n: int) -> float:
    """The interval's p written here from its definition, with scipy's t.isf (not oelm's t.ppf path):
    the α at which gap ± sqrt((t·s/√k)² + (t·SE)²) reaches 0."""
    from scipy.optimize import brentq

    def excess(alpha):
        return math.hypot(stats.t.isf(alpha / 2, k - 1) * seed_std / math.sqrt(k),
                          stats.t.isf(alpha / 2, n - 1) * test_se) - abs(gap)

    return brentq(excess, 1e-12, 1.0, xtol=1e-15)


def test_the_interval_p_value_is_below_alpha_exactly_when_the_interval_excludes_zero(matrix):
    """One model per verdict: on the stand-ins over the real SST-2 labels (3 seeds × 872 examples),
    interval_p_value is below α exactly when paired_interval's (1 − α) interval excludes 0, at its own
    p the interval's end sits on 0, and it equals a p computed here from the formula; with no test-set
    spread it is the paired t-test's p (scipy)."""
    from oelm.report.uncertainty import P_FLOOR, interval_p_value, paired_interval

    out, labels, _ = matrix
    numerators = np.stack([_correct(out, labels, "oelm_freeze", s).astype(float) - _correct(out, labels, "baseline", s)
                           for s in SEEDS])
    got = paired_interval(numerators, transform="points", replicates=2000)
    p = interval_p_value(got["estimate"], got["seed_std"], 3, got["test_se"], 872)
    assert 0.001 < p < 0.5  # a gap neither certain nor nothing: both sides of the alphas below are exercised
    assert p == pytest.approx(_p_by_hand(got["estimate"], got["seed_std"], 3, got["test_se"], 872), rel=1e-6)
    for alpha in (0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 0.9):
        lo, hi = paired_interval(numerators, transform="points", replicates=2000, confidence=100 * (1 - alpha))["ci"]
        assert (p < alpha) == (not lo <= 0.0 <= hi), alpha
    at_p = paired_interval(numerators, transform="points", replicates=2000, confidence=100 * (1 - p))["ci"]
    assert min(abs(at_p[0]), abs(at_p[1])) < 1e-8 * abs(got["estimate"])

    per_seed = np.array([1.0, 2.5, 0.4])
    assert interval_p_value(per_seed.mean(), per_seed.std(ddof=1), 3, 0.0, None) == pytest.approx(
        stats.ttest_1samp(per_seed, 0.0).pvalue, rel=1e-9)
    assert interval_p_value(0.0, 1.0, 3, 0.5, 872) == 1.0
    assert interval_p_value(1.0, None, 1, 0.5, 872) is None  # one seed: no interval, no p
    assert interval_p_value(1.0, 0.0, 3, 0.0, 872) == P_FLOOR  # no spread at all: p is below any level
