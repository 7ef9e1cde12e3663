"""Attention diagnostics of a model on one fixed batch: what the (frozen) query/key projections do.

Per attention site (:func:`oelm.architectures.find_attention_projections`: every registered
family, fused Q/K/V layouts included, and oelm's GPT with or without its fixed map) and per head:

* **entropy** (nats) of the attention distribution of each query position, averaged over the real
  query positions of the batch: ``H_i = -sum_j p_ij ln p_ij``. A uniform distribution over ``n``
  allowed keys has ``ln n`` (``uniform_entropy``: the mean of ``ln n`` over the same rows, padding
  and the causal mask respected); a one-hot one has 0.
* **logit scale**: the mean ``|q_i . k_j| / sqrt(head_dim)`` over the allowed (query, key) pairs:
  the temperature the query/key projections set. Computed from the projections' outputs (content
  logits: before a rotary embedding or a relative-position bias is added; T5, which does not divide
  by ``sqrt(head_dim)``, is divided here as well so that families compare). For oelm GPT's fixed map
  it is the mean ``|R_ij|`` of the map's scores over the allowed pairs.
* **effective rank** of the head's bilinear form ``M_h = W_q,h^T W_k,h`` (``[hidden, hidden]``; the
  score of tokens ``x_i, x_j`` is ``x_i^T M_h x_j / sqrt(head_dim)`` up to biases): ``exp`` of the
  Shannon entropy of its normalized singular values ``sigma_i / sum sigma`` (Roy & Vetterli, "The
  effective rank: a measure of effective dimensionality", EUSIPCO 2007). Between 1 and
  ``head_dim``; ``head_dim`` when every direction of the head's subspace counts equally.
* **overlap** with a reference model's query (key) projection (the pretrained checkpoint): the mean
  squared cosine of the principal angles between the row spaces of ``W_h`` and ``W_h^ref``,
  ``||P_a P_b||_F^2 / k`` (``P`` the orthogonal projectors, ``k`` the smaller rank). 1 for the same
  subspace (head-wise QR keeps it: ``oelm_freeze``), ``k / hidden_size`` expected for an unrelated
  random one (``E tr(P_a P_b) = k^2 / d`` for a uniformly random ``k``-subspace of ``R^d``).

Where the attention probabilities come from (``entropy_source``): a Hugging Face model is switched
to its ``eager`` attention for the pass (``set_attn_implementation``; restored afterwards) and
called with ``output_attentions=True``, and a forward hook on each site's attention module takes
the probabilities that module returns (the last 4-D element of its output tuple): exactly the
model's attention, with its position terms, scaling and masks (``"model"``). oelm's GPT uses SDPA,
which returns no probabilities: they are recomputed as ``softmax(Q K^T / sqrt(head_dim) + mask)``
from the captured projections, which is exactly what its attention computes (``"recomputed"``;
``"fixed map"`` for ``fixed_attention`` layers: ``softmax(R + mask)``). A site whose module returns no
probabilities even so (a custom architecture) is recomputed the same way, from content logits only.

Masks: a query row counts when its position is a real token (``attention_mask``, when the site's
query length equals the input's; all rows otherwise); a key is allowed when it is a real token
(same rule) and, for a causal site (the module's ``is_causal``, oelm's GPT, or probabilities that
are exactly 0 above the diagonal), not after the query.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn

from oelm.architectures import SplitQKV, architecture_of, find_attention_projections
from oelm.method.temperature import TEMPERATURE_NAME

__all__ = ["DIAGNOSTIC_EXAMPLES", "attention_entropy", "uniform_entropy", "effective_rank", "qk_effective_rank",
           "subspace_overlap", "qk_weights", "diagnostic_batch", "attention_diagnostics"]

#: Examples of the fixed batch: the first ones of the validation split, in dataset order (every run of
#: a matrix sees the same batch).
DIAGNOSTIC_EXAMPLES = 64
#: Bytes of attention probabilities one forward chunk may hold (all sites together); the batch is
#: run in chunks of as many examples as fit.
_CHUNK_BYTES = 256 * 2**20
_DIGITS = 5  # decimals kept in the record


# --- the quantities, as pure tensor functions -----------------------------------------------------

def attention_entropy(probs: torch.Tensor, query_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean entropy (nats) of each head's attention rows.

    Args:
        probs: ``[B, H, Tq, Tk]`` attention probabilities (rows sum to 1 over the allowed keys;
            disallowed keys hold 0, and ``0 ln 0 = 0``).
        query_mask: ``[B, Tq]`` bool, the rows that count (default: all).

    Returns:
        ``[H]`` float64: ``-sum_j p_ij ln p_ij`` averaged over the counted rows of every example.

    Raises:
        ValueError: ``probs`` is not 4-D, or no row counts.
    """
    total, rows = _entropy_sums(probs, query_mask)
    if rows == 0:
        raise ValueError("attention_entropy: no query row counts (query_mask is all False)")
    return total / rows


def _entropy_sums(probs: torch.Tensor, query_mask: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    if probs.dim() != 4:
        raise ValueError(f"attention probabilities must be [batch, heads, queries, keys], got shape {tuple(probs.shape)}")
    B, H, Tq, _ = probs.shape
    rows = torch.special.entr(probs.double()).sum(-1)  # (B, H, Tq); entr(0) = 0
    keep = torch.ones(B, Tq, dtype=torch.bool, device=probs.device) if query_mask is None else query_mask.bool()
    rows = torch.where(keep[:, None, :], rows, torch.zeros((), dtype=rows.dtype, device=rows.device))  # NaN rows of pads out
    return rows.sum((0, 2)).cpu(), int(keep.sum())


def uniform_entropy(allowed: torch.Tensor, query_mask: torch.Tensor | None = None) -> float:
    """Mean ``ln n`` (nats) over the counted rows, ``n`` a row's allowed keys: the entropy a uniform
    attention would have on the same rows.

    Args:
        allowed: ``[B, Tq, Tk]`` bool, keys each query may attend.
        query_mask: ``[B, Tq]`` bool, the rows that count (default: all).
    """
    total, rows = _uniform_sums(allowed, query_mask)
    return total / rows if rows else float("nan")


def _uniform_sums(allowed: torch.Tensor, query_mask: torch.Tensor | None) -> tuple[float, int]:
    n = allowed.sum(-1).double()  # (B, Tq)
    keep = torch.ones_like(n, dtype=torch.bool) if query_mask is None else query_mask.bool()
    keep = keep & (n > 0)
    return float(torch.log(n[keep]).sum()), int(keep.sum())


def effective_rank(singular_values: torch.Tensor) -> float:
    """``exp(-sum p_i ln p_i)`` with ``p_i = sigma_i / sum sigma`` (Roy & Vetterli 2007): the
    effective rank of a matrix with these singular values; 0.0 for the zero matrix (no direction)."""
    s = singular_values.double().abs()
    total = s.sum()
    if total <= 0:
        return 0.0
    return float(torch.exp(torch.special.entr(s / total).sum()))


def qk_effective_rank(w_q: torch.Tensor, w_k: torch.Tensor) -> float:
    """Effective rank of one head's bilinear form ``M = w_q^T w_k`` (``w_q``, ``w_k``:
    ``[head_dim, hidden]`` rows of the query / key projection's weight). Computed from the
    ``[head_dim, head_dim]`` core ``R_q R_k^T`` of ``w_q^T = Q_q R_q``, ``w_k^T = Q_k R_k`` (same
    singular values as ``M``, which is never formed)."""
    _, r_q = torch.linalg.qr(w_q.detach().double().T)
    _, r_k = torch.linalg.qr(w_k.detach().double().T)
    return effective_rank(torch.linalg.svdvals(r_q @ r_k.T))


def _row_basis(w: torch.Tensor) -> torch.Tensor:
    """Orthonormal basis ``[r, hidden]`` of the row space of ``w`` (numerical rank ``r``)."""
    return _row_bases(w.unsqueeze(0))[0]


def _row_bases(blocks: torch.Tensor) -> list[torch.Tensor]:
    """:func:`_row_basis` of each ``[k, hidden]`` block of ``blocks`` (``[n, k, hidden]``) from one
    batched SVD (LAPACK on each block in turn: the same bits as one call per block, ~3x faster)."""
    _, s, vh = torch.linalg.svd(blocks.detach().double(), full_matrices=False)
    if not s.numel():
        return [vh[i] for i in range(len(vh))]
    tol = s.amax(-1, keepdim=True) * max(blocks.shape[-2:]) * torch.finfo(torch.float64).eps
    keep = s > tol
    return [vh[i][keep[i]] for i in range(len(vh))]


def subspace_overlap(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean squared cosine of the principal angles between the row spaces of ``a`` and ``b``
    (``[k_a, d]``, ``[k_b, d]``): ``||P_a P_b||_F^2 / min(r_a, r_b)``. 1 for the same subspace;
    ``k / d`` expected for a uniformly random ``k``-subspace (module docstring).

    Raises:
        ValueError: different column counts, or a zero matrix.
    """
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(f"subspace_overlap: row spaces of R^{a.shape[-1]} and R^{b.shape[-1]} cannot be compared")
    return _overlap_of_bases(_row_basis(a), _row_basis(b))


def _overlap_of_bases(qa: torch.Tensor, qb: torch.Tensor) -> float:
    """``||Q_a Q_b^T||_F^2 / min(r_a, r_b)`` of two orthonormal row bases (:func:`subspace_overlap`)."""
    k = min(len(qa), len(qb))
    if k == 0:
        raise ValueError("subspace_overlap: a zero matrix has no row space")
    return float((qa @ qb.T).pow(2).sum() / k)


# --- where the query/key projections of a model are ---------------------------------------------

def _label(kind: str, layer: int, kinds: set[str]) -> str:
    return str(layer) if kinds == {"self"} else f"{kind}.{layer}"


def _site_linears(model: nn.Module) -> list[tuple[str, Any, nn.Module, nn.Module, nn.Module, nn.Module]]:
    """``(label, site, query linear, key linear, module whose input is the query's, the key's)``;
    a fused module that is not split is split into a copy (:meth:`SplitQKV.from_fused`), the model untouched."""
    sites = find_attention_projections(model)
    modules = dict(model.named_modules())
    kinds = {s.kind for s in sites}
    found = []
    for s in sites:
        if s.is_split:
            q, k, q_in, k_in = s.query, s.key, s.query, s.key
        else:
            fused = modules[s.fused_name]
            copy = SplitQKV.from_fused(fused, s.fused, s.num_heads, s.num_kv_heads, s.head_dim)
            q, k, q_in, k_in = copy.query, copy.key, fused, fused
        found.append((_label(s.kind, s.layer, kinds), s, q, k, q_in, k_in))
    return found


def qk_weights(model: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per site label: ``(W_q, W_k)`` as CPU float64 copies (``[num_heads*head_dim, hidden]``,
    ``[num_kv_heads*head_dim, hidden]``); the reference a run's overlap is measured against."""
    return {label: (q.weight.detach().double().cpu().clone(), k.weight.detach().double().cpu().clone())
            for label, _, q, k, _, _ in _site_linears(model)}


# --- one pass over the batch ----------------------------------------------------------------------

@dataclass
class _Site:
    """One site's hooks' state and running sums over the batch's chunks."""

    label: str
    heads: int
    kv_heads: int
    head_dim: int
    query: nn.Linear  # the projections (a copy of a fused module's rows when it is not split)
    key: nn.Linear
    query_input: nn.Module  # the module whose input is the query projection's (the fused module, if fused)
    key_input: nn.Module
    attention: nn.Module
    causal: bool
    fixed_map: torch.Tensor | None = None
    x_q: torch.Tensor | None = None
    x_k: torch.Tensor | None = None
    entropy: torch.Tensor | None = None  # (H,) sums over rows
    rows: int = 0
    uniform: float = 0.0
    uniform_rows: int = 0
    logit: torch.Tensor | None = None  # (H,) sums of |score| over pairs
    pairs: int = 0
    sources: set[str] = field(default_factory=set)


def _probabilities(output: Any, heads: int) -> torch.Tensor | None:
    """The attention probabilities an attention module returned: the last element of its output
    tuple when it is a ``[B, heads, Tq, Tk]`` tensor (BERT, GPT-2, Llama, ...: ``(out, weights)``;
    T5: ``(out, position_bias, weights)``), else None (SDPA, or not asked for)."""
    if isinstance(output, (tuple, list)) and output and isinstance(output[-1], torch.Tensor):
        w = output[-1]
        if w.dim() == 4 and w.shape[1] == heads and len(output) > 1:
            return w
    return None


class _Pass:
    """Forward hooks on every site for the chunks of one batch (see :func:`attention_diagnostics`)."""

    def __init__(self, sites: list[_Site]) -> None:
        self.sites = sites
        self.mask: torch.Tensor | None = None  # (B, T) of the current chunk
        self.handles: list[Any] = []
        for s in sites:
            if s.fixed_map is None:
                self.handles.append(s.query_input.register_forward_hook(self._grab(s, "x_q")))
                self.handles.append(s.key_input.register_forward_hook(self._grab(s, "x_k")))
            self.handles.append(s.attention.register_forward_hook(self._attention(s)))

    def close(self) -> None:
        for h in self.handles:
            h.remove()

    @staticmethod
    def _grab(site: _Site, slot: str) -> Callable:
        def hook(module, args, output):
            if args:
                setattr(site, slot, args[0].detach())
        return hook

    def _attention(self, site: _Site) -> Callable:
        def hook(module, args, output):
            shape = tuple(args[0].shape) if args and isinstance(args[0], torch.Tensor) else None  # (B, T, C)
            _accumulate(site, _probabilities(output, site.heads), self.mask, shape)
            site.x_q = site.x_k = None
        return hook


def _valid(mask: torch.Tensor | None, length: int, batch: int, device: torch.device) -> torch.Tensor:
    """``[B, length]`` bool: real tokens when the mask has this length, else all True."""
    if mask is not None and mask.shape[-1] == length:
        return mask.to(device).bool()
    return torch.ones(batch, length, dtype=torch.bool, device=device)


def _scores(site: _Site, Tq: int, Tk: int) -> torch.Tensor | None:
    """``[B, H, Tq, Tk]`` float32 logits: the fixed map's, or ``q k^T / sqrt(head_dim)``."""
    if site.fixed_map is not None:
        return site.fixed_map[:, :Tq, :Tk].float()[None]
    if site.x_q is None or site.x_k is None:
        return None
    q = site.query(site.x_q).float()  # (B, Tq, H*hd)
    k = site.key(site.x_k).float()  # (B, Tk, Hkv*hd)
    B, hd = q.shape[0], site.head_dim
    q = q.view(B, q.shape[1], site.heads, hd).transpose(1, 2)  # (B, H, Tq, hd)
    k = k.view(B, k.shape[1], site.kv_heads, hd).transpose(1, 2)  # (B, Hkv, Tk, hd)
    k = k.repeat_interleave(site.heads // site.kv_heads, dim=1)  # grouped-query: head h reads key head h // group
    return q @ k.transpose(-1, -2) / math.sqrt(hd)


def _accumulate(site: _Site, probs: torch.Tensor | None, mask: torch.Tensor | None, shape: tuple | None) -> None:
    """Add one chunk's entropy, uniform-entropy and logit-scale sums to ``site`` (``shape``: the
    attention module's input ``(B, T, C)``, which sizes a fixed map)."""
    probs = None if site.fixed_map is not None else probs
    if probs is not None:
        B, _, Tq, Tk = probs.shape
        device = probs.device
    elif site.fixed_map is not None and shape is not None:
        B, Tq = shape[0], shape[1]
        Tk, device = Tq, site.fixed_map.device
    elif site.x_q is not None and site.x_k is not None:
        B, Tq, Tk, device = site.x_q.shape[0], site.x_q.shape[1], site.x_k.shape[1], site.x_q.device
    else:
        return
    if probs is not None and not site.causal and Tq == Tk > 1 and not probs.triu(1).any():
        site.causal = True  # exactly zero above the diagonal for every row: a causal mask
    queries = _valid(mask, Tq, B, device)  # (B, Tq)
    allowed = _valid(mask, Tk, B, device)[:, None, :].expand(B, Tq, Tk)  # (B, Tq, Tk)
    if site.causal:
        allowed = allowed & torch.ones(Tq, Tk, dtype=torch.bool, device=device).tril()
    scores = _scores(site, Tq, Tk)
    if probs is None and scores is not None:  # oelm GPT (SDPA), its fixed map, or a module that returned none
        probs = torch.softmax(scores.masked_fill(~allowed[:, None], float("-inf")), dim=-1)
        site.sources.add("fixed map" if site.fixed_map is not None else "recomputed")
    elif probs is not None:
        site.sources.add("model")
    if probs is None:
        return
    total, rows = _entropy_sums(probs, queries)
    site.entropy = total if site.entropy is None else site.entropy + total
    site.rows += rows
    u, n = _uniform_sums(allowed, queries)
    site.uniform, site.uniform_rows = site.uniform + u, site.uniform_rows + n
    if scores is not None:
        pairs = (allowed & queries[:, :, None])[:, None]  # (B, 1, Tq, Tk)
        logit = torch.where(pairs, scores.abs(), torch.zeros((), device=device)).double().sum((0, 2, 3)).cpu()
        site.logit = logit if site.logit is None else site.logit + logit
        site.pairs += int(pairs.sum())


def _sites(model: nn.Module) -> list[_Site]:
    gpt = architecture_of(model).model_type == "oelm-gpt"
    modules = dict(model.named_modules())
    found = []
    for label, s, q, k, q_in, k_in in _site_linears(model):
        attention = modules[s.attention_name]
        fixed = getattr(attention, "fixed_logits", None) if gpt else None
        found.append(_Site(label, s.num_heads, s.num_kv_heads, s.head_dim, q, k, q_in, k_in, attention,
                           causal=gpt or bool(getattr(attention, "is_causal", False)),
                           fixed_map=fixed.detach() if isinstance(fixed, torch.Tensor) else None))
    return found


def _examples_and_tokens(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[int, int]:
    """The batch's examples and tokens per example: ``input_ids`` ``[B, T]``, or an image model's
    ``pixel_values`` ``[B, C, H, W]`` (ViT: one token per ``patch_size`` square, and the [CLS] token)."""
    if "input_ids" in batch:
        return len(batch["input_ids"]), batch["input_ids"].shape[-1]
    pixels = batch["pixel_values"]
    patch = getattr(getattr(model, "config", None), "patch_size", 16)
    patch = patch[0] if isinstance(patch, (tuple, list)) else patch
    return len(pixels), (pixels.shape[-2] // patch) * (pixels.shape[-1] // patch) + 1


def _chunk_size(model: nn.Module, batch: dict[str, torch.Tensor], sites: list[_Site]) -> int:
    n, T = _examples_and_tokens(model, batch)
    per_example = sum(s.heads for s in sites) * T * T * 4
    return max(1, min(n, _CHUNK_BYTES // max(per_example, 1)))


def _forward(model: nn.Module, sites: list[_Site], batch: dict[str, torch.Tensor]) -> None:
    """Run ``batch`` through ``model`` in chunks, eager attention on a Hugging Face model."""
    hf = callable(getattr(model, "set_attn_implementation", None)) and hasattr(model.config, "_attn_implementation")
    before = model.config._attn_implementation if hf else None
    device = next(model.parameters()).device
    chunk = _chunk_size(model, batch, sites)
    hooks = _Pass(sites)
    was_training = model.training
    try:
        if hf and before != "eager":
            model.set_attn_implementation("eager")
        model.eval()
        with torch.no_grad():
            for start in range(0, _examples_and_tokens(model, batch)[0], chunk):
                part = {k: v[start:start + chunk].to(device) for k, v in batch.items()}
                hooks.mask = part.get("attention_mask")
                if hf:  # DeBERTa returns its probabilities only when asked
                    model(**part, output_attentions=True)
                else:
                    model(**part)
    finally:
        hooks.close()
        model.train(was_training)
        if hf and before != "eager":
            model.set_attn_implementation(before)


# --- the record --------------------------------------------------------------------------------

def _r(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(float(v), _DIGITS)


def _mean(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else None


def _head_ranks(site: _Site) -> list[float] | None:
    if site.fixed_map is not None:  # q_proj / k_proj are not used
        return None
    hd, group = site.head_dim, site.heads // site.kv_heads
    wq, wk = site.query.weight, site.key.weight
    return [qk_effective_rank(wq[h * hd:(h + 1) * hd], wk[(h // group) * hd:(h // group + 1) * hd])
            for h in range(site.heads)]


#: Per reference weight (held, compared by identity): its heads' row bases. A matrix's runs share
#: one reference (matrix/diagnose.py loads it once per process), so its SVDs are made once.
_REFERENCE_BASES: dict[int, tuple[torch.Tensor, int, list[torch.Tensor]]] = {}


def _reference_bases(ref: torch.Tensor, heads: int) -> list[torch.Tensor]:
    held = _REFERENCE_BASES.get(id(ref))
    if held is None or held[0] is not ref or held[1] != heads:
        if len(_REFERENCE_BASES) >= 256:  # a bound (a model has one entry per Q or K weight): start afresh
            _REFERENCE_BASES.clear()
        held = _REFERENCE_BASES[id(ref)] = (ref, heads, _row_bases(ref.reshape(heads, -1, ref.shape[-1])))
    return held[2]


def _head_overlaps(w: torch.Tensor, ref: torch.Tensor, heads: int, hd: int) -> list[float] | None:
    """:func:`subspace_overlap` of each head's rows of ``w`` with the same rows of ``ref`` (both
    ``[heads * hd, hidden]``); None when their shapes differ."""
    if w.shape != ref.shape:
        return None
    ours, theirs = _row_bases(w.reshape(heads, hd, w.shape[-1])), _reference_bases(ref, heads)
    return [_overlap_of_bases(a, b) for a, b in zip(ours, theirs)]


def _site_record(site: _Site, reference: dict[str, tuple[torch.Tensor, torch.Tensor]] | None) -> dict[str, Any]:
    entropy = (site.entropy / site.rows).tolist() if site.entropy is not None and site.rows else None
    logit = (site.logit / site.pairs).tolist() if site.logit is not None and site.pairs else None
    ranks = _head_ranks(site)
    ov_q = ov_k = None
    if reference is not None and site.label in reference and site.fixed_map is None:
        ref_q, ref_k = reference[site.label]
        ov_q = _head_overlaps(site.query.weight.detach().double().cpu(), ref_q, site.heads, site.head_dim)
        ov_k = _head_overlaps(site.key.weight.detach().double().cpu(), ref_k, site.kv_heads, site.head_dim)
    tau = getattr(site.query, TEMPERATURE_NAME, None)
    return {"entropy": entropy, "uniform_entropy": site.uniform / site.uniform_rows if site.uniform_rows else None,
            "logit_scale": logit, "qk_effective_rank": ranks, "overlap_query": ov_q, "overlap_key": ov_k,
            "head_temperature": tau.detach().double().cpu().tolist() if isinstance(tau, torch.Tensor) else None}


def attention_diagnostics(model: nn.Module, batch: dict[str, torch.Tensor], *,
                          reference: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None) -> dict[str, Any]:
    """Every diagnostic of the module docstring for ``model`` on ``batch``.

    Args:
        model: a model of a registered family (not modified; a Hugging Face model's attention
            implementation and the train/eval mode are restored).
        batch: model inputs, ``input_ids`` ``[B, T]`` and optionally ``attention_mask`` (1 token, 0
            pad) and ``token_type_ids`` (an image model: ``pixel_values`` ``[B, C, H, W]``, every
            patch a real token); ``labels`` is ignored.
        reference: :func:`qk_weights` of the model the overlap is measured against (the pretrained
            checkpoint); None: no overlap.

    Returns:
        ``{"sites": [labels], "entropy_source", "head_dim", "hidden_size", "per_head": {entropy,
        logit_scale, qk_effective_rank, overlap_query, overlap_key: [site][head]; and head_temperature, each
        head's learned temperature τ_h (:mod:`oelm.method.temperature`), only where the model has one}, "per_layer":
        {entropy, uniform_entropy, logit_scale, qk_effective_rank, overlap: [site]}, "mean": {the same
        over every site and head, and normalized_entropy = entropy / uniform_entropy}, "seconds"}``.
        Units: nats (entropies), logits (scale), dimensions (rank), squared cosines (overlap); None
        where a quantity does not apply (overlap without a reference, rank of a fixed map's layer).

    Raises:
        UnsupportedModelError: the model's family is not registered.
    """
    started = time.perf_counter()
    sites = _sites(model)
    _forward(model, sites, {k: v for k, v in batch.items() if k != "labels"})
    records = [_site_record(s, reference) for s in sites]
    per_head = {key: [[_r(v) for v in rec[key]] if rec[key] is not None else None for rec in records]
                for key in ("entropy", "logit_scale", "qk_effective_rank", "overlap_query", "overlap_key")}
    if any(rec["head_temperature"] is not None for rec in records):  # oelm_temperature: where each learned tau is
        per_head["head_temperature"] = [[_r(v) for v in rec["head_temperature"]] if rec["head_temperature"] is not None
                                        else None for rec in records]
    per_layer = {key: [_r(_mean(rec[key] or [])) for rec in records]
                 for key in ("entropy", "logit_scale", "qk_effective_rank")}
    per_layer["uniform_entropy"] = [_r(rec["uniform_entropy"]) for rec in records]
    per_layer["overlap"] = [_r(_mean((rec["overlap_query"] or []) + (rec["overlap_key"] or []))) for rec in records]
    flat = {key: [v for rec in records for v in (rec[key] or [])] for key in per_head if key != "head_temperature"}
    mean = {"entropy": _mean(flat["entropy"]), "uniform_entropy": _mean([r["uniform_entropy"] for r in records]),
            "logit_scale": _mean(flat["logit_scale"]), "qk_effective_rank": _mean(flat["qk_effective_rank"]),
            "overlap": _mean(flat["overlap_query"] + flat["overlap_key"])}
    mean["normalized_entropy"] = (mean["entropy"] / mean["uniform_entropy"]
                                  if mean["entropy"] is not None and mean["uniform_entropy"] else None)
    sources = sorted({src for s in sites for src in s.sources})
    return {"sites": [s.label for s in sites], "entropy_source": ", ".join(sources) or None,
            "head_dim": sites[0].head_dim, "hidden_size": int(sites[0].query.weight.shape[1]),
            "mean": {k: _r(v) for k, v in mean.items()}, "per_layer": per_layer, "per_head": per_head,
            "seconds": round(time.perf_counter() - started, 3)}


def diagnostic_batch(dataset: Any, collate_fn: Callable | None = None,
                     examples: int = DIAGNOSTIC_EXAMPLES) -> dict[str, torch.Tensor]:
    """The fixed batch: the first ``examples`` items of ``dataset`` (all when it has fewer), in
    dataset order, collated by ``collate_fn`` (default: torch's ``default_collate``)."""
    from torch.utils.data import default_collate

    items = [dataset[i] for i in range(min(examples, len(dataset)))]
    return (collate_fn or default_collate)(items)
