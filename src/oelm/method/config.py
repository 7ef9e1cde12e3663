"""What an OELM method is, as data: :class:`OELMConfig` (every knob, declared once, with its help
text), the named methods (:data:`METHODS`, :func:`get_method`) and the table of Q/K init kinds
(:data:`INIT_KINDS`: name, summary, source, whether it draws from the seed). PEFT keeps a method's
knobs the same way, in ``tuners/<method>/config.py`` beside the code that applies them.

This module imports no torch: the experiment config's keys-and-types pass (:mod:`oelm.config`) reads
it before torch loads, and ``methods:`` entries take their OELM knobs from :class:`OELMConfig`'s
fields (:class:`oelm.config.MethodEntry`), so a new knob is a field here and its operation in
:mod:`oelm.method.apply` (or the module ``apply_oelm`` calls for it). The functions behind each init
kind are :data:`oelm.method.init.INITS`, which refuses on import to differ from :data:`INIT_KINDS`.

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
                          :mod:`oelm.method.temperature`
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

A knob that only oelm's own GPT can honour says so in its field metadata (``"oelm_gpt"``: what it
does there); :meth:`OELMConfig.needs_oelm_gpt` lists the ones a config sets, and the experiment
config refuses them for a Hugging Face model in one place.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt  # constraints pydantic reads (MethodEntry): installed with pydantic

from oelm.architectures.spec import PARAMETER_GROUPS
from oelm.errors import ConfigError

__all__ = [
    "OELMConfig", "METHODS", "get_method", "InitKind", "INIT_KINDS", "INIT_NAMES", "InitName", "RANDOM_INITS",
    "ALTERNATE", "NORM_RATIO", "RUN_FIELDS", "check_head_temperature",
]


@dataclass(frozen=True)
class InitKind:
    """One value of ``OELMConfig.init``: how the query/key projections are initialized (its
    functions: :data:`oelm.method.init.INITS`).

    Attributes:
        name: the value in configs and checkpoints.
        summary: one line for docs and errors.
        source: where the method comes from (paper, or "oelm").
        draws_random: True when it draws from ``OELMConfig.seed`` (a lean checkpoint then needs the
            seed to regenerate it; without one the frozen tensors are stored).
        pairs: True when it sets the query and key projections of a head together (so both must be
            targets); else each target projection on its own.
    """

    name: str
    summary: str
    source: str
    draws_random: bool = False
    pairs: bool = False


#: Every init kind, by name, in the order docs list them.
INIT_KINDS: dict[str, InitKind] = {
    kind.name: kind
    for kind in (
        InitKind("none", "keep the current weights (pretrained, or the model's own init)", "oelm"),
        InitKind("orthogonalize", "QR per head of the current weights: orthonormal rows, same row space",
                 "the original OELM project"),
        InitKind("orthogonalize_rescaled", "as orthogonalize, each head rescaled to its Frobenius norm before",
                 "oelm (temperature control)"),
        InitKind("polar", "the nearest orthonormal rows per head: U V^T of each head's SVD U S V^T (same row space)",
                 "Fan & Hoffman 1955; Higham 1986"),
        InitKind("random_orthogonal", "a fresh N(0, 1) draw, then QR per head: a random (Haar) orthonormal frame",
                 "Mezzadri 2007 (Haar draw)", draws_random=True),
        InitKind("global_orthogonal", "one QR over the whole matrix, not per head", "the original OELM project"),
        InitKind("normal", "N(0, normal_std^2) draws (0.02, or 'matched' = 1/sqrt(hidden_size))",
                 "the original OELM project (std 0.02)", draws_random=True),
        InitKind("mimetic", "W_q,h^T W_k,h ~ 0.7 I + 0.7 Z per head (rank-head_dim SVD factors)",
                 "Trockman & Kolter, ICML 2023", draws_random=True, pairs=True),
    )
}
#: The init kinds' names, in the table's order (the docs list them so).
INIT_NAMES: tuple[str, ...] = tuple(INIT_KINDS)
#: ``Literal`` of :data:`INIT_NAMES`: the type of ``OELMConfig.init`` and of a config's ``init:``.
InitName = Literal[INIT_NAMES]  # type: ignore[valid-type]
#: Names of the kinds that draw random numbers.
RANDOM_INITS: frozenset[str] = frozenset(name for name, kind in INIT_KINDS.items() if kind.draws_random)

#: ``OELMConfig.reservoir_layers`` value meaning every other layer, starting with the second (indices 1, 3,
#: 5, ...), so the first layer, which reads the embeddings, and alternate layers after it train
#: (:mod:`oelm.method.reservoir`).
ALTERNATE = "alternate"
#: ``OELMConfig.head_temperature`` value: start at the ratio of each head's norm before / after the init
#: (:mod:`oelm.method.temperature`).
NORM_RATIO = "norm_ratio"
#: Fields a run sets, not a ``methods:`` entry: the entry's name is ``method``, the run's seed is ``seed``.
RUN_FIELDS = ("method", "seed")


def check_head_temperature(value: Any, targets: tuple[str, ...], fixed_attention: bool) -> None:
    """Check ``OELMConfig.head_temperature`` against the config's other fields.

    Raises:
        ConfigError: not None, ``"norm_ratio"`` or a finite positive number; set without both
            query and key as targets (the ratio needs both norms); set with ``fixed_attention``
            (the fixed map does not use q).
    """
    if value is None:
        return
    if value != NORM_RATIO and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                    and math.isfinite(value) and value > 0):
        raise ConfigError(f"OELMConfig.head_temperature must be None, '{NORM_RATIO}' or a positive number (1.0 from "
                          f"scratch), got {value!r}")
    if set(targets) != {"query", "key"}:
        raise ConfigError(f"OELMConfig.head_temperature scales each query head's logits and starts from the query and "
                          f"key norms; targets must be ('query', 'key'), got {tuple(targets)}")
    if fixed_attention:
        raise ConfigError("OELMConfig.head_temperature with fixed_attention: the fixed map does not use the query "
                          "projection, so a temperature on it would never act; set one of them")


#: Fields added after checkpoints and run records existed: :meth:`OELMConfig.to_dict` leaves them out
#: while they hold these defaults, so earlier methods keep their recorded form (and fingerprints).
_LATER_FIELDS = {"reservoir_layers": (), "fixed_attention": False, "mimetic_value_output": False, "head_temperature": None}


@dataclass(frozen=True)
class OELMConfig:
    """What ``apply_oelm`` does to a model. Field ``metadata["help"]`` documents each knob."""

    method: str = field(default="oelm_freeze", metadata={"help": "Name used in reports and run directories."})
    init: InitName = field(
        default="orthogonalize",
        metadata={"help": "Q/K initialization, a kind of oelm.method.config.INIT_KINDS: " + "; ".join(
            f"'{k.name}' ({k.summary})" for k in INIT_KINDS.values())},
    )
    normal_std: float | Literal["matched"] = field(
        default=0.02,
        metadata={"help": "Std for init='normal'; 'matched' = 1/sqrt(hidden_size), row norm ~1."},
    )
    targets: tuple[Literal["query", "key"], ...] = field(
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
    reservoir_layers: tuple[Annotated[int, Ge(0)], ...] | Literal["alternate"] = field(
        default=(),
        metadata={"help": "Layers drawn at random and frozen whole (Reservoir Transformers): indices within each "
                  f"stack, or '{ALTERNATE}' (1, 3, 5, ...); () = none."},
    )
    fixed_attention: bool = field(
        default=False,
        metadata={"help": "Replace each head's attention scores by a frozen random map (Synthesizer Random); "
                  "oelm's GPT only.", "oelm_gpt": "replaces the attention scores inside oelm's own GPT"},
    )
    mimetic_value_output: bool = field(
        default=False,
        metadata={"help": "With init='mimetic': also set each attention module's value/output projections so their "
                  "product is ~0.4 Z - 0.4 I (Trockman & Kolter 2023's second half); they still train. oelm's GPT only.",
                  "oelm_gpt": "sets the value/output projections of oelm's own GPT"},
    )
    head_temperature: Annotated[float, Gt(0)] | Literal["norm_ratio"] | None = field(
        default=None,
        metadata={"help": "A trainable scalar per query head multiplying its attention logits (oelm.method.temperature), "
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
        if self.init not in INIT_KINDS:
            raise ConfigError(f"OELMConfig.init={self.init!r} is not one of {INIT_NAMES}")
        bad = [t for t in self.targets if t not in ("query", "key")]
        if bad:
            raise ConfigError(f"OELMConfig.targets has {bad}; allowed: 'query', 'key'")
        if INIT_KINDS[self.init].pairs and set(self.targets) != {"query", "key"}:
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
        return INIT_KINDS[self.init].draws_random or bool(self.reservoir_layers) or self.fixed_attention

    def replace(self, **changes: Any) -> "OELMConfig":
        """A copy with ``changes`` applied (unknown field -> :class:`ConfigError`)."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise ConfigError(f"unknown OELMConfig field(s) {unknown}; valid fields: {sorted(names)}")
        return dataclasses.replace(self, **changes)

    def needs_oelm_gpt(self) -> list[tuple[str, str]]:
        """The knobs this config sets that only oelm's own GPT honours, each with what it does there
        (field ``metadata["oelm_gpt"]``): ``[("fixed_attention", "replaces the attention scores inside
        oelm's own GPT")]``; empty for a method any supported model takes."""
        return [(f.name, f.metadata["oelm_gpt"]) for f in dataclasses.fields(self)
                if "oelm_gpt" in f.metadata and getattr(self, f.name) != f.default]

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON values (tuples as lists), leaving out later fields at their defaults
        (:data:`_LATER_FIELDS`): the form checkpoints and run records hold."""
        d = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}
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


