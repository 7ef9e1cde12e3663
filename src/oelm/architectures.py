"""Architecture registry: where each model family keeps its attention query/key projections.

One :class:`ArchitectureSpec` per model type (Hugging Face ``config.model_type``) says, as data,
which modules are attention layers (a regex on ``model.named_modules()`` names, one per
attention *kind*: ``self``, ``cross``, ``encoder.self``, ``decoder.cross`` ...), which children
hold the query and key projections, where the head counts live, and how fused projections are
laid out. :func:`find_attention_projections` turns a spec into one :class:`ProjectionSite` per
(kind, layer); :func:`split_fused_projections` replaces fused Q/K/V modules by
:class:`SplitQKV` (:mod:`oelm.fused`), three ``nn.Linear`` whose concatenated output equals the fused output, so
the model's own attention code runs unchanged and Q/K can be frozen as whole tensors;
:func:`fuse_split_projections` puts the fused modules back (with the trained values) for a
checkpoint that stock ``transformers`` loads (``oelm.merge_and_unload``).

Families registered here (module names checked against transformers 5.x sources):

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
oelm-gpt                             ``h.N.attn`` -> ``q_proj`` / ``k_proj``               --
===================================  ==================================================  ==================

Another architecture is added without editing oelm, from Python::

    register_architecture(ArchitectureSpec(model_type="my-model", attention_pattern=r"blocks\\.(\\d+)\\.attn$",
                                           query="wq", key="wk", num_heads="n_heads"))

or from a dict / YAML file (:func:`architecture_from_dict`, :func:`load_architecture`), which an
experiment config can carry as ``model.architecture``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from oelm.errors import ConfigError, UnsupportedModelError
from oelm.fused import FUSED_LAYOUTS, SplitQKV, fuse_split_projections

__all__ = [
    "PARAMETER_GROUPS",
    "FUSED_LAYOUTS",
    "AttentionSpec",
    "ArchitectureSpec",
    "ARCHITECTURES",
    "register_architecture",
    "architecture_from_dict",
    "load_architecture",
    "architecture_of",
    "ProjectionSite",
    "find_attention_projections",
    "SplitQKV",
    "split_fused_projections",
    "fuse_split_projections",
]

PARAMETER_GROUPS = (
    "embeddings",
    "attention_query",
    "attention_key",
    "attention_value",
    "attention_qkv",  # a fused Q/K/V projection that has not been split
    "attention_output",
    "ffn",
    "norm",
    "head",
    "other",
)


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
    """

    pattern: str
    query: str = "query"
    key: str = "key"
    kind: str = "self"
    fused: str | None = None

    def __post_init__(self) -> None:
        try:
            compiled = re.compile(self.pattern)
        except re.error as exc:
            raise ConfigError(f"attention pattern {self.pattern!r} is not a valid regex: {exc}") from None
        if compiled.groups < 1:
            raise ConfigError(f"attention pattern {self.pattern!r} needs a group capturing the layer index, e.g. (\\d+)")
        if self.fused is not None and self.fused not in FUSED_LAYOUTS:
            raise ConfigError(f"fused={self.fused!r} is not a known layout; known: {FUSED_LAYOUTS} or null")


HeadCount = str | int | None  # a config attribute name, a literal integer, or None (derive)


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
        for name in ("num_heads", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not (value is None or isinstance(value, str) or (isinstance(value, int) and value > 0)):
                raise ConfigError(
                    f"architecture {self.model_type!r}: {name}={value!r} must be a config attribute name or a positive integer"
                )
        if self.num_heads is None:
            raise ConfigError(f"architecture {self.model_type!r}: num_heads is required")

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
    "num_heads", "num_kv_heads", "head_dim", "groups",
}
_ATTENTION_KEYS = {"pattern", "query", "key", "kind", "fused"}


def architecture_from_dict(d: dict[str, Any], *, source: str = "architecture") -> ArchitectureSpec:
    """Build an :class:`ArchitectureSpec` from plain data (a YAML/JSON mapping).

    Keys: ``model_type`` (required); either ``attention_pattern`` + ``query`` + ``key`` (+
    ``fused``) or ``attention``: a list of mappings with ``pattern``, ``query``, ``key``, ``kind``,
    ``fused``; ``num_heads`` / ``num_kv_heads`` / ``head_dim`` (config attribute names or
    integers); ``groups``: mapping group -> regex (order kept); ``model_class``: class name to
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
    kwargs: dict[str, Any] = {k: d[k] for k in ("model_type", "model_class", "num_heads", "num_kv_heads", "head_dim") if k in d}
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
        "To add one without editing oelm, register it from Python: "
        "oelm.register_architecture(oelm.ArchitectureSpec(model_type=..., attention_pattern=r'layers\\.(\\d+)\\.attn$', "
        "query='q_proj', key='k_proj', num_heads='num_attention_heads')), "
        "or in the experiment config: model: {architecture: {model_type: ..., attention_pattern: ..., "
        "query: ..., key: ..., num_heads: ...}} (see oelm.architectures.architecture_from_dict)."
    )


def architecture_of(model: nn.Module) -> ArchitectureSpec:
    """The registry entry for ``model``: a spec that claims it, else its ``config.model_type``.

    Raises:
        UnsupportedModelError: no entry; the message lists supported types and how to register.
    """
    for spec in ARCHITECTURES.values():
        if spec.claims(model):
            return spec
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in ARCHITECTURES:
        return ARCHITECTURES[model_type]
    raise UnsupportedModelError(_unsupported_message(model, model_type))


# --------------------------------------------------------------------------------------------
# Sites
# --------------------------------------------------------------------------------------------


@dataclass
class ProjectionSite:
    """One attention module's query and key projections.

    Attributes:
        kind: the :class:`AttentionSpec` kind (``"self"``, ``"encoder.self"``, ``"decoder.cross"``...).
        layer: layer index within its stack (from the pattern's first group).
        attention_name: full name of the attention module.
        query_name / key_name: full names of the projections; for a fused module not yet split,
            the fused module's name.
        query / key: the ``nn.Linear`` modules (weights ``[num_heads*head_dim, hidden_size]`` and
            ``[num_kv_heads*head_dim, hidden_size]``); None while the module is still fused.
        num_heads / num_kv_heads / head_dim: head counts of Q and of K/V, and the head size.
        hidden_size: input features of the projections.
        fused: the fused layout (:data:`FUSED_LAYOUTS`) this site had or has, else None.
        fused_name: the fused module's name (``query_name``'s parent once split), else None.
    """

    kind: str
    layer: int
    attention_name: str
    query_name: str
    key_name: str
    query: nn.Linear | None
    key: nn.Linear | None
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    fused: str | None = None
    fused_name: str | None = None

    @property
    def is_split(self) -> bool:
        """True when ``query``/``key`` are separate ``nn.Linear`` modules."""
        return self.query is not None

    def module(self, target: str) -> nn.Linear:
        """The ``nn.Linear`` of ``target`` (``"query"`` or ``"key"``)."""
        linear = self.query if target == "query" else self.key
        if linear is None:
            raise UnsupportedModelError(
                f"{self.fused_name} is a fused {self.fused} projection; call split_fused_projections(model) first"
            )
        return linear

    def heads(self, target: str) -> int:
        """Head count of ``target``: ``num_heads`` for the query, ``num_kv_heads`` for the key."""
        return self.num_heads if target == "query" else self.num_kv_heads

    def shape(self, target: str) -> list[int]:
        """``[out_features, in_features]`` of ``target`` (as if split)."""
        return [self.heads(target) * self.head_dim, self.hidden_size]


def _head_value(value: HeadCount, config: Any, what: str, spec: ArchitectureSpec, model: nn.Module) -> int | None:
    if value is None or isinstance(value, int):
        return value
    if config is None:
        raise UnsupportedModelError(
            f"the {spec.model_type!r} entry reads {what} from config attribute {value!r}, but "
            f"{type(model).__name__} has no .config; give {what} as an integer"
        )
    got = getattr(config, value, None)
    if got is not None and not (isinstance(got, int) and got > 0):
        raise UnsupportedModelError(f"{type(model).__name__}.config.{value}={got!r} is not a positive integer ({what})")
    return got


def _fused_out_features(module: nn.Module, layout: str) -> tuple[int, int]:
    """``(out_features, in_features)`` of a fused module in ``layout``."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise UnsupportedModelError(f"fused {layout} projection {type(module).__name__} has no 2-D weight")
    if layout == "qkv_conv1d":
        return weight.shape[1], weight.shape[0]  # Conv1D stores [in, out]
    return weight.shape[0], weight.shape[1]


def find_attention_projections(model: nn.Module) -> list[ProjectionSite]:
    """Locate every attention module's query/key projections, in ``named_modules()`` order.

    Does not modify the model. Sites of fused modules that are not split yet have
    ``query``/``key`` None (see :func:`split_fused_projections`); sites of already split ones
    point at the :class:`SplitQKV` children.

    Raises:
        UnsupportedModelError: unknown model type; a known type in which no attention module
            matched (the message names the patterns); a matched module without the expected
            children; head counts that do not divide the projection size.
    """
    spec = architecture_of(model)
    config = getattr(model, "config", None)
    num_heads = _head_value(spec.num_heads, config, "num_heads", spec, model)
    if num_heads is None:
        raise UnsupportedModelError(
            f"{type(model).__name__}.config has no integer {spec.num_heads!r}; cannot split Q/K into heads"
        )
    num_kv_heads = _head_value(spec.num_kv_heads, config, "num_kv_heads", spec, model) or num_heads
    head_dim_cfg = _head_value(spec.head_dim, config, "head_dim", spec, model)
    if num_heads % num_kv_heads:
        raise UnsupportedModelError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    patterns = [(a, re.compile(a.pattern)) for a in spec.attention]
    sites: list[ProjectionSite] = []
    for name, module in model.named_modules():
        for a, pattern in patterns:
            m = pattern.search(name)
            if m:
                sites.append(_site(name, module, int(m.group(1)), a, spec, num_heads, num_kv_heads, head_dim_cfg))
                break
    if not sites:
        raise UnsupportedModelError(
            f"no attention module of {type(model).__name__} matched the {spec.model_type!r} pattern(s) "
            f"{[a.pattern for a in spec.attention]}"
        )
    return sites


def _site(
    name: str, module: nn.Module, layer: int, a: AttentionSpec, spec: ArchitectureSpec,
    num_heads: int, num_kv_heads: int, head_dim_cfg: int | None,
) -> ProjectionSite:
    common = dict(kind=a.kind, layer=layer, attention_name=name, num_heads=num_heads, num_kv_heads=num_kv_heads)
    if a.fused is not None:
        fused_name = f"{name}.{a.query}"
        child = getattr(module, a.query, None)
        if isinstance(child, SplitQKV):
            return ProjectionSite(
                **common, query_name=f"{fused_name}.query", key_name=f"{fused_name}.key", query=child.query,
                key=child.key, head_dim=child.head_dim, hidden_size=child.query.in_features, fused=a.fused,
                fused_name=fused_name,
            )
        if child is None:
            raise UnsupportedModelError(
                f"attention module {name!r} ({type(module).__name__}) has no fused child {a.query!r}, "
                f"as the {spec.model_type!r} registry entry expects"
            )
        out_features, hidden_size = _fused_out_features(child, a.fused)
        if a.fused == "qkv_per_head" and num_kv_heads != num_heads:
            raise UnsupportedModelError(f"{fused_name}: layout qkv_per_head needs num_kv_heads == num_heads")
        per_head_units = num_heads + 2 * num_kv_heads
        if out_features % per_head_units:
            raise UnsupportedModelError(
                f"{fused_name} has {out_features} outputs, not (num_heads + 2*num_kv_heads) * head_dim "
                f"with num_heads={num_heads}, num_kv_heads={num_kv_heads}"
            )
        head_dim = head_dim_cfg or out_features // per_head_units
        if head_dim * per_head_units != out_features:
            raise UnsupportedModelError(f"{fused_name} has {out_features} outputs, not {per_head_units} x head_dim={head_dim}")
        return ProjectionSite(
            **common, query_name=fused_name, key_name=fused_name, query=None, key=None, head_dim=head_dim,
            hidden_size=hidden_size, fused=a.fused, fused_name=fused_name,
        )
    q, k = getattr(module, a.query, None), getattr(module, a.key, None)
    if not isinstance(q, nn.Linear) or not isinstance(k, nn.Linear):
        raise UnsupportedModelError(
            f"attention module {name!r} ({type(module).__name__}) has no nn.Linear "
            f"{a.query!r}/{a.key!r} children, as the {spec.model_type!r} registry entry expects"
        )
    head_dim = head_dim_cfg or q.out_features // num_heads
    if q.out_features != num_heads * head_dim or k.out_features != num_kv_heads * head_dim:
        raise UnsupportedModelError(
            f"{name}: {a.query} has {q.out_features} and {a.key} {k.out_features} outputs, expected "
            f"num_heads*head_dim={num_heads}*{head_dim} and num_kv_heads*head_dim={num_kv_heads}*{head_dim}. "
            f"Fix: the model config's head counts ({spec.num_heads!r}, {spec.num_kv_heads!r}) must divide the "
            "projections; correct the config, or register the architecture with the right head-count attributes"
        )
    return ProjectionSite(
        **common, query_name=f"{name}.{a.query}", key_name=f"{name}.{a.key}", query=q, key=k,
        head_dim=head_dim, hidden_size=q.in_features,
    )


# --------------------------------------------------------------------------------------------
# Fused projections (SplitQKV and fusing back: oelm.fused)
# --------------------------------------------------------------------------------------------


def split_fused_projections(model: nn.Module) -> list[str]:
    """Replace every fused Q/K/V module of ``model`` by an equivalent :class:`SplitQKV` (in place).

    Outputs are unchanged up to floating-point summation order (the same products are summed
    in separate matrix multiplications). Returns the names of the replaced modules; an already
    split model, or a family without fused projections, gives ``[]``.

    Raises:
        UnsupportedModelError: as :func:`find_attention_projections`.
    """
    replaced = []
    modules = dict(model.named_modules())
    for site in find_attention_projections(model):
        if site.fused is None or site.is_split:
            continue
        parent_name, _, child_name = site.fused_name.rpartition(".")
        parent = modules[parent_name] if parent_name else model
        fused = getattr(parent, child_name)
        split = SplitQKV.from_fused(fused, site.fused, site.num_heads, site.num_kv_heads, site.head_dim)
        setattr(parent, child_name, split)
        replaced.append(site.fused_name)
    return replaced


# --------------------------------------------------------------------------------------------
# Registered families
# --------------------------------------------------------------------------------------------

_BERT_GROUPS = (
    ("norm", r"LayerNorm\."),
    ("embeddings", r"embeddings\."),
    ("attention_query", r"attention\.self\.query\."),
    ("attention_key", r"attention\.self\.key\."),
    ("attention_value", r"attention\.self\.value\."),
    ("attention_output", r"attention\.output\.dense\."),
    ("ffn", r"(intermediate|output)\.dense\."),
    ("head", r"(^|\.)(pooler|classifier|cls|qa_outputs|lm_head|discriminator_predictions|generator_predictions|generator_lm_head)\."),
)


def _bert_like(model_type: str) -> ArchitectureSpec:
    # BertLayer: .attention.self (BertSelfAttention); decoders with add_cross_attention also
    # have .crossattention.self (BertCrossAttention), both with query/key/value nn.Linear.
    return ArchitectureSpec(
        model_type=model_type,
        attention=(
            AttentionSpec(r"(?:^|\.)encoder\.layer\.(\d+)\.attention\.self$", "query", "key", kind="self"),
            AttentionSpec(r"(?:^|\.)encoder\.layer\.(\d+)\.crossattention\.self$", "query", "key", kind="cross"),
        ),
        num_heads="num_attention_heads",
        group_patterns=(
            ("norm", r"LayerNorm\."),
            ("embeddings", r"embeddings(_project)?\."),
            ("attention_query", r"attention\.self\.query\."),
            ("attention_key", r"attention\.self\.key\."),
            ("attention_value", r"attention\.self\.value\."),
            ("attention_output", r"attention\.output\.dense\."),
            ("ffn", r"(intermediate|output)\.dense\."),
            _BERT_GROUPS[-1],
        ),
    )


for _t in ("bert", "roberta", "xlm-roberta", "electra"):
    register_architecture(_bert_like(_t))

register_architecture(
    ArchitectureSpec(
        model_type="distilbert",
        attention_pattern=r"(?:^|\.)transformer\.layer\.(\d+)\.attention$",
        query="q_lin",
        key="k_lin",
        num_heads="n_heads",
        group_patterns=(
            ("norm", r"layer_norm\."),
            ("embeddings", r"embeddings\."),
            ("attention_query", r"attention\.q_lin\."),
            ("attention_key", r"attention\.k_lin\."),
            ("attention_value", r"attention\.v_lin\."),
            ("attention_output", r"attention\.out_lin\."),
            ("ffn", r"ffn\."),
            ("head", r"(^|\.)(pre_classifier|classifier|qa_outputs|vocab_transform|vocab_projector|vocab_layer_norm)\."),
        ),
    )
)
register_architecture(
    ArchitectureSpec(
        model_type="deberta-v2",
        # DebertaV2Attention.self is a DisentangledSelfAttention with query_proj/key_proj/value_proj;
        # its pos_query_proj/pos_key_proj (relative-position projections) are not Q/K targets.
        attention_pattern=r"(?:^|\.)encoder\.layer\.(\d+)\.attention\.self$",
        query="query_proj",
        key="key_proj",
        num_heads="num_attention_heads",
        group_patterns=(
            ("norm", r"LayerNorm\."),
            ("embeddings", r"(embeddings|rel_embeddings)\."),
            ("attention_query", r"attention\.self\.query_proj\."),
            ("attention_key", r"attention\.self\.key_proj\."),
            ("attention_value", r"attention\.self\.value_proj\."),
            ("attention_output", r"attention\.output\.dense\."),
            ("ffn", r"(intermediate|output)\.dense\."),
            ("head", r"(^|\.)(pooler|classifier|cls|qa_outputs|lm_predictions)\."),
        ),
    )
)
register_architecture(
    ArchitectureSpec(
        model_type="gpt2",
        # GPT2Attention.c_attn: Conv1D(3*n_embd, n_embd), weight [n_embd, 3*n_embd], output q|k|v.
        attention_pattern=r"(?:^|\.)h\.(\d+)\.attn$",
        query="c_attn",
        fused="qkv_conv1d",
        num_heads="n_head",
        group_patterns=(
            ("norm", r"(^|\.)ln_(1|2|f)\."),
            ("embeddings", r"(^|\.)(wte|wpe)\."),
            ("attention_query", r"attn\.c_attn\.query\."),
            ("attention_key", r"attn\.c_attn\.key\."),
            ("attention_value", r"attn\.c_attn\.value\."),
            ("attention_qkv", r"attn\.c_attn\."),
            ("attention_output", r"attn\.c_proj\."),
            ("ffn", r"mlp\."),
            ("head", r"(^|\.)(lm_head|score|classifier|qa_outputs|multiple_choice_head)\."),
        ),
    )
)
register_architecture(
    ArchitectureSpec(
        model_type="gpt_neox",
        # GPTNeoXAttention.query_key_value: nn.Linear(hidden, 3*hidden); forward views the output
        # as [..., num_heads, 3*head_size] and chunks q, k, v per head.
        attention_pattern=r"(?:^|\.)layers\.(\d+)\.attention$",
        query="query_key_value",
        fused="qkv_per_head",
        num_heads="num_attention_heads",
        group_patterns=(
            ("norm", r"(layernorm|final_layer_norm)\."),
            ("embeddings", r"(^|\.)embed_in\."),
            ("attention_query", r"attention\.query_key_value\.query\."),
            ("attention_key", r"attention\.query_key_value\.key\."),
            ("attention_value", r"attention\.query_key_value\.value\."),
            ("attention_qkv", r"attention\.query_key_value\."),
            ("attention_output", r"attention\.dense\."),
            ("ffn", r"mlp\."),
            ("head", r"(^|\.)(lm_head|embed_out|score|classifier|qa_outputs)\."),
        ),
    )
)
_DECODER_GROUPS = (
    ("norm", r"(layernorm|layer_norm|(^|\.)norm)\."),
    ("embeddings", r"(embed_tokens|embed_positions|project_in|project_out)\."),
    ("attention_query", r"self_attn\.q_proj\."),
    ("attention_key", r"self_attn\.k_proj\."),
    ("attention_value", r"self_attn\.v_proj\."),
    ("attention_output", r"self_attn\.(o_proj|out_proj)\."),
    ("ffn", r"(mlp\.|fc1\.|fc2\.)"),
    ("head", r"(^|\.)(lm_head|score|classifier|qa_outputs)\."),
)
for _t in ("llama", "mistral", "qwen2"):
    # <Family>Attention: q_proj [num_attention_heads*head_dim, hidden], k_proj/v_proj
    # [num_key_value_heads*head_dim, hidden]; head_dim from config.head_dim when set.
    register_architecture(
        ArchitectureSpec(
            model_type=_t,
            attention_pattern=r"(?:^|\.)layers\.(\d+)\.self_attn$",
            query="q_proj",
            key="k_proj",
            num_heads="num_attention_heads",
            num_kv_heads="num_key_value_heads",
            head_dim="head_dim",
            group_patterns=_DECODER_GROUPS,
        )
    )
register_architecture(
    ArchitectureSpec(
        model_type="opt",
        attention_pattern=r"(?:^|\.)decoder\.layers\.(\d+)\.self_attn$",
        query="q_proj",
        key="k_proj",
        num_heads="num_attention_heads",
        group_patterns=_DECODER_GROUPS,
    )
)
for _t in ("t5", "mt5", "umt5"):
    # T5Block.layer[0] = T5LayerSelfAttention(.SelfAttention), decoder blocks add
    # layer[1] = T5LayerCrossAttention(.EncDecAttention); T5Attention has q/k/v/o without bias,
    # inner_dim = num_heads * d_kv (d_kv need not be d_model / num_heads).
    register_architecture(
        ArchitectureSpec(
            model_type=_t,
            attention=(
                AttentionSpec(r"(?:^|\.)encoder\.block\.(\d+)\.layer\.\d+\.SelfAttention$", "q", "k", kind="encoder.self"),
                AttentionSpec(r"(?:^|\.)decoder\.block\.(\d+)\.layer\.\d+\.SelfAttention$", "q", "k", kind="decoder.self"),
                AttentionSpec(r"(?:^|\.)decoder\.block\.(\d+)\.layer\.\d+\.EncDecAttention$", "q", "k", kind="decoder.cross"),
            ),
            num_heads="num_heads",
            head_dim="d_kv",
            group_patterns=(
                ("norm", r"layer_norm\."),
                ("embeddings", r"(^|\.)(shared|embed_tokens|relative_attention_bias)\."),
                ("attention_query", r"Attention\.q\."),
                ("attention_key", r"Attention\.k\."),
                ("attention_value", r"Attention\.v\."),
                ("attention_output", r"Attention\.o\."),
                ("ffn", r"DenseReluDense\."),
                ("head", r"(^|\.)(lm_head|classification_head|classifier|qa_outputs)\."),
            ),
        )
    )


def _is_oelm_gpt(model: nn.Module) -> bool:
    from oelm.models.gpt import GPTConfig

    return isinstance(getattr(model, "config", None), GPTConfig)


register_architecture(
    ArchitectureSpec(
        model_type="oelm-gpt",
        attention_pattern=r"(?:^|\.)h\.(\d+)\.attn$",
        query="q_proj",
        key="k_proj",
        num_heads="num_heads",
        group_patterns=(
            ("norm", r"(^|\.)ln_(1|2|f)\."),
            ("embeddings", r"(^|\.)(wte|wpe)\."),
            ("attention_query", r"attn\.q_proj\."),
            ("attention_key", r"attn\.k_proj\."),
            ("attention_value", r"attn\.v_proj\."),
            ("attention_output", r"attn\.o_proj\."),
            ("ffn", r"mlp\."),
            ("head", r"(^|\.)(lm_head|score)\."),
        ),
        matches=_is_oelm_gpt,
    )
)
