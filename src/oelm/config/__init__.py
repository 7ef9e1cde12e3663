"""Experiment configuration: a YAML file validated by Pydantic, overridable from the CLI.

An experiment is data (``configs/<name>.yaml``)::

    name: quickstart
    task: {dataset: sst2, train_samples: 8000, max_length: 128}
    model: {pretrained: sentence-transformers/all-MiniLM-L6-v2}
    methods:
      - {name: baseline, learning_rate: 1.0e-4}
      - {name: oelm_freeze, learning_rate: 2.0e-4}
    seeds: [0]
    training: {epochs: 1, batch_size: 32}

Unknown keys and wrong types are errors that name the key (with the closest valid key
suggested); inf/nan, booleans given for numbers, empty paths, seeds outside [0, 2**32) and
Adam betas outside [0, 1) are refused. ``key=value`` overrides use dotted paths
(``training.epochs=2``, ``seeds=[0,1,2]``, ``methods.0.learning_rate=1e-3``); values are parsed
as YAML (:mod:`oelm.config.reading`).

One module per section, each a set of pydantic models, their names importable from here: the field
types (:mod:`~oelm.config.fields`), ``task:`` and ``model:`` (:mod:`~oelm.config.task`), ``methods:``
(:mod:`~oelm.config.methods`: the OELM knobs are :class:`~oelm.method.config.OELMConfig`'s fields),
``training:`` and ``executor:`` (:mod:`~oelm.config.training`; Hugging Face ``Trainer``'s names for
them: :mod:`~oelm.config.aliases`), ``targets:`` (:mod:`~oelm.config.quality_targets`); the whole
experiment and reading it (:mod:`~oelm.config.experiment_config`, with YAML, overrides and error lines
from :mod:`~oelm.config.reading`); ``oelm init --suite`` (:mod:`~oelm.config.suite`). None of the
section modules imports torch at module level: the keys-only pass reads them.
"""

from oelm.config.experiment_config import ExperimentConfig, config_from_dict, load_config  # noqa: F401 - the public API
from oelm.config.fields import MAX_CORES, MAX_GPUS, Beta, Float, Int, Seed, Text  # noqa: F401
from oelm.config.methods import MethodEntry
from oelm.config.reading import parse_overrides
from oelm.config.task import DatasetSource, ModelConfig, TaskConfig
from oelm.config.training import ExecutorConfig, TrainingConfig, parse_ray_address  # noqa: F401
from oelm.integrations.lora import LORA_KEYS  # noqa: F401

__all__ = [
    "DatasetSource",
    "TaskConfig",
    "ModelConfig",
    "MethodEntry",
    "TrainingConfig",
    "ExperimentConfig",
    "load_config",
    "parse_overrides",
]
# Also importable from here, outside __all__ (as before the split into sections): ExecutorConfig,
# LORA_KEYS, parse_ray_address, config_from_dict, the field types (Int, Float, Seed, Beta, Text) and
# MAX_CORES / MAX_GPUS.
