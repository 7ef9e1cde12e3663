"""The OELM recipe that travels with a model's Hugging Face checkpoints.

``apply_oelm`` gives the model (this instance only) a ``save_pretrained`` that writes the stock
layout: fused Q/K/V modules that ``apply_oelm`` split are fused again on a *copy* of the state dict
(:func:`oelm.architectures.fused.fuse_state_dict`; the live model keeps its split modules and its optimizer's
parameters), so a stock ``from_pretrained`` loads every tensor. The checkpoint's ``config.json``
carries the recipe under the key ``"oelm"`` (:func:`recipe_of`)::

    {"format": "oelm-recipe", "format_version": 1, "method": "oelm_freeze",
     "oelm_config": {...OELMConfig.to_dict()...},
     "frozen": {"transformer.h.0.attn.c_attn.query.weight": {"dtype": "torch.float32", "shape": [32, 32], "sha256": "..."}, ...},
     "split": {"transformer.h.0.attn.c_attn": {"layout": "qkv_conv1d", "num_heads": 4, "num_kv_heads": 4, "head_dim": 8}, ...},
     "applied_to": "GPT2LMHeadModel",
     "versions": {"torch": "2.13.0+cpu", "oelm": "0.1.0"}}

Names in ``frozen`` and ``split`` are relative to the module ``apply_oelm`` ran on, whose class is
``applied_to``. When that is a transformers *base model* (``model.base_model is model``: BertModel,
GPT2Model, the part a task model such as BertForSequenceClassification holds as ``model.bert``),
the recipe also stays on its ``config`` from ``apply_oelm`` on (:func:`keep_recipe_on_config`):
the holder shares that config object, and the holder's own ``save_pretrained`` (transformers',
which runs no oelm code: PyTorch modules do not know their parents) writes it into ``config.json``.
``oelm.load_oelm`` then finds the treated module in the holder by that class (:mod:`oelm.method.marks`).

Hugging Face ``Trainer`` calls ``model.save_pretrained`` for every checkpoint, so checkpoints
every N steps work on split models, and ``resume_from_checkpoint`` (``model.load_state_dict``)
loads them back: each :class:`~oelm.architectures.fused.SplitQKV` splits the fused keys again, and the
model's load hook (:func:`before_load_state_dict`) first renames what transformers renamed on the
way out (GPT-NeoX's ``lm_head`` is written as ``embed_out``) and checks that no frozen tensor would
change, so a checkpoint of another method, seed or base is refused before anything is loaded.
``oelm.load_oelm(checkpoint_dir)`` rebuilds an OELM model from such a checkpoint and checks its
frozen tensors against the recipe's sha256.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import torch
from torch import nn

from oelm.architectures.fused import SplitQKV, fuse_entries, fuse_state_dict, split_fused_entries
from oelm.architectures.spec import ARCHITECTURE_ATTRIBUTE, architecture_to_dict
from oelm.errors import CheckpointMismatchError
from oelm.method.temperature import fold_saved_temperatures, unfold_saved_temperatures

__all__ = [
    "RECIPE_KEY",
    "RECIPE_FORMAT",
    "RECIPE_VERSION",
    "CHECKPOINT_ATTRIBUTES",
    "tensor_sha256",
    "frozen_record",
    "recipe_of",
    "save_pretrained_with_recipe",
    "before_load_state_dict",
    "attach_checkpoint_hooks",
    "detach_checkpoint_hooks",
    "keep_recipe_on_config",
    "stock_layout_when_held",
    "own_layout",
]

RECIPE_KEY = "oelm"  # the config.json key (and config attribute while saving)
RECIPE_FORMAT = "oelm-recipe"
RECIPE_VERSION = 1
#: The instance attributes :func:`attach_checkpoint_hooks` sets: oelm's ``save_pretrained`` and
#: the handles of the load hook and of the state-dict hook.
CHECKPOINT_ATTRIBUTES = ("save_pretrained", "oelm_load_hook", "oelm_state_dict_hook")


def tensor_sha256(tensor: torch.Tensor) -> str:
    """sha256 (hex) of the raw bytes of ``tensor`` as a contiguous CPU tensor (any dtype, any shape).

    Only the bytes are hashed; compare dtype and shape separately (the records store both).
    """
    t = tensor.detach().cpu().contiguous().reshape(-1)
    return hashlib.sha256(t.view(torch.uint8).numpy()).hexdigest()


def frozen_record(model: nn.Module) -> dict[str, dict[str, Any]]:
    """``{name: {"dtype", "shape", "sha256"}}`` of every frozen parameter (``requires_grad=False``;
    a tied one once, under the name ``named_parameters()`` gives it)."""
    return {
        n: {"dtype": str(p.dtype), "shape": list(p.shape), "sha256": tensor_sha256(p)}
        for n, p in model.named_parameters()
        if not p.requires_grad
    }


def _oelm_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("oelm")
    except PackageNotFoundError:  # a source tree on PYTHONPATH without an install
        return None


def recipe_of(model: nn.Module) -> dict[str, Any]:
    """The recipe of a model that went through ``apply_oelm`` (the module docstring shows it):
    the method's config, the sha256 of every frozen tensor, the split fused modules, the class
    ``apply_oelm`` ran on (``applied_to``), and the architecture spec when ``apply_oelm`` got
    ``target_modules``.

    Raises:
        AttributeError: ``model`` has no ``oelm_config``.
    """
    config = model.oelm_config
    split = {
        name: {"layout": m.layout, "num_heads": m.num_heads, "num_kv_heads": m.num_kv_heads, "head_dim": m.head_dim}
        for name, m in model.named_modules()
        if isinstance(m, SplitQKV)
    }
    recipe = {
        "format": RECIPE_FORMAT,
        "format_version": RECIPE_VERSION,
        "method": config.method,
        "oelm_config": config.to_dict(),
        "frozen": frozen_record(model),
        "split": split,
        "applied_to": type(model).__name__,
        "versions": {"torch": torch.__version__, "oelm": _oelm_version()},
    }
    own = vars(model).get(ARCHITECTURE_ATTRIBUTE)
    if own is not None:  # the projections were named with target_modules: the loader needs the names
        recipe["architecture"] = architecture_to_dict(own)
    return recipe


_MISSING = object()


def save_pretrained_with_recipe(model: nn.Module, save_directory: Any, is_main_process: bool = True,
                                state_dict: dict[str, torch.Tensor] | None = None, **kwargs: Any) -> Any:
    """``model.save_pretrained`` of a model that went through ``apply_oelm`` (bound with
    :func:`functools.partial`): the class's own ``save_pretrained`` with the state dict in the
    stock layout (:func:`~oelm.architectures.fused.fuse_state_dict` of ``state_dict`` or of the model's own;
    a learned head temperature folded into its query entries, the exact ones beside them:
    :func:`~oelm.method.temperature.fold_saved_temperatures`) and the recipe in ``config.json`` under
    ``"oelm"``. The model is not changed: its split modules,
    parameters and config are as before (the recipe is on ``model.config`` only while saving).
    Every other argument goes to the class's method as given (``safe_serialization``,
    ``max_shard_size``, ``push_to_hub`` ...).
    """
    state = dict(model.state_dict() if state_dict is None else state_dict)
    fold_saved_temperatures(model, state)  # a stock from_pretrained computes the tempered logits
    fused = fuse_state_dict(model, state)
    config = getattr(model, "config", None)
    previous = getattr(config, RECIPE_KEY, _MISSING)
    if config is not None and is_main_process:
        setattr(config, RECIPE_KEY, recipe_of(model))
    try:
        return type(model).save_pretrained(model, save_directory, is_main_process=is_main_process, state_dict=fused, **kwargs)
    finally:
        if config is not None and is_main_process:
            if previous is _MISSING:
                delattr(config, RECIPE_KEY)
            else:
                setattr(config, RECIPE_KEY, previous)


def _changed_frozen(model: nn.Module, state_dict: dict[str, Any], prefix: str, frozen: tuple[str, ...]) -> list[str]:
    """Names in ``frozen`` whose entry in ``state_dict`` (split from a fused one where the model
    has a :class:`SplitQKV`) differs from the value the parameter holds: shape, or any element."""
    incoming: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if isinstance(module, SplitQKV):
            try:
                incoming.update(split_fused_entries(module, state_dict, f"{prefix}{name}." if name else prefix))
            except ValueError:
                pass  # the SplitQKV's own hook reports it as torch reports a size mismatch
    changed = []
    params = dict(model.named_parameters())
    for name in frozen:
        key, p = prefix + name, params.get(name)
        value = state_dict[key] if key in state_dict else incoming.get(key)
        if p is None or value is None:
            continue
        if value.shape != p.shape or not torch.equal(value.to(device=p.device, dtype=p.dtype), p.detach()):
            changed.append(name)
    return changed


def _legacy_names(model: nn.Module) -> dict[str, str]:
    """``{name on disk: name in the model}`` for the renamings transformers' ``save_pretrained``
    applies when it writes the original format (its reverse weight conversion: GPT-NeoX's
    ``lm_head.weight`` is written as ``embed_out.weight``). ``{}`` with a transformers without it."""
    try:
        from transformers.core_model_loading import revert_weight_conversion  # transformers >= 5
    except ImportError:
        return {}
    state = model.state_dict()  # one detached tensor object per name, tied names included
    names = {id(t): n for n, t in state.items()}
    try:
        reverted = revert_weight_conversion(model, dict(state))
    except Exception:  # noqa: BLE001 - a conversion that needs more than names; keep the names as they are
        return {}
    return {disk: names[id(t)] for disk, t in reverted.items() if id(t) in names and names[id(t)] != disk}


def before_load_state_dict(model: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: dict, strict: bool,
                           missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str], *,
                           frozen: tuple[str, ...] = ()) -> None:
    """``load_state_dict`` pre-hook of an OELM model (torch's signature; ``frozen``, bound by
    :func:`attach_checkpoint_hooks`: the parameters frozen when ``apply_oelm`` finished), run
    before any tensor of the model is loaded. Names that transformers' ``save_pretrained`` renamed
    on the way out are renamed back (a plain ``load_state_dict``, as ``Trainer``'s
    ``resume_from_checkpoint`` calls, would miss GPT-NeoX's ``lm_head`` otherwise); then a state
    dict that would change a frozen tensor is refused. (Each :class:`~oelm.architectures.fused.SplitQKV` splits
    the fused keys in its own hook.) The frozen set is the one of ``apply_oelm``, not the
    ``requires_grad`` flags of the moment: PEFT's inference mode, say, turns every flag off.

    Raises:
        CheckpointMismatchError: names the first frozen tensor that would change and the likely causes.
    """
    unfold_saved_temperatures(state_dict, prefix)  # the exact query entries beside the folded stock ones
    for disk, name in _legacy_names(model).items():
        if prefix + disk in state_dict and prefix + name not in state_dict:
            state_dict[prefix + name] = state_dict.pop(prefix + disk)
    changed = _changed_frozen(model, state_dict, prefix, frozen)
    if not changed:
        return
    config = getattr(model, "oelm_config", None)
    method = f"{config.method!r} (seed {config.seed})" if config is not None else "OELM"
    raise CheckpointMismatchError(
        f"load_state_dict would change the frozen tensor {changed[0]!r} of this {method} model ({len(changed)} frozen "
        "tensors differ): the checkpoint was trained with another method, seed or base model. Fix: apply the method and "
        "seed of the checkpoint's config.json 'oelm' entry to a fresh base model, or load it with "
        "oelm.load_oelm(checkpoint_dir); nothing was loaded",
        tensor=changed[0],
        mismatched=changed,
    )


def stock_layout_when_held(model: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: dict) -> None:
    """``state_dict`` post-hook of a module that went through ``apply_oelm`` (torch's signature):
    when a module that holds it gathers the state dict (``prefix`` is not empty:
    ``holder.state_dict()``, and so transformers' ``holder.save_pretrained`` and every ``Trainer``
    checkpoint of the holder), each split Q/K/V module's entries are written in the stock fused
    layout (``<name>.weight`` / ``<name>.bias`` of GPT-2's ``c_attn`` ...: new tensors from
    :meth:`~oelm.architectures.fused.SplitQKV.fused_tensors`), so a stock ``from_pretrained`` of the
    holder's checkpoint loads every tensor instead of initializing ``c_attn`` at random. PyTorch
    modules do not know their parents, so the holder's save cannot be guarded; its state dict can.

    Left as they are: the module's own ``state_dict()`` (``prefix == ""``: the split names its
    optimizer, oelm's lean checkpoints and PEFT's OELM adapter use; its own ``save_pretrained``
    fuses a copy), ``keep_vars=True`` (the live parameters were asked for), and a split module
    whose query/key/value are not all plain entries (a LoRA layer wrapped around one: the adapter
    saves its own names). Loading such a state dict back (``holder.load_state_dict``: Trainer's
    resume) splits the fused entries again (each split module's load hook)."""
    if not prefix:
        return
    fold_saved_temperatures(model, state_dict, prefix)  # before fusing: the fused query rows are the folded ones
    for name, module in model.named_modules():
        if isinstance(module, SplitQKV):
            fuse_entries(module, state_dict, f"{prefix}{name}." if name else prefix)


def own_layout(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`stock_layout_when_held` on a copy of ``state_dict`` (keys relative to
    ``model``, a holder of a treated module: a PEFT model, say): the exact query entries back
    under their names, every split module's fused entries split again (contiguous copies, so no two
    saved tensors share memory). PEFT's OELM adapter saves these names, not the stock ones."""
    state = dict(state_dict)
    unfold_saved_temperatures(state)
    for name, module in model.named_modules():
        if isinstance(module, SplitQKV):
            prefix = f"{name}." if name else ""
            entries = split_fused_entries(module, state, prefix)
            if entries:
                state.pop(prefix + "weight")
                state.pop(prefix + "bias", None)
                state.update({k: v.clone(memory_format=torch.contiguous_format) for k, v in entries.items() if k not in state})
    return state


def attach_checkpoint_hooks(model: nn.Module) -> None:
    """Give ``model`` (this instance) :func:`save_pretrained_with_recipe` as ``save_pretrained``
    (when its class has one), :func:`before_load_state_dict` as a ``load_state_dict`` pre-hook
    (its handle in ``model.oelm_load_hook``), bound to the parameters frozen now, and
    :func:`stock_layout_when_held` as a ``state_dict`` post-hook (``model.oelm_state_dict_hook``).
    Instance attributes, not a patched class: other instances are untouched, and the model still
    pickles and deep-copies."""
    if hasattr(type(model), "save_pretrained"):
        model.save_pretrained = functools.partial(save_pretrained_with_recipe, model)
    frozen = tuple(n for n, p in model.named_parameters() if not p.requires_grad)
    model.oelm_load_hook = model.register_load_state_dict_pre_hook(functools.partial(before_load_state_dict, frozen=frozen))
    model.oelm_state_dict_hook = model.register_state_dict_post_hook(stock_layout_when_held)
    keep_recipe_on_config(model)


def keep_recipe_on_config(model: nn.Module) -> None:
    """Put :func:`recipe_of` ``model`` on ``model.config`` (under ``"oelm"``) when ``model`` is a
    transformers base model (``model.base_model is model``), so that a task model holding it, which
    shares the config object, writes the recipe into its own ``config.json``. Other models keep a
    config without it (their own ``save_pretrained`` adds it while saving). Call it again after
    changing ``model.oelm_config``."""
    config = getattr(model, "config", None)
    if config is not None and getattr(model, "base_model", None) is model:
        setattr(config, RECIPE_KEY, recipe_of(model))


def detach_checkpoint_hooks(model: nn.Module) -> bool:
    """Undo :func:`attach_checkpoint_hooks` (a ``save_pretrained`` the user set is kept) and drop a
    recipe that a stock ``from_pretrained`` left on ``model.config``; True if anything was removed."""
    attributes = vars(model)
    removed = False
    save = attributes.get("save_pretrained")
    if isinstance(save, functools.partial) and save.func is save_pretrained_with_recipe:
        del model.save_pretrained
        removed = True
    for attribute in ("oelm_load_hook", "oelm_state_dict_hook"):
        handle = attributes.get(attribute)
        if handle is not None:
            handle.remove()
            delattr(model, attribute)
            removed = True
    config = getattr(model, "config", None)
    if config is not None and RECIPE_KEY in vars(config):
        delattr(config, RECIPE_KEY)
        removed = True
    return removed
