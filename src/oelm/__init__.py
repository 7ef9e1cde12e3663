"""oelm — Orthogonal ELM transformer training.

Attention query/key projections get a head-wise orthogonal initialization (an independent,
sign-fixed QR per head) and are frozen, reservoir style, while everything else trains.

Public API::

    from oelm import apply_oelm, get_oelm_model, OELMConfig, head_wise_orthogonal_
    report = apply_oelm(model, "oelm_freeze")
    print(report)  # trainable params: ... || all params: ... || trainable%: ...
    model = get_oelm_model(model, "oelm_freeze")  # PEFT style: returns the model

"""

import os as _os

# Defaults that must be in place before torch loads its OpenMP runtime (importing oelm imports
# torch): on small CPU machines busy-waiting OpenMP threads made a training step ~20x slower.
# setdefault only: a value the user set wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
_os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from oelm.errors import ConfigError, DataFormatError, DataNotFoundError, OELMError, UnsupportedModelError  # noqa: E402
from oelm.init import global_orthogonal_, head_wise_orthogonal_, matched_std, max_orthogonality_error, normal_  # noqa: E402
from oelm.method import (  # noqa: E402
    ARCHITECTURES,
    METHODS,
    ArchitectureSpec,
    OELMConfig,
    ParameterReport,
    apply_oelm,
    architecture_from_dict,
    find_attention_projections,
    get_method,
    get_oelm_model,
    load_architecture,
    parameter_report,
    print_trainable_parameters,
    register_architecture,
)

from oelm.checkpoint import CheckpointError, CheckpointMismatchError, SaveReport, load_oelm, save_pretrained  # noqa: E402

__version__ = "0.1.0"

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
    "normal_",
    "parameter_report",
    "print_trainable_parameters",
    "register_architecture",
]
