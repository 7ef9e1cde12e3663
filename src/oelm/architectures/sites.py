"""Where a model keeps its query/key projections: one :class:`ProjectionSite` per (attention kind,
layer) from its :class:`~oelm.architectures.spec.ArchitectureSpec`, and fused Q/K/V modules split into
:class:`~oelm.architectures.fused.SplitQKV` so Q and K can be frozen as whole tensors."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from oelm.architectures.fused import NAME_HOOKS, SplitQKV, carry_hooks, refuse_hooks
from oelm.architectures.spec import ArchitectureSpec, AttentionSpec, HeadCount, architecture_of
from oelm.errors import UnsupportedModelError



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


def find_attention_projections(model: nn.Module, spec: ArchitectureSpec | None = None) -> list[ProjectionSite]:
    """Locate every attention module's query/key projections, in ``named_modules()`` order.

    Does not modify the model. Sites of fused modules that are not split yet have
    ``query``/``key`` None (see :func:`split_fused_projections`); sites of already split ones
    point at the :class:`SplitQKV` children. ``spec`` (default :func:`architecture_of`) says where
    to look.

    Raises:
        UnsupportedModelError: unknown model type; a known type in which no attention module
            matched (the message names the patterns); a matched module without the expected
            children; head counts that do not divide the projection size.
    """
    spec = spec or architecture_of(model)
    config = getattr(model, "config", None)
    head_dim_cfg = _head_value(spec.head_dim, config, "head_dim", spec, model)
    patterns = [(a, re.compile(a.pattern), _heads_of(a, spec, config, model)) for a in spec.attention]
    sites: list[ProjectionSite] = []
    for name, module in model.named_modules():
        for a, pattern, (num_heads, num_kv_heads) in patterns:
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


def _heads_of(a: AttentionSpec, spec: ArchitectureSpec, config: Any, model: nn.Module) -> tuple[int, int]:
    """``(num_heads, num_kv_heads)`` of attention kind ``a``: its own counts, else the spec's."""
    heads_attr = a.num_heads if a.num_heads is not None else spec.num_heads
    num_heads = _head_value(heads_attr, config, "num_heads", spec, model)
    if num_heads is None:
        raise UnsupportedModelError(
            f"{type(model).__name__}.config has no integer {heads_attr!r}; cannot split Q/K into heads"
        )
    kv_attr = a.num_kv_heads if a.num_kv_heads is not None else spec.num_kv_heads
    num_kv_heads = _head_value(kv_attr, config, "num_kv_heads", spec, model) or num_heads
    if num_heads % num_kv_heads:
        raise UnsupportedModelError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    return num_heads, num_kv_heads


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
# Fused projections (SplitQKV and fusing back: oelm.architectures.fused)
# --------------------------------------------------------------------------------------------


def split_fused_projections(model: nn.Module, spec: ArchitectureSpec | None = None) -> list[str]:
    """Replace every fused Q/K/V module of ``model`` by an equivalent :class:`SplitQKV` (in place).

    Outputs are unchanged up to floating-point summation order (the same products are summed
    in separate matrix multiplications). Returns the names of the replaced modules; an already
    split model, or a family without fused projections, gives ``[]``. Forward and backward hooks
    on a fused module move to its :class:`SplitQKV` (same input and output, :func:`carry_hooks`).

    Raises:
        UnsupportedModelError: as :func:`find_attention_projections`.
        OELMError: a fused module with state-dict or load hooks (they would see other parameter
            names), before any module is replaced.
    """
    plan = []
    modules = dict(model.named_modules())
    for site in find_attention_projections(model, spec):
        if site.fused is None or site.is_split:
            continue
        parent_name, _, child_name = site.fused_name.rpartition(".")
        parent = modules[parent_name] if parent_name else model
        fused = getattr(parent, child_name)
        refuse_hooks(fused, site.fused_name, NAME_HOOKS, "oelm.apply_oelm splits it into query/key/value, which would "
                     "change the names they see; remove them (handle.remove()) first, register them again after; "
                     "nothing was changed")
        plan.append((site, parent, child_name, fused))
    for site, parent, child_name, fused in plan:
        split = SplitQKV.from_fused(fused, site.fused, site.num_heads, site.num_kv_heads, site.head_dim)
        setattr(parent, child_name, carry_hooks(fused, split))
    return [site.fused_name for site, *_ in plan]
