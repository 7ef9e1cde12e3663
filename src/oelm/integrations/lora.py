"""A PEFT LoRA adapter on top of a method (a config's ``lora:``), checked without importing PEFT:
the :class:`peft.LoraConfig` fields a method entry may set (:data:`LORA_KEYS`) and whether each entry
names a module of the model, by PEFT's own matching rules (:func:`lora_target_problems`). The
experiment config (:class:`oelm.config.MethodEntry`) and :func:`oelm.integrations.peft.add_lora`
read them; this module imports neither torch nor PEFT.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

__all__ = ["LORA_KEYS", "lora_target_problems", "lora_target_message"]


#: The PEFT LoraConfig fields a method's ``lora:`` may set (checked here without importing PEFT).
LORA_KEYS = frozenset({
    "r", "lora_alpha", "lora_dropout", "target_modules", "modules_to_save", "bias", "use_rslora", "fan_in_fan_out",
    "init_lora_weights", "layers_to_transform", "task_type",
})


def lora_target_problems(lora: dict[str, Any], module_names: Iterable[str]) -> list[str]:
    """The entries of a ``lora:`` mapping that name no module of a model, by PEFT's own rules
    (peft 0.21 ``check_target_module_exists`` and ``_set_trainable``): a ``target_modules`` string is a
    regex the whole module name must match; a list entry matches a module named exactly so or ending
    with ``"." + entry``; a ``modules_to_save`` entry matches a module name ending with it. PEFT
    refuses only a ``target_modules`` that matches nothing at all, so one typo in a list (``valu``
    beside ``attention.output.dense``) or in ``modules_to_save`` (``classifer``: the head stays
    frozen) would silently train a different model.

    Args:
        lora: the method's ``lora:`` mapping (LoraConfig fields).
        module_names: every module name of the model (``name for name, _ in model.named_modules()``).

    Returns:
        One ``"lora.<field>: <entry> ..."`` phrase per unmatched entry, empty when all match.
    """
    names = [n for n in module_names if n]
    problems = []
    targets = lora.get("target_modules")
    if isinstance(targets, str):
        try:
            matched = any(re.fullmatch(targets, n) for n in names)
        except re.error as exc:
            return [f"lora.target_modules: {targets!r} is not a valid regex ({exc})"]
        if not matched:
            problems.append(f"lora.target_modules: the regex {targets!r} matches no module name")
    elif isinstance(targets, (list, tuple, set)):
        problems += [f"lora.target_modules: {t!r} names no module" for t in targets
                     if not any(n == t or n.endswith(f".{t}") for n in names)]
    saved = lora.get("modules_to_save") or []
    problems += [f"lora.modules_to_save: {m!r} names no module" for m in saved if not any(n.endswith(m) for n in names)]
    return problems


def lora_target_message(problems: list[str], module_names: Iterable[str], model: str) -> str:
    """One line for :func:`lora_target_problems`' findings: what is unmatched, in which ``model``, and
    the leaf-module names the model has (layer numbers dropped) to choose from."""
    names = [n for n in module_names if n]
    prefixes = {n.rpartition(".")[0] for n in names}
    leaves = dict.fromkeys(".".join(p for p in n.split(".") if not p.isdigit()) for n in names if n not in prefixes)
    shown = sorted({".".join(leaf.split(".")[-2:]) for leaf in leaves})
    more = f" and {len(shown) - 24} more" if len(shown) > 24 else ""
    return (f"{'; '.join(problems)} of {model}; fix the name(s): its leaf modules end with "
            f"{', '.join(shown[:24])}{more}")
