"""A learned temperature per query head (``oelm_temperature``): frozen orthonormal Q/K and one
trainable scalar ``tau_h`` per query head multiplying that head's attention logits.

Why. oelm's own mechanism finding (docs/research.md, MiniLM-L6 on SST-2): orthonormalizing each
head's pretrained Q/K rows (QR) costs 4.16 points against the pretrained Q/K frozen as they are, and
putting each head back at its pretrained Frobenius norm (``oelm_rescaled``) recovers 2.92 of them:
most of the cost is the attention's temperature. A learned scalar per head lets training set that
temperature while the frozen Q/K stay orthonormal (their bytes are ``oelm_freeze``'s). Related
work: Henry et al., "Query-Key Normalization for Transformers" (Findings of EMNLP 2020) learn one
scalar that multiplies the logits of l2-normalized queries and keys.

How. A parameter ``head_temperature`` ([num_heads], the weight's dtype, trainable) is registered
on the query projection (an ``nn.Linear``; GPT-2's and GPT-NeoX's split query), so every other
parameter keeps its name, and a forward hook (:func:`scale_query_heads`, a module-level function:
the model still pickles and deep-copies) multiplies head ``h``'s slice of the projection's output,
weight and bias part, by ``tau_h``::

    q = query(x): [..., num_heads * head_dim]  ->  q[..., h*head_dim:(h+1)*head_dim] *= tau_h

So every bilinear term between a query-projection output and a key-projection output is scaled by
``tau_h``: the content logits ``q_h . k_g / sqrt(head_dim)`` (a rotary embedding rotates each head's
q linearly, so it commutes), and in DeBERTa-v2 the position terms made with the same query/key
projections. What is added to the logits outside such a product is not scaled: T5's relative
position bias, DeBERTa's terms made with its own ``pos_*_proj``. An attention that normalizes q after
the projection (a ``q_norm`` / QK-LayerNorm child, e.g. Phi with ``qk_layernorm``) would cancel
``tau`` and is refused (:func:`refuse_normalized_queries`).

Init (``OELMConfig.head_temperature``):

* ``"norm_ratio"`` (:data:`NORM_RATIO`): ``tau_h = a_h * b_g`` where ``a_h = ||W_q,h||_F before the
  init / after it`` (orthonormal rows: ``||W_q,h||_F / sqrt(head_dim)``), ``b_g`` the same for the key
  head ``g = h // (num_heads / num_kv_heads)`` that query head ``h`` reads (grouped-query attention),
  and the biases become ``b_q,h / a_h`` and ``b_k,g / b_g``. Expanding,
  ``tau_h (Q_h x + b_q,h / a_h) . (K_g y + b_k,g / b_g) = (a_h Q_h x + b_q,h) . (b_g K_g y + b_k,g)``:
  step 0 computes ``oelm_rescaled``'s logits (orthonormal rows at the pretrained norm, biases kept)
  up to float rounding. With ``init="none"`` every ratio is 1; a head with zero weights gets 1.
* a positive number: every ``tau_h`` starts there and the biases are kept; ``1.0`` makes step 0 equal
  ``oelm_freeze`` (a model trained from scratch, whose default-init norms mean nothing).

The way out, :func:`oelm.merge_and_unload`, folds ``tau_h`` into the query rows and bias
(:func:`fold_head_temperatures`), so a stock ``from_pretrained`` reproduces the logits.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from oelm.architectures import find_attention_projections
from oelm.architectures.sites import ProjectionSite
from oelm.errors import UnsupportedModelError
from oelm.method.config import NORM_RATIO

__all__ = ["TEMPERATURE_NAME", "UNFOLDED", "head_norms", "add_head_temperatures_", "scale_query_heads",
           "has_head_temperature", "fold_head_temperatures", "fold_saved_temperatures", "unfold_saved_temperatures",
           "refuse_normalized_queries"]

#: The parameter's name on the query projection module.
TEMPERATURE_NAME = "head_temperature"
#: In a saved state dict, the prefix of the exact (unfolded) query weight / bias names beside the
#: folded stock ones (``<query>.unfolded_weight``): :func:`fold_saved_temperatures`.
UNFOLDED = "unfolded_"
# Children of an attention module that normalize q after the projection (Phi's q_layernorm,
# Qwen3 / Gemma 3 / OLMo 2's q_norm, ...): the norm would cancel tau.
_QUERY_NORM = re.compile(r"^(q|query)_?(norm|layernorm|layer_norm|ln)$")


def refuse_normalized_queries(model: nn.Module) -> None:
    """Refuse a model whose attention normalizes q after the projection (before anything changes).

    Raises:
        UnsupportedModelError: names the attention module and its normalizing child.
    """
    modules = dict(model.named_modules())
    for site in find_attention_projections(model):
        for child, _ in modules[site.attention_name].named_children():
            if _QUERY_NORM.match(child):
                raise UnsupportedModelError(
                    f"head_temperature: {site.attention_name}.{child} normalizes the query after its projection, which "
                    "would cancel a per-head temperature on it; use oelm_freeze or oelm_rescaled for this model")


def _frobenius(linear: nn.Linear, heads: int) -> torch.Tensor:
    """``[heads]`` float64 CPU: each head's Frobenius norm."""
    w = linear.weight.detach().to(device="cpu", dtype=torch.float64)
    return torch.linalg.matrix_norm(w.view(heads, -1, w.shape[1]))


def head_norms(sites: list[ProjectionSite]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per site ``(query norms [num_heads], key norms [num_kv_heads])``, float64: taken before the
    init, for :func:`add_head_temperatures_`'s ``"norm_ratio"``."""
    return [(_frobenius(s.query, s.num_heads), _frobenius(s.key, s.num_kv_heads)) for s in sites]


def _ratio(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    ok = (before > 0) & (after > 0)
    return torch.where(ok, before / torch.where(ok, after, 1.0), torch.ones_like(before))


@torch.no_grad()
def _divide_heads_(bias: torch.Tensor | None, ratio: torch.Tensor) -> None:
    """``bias`` ([heads * head_dim]) divided head by head by ``ratio`` ([heads]), in float64."""
    if bias is None:
        return
    rows = ratio.repeat_interleave(bias.shape[0] // ratio.shape[0]).to(bias.device)
    bias.copy_((bias.detach().to(torch.float64) / rows).to(bias.dtype))


@torch.no_grad()
def add_head_temperatures_(sites: list[ProjectionSite], init: float | str,
                           before: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
    """Give every site's query projection a trainable ``head_temperature`` ([num_heads]) and the
    hook that applies it; with ``"norm_ratio"`` divide the query/key biases (module docstring).

    Args:
        sites: split sites (``query`` / ``key`` are ``nn.Linear``), after the Q/K init.
        init: ``"norm_ratio"`` or a positive number.
        before: :func:`head_norms` of the sites before the init (needed for ``"norm_ratio"``).
    """
    for i, s in enumerate(sites):
        query = s.query
        if init == NORM_RATIO:
            a = _ratio(before[i][0], _frobenius(query, s.num_heads))  # (nh,)
            b = _ratio(before[i][1], _frobenius(s.key, s.num_kv_heads))  # (nkv,)
            tau = a * b.repeat_interleave(s.num_heads // s.num_kv_heads)  # query head h reads key head h // group
            _divide_heads_(query.bias, a)
            _divide_heads_(s.key.bias, b)
        else:
            tau = torch.full((s.num_heads,), float(init), dtype=torch.float64)
        param = nn.Parameter(tau.to(device=query.weight.device, dtype=query.weight.dtype))
        query.register_parameter(TEMPERATURE_NAME, param)
        query.register_forward_hook(scale_query_heads)


def scale_query_heads(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    """Forward hook of a query projection with ``head_temperature``: ``output`` ([..., num_heads *
    head_dim]) with head ``h``'s slice multiplied by ``tau_h`` (cast to ``output``'s dtype)."""
    tau = getattr(module, TEMPERATURE_NAME)
    heads = output.unflatten(-1, (tau.shape[0], -1))  # (..., nh, hd)
    return (heads * tau.to(output.dtype).unsqueeze(-1)).flatten(-2)


def has_head_temperature(module: nn.Module) -> bool:
    """True when ``module`` holds a ``head_temperature`` parameter."""
    return TEMPERATURE_NAME in module._parameters


def _scaled_rows(value: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """``value`` ([heads * head_dim, ...]: a query weight or bias) with head ``h``'s rows multiplied
    by ``tau_h`` ([heads]), in float64, cast back to ``value``'s dtype: a new tensor."""
    tau = tau.detach().to(torch.float64)
    rows = tau.repeat_interleave(value.shape[0] // tau.shape[0]).to(value.device)
    return (value.detach().to(torch.float64) * rows.view(-1, *[1] * (value.dim() - 1))).to(value.dtype)


@torch.no_grad()
def fold_head_temperatures(model: nn.Module) -> list[str]:
    """Fold every ``head_temperature`` into its query projection (in place): head ``h``'s weight rows
    and bias multiplied by ``tau_h`` (in float64), the parameter and its hook removed. The
    projection's output is unchanged up to rounding. Returns the names of the folded modules."""
    folded = []
    for name, module in model.named_modules():
        if not has_head_temperature(module):
            continue
        tau = getattr(module, TEMPERATURE_NAME)
        for p in (module.weight, getattr(module, "bias", None)):
            if p is not None:
                p.copy_(_scaled_rows(p, tau))
        for key, hook in list(module._forward_hooks.items()):
            if hook is scale_query_heads:
                del module._forward_hooks[key]
                module._forward_hooks_always_called.pop(key, None)
        delattr(module, TEMPERATURE_NAME)
        folded.append(name)
    return folded


def fold_saved_temperatures(model: nn.Module, state_dict: dict[str, torch.Tensor], prefix: str = "") -> list[str]:
    """In place, on a state dict being saved (keys ``prefix`` + ``model``'s names): each tempered
    query projection's stock entries ``<query>.weight`` / ``.bias`` become ``tau``-folded copies
    (:func:`fold_head_temperatures`' arithmetic), so a stock ``from_pretrained``, which has no
    temperature, computes the trained model's logits; the exact entries move to
    ``<query>.unfolded_weight`` / ``.unfolded_bias`` and ``<query>.head_temperature`` stays, so oelm's
    loaders (:func:`unfold_saved_temperatures`) restore the model bit for bit. A projection whose
    entries are missing or live parameters (``keep_vars=True``) is left alone. Returns the folded
    projections' names (relative to ``model``)."""
    folded = []
    for name, module in model.named_modules():
        if not has_head_temperature(module):
            continue
        where = f"{prefix}{name}." if name else prefix
        keys = [where + t for t in ("weight", "bias") if getattr(module, t, None) is not None]
        tau, values = state_dict.get(where + TEMPERATURE_NAME), [state_dict.get(k) for k in keys]
        if any(v is None or isinstance(v, nn.Parameter) for v in (tau, *values)):
            continue
        for key, value in zip(keys, values):
            state_dict[key] = _scaled_rows(value, tau)
            state_dict[where + UNFOLDED + key.rpartition(".")[2]] = value
        folded.append(name)
    return folded


def unfold_saved_temperatures(state_dict: dict[str, torch.Tensor], prefix: str = "") -> None:
    """The inverse of :func:`fold_saved_temperatures`, in place: every ``<prefix>...unfolded_weight``
    / ``unfolded_bias`` entry replaces the folded ``...weight`` / ``...bias`` beside it."""
    ends = (f".{UNFOLDED}weight", f".{UNFOLDED}bias")
    for key in [k for k in state_dict if k.startswith(prefix) and k.endswith(ends)]:
        head, _, last = key.rpartition(".")
        state_dict[f"{head}.{last[len(UNFOLDED):]}"] = state_dict.pop(key)
