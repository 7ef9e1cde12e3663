"""Initializers for attention query/key projections, and the orthogonality check.

All functions act in place on a projection weight in ``nn.Linear`` layout::

    weight: [num_heads * head_dim, hidden_size]     # out_features x in_features

and return the same tensor (PyTorch's trailing-underscore convention). They run under
``torch.no_grad()`` and compute in float64 before casting back, so the result is orthonormal
to ~1e-7 even for float32 weights.

The method (Orthogonal ELM): each attention head's query and key projections get an
orthonormal set of rows and are then frozen, reservoir style, while the rest of the network
trains. Head-wise orthogonality is what the original OELM project reported as working; a
single QR over the whole matrix (:func:`global_orthogonal_`) was its failing variant, and
normal draws with std 0.02 were its "random" ablation. Because orthonormal rows have norm 1
while std-0.02 rows have norm ~0.02*sqrt(hidden_size), that ablation compared *scale*, not
orthogonality; :func:`normal_` with ``std="matched"`` (1/sqrt(hidden_size)) gives rows of
expected norm 1 so the comparison isolates orthogonality.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

__all__ = [
    "head_wise_orthogonal_",
    "global_orthogonal_",
    "normal_",
    "matched_std",
    "max_orthogonality_error",
]


def _check_weight(weight: torch.Tensor, num_heads: int) -> int:
    """Validate ``weight``/``num_heads`` and return ``head_dim``."""
    if weight.dim() != 2:
        raise ValueError(
            f"expected a 2-D projection weight [num_heads*head_dim, hidden_size], got shape {tuple(weight.shape)}"
        )
    if not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive integer, got {num_heads!r}")
    out_features, hidden_size = weight.shape
    if out_features % num_heads != 0:
        raise ValueError(
            f"weight has {out_features} rows, which is not divisible by num_heads={num_heads}; "
            "expected [num_heads*head_dim, hidden_size] (nn.Linear layout)"
        )
    head_dim = out_features // num_heads
    if head_dim > hidden_size:
        raise ValueError(
            f"head_dim={head_dim} exceeds hidden_size={hidden_size}: a head cannot have more than "
            "hidden_size orthonormal rows"
        )
    return head_dim


def _sign_fixed_q(matrix: torch.Tensor) -> torch.Tensor:
    """Q factor of ``matrix = QR`` (reduced) with the signs fixed so that ``diag(R) >= 0``.

    ``matrix``: [m, n] with m >= n, float64. Returns Q: [m, n] with orthonormal columns.
    Householder QR is unique only up to the sign of each column; multiplying column j by
    sign(R_jj) makes the factorization unique, so the same input always gives the same output
    (and a Gaussian input gives a Haar-distributed Q; Mezzadri 2007, "How to generate random
    matrices from the classical compact groups").
    """
    q, r = torch.linalg.qr(matrix, mode="reduced")
    signs = torch.sign(torch.diagonal(r))
    signs[signs == 0] = 1.0
    return q * signs.unsqueeze(0)


@torch.no_grad()
def head_wise_orthogonal_(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Make each head's rows orthonormal, one QR decomposition per head (in place).

    For head ``h`` the block ``W_h = weight[h*head_dim:(h+1)*head_dim]`` ([head_dim, hidden_size])
    is replaced by ``Q_h^T`` where ``W_h^T = Q_h R_h`` is the reduced QR decomposition,
    sign-fixed (``diag(R_h) >= 0``). Afterwards ``W_h W_h^T = I_{head_dim}`` for every head.
    Different heads are *not* made orthogonal to each other.

    Applied to a pretrained weight it returns the orthonormal basis of the span of that head's
    rows that is closest in the Gram-Schmidt sense; applied to a fresh Gaussian draw it gives a
    random (Haar) orthonormal frame per head.

    Args:
        weight: [num_heads * head_dim, hidden_size], any floating dtype, any device.
        num_heads: number of heads the rows are split into (for grouped-query attention pass
            the key projection's own number of key/value heads).

    Returns:
        ``weight``, modified in place.

    Raises:
        ValueError: weight is not 2-D, rows not divisible by ``num_heads``, or
            ``head_dim > hidden_size``.
    """
    head_dim = _check_weight(weight, num_heads)
    w = weight.detach().to(torch.float64)
    blocks = w.view(num_heads, head_dim, -1)  # (nh, hd, hidden)
    out = torch.empty_like(blocks)
    for h in range(num_heads):
        out[h] = _sign_fixed_q(blocks[h].T).T  # (hidden, hd) -> Q (hidden, hd) -> rows (hd, hidden)
    weight.copy_(out.view_as(weight).to(weight.dtype))
    return weight


@torch.no_grad()
def global_orthogonal_(weight: torch.Tensor) -> torch.Tensor:
    """One QR decomposition over the whole matrix (in place): the non-head-wise variant.

    If ``out_features <= in_features`` the rows become orthonormal (``W W^T = I``), otherwise the
    columns do (``W^T W = I``). Signs are fixed as in :func:`head_wise_orthogonal_`. The original
    OELM project reported that this global variant, unlike the head-wise one, failed.

    Args:
        weight: [out_features, in_features].

    Returns:
        ``weight``, modified in place.

    Raises:
        ValueError: weight is not 2-D.
    """
    if weight.dim() != 2:
        raise ValueError(f"expected a 2-D weight, got shape {tuple(weight.shape)}")
    w = weight.detach().to(torch.float64)
    rows, cols = w.shape
    q = _sign_fixed_q(w.T).T if rows <= cols else _sign_fixed_q(w)
    weight.copy_(q.to(weight.dtype))
    return weight


def matched_std(hidden_size: int) -> float:
    """The std whose Gaussian rows have expected squared norm 1: ``1/sqrt(hidden_size)``.

    With entries ~ N(0, s^2), a row of length ``hidden_size`` has E[||w||^2] = hidden_size * s^2,
    which equals 1 (the norm of an orthonormal row) for s = 1/sqrt(hidden_size).
    """
    if hidden_size < 1:
        raise ValueError(f"hidden_size must be positive, got {hidden_size}")
    return 1.0 / math.sqrt(hidden_size)


@torch.no_grad()
def normal_(
    weight: torch.Tensor,
    std: float | Literal["matched"] = 0.02,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Fill ``weight`` with N(0, std^2) draws (in place).

    ``std=0.02`` reproduces the original project's OELM-Random ablation (BERT/GPT-2 init scale).
    ``std="matched"`` uses :func:`matched_std` of ``weight.shape[1]`` (``hidden_size``), so rows
    have the same expected norm (1) as orthonormal ones and only orthogonality differs.

    The draw is made on the CPU in float32 with ``generator`` (if given) and then copied, so a
    seed gives the same weights on every device.

    Args:
        weight: [out_features, hidden_size].
        std: a positive float or ``"matched"``.
        generator: optional CPU ``torch.Generator`` for reproducible draws.

    Raises:
        ValueError: weight not 2-D, or std not positive / not ``"matched"``.
    """
    if weight.dim() != 2:
        raise ValueError(f"expected a 2-D weight, got shape {tuple(weight.shape)}")
    if std == "matched":
        std = matched_std(weight.shape[1])
    if isinstance(std, str) or not std > 0:
        raise ValueError(f"std must be a positive number or 'matched', got {std!r}")
    draw = torch.randn(weight.shape, generator=generator, dtype=torch.float32) * float(std)
    weight.copy_(draw.to(device=weight.device, dtype=weight.dtype))
    return weight


@torch.no_grad()
def max_orthogonality_error(weight: torch.Tensor, num_heads: int) -> float:
    """Largest deviation from head-wise orthonormality: ``max_h max|W_h W_h^T - I|``.

    Args:
        weight: [num_heads * head_dim, hidden_size].
        num_heads: number of heads.

    Returns:
        A float; ~1e-7 for a float32 weight made by :func:`head_wise_orthogonal_`.

    Raises:
        ValueError: as :func:`head_wise_orthogonal_`.
    """
    head_dim = _check_weight(weight, num_heads)
    blocks = weight.detach().to(torch.float64).view(num_heads, head_dim, -1)
    gram = blocks @ blocks.transpose(1, 2)  # (nh, hd, hd)
    eye = torch.eye(head_dim, dtype=torch.float64, device=weight.device)
    return float((gram - eye).abs().max())
