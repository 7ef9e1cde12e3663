"""The way back out of :func:`oelm.apply_oelm`: :func:`merge_and_unload` (PEFT's name), and the
``save_pretrained`` refusal that ``apply_oelm`` binds on a model whose fused Q/K/V it split.
Re-exported from :mod:`oelm.method`."""

from __future__ import annotations

import functools
from typing import Any

from torch import nn

from oelm.architectures import SplitQKV, fuse_split_projections
from oelm.errors import OELMError
from oelm.parameters import print_trainable_parameters, require_module

__all__ = ["OELM_ATTRIBUTES", "merge_and_unload", "refuse_split_save"]


#: Instance attributes :func:`apply_oelm` sets on the model (and :func:`merge_and_unload` removes):
#: the report, the config, and two PEFT-style methods (``save_pretrained`` only when fused Q/K/V
#: modules were split).
OELM_ATTRIBUTES = ("oelm_report", "oelm_config", "print_trainable_parameters", "save_pretrained")


def refuse_split_save(model: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The refusing ``model.save_pretrained`` of a model whose fused Q/K/V ``apply_oelm`` split (bound with
    :func:`functools.partial`). Raises :class:`OELMError` while any :class:`SplitQKV` remains;
    once none does (fused back with ``fuse_split_projections``), the class's own method runs."""
    split = [name for name, m in model.named_modules() if isinstance(m, SplitQKV)]
    if not split:
        return type(model).save_pretrained(model, *args, **kwargs)
    more = f" (and {len(split) - 1} more)" if len(split) > 1 else ""
    raise OELMError(
        f"{type(model).__name__}.save_pretrained refused: apply_oelm split {split[0]}{more} into separate "
        "query/key/value modules, which a stock from_pretrained does not know and would fill with random weights. "
        "Fix: model = oelm.merge_and_unload(model) first for a plain Hugging Face checkpoint, or "
        "oelm.save_pretrained(model, dir) for a lean OELM checkpoint (reload it with oelm.load_oelm)"
    )


def _is_bound(value: Any, func: Any) -> bool:
    return isinstance(value, functools.partial) and value.func is func


def merge_and_unload(model: nn.Module) -> nn.Module:
    """Turn an OELM model back into a plain model of its architecture, in place, and return it.

    PEFT's name for the way out. Every :class:`SplitQKV` is fused back into the architecture's
    own module and layout with the trained values (GPT-2 ``c_attn``: a ``Conv1D`` with weight
    ``[hidden, 3*hidden]``; GPT-NeoX ``query_key_value``: an ``nn.Linear`` with rows
    ``[num_heads, 3, head_dim]``; see :meth:`SplitQKV.fuse`), so the state dict has the stock
    parameter names and ``model.save_pretrained(dir)`` writes a checkpoint that a stock
    ``from_pretrained(dir)`` loads with no missing or unexpected keys. Outputs are unchanged up to
    floating-point summation order. Then every attribute in :data:`OELM_ATTRIBUTES` is removed
    (the report, the config, ``print_trainable_parameters`` and the refusing ``save_pretrained``,
    so the class's own ``save_pretrained`` is back), and ``apply_oelm`` may be applied again.

    Freezing is unloaded too: every parameter gets ``requires_grad=True``, as in a model that
    ``from_pretrained`` returns, since nothing marks the model as OELM any more (extra groups
    and parameters frozen by hand included). To train on with Q/K frozen, do not merge yet, or
    apply ``oelm_freeze`` again with ``init="none"`` (it keeps the values and freezes them).

    A model without split modules and without OELM attributes (never touched by ``apply_oelm``)
    is returned unchanged (``requires_grad`` flags included). A model with OELM attributes but
    nothing split (BERT, Llama, ...: separate Q/K already) keeps its modules and parameter names;
    its attributes are removed and its parameters made trainable.

    Args:
        model: the model ``apply_oelm`` ran on (not a DistributedDataParallel / ``torch.compile``
            wrapper: unwrap it first); any device and dtype, kept.

    Returns:
        ``model`` itself.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: a :class:`SplitQKV` whose query/key/value disagree on bias or input size
            (not one that ``apply_oelm`` made).
    """
    require_module(model, "merge_and_unload")
    fused = fuse_split_projections(model)
    attributes = vars(model)
    bound = {"print_trainable_parameters": print_trainable_parameters, "save_pretrained": refuse_split_save}
    # a method of that name the user set on the instance is theirs: only oelm's partials go
    ours = [n for n in OELM_ATTRIBUTES if n in attributes and (n not in bound or _is_bound(attributes[n], bound[n]))]
    if not fused and not ours:
        return model
    for name in ours:
        delattr(model, name)
    for p in model.parameters():
        p.requires_grad_(True)
    return model
