"""Validation, selection and early stopping in oelm.training: the Metric notion (direction,
chance, min_delta), TrainState and its checkpoint dict, evaluate's one host read, the
end-of-training validation, and early stopping (patience, the best weights tested, its count
across a resume); on a tiny real SST-2 `oelm run` (oelm GPT, BPE-512), the tiny TinyStories run
of _train_driver and a tiny model (_tiny_model)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
import torch

from _reliability import in_process, in_process_summary, metrics_records, sigterm_at
from _tiny_model import Tiny, tiny_loader
from oelm.cli import main
from oelm.cli.monitor import snapshot_text
from oelm.errors import RunInterruptedError
from oelm.metrics import ACCURACY, PERPLEXITY, get_metric
from oelm.training import TrainState
import oelm.training.evaluation


def test_metric_direction_chance_and_format():
    assert get_metric("accuracy") is ACCURACY and get_metric(PERPLEXITY) is PERPLEXITY
    assert ACCURACY.better(91.3, 91.2) and not ACCURACY.better(91.2, 91.2)
    assert PERPLEXITY.better(4.2, 4.7) and PERPLEXITY.reaches(4.7, 4.7) and not PERPLEXITY.reaches(4.8, 4.7)
    assert ACCURACY.chance_level(num_labels=2, majority_percent=50.92) == pytest.approx(50.92)
    assert ACCURACY.chance_level(num_labels=4, majority_percent=None) == 25.0
    assert PERPLEXITY.chance_level(num_labels=2) is None
    assert ACCURACY.label == "accuracy (%)" and PERPLEXITY.label == "perplexity"
    assert PERPLEXITY.format(4.69123) == "4.691" and ACCURACY.format(None) == "—"
    with pytest.raises(ValueError, match="unknown metric 'bleu'; known: accuracy, perplexity"):
        get_metric("bleu")


def test_metric_improves_by_more_than_min_delta():
    assert ACCURACY.improves(80.5, 80.0) and not ACCURACY.improves(80.5, 80.0, min_delta=0.5)
    assert ACCURACY.improves(80.6, 80.0, min_delta=0.5) and not ACCURACY.improves(80.0, 80.0)
    assert PERPLEXITY.improves(4.5, 4.7, min_delta=0.1) and not PERPLEXITY.improves(4.65, 4.7, min_delta=0.1)
    assert not PERPLEXITY.improves(4.8, 4.7) and not PERPLEXITY.improves(float("nan"), 4.7)


def test_train_state_round_trips_through_its_checkpoint_dict():
    state = TrainState(step=7, epoch=1, batches_in_epoch=3, running_n=2, last_loss=0.75, best_value=4.5, best_step=6,
                       last_eval={"value": 4.5, "loss": 1.5, "n": 10}, history=[{"type": "eval", "step": 6}],
                       per_epoch_seconds=[1.25], elapsed_seconds=3.5, process_start_steps=[0])
    d = state.to_dict() | {"identity": {"learning_rate": 1e-3}, "format": 1}  # checkpoint extras are ignored
    assert TrainState.from_dict(d) == state
    fresh = TrainState()
    assert fresh.to_dict()["last_loss"] is None and math.isnan(TrainState.from_dict(fresh.to_dict()).last_loss)


def test_train_state_from_a_checkpoint_written_before_early_stopping_starts_its_count_at_zero():
    old = TrainState(step=7, best_value=4.5, best_step=6).to_dict()
    for key in ("evals_without_improvement", "early_stopping_reference"):
        del old[key]
    state = TrainState.from_dict(old)
    assert state.evals_without_improvement == 0 and state.early_stopping_reference is None and state.best_step == 6


def test_evaluate_reads_the_device_once_not_per_batch(monkeypatch):
    """The sums stay on the device (float64/int64) and are read once at the end: the same number
    of host reads for 2 batches as for 10, and the same value as the per-batch Python sum."""
    from oelm.training import evaluate

    torch.manual_seed(0)
    model = Tiny()
    expected = {}
    for n in (4, 20):
        loader = tiny_loader(n)
        with torch.no_grad():
            outs = [(model(**b), b["labels"]) for b in loader]
        loss = sum(float(o.loss) * len(y) for o, y in outs) / n
        correct = sum(int((o.logits.argmax(-1) == y).sum()) for o, y in outs)
        expected[n] = {"value": 100.0 * correct / n, "loss": loss, "n": n}
    reads = {}
    real = {name: getattr(torch.Tensor, name) for name in ("item", "__bool__", "__float__", "__int__")}
    for n in (4, 20):
        loader, count = tiny_loader(n), []
        batches = list(loader)
        for name, fn in real.items():
            monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _fn=fn, **k: (count.append(1), _fn(self, *a, **k))[1])
        result = evaluate(model, batches, "accuracy")
        for name, fn in real.items():
            monkeypatch.setattr(torch.Tensor, name, fn)
        reads[n] = len(count)
        assert result == expected[n]
    assert reads[4] == reads[20] <= 3


def test_the_end_of_training_validation_is_not_a_second_record_of_nearly_the_same_weights(tmp_path, data_dir):
    """41 steps, a validation every 20: the one scheduled at 40 would evaluate nearly the weights
    of the end-of-training one at 41; it is left to that one. 50 steps keep 40 (half an interval
    before the end). Every validated step has one record."""
    near, _, _ = in_process(tmp_path / "near", "training.max_steps=41", "training.checkpoint_every=null")
    far, _, _ = in_process(tmp_path / "far", "training.max_steps=50", "training.checkpoint_every=null")
    assert [r["step"] for r in near.history if r["type"] == "eval"] == [20, 41]
    assert [r["step"] for r in far.history if r["type"] == "eval"] == [20, 40, 50]
    assert near.final_validation == [r for r in near.history if r["type"] == "eval"][-1]["perplexity"]


# A learning rate of 1e-7 leaves the tiny GPT's predictions on these 48 SST-2 validation sentences
# unchanged: validation accuracy is flat from the first validation (step 2) on, so it never
# improves again (the loss still moves in the 6th digit, so the weights do change).
FLAT_SST2 = (
    "name: flat\n"
    "task: {dataset: sst2, test_split: test, tokenizer: bpe-512, train_samples: 64, validation_samples: 48, max_length: 32}\n"
    "model: {gpt: gpt-tiny, gpt_overrides: {hidden_size: 32, num_layers: 2, num_heads: 2, intermediate_size: 64, dropout: 0.0}}\n"
    "methods: [{name: baseline, learning_rate: 1.0e-7}]\n"
    "seeds: [0]\n"
    "training: {max_steps: 12, batch_size: 16, eval_every: 2, log_every: 3, timing_warmup_steps: 1, progress_bar: false,"
    " tensorboard: false}\n"
)


def _flat_sst2_run(tmp_path: Path, *overrides: str) -> tuple[dict, list[dict], Path]:
    """`oelm run` of FLAT_SST2: (result.json, metrics.jsonl records) of its one run, output dir."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "flat.yaml"
    cfg.write_text(FLAT_SST2)
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--output-dir", str(out), *overrides]) == 0
    run_dir = out / "runs" / "baseline-seed0"
    assert not (run_dir / "checkpoints").exists()  # finished: the resumable state is removed
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return json.loads((run_dir / "result.json").read_text()), records, out


def _weights_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def test_early_stopping_stops_patience_validations_after_the_best_and_tests_the_best_weights(
        tmp_path, data_dir, monkeypatch, capsys):
    """Patience 3 on a flat validation accuracy: validations at 2 (the best), 4, 6, 8, then the
    run ends as a finished one, reports where and why, and tests the step-2 weights."""
    evaluated = []  # sha256 of the weights of every evaluate() call: the validations, then the test
    real_evaluate = oelm.training.evaluation.evaluate

    def recording_evaluate(model, *args, **kwargs):
        evaluated.append(_weights_digest(model))
        return real_evaluate(model, *args, **kwargs)

    monkeypatch.setattr(oelm.training.evaluation, "evaluate", recording_evaluate)
    result, records, out = _flat_sst2_run(tmp_path, "training.early_stopping_patience=3")
    perf, budget = result["performance"], result["budget"]
    evals = [r["step"] for r in records if r["type"] == "eval"]
    stops = [r for r in records if r["type"] == "early_stop"]
    assert perf["best_step"] == 2 and evals == [2, 4, 6, 8]  # 3 validations after the best one, not one more
    assert perf["early_stopped"] is True and perf["steps"] == budget["steps_run"] == budget["steps"] == 8
    assert budget["planned_steps"] == 12 and budget["samples"] == 8 * 16
    assert len(stops) == 1 and stops[0]["step"] == 8 and stops[0]["best_step"] == 2
    assert stops[0]["evals_without_improvement"] == stops[0]["patience"] == 3 and stops[0]["planned_steps"] == 12
    assert [r["step"] for r in records if r["type"] == "train"][-1] == 8  # the last steps' loss is logged, as at an end
    assert [r["step"] for r in records if r["type"] == "test"] == [2] and perf["test"] is not None
    # The test split was evaluated once, with the weights of the best validation (step 2), not the last;
    # the final run's predictions.npz comes from those evaluations: no pass over the validation split after them.
    assert len(evaluated) == len(evals) + 1 and evaluated[-1] == evaluated[0] != evaluated[-2]
    assert "[baseline-seed0] early stop at step 8 of 12: no improvement in 3 validations (best accuracy" in (
        capsys.readouterr().out)
    report = (out / "report.md").read_text()
    assert "| baseline | 0 | finished |" in report and "| converged: stopped on patience at step 8 of 12 (best at 2) |" in report
    assert "Stopped early (training.early_stopping_patience): baseline seed 0." in report
    assert "finished (early stop)" in snapshot_text(out)


def test_without_patience_a_flat_run_takes_every_planned_step(tmp_path, data_dir):
    """None (the default) never stops; a patience that is never reached changes no number."""
    result, records, out = _flat_sst2_run(tmp_path / "off")
    patient, patient_records, _ = _flat_sst2_run(tmp_path / "patient", "training.early_stopping_patience=100")
    perf, budget = result["performance"], result["budget"]
    assert result["config"]["training"]["early_stopping_patience"] is None
    assert perf["early_stopped"] is False and perf["steps"] == budget["steps_run"] == budget["planned_steps"] == 12
    assert [r["step"] for r in records if r["type"] == "eval"] == list(range(2, 13, 2))
    assert not any(r["type"] == "early_stop" for r in records)
    assert "stopped early" not in (out / "report.md").read_text() and "early stop" not in snapshot_text(out)
    assert perf == patient["performance"]

    def numbers(rs):
        return [{k: v for k, v in r.items() if k not in ("elapsed_seconds", "step_ms", "train_wall_seconds")} for r in rs]

    assert numbers(records) == numbers(patient_records)


EARLY_STOP = ["training.max_steps=45", "training.eval_every=10", "training.early_stopping_patience=2",
              "training.early_stopping_min_delta=1.0e6"]  # no validation after the first beats it by 1e6


def test_early_stopping_count_survives_a_resume(tmp_path, data_dir):
    """The count of validations without improvement is in every checkpoint: interrupted at step
    25 (one such validation behind it, at 20), the resumed run stops at 30 like an uninterrupted
    one, bit-identical. Restarting the count would have run on to step 40 or to the end (45)."""
    reference, ref_model, _ = in_process(tmp_path / "ref", *EARLY_STOP)
    assert reference.early_stopped and reference.steps == 30 and reference.best_step in (10, 20, 30)
    run_dir = tmp_path / "run"
    with pytest.raises(RunInterruptedError):
        in_process(run_dir, *EARLY_STOP, hook=sigterm_at(25))
    saved = json.loads((run_dir / "checkpoints" / "step-25" / "trainer_state.json").read_text())
    assert saved["evals_without_improvement"] == 1 and saved["early_stopping_reference"] is not None
    resumed, model, _ = in_process(run_dir, *EARLY_STOP)
    assert resumed.timing["process_start_steps"] == [0, 25]
    assert resumed.early_stopped and resumed.steps == 30
    assert in_process_summary(resumed, model, run_dir) == in_process_summary(reference, ref_model, tmp_path / "ref")
    assert metrics_records(run_dir) == metrics_records(tmp_path / "ref")
