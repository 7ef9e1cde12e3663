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

More structured inits serve the controls: :func:`rescaled_head_wise_orthogonal_` (orthogonal
rows at each head's own scale: the temperature control), :func:`polar_head_wise_` (the nearest
orthonormal rows per head: the polar factor) and :func:`mimetic_` (Trockman & Kolter
2023: the query-key product close to the identity), with its value/output half
:func:`mimetic_value_output_` (the value-output product close to minus the identity).

The init kinds a method can name (``OELMConfig.init``) are declared in ONE table, torch-free:
:data:`oelm.method.config.INIT_KINDS` (name, summary, source, whether it draws random numbers,
whether it sets Q and K together). The method (:mod:`oelm.method`), the experiment-config schema
(:mod:`oelm.config`, its allowed ``init:`` values) and the lean-checkpoint regeneration
(:mod:`oelm.checkpoint`, which kinds need a seed) all read it. :data:`INITS` gives each kind its
functions (:class:`Initializer`) and refuses on import to differ from it: a new kind is one row there
and one here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal

import torch

from oelm.errors import UnsupportedModelError
from oelm.method.config import INIT_KINDS, INIT_NAMES, InitKind

__all__ = [
    "head_wise_orthogonal_", "rescaled_head_wise_orthogonal_", "polar_head_wise_", "global_orthogonal_", "normal_",
    "mimetic_", "mimetic_value_output_", "MIMETIC_VO_NOISE", "MIMETIC_VO_IDENTITY", "matched_std",
    "max_orthogonality_error", "Initializer", "INITS",
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
    out = _head_wise_q(weight.detach().to(torch.float64).view(num_heads, head_dim, -1))
    weight.copy_(out.view_as(weight).to(weight.dtype))
    return weight


def _head_wise_q(blocks: torch.Tensor) -> torch.Tensor:
    """Orthonormal rows per head: ``blocks`` (nh, hd, hidden) float64 -> the sign-fixed Q^T of each."""
    out = torch.empty_like(blocks)
    for h in range(blocks.shape[0]):
        out[h] = _sign_fixed_q(blocks[h].T).T  # (hidden, hd) -> Q (hidden, hd) -> rows (hd, hidden)
    return out


@torch.no_grad()
def rescaled_head_wise_orthogonal_(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """:func:`head_wise_orthogonal_`, then each head's block rescaled to its Frobenius norm before (in place).

    For head ``h`` with block ``W_h`` ([head_dim, hidden_size]) the result is
    ``(||W_h||_F / sqrt(head_dim)) * Q_h^T``: the rows stay mutually orthogonal (all of norm
    ``||W_h||_F / sqrt(head_dim)``), the row space is that of ``W_h`` as in
    :func:`head_wise_orthogonal_`, and ``||result_h||_F == ||W_h||_F``. Applied to a pretrained
    weight it keeps each head's pretrained scale, so the attention logits keep their temperature
    (orthonormal rows have Frobenius norm ``sqrt(head_dim)`` whatever the pretrained scale); applied
    to a fresh model it keeps the scale of the default initialization. oelm's ``oelm_rescaled``
    method, the temperature control of ``oelm_freeze``.

    Args:
        weight: [num_heads * head_dim, hidden_size], any floating dtype, any device.
        num_heads: number of heads (``num_kv_heads`` for a grouped-query key projection).

    Returns:
        ``weight``, modified in place.

    Raises:
        ValueError: as :func:`head_wise_orthogonal_`.
    """
    head_dim = _check_weight(weight, num_heads)
    blocks = weight.detach().to(torch.float64).view(num_heads, head_dim, -1)  # (nh, hd, hidden)
    norms = torch.linalg.matrix_norm(blocks)  # (nh,) Frobenius norms
    out = _head_wise_q(blocks) * (norms / math.sqrt(head_dim)).view(num_heads, 1, 1)
    weight.copy_(out.view_as(weight).to(weight.dtype))
    return weight


@torch.no_grad()
def polar_head_wise_(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Each head's block replaced by the nearest matrix with orthonormal rows: its polar factor (in place).

    For head ``h`` with block ``W_h`` ([head_dim, hidden_size]) and thin SVD ``W_h = U S V^T``
    (float64; ``U`` [head_dim, head_dim], ``V^T`` [head_dim, hidden_size]) the result is ``U V^T``,
    the matrix with orthonormal rows closest to ``W_h`` in Frobenius norm (Fan & Hoffman 1955;
    Higham 1986, "Computing the polar decomposition"; the orthogonal Procrustes problem, Schönemann
    1966). Same row space as :func:`head_wise_orthogonal_`'s QR basis, but no closer-than-QR basis
    exists; ``W_h`` with orthonormal rows is returned unchanged (to rounding). ``U V^T`` does not
    depend on the SVD's signs (``u_i v_i^T`` is), so no draw and no sign fix: deterministic, and
    unique when ``W_h`` has full row rank. oelm's ``oelm_polar`` method (the nearest-rows control).

    Args:
        weight: [num_heads * head_dim, hidden_size], any floating dtype, any device.
        num_heads: number of heads (``num_kv_heads`` for a grouped-query key projection).

    Returns:
        ``weight``, modified in place.

    Raises:
        ValueError: as :func:`head_wise_orthogonal_`.
    """
    head_dim = _check_weight(weight, num_heads)
    u, _, vh = torch.linalg.svd(weight.detach().to(torch.float64).view(num_heads, head_dim, -1), full_matrices=False)
    weight.copy_((u @ vh).view_as(weight).to(weight.dtype))  # (nh, hd, hd) @ (nh, hd, hidden)
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


#: Mimetic initialization's constants for query/key (Trockman & Kolter 2023): the product
#: ``W_q^T W_k`` of each head is the best rank-``head_dim`` approximation of
#: ``MIMETIC_NOISE * Z + MIMETIC_IDENTITY * I`` with ``Z_ij ~ N(0, 1/hidden_size)``. 0.7 / 0.7 are the
#: values the paper gives for its vision transformers (alpha_1 = beta_1 = 0.7 for Q/K; alpha_2 =
#: beta_2 = 0.4 for V/O), as recalled from the paper, not re-derived or tuned for language here.
MIMETIC_NOISE = 0.7
MIMETIC_IDENTITY = 0.7
#: Mimetic initialization's constants for value/output (alpha_2 = beta_2 = 0.4, the same source and
#: the same caveat as :data:`MIMETIC_NOISE`): ``W_v^T W_o^T ≈ MIMETIC_VO_NOISE * Z - MIMETIC_VO_IDENTITY * I``.
MIMETIC_VO_NOISE = 0.4
MIMETIC_VO_IDENTITY = 0.4


def _sign_fixed_svd(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``U, S, V^T`` of ``matrix`` (float64) with each singular pair's sign fixed: the largest-magnitude
    entry of every column of ``U`` is positive (``V^T``'s row flipped with it, so ``U S V^T`` is
    unchanged). The SVD is unique only up to these signs; fixing them makes the factors, not just
    their product, a function of the input."""
    u, s, vh = torch.linalg.svd(matrix)
    rows = u.abs().argmax(dim=0)  # (n,) where each column peaks
    signs = torch.sign(u[rows, torch.arange(u.shape[1])])
    signs[signs == 0] = 1.0
    return u * signs, s, vh * signs.unsqueeze(1)


@torch.no_grad()
def mimetic_(
    query: torch.Tensor,
    key: torch.Tensor,
    num_heads: int,
    *,
    noise: float = MIMETIC_NOISE,
    identity: float = MIMETIC_IDENTITY,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mimetic initialization of a query/key pair (in place): ``W_q,h^T W_k,h ≈ identity * I + noise * Z_h``.

    Trockman & Kolter, "Mimetic Initialization of Self-Attention Layers", ICML 2023 (arXiv
    2305.09828): pretrained self-attention layers have a query-key product close to a multiple of
    the identity (each token attends to tokens like itself), and initializing it that way trains
    small transformers faster. For each head ``h`` a fresh ``Z_h`` ([hidden, hidden], entries
    N(0, 1/hidden)) is drawn and the target ``M_h = noise * Z_h + identity * I`` is factored by a
    (sign-fixed) SVD ``M_h = U S V^T``; the head's rows become::

        W_q,h = sqrt(S_k) U_k^T      W_k,h = sqrt(S_k) V_k^T        # [head_dim, hidden] each

    with ``k = head_dim`` (the top singular triplets), so ``W_q,h^T W_k,h = U_k S_k V_k^T``, the best
    rank-``head_dim`` approximation of ``M_h``; with ``head_dim == hidden`` it is ``M_h`` itself.
    In ``nn.Linear`` layout the attention logit of tokens ``x_i, x_j`` in head ``h`` is
    ``x_i W_q,h^T W_k,h x_j^T / sqrt(head_dim)``. Value/output projections are left as they are: the
    paper's ``W_v W_o ≈ -I`` half is :func:`mimetic_value_output_`. Draws are made on the CPU in float32 from
    ``generator`` (as :func:`normal_`), the SVD in float64.

    Args:
        query / key: [num_heads * head_dim, hidden_size] each (same shape: grouped-query attention,
            where the key has fewer heads, is not supported).
        num_heads: number of heads.
        noise / identity: the constants (defaults :data:`MIMETIC_NOISE`, :data:`MIMETIC_IDENTITY`).
        generator: optional CPU ``torch.Generator``.

    Returns:
        ``(query, key)``, modified in place.

    Raises:
        ValueError: different shapes, or as :func:`head_wise_orthogonal_`.
    """
    if query.shape != key.shape:
        raise ValueError(
            f"mimetic initialization pairs each query head with one key head; query {tuple(query.shape)} and key "
            f"{tuple(key.shape)} differ (grouped-query attention is not supported)"
        )
    head_dim = _check_weight(query, num_heads)
    hidden = query.shape[1]
    eye = torch.eye(hidden, dtype=torch.float64)
    q_out = torch.empty(num_heads, head_dim, hidden, dtype=torch.float64)
    k_out = torch.empty_like(q_out)
    for h in range(num_heads):
        z = torch.randn(hidden, hidden, generator=generator, dtype=torch.float32).to(torch.float64) / math.sqrt(hidden)
        u, s, vh = _sign_fixed_svd(noise * z + identity * eye)
        root = s[:head_dim].sqrt()  # (hd,)
        q_out[h] = u[:, :head_dim].T * root.unsqueeze(1)  # (hd, hidden)
        k_out[h] = vh[:head_dim] * root.unsqueeze(1)  # (hd, hidden)
    query.copy_(q_out.view_as(query).to(device=query.device, dtype=query.dtype))
    key.copy_(k_out.view_as(key).to(device=key.device, dtype=key.dtype))
    return query, key


@torch.no_grad()
def mimetic_value_output_(
    value: torch.Tensor,
    output: torch.Tensor,
    *,
    noise: float = MIMETIC_VO_NOISE,
    identity: float = MIMETIC_VO_IDENTITY,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mimetic initialization of a value/output pair (in place): the value-output map ``≈ noise * Z - identity * I``.

    The second half of Trockman & Kolter, "Mimetic Initialization of Self-Attention Layers", ICML
    2023 (arXiv 2305.09828): in pretrained vision transformers the product of the value and the
    attention-output projections is close to a negative multiple of the identity. Unlike the
    query-key product it spans all heads at once (the heads' values are concatenated before the
    output projection), so one ``Z`` ([hidden, hidden], entries N(0, 1/hidden)) is drawn per
    attention module and ``M = noise * Z - identity * I`` is factored by a (sign-fixed) SVD
    ``M = U S V^T``; in ``nn.Linear`` layout::

        value  = sqrt(S) U^T        # [hidden, hidden] (num_heads * head_dim == hidden)
        output = V sqrt(S)          # [hidden, hidden]

    so a token that attends only to itself is mapped to ``x value^T output^T = x U S V^T = x M``
    (row vectors, biases aside). Draws are made on the CPU in float32 from ``generator``, the SVD in
    float64, as :func:`mimetic_`. Biases are left as they are.

    Args:
        value: the value projection's weight, [hidden_size, hidden_size].
        output: the attention-output projection's weight, [hidden_size, hidden_size].
        noise / identity: the constants (defaults :data:`MIMETIC_VO_NOISE`, :data:`MIMETIC_VO_IDENTITY`).
        generator: optional CPU ``torch.Generator``.

    Returns:
        ``(value, output)``, modified in place.

    Raises:
        ValueError: either weight is not square, or their shapes differ (a value projection
            narrower than the model, as under grouped-query attention, is not supported).
    """
    if value.dim() != 2 or value.shape[0] != value.shape[1] or value.shape != output.shape:
        raise ValueError(
            f"mimetic value/output initialization needs square [hidden, hidden] value and output weights; got value "
            f"{tuple(value.shape)} and output {tuple(output.shape)}"
        )
    hidden = value.shape[1]
    z = torch.randn(hidden, hidden, generator=generator, dtype=torch.float32).to(torch.float64) / math.sqrt(hidden)
    u, s, vh = _sign_fixed_svd(noise * z - identity * torch.eye(hidden, dtype=torch.float64))
    root = s.sqrt()  # (hidden,)
    value.copy_((u.T * root.unsqueeze(1)).to(device=value.device, dtype=value.dtype))
    output.copy_((vh.T * root.unsqueeze(0)).to(device=output.device, dtype=output.dtype))
    return value, output


# --------------------------------------------------------------------------------------------
# The init kinds: one table that the method (oelm.method), the config schema (oelm.config) and the
# lean-checkpoint regeneration (oelm.checkpoint) read
# --------------------------------------------------------------------------------------------

WeightInit = Callable[[torch.Tensor, int, "torch.Generator | None", "float | str"], object]
PairInit = Callable[[torch.Tensor, torch.Tensor, int, int, "torch.Generator | None"], object]


@dataclass(frozen=True)
class Initializer(InitKind):
    """An init kind (:class:`~oelm.method.config.InitKind`: name, summary, source, ``draws_random``,
    ``pairs``) with its functions.

    Attributes:
        weight: ``f(weight, num_heads, generator, normal_std)``, applied to each target projection
            in place (the key with its own head count), or None.
        pair: ``f(query, key, num_heads, num_kv_heads, generator)``, applied once per attention
            module to both projections (needs both targets), or None. Neither: weights kept.
    """

    weight: WeightInit | None = None
    pair: PairInit | None = None


def _kind(name: str, weight: WeightInit | None = None, pair: PairInit | None = None) -> Initializer:
    """The declared kind ``name`` (:data:`~oelm.method.config.INIT_KINDS`) with its functions."""
    return Initializer(**vars(INIT_KINDS[name]), weight=weight, pair=pair)


def _random_orthogonal(weight: torch.Tensor, heads: int, generator: torch.Generator | None, std: float | str) -> None:
    normal_(weight, std=1.0, generator=generator)
    head_wise_orthogonal_(weight, heads)


def _mimetic_pair(query: torch.Tensor, key: torch.Tensor, heads: int, kv_heads: int, generator: torch.Generator | None) -> None:
    if kv_heads != heads:
        raise UnsupportedModelError(
            f"init='mimetic' pairs every query head with its own key head, but this attention has {heads} query and "
            f"{kv_heads} key/value heads (grouped-query attention); use another init for this model"
        )
    mimetic_(query, key, heads, generator=generator)


#: Every init kind's functions, by name, in :data:`~oelm.method.config.INIT_KINDS`' order.
INITS: dict[str, Initializer] = {
    kind.name: kind
    for kind in (
        _kind("none"),
        _kind("orthogonalize", weight=lambda w, h, g, std: head_wise_orthogonal_(w, h)),
        _kind("orthogonalize_rescaled", weight=lambda w, h, g, std: rescaled_head_wise_orthogonal_(w, h)),
        _kind("polar", weight=lambda w, h, g, std: polar_head_wise_(w, h)),
        _kind("random_orthogonal", weight=_random_orthogonal),
        _kind("global_orthogonal", weight=lambda w, h, g, std: global_orthogonal_(w)),
        _kind("normal", weight=lambda w, h, g, std: normal_(w, std=std, generator=g)),
        _kind("mimetic", pair=_mimetic_pair),
    )
}
if tuple(INITS) != INIT_NAMES or any(kind.pairs != (kind.pair is not None) for kind in INITS.values()):
    raise ImportError(f"oelm.method.init.INITS defines {tuple(INITS)} but oelm.method.config.INIT_KINDS declares "
                      f"{INIT_NAMES}; give every declared kind its functions, in the table's order (a pair function "
                      "exactly for the kinds declared pairs=True)")
