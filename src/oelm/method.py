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

Named methods (:data:`METHODS`):

========================  =====================================================================
``baseline``              nothing initialized or frozen, everything trains (fused Q/K/V still split,
                          see ``OELMConfig.split_fused``)
``oelm_freeze``           Q/K rows orthonormalized per head (pretrained weights are orthogonalized,
                          a fresh model's random init becomes a random orthogonal draw), frozen
``oelm_random``           Q/K ~ N(0, 0.02^2), frozen: the original project's ablation
``oelm_random_matched``   Q/K ~ N(0, 1/hidden_size), frozen: same row norm as orthonormal rows
``oelm_global``           one QR over the whole Q/K matrix (not per head), frozen
``oelm_qk_ffn``           ``oelm_freeze`` plus the feed-forward weights frozen
``oelm_ffn_only``         only the feed-forward weights frozen (Q/K train)
========================  =====================================================================

The way back out is :func:`merge_and_unload` (PEFT's name): it fuses split Q/K/V modules back
into the architecture's own module with the trained values and removes everything
``apply_oelm`` put on the model, so ``model.save_pretrained(dir)`` writes a checkpoint that a
stock ``AutoModelForCausalLM.from_pretrained(dir)`` loads completely. Before that,
``model.save_pretrained`` (and so Hugging Face ``Trainer``'s checkpoints) already writes the
stock layout, with the method's recipe in ``config.json`` (:mod:`oelm.recipe`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from oelm.architectures import (
    ARCHITECTURE_ATTRIBUTE,
    ARCHITECTURES,
    FUSED_LAYOUTS,
    PARAMETER_GROUPS,
    ArchitectureSpec,
    AttentionSpec,
    ProjectionSite,
    SplitQKV,
    architecture_from_dict,
    architecture_of,
    attach_architecture,
    find_attention_projections,
    fuse_split_projections,
    load_architecture,
    register_architecture,
    split_fused_projections,
)
from oelm.errors import ConfigError, OELMError, UnsupportedModelError
from oelm.init import global_orthogonal_, head_wise_orthogonal_, max_orthogonality_error, normal_
from oelm.recipe import CHECKPOINT_ATTRIBUTES, attach_checkpoint_hooks, detach_checkpoint_hooks

__all__ = [
    "OELMConfig",
    "METHODS",
    "get_method",
    "PARAMETER_GROUPS",
    "FUSED_LAYOUTS",
    "ArchitectureSpec",
    "AttentionSpec",
    "ARCHITECTURES",
    "register_architecture",
    "architecture_from_dict",
    "load_architecture",
    "ProjectionSite",
    "find_attention_projections",
    "SplitQKV",
    "split_fused_projections",
    "ParameterReport",
    "parameter_report",
    "apply_oelm",
    "get_oelm_model",
    "print_trainable_parameters",
    "merge_and_unload",
    "OELM_ATTRIBUTES",
]

InitName = Literal["none", "orthogonalize", "random_orthogonal", "global_orthogonal", "normal"]


@dataclass(frozen=True)
class OELMConfig:
    """What ``apply_oelm`` does to a model. Field ``metadata["help"]`` documents each knob."""

    method: str = field(default="oelm_freeze", metadata={"help": "Name used in reports and run directories."})
    init: InitName = field(
        default="orthogonalize",
        metadata={
            "help": "Q/K initialization: 'orthogonalize' (QR per head of the current weight), "
            "'random_orthogonal' (fresh Gaussian draw, then QR per head), 'global_orthogonal' "
            "(one QR over the whole matrix), 'normal' (Gaussian with normal_std), 'none' (keep)."
        },
    )
    normal_std: float | Literal["matched"] = field(
        default=0.02,
        metadata={"help": "Std for init='normal'; 'matched' = 1/sqrt(hidden_size), row norm ~1."},
    )
    targets: tuple[str, ...] = field(
        default=("query", "key"), metadata={"help": "Which projections to initialize and freeze."}
    )
    freeze: bool = field(default=True, metadata={"help": "Freeze the target projections."})
    freeze_bias: bool = field(default=True, metadata={"help": "Freeze the target projections' biases too."})
    extra_frozen_groups: tuple[str, ...] = field(
        default=(), metadata={"help": f"Parameter groups frozen in addition, from {PARAMETER_GROUPS}."}
    )
    seed: int | None = field(
        default=None, metadata={"help": "Seed of random draws (random_orthogonal, normal); None: torch's global RNG."}
    )
    split_fused: bool = field(
        default=True,
        metadata={
            "help": "Split fused Q/K/V modules (GPT-2 c_attn, GPT-NeoX query_key_value) into separate, "
            "output-identical q/k/v nn.Linear for every method, baseline and oelm_ffn_only included, so all "
            "methods of a timed comparison run the same three matmuls instead of baseline keeping one fused "
            "matmul. False: only methods that target Q/K split (they must, to freeze whole tensors); "
            "baseline then keeps the fused module. Outputs are identical either way (up to float summation order)."
        },
    )

    def __post_init__(self) -> None:
        if not isinstance(self.method, str) or not self.method:
            raise ConfigError(f"OELMConfig.method must be a non-empty name (str), got {self.method!r}")
        for name in ("targets", "extra_frozen_groups"):
            value = getattr(self, name)
            if isinstance(value, str) or not isinstance(value, (tuple, list)):
                raise ConfigError(f"OELMConfig.{name} must be a tuple of names, e.g. ('query', 'key'), got {value!r}")
        for name in ("freeze", "freeze_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"OELMConfig.{name} must be True or False, got {getattr(self, name)!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63):
            raise ConfigError(f"OELMConfig.seed must be None or an int in [0, 2**63), got {self.seed!r}")
        valid_inits = ("none", "orthogonalize", "random_orthogonal", "global_orthogonal", "normal")
        if self.init not in valid_inits:
            raise ConfigError(f"OELMConfig.init={self.init!r} is not one of {valid_inits}")
        bad = [t for t in self.targets if t not in ("query", "key")]
        if bad:
            raise ConfigError(f"OELMConfig.targets has {bad}; allowed: 'query', 'key'")
        bad = [g for g in self.extra_frozen_groups if g not in PARAMETER_GROUPS]
        if bad:
            raise ConfigError(f"OELMConfig.extra_frozen_groups has {bad}; allowed: {PARAMETER_GROUPS}")
        if not isinstance(self.split_fused, bool):
            raise ConfigError(f"OELMConfig.split_fused must be true or false, got {self.split_fused!r}")
        if self.normal_std != "matched" and not (
            isinstance(self.normal_std, (int, float)) and not isinstance(self.normal_std, bool)
            and math.isfinite(self.normal_std) and self.normal_std > 0
        ):
            raise ConfigError(f"OELMConfig.normal_std must be a positive number or 'matched', got {self.normal_std!r}")

    def replace(self, **changes: Any) -> "OELMConfig":
        """A copy with ``changes`` applied (unknown field -> :class:`ConfigError`)."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise ConfigError(f"unknown OELMConfig field(s) {unknown}; valid fields: {sorted(names)}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["targets"] = list(self.targets)
        d["extra_frozen_groups"] = list(self.extra_frozen_groups)
        return d


METHODS: dict[str, OELMConfig] = {
    "baseline": OELMConfig(method="baseline", init="none", targets=(), freeze=False),
    "oelm_freeze": OELMConfig(method="oelm_freeze", init="orthogonalize"),
    "oelm_random": OELMConfig(method="oelm_random", init="normal", normal_std=0.02),
    "oelm_random_matched": OELMConfig(method="oelm_random_matched", init="normal", normal_std="matched"),
    "oelm_global": OELMConfig(method="oelm_global", init="global_orthogonal"),
    "oelm_qk_ffn": OELMConfig(method="oelm_qk_ffn", init="orthogonalize", extra_frozen_groups=("ffn",)),
    "oelm_ffn_only": OELMConfig(
        method="oelm_ffn_only", init="none", targets=(), freeze=False, extra_frozen_groups=("ffn",)
    ),
}


def get_method(name: str) -> OELMConfig:
    """The named method's :class:`OELMConfig`.

    Raises:
        TypeError: ``name`` is not a string.
        ConfigError: unknown name (the closest named method suggested, all of them listed).
    """
    if not isinstance(name, str):
        raise TypeError(f"a method name is a str (one of {', '.join(METHODS)}), got {type(name).__name__} {name!r}")
    try:
        return METHODS[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(METHODS), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"unknown method {name!r}; {hint}named methods are: {', '.join(METHODS)}") from None


def _require_module(model: Any, func: str) -> None:
    """Refuse anything but an ``nn.Module`` as the model argument of ``func``, with one line."""
    if isinstance(model, nn.Module):
        return
    hint = ""
    if isinstance(model, (str, os.PathLike)):
        hint = (f"; load the model first, e.g. model = AutoModelForCausalLM.from_pretrained({str(model)!r}, "
                "trust_remote_code=False), then oelm." + func + "(model, ...)")
    raise TypeError(f"oelm.{func} expects a torch.nn.Module (a transformers or oelm model), got {type(model).__name__}{hint}")


def _resolve_config(config: Any, seed: Any, func: str) -> OELMConfig:
    """``config`` as an :class:`OELMConfig` (a method name looked up), with ``seed`` applied."""
    if isinstance(config, str):
        config = get_method(config)
    elif not isinstance(config, OELMConfig):
        if isinstance(config, dict):
            hint = "; for a mapping, pass OELMConfig(**mapping)"
        elif hasattr(config, "oelm_config"):
            hint = "; for a config's method entry, pass entry.oelm_config()"
        else:
            hint = ""
        raise TypeError(f"oelm.{func}: config must be an OELMConfig or a method name ({', '.join(METHODS)}), "
                        f"got {type(config).__name__}{hint}")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise TypeError(f"oelm.{func}: seed must be None or an int in [0, 2**63), got {seed!r}")
        config = config.replace(seed=seed)
    return config


# --------------------------------------------------------------------------------------------
# Parameter report
# --------------------------------------------------------------------------------------------


@dataclass
class ParameterReport:
    """Trainable/frozen parameter counts of a model, overall and per group.

    Counts are numbers of scalar parameters; tied weights are counted once. ``groups`` maps a
    group name (embeddings, attention_query/key/value/output, ffn, norm, head, other) to
    ``{"total", "trainable", "frozen"}``. ``projections`` lists where Q/K were found (empty for a
    report made without ``apply_oelm``).
    """

    method: str
    total: int
    trainable: int
    frozen: int
    groups: dict[str, dict[str, int]]
    projections: list[dict[str, Any]] = field(default_factory=list)

    @property
    def trainable_percent(self) -> float:
        """Trainable share of all parameters, in %."""
        return 100.0 * self.trainable / self.total if self.total else 0.0

    def __str__(self) -> str:
        return (
            f"trainable params: {self.trainable:,} || all params: {self.total:,} "
            f"|| trainable%: {self.trainable_percent:.4f}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "total": self.total,
            "trainable": self.trainable,
            "frozen": self.frozen,
            "trainable_percent": self.trainable_percent,
            "groups": self.groups,
            "projections": self.projections,
        }

    def table(self) -> str:
        """The per-group table as aligned plain text."""
        lines = [f"{'group':<18}{'total':>14}{'trainable':>14}{'frozen':>14}"]
        for g, c in self.groups.items():
            lines.append(f"{g:<18}{c['total']:>14,}{c['trainable']:>14,}{c['frozen']:>14,}")
        lines.append(f"{'all':<18}{self.total:>14,}{self.trainable:>14,}{self.frozen:>14,}")
        return "\n".join(lines)


def _group_of(name: str, patterns: tuple[tuple[str, str], ...]) -> str:
    for group, regex in patterns:
        if re.search(regex, name):
            return group
    return "other"


def parameter_report(model: nn.Module, method: str = "") -> ParameterReport:
    """Count total/trainable/frozen parameters of ``model``, overall and per group.

    Groups come from the model's registry entry: the query/key projections found by
    :func:`find_attention_projections` (split ones, and SplitQKV's value) are
    ``attention_query``/``attention_key``/``attention_value`` whatever the patterns say; every
    other parameter gets the first matching ``group_patterns`` regex. A model of unknown type
    gets only ``"other"``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
    """
    _require_module(model, "parameter_report")
    try:
        patterns = architecture_of(model).group_patterns
        sites = find_attention_projections(model)
    except UnsupportedModelError:
        patterns, sites = (), []
    by_id: dict[int, str] = {}
    for site in sites:
        if site.is_split:
            for module, group in ((site.query, "attention_query"), (site.key, "attention_key")):
                by_id.update({id(p): group for p in module.parameters()})
    by_id.update({id(p): "attention_value" for m in model.modules() if isinstance(m, SplitQKV) for p in m.value.parameters()})
    groups = {g: {"total": 0, "trainable": 0, "frozen": 0} for g in PARAMETER_GROUPS}
    for name, p in model.named_parameters():  # named_parameters() yields tied weights once
        g = groups[by_id.get(id(p)) or _group_of(name, patterns)]
        g["total"] += p.numel()
        g["trainable" if p.requires_grad else "frozen"] += p.numel()
    groups = {k: v for k, v in groups.items() if v["total"]}
    total = sum(v["total"] for v in groups.values())
    trainable = sum(v["trainable"] for v in groups.values())
    return ParameterReport(method=method, total=total, trainable=trainable, frozen=total - trainable, groups=groups)


def print_trainable_parameters(model: nn.Module) -> None:
    """Print the PEFT-style line ``trainable params: … || all params: … || trainable%: …``."""
    print(parameter_report(model))


# --------------------------------------------------------------------------------------------
# apply_oelm
# --------------------------------------------------------------------------------------------


def _init_projection(weight: torch.Tensor, heads: int, config: OELMConfig, generator: torch.Generator | None) -> None:
    if config.init == "orthogonalize":
        head_wise_orthogonal_(weight, heads)
    elif config.init == "random_orthogonal":
        normal_(weight, std=1.0, generator=generator)
        head_wise_orthogonal_(weight, heads)
    elif config.init == "global_orthogonal":
        global_orthogonal_(weight)
    elif config.init == "normal":
        normal_(weight, std=config.normal_std, generator=generator)


def _split_if_fused_family(model: nn.Module) -> None:
    """Split fused Q/K/V modules of a registered fused family; other models are left alone.

    For methods without Q/K targets (``baseline``, ``oelm_ffn_only``), which must keep working on
    models oelm has no registry entry for: an unknown model or a family without fused layouts is
    not an error here.
    """
    try:
        spec = architecture_of(model)
    except UnsupportedModelError:
        return
    if any(a.fused is not None for a in spec.attention):
        split_fused_projections(model)


#: Instance attributes :func:`apply_oelm` sets on the model (and :func:`merge_and_unload` removes):
#: the report, the config, a PEFT-style ``print_trainable_parameters``, the checkpoint hooks of
#: :mod:`oelm.recipe` (``save_pretrained`` in the stock layout, the load hook's handle), and the
#: spec ``target_modules`` gave.
OELM_ATTRIBUTES = ("oelm_report", "oelm_config", "print_trainable_parameters", *CHECKPOINT_ATTRIBUTES, ARCHITECTURE_ATTRIBUTE)


def _is_bound(value: Any, func: Any) -> bool:
    return isinstance(value, functools.partial) and value.func is func


def apply_oelm(model: nn.Module, config: OELMConfig | str = "oelm_freeze", *, seed: int | None = None,
               target_modules: dict[str, Any] | None = None, num_heads: int | None = None) -> ParameterReport:
    """Apply an OELM method to ``model`` in place and return its parameter report.

    Steps: find every attention module's query/key projections through the architecture
    registry (:func:`find_attention_projections`); when the method targets Q/K and the family
    fuses Q/K/V into one module (GPT-2 ``c_attn``, GPT-NeoX ``query_key_value``), replace that
    module by an output-identical :class:`SplitQKV` first (:func:`split_fused_projections`);
    initialize the ``config.targets`` weights per ``config.init``, head-wise with the
    projection's own head count (``num_kv_heads`` for K under grouped-query attention; biases are
    kept); set ``requires_grad=False`` on them (and their biases if ``config.freeze_bias``) and on
    every parameter of ``config.extra_frozen_groups``. With ``config.split_fused`` (the default)
    methods without Q/K targets (``baseline``, ``oelm_ffn_only``) split fused modules too, so
    every method of a comparison runs the same kernels; ``baseline`` otherwise changes nothing
    (with ``split_fused=False`` fused modules stay fused). Models of unknown type are left as
    they are by methods without targets.

    The report is also stored on the model as ``model.oelm_report`` and the config as
    ``model.oelm_config``, and ``model.print_trainable_parameters()`` prints the report's line (as
    on a PEFT model). ``model.save_pretrained`` (this instance only) writes the stock layout, split
    modules fused again on a copy of the state dict, with the recipe in ``config.json``, and a
    ``load_state_dict`` pre-hook refuses a state dict that would change a frozen tensor, so Hugging
    Face ``Trainer``'s checkpoints and ``resume_from_checkpoint`` work on split models (see
    :mod:`oelm.recipe`). Instance attributes, not a subclass or a patched class: the model keeps
    its class, other instances are untouched, and it still pickles and deep-copies. All of these
    are listed in :data:`OELM_ATTRIBUTES`.

    A model that already went through ``apply_oelm`` (``model.oelm_config`` is set) is refused
    before anything changes: a second method on top would mix two initializations and two sets
    of frozen tensors that no lean checkpoint records. Start from a fresh model, or call
    :func:`merge_and_unload` first (which makes it a plain model again).

    Args:
        model: a supported model (see :data:`ARCHITECTURES`, or register one, or name its
            projections with ``target_modules``).
        config: an :class:`OELMConfig` or a name from :data:`METHODS`.
        seed: overrides ``config.seed`` for random draws.
        target_modules: PEFT-style names of the projections, for a model no registry entry knows:
            ``{"query": "q_proj", "key": "k_proj"}`` or ``{"qkv": "c_attn", "layout": "qkv_conv1d"}``
            (module-name suffixes or full-name regexes; :mod:`oelm.architectures.targets`). The
            spec built from them stays on this model (``model.oelm_architecture``); checkpoints record it.
        num_heads: the query head count with ``target_modules`` when the model's config has none.

    Returns:
        :class:`ParameterReport`; ``str(report)`` is the PEFT-style line; ``report.projections``
        has one entry per (site, target) with module, kind, layer, shape, heads, head_dim, fused
        layout, frozen flag and ``max_orthogonality_error``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` (``None``, a name: load the model first),
            ``config`` neither an :class:`OELMConfig` nor a name, ``seed`` not a non-negative int.
        ConfigError: unknown method name.
        OELMError: the model already carries an OELM application (``model.oelm_config``).
        UnsupportedModelError: the model's query/key projections cannot be found; the message
            lists supported model types and how to register one.
    """
    _require_module(model, "apply_oelm")
    config = _resolve_config(config, seed, "apply_oelm")
    if config.targets and any(p.is_meta for p in model.parameters()):
        raise OELMError(
            f"{type(model).__name__} has parameters on the meta device (shapes without values), so its query/key "
            "weights cannot be initialized; materialize the model first (load it without device_map='meta' / "
            "init_empty_weights, or model.to_empty(device=...) and load its weights)"
        )
    previous = getattr(model, "oelm_config", None)
    if previous is not None:
        raise OELMError(
            f"{type(model).__name__} already went through apply_oelm ({getattr(previous, 'method', previous)!r}); "
            f"applying {config.method!r} on top would mix two methods' initialization and freezing. Fix: start from a "
            "fresh model, or call model = oelm.merge_and_unload(model) first to make it a plain model again"
        )
    if target_modules is not None:
        attach_architecture(model, target_modules, num_heads=num_heads)  # refused here if nothing fits
    if config.targets:
        split_fused_projections(model)
        sites = find_attention_projections(model)
    else:
        sites = []
        if config.extra_frozen_groups:
            architecture_of(model)  # unknown model -> UnsupportedModelError, not a silent "other" group
        if config.split_fused:
            _split_if_fused_family(model)
    generator = torch.Generator().manual_seed(config.seed) if config.seed is not None else None

    projections = []
    for site in sites:
        for target in config.targets:
            linear, heads = site.module(target), site.heads(target)
            if config.init != "none":
                _init_projection(linear.weight, heads, config, generator)
            if config.freeze:
                linear.weight.requires_grad_(False)
                if linear.bias is not None and config.freeze_bias:
                    linear.bias.requires_grad_(False)
            projections.append(
                {
                    "layer": site.layer,
                    "kind": site.kind,
                    "target": target,
                    "module": site.query_name if target == "query" else site.key_name,
                    "shape": list(linear.weight.shape),
                    "num_heads": heads,
                    "head_dim": site.head_dim,
                    "fused": site.fused,
                    "bias": linear.bias is not None,
                    "frozen": not linear.weight.requires_grad,
                    "max_orthogonality_error": max_orthogonality_error(linear.weight, heads),
                }
            )

    if config.extra_frozen_groups:
        patterns = architecture_of(model).group_patterns
        for name, p in model.named_parameters():
            if _group_of(name, patterns) in config.extra_frozen_groups:
                p.requires_grad_(False)

    report = parameter_report(model, method=config.method)
    report.projections = projections
    model.oelm_report = report
    model.oelm_config = config
    model.print_trainable_parameters = functools.partial(print_trainable_parameters, model)
    attach_checkpoint_hooks(model)
    return report


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
    _require_module(model, "get_oelm_model")
    apply_oelm(model, config, seed=seed, **targets)
    return model


def merge_and_unload(model: nn.Module) -> nn.Module:
    """Turn an OELM model back into a plain model of its architecture, in place, and return it.

    PEFT's name for the way out. Every :class:`SplitQKV` is fused back into the architecture's
    own module and layout with the trained values (GPT-2 ``c_attn``: a ``Conv1D`` with weight
    ``[hidden, 3*hidden]``; GPT-NeoX ``query_key_value``: an ``nn.Linear`` with rows
    ``[num_heads, 3, head_dim]``; see :meth:`SplitQKV.fuse`), so the state dict has the stock
    parameter names and ``model.save_pretrained(dir)`` writes a checkpoint that a stock
    ``from_pretrained(dir)`` loads with no missing or unexpected keys. Outputs are unchanged up to
    floating-point summation order. Then every attribute in :data:`OELM_ATTRIBUTES` is removed
    (the report, the config, ``print_trainable_parameters``, oelm's ``save_pretrained``, so the
    class's own is back, and the load hook; a recipe that a stock ``from_pretrained`` put on
    ``model.config`` goes too), and ``apply_oelm`` may be applied again.

    Freezing is unloaded too: every parameter gets ``requires_grad=True``, as in a model that
    ``from_pretrained`` returns, since nothing marks the model as OELM any more (extra groups
    and parameters frozen by hand included). To train on with Q/K frozen, do not merge yet, or
    apply ``oelm_freeze`` again with ``init="none"`` (it keeps the values and freezes them).

    A model without split modules and without OELM attributes (never touched by ``apply_oelm``)
    is returned unchanged (``requires_grad`` flags included). A model with OELM attributes but
    nothing split (BERT, Llama, ...: separate Q/K already) keeps its modules and parameter names;
    its attributes are removed and its parameters made trainable.

    Args:
        model: the model ``apply_oelm`` ran on (not a DistributedDataParallel / ``torch.compile``
            wrapper: unwrap it first); any device and dtype, kept.

    Returns:
        ``model`` itself.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: a :class:`SplitQKV` whose query/key/value disagree on bias or input size
            (not one that ``apply_oelm`` made).
    """
    _require_module(model, "merge_and_unload")
    fused = fuse_split_projections(model)
    detached = detach_checkpoint_hooks(model)
    attributes = vars(model)
    # a method of that name the user set on the instance is theirs: only oelm's partial goes
    ours = [n for n in ("oelm_report", "oelm_config", ARCHITECTURE_ATTRIBUTE) if n in attributes]
    if _is_bound(attributes.get("print_trainable_parameters"), print_trainable_parameters):
        ours.append("print_trainable_parameters")
    if not fused and not ours and not detached:
        return model
    for name in ours:
        delattr(model, name)
    for p in model.parameters():
        p.requires_grad_(True)
    return model
