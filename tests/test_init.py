"""Initializers: head-wise orthogonality, sign-fix determinism, scale-matched normal draws, the rescaled
and mimetic inits, and the one init table the config schema, the method and the checkpoint read."""

from __future__ import annotations

import math

import pytest
import torch

from oelm.method.config import INIT_KINDS, INIT_NAMES
from oelm.method.init import (
    INITS,
    MIMETIC_IDENTITY,
    MIMETIC_NOISE,
    MIMETIC_VO_IDENTITY,
    MIMETIC_VO_NOISE,
    global_orthogonal_,
    head_wise_orthogonal_,
    matched_std,
    max_orthogonality_error,
    mimetic_,
    mimetic_value_output_,
    normal_,
    polar_head_wise_,
    rescaled_head_wise_orthogonal_,
)


@pytest.mark.parametrize(
    "num_heads,head_dim,hidden",
    [(1, 8, 8), (4, 16, 64), (12, 32, 384), (8, 64, 512), (3, 5, 17), (16, 4, 64), (2, 48, 50)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_head_wise_rows_orthonormal(num_heads, head_dim, hidden, dtype):
    g = torch.Generator().manual_seed(num_heads * 1000 + head_dim + hidden)
    w = torch.randn(num_heads * head_dim, hidden, generator=g, dtype=dtype) * 0.02
    head_wise_orthogonal_(w, num_heads)
    blocks = w.double().view(num_heads, head_dim, hidden)
    for h in range(num_heads):
        gram = blocks[h] @ blocks[h].T
        assert torch.allclose(gram, torch.eye(head_dim, dtype=torch.float64), atol=1e-5)
    assert max_orthogonality_error(w, num_heads) < 1e-5
    assert w.dtype == dtype


def test_random_shapes_property():
    g = torch.Generator().manual_seed(0)
    for _ in range(25):
        nh = int(torch.randint(1, 13, (1,), generator=g))
        hd = int(torch.randint(1, 65, (1,), generator=g))
        hidden = hd + int(torch.randint(0, 200, (1,), generator=g))
        w = torch.randn(nh * hd, hidden, generator=g)
        head_wise_orthogonal_(w, nh)
        assert max_orthogonality_error(w, nh) < 1e-5, (nh, hd, hidden)


def test_heads_are_independent_not_globally_orthogonal():
    # Head-wise QR does not make different heads orthogonal to each other.
    torch.manual_seed(0)
    w = torch.randn(4 * 8, 64)
    head_wise_orthogonal_(w, 4)
    assert max_orthogonality_error(w, 4) < 1e-5
    assert max_orthogonality_error(w, 1) > 0.05  # rows of different heads still overlap


def test_sign_fix_is_deterministic_and_idempotent():
    torch.manual_seed(1)
    w = torch.randn(6 * 8, 48)
    a = head_wise_orthogonal_(w.clone(), 6)
    b = head_wise_orthogonal_(w.clone(), 6)
    assert torch.equal(a, b)
    # A matrix that is already orthonormal per head with diag(R) > 0 is a fixed point.
    c = head_wise_orthogonal_(a.clone(), 6)
    assert torch.allclose(a, c, atol=1e-6)
    # Sign fix: each head's R factor has a non-negative diagonal, so flipping the sign of the
    # input's rows flips the output rows (the result depends on the input, not on LAPACK's signs).
    d = head_wise_orthogonal_(-w.clone(), 6)
    assert torch.allclose(d, -a, atol=1e-6)


def test_orthogonalize_keeps_each_heads_row_space():
    torch.manual_seed(2)
    w = torch.randn(4 * 8, 40)
    q = head_wise_orthogonal_(w.clone(), 4)
    for h in range(4):
        W, Q = w[h * 8 : (h + 1) * 8].double(), q[h * 8 : (h + 1) * 8].double()
        proj = Q.T @ Q  # projector onto Q's row space
        assert torch.allclose(W @ proj, W, atol=1e-6)


def test_global_orthogonal_rows_and_columns():
    torch.manual_seed(3)
    wide = global_orthogonal_(torch.randn(32, 64))
    assert torch.allclose(wide.double() @ wide.double().T, torch.eye(32, dtype=torch.float64), atol=1e-5)
    tall = global_orthogonal_(torch.randn(64, 32))
    assert torch.allclose(tall.double().T @ tall.double(), torch.eye(32, dtype=torch.float64), atol=1e-5)


def test_normal_std_and_matched_row_norm():
    g = torch.Generator().manual_seed(0)
    w = normal_(torch.empty(512, 768), std=0.02, generator=g)
    assert abs(w.std().item() - 0.02) < 0.001
    m = normal_(torch.empty(512, 768), std="matched", generator=torch.Generator().manual_seed(0))
    assert matched_std(768) == pytest.approx(1 / math.sqrt(768))
    row_norms = m.norm(dim=1)
    assert abs(row_norms.mean().item() - 1.0) < 0.02  # same scale as orthonormal rows
    # std 0.02 rows are ~0.55 long at hidden 768: the original ablation changed the scale.
    assert abs(w.norm(dim=1).mean().item() - 0.02 * math.sqrt(768)) < 0.02


def test_normal_reproducible_with_generator():
    a = normal_(torch.empty(8, 8), generator=torch.Generator().manual_seed(5))
    b = normal_(torch.empty(8, 8), generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)


@pytest.mark.parametrize(
    "shape,heads,match",
    [((10, 8), 3, "not divisible"), ((16, 4), 2, "exceeds hidden_size"), ((4,), 1, "2-D"), ((8, 8), 0, "positive")],
)
def test_bad_shapes_raise_clear_errors(shape, heads, match):
    with pytest.raises(ValueError, match=match):
        head_wise_orthogonal_(torch.randn(*shape), heads)


def test_normal_rejects_bad_std():
    with pytest.raises(ValueError, match="std"):
        normal_(torch.empty(4, 4), std=-1.0)


# ---------------------------------------------------------------- rescaled orthogonal (oelm_rescaled)


@pytest.mark.parametrize("num_heads,head_dim,hidden", [(4, 16, 64), (12, 32, 384), (3, 5, 17)])
def test_rescaled_keeps_each_heads_frobenius_norm_and_orthogonal_rows(num_heads, head_dim, hidden):
    g = torch.Generator().manual_seed(hidden)
    scales = torch.rand(num_heads, 1, 1, generator=g, dtype=torch.float64) * 3 + 0.1  # heads of different scale
    w = (torch.randn(num_heads, head_dim, hidden, generator=g, dtype=torch.float64) * scales).view(-1, hidden)
    before = w.clone()
    rescaled_head_wise_orthogonal_(w, num_heads)
    for h in range(num_heads):
        b0, b = before.view(num_heads, head_dim, hidden)[h], w.view(num_heads, head_dim, hidden)[h]
        assert torch.allclose(torch.linalg.matrix_norm(b), torch.linalg.matrix_norm(b0), rtol=1e-12)
        gram = b @ b.T  # orthogonal rows, all of norm ||W_h||_F / sqrt(head_dim)
        assert torch.allclose(gram, torch.eye(head_dim, dtype=torch.float64) * gram[0, 0], atol=1e-10)
        assert torch.allclose(b0 @ torch.linalg.pinv(b) @ b, b0, atol=1e-8)  # same row space as the pretrained head
    unit = head_wise_orthogonal_(before.clone(), num_heads).view(num_heads, head_dim, hidden)
    direction = w.view(num_heads, head_dim, hidden) / torch.linalg.matrix_norm(w.view(num_heads, head_dim, hidden)).view(-1, 1, 1)
    assert torch.allclose(direction * math.sqrt(head_dim), unit, atol=1e-10)  # oelm_freeze's rows, scaled


# ---------------------------------------------------------------- polar factor (oelm_polar)


def _heads(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    return w.double().view(num_heads, w.shape[0] // num_heads, w.shape[1])


@pytest.mark.parametrize("num_heads,head_dim,hidden", [(1, 8, 8), (4, 16, 64), (3, 5, 17), (2, 48, 50)])
def test_polar_is_the_nearest_orthonormal_rows_closer_than_qr_same_row_space(num_heads, head_dim, hidden):
    g = torch.Generator().manual_seed(hidden + 7)
    scales = torch.rand(num_heads, 1, 1, generator=g, dtype=torch.float64) * 3 + 0.1
    w = (torch.randn(num_heads, head_dim, hidden, generator=g, dtype=torch.float64) * scales).view(-1, hidden)
    polar = _heads(polar_head_wise_(w.clone(), num_heads), num_heads)
    qr = _heads(head_wise_orthogonal_(w.clone(), num_heads), num_heads)
    assert max_orthogonality_error(polar.reshape_as(w), num_heads) < 1e-12
    for h, (w_h, p_h, q_h) in enumerate(zip(_heads(w, num_heads), polar, qr)):
        s = torch.linalg.svdvals(w_h)
        # the minimum over all matrices with orthonormal rows (von Neumann's trace inequality): sum (s_i - 1)^2
        assert torch.isclose(torch.linalg.matrix_norm(w_h - p_h) ** 2, ((s - 1) ** 2).sum(), rtol=1e-10)
        assert torch.linalg.matrix_norm(w_h - p_h) < torch.linalg.matrix_norm(w_h - q_h) - 1e-6, h  # QR's basis is farther
        assert torch.allclose(w_h @ torch.linalg.pinv(p_h) @ p_h, w_h, atol=1e-8)  # the head's own row space
        rotation = torch.linalg.qr(torch.randn(head_dim, head_dim, generator=g, dtype=torch.float64))[0]
        assert torch.linalg.matrix_norm(w_h - rotation @ p_h) >= torch.linalg.matrix_norm(w_h - p_h) - 1e-12


def test_polar_keeps_orthonormal_rows_and_ignores_the_svd_signs():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(4 * 8, 32, generator=g, dtype=torch.float64)
    orthonormal = head_wise_orthogonal_(w.clone(), 4)
    assert torch.allclose(polar_head_wise_(orthonormal.clone(), 4), orthonormal, atol=1e-12, rtol=0)  # already the nearest
    polar = _heads(polar_head_wise_(w.clone(), 4), 4)
    for w_h, p_h in zip(_heads(w, 4), polar):
        u, _, vh = torch.linalg.svd(w_h, full_matrices=False)
        signs = torch.where(torch.rand(8, generator=g) < 0.5, -1.0, 1.0).double()  # any sign choice of the SVD
        assert torch.allclose((u * signs) @ (vh * signs[:, None]), p_h, atol=1e-12, rtol=0)
    again = polar_head_wise_(w.clone(), 4)
    assert again.numpy().tobytes() == polar.reshape_as(w).numpy().tobytes()  # deterministic: no draw
    as_float = polar_head_wise_(w.float(), 4)
    assert as_float.dtype == torch.float32 and max_orthogonality_error(as_float, 4) < 1e-6


def test_polar_per_head_with_the_keys_own_head_count():
    """Grouped-query attention: a key projection of 2 heads is 2 blocks of head_dim rows, not 4 of half that."""
    g = torch.Generator().manual_seed(5)
    key = torch.randn(2 * 8, 32, generator=g)
    polar_head_wise_(key, 2)
    assert max_orthogonality_error(key, 2) < 1e-6
    assert max_orthogonality_error(key, 1) > 0.1  # the two heads are not orthogonal to each other
    with pytest.raises(ValueError, match="not divisible by num_heads=3"):
        polar_head_wise_(key, 3)


# ---------------------------------------------------------------- mimetic (Trockman & Kolter 2023)


def test_mimetic_single_full_width_head_is_identity_plus_noise():
    """head_dim == hidden: no truncation, so W_q^T W_k = 0.7 Z + 0.7 I with Z_ij ~ N(0, 1/hidden) exactly."""
    hidden = 64
    q, k = torch.empty(hidden, hidden, dtype=torch.float64), torch.empty(hidden, hidden, dtype=torch.float64)
    mimetic_(q, k, 1, generator=torch.Generator().manual_seed(3))
    m = q.T @ k  # [hidden, hidden], the bilinear form of the attention logits
    diag, off = torch.diagonal(m), m[~torch.eye(hidden, dtype=torch.bool)]
    # identity component: mean diagonal = 0.7 + mean of 64 draws N(0, 0.7^2/64) (std 0.011)
    assert abs(diag.mean().item() - MIMETIC_IDENTITY) < 0.05
    assert abs(off.mean().item()) < 0.01 and abs(off.std().item() - MIMETIC_NOISE / math.sqrt(hidden)) < 0.01
    z = torch.randn(hidden, hidden, generator=torch.Generator().manual_seed(3)).double() / math.sqrt(hidden)
    assert torch.allclose(m, MIMETIC_NOISE * z + MIMETIC_IDENTITY * torch.eye(hidden, dtype=torch.float64), atol=1e-10)


def test_mimetic_heads_are_the_best_rank_head_dim_approximation_and_lean_towards_the_identity():
    nh, hd, hidden = 4, 8, 32
    q, k = torch.empty(nh * hd, hidden), torch.empty(nh * hd, hidden)
    mimetic_(q, k, nh, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(0)  # the same draws, one Z per head in head order
    eye = torch.eye(hidden, dtype=torch.float64)
    for h in range(nh):
        z = torch.randn(hidden, hidden, generator=g).double() / math.sqrt(hidden)
        u, s, vh = torch.linalg.svd(MIMETIC_NOISE * z + MIMETIC_IDENTITY * eye)
        best = u[:, :hd] @ torch.diag(s[:hd]) @ vh[:hd]  # Eckart-Young: the best rank-hd approximation
        m = q[h * hd:(h + 1) * hd].double().T @ k[h * hd:(h + 1) * hd].double()
        assert torch.allclose(m, best, atol=1e-5)
        cosine = torch.trace(m) / (torch.linalg.matrix_norm(m) * math.sqrt(hidden))  # cos(M_h, I)
        assert cosine > 0.25, cosine  # a random pair of this shape has |cos| of order 0.06
    with torch.no_grad():  # seeded: the same generator state gives the same bytes
        q2, k2 = torch.empty_like(q), torch.empty_like(k)
        mimetic_(q2, k2, nh, generator=torch.Generator().manual_seed(0))
    assert torch.equal(q, q2) and torch.equal(k, k2)


def test_mimetic_refuses_grouped_query_shapes():
    with pytest.raises(ValueError, match="grouped-query"):
        mimetic_(torch.empty(32, 32), torch.empty(16, 32), 4)


def test_mimetic_value_output_map_is_minus_identity_plus_noise_across_heads():
    """The value-output half: a token attending only to itself is mapped by x value^T output^T, which
    must equal 0.4 Z - 0.4 I (one Z for the whole module, not per head) with the same draws."""
    hidden = 48
    v, o = torch.empty(hidden, hidden), torch.empty(hidden, hidden)
    mimetic_value_output_(v, o, generator=torch.Generator().manual_seed(5))
    m = v.double().T @ o.double().T  # [hidden, hidden]: row vector x -> x @ m
    z = torch.randn(hidden, hidden, generator=torch.Generator().manual_seed(5)).double() / math.sqrt(hidden)
    assert torch.allclose(m, MIMETIC_VO_NOISE * z - MIMETIC_VO_IDENTITY * torch.eye(hidden, dtype=torch.float64), atol=1e-5)
    x = torch.randn(3, hidden, generator=torch.Generator().manual_seed(1))
    through = torch.nn.functional.linear(torch.nn.functional.linear(x, v), o)  # what nn.Linear v_proj then o_proj do
    assert torch.allclose(through.double(), x.double() @ m, atol=1e-5)
    cosine = torch.trace(m) / (torch.linalg.matrix_norm(m) * math.sqrt(hidden))
    assert cosine < -0.5, cosine  # leans towards -I (0.4 / sqrt(0.4^2 + 0.4^2) ~ 0.71)
    v2, o2 = torch.empty_like(v), torch.empty_like(o)
    mimetic_value_output_(v2, o2, generator=torch.Generator().manual_seed(5))
    assert torch.equal(v, v2) and torch.equal(o, o2)


def test_mimetic_value_output_refuses_non_square_weights():
    with pytest.raises(ValueError, match="square"):
        mimetic_value_output_(torch.empty(16, 32), torch.empty(32, 16))


# ---------------------------------------------------------------- the init table


def test_one_init_table_feeds_the_config_schema_the_method_and_the_checkpoint():
    from typing import get_args

    from oelm.checkpoint import RANDOM_INITS as CHECKPOINT_RANDOM
    from oelm.config import MethodEntry
    from oelm.method import METHODS, OELMConfig

    assert INIT_NAMES == tuple(INITS)
    declared = [(k.name, k.summary, k.source, k.draws_random, k.pairs) for k in INIT_KINDS.values()]
    assert [(k.name, k.summary, k.source, k.draws_random, k.pairs) for k in INITS.values()] == declared
    assert set(get_args(get_args(MethodEntry.model_fields["init"].annotation)[0])) == set(INITS)  # the YAML's allowed values
    assert CHECKPOINT_RANDOM == {name for name, kind in INITS.items() if kind.draws_random}
    assert {"random_orthogonal", "normal", "mimetic"} <= CHECKPOINT_RANDOM and "orthogonalize" not in CHECKPOINT_RANDOM
    for kind in INITS.values():
        assert kind.source and kind.summary
        assert not (kind.weight and kind.pair) and kind.pairs == (kind.pair is not None)
        OELMConfig(init=kind.name)  # every kind is a valid method init
    assert {m.init for m in METHODS.values()} <= set(INITS)
