"""Fused query/key/value modules split into separate projections and fused back.

GPT-2's ``c_attn`` (a ``Conv1D``, weight ``[in, 3*out]``) and GPT-NeoX's ``query_key_value``
(rows ``[num_heads, 3, head_dim]``) compute Q, K and V in one matmul, so Q and K cannot be frozen
as whole tensors. :class:`SplitQKV` stands in for such a module with three ``nn.Linear`` whose
combined output is the fused output; :func:`fuse_split_projections` puts the architecture's own
module back, with the trained values (``oelm.merge_and_unload``). Layouts: :data:`~oelm.architectures.spec.FUSED_LAYOUTS`.

The same conversion works on state dicts, so checkpoints keep the stock layout while the model
stays split: :func:`fuse_state_dict` turns a split model's state dict into the one the stock
architecture has (what ``model.save_pretrained`` of an OELM model writes), and a
:class:`SplitQKV` accepts the stock fused keys in ``load_state_dict`` (what Hugging Face
``Trainer``'s ``resume_from_checkpoint`` calls) and splits them again.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from oelm.architectures.spec import FUSED_LAYOUTS
from oelm.errors import OELMError

__all__ = [
    "SplitQKV", "fuse_split_projections", "fuse_state_dict", "fuse_entries", "fuse_tensors", "split_fused_entries",
    "split_fused_tensors", "IO_HOOKS", "NAME_HOOKS", "module_hooks", "carry_hooks", "refuse_hooks", "refuse_split_hooks",
]

_PARTS = ("query", "key", "value")
_SPLIT_KEYS = frozenset(f"{part}.{tensor}" for part in _PARTS for tensor in ("weight", "bias"))

# A SplitQKV and the fused module it stands in for take the same input and give the same output,
# so hooks on either see the same tensors and move with the module when one replaces the other
# (the dicts themselves move, so the user's RemovableHandle still removes its hook). Hooks that see
# parameter names (state dict / load hooks) would see other names: a module with those is refused.
IO_HOOKS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks", "_forward_hooks_with_kwargs",
             "_forward_hooks_always_called", "_backward_pre_hooks", "_backward_hooks")
NAME_HOOKS = ("_state_dict_pre_hooks", "_state_dict_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")


def split_fused_tensors(
    weight: torch.Tensor, bias: torch.Tensor | None, layout: str, num_heads: int, num_kv_heads: int, head_dim: int
) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """A fused weight (and bias) cut into query, key and value ``(weight [out, in], bias [out])``.

    ``weight`` is in the fused module's own orientation (``qkv_conv1d``: ``[in, 3*out]``; the
    others: ``[out_q + 2*out_kv, in]``); the results are in ``nn.Linear`` orientation and may be
    views of the inputs. ``out_q = num_heads*head_dim``, ``out_kv = num_kv_heads*head_dim``.
    """
    if layout not in FUSED_LAYOUTS:
        raise ValueError(f"unknown fused layout {layout!r}; known: {FUSED_LAYOUTS}")
    if layout == "qkv_conv1d":
        weight = weight.T  # Conv1D [in, out] -> nn.Linear [out, in]
    q_out, kv_out = num_heads * head_dim, num_kv_heads * head_dim
    if layout == "qkv_per_head":
        w = weight.reshape(num_heads, 3, head_dim, -1)
        weights = [w[:, i].reshape(q_out, -1) for i in range(3)]
        biases = [bias.reshape(num_heads, 3, head_dim)[:, i].reshape(q_out) for i in range(3)] if bias is not None else [None] * 3
    else:
        sizes = [q_out, kv_out, kv_out]
        weights = list(weight.split(sizes, dim=0))
        biases = list(bias.split(sizes)) if bias is not None else [None] * 3
    return list(zip(weights, biases))


def fuse_tensors(
    weights: list[torch.Tensor], biases: list[torch.Tensor | None], layout: str, num_heads: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The inverse of :func:`split_fused_tensors`: query/key/value weights ``[out, in]`` (and
    biases, all or none) as one contiguous fused weight in the module's own orientation, and bias.

    A ``qkv_conv1d`` fused module always has a bias: none given gives zeros.
    """
    with_bias = biases[0] is not None
    with torch.no_grad():
        if layout == "qkv_per_head":  # rows [num_heads, 3, head_dim], as split_fused_tensors reads them
            heads = (num_heads, head_dim)
            weight = torch.stack([w.reshape(*heads, -1) for w in weights], dim=1).flatten(0, 2)
            bias = torch.stack([b.reshape(heads) for b in biases], dim=1).flatten() if with_bias else None
        else:  # rows [q; k; v]
            weight = torch.cat(list(weights), dim=0)
            bias = torch.cat(list(biases)) if with_bias else None
        if layout == "qkv_conv1d":
            weight = weight.T  # nn.Linear [out, in] -> Conv1D [in, out]
            if bias is None:
                bias = weight.new_zeros(weight.shape[1])
    return weight.contiguous(), None if bias is None else bias.contiguous()


class SplitQKV(nn.Module):
    """Separate query/key/value projections standing in for one fused Q/K/V module.

    ``forward(x)`` returns exactly what the fused module returned, so the model's attention code
    (which splits or reshapes the fused output) runs unchanged::

        x: [..., hidden_size]
        q = query(x): [..., num_heads*head_dim]    k = key(x), v = value(x): [..., num_kv_heads*head_dim]
        layout qkv / qkv_conv1d:  cat([q, k, v], -1)
        layout qkv_per_head:      stack([q, k, v] viewed [..., num_heads, head_dim], dim=-2)
                                  -> [..., num_heads, 3, head_dim] -> [..., 3*num_heads*head_dim]

    Because Q, K and V are separate parameters, Q and K can be frozen as whole tensors
    (``requires_grad=False``); no gradient of a slice is masked.

    ``load_state_dict`` accepts either this module's own keys (``query.weight`` ...) or the fused
    module's (``weight``, ``bias`` in the stock layout: a checkpoint that ``model.save_pretrained``
    or a stock model wrote), which it splits (:func:`split_fused_entries`).
    """

    def __init__(self, query: nn.Linear, key: nn.Linear, value: nn.Linear, layout: str, num_heads: int, head_dim: int):
        super().__init__()
        if layout not in FUSED_LAYOUTS:
            raise ValueError(f"unknown fused layout {layout!r}; known: {FUSED_LAYOUTS}")
        self.query, self.key, self.value = query, key, value
        self.layout, self.num_heads, self.head_dim = layout, num_heads, head_dim
        self.register_load_state_dict_pre_hook(_load_split_or_fused)

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads (fewer than ``num_heads`` under grouped-query attention)."""
        return self.key.out_features // self.head_dim

    @classmethod
    def from_fused(cls, fused: nn.Module, layout: str, num_heads: int, num_kv_heads: int, head_dim: int) -> "SplitQKV":
        """Copy a fused module's weights into three ``nn.Linear`` (same dtype and device)."""
        bias = fused.bias.detach() if getattr(fused, "bias", None) is not None else None
        linears = []
        for w, b in split_fused_tensors(fused.weight.detach(), bias, layout, num_heads, num_kv_heads, head_dim):
            lin = nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device=w.device, dtype=w.dtype)
            with torch.no_grad():
                lin.weight.copy_(w)
                if b is not None:
                    lin.bias.copy_(b)
            lin.weight.requires_grad_(fused.weight.requires_grad)
            if b is not None:
                lin.bias.requires_grad_(fused.bias.requires_grad)
            linears.append(lin)
        return cls(*linears, layout=layout, num_heads=num_heads, head_dim=head_dim)

    def fused_tensors(self, tensors: dict[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The fused module's ``(weight, bias)`` for this module's values, or for ``tensors``
        (this module's state dict, keys ``query.weight`` ...: a copy of it, say); see :func:`fuse_tensors`.

        Raises:
            ValueError: some of query/key/value have a bias and others not, or their input sizes
                differ (they were not made by :meth:`from_fused`).
        """
        linears = [getattr(self, p) for p in _PARTS]
        with_bias = self.query.bias is not None
        if any((lin.bias is not None) != with_bias for lin in linears) or len({lin.in_features for lin in linears}) != 1:
            raise ValueError(
                "SplitQKV.fuse: query/key/value must all have a bias or none, and the same input size; "
                f"got {[(lin.in_features, lin.bias is not None) for lin in linears]}"
            )
        tensors = tensors if tensors is not None else self.state_dict()
        weights = [tensors[f"{p}.weight"] for p in _PARTS]
        biases = [tensors[f"{p}.bias"] if with_bias else None for p in _PARTS]
        return fuse_tensors(weights, biases, self.layout, self.num_heads, self.head_dim)

    def fuse(self) -> nn.Module:
        """The fused module this stands in for, holding the current Q/K/V values: the inverse of
        :meth:`from_fused`.

        ``qkv_conv1d`` gives a transformers ``Conv1D`` (weight ``[hidden_size, 3*out]``, GPT-2's
        ``c_attn``), ``qkv`` and ``qkv_per_head`` give an ``nn.Linear`` (weight ``[out_q + 2*out_kv,
        hidden_size]``, rows per :data:`FUSED_LAYOUTS`), on the device and in the dtype of ``query``.
        Its parameters are new tensors with ``requires_grad=True``; ``fuse()(x)`` equals
        ``self(x)`` up to floating-point summation order. A Conv1D always has a bias: split
        projections without biases give it zeros.

        Raises:
            ValueError: as :meth:`fused_tensors`.
        """
        weight, bias = self.fused_tensors()
        if self.layout == "qkv_conv1d":
            from transformers.pytorch_utils import Conv1D  # transformers only for GPT-2's layout

            with torch.device("meta"):  # no throw-away random init; the parameters are set below
                fused = Conv1D(weight.shape[1], weight.shape[0])
        else:
            fused = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
        fused.weight = nn.Parameter(weight)
        if bias is not None:
            fused.bias = nn.Parameter(bias)
        return fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.query(x), self.key(x), self.value(x)
        if self.layout == "qkv_per_head":
            shape = (*x.shape[:-1], self.num_heads, self.head_dim)
            return torch.stack([q.view(shape), k.view(shape), v.view(shape)], dim=-2).flatten(-3)
        return torch.cat([q, k, v], dim=-1)

    def extra_repr(self) -> str:
        return f"layout={self.layout}, num_heads={self.num_heads}, head_dim={self.head_dim}"


def split_fused_entries(module: SplitQKV, state_dict: dict[str, Any], prefix: str) -> dict[str, torch.Tensor]:
    """The split entries (``<prefix>query.weight`` ...) for the stock fused ``<prefix>weight`` /
    ``<prefix>bias`` of ``state_dict`` (views of them; ``state_dict`` is not changed); ``{}`` when
    ``state_dict`` has no fused entry for ``module``.

    Raises:
        ValueError: the fused weight's shape is not the one ``module`` stands in for, or a non-zero
            fused bias has no split bias to go to (the message names the key).
    """
    if prefix + "weight" not in state_dict:
        return {}
    weight, bias = state_dict[prefix + "weight"], state_dict.get(prefix + "bias")
    out = module.query.out_features + 2 * module.key.out_features
    expected = (module.query.in_features, out) if module.layout == "qkv_conv1d" else (out, module.query.in_features)
    if tuple(weight.shape) != expected or (bias is not None and tuple(bias.shape) != (out,)):
        raise ValueError(
            f"size mismatch for {prefix}weight: the checkpoint has a fused {module.layout} weight of shape "
            f"{list(weight.shape)}, the split module stands in for one of shape {list(expected)}"
        )
    entries = {}
    parts = split_fused_tensors(weight, bias, module.layout, module.num_heads, module.num_kv_heads, module.head_dim)
    for part, (w, b) in zip(_PARTS, parts):
        entries[f"{prefix}{part}.weight"] = w
        if getattr(module, part).bias is not None and b is not None:
            entries[f"{prefix}{part}.bias"] = b
        elif b is not None and bool(b.any()):  # a Conv1D's zero bias stands in for none; anything else is lost
            raise ValueError(f"{prefix}bias is not zero, but {prefix}{part} has no bias to hold it")
    return entries


def fuse_entries(module: SplitQKV, state_dict: dict[str, Any], prefix: str) -> bool:
    """The inverse of :func:`split_fused_entries`, in place: ``module``'s split entries of
    ``state_dict`` (``<prefix>query.weight`` ...) replaced by the stock fused ``<prefix>weight`` /
    ``<prefix>bias`` (new tensors, :meth:`SplitQKV.fused_tensors`). True if replaced; False, with
    ``state_dict`` unchanged, when an entry is missing (a LoRA layer wrapped around ``value``
    renames it) or is a live ``nn.Parameter`` (``state_dict(keep_vars=True)``).

    Raises:
        ValueError: as :meth:`SplitQKV.fused_tensors`.
    """
    with_bias = module.query.bias is not None
    keys = [f"{part}.{tensor}" for part in _PARTS for tensor in (("weight", "bias") if with_bias else ("weight",))]
    local = {k: state_dict.get(prefix + k) for k in keys}
    if any(v is None or isinstance(v, nn.Parameter) for v in local.values()):
        return False
    weight, bias = module.fused_tensors(local)
    for k in keys:
        del state_dict[prefix + k]
    state_dict[prefix + "weight"] = weight
    if bias is not None:
        state_dict[prefix + "bias"] = bias
    return True


def _load_split_or_fused(module: SplitQKV, state_dict: dict[str, Any], prefix: str, local_metadata: dict, strict: bool,
                         missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str]) -> None:
    """``load_state_dict`` pre-hook of :class:`SplitQKV` (torch's signature): stock fused keys
    are replaced by the split ones (a shape that does not fit is reported as torch reports one); a
    split entry the state dict also has explicitly (a tempered query's exact weight saved beside
    the folded fused one: :func:`oelm.method.temperature.fold_saved_temperatures`) is kept."""
    try:
        entries = split_fused_entries(module, state_dict, prefix)
    except ValueError as exc:
        error_msgs.append(str(exc))
        entries = {}
    if prefix + "weight" in state_dict:
        state_dict.pop(prefix + "weight")
        state_dict.pop(prefix + "bias", None)
    state_dict.update({k: v for k, v in entries.items() if k not in state_dict})  # an explicit split entry wins


def fuse_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """A copy of ``state_dict`` (default ``model.state_dict()``) in the stock layout: the keys of
    every :class:`SplitQKV` of ``model`` (``<name>.query.weight`` ...) replaced by the fused
    module's (``<name>.weight``, ``<name>.bias``), holding new tensors (:func:`fuse_tensors`);
    every other entry is the same object. ``model`` and its parameters are not changed.

    ``state_dict``'s keys are relative to ``model`` (as ``model.state_dict()`` gives them); a
    split module none of whose keys are there (a partial state dict) is left out. Other tensors of a
    split projection keep their split names (``<name>.query.head_temperature``: :mod:`oelm.method.temperature`).
    """
    fused = dict(model.state_dict() if state_dict is None else state_dict)
    for name, module in model.named_modules():
        if not isinstance(module, SplitQKV):
            continue
        prefix = f"{name}." if name else ""
        local = {k[len(prefix):]: fused.pop(k) for k in list(fused) if k.startswith(prefix) and k[len(prefix):] in _SPLIT_KEYS}
        if local:
            weight, bias = module.fused_tensors(local)
            fused[prefix + "weight"] = weight
            if bias is not None:
                fused[prefix + "bias"] = bias
    return fused


def module_hooks(module: nn.Module, kinds: tuple[str, ...] = IO_HOOKS + NAME_HOOKS, ignore: tuple = ()) -> list[str]:
    """The kinds of torch hooks registered on ``module`` itself (``"forward_hooks"``, ...: the
    dicts of ``kinds`` that hold a hook not in ``ignore``; the with-kwargs / always-called flag
    dicts are not kinds)."""
    return [kind.lstrip("_") for kind in kinds if not kind.endswith(("_kwargs", "_called"))
            and any(hook not in ignore for hook in (getattr(module, kind, None) or {}).values())]


def refuse_hooks(module: nn.Module, name: str, kinds: tuple[str, ...], why: str, ignore: tuple = ()) -> None:
    """Refuse, with one line naming the module and the hook kinds, a module that has hooks of ``kinds``
    (other than the functions in ``ignore``).

    Raises:
        OELMError: ``module`` has such hooks.
    """
    found = module_hooks(module, kinds, ignore)
    if found:
        raise OELMError(f"{name} ({type(module).__name__}) has {', '.join(found)} registered on it: {why}")


def carry_hooks(old: nn.Module, new: nn.Module) -> nn.Module:
    """Give ``new`` (which replaces ``old`` in the model, with the same input and output) ``old``'s
    forward and backward hooks: the hook dicts themselves, so handles stay valid. Returns ``new``."""
    for kind in IO_HOOKS:
        if hasattr(old, kind):
            vars(new)[kind] = getattr(old, kind)
    if hasattr(old, "_is_full_backward_hook"):
        vars(new)["_is_full_backward_hook"] = old._is_full_backward_hook
    return new


def refuse_split_hooks(model: nn.Module, ignore: tuple = ()) -> list[tuple[str, SplitQKV]]:
    """Refuse a hook (other than the functions in ``ignore``) on a split query/key/value projection,
    which fusing would drop; the ``(name, SplitQKV)`` pairs of ``model`` otherwise.

    Raises:
        OELMError: names the projection and the hook kind.
    """
    splits = [(name, m) for name, m in model.named_modules() if isinstance(m, SplitQKV)]
    for name, split in splits:
        for part in _PARTS:
            refuse_hooks(getattr(split, part), f"{name}.{part}" if name else part, IO_HOOKS + NAME_HOOKS,
                         "oelm.merge_and_unload fuses it with its siblings into one module and would drop them; "
                         "remove them first (handle.remove()); nothing was changed", ignore)
    return splits


def fuse_split_projections(model: nn.Module) -> list[str]:
    """Replace every :class:`SplitQKV` of ``model`` by the fused module it stands in for (in place).

    The inverse of :func:`split_fused_projections`, with the split modules' current values (see
    :meth:`SplitQKV.fuse`): afterwards the model has the architecture's own module types and
    parameter names again (GPT-2 ``c_attn.weight`` ``[in, 3*out]``, GPT-NeoX
    ``query_key_value.weight`` ``[3*hidden, hidden]`` in per-head order), so a stock
    ``from_pretrained`` reads what ``save_pretrained`` writes. The new fused parameters have
    ``requires_grad=True``. Returns the names of the replaced modules; ``[]`` when there are none.
    Works on any model (no registry look-up).

    Forward and backward hooks on a :class:`SplitQKV` move to the fused module (same input and
    output; :func:`carry_hooks`). Hooks on its ``query``/``key``/``value`` have no module to go to
    (the fused one computes all three at once): such a model is refused before anything changes.

    Raises:
        OELMError: a hook on a split projection (the message names it and the kind).
        ValueError: as :meth:`SplitQKV.fused_tensors`.
    """
    splits = refuse_split_hooks(model)
    modules = dict(model.named_modules())
    for name, split in splits:
        parent_name, _, child_name = name.rpartition(".")
        fused = carry_hooks(split, split.fuse().train(split.training))
        setattr(modules[parent_name] if parent_name else model, child_name, fused)
    return [name for name, _ in splits]
