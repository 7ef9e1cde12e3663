"""The whole experiment (:class:`ExperimentConfig`, whose checks span sections) and reading it
(:func:`load_config`, :func:`config_from_dict`): the package :mod:`oelm.config` re-exports them with
every section's names.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from oelm.config.fields import (
    KEYS_ONLY, MAX_GRID_GROWTH, MAX_LEARNING_RATES, MAX_METHODS, MAX_RUNS, MAX_SEEDS, Float, Int, Seed, StrictModel, Text,
    keys_only,
)
from oelm.config.methods import MethodEntry
from oelm.config.quality_targets import QualityTarget, check_quality_targets
from oelm.config.reading import (
    canonical_file, format_validation_error, merge, override_changes, override_sites, safe_load_unique, source_name,
)
from oelm.config.task import ModelConfig, TaskConfig
from oelm.config.training import ExecutorConfig, TrainingConfig
from oelm.errors import ConfigError
from oelm.io import safetensors_problem

__all__ = ["ExperimentConfig", "config_from_dict", "load_config"]


_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")


class ExperimentConfig(StrictModel):
    """A comparison: one task and model, several methods, several seeds.

    The protocol (see :mod:`oelm.matrix.plan`): each method's learning-rate candidates
    (:meth:`learning_rate_candidates`) are swept on ``sweep_seeds`` and the best on validation
    (mean over those seeds) is selected; then every seed runs at the selected rate. With a
    single candidate there is no sweep stage.
    """

    name: str = Field(description="Experiment name; also the default output folder outputs/<name>, so a plain folder name.")
    description: str = ""
    task: TaskConfig
    model: ModelConfig
    methods: list[MethodEntry] = Field(min_length=1)
    seeds: list[Seed] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    learning_rates: list[Float] | None = Field(
        None,
        min_length=1,
        description="Learning-rate candidates for every method without its own learning_rate(s); "
        "None = training.learning_rate only (no sweep).",
    )
    sweep_seeds: list[Seed] | None = Field(
        None, min_length=1, description="Seeds the learning-rate sweep runs on (a subset of seeds); default: the first seed."
    )
    max_grid_growth: Int = Field(
        0, ge=0,
        description="Learning rates the sweep may add per swept method, on validation only, while its selected rate "
        "is on the edge of its grid: x2 above the highest, /2 below the lowest, then select again, before any final "
        "run (oelm.matrix.plan.select_learning_rates); 0 = the grid as written.",
    )
    init_from: Text | None = Field(
        None,
        description="Start every run from saved weights (pretrain-then-fine-tune): a safetensors file, or an "
        "`oelm run` output directory whose selected final run of the same method and seed is used. "
        "{method} and {seed} are substituted.",
    )
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig, description="Where the runs train (local or Ray).")
    output_dir: Text | None = Field(None, description="Default: outputs/<name>.")
    reference: dict[str, Float] = Field(
        default_factory=dict, description="Published numbers to show beside ours (method -> metric)."
    )
    reference_source: str = ""
    targets: dict[str, QualityTarget] = Field(
        default_factory=dict, description="Bounds a method's gap to baseline should meet (oelm.config.quality_targets), e.g. "
        "oelm_freeze: {perplexity_ratio_max: 1.05}; checked pass / fail with its interval in the report.")

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        # The name becomes a path (outputs/<name>): refuse anything that could leave outputs/.
        if not _SAFE_NAME.fullmatch(value) or ".." in value:
            raise ValueError(
                "the experiment name becomes the folder outputs/<name>, so it may only use letters, digits and "
                "'_', '-', '.', '+' (at most 128, not starting with '.' or '-', no '..', no path separators), "
                "e.g. 'sst2-minilm'"
            )
        return value

    @model_validator(mode="after")
    def _unique_methods(self) -> "ExperimentConfig":
        _check_counts(self)
        names = [m.name for m in self.methods]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"methods has duplicate names {dup}")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds has duplicates: {self.seeds}")
        if self.learning_rates is not None:
            if any(lr <= 0 for lr in self.learning_rates) or len(set(self.learning_rates)) != len(self.learning_rates):
                raise ValueError(f"learning_rates must be distinct positive numbers, got {self.learning_rates}")
        if self.sweep_seeds is not None:
            extra = [s for s in self.sweep_seeds if s not in self.seeds]
            if extra or len(set(self.sweep_seeds)) != len(self.sweep_seeds):
                raise ValueError(f"sweep_seeds {self.sweep_seeds} must be distinct members of seeds {self.seeds}")
        for m in self.methods:
            _check_method_seeds(m, self.seeds, self.sweep_seed_list() if len(self.learning_rate_candidates(m)) > 1 else [])
            try:
                TrainingConfig.model_validate(self.training.model_dump() | m.training)
            except ValidationError as err:
                first = err.errors()[0]
                raise ValueError(
                    f"methods[{m.name}].training.{'.'.join(map(str, first['loc']))}: "
                    f"{first['msg'].removeprefix('Value error, ')} (got {first.get('input')!r})"
                ) from None
        unknown = sorted(set(self.reference) - set(names))
        if unknown:
            raise ValueError(f"reference names {unknown}, which are not methods of this config ({', '.join(names)}); "
                             "key each published number by the method name it is shown beside")
        check_quality_targets(self.targets, names)
        if self.init_from:
            for m in self.methods:
                for seed in self.seeds:
                    path = Path(self.init_from.replace("{method}", m.name).replace("{seed}", str(seed))).expanduser()
                    problem = safetensors_problem(path) if path.is_file() else None
                    if problem:
                        raise ValueError(
                            f"init_from: the file {path} {problem}; give a model.safetensors (e.g. <output_dir>/runs/"
                            "<run>/checkpoint/model.safetensors) or an `oelm run` output directory"
                        )
        if self.task.test_split and not self.training.save_best_checkpoint and any(
            len(self.learning_rate_candidates(m)) > 1 for m in self.methods
        ):
            raise ValueError(
                "a learning-rate sweep with a test split needs training.save_best_checkpoint: true "
                "(the selected sweep run is tested once from its best checkpoint)"
            )
        return self

    @model_validator(mode="after")
    def _methods_fit_the_model(self, info: ValidationInfo) -> "ExperimentConfig":
        """Methods that need a kind of model: refused when the config is read, not when a run builds it
        (in the full pass: the data registry, the GPT presets and the reservoir's layer check). The knobs
        only oelm's GPT honours are data on the method (:meth:`OELMConfig.needs_oelm_gpt`), checked here."""
        if keys_only(info):
            return self
        from oelm.data.registry import get_dataset_spec  # TaskConfig's full pass has imported it
        from oelm.method.reservoir import reservoir_indices  # torch, as the methods' configs

        check_quality_targets(self.targets, [m.name for m in self.methods], get_dataset_spec(self.task.dataset).metric)

        num_layers = None
        if self.model.gpt is not None:
            from oelm.models.gpt import gpt_config  # already imported by ModelConfig's check of the preset

            num_layers = gpt_config(self.model.gpt, **self.model.gpt_overrides).num_layers
        for m in self.methods:
            cfg = m.oelm_config()
            if cfg.head_temperature is not None and m.head_temperature is None:
                # where a learned head temperature starts, recorded in the entry (and so in every run's method
                # config): 1 for a model trained from scratch (step 0 = oelm_freeze: the default init's norms mean
                # nothing), the norm ratio for pretrained weights (step 0 = oelm_rescaled); init_from runs load theirs
                m.head_temperature = 1.0 if self.model.gpt is not None or self.init_from else "norm_ratio"
            tau_scale = self.training_for(m).head_temperature_lr_scale
            if tau_scale != 1.0 and cfg.head_temperature is None:
                own = "head_temperature_lr_scale" in m.training
                fix = ("drop it there, or base the method on oelm_temperature" if own else
                       "set it under the training: of the methods that learn one (methods[NAME].training)")
                raise ValueError(
                    f"{f'methods[{m.name}].training' if own else 'training'}.head_temperature_lr_scale={tau_scale:g}, but "
                    f"method {m.name!r} learns no head temperature (only oelm_temperature and methods based on it do); {fix}"
                )
            gpt_only = cfg.needs_oelm_gpt() if self.model.gpt is None else []
            if gpt_only:
                knob, what = gpt_only[0]
                raise ValueError(
                    f"method {m.name!r}: {knob} {what}, but model.pretrained {self.model.pretrained!r} is a library "
                    f"model whose attention code oelm does not change; use model.gpt (e.g. gpt-tiny) or drop {knob}"
                )
            if cfg.reservoir_layers and num_layers is not None:
                try:
                    reservoir_indices(cfg.reservoir_layers, range(num_layers))
                except ConfigError as exc:
                    raise ValueError(f"method {m.name!r}: {exc}") from None
        return self

    def learning_rate(self, method: MethodEntry) -> float:
        """The method's single learning rate (its first candidate)."""
        return self.learning_rate_candidates(method)[0]

    def learning_rate_candidates(self, method: MethodEntry) -> list[float]:
        """Candidates swept for ``method``, in config order: ``method.learning_rates``, else
        ``method.learning_rate`` (or, the same, ``method.training.learning_rate``), else the
        experiment's ``learning_rates``, else ``training.learning_rate``. One candidate = no sweep."""
        if method.learning_rates:
            return list(method.learning_rates)
        if method.learning_rate is not None:
            return [method.learning_rate]
        if "learning_rate" in method.training:
            return [float(method.training["learning_rate"])]
        if self.learning_rates:
            return list(self.learning_rates)
        return [self.training.learning_rate]

    def seeds_of(self, method: MethodEntry | str) -> list[int]:
        """The seeds ``method`` (an entry or its name) runs, in the order of ``seeds``: its own
        ``seeds``, else the experiment's."""
        entry = method if isinstance(method, MethodEntry) else next(m for m in self.methods if m.name == method)
        return [s for s in self.seeds if entry.seeds is None or s in entry.seeds]

    def sweep_seed_list(self) -> list[int]:
        """Seeds of the learning-rate sweep (default: the first seed)."""
        return list(self.sweep_seeds) if self.sweep_seeds else self.seeds[:1]

    def training_for(self, method: MethodEntry) -> TrainingConfig:
        """The training settings of ``method``: the experiment's, with ``method.training`` applied.
        Equal for every method (equal budgets) unless a method overrides them."""
        if not method.training:
            return self.training
        return TrainingConfig.model_validate(self.training.model_dump() | method.training)


def _check_counts(config: ExperimentConfig) -> None:
    """Refuse a count that multiplies runs past its bound (:data:`oelm.config.fields.MAX_SEEDS` and
    the others), before any run is planned: seeds, methods, learning rates (the experiment's and
    each method's), ``max_grid_growth``, and the runs they make together.

    Raises:
        ValueError: one line naming the field, its count, the bound and why."""
    why = "it multiplies the runs, so a count this large is a typo, not an experiment"
    counts = [("seeds", len(config.seeds), MAX_SEEDS), ("methods", len(config.methods), MAX_METHODS),
              ("learning_rates", len(config.learning_rates or []), MAX_LEARNING_RATES),
              *((f"methods[{m.name}].learning_rates", len(m.learning_rates or []), MAX_LEARNING_RATES) for m in config.methods),
              ("max_grid_growth", config.max_grid_growth, MAX_GRID_GROWTH)]
    for field, count, bound in counts:
        if count > bound:
            raise ValueError(f"{field}: {count} is more than {bound} ({why}); give at most {bound}")
    sweep = len(config.sweep_seed_list())
    swept_extra = {m.name: (len(config.learning_rate_candidates(m)) - 1 + config.max_grid_growth) * sweep
                   if len(config.learning_rate_candidates(m)) > 1 else 0 for m in config.methods}  # sweep runs not promoted
    runs = sum(len(config.seeds_of(m)) + swept_extra[m.name] for m in config.methods)
    if runs > MAX_RUNS:
        raise ValueError(f"methods x learning rates x seeds make up to {runs} runs, more than {MAX_RUNS} ({why}); "
                         "give fewer seeds, methods or learning rates")


def _check_method_seeds(method: MethodEntry, seeds: list[int], sweep_seeds: list[int]) -> None:
    """A method's own ``seeds``: distinct members of the experiment's ``seeds`` that hold its
    ``sweep_seeds`` (empty for a method without a sweep).

    Raises:
        ValueError: naming the method, the seeds and the fix."""
    own = method.seeds
    if own is None:
        return
    if len(set(own)) != len(own) or any(s not in seeds for s in own):
        raise ValueError(f"methods[{method.name}].seeds {own} must be distinct members of seeds {seeds}")
    missing = [s for s in sweep_seeds if s not in own]
    if missing:
        raise ValueError(f"methods[{method.name}].seeds {own} must hold the sweep seeds {sweep_seeds} (its learning "
                         f"rate is swept on them; missing {missing}): add them, or set sweep_seeds")


# --------------------------------------------------------------------------------------------
# Loading (overrides and error messages: oelm.config.reading)
# --------------------------------------------------------------------------------------------


def config_from_dict(data: dict[str, Any], source: str = "(dict)", overrides: dict[str, str] | None = None) -> ExperimentConfig:
    """Validate a config mapping. Raises :class:`ConfigError` naming every bad key (and the
    command-line override that set it: ``overrides``, resolved key path -> ``key=value`` as typed,
    from :func:`oelm.config.reading.override_sites`).

    Validated twice: first keys, types and bounds only (nothing that imports torch, so a typo is
    reported at once), then fully (named methods, datasets and splits, GPT presets)."""
    if not isinstance(data, dict):
        raise ConfigError(f"experiment config {source} must be a YAML mapping at the top level, got {type(data).__name__}")
    for context in (KEYS_ONLY, None):
        try:
            config = ExperimentConfig.model_validate(data, context=context)
        except ValidationError as err:
            raise format_validation_error(err, source, ExperimentConfig, overrides) from None
        except ConfigError as err:
            raise ConfigError(f"invalid experiment config {source}: {err}") from None
    return config


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read, merge overrides into, and validate an experiment YAML file.

    Raises:
        ConfigError: missing file, a directory, malformed YAML (with line/column), unknown keys (with the
            closest valid key), wrong types or out-of-range values.
    """
    path = Path(path)
    if path.is_dir():
        found = sorted(p.name for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
        if found:
            shown = ", ".join(found[:10]) + (f" (and {len(found) - 10} more)" if len(found) > 10 else "")
            fix = f"pass one of its YAML files: {shown}, e.g. {path / found[0]}"
        else:
            fix = "it holds no .yaml file; pass a YAML file such as configs/quickstart.yaml"
        raise ConfigError(f"config file {path} is a directory, not a YAML file; {fix}")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist (configs live under configs/, e.g. configs/quickstart.yaml)")
    try:
        data = safe_load_unique(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"config file {path} is not valid YAML{where}: {problem}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text ({exc})") from None
    if data is None:
        raise ConfigError(f"config file {path} is empty")
    sites = None
    if overrides:
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must be a YAML mapping at the top level")
        data = merge(canonical_file(data), override_changes(overrides))
        sites = override_sites(overrides, data)
    return config_from_dict(data, source=source_name(path), overrides=sites)
