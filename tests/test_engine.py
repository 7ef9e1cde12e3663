"""Engine features of oelm.train: gradient accumulation, the WSD schedule, torch.compile, the
undone timing warm-up, TrainState round trips and the Metric notion, on the tiny real
TinyStories run of _train_driver (oelm GPT, BPE-384, 40 stories)."""

from __future__ import annotations

import math

import pytest
import torch

from _reliability import in_process, in_process_summary

from oelm.config import TrainingConfig
from oelm.errors import ConfigError
from oelm.metrics import ACCURACY, PERPLEXITY, get_metric
from oelm.train import TrainState, make_scheduler, optimizer_steps_per_epoch

NO_DROPOUT = "model.gpt_overrides={hidden_size: 32, num_layers: 2, num_heads: 2, intermediate_size: 64, dropout: 0.0}"
SHORT = ["training.max_steps=12", "training.eval_every=6", "training.checkpoint_every=null", NO_DROPOUT]


def _train_losses(result) -> list[float]:
    return [r["loss"] for r in result.history if r["type"] == "train"]


def test_accumulation_of_two_micro_batches_of_4_equals_one_batch_of_8(tmp_path, data_dir):
    """The same 8 sequences per optimizer step (the loader order is the sampler's, batched in 4s),
    the mean of two micro-batch means = the mean of 8 equal-length blocks: same training to float
    tolerance; an accumulation of 2 with batch 8 (16 per step) is a different run."""
    one, _, _ = in_process(tmp_path / "one", *SHORT, "training.batch_size=8")
    acc, _, _ = in_process(tmp_path / "acc", *SHORT, "training.batch_size=4", "training.gradient_accumulation_steps=2")
    big, _, _ = in_process(tmp_path / "big", *SHORT, "training.batch_size=8", "training.gradient_accumulation_steps=2")
    assert one.steps == acc.steps == big.steps == 12
    assert one.timing["samples"] == acc.timing["samples"] == 12 * 8 and big.timing["samples"] == 12 * 16
    assert acc.timing["gradient_accumulation_steps"] == 2
    for a, b in zip(_train_losses(one), _train_losses(acc)):
        assert math.isclose(a, b, rel_tol=1e-5)
    assert math.isclose(one.final_validation, acc.final_validation, rel_tol=1e-5)
    assert not math.isclose(one.final_validation, big.final_validation, rel_tol=1e-3)


def test_accumulation_larger_than_an_epoch_is_a_config_error():
    with pytest.raises(ConfigError, match="gradient_accumulation_steps=8 is more than the 5 batches"):
        optimizer_steps_per_epoch(5, 8)
    assert optimizer_steps_per_epoch(10, 3) == 3  # the remainder micro-batch is left out


def test_wsd_schedule_warms_up_holds_then_decays_over_the_last_fifth():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    cfg = TrainingConfig(schedule="wsd", warmup_steps=10, decay_ratio=0.2)
    sched = make_scheduler(opt, cfg, total_steps=100)
    lrs = []
    for _ in range(100):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == 0.0 and lrs[5] == pytest.approx(0.5)  # linear warmup
    assert all(lr == pytest.approx(1.0) for lr in lrs[10:80])  # stable
    assert lrs[81] < 1.0 and lrs[99] < 0.01 and all(a >= b for a, b in zip(lrs[80:], lrs[81:]))  # decay to ~0


def test_warmup_pass_is_undone_results_bit_identical_and_time_reported(tmp_path, data_dir):
    """The warm-up pass (dropout on, so it draws random numbers) changes no number of the run."""
    with_warmup = in_process(tmp_path / "w", "training.max_steps=10", "training.timing_warmup_passes=2")
    without = in_process(tmp_path / "n", "training.max_steps=10", "training.timing_warmup_passes=0")
    a = in_process_summary(with_warmup[0], with_warmup[1], tmp_path / "w")
    b = in_process_summary(without[0], without[1], tmp_path / "n")
    assert a == b
    assert with_warmup[0].timing["warmup_seconds"] > 0 and without[0].timing["warmup_seconds"] == 0.0
    assert with_warmup[0].timing["compile_seconds"] is None


@pytest.mark.slow
def test_compile_trains_the_same_model_and_reports_compile_seconds(tmp_path, data_dir):
    eager, _, _ = in_process(tmp_path / "e", *SHORT)
    compiled, model, _ = in_process(tmp_path / "c", *SHORT, "training.compile=true")
    assert compiled.timing["compile"] is True and compiled.timing["compile_seconds"] > 0
    assert compiled.steps == eager.steps
    assert math.isclose(compiled.final_validation, eager.final_validation, rel_tol=1e-3)
    assert not any(k.startswith("_orig_mod") for k in model.state_dict())  # the saved names are the model's own


def test_train_state_round_trips_through_its_checkpoint_dict():
    state = TrainState(step=7, epoch=1, batches_in_epoch=3, running_n=2, last_loss=0.75, best_value=4.5, best_step=6,
                       last_eval={"value": 4.5, "loss": 1.5, "n": 10}, history=[{"type": "eval", "step": 6}],
                       per_epoch_seconds=[1.25], elapsed_seconds=3.5, process_start_steps=[0])
    d = state.to_dict() | {"identity": {"learning_rate": 1e-3}, "format": 1}  # checkpoint extras are ignored
    assert TrainState.from_dict(d) == state
    fresh = TrainState()
    assert fresh.to_dict()["last_loss"] is None and math.isnan(TrainState.from_dict(fresh.to_dict()).last_loss)


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
