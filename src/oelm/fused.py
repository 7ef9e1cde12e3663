"""Fused query/key/value modules split into separate projections and fused back.

GPT-2's ``c_attn`` (a ``Conv1D``, weight ``[in, 3*out]``) and GPT-NeoX's ``query_key_value``
(rows ``[num_heads, 3, head_dim]``) compute Q, K and V in one matmul, so Q and K cannot be frozen
as whole tensors. :class:`SplitQKV` stands in for such a module with three ``nn.Linear`` whose
combined output is the fused output; :func:`fuse_split_projections` puts the architecture's own
module back, with the trained values (``oelm.merge_and_unload``). Layouts: :data:`FUSED_LAYOUTS`.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["FUSED_LAYOUTS", "SplitQKV", "fuse_split_projections"]

# Fused Q/K/V layouts, named by how the fused output features are ordered:
#   qkv           nn.Linear, rows [q (num_heads*head_dim); k (num_kv_heads*head_dim); v (same)]
#   qkv_conv1d    transformers Conv1D (y = x @ W + b, W: [in, out]), output columns as ``qkv``
#   qkv_per_head  nn.Linear, rows [num_heads, 3, head_dim]: each head's q, k, v next to each other
FUSED_LAYOUTS = ("qkv", "qkv_conv1d", "qkv_per_head")


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
    """

    def __init__(self, query: nn.Linear, key: nn.Linear, value: nn.Linear, layout: str, num_heads: int, head_dim: int):
        super().__init__()
        if layout not in FUSED_LAYOUTS:
            raise ValueError(f"unknown fused layout {layout!r}; known: {FUSED_LAYOUTS}")
        self.query, self.key, self.value = query, key, value
        self.layout, self.num_heads, self.head_dim = layout, num_heads, head_dim

    @classmethod
    def from_fused(cls, fused: nn.Module, layout: str, num_heads: int, num_kv_heads: int, head_dim: int) -> "SplitQKV":
        """Copy a fused module's weights into three ``nn.Linear`` (same dtype and device)."""
        weight = fused.weight.detach()
        bias = fused.bias.detach() if getattr(fused, "bias", None) is not None else None
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
        linears = []
        for w, b in zip(weights, biases):
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
            ValueError: some of query/key/value have a bias and others not, or their input sizes
                differ (they were not made by :meth:`from_fused`).
        """
        linears = (self.query, self.key, self.value)
        with_bias = self.query.bias is not None
        if any((lin.bias is not None) != with_bias for lin in linears) or len({lin.in_features for lin in linears}) != 1:
            raise ValueError(
                "SplitQKV.fuse: query/key/value must all have a bias or none, and the same input size; "
                f"got {[(lin.in_features, lin.bias is not None) for lin in linears]}"
            )
        with torch.no_grad():
            if self.layout == "qkv_per_head":  # rows [num_heads, 3, head_dim], as from_fused reads them
                heads = (self.num_heads, self.head_dim)
                weight = torch.stack([lin.weight.view(*heads, -1) for lin in linears], dim=1).flatten(0, 2)
                bias = torch.stack([lin.bias.view(heads) for lin in linears], dim=1).flatten() if with_bias else None
            else:  # rows [q; k; v]
                weight = torch.cat([lin.weight for lin in linears], dim=0)
                bias = torch.cat([lin.bias for lin in linears]) if with_bias else None
        out_features, in_features = weight.shape
        if self.layout == "qkv_conv1d":
            from transformers.pytorch_utils import Conv1D

            with torch.device("meta"):  # no throw-away random init; the parameters are set below
                fused = Conv1D(out_features, in_features)
            weight = weight.T  # nn.Linear [out, in] -> Conv1D [in, out]
            if bias is None:
                bias = weight.new_zeros(out_features)
        else:
            fused = nn.Linear(in_features, out_features, bias=bias is not None, device="meta")
        fused.weight = nn.Parameter(weight.contiguous())
        if bias is not None:
            fused.bias = nn.Parameter(bias.contiguous())
        return fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.query(x), self.key(x), self.value(x)
        if self.layout == "qkv_per_head":
            shape = (*x.shape[:-1], self.num_heads, self.head_dim)
            return torch.stack([q.view(shape), k.view(shape), v.view(shape)], dim=-2).flatten(-3)
        return torch.cat([q, k, v], dim=-1)

    def extra_repr(self) -> str:
        return f"layout={self.layout}, num_heads={self.num_heads}, head_dim={self.head_dim}"


def fuse_split_projections(model: nn.Module) -> list[str]:
    """Replace every :class:`SplitQKV` of ``model`` by the fused module it stands in for (in place).

    The inverse of :func:`split_fused_projections`, with the split modules' current values (see
    :meth:`SplitQKV.fuse`): afterwards the model has the architecture's own module types and
    parameter names again (GPT-2 ``c_attn.weight`` ``[in, 3*out]``, GPT-NeoX
    ``query_key_value.weight`` ``[3*hidden, hidden]`` in per-head order), so a stock
    ``from_pretrained`` reads what ``save_pretrained`` writes. The new fused parameters have
    ``requires_grad=True``. Returns the names of the replaced modules; ``[]`` when there are none.
    Works on any model (no registry look-up).
    """
    splits = [(name, m) for name, m in model.named_modules() if isinstance(m, SplitQKV)]
    modules = dict(model.named_modules())
    for name, split in splits:
        parent_name, _, child_name = name.rpartition(".")
        setattr(modules[parent_name] if parent_name else model, child_name, split.fuse().train(split.training))
    return [name for name, _ in splits]
