"""Model FLOPs per token for any transformer: oelm's GPT or a Hugging Face model.

The count is the one of the PaLM paper (Chowdhery et al. 2022, "PaLM: Scaling Language Modeling
with Pathways", appendix B), also used by nanoGPT's ``estimate_mfu``::

    flops_per_token = 6 * N + 12 * L * H * T

``N`` matmul parameters (every parameter except the token / position / token-type embedding
tables, see :func:`count_matmul_parameters`), ``L`` layers, ``H`` hidden size, ``T`` sequence
length. Per token and per weight, the forward pass does one multiply-add (2 FLOPs); the backward
pass does two: one for the gradient with respect to the layer's *input* (2 FLOPs) and one for the
gradient with respect to the *weight* (2 FLOPs), hence ``6 N``. Attention adds, per layer and per
token, ``Q K^T`` and ``P V`` against ``T`` positions of width ``H``: ``2 * 2 * H * T`` forward,
times 3 with the backward, hence ``12 L H T``. The full ``T x T`` score matrix is counted even
under a causal mask (as PaLM and nanoGPT do).

What the formula deliberately does not see:

* **Frozen weights.** A frozen weight (OELM's Q/K projections) still costs its forward matmul
  and the gradient with respect to its input (the layers below it train), but not its
  weight gradient, which autograd skips: the work actually executed is
  ``6 N - 2 N_frozen + 12 L H T`` (see :func:`executed_flops_per_token`). *Model* FLOPs count
  ``6 N`` for every parameter whether it trains or not. That is the standard convention: MFU
  is a property of the architecture and the throughput, not of which weights train, so a
  baseline run and an OELM run of the same architecture are credited with the same FLOPs per
  token and their MFU ratio equals their throughput ratio.
* Biases and norm scales count as 6 FLOPs each like matmul weights (they cost fewer); element-
  wise work (softmax, GELU, norms), the optimizer and embedding look-ups are not counted. For
  the models here these are well under 1 % of ``6 N``.
"""

from __future__ import annotations

from torch import nn

from oelm.architectures.spec import architecture_of
from oelm.errors import UnsupportedModelError

__all__ = [
    "count_matmul_parameters",
    "executed_flops_per_token",
    "model_flops_per_token",
    "model_layers_and_width",
]

# Config attribute names tried for a model whose architecture is not registered (oelm GPTConfig,
# BERT/Llama, GPT-2, T5/BART); a registered one says its own (ArchitectureSpec.num_layers / hidden_size).
_LAYER_ATTRS = ("num_layers", "num_hidden_layers", "n_layer")
_WIDTH_ATTRS = ("hidden_size", "n_embd", "d_model")


def _unwrap(model: nn.Module) -> nn.Module:
    """The module under ``torch.compile`` (``_orig_mod``) and DDP/DataParallel (``module``) wrappers."""
    while True:
        inner = getattr(model, "_orig_mod", None) or (
            model.module if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)) else None
        )
        if inner is None:
            return model
        model = inner


def count_matmul_parameters(model: nn.Module, frozen: bool | None = None) -> int:
    """``N`` of the PaLM count: parameters that multiply activations (each shared tensor once).

    Every parameter counts except the weights of ``nn.Embedding`` modules (token, position,
    token-type tables: looked up, not multiplied), unless that weight is also the weight of an
    ``nn.Linear`` somewhere in the model: a tied output projection (``lm_head`` sharing the
    token-embedding matrix) is a real ``[H, V]`` matmul per token and stays in. A fixed attention
    map (``fixed_logits`` of oelm GPT's ``fixed_attention`` method) does not count either: it takes
    the place of ``Q K^T``, and its softmax times ``V`` is the attention term of the formula.

    Args:
        model: any ``nn.Module`` (compiled / DDP wrappers are unwrapped).
        frozen: ``None`` counts all of them; ``True`` only ``requires_grad=False`` ones;
            ``False`` only trainable ones.

    Returns:
        The count (an int >= 0).
    """
    model = _unwrap(model)
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    tables = {
        id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding) and id(m.weight) not in linear_weights
    }
    tables |= {id(m.fixed_logits) for m in model.modules() if isinstance(getattr(m, "fixed_logits", None), nn.Parameter)}
    total = 0
    for p in model.parameters():  # yields a tied tensor once
        if id(p) in tables:
            continue
        if frozen is None or frozen == (not p.requires_grad):
            total += p.numel()
    return total


def model_layers_and_width(model: nn.Module) -> tuple[int, int]:
    """``(L, H)``: number of transformer layers and hidden size, read from ``model.config``.

    The model's registered architecture says which config attributes hold them
    (:attr:`oelm.ArchitectureSpec.num_layers` / ``hidden_size``); for a model of an unregistered
    type, ``num_layers`` / ``num_hidden_layers`` / ``n_layer`` and ``hidden_size`` / ``n_embd`` /
    ``d_model`` are tried (oelm GPTConfig, BERT/Llama-style, GPT-2-style, T5/BART-style configs).

    Raises:
        ValueError: the model has no ``config``, or the config has none of those attributes
            (the message names what was tried).
    """
    model = _unwrap(model)
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError(f"{type(model).__name__} has no .config; cannot read its number of layers and hidden size")

    try:
        spec = architecture_of(model)
    except UnsupportedModelError:
        spec = None

    def first(field: str, names: tuple[str, ...]) -> int:
        if spec is not None:
            value = spec.config_value(config, field)
            if value is not None:
                return value
            names = (str(getattr(spec, field)), *names)
        for name in names:
            value = getattr(config, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        raise ValueError(
            f"{type(config).__name__} has none of {', '.join(dict.fromkeys(names))}; cannot count attention FLOPs"
        )

    return first("num_layers", _LAYER_ATTRS), first("hidden_size", _WIDTH_ATTRS)


def _check_seq_len(seq_len: int) -> int:
    if isinstance(seq_len, bool) or int(seq_len) != seq_len or seq_len < 1:
        raise ValueError(f"seq_len must be a positive int (tokens per sequence), got {seq_len!r}")
    return int(seq_len)


def model_flops_per_token(model: nn.Module, seq_len: int) -> float:
    """Training model FLOPs (forward + backward) per token: ``6 N + 12 L H T`` (PaLM, appendix B).

    ``N`` = :func:`count_matmul_parameters` (frozen ones included), ``(L, H)`` =
    :func:`model_layers_and_width`, ``T`` = ``seq_len``. Frozen weights are counted like trainable
    ones (the standard convention; see the module docstring), so the baseline and OELM variants
    of one architecture get the same number.

    Args:
        model: oelm GPT or a Hugging Face transformer (or a compiled / DDP wrapper of one).
        seq_len: tokens per training sequence (the block length / padded length).

    Returns:
        FLOPs per token, a float.

    Raises:
        ValueError: ``seq_len`` is not a positive int, or ``(L, H)`` cannot be read.
    """
    T = _check_seq_len(seq_len)
    L, H = model_layers_and_width(model)
    return float(6 * count_matmul_parameters(model) + 12 * L * H * T)


def executed_flops_per_token(model: nn.Module, seq_len: int) -> float:
    """FLOPs per token the step actually executes: model FLOPs less the skipped weight gradients.

    ``6 N + 12 L H T - 2 N_frozen``: a frozen weight's gradient (2 FLOPs per weight per token) is
    never computed. The ratio ``executed / model`` is the step-time ratio OELM-Freeze can hope for
    against the baseline when matmuls dominate (the optimizer's savings come on top).

    Raises:
        ValueError: as :func:`model_flops_per_token`.
    """
    return model_flops_per_token(model, seq_len) - 2.0 * count_matmul_parameters(model, frozen=True)
