"""The OELM method as a transformation of an existing model: initialize Q/K, freeze, report.

Users meet one call::

    report = apply_oelm(model, "oelm_freeze")   # or an OELMConfig
    print(report)   # trainable params: 95,310,339 || all params: 109,484,547 || trainable%: 87.0537

``apply_oelm`` finds every attention layer's query and key projections through an
architecture registry (model type -> module-name patterns and config attributes, not
if-chains; it lives in :mod:`oelm.architectures` and is re-exported here; fused Q/K/V modules
are first split into separate projections with identical outputs), initializes them (head-wise orthogonal, or an ablation), and freezes them:
``requires_grad=False``, so an optimizer built from trainable parameters never sees them and
weight decay cannot move them. It does not need oelm's training loop; any loop or Hugging Face
``Trainer`` that builds its optimizer from ``requires_grad`` parameters keeps them
bit-identical.

The method's knobs (:class:`~oelm.method.config.OELMConfig`) and the named methods (:data:`METHODS`)
are data in :mod:`oelm.method.config`; the Q/K init kinds' functions are :data:`oelm.method.init.INITS`;
reservoir layers and the fixed map are in :mod:`oelm.method.reservoir`.

The way back out is :func:`~oelm.method.merge.merge_and_unload` (PEFT's name): it fuses split Q/K/V modules back
into the architecture's own module with the trained values and removes everything
``apply_oelm`` put on the model, so ``model.save_pretrained(dir)`` writes a checkpoint that a
stock ``AutoModelForCausalLM.from_pretrained(dir)`` loads completely. Before that,
``model.save_pretrained`` (and so Hugging Face ``Trainer``'s checkpoints) already writes the
stock layout, with the method's recipe in ``config.json`` (:mod:`oelm.method.checkpoint_record`). ``apply_oelm`` may
treat a module of a model (``model.bert``); the whole tree then knows (:mod:`oelm.method.marks`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from oelm.architectures import (
    ARCHITECTURE_ATTRIBUTE,
    ProjectionSite,
    architecture_of,
    attach_architecture,
    find_attention_projections,
    split_fused_projections,
)
from oelm.errors import OELMError, UnsupportedModelError
from oelm.method.checkpoint_record import attach_checkpoint_hooks
from oelm.method.config import METHODS, NORM_RATIO, OELMConfig, get_method
from oelm.method.init import INITS
from oelm.method.marks import mark_parts, part_line, refuse_wrapper, treated_line
from oelm.method.parameters import ParameterReport, group_of, parameter_report, print_trainable_parameters, projection_row, require_module
from oelm.method.reservoir import (find_layers, fixed_attention_, fixed_attention_modules, mimetic_value_output_all_, reservoir_,
                                   reservoir_indices, value_output_modules)
from oelm.method.temperature import add_head_temperatures_, head_norms, refuse_normalized_queries

__all__ = ["apply_oelm", "get_oelm_model"]


def _resolve_config(config: Any, seed: Any, func: str) -> OELMConfig:
    """``config`` as an :class:`OELMConfig` (a method name looked up), with ``seed`` applied."""
    if isinstance(config, str):
        config = get_method(config)
    elif not isinstance(config, OELMConfig):
        hint = ("; for a mapping, pass OELMConfig(**mapping)" if isinstance(config, dict) else
                "; for a config's method entry, pass entry.oelm_config()" if hasattr(config, "oelm_config") else "")
        raise TypeError(f"oelm.{func}: config must be an OELMConfig or a method name ({', '.join(METHODS)}), "
                        f"got {type(config).__name__}{hint}")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise TypeError(f"oelm.{func}: seed must be None or an int in [0, 2**63), got {seed!r}")
        config = config.replace(seed=seed)
    return config


# --------------------------------------------------------------------------------------------
# apply_oelm
# --------------------------------------------------------------------------------------------


def _split_and_find(model: nn.Module, config: OELMConfig, target_modules: dict[str, Any] | None) -> list[ProjectionSite]:
    """Split the fused Q/K/V modules the method needs split and return the attention sites (none
    for a method without Q/K targets). A refusal on the way (a fused module with state-dict hooks, an
    unknown model with ``extra_frozen_groups``) comes before any module changes; the spec
    ``target_modules`` attached goes again then.

    Methods without Q/K targets (``baseline``, ``oelm_ffn_only``) must keep working on models
    oelm has no registry entry for: an unknown model or a family without fused layouts is not an
    error for them; with ``split_fused`` they split a registered fused family.
    """
    try:
        if config.targets:
            split_fused_projections(model)
            return find_attention_projections(model)
        if config.extra_frozen_groups:
            architecture_of(model)  # unknown model -> UnsupportedModelError, not a silent "other" group
        if config.split_fused:
            try:
                spec = architecture_of(model)
            except UnsupportedModelError:
                return []
            if any(a.fused is not None for a in spec.attention):
                split_fused_projections(model)
        return []
    except OELMError:
        if target_modules is not None:
            vars(model).pop(ARCHITECTURE_ATTRIBUTE, None)
        raise


def _refuse_treated(model: nn.Module, config: OELMConfig) -> None:
    """Refuse a model that went through ``apply_oelm``, holds a module that did, or is a part of one
    (:mod:`oelm.method.marks`: the marks go down the tree, since modules do not know their parents)."""
    line, fix = treated_line(model), "start from a fresh model, or call model = oelm.merge_and_unload(model) first to make it a plain model again"
    if line is None:
        line, fix = part_line(model), ("start from a fresh model, or merge the model that went through apply_oelm first "
                                       "(oelm.merge_and_unload on it, or on one that holds it)")
    if line is not None:
        raise OELMError(f"{line}; applying {config.method!r} on top would mix two methods' initialization and "
                        f"freezing. Fix: {fix}")


def _refuse_before_changes(model: nn.Module, config: OELMConfig, target_modules: dict[str, Any] | None,
                           num_heads: int | None) -> None:
    """Every refusal that does not need the model changed first, so a refused model is untouched
    (the spec ``target_modules`` gives is kept on the model only once the checks that read it pass)."""
    refuse_wrapper(model, "apply_oelm")
    if (config.targets or config.reservoir_layers or config.fixed_attention) and any(p.is_meta for p in model.parameters()):
        raise OELMError(
            f"{type(model).__name__} has parameters on the meta device (shapes without values), so its query/key "
            "weights cannot be initialized; materialize the model first (load it without device_map='meta' / "
            "init_empty_weights, or model.to_empty(device=...) and load its weights)"
        )
    _refuse_treated(model, config)
    if target_modules is not None:
        attach_architecture(model, target_modules, num_heads=num_heads)  # refused here if nothing fits
    try:
        if config.fixed_attention:
            fixed_attention_modules(model)  # a model without oelm's attention (a Hugging Face one): one line
        if config.mimetic_value_output:
            value_output_modules(model)  # likewise
        if config.reservoir_layers:  # an index the model lacks (its layers found through the spec above)
            reservoir_indices(config.reservoir_layers, set(find_layers(model).values()))
        if config.head_temperature is not None:
            refuse_normalized_queries(model)  # a q_norm would cancel the temperature
    except Exception:
        if target_modules is not None:
            vars(model).pop(ARCHITECTURE_ATTRIBUTE, None)
        raise


def _init_and_freeze(sites: list[ProjectionSite], config: OELMConfig, generator: torch.Generator | None) -> list[dict[str, Any]]:
    """Initialize (``INITS[config.init]``) and freeze the target projections of every site; one
    row per (site, target) for ``ParameterReport.projections``."""
    kind = INITS[config.init]
    projections = []
    for site in sites:
        if kind.pair is not None:
            kind.pair(site.module("query").weight, site.module("key").weight, site.num_heads, site.num_kv_heads, generator)
        for target in config.targets:
            linear, heads = site.module(target), site.heads(target)
            if kind.weight is not None:
                kind.weight(linear.weight, heads, generator, config.normal_std)
            if config.freeze:
                linear.weight.requires_grad_(False)
                if linear.bias is not None and config.freeze_bias:
                    linear.bias.requires_grad_(False)
            projections.append(projection_row(site, target))
    return projections


def _finish(model: nn.Module, config: OELMConfig, projections: list[dict[str, Any]]) -> ParameterReport:
    """Freeze ``config.extra_frozen_groups``; put the report, the config, ``print_trainable_parameters``
    and the checkpoint hooks on ``model`` and mark its submodules as parts of it; the report."""
    if config.extra_frozen_groups:
        patterns = architecture_of(model).group_patterns
        for name, p in model.named_parameters():
            if group_of(name, patterns) in config.extra_frozen_groups:
                p.requires_grad_(False)
    report = parameter_report(model, method=config.method)
    report.projections = projections
    model.oelm_report = report
    model.oelm_config = config
    model.print_trainable_parameters = functools.partial(print_trainable_parameters, model)
    attach_checkpoint_hooks(model)
    mark_parts(model, config.method)
    return report


def apply_oelm(model: nn.Module, config: OELMConfig | str = "oelm_freeze", *, seed: int | None = None,
               target_modules: dict[str, Any] | None = None, num_heads: int | None = None) -> ParameterReport:
    """Apply an OELM method to ``model`` in place and return its parameter report.

    Steps: find every attention module's query/key projections through the architecture registry
    (:func:`find_attention_projections`); when the method targets Q/K and the family fuses Q/K/V
    into one module (GPT-2 ``c_attn``, GPT-NeoX ``query_key_value``), replace that module by an
    output-identical :class:`SplitQKV` first (:func:`split_fused_projections`; forward and backward
    hooks on it move along); draw ``config.reservoir_layers`` and ``config.fixed_attention``
    (:mod:`oelm.method.reservoir`); initialize the ``config.targets`` weights per ``config.init``,
    head-wise with the projection's own head count (``num_kv_heads`` for K under grouped-query
    attention; biases kept); set ``requires_grad=False`` on them (their biases too if
    ``config.freeze_bias``) and on ``config.extra_frozen_groups``; give each query projection a
    trainable per-head ``head_temperature`` when ``config.head_temperature`` says (:mod:`oelm.method.temperature`).
    With ``config.split_fused`` methods without Q/K targets split fused modules too (every method of
    a comparison runs the same kernels); unknown models are left as they are by methods without targets.

    The report goes on the model as ``model.oelm_report``, the config as ``model.oelm_config``;
    ``model.print_trainable_parameters()`` prints the report's line (as on a PEFT model);
    ``model.save_pretrained`` writes the stock layout with the recipe in ``config.json``, and a
    ``load_state_dict`` pre-hook refuses a frozen tensor that would change (:mod:`oelm.method.checkpoint_record`).
    Instance attributes, all listed in :data:`~oelm.method.merge.OELM_ATTRIBUTES`: the class and other instances are
    untouched, and the model still pickles and deep-copies. Every submodule is marked as a part of
    it (:mod:`oelm.method.marks`), so one application per module tree: a model that went through
    ``apply_oelm``, holds a module that did, or is a part of one is refused before anything changes.

    Args:
        model: a supported model (see :data:`ARCHITECTURES`, or register one, or name its
            projections with ``target_modules``), or a module of one (``model.bert``).
        config: an :class:`OELMConfig` or a name from :data:`METHODS`.
        seed: overrides ``config.seed`` for random draws.
        target_modules: PEFT-style names of the projections for a model no registry entry knows
            (:mod:`oelm.architectures.target_modules`); the spec stays on the model, checkpoints record it.
        num_heads: the query head count with ``target_modules`` when the model's config has none.

    Returns:
        :class:`ParameterReport`: ``str(report)`` is the PEFT-style line; ``report.projections``
        has one entry per (site, target): module, kind, layer, shape, heads, head_dim, fused layout,
        frozen flag, ``max_orthogonality_error``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, ``config`` neither an :class:`OELMConfig` nor
            a name, ``seed`` not a non-negative int.
        ConfigError: unknown method name; ``reservoir_layers`` names a layer the model lacks.
        OELMError: the tree already carries an OELM application (named); a DDP / ``torch.compile``
            wrapper; a fused module with state-dict or load hooks.
        UnsupportedModelError: no query/key projections found (supported types listed); ``fixed_attention``
            on a model that is not oelm's GPT.
    """
    require_module(model, "apply_oelm")
    config = _resolve_config(config, seed, "apply_oelm")
    _refuse_before_changes(model, config, target_modules, num_heads)
    sites = _split_and_find(model, config, target_modules)
    generator = torch.Generator().manual_seed(config.seed) if config.seed is not None else None
    # Draw order (a lean checkpoint repeats it): reservoir layers, the fixed map, Q/K per site, then V/O.
    if config.reservoir_layers:
        reservoir_(model, config.reservoir_layers, generator)
    if config.fixed_attention:
        fixed_attention_(model, generator)
    before = head_norms(sites) if config.head_temperature == NORM_RATIO else None
    projections = _init_and_freeze(sites, config, generator)
    if config.head_temperature is not None:  # after the init: its ratio is of the norms before and after
        add_head_temperatures_(sites, config.head_temperature, before)
    if config.mimetic_value_output:  # drawn last, so the Q/K draws do not depend on it
        mimetic_value_output_all_(model, generator)
    return _finish(model, config, projections)


def get_oelm_model(model: nn.Module, config: OELMConfig | str = "oelm_freeze", *, seed: int | None = None,
                   **targets: Any) -> nn.Module:
    """PEFT-style entry point: apply ``config`` to ``model`` (in place) and return the model.

    Same as :func:`apply_oelm` (``targets``: its ``target_modules`` / ``num_heads``), but returns the model (like ``peft.get_peft_model``); the report
    is on ``model.oelm_report`` and ``model.print_trainable_parameters()`` (or
    :func:`print_trainable_parameters`) prints its summary line::

        model = get_oelm_model(AutoModelForCausalLM.from_config(cfg), "oelm_freeze", seed=0)
        model.print_trainable_parameters()

    Raises:
        ConfigError, OELMError, UnsupportedModelError: as :func:`apply_oelm`.
    """
    require_module(model, "get_oelm_model")
    apply_oelm(model, config, seed=seed, **targets)
    return model
