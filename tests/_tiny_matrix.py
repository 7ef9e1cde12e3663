"""A tiny real matrix shared by the matrix and executor tests: gpt-tiny causal classification on
real SST-2 sentences, baseline swept over two learning rates, OELM-Freeze and OELM-Random at one
rate each, one seed: 4 trained runs, then the selected sweep run promoted (test split once)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

TINY_GPT = "{gpt: gpt-tiny, gpt_overrides: {hidden_size: 32, num_layers: 2, num_heads: 2, intermediate_size: 64, dropout: 0.0}}"

CONFIG = (
    "name: tiny-matrix\n"
    "task: {dataset: sst2, test_split: test, tokenizer: bpe-512, train_samples: 48, validation_samples: 32, max_length: 32}\n"
    f"model: {TINY_GPT}\n"
    "methods: [{name: baseline, learning_rates: [1.0e-4, 3.0e-3]}, {name: oelm_freeze, learning_rate: 2.0e-3},\n"
    "          {name: oelm_random, learning_rate: 2.0e-3}]\n"
    "seeds: [0]\n"
    "training: {max_steps: 4, batch_size: 16, eval_every: 2, log_every: 2, timing_warmup_steps: 1, progress_bar: false,\n"
    "           tensorboard: false}\n"
)

#: One 2-step gpt-tiny baseline run on real SST-2 sentences: a real run folder to damage or plant links in.
ONE_RUN = (
    "name: one\n"
    "task: {dataset: sst2, tokenizer: bpe-512, train_samples: 32, validation_samples: 16, max_length: 32}\n"
    "model: {gpt: gpt-tiny, gpt_overrides: {hidden_size: 32, num_layers: 2, num_heads: 2, intermediate_size: 64}}\n"
    "methods: [{name: baseline, learning_rate: 1.0e-3}]\n"
    "seeds: [0]\n"
    "training: {max_steps: 2, batch_size: 16, eval_every: 2, log_every: 1, progress_bar: false, tensorboard: false}\n"
)


def write_config(folder: Path, text: str = CONFIG) -> Path:
    path = Path(folder) / "matrix.yaml"
    path.write_text(text)
    return path


def numbers(out: Path) -> dict[str, tuple]:
    """Per run folder: stage, performance, the metrics log without its clock fields, and the sha256 of
    the best weights: everything training computed, nothing that depends on when or where it ran."""
    found = {}
    for p in sorted(Path(out).glob("runs/*/result.json")):
        r = json.loads(p.read_text())
        log = [{k: v for k, v in json.loads(line).items() if "seconds" not in k and k not in ("step_ms", "tokens_per_second",
                                                                                                "samples_per_second")}
               for line in (p.parent / "metrics.jsonl").read_text().splitlines()]
        weights = p.parent / "checkpoint" / "model.safetensors"
        found[p.parent.name] = (r["stage"], r["performance"], log, hashlib.sha256(weights.read_bytes()).hexdigest())
    return found
