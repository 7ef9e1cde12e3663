"""Methods that freeze more than the query/key projections: reservoir layers and a fixed attention map.

``apply_oelm`` calls these when ``OELMConfig.reservoir_layers`` / ``OELMConfig.fixed_attention`` are
set (methods ``reservoir`` and ``fixed_attention``, :data:`oelm.method.METHODS`):

- **Reservoir layers** (Shen et al., "Reservoir Transformers", ACL 2021): chosen whole transformer
  layers are drawn at random and frozen, while the layers between them train; the frozen layers act
  as a fixed random feature map (a reservoir, as in echo-state networks). A layer is a module that
  contains an attention module of the model's :class:`~oelm.architectures.ArchitectureSpec`: the
  name up to the pattern's layer index (``bert.encoder.layer.3``, ``transformer.h.3``,
  ``gpt_neox.layers.3``, T5's ``encoder.block.3`` and ``decoder.block.3``), so every registered
  family works without another table.
- **A fixed attention map** (Tay et al., "Synthesizer: Rethinking Self-Attention in Transformer
  Models", ICML 2021, the "Random" synthesizer with its map kept fixed): each head's attention
  scores are a frozen random ``[T, T]`` matrix ``R_h`` instead of ``Q_h K_h^T / sqrt(hs)``, so the
  attention pattern does not depend on the input (values still do). Only in oelm's own GPT, whose
  attention module offers ``set_fixed_attention``; a Hugging Face model is refused with one line.

Both draw from the method's seeded generator, so a lean checkpoint regenerates them exactly and
checks them by sha256 like the frozen Q/K (:mod:`oelm.checkpoint`).

- **Mimetic value/output** (``OELMConfig.mimetic_value_output``, methods ``oelm_mimetic_vo`` and
  ``mimetic_vo_trained``): the value-output half of Trockman & Kolter's mimetic initialization
  (:func:`oelm.method.init.mimetic_value_output_`) on every attention module of oelm's GPT, drawn after the
  Q/K. These projections train, so a checkpoint stores them; only their starting point is drawn.
"""

from __future__ import annotations

import re
import torch
from torch import nn

from oelm.architectures import architecture_of
from oelm.errors import ConfigError, UnsupportedModelError
from oelm.method.config import ALTERNATE
from oelm.method.init import mimetic_value_output_

__all__ = ["RESERVOIR_STD", "FIXED_ATTENTION_STD", "find_layers", "reservoir_indices", "reservoir_",
           "fixed_attention_", "fixed_attention_modules", "mimetic_value_output_all_", "value_output_modules"]

#: Std of a reservoir layer's matrices when the model's config has no ``initializer_range``: 0.02,
#: the GPT-2 / BERT initialization (oelm's GPT uses it too).
RESERVOIR_STD = 0.02
#: Std of the fixed attention scores ``R_h``: N(0, 1) logits give each query a random, moderately
#: peaked distribution over the keys it may see.
FIXED_ATTENTION_STD = 1.0


def find_layers(model: nn.Module) -> dict[str, int]:
    """The model's transformer layers: module name -> layer index within its stack, in model order.

    Raises:
        UnsupportedModelError: the model's type has no registry entry.
    """
    spec = architecture_of(model)
    patterns = [re.compile(a.pattern) for a in spec.attention]
    layers: dict[str, int] = {}
    for name, _ in model.named_modules():
        for pattern in patterns:
            m = pattern.search(name)
            if m:
                layers.setdefault(name[: m.end(1)], int(m.group(1)))
                break
    if not layers:
        raise UnsupportedModelError(f"no layer of {type(model).__name__} matched the {spec.model_type!r} attention pattern(s)")
    return layers


def reservoir_indices(spec: tuple[int, ...] | str, available: set[int] | range) -> list[int]:
    """The layer indices ``spec`` chooses among ``available``: ``"alternate"`` -> the odd ones.

    Raises:
        ConfigError: an index the model does not have, or a spec that chooses no layer.
    """
    available = sorted(available)
    if spec == ALTERNATE:
        chosen = [i for i in available if i % 2 == 1]
    else:
        missing = [i for i in spec if i not in available]
        if missing:
            raise ConfigError(
                f"reservoir_layers {list(spec)} names layer(s) {missing}, but the model has layers "
                f"{available[0]}..{available[-1]}; choose indices in that range"
            )
        chosen = sorted(spec)
    if not chosen:
        raise ConfigError(f"reservoir_layers={spec!r} chooses no layer of a model with layers {available}; "
                          "give explicit indices, e.g. [0]")
    return chosen


def _is_norm(module: nn.Module) -> bool:
    return "norm" in type(module).__name__.lower()  # LayerNorm, RMSNorm, T5LayerNorm, ...


@torch.no_grad()
def reservoir_(model: nn.Module, spec: tuple[int, ...] | str, generator: torch.Generator | None) -> list[str]:
    """Draw the chosen layers of ``model`` at random and freeze them (in place).

    Every parameter of a chosen layer is redrawn, on a pretrained and a fresh model alike, so a
    reservoir layer is random whatever the base: matrices (2-D and up) ~ N(0, std^2) with
    ``std = model.config.initializer_range`` when the config has it, else :data:`RESERVOIR_STD`;
    weights of normalization modules 1 and their biases 0; other vectors (biases) 0. Draws are made
    on the CPU in float32 from ``generator`` (layers in model order, parameters in
    ``named_parameters`` order) and copied, so a seed gives the same layers on every device. Then
    ``requires_grad=False`` on all of them.

    Args:
        model: a model of a registered family.
        spec: layer indices (within each stack: T5's encoder and decoder both) or ``"alternate"``.
        generator: CPU generator of the draws (None: torch's global RNG).

    Returns:
        The names of the frozen layer modules.

    Raises:
        UnsupportedModelError: unknown model type. ConfigError: as :func:`reservoir_indices`.
    """
    layers = find_layers(model)
    chosen = set(reservoir_indices(spec, set(layers.values())))
    std = getattr(getattr(model, "config", None), "initializer_range", None) or RESERVOIR_STD
    modules = dict(model.named_modules())
    names = [name for name, index in layers.items() if index in chosen]
    for name in names:
        for module in modules[name].modules():
            for pname, p in module.named_parameters(recurse=False):
                if _is_norm(module):
                    value = torch.ones(p.shape) if pname == "weight" else torch.zeros(p.shape)
                elif p.dim() >= 2:
                    value = torch.randn(p.shape, generator=generator, dtype=torch.float32) * float(std)
                else:
                    value = torch.zeros(p.shape)
                p.copy_(value.to(device=p.device, dtype=p.dtype))
                p.requires_grad_(False)
    return names


def fixed_attention_(model: nn.Module, generator: torch.Generator | None) -> list[str]:
    """Give every attention module of oelm's GPT a frozen random attention map (in place).

    Each ``CausalSelfAttention`` gets ``fixed_logits`` ([num_heads, context_length,
    context_length], N(0, :data:`FIXED_ATTENTION_STD`^2), ``requires_grad=False``), drawn on the CPU in
    float32 from ``generator`` in layer order; its forward then uses
    ``softmax(R_h[:T, :T] + causal/padding mask) V_h`` per head (see
    :meth:`oelm.models.gpt.CausalSelfAttention.set_fixed_attention`).

    Returns:
        The names of the attention modules changed.

    Raises:
        UnsupportedModelError: the model has no attention module that supports a fixed map (a
            Hugging Face model: its attention code is the library's, which oelm does not rewrite).
    """
    targets = fixed_attention_modules(model)
    for _, module in targets:
        module.set_fixed_attention(generator=generator, std=FIXED_ATTENTION_STD)
    return [n for n, _ in targets]


def fixed_attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The attention modules of ``model`` that take a fixed map (``set_fixed_attention``), by name.

    Raises:
        UnsupportedModelError: none (a Hugging Face model), in one line.
    """
    return _oelm_gpt_attention(
        model, f"fixed_attention replaces the attention scores inside oelm's own GPT (model.gpt, e.g. gpt-tiny); "
        f"{type(model).__name__} keeps its library's attention code, which oelm does not rewrite: use an oelm GPT or "
        "another method")


def value_output_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The attention modules of oelm's GPT, whose value / output projections (``v_proj``, ``o_proj``:
    ``nn.Linear(hidden_size, hidden_size)``) the mimetic value/output init sets, by name.

    Raises:
        UnsupportedModelError: none (a Hugging Face model: the architecture registry names its query
            and key projections only), in one line.
    """
    return _oelm_gpt_attention(
        model, f"mimetic_value_output sets the value and attention-output projections of oelm's own GPT (model.gpt, "
        f"e.g. gpt-tiny); the registry knows only the query/key projections of {type(model).__name__}: use an oelm "
        "GPT, or init: mimetic without mimetic_value_output")


def _oelm_gpt_attention(model: nn.Module, refusal: str) -> list[tuple[str, nn.Module]]:
    """The attention modules of oelm's GPT (``CausalSelfAttention``: they offer ``set_fixed_attention``)
    by name, or :class:`UnsupportedModelError` with ``refusal`` when there is none."""
    targets = [(n, m) for n, m in model.named_modules() if callable(getattr(m, "set_fixed_attention", None))]
    if not targets:
        raise UnsupportedModelError(refusal)
    return targets


def mimetic_value_output_all_(model: nn.Module, generator: torch.Generator | None) -> list[str]:
    """Mimetic value/output initialization (:func:`oelm.method.init.mimetic_value_output_`) of every
    attention module of oelm's GPT, in layer order, from ``generator``; the projections stay trainable.

    Returns:
        The names of the attention modules changed.

    Raises:
        UnsupportedModelError: as :func:`value_output_modules`.
    """
    targets = value_output_modules(model)
    for _, module in targets:
        mimetic_value_output_(module.v_proj.weight, module.o_proj.weight, generator=generator)
    return [n for n, _ in targets]
