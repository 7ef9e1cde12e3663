"""oelm — Orthogonal ELM transformer training.

Attention query/key projections get a head-wise orthogonal initialization (an independent,
sign-fixed QR per head) and are frozen, reservoir style, while everything else trains.

Public API::

    from oelm import apply_oelm, get_oelm_model, merge_and_unload, OELMConfig, head_wise_orthogonal_
    report = apply_oelm(model, "oelm_freeze")
    print(report)  # trainable params: ... || all params: ... || trainable%: ...
    # or, PEFT style (returns the model): model = get_oelm_model(model, "oelm_freeze")
    ...  # train
    model = merge_and_unload(model)  # a plain model again: stock save_pretrained/from_pretrained

"""

import os as _os

# Defaults that must be in place before torch loads its OpenMP runtime (every oelm module that
# needs torch is imported after this package's __init__ has run): on small CPU machines busy-waiting OpenMP threads made a training step ~20x slower.
# setdefault only: a value the user set wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
_os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import importlib as _importlib
import importlib.util as _importlib_util
import sys as _sys
from typing import TYPE_CHECKING as _TYPE_CHECKING

from oelm._version import __version__  # noqa: E402
from oelm.errors import ConfigError, DataFormatError, DataNotFoundError, OELMError, UnsupportedModelError  # noqa: E402

# The rest of the public API is imported on first use (module ``__getattr__``, PEP 562), so that
# ``import oelm`` and ``oelm --help`` do not pay for torch (~2 s) before anything needs it.
# name -> the module that defines it.
_LAZY = {
    **dict.fromkeys(
        ("global_orthogonal_", "head_wise_orthogonal_", "matched_std", "max_orthogonality_error", "normal_"),
        "oelm.method.init",
    ),
    **dict.fromkeys(
        ("METHODS", "OELMConfig", "ParameterReport", "apply_oelm", "get_method", "get_oelm_model", "merge_and_unload",
         "parameter_report", "print_trainable_parameters"),
        "oelm.method",
    ),
    **dict.fromkeys(
        ("ARCHITECTURES", "ArchitectureSpec", "architecture_from_dict", "find_attention_projections", "load_architecture",
         "register_architecture"),
        "oelm.architectures",
    ),
    **dict.fromkeys(("CheckpointError", "CheckpointMismatchError", "SaveReport", "load_oelm", "save_pretrained"), "oelm.checkpoint"),
}

if _TYPE_CHECKING:  # static analysers and IDEs see the eager imports
    from oelm.architectures import (
        ARCHITECTURES,
        ArchitectureSpec,
        architecture_from_dict,
        find_attention_projections,
        load_architecture,
        register_architecture,
    )
    from oelm.checkpoint import CheckpointError, CheckpointMismatchError, SaveReport, load_oelm, save_pretrained
    from oelm.method import (
        METHODS,
        OELMConfig,
        ParameterReport,
        apply_oelm,
        get_method,
        get_oelm_model,
        merge_and_unload,
        parameter_report,
        print_trainable_parameters,
    )
    from oelm.method.init import global_orthogonal_, head_wise_orthogonal_, matched_std, max_orthogonality_error, normal_


def __getattr__(name: str):
    """``oelm.<name>`` for the lazily imported public names (see ``_LAZY``), and ``oelm.<submodule>``
    (``oelm.method``, ...) imported on first access as ``import oelm`` used to provide."""
    module = _LAZY.get(name)
    if module is None:
        if not name.startswith("_") and _importlib_util.find_spec(f"{__name__}.{name}") is not None:
            return _importlib.import_module(f"{__name__}.{name}")
        raise AttributeError(f"module 'oelm' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


# Documented module names kept where users import them, for a module that moved into a package:
# ``import oelm.peft`` gives oelm.integrations.peft itself (one module under two names, so PEFT gets
# OELM registered once). A finder on sys.meta_path answers for these names only; nothing inside
# oelm imports them.
_MODULE_ALIASES = {"oelm.peft": "oelm.integrations.peft"}


class _ModuleAlias:
    """Finder and loader (``importlib``'s protocols) of :data:`_MODULE_ALIASES`."""

    @staticmethod
    def find_spec(fullname: str, path=None, target=None):
        return _importlib_util.spec_from_loader(fullname, _ModuleAlias) if fullname in _MODULE_ALIASES else None

    @staticmethod
    def create_module(spec):
        return _importlib.import_module(_MODULE_ALIASES[spec.name])

    @staticmethod
    def exec_module(module) -> None:
        """Nothing: the module ran under its own name."""


if _ModuleAlias not in _sys.meta_path:
    _sys.meta_path.append(_ModuleAlias)


# OELM's PEFT methods are registered when PEFT is imported, without ``import oelm`` importing PEFT:
# PEFT 0.21 has no entry points for out-of-tree methods (its PEFT_TYPE_TO_CONFIG_MAPPING is filled
# by imports, and a saved adapter's "peft_type" is looked up there), so ``PeftModel.from_pretrained``
# of an OELM adapter raised a bare KeyError: 'OELM' unless ``import oelm.peft`` came first. Now the
# first ``import peft`` after ``import oelm`` (or ``import oelm`` after ``import peft``) imports
# oelm.integrations.peft, which registers its methods, right after PEFT's own __init__ has run.
def _register_with_peft() -> None:
    try:
        _importlib.import_module("oelm.integrations.peft")  # a partly imported one (it imported PEFT) is fine
    except Exception as exc:  # noqa: BLE001 - importing PEFT must not fail because of oelm
        import warnings  # only on this failure path

        warnings.warn(f"oelm could not register its PEFT methods ({type(exc).__name__}: {exc}); "
                      "`import oelm.peft` shows the error", stacklevel=2)


class _AfterPeftImport:
    """A one-shot finder on ``sys.meta_path``: when ``peft`` is first imported, PEFT's own spec,
    whose loader runs :func:`_register_with_peft` after executing PEFT's ``__init__``."""

    @classmethod
    def find_spec(cls, fullname: str, path=None, target=None):
        if fullname != "peft" or cls not in _sys.meta_path:
            return None
        _sys.meta_path.remove(cls)  # once, and not while PEFT is looked up just below
        spec = _importlib_util.find_spec("peft")
        loader = getattr(spec, "loader", None)
        if loader is not None and hasattr(loader, "exec_module"):
            execute = loader.exec_module

            def exec_then_register(module) -> None:
                execute(module)
                _register_with_peft()

            loader.exec_module = exec_then_register  # this spec's own loader object, made by find_spec above
        return spec


if "peft" in _sys.modules:
    _register_with_peft()
elif _AfterPeftImport not in _sys.meta_path:
    _sys.meta_path.insert(0, _AfterPeftImport)


__all__ = [
    "CheckpointError",
    "CheckpointMismatchError",
    "SaveReport",
    "load_oelm",
    "save_pretrained",
    "ARCHITECTURES",
    "METHODS",
    "ArchitectureSpec",
    "ConfigError",
    "DataFormatError",
    "DataNotFoundError",
    "OELMConfig",
    "OELMError",
    "ParameterReport",
    "UnsupportedModelError",
    "apply_oelm",
    "architecture_from_dict",
    "find_attention_projections",
    "get_method",
    "get_oelm_model",
    "global_orthogonal_",
    "head_wise_orthogonal_",
    "load_architecture",
    "matched_std",
    "max_orthogonality_error",
    "merge_and_unload",
    "normal_",
    "parameter_report",
    "print_trainable_parameters",
    "register_architecture",
]
