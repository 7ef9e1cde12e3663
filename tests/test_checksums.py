"""A finished run's best weights carry their sha256 (result.json ``checkpoint``), and every reuse
of them checks it: a rerun that keeps the run, the promotion of a sweep run, pretrain ->
fine-tune (``init_from``) and ``oelm report``. A flipped byte is named; intact files work;
results written before the record existed are accepted unchecked. Missing weights are refused
the same way unless ``--allow-missing-weights`` (a matrix carried to another machine without
them): then results count, and a selected sweep run is retrained for its test split."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from oelm.cli import main
from oelm.config import load_config
from oelm.errors import ChecksumError
from oelm.io import sha256_file
from oelm.matrix.assemble import resolve_init_from
from oelm.matrix.data import prepare_data
from oelm.matrix.run_one import promote
from oelm.records import PlannedRun, RunRecord

TINY_GPT = "{gpt: gpt-tiny, gpt_overrides: {hidden_size: 32, num_layers: 2, num_heads: 2, intermediate_size: 64, dropout: 0.0}}"
SELECTED = "baseline-lr0.003-seed0"  # the sweep's better candidate (the other barely moves in 4 steps)


@pytest.fixture(scope="module")
def swept(tmp_path_factory, data_dir):
    """One method swept over two learning rates on one seed: two sweep runs, the selected one
    promoted to the final run (test split evaluated from its checkpoint)."""
    tmp = tmp_path_factory.mktemp("checksums")
    cfg = tmp / "sum.yaml"
    cfg.write_text(
        "name: sum\n"
        "task: {dataset: sst2, test_split: test, tokenizer: bpe-512, train_samples: 48, validation_samples: 32, max_length: 32}\n"
        f"model: {TINY_GPT}\n"
        "methods: [{name: baseline, learning_rates: [1.0e-4, 3.0e-3]}]\n"
        "seeds: [0]\n"
        "training: {max_steps: 4, batch_size: 16, eval_every: 2, log_every: 2, timing_warmup_steps: 1, progress_bar: false, tensorboard: false}\n"
    )
    out = tmp / "out"
    assert main(["run", str(cfg), "--output-dir", str(out)]) == 0
    return cfg, out


@contextlib.contextmanager
def flipped_byte(path: Path):
    """Flip the last byte of ``path`` (inside the tensor data: the file still loads) for the block."""
    data = bytearray(path.read_bytes())
    original = bytes(data)
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    try:
        yield path
    finally:
        path.write_bytes(original)


def _ckpt(out: Path, run: str = SELECTED) -> Path:
    return out / "runs" / run / "checkpoint" / "model.safetensors"


def test_finished_runs_record_their_checkpoint_sha256(swept):
    _, out = swept
    for run_dir in (out / "runs").iterdir():
        r = json.loads((run_dir / "result.json").read_text())
        ckpt = run_dir / "checkpoint" / "model.safetensors"
        assert r["checkpoint"] == {"path": "checkpoint/model.safetensors", "sha256": sha256_file(ckpt),
                                   "bytes": ckpt.stat().st_size}, run_dir.name
    assert json.loads((out / "runs" / SELECTED / "result.json").read_text())["stage"] == "final"


def test_rerun_checks_kept_runs_checkpoints(swept, capsys):
    cfg, out = swept
    assert main(["run", str(cfg), "--output-dir", str(out)]) == 0  # intact: kept
    assert "finished earlier; kept" in capsys.readouterr().out
    with flipped_byte(_ckpt(out)) as bad:
        assert main(["run", str(cfg), "--output-dir", str(out)]) == 2
        err = capsys.readouterr().err
    assert err.startswith(f"oelm: error: {bad} is corrupted: its size or sha256 differs from the one recorded in "
                          f"{out / 'runs' / SELECTED / 'result.json'}; delete the folder {out / 'runs' / SELECTED} "
                          "and rerun the same command")
    assert err.count("\n") == 1


def test_promotion_checks_the_sweep_runs_checkpoint(swept):
    cfg, out = swept
    config = load_config(cfg)
    run_dir = out / "runs" / SELECTED
    result = RunRecord(json.loads((run_dir / "result.json").read_text()) | {"stage": "sweep", "selected": False})
    data = prepare_data(config)
    run = PlannedRun("baseline", 3.0e-3, 0, "final", SELECTED)
    before = (run_dir / "result.json").read_bytes()
    try:
        with flipped_byte(_ckpt(out)) as bad, pytest.raises(ChecksumError, match=f"{bad} is corrupted"):
            promote(config, config.methods[0], run, data, run_dir, result, lambda m: None)
        promoted = promote(config, config.methods[0], run, data, run_dir, result, lambda m: None)
        assert promoted.stage == "final" and promoted.test is not None
    finally:
        (run_dir / "result.json").write_bytes(before)


def test_init_from_checks_the_pretrained_runs_checkpoint(swept, tmp_path):
    cfg, out = swept
    fine = tmp_path / "fine.yaml"
    fine.write_text(cfg.read_text().replace("name: sum\n", f"name: fine\ninit_from: {out}\n"))
    config = load_config(fine)
    assert resolve_init_from(config, "baseline", 0) == _ckpt(out)
    with flipped_byte(_ckpt(out)) as bad, pytest.raises(ChecksumError) as info:
        resolve_init_from(config, "baseline", 0)
    assert str(info.value).startswith(f"{bad} is corrupted") and f"rerun the pretraining config with --output-dir {out}" in str(info.value)


def test_a_damaged_header_is_left_to_the_checksum_not_a_traceback_before_data(swept, tmp_path):
    """The pre-data shape check reads only safetensors headers and hashes nothing: an intact
    pretraining passes it, and a checkpoint whose header is damaged is skipped there (no
    traceback) and named by the sha256 check when the data is prepared."""
    from oelm.matrix.assemble import check_init_shapes

    cfg, out = swept
    fine = tmp_path / "fine.yaml"
    fine.write_text(cfg.read_text().replace("name: sum\n", f"name: fine\ninit_from: {out}\n"))
    config = load_config(fine)
    check_init_shapes(config)
    ckpt = _ckpt(out)
    before = ckpt.read_bytes()
    try:
        ckpt.write_bytes(before[:8] + b"X" + before[9:])  # the header's JSON no longer parses; same size
        check_init_shapes(config)
        with pytest.raises(ChecksumError, match=f"{ckpt} is corrupted"):
            resolve_init_from(config, "baseline", 0)
    finally:
        ckpt.write_bytes(before)


def test_results_without_a_recorded_sha256_are_accepted(swept, tmp_path):
    cfg, out = swept
    path = out / "runs" / SELECTED / "result.json"
    before = path.read_bytes()
    fine = tmp_path / "fine.yaml"
    fine.write_text(cfg.read_text().replace("name: sum\n", f"name: fine\ninit_from: {out}\n"))
    try:
        path.write_text(json.dumps({k: v for k, v in json.loads(before).items() if k != "checkpoint"}))
        with flipped_byte(_ckpt(out)):
            assert resolve_init_from(load_config(fine), "baseline", 0) == _ckpt(out)
    finally:
        path.write_bytes(before)


def test_report_warns_about_a_corrupted_final_checkpoint(swept, capsys):
    _, out = swept
    assert main(["report", str(out)]) == 0
    assert "warning" not in capsys.readouterr().err
    with flipped_byte(_ckpt(out)) as bad:
        assert main(["report", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"oelm: warning: {bad} is corrupted") and err.count("\n") == 1


def test_report_says_once_that_weights_are_absent_instead_of_warning(swept, capsys):
    """Committed results leave the weights out: the report says so in one line (how many runs),
    with no warning (a file that is there but corrupted still is one: the test above)."""
    _, out = swept
    removed = _ckpt(out)
    saved = removed.read_bytes()
    removed.unlink()
    try:
        capsys.readouterr()
        assert main(["report", str(out)]) == 0
        err = capsys.readouterr().err
        assert "warning" not in err and err.startswith("oelm: 1 finished run(s) have no best weights here")
    finally:
        removed.write_bytes(saved)


def _weightless_copy(out: Path, dest: Path, unpromote: str | None = None) -> Path:
    """``out`` as restored from a copy without weights (what scripts/collect_results.sh keeps);
    ``unpromote``: that run's result as it was before its promotion (a copy taken after the
    sweep, before the test split was evaluated)."""
    import shutil

    shutil.copytree(out, dest, ignore=shutil.ignore_patterns("*.safetensors", "checkpoints", ".claims", "comparison.json"))
    if unpromote:
        path = dest / "runs" / unpromote / "result.json"
        r = json.loads(path.read_text())
        r.update(stage="sweep", selected=False, performance=r["performance"] | {"test": None})
        r.pop("swept", None)
        path.write_text(json.dumps(r))
    return dest


def test_kept_runs_without_weights_are_refused_unless_allowed(swept, tmp_path, capsys):
    cfg, out = swept
    copy = _weightless_copy(out, tmp_path / "restored")
    before = {p.parent.name: p.read_bytes() for p in (copy / "runs").glob("*/result.json")}
    assert main(["run", str(cfg), "--output-dir", str(copy)]) == 2
    err = capsys.readouterr().err
    assert "is missing, but" in err and "rerun with --allow-missing-weights" in err
    assert main(["run", str(cfg), "--output-dir", str(copy), "--allow-missing-weights"]) == 0
    assert capsys.readouterr().out.count("best weights are missing; result kept without them") == 2
    # nothing retrained: every result as restored, and the comparison rebuilt from them
    assert {p.parent.name: p.read_bytes() for p in (copy / "runs").glob("*/result.json")} == before
    assert (json.loads((copy / "comparison.json").read_text())["methods"]["baseline"]["test"]["mean"]
            == json.loads((out / "comparison.json").read_text())["methods"]["baseline"]["test"]["mean"])


@pytest.mark.parametrize("executor", ["local", "only"])
def test_a_selected_sweep_run_without_weights_is_retrained_for_its_test_split(swept, tmp_path, capsys, executor):
    """The local executor, and `oelm run --only` on the promotion that `oelm plan` lists."""
    cfg, out = swept
    original = json.loads((out / "runs" / SELECTED / "result.json").read_text())
    copy = _weightless_copy(out, tmp_path / "restored", unpromote=SELECTED)
    flags = ["--only", SELECTED] if executor == "only" else []
    assert main(["run", str(cfg), "--output-dir", str(copy), *flags]) == 2  # not without the flag
    assert "rerun with --allow-missing-weights" in capsys.readouterr().err
    assert main(["run", str(cfg), "--output-dir", str(copy), *flags, "--allow-missing-weights"]) == 0
    assert "retraining it as the final run" in capsys.readouterr().out
    (aside,) = (copy / "runs" / ".weights-missing").iterdir()
    assert aside.name.startswith(SELECTED) and json.loads((aside / "result.json").read_text())["stage"] == "sweep"
    r = json.loads((copy / "runs" / SELECTED / "result.json").read_text())
    assert r["stage"] == "final" and r["selected"] and r["performance"]["test"] is not None
    assert r["retrained_without_weights"]["sweep_best_validation"] == original["performance"]["best_validation"]
    assert (copy / "runs" / SELECTED / "checkpoint" / "model.safetensors").is_file()
    # same seed, data order and budget on the same machine: the retrained run is the lost one again
    assert r["performance"]["best_validation"] == original["performance"]["best_validation"]
    assert r["performance"]["test"] == original["performance"]["test"]


def test_a_partial_copy_carries_a_matrix_to_a_machine_without_its_weights(swept, tmp_path, capsys):
    """scripts/collect_results.sh --partial copies the runs that have a result, without weights;
    `oelm run --allow-missing-weights` on that copy keeps them and trains only what was missing."""
    import shutil
    import subprocess

    cfg, out = swept
    running = "baseline-lr0.0001-seed0"  # no result.json yet: still training when the copy was taken
    machine = tmp_path / "old-machine"
    shutil.copytree(out, machine)
    (machine / "runs" / running / "result.json").unlink()
    carried = tmp_path / "carried"
    script = Path(__file__).resolve().parents[1] / "scripts" / "collect_results.sh"
    subprocess.run(["bash", str(script), "--partial", str(machine), str(carried)], check=True, capture_output=True)
    assert not list(carried.rglob("*.safetensors")) and not (carried / "runs" / running).exists()
    kept = (carried / "runs" / SELECTED / "result.json").read_bytes()
    assert kept == (out / "runs" / SELECTED / "result.json").read_bytes()
    assert main(["run", str(cfg), "--output-dir", str(carried), "--allow-missing-weights"]) == 0
    assert (carried / "runs" / SELECTED / "result.json").read_bytes() == kept  # kept, not retrained
    retrained = json.loads((carried / "runs" / running / "result.json").read_text())
    assert retrained["status"] == "finished" and (carried / "runs" / running / "checkpoint" / "model.safetensors").is_file()
    assert (retrained["performance"]["best_validation"]
            == json.loads((out / "runs" / running / "result.json").read_text())["performance"]["best_validation"])
