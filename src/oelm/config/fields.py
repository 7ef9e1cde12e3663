"""The field types every part of the experiment config (:mod:`oelm.config`) is built from.

``Int`` refuses booleans, floats and strings (never silently 1 or truncated); ``Float`` refuses
booleans (inf / nan are refused by every model: ``allow_inf_nan=False``); ``Seed`` is in
``[0, 2**32)`` (numpy / torch generators); ``Beta`` (Adam) in ``[0, 1)``; ``Text`` is not blank.
:class:`StrictModel` is the base of every config model: unknown keys are errors, assignments are
validated. :data:`KEYS_ONLY` is the validation context of the config's first, keys-only pass
(:func:`oelm.config.config_from_dict`), which validators test with :func:`keys_only`.

No torch, no data registry: the keys-only pass reads this module.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, ValidationInfo

__all__ = ["Beta", "Float", "Int", "KEYS_ONLY", "MAX_CORES", "MAX_GPUS", "MAX_SEEDS", "MAX_METHODS", "MAX_LEARNING_RATES",
           "MAX_GRID_GROWTH", "MAX_RUNS", "Seed", "StrictModel", "Text", "keys_only"]


def _not_bool(value: Any) -> Any:
    # YAML's true/false would otherwise pass as 1/0 (`max_steps: true` trained one step).
    if isinstance(value, bool):
        raise ValueError(f"expected a number, not the boolean {str(value).lower()}")
    return value


# Integers: a boolean, a float or a string is an error, never silently 1 / truncated.
Int = Annotated[int, BeforeValidator(_not_bool), Strict()]
# Floats: a boolean is an error; inf / nan are refused by every model (allow_inf_nan=False).
Float = Annotated[float, BeforeValidator(_not_bool)]

#: Bounds no machine reaches: a value beyond is a typo or an attack, refused at validation.
MAX_CORES, MAX_GPUS = 4096, 1024

#: Bounds on the counts that multiply runs (methods x learning rates x seeds), checked before anything
#: is planned or allocated: past them a config is a typo (a range meant as a list, 1000000000 for 10),
#: not an experiment. Each is far above every committed experiment (at most 9 methods, 5 seeds, 5
#: learning rates, no grid growth). ``MAX_GRID_GROWTH``: each growth doubles or halves the grid's edge
#: rate, so 20 reach a factor of 10^6.
MAX_SEEDS, MAX_METHODS, MAX_LEARNING_RATES, MAX_GRID_GROWTH, MAX_RUNS = 1000, 100, 100, 20, 10_000

# Seeds feed numpy / torch generators, which take 0 <= seed < 2**32.
Seed = Annotated[int, BeforeValidator(_not_bool), Strict(), Field(ge=0, lt=2**32)]
Beta = Annotated[float, BeforeValidator(_not_bool), Field(ge=0, lt=1)]


def _not_blank(value: Any) -> Any:
    # An empty path or name would silently mean "here" or "the default" (`output_dir: ''` wrote to ./).
    if isinstance(value, str) and not value.strip():
        raise ValueError("is empty; give a value or leave the key out for its default")
    return value


Text = Annotated[str, BeforeValidator(_not_blank)]

# config_from_dict validates twice: first with this context, keys, types and bounds only (no check
# that imports torch, transformers or the data registry), so a typo fails in a fraction of a second.
KEYS_ONLY = {"keys_only": True}


def keys_only(info: ValidationInfo) -> bool:
    """True in the keys-only pass: a validator that needs torch, transformers or the data registry returns at once."""
    return bool((info.context or {}).get("keys_only"))


class StrictModel(BaseModel):
    """A config model: unknown keys are errors, assignments are validated, inf / nan are refused."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
