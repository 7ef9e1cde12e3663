"""One method of an experiment config (:mod:`oelm.config`): ``methods:`` entries
(:class:`MethodEntry`): a named method (:data:`oelm.method.METHODS`), optionally modified (init,
targets, freezing, reservoir layers, a LoRA adapter on top: :data:`LORA_KEYS`), with its learning
rate(s) and its own training overrides. The method's :class:`~oelm.method.OELMConfig` is built (and
so checked) in the full pass only: it imports torch.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Iterable, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from oelm.config_aliases import canonical_training
from oelm.config_fields import Float, Int, Seed, StrictModel, keys_only
from oelm.config_training import TrainingConfig
from oelm.init_names import InitName  # the init table's names, without torch

if TYPE_CHECKING:
    from oelm.method import OELMConfig

__all__ = ["LORA_KEYS", "MethodEntry", "lora_target_problems", "lora_target_message"]


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


class MethodEntry(StrictModel):
    """One method of the comparison: a named method, optionally modified, with its learning rate."""

    name: str = Field(description="Run name; a named method (oelm.METHODS) unless `base` is given.")
    base: str | None = Field(None, description="Named method this one starts from (default: `name`).")
    learning_rate: Float | None = Field(None, gt=0, description="Overrides training.learning_rate for this method.")
    learning_rates: list[Float] | None = Field(
        None,
        min_length=1,
        description="Learning-rate candidates swept for this method (selected on validation only); "
        "overrides learning_rate and the experiment's learning_rates.",
    )
    seeds: list[Seed] | None = Field(
        None,
        min_length=1,
        description="The seeds this method runs (a subset of the experiment's seeds that holds the sweep seeds "
        "when the method is swept), fixed before any run: e.g. 5 for baseline and oelm_freeze, 3 for the "
        "controls; default: the experiment's seeds. Comparisons pair over the seeds both methods ran.",
    )
    training: dict[str, Any] = Field(
        default_factory=dict,
        description="TrainingConfig fields overridden for this method only (e.g. a different budget); "
        "empty = the experiment's training settings, the same for every method.",
    )
    init: InitName | None = Field(None, description="Q/K init kind, from the table oelm.init.INITS.")
    normal_std: Float | Literal["matched"] | None = None
    targets: list[Literal["query", "key"]] | None = None
    freeze: bool | None = None
    freeze_bias: bool | None = None
    extra_frozen_groups: list[str] | None = None
    reservoir_layers: list[Annotated[Int, Field(ge=0)]] | Literal["alternate"] | None = Field(
        None, description="OELMConfig.reservoir_layers: layers drawn at random and frozen whole (indices, or "
        "'alternate' = 1, 3, 5, ...).")
    fixed_attention: bool | None = Field(
        None, description="OELMConfig.fixed_attention: a frozen random attention map per head (oelm GPT only).")
    mimetic_value_output: bool | None = Field(
        None, description="OELMConfig.mimetic_value_output: with init: mimetic, the value/output half too "
        "(Trockman & Kolter 2023; oelm GPT only).")
    head_temperature: Annotated[Float, Field(gt=0)] | Literal["norm_ratio"] | None = Field(
        None, description="OELMConfig.head_temperature: a trainable scalar per query head on its attention "
        "logits and where it starts ('norm_ratio': step 0 = oelm_rescaled; a number: 1.0 = oelm_freeze). Unset: "
        "the experiment picks 1.0 for model.gpt (trained from scratch) and 'norm_ratio' for model.pretrained.")
    split_fused: bool | None = Field(
        None,
        description="OELMConfig.split_fused: false keeps a fused Q/K/V module (GPT-2 c_attn, GPT-NeoX "
        "query_key_value) fused in methods that do not target Q/K (baseline, oelm_ffn_only); default true "
        "splits it in every method so all run the same matmuls.",
    )
    lora: dict[str, Any] | None = Field(
        None,
        description="A PEFT LoRA adapter on top of the method (LoraConfig fields: r, lora_alpha, lora_dropout, "
        "target_modules, modules_to_save, ...): the method is applied first (frozen orthogonal Q/K for oelm_freeze), "
        "then LoRA freezes the rest and trains its matrices and modules_to_save (oelm.peft.add_lora; the peft extra).",
    )

    @field_validator("training", mode="before")
    @classmethod
    def _trainer_names(cls, value: Any) -> Any:
        # Hugging Face Trainer's names for the same settings (oelm.config_aliases); recorded under oelm's
        return canonical_training(value)

    @model_validator(mode="after")
    def _known_base(self, info: ValidationInfo) -> "MethodEntry":
        if self.learning_rates is not None:
            if any(not (isinstance(lr, (int, float)) and lr > 0) for lr in self.learning_rates):
                raise ValueError(f"method {self.name!r}: learning_rates must be positive numbers, got {self.learning_rates}")
            if len(set(self.learning_rates)) != len(self.learning_rates):
                raise ValueError(f"method {self.name!r}: learning_rates has duplicates: {self.learning_rates}")
        unknown = sorted(set(self.training) - set(TrainingConfig.model_fields))
        if unknown:
            raise ValueError(
                f"method {self.name!r}: training has unknown key(s) {unknown}; valid keys: {', '.join(TrainingConfig.model_fields)}"
            )
        if self.lora is not None:
            unknown = sorted(set(self.lora) - LORA_KEYS)
            if unknown or not self.lora.get("target_modules"):
                raise ValueError(f"method {self.name!r}: lora needs target_modules and takes only {sorted(LORA_KEYS)}; "
                                 f"got {sorted(self.lora)}")
        if "learning_rate" in self.training and (self.learning_rate is not None or self.learning_rates is not None):
            given = "learning_rate" if self.learning_rate is not None else "learning_rates"
            raise ValueError(
                f"method {self.name!r} sets both {given} and training.learning_rate; keep one (they mean the same: "
                "this method's rate)"
            )
        if keys_only(info):
            return self
        from oelm.method import METHODS  # torch: only once the keys-only pass has found no typo

        base = self.base or self.name
        if self.base is not None and base not in METHODS:
            raise ValueError(f"method {self.name!r}: base {self.base!r} is not a named method ({', '.join(METHODS)})")
        if base not in METHODS:
            raise ValueError(
                f"method {self.name!r} is not a named method ({', '.join(METHODS)}); "
                "to define a new one, give `base:` naming the method it starts from"
            )
        self.oelm_config()  # init / normal_std / groups checked now, not when the first run builds its model
        return self

    def oelm_config(self) -> "OELMConfig":
        """The :class:`~oelm.method.OELMConfig` this entry describes."""
        from oelm.method import get_method  # torch: not needed to read a config (a typo fails before it loads)
        from oelm.structural import ALTERNATE

        changes: dict[str, Any] = {"method": self.name}
        for key in ("init", "normal_std", "freeze", "freeze_bias", "split_fused", "fixed_attention",
                    "mimetic_value_output", "head_temperature"):
            if getattr(self, key) is not None:
                changes[key] = getattr(self, key)
        if self.reservoir_layers is not None:
            changes["reservoir_layers"] = self.reservoir_layers if self.reservoir_layers == ALTERNATE else tuple(self.reservoir_layers)
        if self.targets is not None:
            changes["targets"] = tuple(self.targets)
        if self.extra_frozen_groups is not None:
            changes["extra_frozen_groups"] = tuple(self.extra_frozen_groups)
        return get_method(self.base or self.name).replace(**changes)
