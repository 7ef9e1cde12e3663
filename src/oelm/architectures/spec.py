"""Architecture specs and their registry: :class:`AttentionSpec`, :class:`ArchitectureSpec`,
:data:`ARCHITECTURES`, registration from Python, a dict or a YAML file, and the look-up of a
model's spec (:func:`architecture_of`). The families oelm ships are in :mod:`oelm.architectures.builtin`."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from oelm.errors import ConfigError, UnsupportedModelError

if TYPE_CHECKING:  # torch only in annotations: the experiment config reads this module before torch loads
    from torch import nn

__all__ = [
    "PARAMETER_GROUPS",
    "FUSED_LAYOUTS",
    "AttentionSpec",
    "ArchitectureSpec",
    "ARCHITECTURES",
    "HeadCount",
    "register_architecture",
    "architecture_from_dict",
    "architecture_to_dict",
    "load_architecture",
    "architecture_of",
    "ARCHITECTURE_ATTRIBUTE",
]

# Fused Q/K/V layouts, named by how the fused output features are ordered:
#   qkv           nn.Linear, rows [q (num_heads*head_dim); k (num_kv_heads*head_dim); v (same)]
#   qkv_conv1d    transformers Conv1D (y = x @ W + b, W: [in, out]), output columns as ``qkv``
#   qkv_per_head  nn.Linear, rows [num_heads, 3, head_dim]: each head's q, k, v next to each other
FUSED_LAYOUTS = ("qkv", "qkv_conv1d", "qkv_per_head")

PARAMETER_GROUPS = (
    "embeddings",
    "attention_query",
    "attention_key",
    "attention_value",
    "attention_qkv",  # a fused Q/K/V projection that has not been split
    "attention_output",
    "attention_map",  # a fixed attention map (oelm GPT's fixed_attention method)
    "ffn",
    "norm",
    "head",
    "other",
)


HeadCount = str | int | None  # a config attribute name, a literal integer, or None (derive)


@dataclass(frozen=True)
class AttentionSpec:
    """One kind of attention module of an architecture.

    Attributes:
        pattern: regex matched with ``re.search`` against names from ``model.named_modules()``;
            it selects the attention modules of this kind, and its first group is the layer index.
        query / key: child names of the attention module holding the query / key projections
            (``nn.Linear``, weight ``[num_heads*head_dim, hidden_size]``). For a fused module,
            ``query`` names the fused child and ``key`` is ignored.
        kind: label that tells sites of one model apart, e.g. ``"self"``, ``"cross"``,
            ``"encoder.self"``, ``"decoder.cross"``; shown in the projections table.
        fused: ``None`` for separate projections, else one of :data:`FUSED_LAYOUTS`.
        num_heads / num_kv_heads: this kind's head counts when they differ from the
            architecture's (BART's encoder and decoder have their own): a config attribute name
            or an integer; None = the :class:`ArchitectureSpec`'s.
    """

    pattern: str
    query: str = "query"
    key: str = "key"
    kind: str = "self"
    fused: str | None = None
    num_heads: HeadCount = None
    num_kv_heads: HeadCount = None

    def __post_init__(self) -> None:
        try:
            compiled = re.compile(self.pattern)
        except re.error as exc:
            raise ConfigError(f"attention pattern {self.pattern!r} is not a valid regex: {exc}") from None
        if compiled.groups < 1:
            raise ConfigError(f"attention pattern {self.pattern!r} needs a group capturing the layer index, e.g. (\\d+)")
        if self.fused is not None and self.fused not in FUSED_LAYOUTS:
            raise ConfigError(f"fused={self.fused!r} is not a known layout; known: {FUSED_LAYOUTS} or null")
        for name in ("num_heads", "num_kv_heads"):
            _check_head_count(getattr(self, name), f"attention kind {self.kind!r}: {name}")


def _check_head_count(value: Any, what: str) -> None:
    if not (value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool) and value > 0)):
        raise ConfigError(f"{what}={value!r} must be a config attribute name or a positive integer")


@dataclass(frozen=True)
class ArchitectureSpec:
    """How to find the query/key projections of one model type.

    Attributes:
        model_type: the registry key: Hugging Face ``config.model_type`` (or ``"oelm-gpt"``).
        attention: the attention kinds (:class:`AttentionSpec`). Shortcut for one kind: give
            ``attention_pattern`` / ``query`` / ``key`` (and ``fused``) instead.
        num_heads: number of query heads: a config attribute name or an integer.
        num_kv_heads: number of key/value heads (grouped-query attention: fewer than
            ``num_heads``; 1 = multi-query): attribute name, integer, or None = ``num_heads``.
            An attribute that is missing or None on the config also means ``num_heads``.
        head_dim: attribute name, integer, or None; when None (or the attribute is missing or
            None), derived from the projection's size: ``out_features // num_heads``.
        num_layers / hidden_size: the transformer's layers and width (``L``, ``H`` of the FLOP
            count, :mod:`oelm.architectures.flops`): config attribute names or integers; the defaults are the
            Hugging Face names, which every ``PretrainedConfig`` maps (``attribute_map``).
        max_positions: the longest input in tokens (what ``task.max_length`` / ``block_size`` is
            checked against before a run): attribute name, integer, or None (relative
            positions: no limit from the config).
        padded_positions: RoBERTa style: position ids start after ``pad_token_id``, so
            ``pad_token_id + 1`` of ``max_positions`` are unusable.
        group_patterns: ``(group, regex)`` pairs tried in order on parameter names for the
            per-group parameter table (groups from :data:`PARAMETER_GROUPS`); first match wins,
            no match -> ``"other"``.
        matches: optional predicate that claims a model regardless of ``config.model_type``
            (e.g. a model without a Hugging Face config).
        model_class: optional class name; a model whose ``type(model).__name__`` equals it is of
            this type (the config-file form of ``matches``).
    """

    model_type: str
    attention: tuple[AttentionSpec, ...] = ()
    num_heads: HeadCount = "num_attention_heads"
    num_kv_heads: HeadCount = None
    head_dim: HeadCount = None
    num_layers: HeadCount = "num_hidden_layers"
    hidden_size: HeadCount = "hidden_size"
    max_positions: HeadCount = "max_position_embeddings"
    padded_positions: bool = False
    group_patterns: tuple[tuple[str, str], ...] = ()
    matches: Callable[[nn.Module], bool] | None = None
    model_class: str | None = None
    attention_pattern: dataclasses.InitVar[str | None] = None
    query: dataclasses.InitVar[str] = "query"
    key: dataclasses.InitVar[str] = "key"
    fused: dataclasses.InitVar[str | None] = None

    def __post_init__(self, attention_pattern: str | None, query: str, key: str, fused: str | None) -> None:
        if attention_pattern is not None:
            if self.attention:
                raise ConfigError(f"architecture {self.model_type!r}: give `attention` or `attention_pattern`, not both")
            object.__setattr__(self, "attention", (AttentionSpec(attention_pattern, query, key, fused=fused),))
        object.__setattr__(self, "attention", tuple(self.attention))
        if not self.attention:
            raise ConfigError(f"architecture {self.model_type!r} has no attention pattern; give `attention_pattern` or `attention`")
        bad = [g for g, _ in self.group_patterns if g not in PARAMETER_GROUPS]
        if bad:
            raise ConfigError(f"architecture {self.model_type!r}: unknown parameter group(s) {bad}; known: {PARAMETER_GROUPS}")
        for name in ("num_heads", "num_kv_heads", "head_dim", "num_layers", "hidden_size", "max_positions"):
            _check_head_count(getattr(self, name), f"architecture {self.model_type!r}: {name}")
        if self.num_heads is None:
            raise ConfigError(f"architecture {self.model_type!r}: num_heads is required")
        if not isinstance(self.padded_positions, bool):
            raise ConfigError(f"architecture {self.model_type!r}: padded_positions={self.padded_positions!r} must be true or false")

    def config_value(self, config: Any, name: str) -> int | None:
        """The integer this spec's ``name`` field (``num_layers``, ``hidden_size``,
        ``max_positions``, ``num_heads``, ...) gives for a model ``config``: the literal integer,
        or the value of the config attribute it names; None when that is missing or not a
        positive integer."""
        field = getattr(self, name)
        value = getattr(config, field, None) if isinstance(field, str) else field
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    def claims(self, model: nn.Module) -> bool:
        """True if ``matches`` or ``model_class`` says ``model`` is of this type."""
        if self.matches is not None and self.matches(model):
            return True
        return self.model_class is not None and type(model).__name__ == self.model_class


ARCHITECTURES: dict[str, ArchitectureSpec] = {}


def register_architecture(spec: ArchitectureSpec) -> ArchitectureSpec:
    """Add (or replace) ``spec`` in :data:`ARCHITECTURES` under ``spec.model_type``; returns it."""
    if not isinstance(spec, ArchitectureSpec):
        raise ConfigError(f"register_architecture expects an ArchitectureSpec, got {type(spec).__name__}")
    ARCHITECTURES[spec.model_type] = spec
    return spec


_DICT_KEYS = {
    "model_type", "model_class", "attention", "attention_pattern", "query", "key", "fused",
    "num_heads", "num_kv_heads", "head_dim", "num_layers", "hidden_size", "max_positions", "padded_positions", "groups",
}
_ATTENTION_KEYS = {"pattern", "query", "key", "kind", "fused", "num_heads", "num_kv_heads"}


def architecture_from_dict(d: dict[str, Any], *, source: str = "architecture") -> ArchitectureSpec:
    """Build an :class:`ArchitectureSpec` from plain data (a YAML/JSON mapping).

    Keys: ``model_type`` (required); either ``attention_pattern`` + ``query`` + ``key`` (+
    ``fused``) or ``attention``: a list of mappings with ``pattern``, ``query``, ``key``, ``kind``,
    ``fused``; ``num_heads`` / ``num_kv_heads`` / ``head_dim`` / ``num_layers`` / ``hidden_size``
    / ``max_positions`` (config attribute names or integers), ``padded_positions``; ``groups``: mapping group -> regex (order kept); ``model_class``: class name to
    match instead of ``config.model_type``. Example::

        model_type: my-model
        attention_pattern: 'blocks\\.(\\d+)\\.attn$'
        query: wq
        key: wk
        num_heads: n_heads        # or 4
        groups: {attention_output: 'attn\\.wo\\.', ffn: 'mlp\\.'}

    Raises:
        ConfigError: not a mapping, unknown or missing keys, bad regex, bad head count; the
            message names ``source`` and the key.
    """
    if not isinstance(d, dict):
        raise ConfigError(f"{source} must be a mapping, got {type(d).__name__}")
    unknown = sorted(set(d) - _DICT_KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {unknown}; allowed: {sorted(_DICT_KEYS)}")
    if not isinstance(d.get("model_type"), str):
        raise ConfigError(f"{source}.model_type is required (the Hugging Face config.model_type this entry is for)")
    kwargs: dict[str, Any] = {k: d[k] for k in ("model_type", "model_class", "num_heads", "num_kv_heads", "head_dim",
                                                "num_layers", "hidden_size", "max_positions", "padded_positions") if k in d}
    if "attention" in d:
        if not isinstance(d["attention"], list) or not d["attention"]:
            raise ConfigError(f"{source}.attention must be a non-empty list of mappings with keys {sorted(_ATTENTION_KEYS)}")
        kinds = []
        for i, a in enumerate(d["attention"]):
            bad = sorted(set(a) - _ATTENTION_KEYS) if isinstance(a, dict) else ["<not a mapping>"]
            if bad or "pattern" not in a:
                raise ConfigError(f"{source}.attention[{i}]: needs `pattern`; allowed keys {sorted(_ATTENTION_KEYS)}, got {bad or sorted(a)}")
            kinds.append(AttentionSpec(**a))
        kwargs["attention"] = tuple(kinds)
    for k in ("attention_pattern", "query", "key", "fused"):
        if k in d:
            kwargs[k] = d[k]
    groups = d.get("groups") or {}
    if not isinstance(groups, dict):
        raise ConfigError(f"{source}.groups must be a mapping group -> regex")
    kwargs["group_patterns"] = tuple((str(g), str(r)) for g, r in groups.items())
    try:
        return ArchitectureSpec(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def architecture_to_dict(spec: ArchitectureSpec) -> dict[str, Any]:
    """The plain-data form of ``spec`` that :func:`architecture_from_dict` reads back (for a
    checkpoint's record). ``matches`` (a Python predicate) has no data form and is left out."""
    attention = []
    for a in spec.attention:
        entry = {"pattern": a.pattern, "query": a.query, "key": a.key, "kind": a.kind, "fused": a.fused}
        entry.update({k: getattr(a, k) for k in ("num_heads", "num_kv_heads") if getattr(a, k) is not None})
        attention.append(entry)
    d: dict[str, Any] = {"model_type": spec.model_type, "attention": attention, "num_heads": spec.num_heads}
    d.update({k: getattr(spec, k) for k in ("num_kv_heads", "head_dim", "model_class") if getattr(spec, k) is not None})
    # the family's shape (flops, the position check); None kept: max_positions None means no limit
    d.update({k: getattr(spec, k) for k in ("num_layers", "hidden_size", "max_positions", "padded_positions")})
    d["groups"] = dict(spec.group_patterns)
    return d


def load_architecture(path: str | Path) -> ArchitectureSpec:
    """Read one architecture mapping from a YAML file (see :func:`architecture_from_dict`).

    Raises:
        ConfigError: the file is missing, not YAML, or not a valid architecture.
    """
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read architecture file {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"architecture file {path} is not valid YAML: {exc}") from None
    return architecture_from_dict(data, source=str(path))


def _unsupported_message(model: nn.Module, model_type: Any) -> str:
    return (
        f"oelm does not know where the attention query/key projections of {type(model).__name__} "
        f"(model_type={model_type!r}) are. Supported model types: {', '.join(sorted(ARCHITECTURES))}. "
        "Name its projections, PEFT style: oelm.apply_oelm(model, method, target_modules={'query': 'q_proj', "
        "'key': 'k_proj'}) (module-name suffixes or regexes; num_heads= if the config has no head count). "
        "Or register it, without editing oelm, from Python: "
        "oelm.register_architecture(oelm.ArchitectureSpec(model_type=..., attention_pattern=r'layers\\.(\\d+)\\.attn$', "
        "query='q_proj', key='k_proj', num_heads='num_attention_heads')), "
        "or in the experiment config: model: {architecture: {model_type: ..., attention_pattern: ..., "
        "query: ..., key: ..., num_heads: ...}} (see oelm.architectures.architecture_from_dict)."
    )


#: The instance attribute holding a model's own spec (``apply_oelm(..., target_modules=...)``).
ARCHITECTURE_ATTRIBUTE = "oelm_architecture"


def architecture_of(model: nn.Module) -> ArchitectureSpec:
    """The spec for ``model``: its own (``model.oelm_architecture``, set by ``apply_oelm(...,
    target_modules=...)``), else a registry entry that claims it, else its ``config.model_type``'s.

    Raises:
        UnsupportedModelError: no entry; the message lists supported types and how to register.
    """
    own = vars(model).get(ARCHITECTURE_ATTRIBUTE)
    if isinstance(own, ArchitectureSpec):
        return own
    for spec in ARCHITECTURES.values():
        if spec.claims(model):
            return spec
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in ARCHITECTURES:
        return ARCHITECTURES[model_type]
    raise UnsupportedModelError(_unsupported_message(model, model_type))
