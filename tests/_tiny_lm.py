"""Overrides that turn configs/tinystories-tiny.yaml into a seconds-long 2-seed baseline vs
OELM-Freeze matrix (a 2-layer, 32-wide GPT, BPE-512, dropout off) for the report tests."""

from __future__ import annotations


def tiny_lm_overrides(max_steps: int, eval_every: int) -> list[str]:
    """`oelm run` overrides for the tiny matrix; ``max_steps`` / ``eval_every`` in optimizer steps."""
    return [
        "task.train_samples=40", "task.validation_samples=12", "task.tokenizer=bpe-512", "task.block_size=32",
        f"training.max_steps={max_steps}", f"training.eval_every={eval_every}", "training.log_every=2",
        "training.timing_warmup_steps=2", "training.progress_bar=false", "training.tensorboard=false",
        "training.eval_at_start=true", "training.save_best_checkpoint=false",
        "model.gpt_overrides={dropout: 0.0, hidden_size: 32, num_layers: 2, num_heads: 2}",
        "methods=[{name: baseline, learning_rate: 3.0e-3}, {name: oelm_freeze, learning_rate: 3.0e-3}]", "seeds=[0,1]",
    ]
