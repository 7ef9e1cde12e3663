"""Build a fresh model from an experiment config: a pretrained checkpoint or oelm's GPT
(:func:`build_model`), and the checks made before any data is read (:func:`check_sequence_length`,
memory). A run's assembly (``init_from`` weights, the method) is :mod:`oelm.matrix.assemble`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from oelm.architectures import ARCHITECTURES, architecture_from_dict, register_architecture
from oelm.architectures.sites import find_attention_projections
from oelm.config import ExperimentConfig
from oelm.data.registry import get_dataset_spec
from oelm.errors import ConfigError, OELMError
from oelm.models.gpt import build_gpt
from oelm.models.pretrained import load_pretrained, resolve_pretrained

if TYPE_CHECKING:
    from oelm.matrix.data import PreparedData

__all__ = [
    "build_model", "check_sequence_length", "pretrained_max_positions", "skeleton_model", "skeleton_module_names",
    "MAX_GPT_CONTEXT", "SKELETON_VOCAB",
]

# An oelm GPT's context length defaults to task.max_length / block_size, and its position table
# (and attention) grow with it: cap it, so a typo such as max_length=100000000 is an error, not a
# 512 GB allocation. A config that sets model.gpt_overrides.context_length chooses its own limit.
MAX_GPT_CONTEXT = 65_536

# For a model type oelm has no architecture for (ArchitectureSpec.max_positions / padded_positions say it
# for the registered ones): config.json fields that hold a checkpoint's number of positions, most
# common first, and the RoBERTa-style types that number positions from padding_idx + 1 (so
# pad_token_id + 1 of them are unusable).
_POSITION_FIELDS = ("max_position_embeddings", "n_positions", "max_seq_len", "max_sequence_length", "seq_length", "n_ctx")
_PADDING_OFFSET_TYPES = {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "longformer", "data2vec-text", "mpnet", "ibert"}


def _pretrained_config(name: str, trust_remote_code: bool):
    """The transformers config of pretrained checkpoint ``name`` (its config.json only, no weights),
    or None when it cannot be read here: the model loader names the problem when a run starts."""
    from transformers import AutoConfig  # kept out of `import oelm`

    try:
        return AutoConfig.from_pretrained(resolve_pretrained(name), trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return None


def pretrained_max_positions(name: str, *, trust_remote_code: bool = False) -> tuple[int, str] | None:
    """The longest input (tokens) of pretrained checkpoint ``name`` and the config.json field it
    comes from, read from its config only (no weights): the field its registered architecture
    names (:attr:`oelm.ArchitectureSpec.max_positions`, less ``pad_token_id + 1`` when
    ``padded_positions``), else the common fields. None when the config cannot be read or has no
    such field (relative positions, e.g. T5): the model loader reports a missing checkpoint."""
    hf_config = _pretrained_config(name, trust_remote_code)
    if hf_config is None:
        return None
    model_type = getattr(hf_config, "model_type", None)
    spec = ARCHITECTURES.get(model_type)
    fields = _POSITION_FIELDS if spec is None or not isinstance(spec.max_positions, str) else (spec.max_positions, *_POSITION_FIELDS)
    padded = spec.padded_positions if spec is not None else model_type in _PADDING_OFFSET_TYPES
    for field in dict.fromkeys(fields):
        value = getattr(hf_config, field, None)
        if isinstance(value, int) and value > 0:
            if padded:
                value -= (getattr(hf_config, "pad_token_id", None) or 0) + 1
            return value, field
    return None


def check_sequence_length(config: ExperimentConfig) -> None:
    """Refuse a ``task.max_length`` (classification) or ``task.block_size`` (language modelling)
    longer than the model takes, before any data is read or model built.

    Limits: a pretrained checkpoint's positions (:func:`pretrained_max_positions`); an oelm GPT's
    ``model.gpt_overrides.context_length`` when set, else :data:`MAX_GPT_CONTEXT`.

    Raises:
        ConfigError: naming the key, its value, the limit and where the limit comes from.
    """
    lm = get_dataset_spec(config.task.dataset).task_type == "language_modeling"
    key, length = ("task.block_size", config.task.block_size) if lm else ("task.max_length", config.task.max_length)
    if config.model.gpt is not None:
        context = config.model.gpt_overrides.get("context_length")
        if context is not None:
            limit, source = int(context), "model.gpt_overrides.context_length"
            fix = f"lower {key} to at most {limit} or raise model.gpt_overrides.context_length"
        else:
            limit, source = MAX_GPT_CONTEXT, "oelm's cap on a GPT's context length"
            fix = f"lower {key} to at most {limit:,}"
    else:
        found = pretrained_max_positions(config.model.pretrained, trust_remote_code=config.model.trust_remote_code)
        if found is None:
            return
        limit, field = found
        source = f"{field} in the config.json of {config.model.pretrained}"
        fix = f"lower {key} to at most {limit}"
    if length > limit:
        raise ConfigError(f"{key}={length} is longer than the model takes ({limit:,} tokens, {source}); {fix}")


#: The vocabulary size a skeleton gets when the tokenizer is not known yet (before any data): a
#: prime no model dimension equals, so the tensors whose shape follows the vocabulary show it.
SKELETON_VOCAB = 65_521


def skeleton_model(config: ExperimentConfig):
    """The model ``config`` builds, as a weightless skeleton (``accelerate``'s ``init_empty_weights``:
    no memory, no data, no RNG draw), so names and shapes in a config can be checked before any data
    is prepared. An oelm GPT whose vocabulary follows the tokenizer gets :data:`SKELETON_VOCAB` ids
    and the context length :func:`build_model` gives it. None when it cannot be built here (an
    unreadable or missing checkpoint: the model loader reports that when the run starts)."""
    from accelerate import init_empty_weights  # with transformers below: kept out of `import oelm`

    spec = get_dataset_spec(config.task.dataset)
    lm = spec.task_type == "language_modeling"
    hf_task = "causal_lm" if lm else "sequence_classification"
    labels = {} if lm or not spec.label_names else {"num_labels": len(spec.label_names)}  # else the data says
    try:
        with torch.random.fork_rng(devices=[]), init_empty_weights():
            if config.model.pretrained:
                from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

                if config.model.architecture:
                    register_architecture(architecture_from_dict(config.model.architecture, source="model.architecture"))
                hf_config = _pretrained_config(config.model.pretrained, config.model.trust_remote_code)
                if hf_config is None:
                    return None
                if labels:
                    hf_config.num_labels = labels["num_labels"]
                auto = AutoModelForCausalLM if lm else AutoModelForSequenceClassification
                return auto.from_config(hf_config, trust_remote_code=config.model.trust_remote_code)
            overrides = labels | {"vocab_size": SKELETON_VOCAB,
                         "context_length": max(config.task.block_size if lm else config.task.max_length, 1)}
            return build_gpt(config.model.gpt, hf_task, **(overrides | dict(config.model.gpt_overrides)))
    except (OSError, ValueError, TypeError):
        return None


def skeleton_module_names(config: ExperimentConfig) -> list[str] | None:
    """Every module name of the model ``config`` builds (:func:`skeleton_model`). A fused
    query/key/value module appears with the ``.query`` / ``.key`` / ``.value`` children oelm's
    split gives it (:class:`oelm.architectures.fused.SplitQKV`), as every method sees it after ``apply_oelm``.
    None when the skeleton cannot be built here."""
    model = skeleton_model(config)
    if model is None:
        return None
    names = [name for name, _ in model.named_modules() if name]
    try:
        fused = [s.fused_name or s.query_name for s in find_attention_projections(model) if s.fused]
    except OELMError:  # a model OELM cannot treat: apply_oelm says so when the run starts
        fused = []
    return names + [f"{name}.{part}" for name in fused for part in ("query", "key", "value")]


def build_model(config: ExperimentConfig, data: "PreparedData | None", *, task_type: str | None = None, num_labels: int | None = None):
    """A fresh model for one run (call after seeding). Returns ``(model, tokenizer)``."""
    task_type = task_type or (data.task_type if data else "classification")
    num_labels = num_labels if num_labels is not None else (data.num_labels if data else 2)
    hf_task = "sequence_classification" if task_type == "classification" else "causal_lm"
    if config.model.architecture:  # a user-declared registry entry (oelm.architecture_from_dict)
        register_architecture(architecture_from_dict(config.model.architecture, source="model.architecture"))
    if config.model.pretrained:
        return load_pretrained(
            config.model.pretrained,
            hf_task,
            num_labels=num_labels,
            trust_remote_code=config.model.trust_remote_code,
            tokenizer=data.tokenizer if data else None,
        )
    tokenizer = data.tokenizer if data else None
    overrides = dict(config.model.gpt_overrides)
    if tokenizer is not None:
        if overrides.get("vocab_size", len(tokenizer)) < len(tokenizer):  # ids past the embedding: IndexError mid-run
            raise ConfigError(
                f"model.gpt_overrides.vocab_size={overrides['vocab_size']} is smaller than the tokenizer "
                f"({len(tokenizer):,} ids, task.tokenizer={config.task.tokenizer or 'gpt2'!r}); remove vocab_size (it then "
                "follows the tokenizer) or set it to at least the tokenizer's size"
            )
        overrides.setdefault("vocab_size", len(tokenizer))
        overrides.setdefault("pad_token_id", tokenizer.pad_token_id)
    needed = config.task.block_size if task_type == "language_modeling" else config.task.max_length
    overrides.setdefault("context_length", max(needed, 1))
    if hf_task == "sequence_classification":
        overrides.setdefault("num_labels", num_labels)
    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):  # shapes only: no memory, no RNG draw
            shape_only = build_gpt(config.model.gpt, hf_task, **overrides)
        _check_fits_in_memory(sum(p.numel() for p in shape_only.parameters()), f"model.gpt {config.model.gpt!r} with "
                              f"gpt_overrides {config.model.gpt_overrides}")
        model = build_gpt(config.model.gpt, hf_task, **overrides)
    except TypeError as exc:
        raise ConfigError(f"model.gpt_overrides: {exc}") from None
    return model, tokenizer


def _check_fits_in_memory(parameters: int, what: str) -> None:
    """Refuse a model whose training cannot fit: at least 16 bytes per parameter (fp32 weights,
    gradients and AdamW's two moments) against this machine's GPU memory (CUDA) or RAM.

    Raises:
        ConfigError: naming the model, its parameter count, the bytes needed and those available.
    """
    if torch.cuda.is_available():
        available, where = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory, "GPU memory"
    else:
        try:
            available, where = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "RAM"
        except (ValueError, OSError, AttributeError):  # not available on this platform: no check
            return
    needed = 16 * parameters
    if needed > available:
        raise ConfigError(
            f"{what} has {parameters:,} parameters: training needs at least {needed / 1e9:,.1f} GB (16 bytes per parameter: "
            f"fp32 weights, gradients, AdamW moments) but this machine has {available / 1e9:,.1f} GB of {where}; lower "
            "hidden_size / num_layers / intermediate_size / vocab_size"
        )
