"""Trainable/frozen parameter counts of a model, overall and per group (PEFT's
``print_trainable_parameters``): :class:`ParameterReport`, :func:`parameter_report`. Used by
:func:`oelm.apply_oelm` (the report it returns) and re-exported from :mod:`oelm.method`."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from oelm.architectures import PARAMETER_GROUPS, ProjectionSite, SplitQKV, architecture_of, find_attention_projections
from oelm.errors import UnsupportedModelError
from oelm.method.init import max_orthogonality_error

__all__ = ["ParameterReport", "parameter_report", "projection_row", "print_trainable_parameters", "group_of", "require_module"]


def require_module(model: Any, func: str) -> None:
    """Refuse anything but an ``nn.Module`` as the model argument of ``func``, with one line."""
    if isinstance(model, nn.Module):
        return
    hint = ""
    if isinstance(model, (str, os.PathLike)):
        hint = (f"; load the model first, e.g. model = AutoModelForCausalLM.from_pretrained({str(model)!r}, "
                "trust_remote_code=False), then oelm." + func + "(model, ...)")
    raise TypeError(f"oelm.{func} expects a torch.nn.Module (a transformers or oelm model), got {type(model).__name__}{hint}")






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


def group_of(name: str, patterns: tuple[tuple[str, str], ...]) -> str:
    """The first group whose regex (``(group, regex)`` pairs, in order) finds ``name``; else ``"other"``."""
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
    require_module(model, "parameter_report")
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
        g = groups[by_id.get(id(p)) or group_of(name, patterns)]
        g["total"] += p.numel()
        g["trainable" if p.requires_grad else "frozen"] += p.numel()
    groups = {k: v for k, v in groups.items() if v["total"]}
    total = sum(v["total"] for v in groups.values())
    trainable = sum(v["trainable"] for v in groups.values())
    return ParameterReport(method=method, total=total, trainable=trainable, frozen=total - trainable, groups=groups)


def projection_row(site: ProjectionSite, target: str) -> dict[str, Any]:
    """One row of :attr:`ParameterReport.projections`: where ``target`` (``"query"`` / ``"key"``) of
    ``site`` is, its shape, heads, fused layout, bias, whether it is frozen and its
    ``max_orthogonality_error`` (:func:`oelm.method.init.max_orthogonality_error`, with its own head count)."""
    linear, heads = site.module(target), site.heads(target)
    return {
        "layer": site.layer, "kind": site.kind, "target": target,
        "module": site.query_name if target == "query" else site.key_name,
        "shape": list(linear.weight.shape), "num_heads": heads, "head_dim": site.head_dim, "fused": site.fused,
        "bias": linear.bias is not None, "frozen": not linear.weight.requires_grad,
        "max_orthogonality_error": max_orthogonality_error(linear.weight, heads),
    }


def print_trainable_parameters(model: nn.Module) -> None:
    """Print the PEFT-style line ``trainable params: … || all params: … || trainable%: …``."""
    print(parameter_report(model))
