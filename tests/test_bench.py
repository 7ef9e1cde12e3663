"""Tests for `oelm bench` (oelm.bench): a few interleaved steps of a tiny GPT on CPU, the JSON
figures, the frozen-tensor honesty check, and one-line errors for bad input."""

from __future__ import annotations

import json

import pytest

from oelm import cli
from oelm.bench import BENCH_SHAPES, BenchConfig, run_bench

TINY_ARGS = [
    "bench", "--model", "gpt-tiny", "--set", "num_layers=2", "hidden_size=32", "num_heads=4", "intermediate_size=64",
    "--vocab-size", "128", "--seq-len", "16", "--batch-size", "2", "--steps", "6", "--warmup-steps", "1",
    "--device", "cpu", "--data", "random", "--no-progress",
]


@pytest.fixture(scope="module")
def bench_json(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    assert cli.main([*TINY_ARGS, "--json", str(path)]) == 0
    return json.loads(path.read_text())


def test_bench_json_has_sane_figures(bench_json):
    r = bench_json
    assert set(r["runners"]) == {"baseline", "oelm_freeze", "plain"}
    assert r["runners"]["plain"]["kind"] == "plain" and r["runners"]["baseline"]["kind"] == "engine"
    assert r["model"]["gpt_config"]["num_layers"] == 2 and r["model"]["tokens_per_step"] == 2 * 16
    for name, runner in r["runners"].items():
        s = runner["per_step_ms"]
        assert s["n"] == 6 and len(runner["step_times_ms"]) == 6, name
        assert 0 < s["p10"] <= s["median"] <= s["p90"], name
        assert runner["tokens_per_second"] > 0
        # tokens/s is tokens over the timed steps' seconds
        assert runner["tokens_per_second"] == pytest.approx(32 * 6 / (sum(runner["step_times_ms"]) / 1000), rel=1e-6)
        mfu = runner["mfu"]
        assert mfu["peak_source"] == "measured-probe" and mfu["peak_flops"] > 0
        assert mfu["mfu"] == pytest.approx(mfu["flops_per_token"] * runner["tokens_per_second"] / mfu["peak_flops"])
        assert runner["final_loss"] > 0
    ratio = r["ratios"]["oelm_freeze"]
    assert ratio["median"] > 0 and ratio["n"] == 6 and ratio["p10"] <= ratio["median"] <= ratio["p90"]
    per_step = sorted(a / b for a, b in zip(r["runners"]["oelm_freeze"]["step_times_ms"], r["runners"]["baseline"]["step_times_ms"]))
    assert ratio["median"] == pytest.approx((per_step[2] + per_step[3]) / 2)
    assert 0.9 < ratio["theory"] < 1.0  # frozen Q/K skip their weight gradients
    assert isinstance(r["engine_overhead_percent"], float)
    assert r["data"] == "random token ids"


def test_frozen_qk_are_bit_identical_after_the_bench(bench_json):
    frozen = bench_json["runners"]["oelm_freeze"]
    assert frozen["frozen_tensors"] == 2 * 2 * 2  # q and k, weight and bias, 2 layers
    assert frozen["frozen_bit_identical"] is True
    assert bench_json["runners"]["baseline"]["frozen_tensors"] == 0


def test_frozen_check_can_fail(monkeypatch):
    # If a "frozen" tensor moved during the steps, the record must say so.
    import oelm.bench as bench

    calls = {"n": 0}
    real = bench._frozen_bytes

    def moving(model):
        calls["n"] += 1
        out = real(model)
        return {k: v + b"x" for k, v in out.items()} if calls["n"] > 3 else out  # after the steps: different

    monkeypatch.setattr(bench, "_frozen_bytes", moving)
    cfg = BenchConfig(model="gpt-tiny", overrides={"num_layers": 1, "hidden_size": 16, "num_heads": 2, "intermediate_size": 32},
                      vocab_size=64, seq_len=8, batch_size=2, steps=2, warmup_steps=1, device="cpu", data="random", plain=False)
    result = run_bench(cfg, progress=False)
    assert result["runners"]["oelm_freeze"]["frozen_bit_identical"] is False
    assert result["engine_overhead_percent"] is None and "plain" not in result["runners"]


def test_cpu_bench_shape_is_issue_12s():
    s = BENCH_SHAPES["cpu-bench"]
    assert (s.overrides["num_layers"], s.overrides["hidden_size"], s.overrides["num_heads"], s.overrides["intermediate_size"],
            s.overrides["vocab_size"], s.batch_size, s.seq_len) == (4, 256, 4, 1024, 4096, 8, 128)


@pytest.mark.parametrize(
    "args, message",
    [
        (["bench", "--model", "gpt-huge"], "unknown bench model 'gpt-huge'; valid: cpu-bench, gpt-medium-512, gpt-tiny"),
        (["bench", "--methods", "oelm_freeze"], "must include baseline"),
        (["bench", "--methods", "baseline,frozen_everything"], "unknown method(s) frozen_everything"),
        (["bench", "--set", "num_layers"], "--set expects key=value"),
        (["bench", "--set", "layers=2"], "unknown GPTConfig override key(s) 'layers'"),
        (["bench", "--data", "imagenet"], "unknown --data 'imagenet'"),
        (["bench", "--steps", "0"], "--steps must be >= 1"),
    ],
)
def test_bad_input_is_one_line_error(args, message, capsys):
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("oelm: error: ") and message in err and err.count("\n") == 1, err
