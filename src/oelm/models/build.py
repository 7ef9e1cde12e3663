"""Build the model of one run: a pretrained checkpoint or oelm's GPT, optional ``init_from``
weights (pretrain -> fine-tune), then the method (:func:`oelm.apply_oelm`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from oelm.config import ExperimentConfig, MethodEntry
from oelm.errors import ConfigError
from oelm.method import apply_oelm
from oelm.io import read_json
from oelm.runs import run_results, verify_checkpoint

if TYPE_CHECKING:
    from oelm.data.prepare import PreparedData

__all__ = ["build_model", "build_run_model", "check_sequence_length", "pretrained_max_positions", "resolve_init_from",
           "load_init_weights", "MAX_GPT_CONTEXT"]

# An oelm GPT's context length defaults to task.max_length / block_size, and its position table
# (and attention) grow with it: cap it, so a typo such as max_length=100000000 is an error, not a
# 512 GB allocation. A config that sets model.gpt_overrides.context_length chooses its own limit.
MAX_GPT_CONTEXT = 65_536

# config.json fields that hold a checkpoint's number of positions, most common first.
_POSITION_FIELDS = ("max_position_embeddings", "n_positions", "max_seq_len", "max_sequence_length", "seq_length", "n_ctx")
# RoBERTa-style models number positions from padding_idx + 1, so pad_token_id + 1 of them are unusable.
_PADDING_OFFSET_TYPES = {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "longformer", "data2vec-text", "mpnet", "ibert"}


def pretrained_max_positions(name: str, *, trust_remote_code: bool = False) -> tuple[int, str] | None:
    """The longest input (tokens) of pretrained checkpoint ``name`` and the config.json field it
    comes from, read from its config only (no weights); None when the config cannot be read or
    has no such field (relative positions, e.g. T5): the model loader reports a missing checkpoint."""
    from transformers import AutoConfig

    from oelm.models.pretrained import resolve_pretrained

    try:
        hf_config = AutoConfig.from_pretrained(resolve_pretrained(name), trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return None
    for field in _POSITION_FIELDS:
        value = getattr(hf_config, field, None)
        if isinstance(value, int) and value > 0:
            if getattr(hf_config, "model_type", None) in _PADDING_OFFSET_TYPES:
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
    from oelm.data import get_dataset_spec

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


def build_model(config: ExperimentConfig, data: "PreparedData | None", *, task_type: str | None = None, num_labels: int | None = None):
    """A fresh model for one run (call after seeding). Returns ``(model, tokenizer)``."""
    task_type = task_type or (data.task_type if data else "classification")
    num_labels = num_labels if num_labels is not None else (data.num_labels if data else 2)
    hf_task = "sequence_classification" if task_type == "classification" else "causal_lm"
    if config.model.architecture:  # a user-declared registry entry (oelm.architecture_from_dict)
        from oelm.architectures import architecture_from_dict, register_architecture

        register_architecture(architecture_from_dict(config.model.architecture, source="model.architecture"))
    if config.model.pretrained:
        from oelm.models.pretrained import load_pretrained

        return load_pretrained(
            config.model.pretrained,
            hf_task,
            num_labels=num_labels,
            trust_remote_code=config.model.trust_remote_code,
            tokenizer=data.tokenizer if data else None,
        )
    from oelm.models.gpt import build_gpt

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



def resolve_init_from(config: ExperimentConfig, method: str, seed: int) -> Path | None:
    """The safetensors file a run of ``method`` / ``seed`` starts from (``config.init_from``).

    ``{method}`` and ``{seed}`` are substituted. A directory is an ``oelm run`` output folder:
    its finished *final* run of the same method and seed (at the learning rate selected there)
    provides ``checkpoint/model.safetensors``.

    The run's checkpoint is checked against the sha256 its ``result.json`` records (results
    written before oelm recorded one are used unchecked).

    Raises:
        ConfigError: the file, or a finished final run of that method and seed, does not exist.
        ChecksumError: that run's ``checkpoint/model.safetensors`` is missing or corrupted
            (size or sha256 differs from its ``result.json``); names the file.
    """
    if not config.init_from:
        return None
    path = Path(config.init_from.replace("{method}", method).replace("{seed}", str(seed))).expanduser()
    if path.is_file():
        from oelm.config import safetensors_problem

        problem = safetensors_problem(path)  # a file written (or cut short) after the config was read
        if problem:
            raise ConfigError(f"init_from: the file {path} {problem}; give a model.safetensors or an `oelm run` output directory")
        return path
    if path.is_dir() and (path / "runs").is_dir():
        for run_dir, r in run_results(path):
            if r.get("method") == method and r.get("seed") == seed and r.get("stage", "final") == "final" and r.get("status") == "finished":
                ckpt = verify_checkpoint(run_dir, r, (
                    f"init_from cannot use it: delete {run_dir} and rerun the pretraining config with "
                    f"--output-dir {path} to train that run again"))
                if ckpt.is_file():
                    return ckpt
        raise ConfigError(
            f"init_from: {path} has no finished final run of method {method!r} with seed {seed} and a "
            "checkpoint/model.safetensors; run the pretraining config first (same methods and seeds)"
        )
    raise ConfigError(f"init_from: {path} is neither a safetensors file nor an `oelm run` output directory")


def _describe_tokenizer(record: dict[str, Any]) -> str:
    return f"{record.get('spec')!r} ({record.get('vocab_size', 0):,} ids, sha256 {str(record.get('sha256'))[:12]})"


def check_init_tokenizer(checkpoint: Path, tokenizer: dict[str, Any]) -> bool:
    """Refuse an ``init_from`` checkpoint whose pretraining used another tokenizer than this
    run's ``tokenizer`` (a :func:`oelm.data.lm.tokenizer_record`).

    Two tokenizers with the same vocabulary size (two ``bpe-4096`` trained on different text)
    give the same shapes, so :func:`load_init_weights` cannot see it, but every embedding row
    would then belong to another token. The pretraining's record is read from the
    ``result.json`` of the run that saved ``checkpoint`` (``<run>/checkpoint/model.safetensors``).

    Returns:
        True when the tokenizers match; False when there is nothing to compare with (a
        safetensors file outside an ``oelm run`` folder, or a result written before oelm
        recorded its tokenizer): the caller says it could not check.

    Raises:
        ConfigError: the tokenizers differ (sha256); names both and the file to use instead.
    """
    result = checkpoint.parent.parent / "result.json"
    recorded = read_json(result).get("tokenizer") if checkpoint.parent.name == "checkpoint" and result.is_file() else None
    if not recorded or not recorded.get("sha256"):
        return False
    if recorded["sha256"] == tokenizer.get("sha256"):
        return True
    saved = checkpoint.parents[3] / "tokenizer.json"  # <output_dir>/runs/<run>/checkpoint/model.safetensors
    fix = (f"set task.tokenizer: {saved} (the tokenizer that pretraining saved)" if saved.is_file()
           else "set task.tokenizer to the pretraining's tokenizer (the same spec and training text, or its tokenizer.json)")
    raise ConfigError(
        f"init_from {checkpoint}: pretrained with tokenizer {_describe_tokenizer(recorded)}, but this config's "
        f"task.tokenizer gives {_describe_tokenizer(tokenizer)}; the same token ids would be other tokens. Fix: {fix}"
    )


def load_init_weights(model: torch.nn.Module, path: Path) -> dict[str, Any]:
    """Copy every tensor of ``path`` (safetensors) whose name and shape match into ``model``.

    A language model's tied ``lm_head.weight`` stands in for ``transformer.wte.weight`` when
    only one of them was saved. Task heads that the file lacks (e.g. a classifier's ``score``)
    keep their fresh initialization.

    Returns:
        ``{"path", "loaded", "skipped"}``: tensor names copied and names left at their init.

    Raises:
        ConfigError: a tensor has a different shape (another vocabulary or context length), or
            nothing in the file matches the model.
    """
    from safetensors.torch import load_file

    state = load_file(str(path))
    if "transformer.wte.weight" not in state and "lm_head.weight" in state:
        state["transformer.wte.weight"] = state["lm_head.weight"]
    own = model.state_dict()
    loaded, skipped = [], []
    for name, tensor in own.items():
        src = state.get(name)
        if src is None:
            skipped.append(name)
            continue
        if src.shape != tensor.shape:
            raise ConfigError(
                f"init_from {path}: {name} has shape {tuple(src.shape)} there but {tuple(tensor.shape)} here; "
                "use the same tokenizer (task.tokenizer) and context length (model.gpt_overrides.context_length) "
                "as the pretraining config"
            )
        loaded.append(name)
    if not loaded:
        raise ConfigError(f"init_from {path}: no tensor name matches the model; is it a checkpoint of the same architecture?")
    with torch.no_grad():
        for name in loaded:
            own[name].copy_(state[name])
    return {"path": str(path), "loaded": len(loaded), "skipped": skipped}


def build_run_model(config: ExperimentConfig, entry: MethodEntry, seed: int, data: "PreparedData"):
    """Seeded fresh model with the method applied (and ``init_from`` weights loaded first), then
    the method's LoRA adapter when it has one (``lora:``; the model is then a PEFT model).

    With ``init_from`` the pretrained query/key weights are kept as they are (``init: none``)
    and frozen as the method says: the pretraining run of the same method already gave them
    their orthogonal or random initialization."""
    from accelerate.utils import set_seed

    set_seed(seed)
    model, _ = build_model(config, data)
    oelm_cfg = entry.oelm_config()
    init_info = None
    init_path = resolve_init_from(config, entry.name, seed)
    if init_path is not None:
        init_info = load_init_weights(model, init_path)
        oelm_cfg = oelm_cfg.replace(init="none")
    report = apply_oelm(model, oelm_cfg, seed=seed)
    if entry.lora is not None:  # PEFT is imported only for a method with a LoRA adapter (the peft extra)
        from oelm.peft import add_lora

        model, report = add_lora(model, entry.lora, report)
    return model, oelm_cfg, report, init_info

