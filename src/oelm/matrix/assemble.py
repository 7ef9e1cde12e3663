"""Assemble one run's model: seeded, built from the config (:func:`oelm.matrix.model.build_model`),
started from ``init_from`` weights (pretrain -> fine-tune: the pretraining matrix's run of the
same method and seed, checked against its recorded sha256 and tokenizer), then the method
applied (:func:`oelm.apply_oelm`). What :mod:`oelm.matrix.run_one` trains.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from oelm.config import ExperimentConfig, MethodEntry
from oelm.errors import ConfigError
from oelm.io import safetensors_problem
from oelm.matrix.model import SKELETON_VOCAB, build_model, skeleton_model
from oelm.method.apply import apply_oelm
from oelm.method.temperature import TEMPERATURE_NAME
from oelm.records import MatrixFolder, RunFolder

if TYPE_CHECKING:
    from oelm.matrix.data import PreparedData

__all__ = ["build_run_model", "resolve_init_from", "check_init_tokenizer", "check_init_shapes", "load_init_weights"]


def resolve_init_from(config: ExperimentConfig, method: str, seed: int, *, verify: bool = True) -> Path | None:
    """The safetensors file a run of ``method`` / ``seed`` starts from (``config.init_from``).

    ``{method}`` and ``{seed}`` are substituted. A directory is an ``oelm run`` output folder:
    its finished *final* run of the same method and seed (at the learning rate selected there)
    provides ``checkpoint/model.safetensors``.

    The run's checkpoint is checked against the sha256 its ``result.json`` records (results
    written before oelm recorded one are used unchecked); ``verify=False`` only finds it (what a
    check that reads the file's header needs, without hashing every checkpoint twice).

    Raises:
        ConfigError: the file, or a finished final run of that method and seed, does not exist.
        ChecksumError: that run's ``checkpoint/model.safetensors`` is missing or corrupted
            (size or sha256 differs from its ``result.json``); names the file.
    """
    if not config.init_from:
        return None
    path = Path(config.init_from.replace("{method}", method).replace("{seed}", str(seed))).expanduser()
    if path.is_file():
        problem = safetensors_problem(path)  # a file written (or cut short) after the config was read
        if problem:
            raise ConfigError(f"init_from: the file {path} {problem}; give a model.safetensors or an `oelm run` output directory")
        return path
    pretraining = MatrixFolder(path)
    if path.is_dir() and pretraining.runs.is_dir():
        for run, r in pretraining.iter_results("restore it from a copy, or rerun `oelm run` with that --output-dir "
                                               "to train the run again"):
            if r.method == method and r.seed == seed and r.stage in (None, "final") and r.finished:
                if not verify and run.best_weights.is_file():
                    return run.best_weights
                ckpt = run.verify_weights(r, (
                    f"init_from cannot use it: delete {run.path} and rerun the pretraining config with "
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
    run = RunFolder(checkpoint.parent.parent)  # <run>/checkpoint/model.safetensors
    record = run.read_result() if checkpoint.parent.name == "checkpoint" else None
    recorded = record.tokenizer if record is not None else None
    if not recorded or not recorded.get("sha256"):
        return False
    if recorded["sha256"] == tokenizer.get("sha256"):
        return True
    saved = MatrixFolder(run.path.parent.parent).tokenizer  # <output_dir>/runs/<run>/checkpoint/model.safetensors
    fix = (f"set task.tokenizer: {saved} (the tokenizer that pretraining saved)" if saved.is_file()
           else "set task.tokenizer to the pretraining's tokenizer (the same spec and training text, or its tokenizer.json)")
    raise ConfigError(
        f"init_from {checkpoint}: pretrained with tokenizer {_describe_tokenizer(recorded)}, but this config's "
        f"task.tokenizer gives {_describe_tokenizer(tokenizer)}; the same token ids would be other tokens. Fix: {fix}"
    )


def _shape_mismatch(path: Path, name: str, there: tuple[int, ...], here: tuple[int, ...]) -> ConfigError:
    return ConfigError(
        f"init_from {path}: {name} has shape {there} there but {here} here; use the same tokenizer (task.tokenizer), "
        "context length (model.gpt_overrides.context_length) and model sizes (model.gpt / gpt_overrides) as the pretraining config"
    )


def check_init_shapes(config: ExperimentConfig) -> None:
    """Before any data: resolve every ``init_from`` checkpoint of the matrix (each method and seed,
    :func:`resolve_init_from`) and compare its tensor shapes, read from the safetensors header only,
    with the model's weightless skeleton (:func:`oelm.matrix.model.skeleton_model`). Tensors whose
    shape follows the tokenizer (the embedding and the LM head) wait for the data
    (:func:`load_init_weights` checks them when a run starts), as does the tokenizer itself
    (:func:`check_init_tokenizer`).

    Raises:
        ConfigError: a checkpoint is missing (the pretraining has no finished final run of that
            method and seed), a tensor has another shape, or no tensor name matches the model.
    """
    from safetensors import safe_open

    if not config.init_from:
        return
    paths = {resolve_init_from(config, m.name, seed, verify=False) for m in config.methods  # hashed when data is prepared
             for seed in config.seeds_of(m)}  # a swept method's seeds hold the sweep seeds
    skeleton = skeleton_model(config)
    if skeleton is None:
        return
    own = {name: tuple(t.shape) for name, t in skeleton.state_dict().items()}
    for path in sorted(p for p in paths if p is not None):
        if safetensors_problem(path):  # a damaged header: the sha256 check names the file when data is prepared
            continue
        with safe_open(str(path), framework="pt") as f:
            there = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
        if "transformer.wte.weight" not in there and "lm_head.weight" in there:
            there["transformer.wte.weight"] = there["lm_head.weight"]
        common = [n for n in own if n in there]
        if not common:
            raise ConfigError(f"init_from {path}: no tensor name matches the model; is it a checkpoint of the same architecture?")
        for name in common:
            if SKELETON_VOCAB not in own[name] and there[name] != own[name]:
                raise _shape_mismatch(path, name, there[name], own[name])


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
            raise _shape_mismatch(path, name, tuple(src.shape), tuple(tensor.shape))
        loaded.append(name)
    if not loaded:
        raise ConfigError(f"init_from {path}: no tensor name matches the model; is it a checkpoint of the same architecture?")
    with torch.no_grad():
        for name in loaded:
            own[name].copy_(state[name])
    return {"path": str(path), "loaded": len(loaded), "skipped": skipped}


def _load_head_temperatures(model: torch.nn.Module, path: Path) -> int:
    """Copy ``path``'s learned head temperatures (``*.head_temperature``, a pretraining run of
    ``oelm_temperature``) into the ones ``apply_oelm`` just gave ``model``; the number copied. A file
    without them leaves the method's start (the pretraining ran another method)."""
    from safetensors import safe_open

    params = {n: p for n, p in model.named_parameters() if n.endswith("." + TEMPERATURE_NAME)}
    with safe_open(str(path), framework="pt") as f, torch.no_grad():
        names = [n for n in params if n in set(f.keys())]
        for name in names:
            value = f.get_tensor(name)
            if value.shape != params[name].shape:
                raise _shape_mismatch(path, name, tuple(value.shape), tuple(params[name].shape))
            params[name].copy_(value)
    return len(names)


def build_run_model(config: ExperimentConfig, entry: MethodEntry, seed: int, data: "PreparedData"):
    """Seeded fresh model with the method applied (and ``init_from`` weights loaded first), then
    the method's LoRA adapter when it has one (``lora:``; the model is then a PEFT model).

    With ``init_from`` the pretrained query/key weights are kept as they are (``init: none``)
    and frozen as the method says: the pretraining run of the same method already gave them
    their orthogonal or random initialization; its learned head temperatures (``oelm_temperature``)
    are loaded once ``apply_oelm`` has made the parameters."""
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
    if init_path is not None and oelm_cfg.head_temperature is not None:  # made by apply_oelm: the pretraining's go in now
        init_info["loaded"] += _load_head_temperatures(model, init_path)
    if entry.lora is not None:  # PEFT is imported only for a method with a LoRA adapter (the peft extra)
        from oelm.integrations.peft import add_lora

        model, report = add_lora(model, entry.lora, report)
    return model, oelm_cfg, report, init_info
