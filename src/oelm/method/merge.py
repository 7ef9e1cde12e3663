"""The way back out of :func:`oelm.apply_oelm`: :func:`merge_and_unload` (PEFT's name), and
:data:`OELM_ATTRIBUTES`, what ``apply_oelm`` puts on a model. (A split model's own
``save_pretrained`` writes the stock layout: :mod:`oelm.method.checkpoint_record`.) Re-exported from
:mod:`oelm.method`."""

from __future__ import annotations

import functools
from typing import Any

from torch import nn

from oelm.architectures import ARCHITECTURE_ATTRIBUTE, fuse_split_projections
from oelm.architectures.fused import refuse_split_hooks
from oelm.errors import OELMError
from oelm.method.checkpoint_record import CHECKPOINT_ATTRIBUTES, detach_checkpoint_hooks
from oelm.method.marks import part_line, refuse_wrapper, treated_modules, unmark
from oelm.method.parameters import print_trainable_parameters, require_module
from oelm.method.temperature import fold_head_temperatures, scale_query_heads

__all__ = ["OELM_ATTRIBUTES", "merge_and_unload"]


#: Instance attributes :func:`apply_oelm` sets on the model (and :func:`merge_and_unload` removes):
#: the report, the config, a PEFT-style ``print_trainable_parameters``, the checkpoint hooks of
#: :mod:`oelm.method.checkpoint_record` (``save_pretrained`` in the stock layout, the load hook's handle), and the
#: spec ``target_modules`` gave. (Each submodule gets :data:`oelm.method.marks.PART_OF_ATTRIBUTE`, removed too.)
OELM_ATTRIBUTES = ("oelm_report", "oelm_config", "print_trainable_parameters", *CHECKPOINT_ATTRIBUTES, ARCHITECTURE_ATTRIBUTE)


def _is_bound(value: Any, func: Any) -> bool:
    return isinstance(value, functools.partial) and value.func is func


def _unload(module: nn.Module) -> bool:
    """Remove what ``apply_oelm`` put on ``module`` (:data:`OELM_ATTRIBUTES`, the checkpoint hooks,
    a recipe on its config); True if anything was there."""
    detached = detach_checkpoint_hooks(module)
    attributes = vars(module)
    # a method of that name the user set on the instance is theirs: only oelm's partial goes
    ours = [n for n in ("oelm_report", "oelm_config", ARCHITECTURE_ATTRIBUTE) if n in attributes]
    if _is_bound(attributes.get("print_trainable_parameters"), print_trainable_parameters):
        ours.append("print_trainable_parameters")
    for name in ours:
        delattr(module, name)
    return detached or bool(ours)


def merge_and_unload(model: nn.Module) -> nn.Module:
    """Turn an OELM model back into a plain model of its architecture, in place, and return it.

    PEFT's name for the way out. Every :class:`SplitQKV` is fused back into the architecture's
    own module and layout with the trained values (GPT-2 ``c_attn``: a ``Conv1D`` with weight
    ``[hidden, 3*hidden]``; GPT-NeoX ``query_key_value``: an ``nn.Linear`` with rows
    ``[num_heads, 3, head_dim]``; see :meth:`SplitQKV.fuse`), so the state dict has the stock
    parameter names and ``model.save_pretrained(dir)`` writes a checkpoint that a stock
    ``from_pretrained(dir)`` loads with no missing or unexpected keys. Outputs are unchanged up to
    floating-point summation order. Then every attribute in :data:`OELM_ATTRIBUTES` is removed
    (the report, the config, ``print_trainable_parameters``, oelm's ``save_pretrained``, so the
    class's own is back, and the load hook; a recipe that a stock ``from_pretrained`` put on
    ``model.config`` goes too), and ``apply_oelm`` may be applied again. A learned per-head
    temperature (``oelm_temperature``) is folded into its query rows and bias first
    (:func:`oelm.method.temperature.fold_head_temperatures`), so the stock model computes the same logits.

    The whole tree is merged: a model that holds a module ``apply_oelm`` ran on (``model.bert``
    after ``apply_oelm(model.bert)``) is merged like that module (:mod:`oelm.method.marks`). Forward
    and backward hooks on a split module move to the fused one; hooks on its query/key/value
    projections, which no module of the merged model computes alone, are refused.

    Freezing is unloaded too: every parameter gets ``requires_grad=True``, as in a model that
    ``from_pretrained`` returns, since nothing marks the model as OELM any more (extra groups
    and parameters frozen by hand included). To train on with Q/K frozen, do not merge yet, or
    apply ``oelm_freeze`` again with ``init="none"`` (it keeps the values and freezes them).

    A model without split modules and without OELM attributes (never touched by ``apply_oelm``)
    is returned unchanged (``requires_grad`` flags included). A model with OELM attributes but
    nothing split (BERT, Llama, ...: separate Q/K already) keeps its modules and parameter names;
    its attributes are removed and its parameters made trainable.

    Args:
        model: the model ``apply_oelm`` ran on, or one that holds it; any device and dtype, kept.

    Returns:
        ``model`` itself.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        OELMError: ``model`` is a DistributedDataParallel / DataParallel / FSDP / ``torch.compile``
            wrapper (``unwrap it first: model.module / model._orig_mod``); ``model`` is a part of a
            model that went through ``apply_oelm`` (merge that model); a forward/backward or
            state-dict hook on a split query/key/value projection (named). Nothing is changed.
        ValueError: a :class:`SplitQKV` whose query/key/value disagree on bias or input size
            (not one that ``apply_oelm`` made).
    """
    require_module(model, "merge_and_unload")
    refuse_wrapper(model, "merge_and_unload")
    part = part_line(model)
    if part is not None:
        raise OELMError(f"{part}: oelm.merge_and_unload on a part would leave that model half merged. Fix: "
                        "merge the model that went through apply_oelm (or one that holds it)")
    treated = [m for _, m in treated_modules(model) if m is not model]
    refuse_split_hooks(model, ignore=(scale_query_heads,))  # hooks fusing cannot move, before anything changes
    folded = fold_head_temperatures(model)  # each query head's tau into its rows and bias (oelm_temperature)
    fused = fuse_split_projections(model)
    unloaded = [_unload(m) for m in (model, *treated)]
    if not fused and not folded and not any(unloaded):
        return model
    unmark(model)
    for p in model.parameters():
        p.requires_grad_(True)
    return model
