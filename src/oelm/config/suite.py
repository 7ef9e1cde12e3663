"""Research suites: one command writes the whole comparison a question needs.

``oelm init PATH --suite frozen-attention --model M --task T`` writes an experiment config
(:func:`suite_config`) with the controls and initializations that apply to model ``M`` on the
task ``T`` (a registered dataset, or your own data as a config's ``task.source`` takes it:
``--task '{dataset: my-reviews, source: {files: {train: train.csv, validation: dev.csv}}}'`` or a
YAML file holding that mapping), a learning-rate grid fixed before any run, several seeds, the task's test
split where it has a labelled one, and a ``targets:`` block (:mod:`oelm.config.quality_targets`) as an
example; ``oelm run PATH`` trains it and ends with the report.

**frozen-attention** asks what in frozen query/key projections carries (or costs) quality:

* a pretrained model (``M`` a Hugging Face id or local directory) gets the Q/K controls of the
  SST-2 mechanism matrix (``configs/research/sst2_mechanism.yaml``): baseline, oelm_freeze
  (pretrained Q/K orthogonalized per head, frozen), oelm_random (N(0, 0.02²)), oelm_random_orthogonal
  (a fresh Gaussian, QR per head: orthogonality without the pretrained subspace),
  oelm_random_matched (N(0, 1/hidden_size): orthonormal rows' scale), oelm_pretrained_frozen (the
  pretrained Q/K as they are: does the QR step matter?), oelm_rescaled (oelm_freeze's rows at the
  pretrained per-head norm: the temperature control) and oelm_mimetic (Trockman & Kolter, ICML 2023);
* a model trained from scratch (``M`` an oelm GPT preset: gpt-tiny, gpt-medium-512) gets the
  structured inits of ``configs/research/gpt_tiny_inits.yaml``: baseline, oelm_freeze, oelm_random,
  oelm_global (one QR over the whole Q/K matrix: the original project's Phase 2 variant),
  oelm_mimetic (frozen), mimetic_trained and mimetic_vo_trained (the paper's whole init, value/output
  included), fixed_attention (a frozen random attention map per
  head: Synthesizer "Random", Tay et al., ICML 2021) and reservoir (every other layer frozen at its
  random init: Shen et al., ACL 2021).

**The learning-rate grid, fixed before any test** (:data:`GRIDS`): one grid for every method, so the
comparison is one of methods, not of grids: three rates a factor 2 apart around the rate oelm's own
sweeps selected for the model family — 1e-4 for a pretrained encoder (every MiniLM SST-2 selection
lay in [5e-5, 2e-4]: docs/results/evidence-sst2-minilm/sweep.json, cpu-sst2), 1e-3 for oelm's GPT
from scratch (the TinyStories and AG News sweeps selected 5e-4 to 2e-3). Swept on the first seed,
selected on validation only; a selection on the grid's edge is flagged in the report (grow the
grid then: the report records when a grid grew after test results existed).
"""

from __future__ import annotations

import json
from typing import Any

from oelm.config.fields import MAX_SEEDS
from oelm.errors import ConfigError, OELMError

__all__ = ["SUITES", "GRIDS", "MIN_SEEDS", "DEFAULT_SEEDS", "suite_methods", "suite_config", "task_source"]

SUITES = ("frozen-attention",)
#: The learning-rate grid of every method (module docstring): "pretrained" / "scratch".
GRIDS = {"pretrained": (5.0e-5, 1.0e-4, 2.0e-4), "scratch": (5.0e-4, 1.0e-3, 2.0e-3)}
MIN_SEEDS, DEFAULT_SEEDS = 3, 5
#: A training split larger than this is subsampled (the SST-2 mechanism matrix's 12,000 sentences:
#: 375 steps an epoch at batch 32, ~6 min a MiniLM run on one CPU core); delete train_samples for all.
CPU_TRAIN_SAMPLES = 12_000

# (method, extra MethodEntry keys, what it controls for) — the comments the config carries.
_PRETRAINED = (
    ("baseline", {}, "everything trains: the reference every gap is taken against"),
    ("oelm_freeze", {}, "pretrained Q/K orthogonalized per head (QR), frozen: OELM-Freeze"),
    ("oelm_random", {}, "Q/K ~ N(0, 0.02^2), frozen: the original's OELM-Random"),
    ("oelm_random_orthogonal", {"base": "oelm_freeze", "init": "random_orthogonal"},
     "fresh Gaussian Q/K, QR per head, frozen: orthogonal, without the pretrained subspace"),
    ("oelm_random_matched", {}, "Q/K ~ N(0, 1/hidden_size), frozen: orthonormal rows' scale, not orthogonal"),
    ("oelm_pretrained_frozen", {}, "the pretrained Q/K frozen as they are: does the QR step matter?"),
    ("oelm_rescaled", {}, "oelm_freeze's rows at each head's pretrained Frobenius norm: the temperature control"),
    ("oelm_mimetic", {}, "W_q,h^T W_k,h ~ identity per head (Trockman & Kolter, ICML 2023), frozen"),
)
_SCRATCH = (
    ("baseline", {}, "everything trains: the reference every gap is taken against"),
    ("oelm_freeze", {}, "random orthogonal Q/K per head, frozen: OELM-Freeze on a fresh model"),
    ("oelm_random", {}, "Q/K ~ N(0, 0.02^2), frozen: the original's OELM-Random"),
    ("oelm_global", {}, "one QR over the whole Q/K matrix, frozen: the original's Phase 2 variant"),
    ("oelm_mimetic", {}, "W_q,h^T W_k,h ~ identity per head (Trockman & Kolter, ICML 2023), frozen"),
    ("mimetic_trained", {}, "the same mimetic Q/K as the initialization, trained"),
    ("mimetic_vo_trained", {}, "the paper's whole mimetic init (Q/K and V/O ~ -identity), trained"),
    ("fixed_attention", {}, "a frozen random attention map per head (Synthesizer Random, Tay et al. 2021)"),
    ("reservoir", {}, "every other layer frozen whole at its random init (Shen et al., ACL 2021)"),
)


def suite_methods(suite: str, scratch: bool) -> list[tuple[str, dict[str, Any], str]]:
    """The ``(method, extra config keys, comment)`` rows of ``suite`` for a model trained from
    scratch (an oelm GPT preset) or a pretrained one.

    Raises:
        ConfigError: an unknown suite.
    """
    if suite not in SUITES:
        raise ConfigError(f"--suite {suite}: unknown suite; available: {', '.join(SUITES)}")
    return list(_SCRATCH if scratch else _PRETRAINED)


def _flow(value: Any) -> str:
    """``value`` as one line of YAML flow style (``[5.0e-05, 0.0001]``, ``true``, ``0.01``)."""
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("...").strip()  # a scalar document ends with "..."


def _line(code: str, comment: str = "") -> str:
    """One config line, its comment (if any) aligned at column 34."""
    return f"{code:<33} # {comment}" if comment else code


def _labelled_test(spec) -> bool:
    """Whether ``spec`` has a ``test`` split with labels: its local file where one is present
    (the local XNLI test has none: label -1), else the Hub's."""
    from oelm.data.registry import available_splits, find_local_files

    if "test" not in available_splits(spec):
        return False
    if spec.task_type != "classification":
        return True
    try:
        files = find_local_files(spec, "test")
    except OELMError:  # a broken data dir or a half-copied split: the run names it; the config keeps the split
        return True
    if not files or spec.local_format("test") != "parquet":
        return True
    import pyarrow.parquet as pq  # pyarrow comes with datasets: only to read one column

    labels = pq.read_table(files[0], columns=[spec.label_column]).column(0).to_pylist()
    return any(label is not None and label >= 0 for label in labels)


def smoke_command(name: str, spec, grid: tuple[float, ...]) -> str:
    """The smoke-run command the suite's header gives: every method of the config at 2 optimizer
    steps, seed 0 and the grid's middle rate, 64 validation (and test) examples, into
    ``outputs/<name>-smoke`` so that the full run's ``outputs/<name>`` is not claimed by these
    settings. ``spec``: the task's :class:`oelm.data.DatasetSpec`."""
    test = " task.test_samples=64" if _labelled_test(spec) or _holdout_rows(spec) else ""
    return (f"oelm run THIS_FILE --output-dir outputs/{name}-smoke training.max_steps=2 'seeds=[0]' "
            f"'learning_rates=[{grid[len(grid) // 2]:g}]' task.validation_samples=64{test}")


def _holdout_rows(spec) -> int | None:
    """The validation rows a task without a labelled test split holds half of out as its test set
    (None: unknown, or too few to split)."""
    train_rows = spec.local_rows.get("train") or spec.official_rows.get("train")
    rows = spec.local_rows.get("validation")
    if rows is None and spec.validation_holdout is not None and train_rows:
        rows = max(1, round(spec.validation_holdout * train_rows))
    return rows if rows and rows >= 4 else None


def task_source(task: str) -> tuple[str, dict[str, Any] | None]:
    """``--task`` as ``(dataset name, task.source or None)``: a registered dataset's name, or your
    own data as a config's ``task:`` takes it (:class:`oelm.config.DatasetSource`): a YAML mapping
    ``{dataset: NAME, source: {files: {...}, text_columns: [...], ...}}``, inline or in a ``.yaml``
    file (which may hold it under ``task:``); relative file paths are resolved against the working
    directory, as when a config is read.

    Raises:
        ConfigError: the YAML is malformed, not such a mapping, lacks ``dataset`` or ``source``,
            has other task keys (the suite writes those), or its ``source`` is invalid (the key named).
    """
    import yaml
    from pydantic import ValidationError

    from oelm.config.task import DatasetSource

    text, where = task, "--task"
    if task.endswith((".yaml", ".yml")):
        try:
            text, where = open(task, encoding="utf-8").read(), f"--task {task}"
        except OSError as exc:
            raise ConfigError(f"--task {task}: cannot read it ({exc.strerror or exc}); give a registered dataset's name "
                              "or a YAML file holding {dataset: NAME, source: {files: {...}}}") from None
    elif not task.lstrip().startswith("{"):
        return task, None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML ({' '.join(str(exc).split())})") from None
    if isinstance(data, dict) and isinstance(data.get("task"), dict) and len(data) == 1:
        data = data["task"]
    if not isinstance(data, dict) or not isinstance(data.get("dataset"), str) or not isinstance(data.get("source"), dict):
        raise ConfigError(f"{where}: give a registered dataset's name, or your own data as "
                          "{dataset: NAME, source: {files: {train: FILE, validation: FILE}, text_columns: [COLUMN], "
                          "label_column: COLUMN}} (a config's task.source keys)")
    extra = sorted(set(data) - {"dataset", "source"})
    if extra:
        raise ConfigError(f"{where}: {', '.join(extra)}: the suite writes the task's other keys (splits, samples, "
                          "lengths); give dataset and source only, then edit the written file")
    try:
        source = DatasetSource.model_validate(data["source"])
    except ValidationError as err:
        e = err.errors()[0]
        raise ConfigError(f"{where}: task.source.{'.'.join(map(str, e['loc']))}: "
                          f"{e['msg'].removeprefix('Value error, ')}") from None
    return data["dataset"], source.model_dump(exclude_none=True)


def _task_lines(spec, scratch: bool, source: dict[str, Any] | None = None) -> list[str]:
    """The ``task:`` block: the test split where labelled, else half of validation held out as
    test (when its size is known), a CPU-sized training subset, the tokenizer of a GPT from scratch;
    ``source``: your own data's ``task.source`` (:func:`task_source`)."""
    lines = ["task:", f"  dataset: {spec.name}"]
    if source is not None:
        lines.append(f"  source: {_flow(source)}")
    lm = spec.task_type == "language_modeling"
    if scratch:
        lines.append(_line("  tokenizer: bpe-4096", "trained on the training split (a GPT from scratch)"))
    lines.append("  block_size: 128" if lm else "  max_length: 128")
    train_rows = spec.local_rows.get("train") or spec.official_rows.get("train")
    if not lm and train_rows and train_rows > CPU_TRAIN_SAMPLES:
        lines.append(_line(f"  train_samples: {CPU_TRAIN_SAMPLES}", f"a CPU-sized subset of {train_rows:,}; delete for the whole split"))
    if _labelled_test(spec):
        lines.append(_line("  test_split: test", "evaluated once per final run, never used for selection"))
        return lines
    if rows := _holdout_rows(spec):
        lines += [_line(f"  validation_samples: {rows // 2}",
                        f"selection on half of the {rows:,} validation {'documents' if lm else 'examples'} ..."),
                  _line("  test_split: validation", f"... and the held-out rest ({rows - rows // 2:,}) tested once: the task "
                        "has no labelled test split")]
    else:
        lines.append("  # no labelled test split and no validation size to hold one out of: validation numbers only")
    return lines


def _training_lines(spec, scratch: bool) -> list[str]:
    """The ``training:`` block: the budgets of oelm's committed matrices for this kind of run."""
    if not scratch:  # configs/research/sst2_mechanism.yaml
        body = {"epochs": 1, "batch_size": 32, "eval_batch_size": 256, "weight_decay": 0.01, "warmup_ratio": 0.1,
                "schedule": "linear", "evals_per_epoch": 4, "group_by_length": spec.task_type == "classification"}
    elif spec.task_type == "language_modeling":  # configs/research/gpt_tiny_inits.yaml
        body = {"epochs": 30, "early_stopping_patience": 3, "batch_size": 16, "eval_batch_size": 64,
                "weight_decay": 0.1, "warmup_ratio": 0.01, "schedule": "cosine", "evals_per_epoch": 1}
    else:  # configs/evidence/gpt_cls_ag_news.yaml
        body = {"epochs": 10, "early_stopping_patience": 2, "batch_size": 32, "eval_batch_size": 256,
                "weight_decay": 0.01, "warmup_ratio": 0.05, "schedule": "cosine", "evals_per_epoch": 1,
                "group_by_length": True}
    return ["training:"] + [f"  {k}: {_flow(v)}" for k, v in body.items() if v is not False]


def _targets_lines(spec) -> list[str]:
    """An example ``targets:`` block (:mod:`oelm.config.quality_targets`) for the task's metric."""
    if spec.metric == "perplexity":
        bound = _line("  oelm_freeze: {perplexity_ratio_max: 1.05}", "the original plan: OELM-Freeze PPL <= baseline PPL x 1.05")
    else:
        bound = _line("  oelm_freeze: {accuracy_gap_min: -2.0}", "at most 2 points under baseline (an example: edit it)")
    return [_line("targets:", "checked pass / fail / undecided with its 95% interval in the report"), bound]


def suite_config(suite: str, model: str, task: str, name: str, seeds: int = DEFAULT_SEEDS, version: str = "") -> str:
    """The text of the config ``oelm init --suite SUITE --model MODEL --task TASK`` writes, validated
    before it is returned (:func:`oelm.config.config_from_dict`).

    Args:
        model: an oelm GPT preset (trained from scratch) or a Hugging Face id / local directory (pretrained).
        task: a registered dataset (``oelm.data.DATASETS``), or your own data as a YAML mapping
            ``{dataset: NAME, source: {...}}`` (inline or a ``.yaml`` file: :func:`task_source`).
        name: the experiment's name (its output folder outputs/<name>).
        seeds: seeds per method, at least :data:`MIN_SEEDS`.

    Raises:
        ConfigError: an unknown suite or task, fewer than 3 seeds or more than :data:`~oelm.config.fields.MAX_SEEDS`,
            or a result that does not validate.
    """
    import yaml

    from oelm.config import config_from_dict
    from oelm.data.registry import get_dataset_spec
    from oelm.models.gpt import PRESETS  # torch: the config's own validation loads it too

    if seeds > MAX_SEEDS:  # before the seed list is made: 10^9 of them filled memory (issue 46)
        raise ConfigError(f"--seeds {seeds}: more than {MAX_SEEDS} (every seed is a run of every method, so a count this "
                          f"large is a typo, not an experiment); give at most {MAX_SEEDS} (default {DEFAULT_SEEDS})")
    if seeds < MIN_SEEDS:
        raise ConfigError(f"--seeds {seeds}: a suite needs at least {MIN_SEEDS} seeds for an interval worth reading "
                          f"(default {DEFAULT_SEEDS})")
    name_of_data, source = task_source(task)
    if source is None:
        spec = get_dataset_spec(task)
    else:
        from oelm.data.sources import source_spec

        spec = source_spec(name_of_data, source)
        task = f"{name_of_data} (your own data)"
    scratch = model in PRESETS
    methods = suite_methods(suite, scratch)
    grid = GRIDS["scratch" if scratch else "pretrained"]
    kind = f"oelm's {model} trained from scratch" if scratch else f"pretrained {model}"
    centre = ("1e-3, the rate oelm's GPT sweeps from scratch selected" if scratch
              else "1e-4, the rate every MiniLM SST-2 sweep selected")
    header = [
        f"# Written by `oelm init --suite {suite} --model {model} --task {task}`{f' (oelm {version})' if version else ''}:",
        f"# what in frozen query/key projections carries (or costs) quality, on {kind}.",
        "# Methods, their sources and the grid rule: oelm.config.suite (docs/research.md). Train and report:",
        f"#   oelm run THIS_FILE          (into outputs/{name}/; rerunning it continues there)",
        "# First a smoke run: every method for 2 steps, one seed and rate, 64 evaluation examples, in its own",
        "# folder (a run with other settings may not share outputs/NAME; 2-3 min on 2 busy CPU cores):",
        f"#   {smoke_command(name, spec, grid)}",
        f"# Learning rates: one grid for every method, fixed before any test: {_flow(list(grid))}, a factor 2",
        f"# around {centre}; swept on the first seed, selected on validation only.",
    ]
    model_lines = (["model:", f"  gpt: {model}", f"  gpt_overrides: {{dropout: {0.0 if spec.task_type == 'language_modeling' else 0.1}}}"]
                   if scratch else ["model:", f"  pretrained: {json.dumps(model)}"])
    method_lines = ["methods:"]
    for method, extra, comment in methods:
        method_lines.append(_line(f"  - {{name: {method}{''.join(f', {k}: {v}' for k, v in extra.items())}}}", comment))
    lines = [
        *header, "",
        f"name: {name}",
        f"description: {json.dumps(f'{suite} suite: {len(methods)} methods on {kind}, {task}, {seeds} seeds, one fixed 3-rate grid.')}",
        *_task_lines(spec, scratch, source), *model_lines, *method_lines,
        f"learning_rates: {_flow(list(grid))}",
        f"seeds: {_flow(list(range(seeds)))}",
        *_training_lines(spec, scratch), *_targets_lines(spec),
    ]
    text = "\n".join(lines) + "\n"
    config_from_dict(yaml.safe_load(text), source=f"oelm init --suite {suite}")
    return text
