"""One method of an experiment config (:mod:`oelm.config`): ``methods:`` entries
(:class:`MethodEntry`): a named method (:data:`oelm.method.config.METHODS`), optionally modified by
any knob of :class:`~oelm.method.config.OELMConfig` (init, targets, freezing, reservoir layers, ...),
with a LoRA adapter on top (:data:`~oelm.integrations.lora.LORA_KEYS`), its learning rate(s) and its
own training overrides.

The OELM knobs are not restated here: they are :class:`~oelm.method.config.OELMConfig`'s fields (all
but :data:`~oelm.method.config.RUN_FIELDS`), each an optional entry field of the same type (a tuple
becomes a YAML list; ``int`` / ``float`` refuse booleans, :mod:`oelm.config.fields`) with its help
text as the description, so a new knob is a field of :class:`~oelm.method.config.OELMConfig` and
nothing here. The keys-only pass checks their types and bounds; the full pass builds the method's
:class:`~oelm.method.config.OELMConfig`, which checks the rest.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Annotated, Any, Union

from pydantic import Field, ValidationInfo, create_model, field_validator, model_validator

from oelm.config.aliases import canonical_training, trainer_hint
from oelm.config.fields import Float, Int, Seed, StrictModel, keys_only
from oelm.config.training import TrainingConfig
from oelm.integrations.lora import LORA_KEYS
from oelm.method.config import METHODS, RUN_FIELDS, OELMConfig, get_method

__all__ = ["MethodEntry"]


def _entry_type(annotation: Any) -> Any:
    """The YAML-side type of an :class:`OELMConfig` field's ``annotation``: tuples as lists, ``int`` /
    ``float`` as :data:`~oelm.config.fields.Int` / :data:`~oelm.config.fields.Float` (no booleans),
    through unions and ``Annotated`` constraints; literals and ``bool`` / ``str`` as they are."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return Annotated[(_entry_type(args[0]), *annotation.__metadata__)]
    if origin in (Union, types.UnionType):
        return Union[tuple(_entry_type(a) for a in args)]
    if origin is tuple:
        return list[_entry_type(args[0])]
    return {int: Int, float: Float}.get(annotation, annotation)


def _knob_fields() -> dict[str, Any]:
    """Every OELM knob as an optional :class:`MethodEntry` field: :class:`OELMConfig`'s fields but
    :data:`RUN_FIELDS`, in its order, unset (None) unless the entry sets it."""
    hints = typing.get_type_hints(OELMConfig, include_extras=True)
    return {f.name: (_entry_type(hints[f.name]) | None, Field(None, description=f.metadata["help"]))
            for f in dataclasses.fields(OELMConfig) if f.name not in RUN_FIELDS}


class _EntryBase(StrictModel):
    """The fields of a ``methods:`` entry before its OELM knobs (so they keep the order they are read in)."""

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


#: The entry's OELM knobs, derived from OELMConfig (:func:`_knob_fields`).
_WithKnobs = create_model("_WithKnobs", __base__=_EntryBase, __module__=__name__, **_knob_fields())


class MethodEntry(_WithKnobs):
    """One method of the comparison: a named method, optionally modified (any OELMConfig knob but
    ``method`` and ``seed``), with its learning rate."""

    lora: dict[str, Any] | None = Field(
        None,
        description="A PEFT LoRA adapter on top of the method (LoraConfig fields: r, lora_alpha, lora_dropout, "
        "target_modules, modules_to_save, ...): the method is applied first (frozen orthogonal Q/K for oelm_freeze), "
        "then LoRA freezes the rest and trains its matrices and modules_to_save (oelm.integrations.peft.add_lora; the peft extra).",
    )

    @field_validator("training", mode="before")
    @classmethod
    def _trainer_names(cls, value: Any) -> Any:
        # Hugging Face Trainer's names for the same settings (oelm.config.aliases); recorded under oelm's
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
            keys = list(TrainingConfig.model_fields)
            hint = trainer_hint(unknown[0], keys) if len(unknown) == 1 else ""
            raise ValueError(f"method {self.name!r}: training has unknown key(s) {unknown}; "
                             f"{hint or 'valid keys: ' + ', '.join(keys)}")
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

    def oelm_config(self) -> OELMConfig:
        """The :class:`~oelm.method.config.OELMConfig` this entry describes: its base method with every
        knob the entry sets (YAML lists as tuples).

        Raises:
            ConfigError: the knobs' combination is refused by :class:`OELMConfig` (named there).
        """
        changes: dict[str, Any] = {"method": self.name}
        for name in _KNOBS:
            value = getattr(self, name)
            if value is not None:
                changes[name] = tuple(value) if isinstance(value, list) else value
        return get_method(self.base or self.name).replace(**changes)


#: The names of the OELM knobs an entry may set.
_KNOBS = tuple(name for name in _WithKnobs.model_fields if name not in _EntryBase.model_fields)
