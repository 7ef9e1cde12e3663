"""The OELM method: what it is (:mod:`~oelm.method.config`, data, no torch) and what it does to a model.

The public method API, importable from here (and from ``oelm``)::

    from oelm.method import apply_oelm, get_oelm_model, merge_and_unload, OELMConfig, METHODS, get_method

One module per job: :mod:`~oelm.method.config` (:class:`OELMConfig`, the named methods, the init
kinds' table), :mod:`~oelm.method.apply` (:func:`apply_oelm`, :func:`get_oelm_model`),
:mod:`~oelm.method.init` (the Q/K initializers), :mod:`~oelm.method.reservoir` (reservoir layers,
the fixed attention map, mimetic value/output), :mod:`~oelm.method.temperature` (the learned
per-head temperature), :mod:`~oelm.method.parameters` (the parameter report),
:mod:`~oelm.method.merge` (the way back out), :mod:`~oelm.method.checkpoint_record` (the recipe a
checkpoint's ``config.json`` carries), :mod:`~oelm.method.marks` (which module trees went through
``apply_oelm``) and :mod:`~oelm.method.diagnostics` (attention entropy, logit scale, effective
rank). The architecture registry they use is :mod:`oelm.architectures`.

The config half is imported at once (no torch: an experiment config's keys-only pass reads it); the
rest on first use (PEP 562), so ``import oelm.method.config`` does not load torch.
"""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING

from oelm.method.config import METHODS, OELMConfig, get_method

# name -> the module (under oelm.method) that defines it, imported on first use: they need torch.
_LAZY = {
    **dict.fromkeys(("apply_oelm", "get_oelm_model"), "apply"),
    **dict.fromkeys(("OELM_ATTRIBUTES", "merge_and_unload"), "merge"),
    **dict.fromkeys(("ParameterReport", "parameter_report", "print_trainable_parameters"), "parameters"),
}

if _TYPE_CHECKING:  # static analysers and IDEs see the eager imports
    from oelm.method.apply import apply_oelm, get_oelm_model
    from oelm.method.merge import OELM_ATTRIBUTES, merge_and_unload
    from oelm.method.parameters import ParameterReport, parameter_report, print_trainable_parameters


def __getattr__(name: str):
    """``oelm.method.<name>`` for the names of :data:`_LAZY`, imported on first use."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'oelm.method' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f"oelm.method.{module}"), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "OELMConfig", "METHODS", "get_method", "apply_oelm", "get_oelm_model", "merge_and_unload", "OELM_ATTRIBUTES",
    "ParameterReport", "parameter_report", "print_trainable_parameters",
]
