"""OELM in the Hugging Face ecosystem: ``Trainer`` runs, activation (gradient) checkpointing.

Trainer: real SST-2 sentences, real MiniLM, weight decay 0.1 -> frozen Q/K bit-identical and
never in the optimizer, every trainable tensor changed, finite losses. Checkpointing: the
gradients of every trainable parameter equal those computed without it, frozen Q/K get none.
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

import oelm
from oelm import apply_oelm
from oelm.data import classification_collator, encode_classification, load_classification, subsample
from oelm.models.gpt import build_gpt
from oelm.models.pretrained import load_pretrained

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "trainer_sst2.py"


@pytest.fixture(scope="module")
def minilm_tokenizer():
    return load_pretrained(MINILM, "sequence_classification", num_labels=2)[1]


@pytest.fixture(scope="module")
def sst2_subset(data_dir, minilm_tokenizer):
    df = subsample(load_classification("sst2", "train", data_dir), 64, seed=0)
    return encode_classification(df, minilm_tokenizer, ("text",), max_length=48)


@pytest.mark.parametrize("activation_checkpointing", [False, True])
def test_trainer_few_steps_keeps_frozen_qk_bit_identical(tmp_path, minilm_tokenizer, sst2_subset, activation_checkpointing):
    torch.manual_seed(0)
    model, _ = load_pretrained(MINILM, "sequence_classification", num_labels=2, tokenizer=minilm_tokenizer)
    apply_oelm(model, "oelm_freeze")
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    trainable = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert len(frozen) == 6 * 4 and all(".attention.self.query." in n or ".attention.self.key." in n for n in frozen)

    # the example's helper picks this transformers' names (activation_checkpointing, or the older gradient_checkpointing)
    checkpointing = load_example().checkpointing_arguments(activation_checkpointing)
    prefix = next(iter(checkpointing)).removesuffix("_checkpointing")
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=5,
        per_device_train_batch_size=8,
        learning_rate=1e-4,
        weight_decay=0.1,
        **checkpointing,
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=sst2_subset, data_collator=classification_collator(minilm_tokenizer))
    out = trainer.train()

    assert out.global_step == 5
    assert getattr(model, f"is_{prefix}_checkpointing") == activation_checkpointing
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 5 and all(math.isfinite(x) for x in losses)
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    params = dict(model.named_parameters())
    assert not optimized & {id(params[n]) for n in frozen}  # frozen tensors never reach AdamW
    assert optimized == {id(params[n]) for n in trainable}
    for n, before in frozen.items():
        assert torch.equal(before, params[n]), f"frozen {n} moved"
    unchanged = [n for n, before in trainable.items() if torch.equal(before, params[n])]
    assert not unchanged, f"trainable tensors that did not change: {unchanged}"


def test_the_examples_trainer_decays_what_oelms_loop_decays_and_never_a_head_temperature(data_dir):
    """examples/trainer_sst2.py with ``oelm_temperature``: the Trainer's AdamW puts exactly the
    parameters oelm's own optimizer decays (``build_optimizer``: trainable >= 2-D weights) in its
    decayed group, so the 6 per-head temperatures get no weight decay; a stock ``Trainer`` would
    decay them (their name has no "bias" or "norm")."""
    from oelm.config import TrainingConfig
    from oelm.method.temperature import TEMPERATURE_NAME
    from oelm.training.engine import build_optimizer

    example = load_example()
    trainer = example.build_trainer(example.parse_args(["--method", "oelm_temperature", "--train-size", "16",
                                                        "--eval-size", "8", "--weight-decay", "0.1", "--data-dir",
                                                        str(data_dir), "--output-dir", "/nonexistent-unused"]))
    model = trainer.model
    temperatures = [n for n, _ in model.named_parameters() if n.endswith(f".{TEMPERATURE_NAME}")]
    assert len(temperatures) == 6
    assert set(temperatures) <= set(Trainer.get_decay_parameter_names(trainer, model))  # the stock rule decays them

    def decayed(optimizer) -> set[int]:
        return {id(p) for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]}

    def every(optimizer) -> set[int]:
        return {id(p) for g in optimizer.param_groups for p in g["params"]}

    ours = build_optimizer(model, 1e-4, TrainingConfig(weight_decay=0.1))
    theirs = trainer.create_optimizer()
    assert decayed(theirs) == decayed(ours) and every(theirs) == every(ours)
    assert not {id(p) for n, p in model.named_parameters() if n in temperatures} & decayed(theirs)


def load_example():
    """``examples/trainer_sst2.py`` as a module."""
    spec = importlib.util.spec_from_file_location("trainer_sst2", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def test_example_script_trains_and_saves_a_lean_checkpoint(tmp_path, data_dir):
    summary = load_example().main([
        "--max-steps", "3", "--train-size", "48", "--eval-size", "32", "--batch-size", "8",
        "--data-dir", str(data_dir), "--output-dir", str(tmp_path),
    ])
    assert summary["steps"] == 3 and math.isfinite(summary["train_loss"])
    assert summary["frozen_tensors_bit_identical"] and 0.0 <= summary["eval_accuracy"] <= 1.0
    assert summary["checkpoint_bytes"] < summary["full_checkpoint_bytes"]
    loaded = oelm.load_oelm(tmp_path / "oelm")  # base rebuilt from the recorded source (packaged MiniLM)
    assert loaded.oelm_config.method == "oelm_freeze"


# ---------------------------------------------------------------------------------------------
# Activation (gradient) checkpointing
# ---------------------------------------------------------------------------------------------


def tiny_bert():
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                     max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(cfg)


def tiny_gpt():
    torch.manual_seed(0)
    return build_gpt("gpt-tiny", "sequence_classification", vocab_size=100, num_layers=2, hidden_size=64,
                     intermediate_size=128, context_length=32)


def grads_and_calls(model, enable: str | None, attn_module):
    """Gradients of one loss (dict name -> grad or None) and how often ``attn_module`` ran forward."""
    calls = []
    handle = attn_module.register_forward_hook(lambda *_: calls.append(1))
    if enable is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # gradient_checkpointing_enable: deprecated alias in transformers 5
            getattr(model, enable)(**{f"{enable.split('_')[0]}_checkpointing_kwargs": {"use_reentrant": False}})
    model.train()
    model.zero_grad(set_to_none=True)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 100, (4, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0
    model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1, 1, 0])).loss.backward()
    handle.remove()
    return {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}, len(calls)


@pytest.mark.parametrize("kind", ["bert", "gpt"])
@pytest.mark.parametrize("enable", ["activation_checkpointing_enable", "gradient_checkpointing_enable"])
@pytest.mark.parametrize("freeze_embeddings", [False, True])
def test_checkpointing_gives_the_same_gradients_and_none_for_frozen_qk(kind, enable, freeze_embeddings):
    build = tiny_bert if kind == "bert" else tiny_gpt

    def prepared():
        model = build()
        apply_oelm(model, "oelm_freeze")
        if freeze_embeddings:  # then no input of the first checkpointed block requires grad
            embeddings = [model.bert.embeddings] if kind == "bert" else [model.transformer.wte, model.transformer.wpe]
            for p in (p for m in embeddings for p in m.parameters()):
                p.requires_grad_(False)
        attn = model.bert.encoder.layer[0].attention.self if kind == "bert" else model.transformer.h[0].attn
        return model, attn

    model, attn = prepared()
    if not hasattr(model, enable):  # older transformers (5.17 was seen) have only gradient_checkpointing_enable
        pytest.skip(f"this transformers ({transformers.__version__}) has no {type(model).__name__}.{enable}")
    ref, ref_calls = grads_and_calls(model, None, attn)
    model, attn = prepared()
    got, calls = grads_and_calls(model, enable, attn)

    assert ref_calls == 1 and calls == 2  # with checkpointing the block ran again in the backward pass
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    qk = {n for n in frozen if any(s in n for s in (".query.", ".key.", ".q_proj.", ".k_proj."))}
    assert len(qk) == 8  # 2 layers x (Q, K) x (weight, bias)
    for n in frozen:
        assert got[n] is None and ref[n] is None, f"frozen {n} got a gradient"
    for n, p in model.named_parameters():
        if p.requires_grad:
            assert got[n] is not None, f"{n} got no gradient with checkpointing"
            torch.testing.assert_close(got[n], ref[n], rtol=0, atol=1e-6, msg=lambda m: f"{n}: {m}")


def test_load_pretrained_prints_no_weight_loading_bar_and_keeps_the_bar_setting(capfd, minilm_tokenizer):
    """transformers' "Loading weights" bar is off while oelm loads a checkpoint (one line per run in
    every log, with training.progress_bar false too); the caller's progress-bar setting is restored."""
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled()
    capfd.readouterr()
    load_pretrained(MINILM, "sequence_classification", num_labels=2, tokenizer=minilm_tokenizer)
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()
