"""Models trained with OELM: a small GPT (decoder-only transformer) with separate q/k/v/o projections."""

from oelm.models.gpt import (
    MLP,
    PRESETS,
    TASKS,
    Block,
    CausalSelfAttention,
    GPTConfig,
    GPTForCausalLM,
    GPTForSequenceClassification,
    GPTModel,
    build_gpt,
    gpt_config,
)

__all__ = [
    "GPTConfig",
    "PRESETS",
    "gpt_config",
    "CausalSelfAttention",
    "MLP",
    "Block",
    "GPTModel",
    "GPTForCausalLM",
    "GPTForSequenceClassification",
    "build_gpt",
    "TASKS",
]
