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
``oelm_pretrained_frozen`` Q/K frozen as they are (no QR): the control for ``oelm_freeze``
``oelm_rescaled``         ``oelm_freeze`` with each head rescaled to its pretrained (or default-init)
                          Frobenius norm: the temperature control
``oelm_temperature``      ``oelm_freeze``'s frozen Q/K plus one trainable scalar per query head on its
                          logits, starting at the norm ratio (step 0 = ``oelm_rescaled``; 1 from scratch):
                          :mod:`oelm.temperature`
``oelm_polar``            Q/K rows per head the nearest orthonormal ones (polar factor ``U V^T`` of the
                          head's SVD; Fan & Hoffman 1955), frozen: the control for QR's basis
``oelm_mimetic``          mimetic Q/K (Trockman & Kolter 2023: ``W_q^T W_k ≈ 0.7 I + 0.7 Z``), frozen
``mimetic_trained``       mimetic Q/K as the initialization, trained
``oelm_mimetic_vo``       ``oelm_mimetic`` plus mimetic V/O (``≈ 0.4 Z - 0.4 I``, trained); oelm's GPT only
``mimetic_vo_trained``    the paper's whole mimetic init (Q/K and V/O), trained; oelm's GPT only
``fixed_attention``       a frozen random attention map per head (Synthesizer "Random", Tay et al.
                          2021), oelm's GPT only; its unused Q/K frozen
``reservoir``             every other layer (1, 3, ...) drawn at random and frozen whole (Reservoir
                          Transformers, Shen et al. 2021)
========================  =====================================================================

The Q/K init kinds are the table :data:`oelm.init.INITS`; reservoir layers and the fixed map are
in :mod:`oelm.structural`.

The way back out is :func:`merge_and_unload` (PEFT's name): it fuses split Q/K/V modules back
into the architecture's own module with the trained values and removes everything
``apply_oelm`` put on the model, so ``model.save_pretrained(dir)`` writes a checkpoint that a
stock ``AutoModelForCausalLM.from_pretrained(dir)`` loads completely. Before that,
``model.save_pretrained`` (and so Hugging Face ``Trainer``'s checkpoints) already writes the
stock layout, with the method's recipe in ``config.json`` (:mod:`oelm.recipe`). ``apply_oelm`` may
treat a module of a model (``model.bert``); the whole tree then knows (:mod:`oelm.treated`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
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
    load_architecture,
    register_architecture,
    split_fused_projections,
)
from oelm.errors import ConfigError, OELMError, UnsupportedModelError
from oelm.init import INIT_NAMES, INITS, InitName
from oelm.merge import OELM_ATTRIBUTES, merge_and_unload
from oelm.parameters import (ParameterReport, group_of, parameter_report, print_trainable_parameters, projection_row,
                             require_module)
from oelm.recipe import attach_checkpoint_hooks
from oelm.structural import (ALTERNATE, find_layers, fixed_attention_, fixed_attention_modules, mimetic_value_output_all_,
                             reservoir_, reservoir_indices, value_output_modules)
from oelm.temperature import NORM_RATIO, add_head_temperatures_, check_head_temperature, head_norms, refuse_normalized_queries
from oelm.treated import mark_parts, part_line, refuse_wrapper, treated_line

__all__ = [
    "OELMConfig", "METHODS", "get_method", "PARAMETER_GROUPS", "FUSED_LAYOUTS", "ArchitectureSpec", "AttentionSpec",
    "ARCHITECTURES", "register_architecture", "architecture_from_dict", "load_architecture", "ProjectionSite",
    "find_attention_projections", "SplitQKV", "split_fused_projections", "ParameterReport", "parameter_report",
    "apply_oelm", "get_oelm_model", "print_trainable_parameters", "merge_and_unload", "OELM_ATTRIBUTES",
]

#: Fields added after checkpoints and run records existed: :meth:`OELMConfig.to_dict` leaves them out
#: while they hold these defaults, so earlier methods keep their recorded form (and fingerprints).
_LATER_FIELDS = {"reservoir_layers": (), "fixed_attention": False, "mimetic_value_output": False, "head_temperature": None}


@dataclass(frozen=True)
class OELMConfig:
    """What ``apply_oelm`` does to a model. Field ``metadata["help"]`` documents each knob."""

    method: str = field(default="oelm_freeze", metadata={"help": "Name used in reports and run directories."})
    init: InitName = field(
        default="orthogonalize",
        metadata={"help": "Q/K initialization, a kind of oelm.init.INITS: " + "; ".join(
            f"'{k.name}' ({k.summary})" for k in INITS.values())},
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
        default=None, metadata={"help": "Seed of random draws (random inits, reservoir layers, the fixed map); "
                                "None: torch's global RNG."}
    )
    reservoir_layers: tuple[int, ...] | str = field(
        default=(),
        metadata={"help": "Layers drawn at random and frozen whole (Reservoir Transformers): indices within each "
                  f"stack, or '{ALTERNATE}' (1, 3, 5, ...); () = none."},
    )
    fixed_attention: bool = field(
        default=False,
        metadata={"help": "Replace each head's attention scores by a frozen random map (Synthesizer Random); "
                  "oelm's GPT only."},
    )
    mimetic_value_output: bool = field(
        default=False,
        metadata={"help": "With init='mimetic': also set each attention module's value/output projections so their "
                  "product is ~0.4 Z - 0.4 I (Trockman & Kolter 2023's second half); they still train. oelm's GPT only."},
    )
    head_temperature: float | Literal["norm_ratio"] | None = field(
        default=None,
        metadata={"help": "A trainable scalar per query head multiplying its attention logits (oelm.temperature), "
                  f"and where it starts: '{NORM_RATIO}' (each head's Q and K norm before the init over after, biases "
                  "divided to match: step 0 = oelm_rescaled) or a number (1.0 from scratch: step 0 = oelm_freeze); "
                  "None: no temperature."},
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
        if self.init not in INITS:
            raise ConfigError(f"OELMConfig.init={self.init!r} is not one of {INIT_NAMES}")
        bad = [t for t in self.targets if t not in ("query", "key")]
        if bad:
            raise ConfigError(f"OELMConfig.targets has {bad}; allowed: 'query', 'key'")
        if INITS[self.init].pair is not None and set(self.targets) != {"query", "key"}:
            raise ConfigError(f"OELMConfig.init={self.init!r} sets query and key together; targets must be "
                              f"('query', 'key'), got {tuple(self.targets)}")
        self._check_structural()
        check_head_temperature(self.head_temperature, tuple(self.targets), self.fixed_attention)
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

    def _check_structural(self) -> None:
        layers = self.reservoir_layers
        if isinstance(layers, list):
            object.__setattr__(self, "reservoir_layers", layers := tuple(layers))
        if not (layers == ALTERNATE or isinstance(layers, tuple) and all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers) and len(set(layers)) == len(layers)):
            raise ConfigError(f"OELMConfig.reservoir_layers must be distinct layer indices >= 0 (e.g. (1, 3)) or "
                              f"'{ALTERNATE}', got {layers!r}")
        if not isinstance(self.fixed_attention, bool):
            raise ConfigError(f"OELMConfig.fixed_attention must be true or false, got {self.fixed_attention!r}")
        if not isinstance(self.mimetic_value_output, bool) or self.mimetic_value_output and self.init != "mimetic":
            raise ConfigError(f"OELMConfig.mimetic_value_output={self.mimetic_value_output!r} must be true or false, and "
                              f"true only with init='mimetic' (its value/output half; init is {self.init!r})")

    @property
    def draws_random(self) -> bool:
        """True when applying this config draws random numbers (from ``seed``): a random init kind,
        reservoir layers or a fixed attention map. A lean checkpoint regenerates them from the seed."""
        return INITS[self.init].draws_random or bool(self.reservoir_layers) or self.fixed_attention

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
        if isinstance(self.reservoir_layers, tuple):
            d["reservoir_layers"] = list(self.reservoir_layers)
        for name, default in _LATER_FIELDS.items():
            if getattr(self, name) == default:
                del d[name]
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
    "oelm_pretrained_frozen": OELMConfig(method="oelm_pretrained_frozen", init="none"),
    "oelm_rescaled": OELMConfig(method="oelm_rescaled", init="orthogonalize_rescaled"),
    "oelm_temperature": OELMConfig(method="oelm_temperature", init="orthogonalize", head_temperature=NORM_RATIO),
    "oelm_polar": OELMConfig(method="oelm_polar", init="polar"),
    "oelm_mimetic": OELMConfig(method="oelm_mimetic", init="mimetic"),
    "mimetic_trained": OELMConfig(method="mimetic_trained", init="mimetic", freeze=False),
    "oelm_mimetic_vo": OELMConfig(method="oelm_mimetic_vo", init="mimetic", mimetic_value_output=True),
    "mimetic_vo_trained": OELMConfig(method="mimetic_vo_trained", init="mimetic", freeze=False, mimetic_value_output=True),
    "fixed_attention": OELMConfig(method="fixed_attention", init="none", fixed_attention=True),
    "reservoir": OELMConfig(method="reservoir", init="none", targets=(), freeze=False, reservoir_layers=ALTERNATE),
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
    (:mod:`oelm.treated`: the marks go down the tree, since modules do not know their parents)."""
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
    (:mod:`oelm.structural`); initialize the ``config.targets`` weights per ``config.init``,
    head-wise with the projection's own head count (``num_kv_heads`` for K under grouped-query
    attention; biases kept); set ``requires_grad=False`` on them (their biases too if
    ``config.freeze_bias``) and on ``config.extra_frozen_groups``; give each query projection a
    trainable per-head ``head_temperature`` when ``config.head_temperature`` says (:mod:`oelm.temperature`).
    With ``config.split_fused`` methods without Q/K targets split fused modules too (every method of
    a comparison runs the same kernels); unknown models are left as they are by methods without targets.

    The report goes on the model as ``model.oelm_report``, the config as ``model.oelm_config``;
    ``model.print_trainable_parameters()`` prints the report's line (as on a PEFT model);
    ``model.save_pretrained`` writes the stock layout with the recipe in ``config.json``, and a
    ``load_state_dict`` pre-hook refuses a frozen tensor that would change (:mod:`oelm.recipe`).
    Instance attributes, all listed in :data:`OELM_ATTRIBUTES`: the class and other instances are
    untouched, and the model still pickles and deep-copies. Every submodule is marked as a part of
    it (:mod:`oelm.treated`), so one application per module tree: a model that went through
    ``apply_oelm``, holds a module that did, or is a part of one is refused before anything changes.

    Args:
        model: a supported model (see :data:`ARCHITECTURES`, or register one, or name its
            projections with ``target_modules``), or a module of one (``model.bert``).
        config: an :class:`OELMConfig` or a name from :data:`METHODS`.
        seed: overrides ``config.seed`` for random draws.
        target_modules: PEFT-style names of the projections for a model no registry entry knows
            (:mod:`oelm.architectures.targets`); the spec stays on the model, checkpoints record it.
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
