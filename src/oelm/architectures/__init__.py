"""Architecture registry: where each model family keeps its attention query/key projections.

One :class:`ArchitectureSpec` per model type (Hugging Face ``config.model_type``) says, as data,
which modules are attention layers (a regex on ``model.named_modules()`` names, one per
attention *kind*: ``self``, ``cross``, ``encoder.self``, ``decoder.cross`` ...), which children
hold the query and key projections, where the head counts live, and how fused projections are
laid out. :func:`find_attention_projections` turns a spec into one :class:`ProjectionSite` per
(kind, layer); :func:`split_fused_projections` replaces fused Q/K/V modules by
:class:`SplitQKV` (:mod:`oelm.architectures.fused`), three ``nn.Linear`` whose concatenated output equals the fused output, so
the model's own attention code runs unchanged and Q/K can be frozen as whole tensors;
:func:`fuse_split_projections` puts the fused modules back (with the trained values) for a
checkpoint that stock ``transformers`` loads (``oelm.merge_and_unload``).

Families registered in :mod:`oelm.architectures.builtin` (module names checked against transformers 5.x sources):

===================================  ==================================================  ==================
model_type                           attention module(s) -> query / key children          fused layout
===================================  ==================================================  ==================
bert, roberta, xlm-roberta, electra  ``encoder.layer.N.attention.self`` (and              --
                                     ``crossattention.self``) -> ``query`` / ``key``
distilbert                           ``transformer.layer.N.attention`` -> ``q_lin``/``k_lin`` --
deberta-v2                           ``encoder.layer.N.attention.self`` ->                  --
                                     ``query_proj`` / ``key_proj``
gpt2                                 ``h.N.attn`` -> ``c_attn``                            ``qkv_conv1d``
gpt_neox                             ``layers.N.attention`` -> ``query_key_value``         ``qkv_per_head``
llama, mistral, qwen2, opt           ``layers.N.self_attn`` -> ``q_proj`` / ``k_proj``     --
t5, mt5, umt5                        ``encoder.block.N.layer.0.SelfAttention``,            --
                                     ``decoder.block.N.layer.0.SelfAttention``,
                                     ``decoder.block.N.layer.1.EncDecAttention`` -> q / k
gemma, phi                           ``layers.N.self_attn`` -> ``q_proj`` / ``k_proj``     --
vit                                  ``layers.N.attention`` -> ``q_proj`` / ``k_proj``     --
bart                                 ``encoder.layers.N.self_attn``,                       --
                                     ``decoder.layers.N.self_attn``,
                                     ``decoder.layers.N.encoder_attn`` -> q_proj / k_proj
oelm-gpt                             ``h.N.attn`` -> ``q_proj`` / ``k_proj``               --
===================================  ==================================================  ==================

Another architecture is added without editing oelm, from Python::

    register_architecture(ArchitectureSpec(model_type="my-model", attention_pattern=r"blocks\\.(\\d+)\\.attn$",
                                           query="wq", key="wk", num_heads="n_heads"))

or from a dict / YAML file (:func:`architecture_from_dict`, :func:`load_architecture`), which an
experiment config can carry as ``model.architecture``. A single model needs no entry at all: name
its projections PEFT style, ``apply_oelm(model, method, target_modules={"query": "q_proj", "key":
"k_proj"})`` (:mod:`oelm.architectures.target_modules`), and the spec stays on that model instance.
"""

import importlib as _importlib

from oelm.architectures import builtin  # noqa: F401  registers the families oelm ships
from oelm.architectures.spec import (
    ARCHITECTURE_ATTRIBUTE,
    ARCHITECTURES,
    FUSED_LAYOUTS,
    PARAMETER_GROUPS,
    ArchitectureSpec,
    AttentionSpec,
    architecture_from_dict,
    architecture_of,
    architecture_to_dict,
    load_architecture,
    register_architecture,
)

# The specs and the registry above import no torch (the experiment config's first pass reads them);
# the names that work on modules are imported on first use (PEP 562). name -> its module.
_LAZY = {
    **dict.fromkeys(("ProjectionSite", "find_attention_projections", "split_fused_projections"), "sites"),
    **dict.fromkeys(("architecture_from_targets", "attach_architecture", "set_architecture"), "target_modules"),
    **dict.fromkeys(("SplitQKV", "fuse_split_projections"), "fused"),
}


def __getattr__(name: str):
    """``oelm.architectures.<name>`` for the names of :data:`_LAZY`, imported on first use."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'oelm.architectures' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f"oelm.architectures.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "PARAMETER_GROUPS",
    "FUSED_LAYOUTS",
    "AttentionSpec",
    "ArchitectureSpec",
    "ARCHITECTURES",
    "register_architecture",
    "architecture_from_dict",
    "architecture_to_dict",
    "architecture_from_targets",
    "attach_architecture",
    "set_architecture",
    "ARCHITECTURE_ATTRIBUTE",
    "load_architecture",
    "architecture_of",
    "ProjectionSite",
    "find_attention_projections",
    "SplitQKV",
    "split_fused_projections",
    "fuse_split_projections",
]
