"""Projections named PEFT style, for a model no registry entry knows.

``apply_oelm(model, method, target_modules={"query": "q_proj", "key": "k_proj"})`` builds an
:class:`~oelm.architectures.spec.ArchitectureSpec` from the names (:func:`architecture_from_targets`)
and keeps it on the model instance (``model.oelm_architecture``), where
:func:`~oelm.architectures.spec.architecture_of` finds it first; nothing is registered globally.
Checkpoints record it (:func:`~oelm.architectures.spec.architecture_to_dict`), so ``load_oelm``
finds the projections again.

Matching follows PEFT's ``target_modules``: a pattern matches a module whose full name equals it
or ends with ``"." + pattern`` (a suffix such as ``"q_proj"`` or ``"attn.c_attn"``), or that
``re.fullmatch``-es it as a regular expression (``r".*decoder.*\\.q_proj"``). A role takes one
pattern or a list. Roles:

* ``{"query": ..., "key": ...}``: separate ``nn.Linear`` projections, siblings in one attention
  module (query weight ``[num_heads*head_dim, hidden]``, key ``[num_kv_heads*head_dim, hidden]``);
* ``{"qkv": ..., "layout": "qkv" | "qkv_conv1d" | "qkv_per_head"}``: one fused module per
  attention layer, in a layout of :data:`~oelm.architectures.spec.FUSED_LAYOUTS` (split before freezing).

Head counts: ``num_heads`` / ``num_kv_heads`` given, else read from the model's config (the first
integer of ``num_attention_heads``, ``n_head``, ``num_heads``, ``n_heads``,
``encoder_attention_heads``; ``num_key_value_heads``; ``head_dim``); without a key/value count,
separate projections give it by their shapes (key rows / query head size). The attention modules must be
numbered (``...layers.3.self_attn``); each stack of them (a decoder's self- and cross-attention,
say) becomes its own attention kind, named by its module path (``model.decoder.layers.N.encoder_attn``).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from torch import nn

from oelm.architectures.sites import find_attention_projections
from oelm.architectures.spec import ARCHITECTURE_ATTRIBUTE, FUSED_LAYOUTS, ArchitectureSpec, AttentionSpec
from oelm.errors import ConfigError, UnsupportedModelError

__all__ = ["architecture_from_targets", "attach_architecture", "set_architecture"]

_HEAD_ATTRIBUTES = ("num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads")


def _patterns(value: Any, role: str) -> tuple[str, ...]:
    patterns = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, (list, tuple)) else None
    if not patterns or not all(isinstance(p, str) and p for p in patterns):
        raise ConfigError(f"target_modules[{role!r}] must be a module-name suffix or regex, or a list of them; got {value!r}")
    for p in patterns:
        try:
            re.compile(p)
        except re.error as exc:
            raise ConfigError(f"target_modules[{role!r}]: {p!r} is not a valid regex ({exc})") from None
    return patterns


def _roles(target_modules: Any) -> tuple[dict[str, tuple[str, ...]], str | None]:
    """``({role: patterns}, fused layout or None)`` from a ``target_modules`` mapping, validated."""
    if not isinstance(target_modules, Mapping):
        raise ConfigError(
            "target_modules must be a mapping, e.g. {'query': 'q_proj', 'key': 'k_proj'} or "
            f"{{'qkv': 'c_attn', 'layout': 'qkv_conv1d'}}; got {type(target_modules).__name__}"
        )
    keys = set(target_modules)
    if keys == {"query", "key"}:
        return {r: _patterns(target_modules[r], r) for r in ("query", "key")}, None
    if keys == {"qkv", "layout"}:
        if target_modules["layout"] not in FUSED_LAYOUTS:
            raise ConfigError(f"target_modules['layout']={target_modules['layout']!r} is not one of {FUSED_LAYOUTS}")
        return {"qkv": _patterns(target_modules["qkv"], "qkv")}, target_modules["layout"]
    raise ConfigError(
        f"target_modules has keys {sorted(keys)}; give 'query' and 'key' (separate projections) or 'qkv' and "
        f"'layout' (one fused module, layout one of {FUSED_LAYOUTS})"
    )


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(name == p or name.endswith("." + p) or re.fullmatch(p, name) for p in patterns)


def _template(parent: str) -> tuple[str, str]:
    """``(pattern, kind)`` of an attention module's name: in the pattern the first number is the
    layer index (a group) and later numbers stay as they are (``encoder.block.3.layer.0.SelfAttention``);
    the kind is the name with the layer index as ``N``."""
    parts = parent.split(".")
    numbered = [i for i, part in enumerate(parts) if part.isdigit()]
    if not numbered:
        raise UnsupportedModelError(
            f"target module parent {parent!r} is not inside a numbered layer (a ModuleList); register the "
            "architecture with oelm.register_architecture instead"
        )
    escaped = [re.escape(p) for p in parts]
    escaped[numbered[0]] = r"(\d+)"
    kind = parts.copy()
    kind[numbered[0]] = "N"
    return r"(?:^|\.)" + r"\.".join(escaped) + "$", ".".join(kind)


def _attention_kinds(model: nn.Module, roles: dict[str, tuple[str, ...]], fused: str | None) -> tuple[AttentionSpec, ...]:
    names = [n for n, _ in model.named_modules() if n]
    children: dict[str, dict[str, str]] = {}  # attention module -> role -> child name
    for role, patterns in roles.items():
        for name in names:
            if _matches(name, patterns):
                parent, _, child = name.rpartition(".")
                children.setdefault(parent, {})[role] = child
    if not children:
        raise UnsupportedModelError(
            f"no module of {type(model).__name__} matched target_modules {dict(roles)} (suffixes or full-name regexes)"
        )
    kinds: dict[tuple[str, str, str], AttentionSpec] = {}
    for parent, found in children.items():
        if fused is None and set(found) != {"query", "key"}:
            missing = ({"query", "key"} - set(found)).pop()
            raise UnsupportedModelError(
                f"{parent!r} has a {sorted(found)[0]} projection matching target_modules but no {missing} sibling matching "
                f"{list(roles[missing])}; query and key must be children of the same attention module"
            )
        query, key = (found["qkv"], found["qkv"]) if fused else (found["query"], found["key"])
        pattern, kind = _template(parent)
        kinds.setdefault((pattern, query, key), AttentionSpec(pattern, query, key, kind=kind, fused=fused))
    return tuple(kinds.values())


def _config_int(config: Any, names: tuple[str, ...]) -> str | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return name
    return None


def architecture_from_targets(model: nn.Module, target_modules: Mapping[str, Any], *, num_heads: int | None = None,
                              num_kv_heads: int | None = None) -> ArchitectureSpec:
    """An :class:`ArchitectureSpec` for ``model`` from PEFT-style names (see the module docstring).

    Raises:
        ConfigError: ``target_modules`` is not a mapping of the roles above, a pattern is not a
            valid regex, a head count is not a positive integer.
        UnsupportedModelError: nothing matched; a query without a key sibling; no head count
            given or found on the config (the message asks for ``num_heads=``).
    """
    roles, fused = _roles(target_modules)
    for what, value in (("num_heads", num_heads), ("num_kv_heads", num_kv_heads)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ConfigError(f"{what} must be a positive integer or None, got {value!r}")
    config = getattr(model, "config", None)
    heads = num_heads or _config_int(config, _HEAD_ATTRIBUTES)
    if heads is None:
        raise UnsupportedModelError(
            f"{type(model).__name__} has no config attribute with its number of attention heads "
            f"({', '.join(_HEAD_ATTRIBUTES)}); give it: apply_oelm(model, ..., target_modules=..., num_heads=N)"
        )
    model_type = getattr(config, "model_type", None) or type(model).__name__
    attention = _attention_kinds(model, roles, fused)
    head_dim = _config_int(config, ("head_dim",))
    kv_heads = num_kv_heads or _config_int(config, ("num_key_value_heads",))
    if kv_heads is None and fused is None and isinstance(heads, int):
        kv_heads = _kv_heads_from_shapes(model, attention[0], heads)
    return ArchitectureSpec(
        model_type=f"{model_type} (target_modules)", attention=attention, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim,
    )


def _kv_heads_from_shapes(model: nn.Module, a: AttentionSpec, num_heads: int) -> int | None:
    """Key/value heads of a model without a config: the key projection's rows over the query's
    head size (grouped-query attention: fewer than ``num_heads``); None when it does not divide."""
    pattern = re.compile(a.pattern)
    for name, module in model.named_modules():
        if pattern.search(name):
            q, k = getattr(module, a.query, None), getattr(module, a.key, None)
            if isinstance(q, nn.Linear) and isinstance(k, nn.Linear) and q.out_features % num_heads == 0:
                head_dim = q.out_features // num_heads
                return k.out_features // head_dim if k.out_features % head_dim == 0 else None
            return None
    return None


def set_architecture(model: nn.Module, spec: ArchitectureSpec) -> ArchitectureSpec:
    """Keep ``spec`` on ``model`` (``model.oelm_architecture``) after checking it finds the
    projections (:class:`UnsupportedModelError` otherwise, with the model unchanged)."""
    find_attention_projections(model, spec)
    setattr(model, ARCHITECTURE_ATTRIBUTE, spec)
    return spec


def attach_architecture(model: nn.Module, target_modules: Mapping[str, Any], *, num_heads: int | None = None,
                        num_kv_heads: int | None = None) -> ArchitectureSpec:
    """:func:`architecture_from_targets` kept on ``model`` by :func:`set_architecture`."""
    return set_architecture(model, architecture_from_targets(model, target_modules, num_heads=num_heads, num_kv_heads=num_kv_heads))
