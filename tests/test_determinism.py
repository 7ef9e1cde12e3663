"""Determinism: the same config and seed, run twice in fresh processes on CPU, give
bit-identical metrics, metrics.jsonl and weights (sha256 of every tensor)."""

from __future__ import annotations

import pytest

import json

from _reliability import comparable, metrics_records, start


@pytest.mark.slow
def test_same_config_and_seed_twice_is_bit_identical(tmp_path, data_dir):
    procs = {name: start(tmp_path / name, tmp_path / f"{name}.json") for name in ("first", "second")}  # concurrently
    results = []
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        results.append(json.loads((tmp_path / f"{name}.json").read_text()))
    assert results[0]["saved_weights"] and len(results[0]["model_weights"]) >= 10
    assert comparable(results[0]) == comparable(results[1])
    assert metrics_records(tmp_path / "first") == metrics_records(tmp_path / "second")


def test_a_different_seed_changes_the_run(tmp_path, data_dir):
    """The comparison above is not vacuous: changing the seed changes weights and metrics."""
    from _reliability import in_process, in_process_summary

    a = in_process_summary(*in_process(tmp_path / "a", "training.max_steps=10")[:2], tmp_path / "a")
    b = in_process_summary(*in_process(tmp_path / "b", "training.max_steps=10", "seeds=[1]")[:2], tmp_path / "b")
    assert a["model_weights"] != b["model_weights"] and a["performance"] != b["performance"]
