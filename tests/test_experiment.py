"""End-to-end `oelm run` on real data, tiny budgets: result files, comparison, resume, errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from oelm.cli import main
from oelm.experiment import run_order, run_name
from oelm.init import max_orthogonality_error

ROOT = Path(__file__).resolve().parents[1]
TINY_SST2 = [
    "task.train_samples=48", "task.validation_samples=40", "training.max_steps=4", "training.batch_size=12",
    "training.eval_every=2", "training.log_every=2", "training.timing_warmup_steps=1", "training.progress_bar=false",
]
MINILM_TOTAL = 22_713_986
MINILM_QK = 6 * 2 * (384 * 384 + 384)  # 6 layers x (query + key) x (weight + bias)


@pytest.fixture(scope="module")
def sst2_run(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("sst2")
    assert main(["run", str(ROOT / "configs/quickstart.yaml"), "--output-dir", str(out), *TINY_SST2]) == 0
    return out


def test_result_json_has_every_field(sst2_run):
    for method in ("baseline", "oelm_freeze", "oelm_random"):
        r = json.loads((sst2_run / "runs" / f"{method}-seed0" / "result.json").read_text())
        assert r["method"] == method and r["seed"] == 0 and r["task"] == "sst2"
        assert r["model"] == "sentence-transformers/all-MiniLM-L6-v2"
        assert r["config"]["task"]["train_samples"] == 48 and r["config"]["training"]["max_steps"] == 4
        env = r["environment"]
        for key in ("python", "packages", "device", "cpu_model", "torch_num_threads", "load_average", "matmul_probe", "matmul_probe_after"):
            assert key in env, key
        assert env["matmul_probe"]["gflops"] > 0 and env["matmul_probe_after"]["gflops"] > 0
        assert env["packages"]["torch"].startswith("2.") and env["matmul_probe_drift_percent"] is not None
        p = r["parameters"]
        assert p["total"] == MINILM_TOTAL
        expected_frozen = 0 if method == "baseline" else MINILM_QK
        assert p["frozen"] == expected_frozen and p["trainable"] == MINILM_TOTAL - expected_frozen
        assert p["trainable_percent"] == pytest.approx(100 * p["trainable"] / p["total"])
        perf = r["performance"]
        assert perf["metric"] == "accuracy"
        assert 0 <= perf["best_validation"] <= 100 and 0 <= perf["final_validation"] <= 100
        assert perf["best_step"] in (2, 4) and perf["steps"] == 4
        assert perf["best_validation"] >= perf["final_validation"]
        assert math.isfinite(perf["final_train_loss"]) and perf["final_train_loss"] > 0
        t = r["timing"]
        assert t["total_seconds"] > t["train_seconds"] > 0
        assert t["validation_seconds"] > 0 and t["data_seconds"] >= 0
        assert len(t["per_epoch_seconds"]) >= 1 and all(s > 0 for s in t["per_epoch_seconds"])
        sm = t["per_step_ms"]
        assert sm["n"] == 3  # 4 steps, 1 timing warm-up step excluded
        assert sm["p10"] <= sm["median"] <= sm["p90"] and sm["mean"] > 0
        assert t["tokens_per_second"] > 0 and t["samples_per_second"] > 0
        lines = [json.loads(l) for l in (sst2_run / "runs" / f"{method}-seed0" / "metrics.jsonl").read_text().splitlines()]
        assert [l["step"] for l in lines if l["type"] == "eval"] == [2, 4]
        assert any((sst2_run / "runs" / f"{method}-seed0" / "tensorboard").iterdir())


def test_checkpoint_keeps_frozen_orthogonal_qk(sst2_run):
    state = load_file(str(sst2_run / "runs" / "oelm_freeze-seed0" / "checkpoint" / "model.safetensors"))
    base = load_file(str(sst2_run / "runs" / "baseline-seed0" / "checkpoint" / "model.safetensors"))
    for layer in range(6):
        q = state[f"bert.encoder.layer.{layer}.attention.self.query.weight"]
        assert max_orthogonality_error(q, 12) < 1e-5  # still orthonormal after training: frozen
        assert max_orthogonality_error(base[f"bert.encoder.layer.{layer}.attention.self.query.weight"], 12) > 0.01


def test_comparison_and_report(sst2_run):
    c = json.loads((sst2_run / "comparison.json").read_text())
    assert set(c["methods"]) == {"baseline", "oelm_freeze", "oelm_random"}
    gap = c["vs_baseline"]["oelm_freeze"]
    b, f = c["methods"]["baseline"], c["methods"]["oelm_freeze"]
    assert gap["metric_gap"] == pytest.approx(f["best_validation"]["mean"] - b["best_validation"]["mean"])
    assert gap["speedup"] == pytest.approx(b["total_seconds"]["mean"] / f["total_seconds"]["mean"])
    assert gap["total_time_gap_percent"] == pytest.approx(100 * (f["total_seconds"]["mean"] / b["total_seconds"]["mean"] - 1))
    assert gap["parameters_saved_percent"] == pytest.approx(100 * MINILM_QK / MINILM_TOTAL)
    report = (sst2_run / "report.md").read_text()
    assert "| oelm_freeze |" in report and "best val accuracy" in report


def test_report_command_rebuilds_comparison(sst2_run):
    before = json.loads((sst2_run / "comparison.json").read_text())
    (sst2_run / "comparison.json").unlink()
    (sst2_run / "report.md").unlink()
    assert main(["report", str(sst2_run)]) == 0
    after = json.loads((sst2_run / "comparison.json").read_text())
    assert after == before and "| oelm_random |" in (sst2_run / "report.md").read_text()


def test_rerun_keeps_finished_runs(sst2_run, capsys):
    path = sst2_run / "runs" / "baseline-seed0" / "result.json"
    before = path.read_bytes(), path.stat().st_mtime_ns
    assert main(["run", str(ROOT / "configs/quickstart.yaml"), "--output-dir", str(sst2_run), *TINY_SST2]) == 0
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    assert "finished earlier; kept" in capsys.readouterr().out


def test_rerun_with_display_only_change_is_accepted(sst2_run):
    args = [a for a in TINY_SST2 if not a.startswith("training.progress_bar")]
    assert main(["run", str(ROOT / "configs/quickstart.yaml"), "--output-dir", str(sst2_run), *args,
                 "training.progress_bar=true", "training.tensorboard=false"]) == 0


def test_missing_pretrained_model_is_a_clear_error(tmp_path, capsys):
    code = main(["run", str(ROOT / "configs/quickstart.yaml"), "--output-dir", str(tmp_path),
                 "model.pretrained=no-such-org/no-such-model"])
    err = capsys.readouterr().err
    assert code == 2 and "no-such-org/no-such-model" in err and "local directory" in err
    assert "Traceback" not in err


def test_rerun_with_changed_config_is_refused(sst2_run, capsys):
    code = main(["run", str(ROOT / "configs/quickstart.yaml"), "--output-dir", str(sst2_run), *TINY_SST2, "training.learning_rate=0.5"])
    err = capsys.readouterr().err
    assert code == 2 and "holds results of a different config" in err and "training" in err


def test_language_modelling_run(tmp_path, data_dir):
    out = tmp_path / "ts"
    code = main([
        "run", str(ROOT / "configs/tinystories-tiny.yaml"), "--output-dir", str(out),
        "task.train_samples=60", "task.validation_samples=20", "task.tokenizer=bpe-512", "task.block_size=64",
        "training.max_steps=6", "training.eval_every=3", "training.log_every=3", "training.progress_bar=false",
        "methods=[{name: baseline}, {name: oelm_freeze}]",
    ])
    assert code == 0
    r = json.loads((out / "runs" / "oelm_freeze-seed0" / "result.json").read_text())
    assert r["performance"]["metric"] == "perplexity"
    assert 1 < r["performance"]["best_validation"] < 10_000
    assert r["data"]["train"]["blocks"] > 0 and r["parameters"]["frozen"] == 4 * 2 * (128 * 128 + 128)
    assert r["timing"]["tokens_per_second"] > 0
    state = load_file(str(out / "runs" / "oelm_freeze-seed0" / "checkpoint" / "model.safetensors"))
    assert max_orthogonality_error(state["transformer.h.0.attn.k_proj.weight"], 4) < 1e-5


def test_run_order_is_balanced():
    assert run_order(["A", "B", "C"], [0, 1, 2]) == [
        ("A", 0), ("B", 0), ("C", 0), ("C", 1), ("B", 1), ("A", 1), ("A", 2), ("B", 2), ("C", 2)]


def test_run_names_cannot_escape():
    name = run_name("../../etc", 0)  # sanitized, with a hash of the original name (no collisions)
    assert name.startswith("etc-") and name.endswith("-seed0") and ".." not in name
    assert "/" not in run_name("a/b", 1)


def test_cli_errors_are_one_clear_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntask: {dataset: sst2}\nmodel: {gpt: gpt-tiny}\nmethods: [{name: baseline}]\ntraining: {epoch: 2}\n")
    assert main(["run", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oelm: error: invalid experiment config") and "training.epoch" in err and "'epochs'" in err
    assert "Traceback" not in err


def test_missing_data_dir_is_a_clear_error(tmp_path, capsys):
    empty = tmp_path / "nodata"
    empty.mkdir()
    code = main(["run", str(ROOT / "configs/quickstart.yaml"), "--output-dir", str(tmp_path / "o"), f"task.data_dir={empty}"])
    err = capsys.readouterr().err
    assert code == 2 and str(empty) in err and "sst2" in err


def test_inspect_prints_projection_table(capsys):
    assert main(["inspect", "--gpt", "gpt-tiny", "--method", "oelm_freeze"]) == 0
    out = capsys.readouterr().out
    assert "transformer.h.0.attn.q_proj" in out and "trainable%:" in out


def test_mixed_precision_runs_in_one_process(tmp_path, data_dir):
    """bf16 and fp16 (loss-scaled) autocast train (CPU here, CUDA on a GPU), and a later fp32 run
    in the same process is really fp32: precision is per run, not process-wide state."""
    common = [
        "task.train_samples=40", "task.validation_samples=10", "task.tokenizer=bpe-512", "task.block_size=32",
        "training.max_steps=3", "training.eval_every=3", "training.progress_bar=false", "methods=[{name: oelm_freeze}]",
    ]
    losses = {}
    for precision in ("bf16", "fp16", "no"):
        out = tmp_path / precision
        assert main(["run", str(ROOT / "configs/tinystories-tiny.yaml"), "--output-dir", str(out),
                     f"training.mixed_precision={precision}", *common]) == 0
        r = json.loads((out / "runs" / "oelm_freeze-seed0" / "result.json").read_text())
        assert r["timing"]["mixed_precision"] == precision
        assert math.isfinite(r["performance"]["best_validation"])
        losses[precision] = r["performance"]["final_train_loss"]
    # Same seed and data: reduced precision really changed the arithmetic, fp32 did not use it.
    assert losses["bf16"] != losses["no"] and losses["fp16"] != losses["no"]
    assert losses["bf16"] == pytest.approx(losses["no"], rel=0.05)


def test_gpt_sequence_classification_run(tmp_path, data_dir):
    """oelm's GPT as a causal classifier on real SST-2 with the local GPT-2 tokenizer (pad = eos)."""
    cfg = tmp_path / "gpt-sst2.yaml"
    cfg.write_text(
        "name: gpt-sst2\n"
        "task: {dataset: sst2, tokenizer: gpt2, train_samples: 48, validation_samples: 32, max_length: 64}\n"
        "model: {gpt: gpt-tiny}\n"
        "methods: [{name: baseline}, {name: oelm_freeze}]\n"
        "training: {max_steps: 3, batch_size: 16, eval_every: 3, progress_bar: false, learning_rate: 1.0e-3}\n"
    )
    assert main(["run", str(cfg), "--output-dir", str(tmp_path / "out")]) == 0
    r = json.loads((tmp_path / "out" / "runs" / "oelm_freeze-seed0" / "result.json").read_text())
    assert r["performance"]["metric"] == "accuracy" and 0 <= r["performance"]["best_validation"] <= 100
    # vocab 50,257 x 128 tied embeddings + 4 blocks + 2-way score head; Q/K frozen
    assert r["parameters"]["frozen"] == 4 * 2 * (128 * 128 + 128)
    assert r["parameters"]["groups"]["head"]["total"] == 128 * 2 + 2
