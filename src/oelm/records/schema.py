"""The schema of ``runs/<name>/result.json`` (:class:`ResultFile`, checked on every read and before
every write by :mod:`oelm.records.result`) and of a ``metrics.jsonl`` evaluation line
(:class:`EvalRecord`, documented, not validated). A field another part of oelm adds to a result
is declared here and read through a :class:`~oelm.records.result.RunRecord` property.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from typing_extensions import TypedDict  # pydantic validates it (typing.TypedDict only from Python 3.12)

from oelm.metrics import METRICS

__all__ = ["ResultFile", "Performance", "TokenAccuracy", "Mfu", "Timing", "Environment", "Parameters", "Data",
           "Executor", "Predictions", "Diagnostics", "DiagnosticsMean", "DataSource", "EvalRecord",
           "value_problem"]


class TokenAccuracy(TypedDict, total=False):
    """``result["performance"]["token_accuracy"]``: a language model's next-token top-1 accuracy
    (%) at the best step on validation, and on the test split (None without one)."""

    best_validation: float | None
    test: float | None


class Performance(TypedDict, total=False):
    """``result["performance"]``: metric values in the metric's unit (accuracy %, perplexity);
    None where a value was not finite (JSON has no NaN)."""

    metric: str
    best_validation: float | None
    best_step: int | None
    final_validation: float | None
    final_train_loss: float | None
    test: float | None
    steps: int | None  # optimizer steps taken
    early_stopped: bool  # training.early_stopping_patience ended it before budget.planned_steps (absent in older results)
    token_accuracy: TokenAccuracy | None  # language modelling only (None for classification; absent in older results)


class Predictions(TypedDict, total=False):
    """``result["predictions"]``: the final run's per-example predictions file
    (:mod:`oelm.records.predictions`): ``path`` relative to the run folder, ``sha256`` (hex), ``bytes``,
    ``format`` (its layout's version)."""

    path: str
    sha256: str
    bytes: int
    format: int


class DiagnosticsMean(TypedDict, total=False):
    """``result["diagnostics"]["mean"]``: one run's attention diagnostics averaged over every site
    and head (:func:`oelm.method.diagnostics.attention_diagnostics`): entropy and a uniform attention's
    (nats), normalized entropy (entropy / uniform), logit scale (mean |q.k|/sqrt(head_dim)),
    effective rank of W_q^T W_k (of head_dim), overlap with the pretrained Q/K (0..1)."""

    entropy: float | None
    uniform_entropy: float | None
    normalized_entropy: float | None
    logit_scale: float | None
    qk_effective_rank: float | None
    overlap: float | None


class Diagnostics(TypedDict, total=False):
    """``result["diagnostics"]``: a final run's attention diagnostics of its best weights on one
    fixed validation batch (:func:`oelm.matrix.diagnose.run_diagnostics`; absent in older results,
    None for a sweep run). ``batch`` {split, examples, rule}, ``reference`` (what the overlap
    compares with; None from scratch), ``sites`` (layer labels), ``entropy_source``, ``head_dim``,
    ``hidden_size``, ``mean`` (:class:`DiagnosticsMean`), ``per_layer`` / ``per_head`` (lists per
    site / per site and head), ``seconds`` (the whole pass); instead ``skipped`` (FSDP: `oelm
    diagnose` afterwards) or ``error`` ("<type>: <message>": the run is kept without them)."""

    batch: dict[str, Any]
    reference: str | None
    sites: list[str]
    entropy_source: str | None
    head_dim: int | None
    hidden_size: int | None
    mean: DiagnosticsMean
    per_layer: dict[str, Any]
    per_head: dict[str, Any]
    seconds: float | None
    skipped: str
    error: str


class EvalRecord(TypedDict, total=False):
    """One ``{"type": "eval"}`` line of a run's ``metrics.jsonl`` (written by
    :mod:`oelm.training.evaluation`; not validated on read: :func:`oelm.report.read_metrics` skips
    a line whose step or numbers are not numbers). The metric's value is under its name
    (``accuracy`` %, ``perplexity``); the rest absent in older runs."""

    type: Literal["eval", "train", "test"]
    step: int
    loss: float | None
    elapsed_seconds: float | None  # since the run's start (wall clock)
    token_accuracy: float | None  # language modelling: next-token top-1 accuracy (%)
    train_wall_seconds: float | None  # seconds spent training up to this evaluation (evaluations excluded)
    train_tokens: int | None  # tokens trained on up to this evaluation
    train_flops: float | None  # model FLOPs trained up to this evaluation (oelm.architectures.flops)


class Mfu(TypedDict, total=False):
    """``result["timing"]["mfu"]`` (:func:`oelm.runtime.environment.mfu_record`): model FLOPs utilization
    (a fraction) and the peak (FLOP/s) it divides by; with a measured peak also when that peak was
    taken (UTC, its age in s) and the machine's 1-minute load average then and at the run's end
    (absent in older results)."""

    mfu: float | None
    flops_per_token: float | None
    tokens_per_second: float | None
    peak_flops: float | None
    peak_source: str | None  # "datasheet:<GPU>", "measured-probe", "measured-interleaved"
    peak_precision: str | None
    precision: str | None
    peak_measured_utc: str | None
    peak_age_s: float | None
    peak_load_1min: float | None
    load_1min: float | None


class Timing(TypedDict, total=False):
    """The parts of ``result["timing"]`` the readers use (seconds, ms, tokens/s; the rest is free).

    Where a run's wall time went (:attr:`RunRecord.time_split <oelm.records.result.RunRecord.time_split>`;
    absent in results written before it): ``wall_seconds`` = ``setup_seconds`` + ``train_seconds`` +
    ``data_seconds`` + ``validation_seconds`` + ``test_seconds`` + ``predictions_seconds`` +
    ``checkpoint_seconds`` + ``best_weights_seconds`` + the rest."""

    device: str | None
    mixed_precision: str | None
    total_seconds: float | None  # the run's clock: after the warm-up, summed over resumes
    wall_seconds: float | None  # the run's wall time: its process's, plus the earlier processes' resumed_seconds
    setup_seconds: float | None  # before the run's clock, in its (last) process: probe, model, loaders, engine, warm-up
    resumed_seconds: float | None  # the run's clock in the earlier processes of a resumed run (0: one process)
    train_seconds: float | None
    data_seconds: float | None  # waiting for the training loader's batches
    validation_seconds: float | None  # a final run's validations keep their per-example outcomes meanwhile
    test_seconds: float | None
    predictions_seconds: float | None  # a final run: its best validation's predictions kept, predictions.npz written
    checkpoint_seconds: float | None  # the resumable checkpoints
    best_weights_seconds: float | None  # checkpoint/model.safetensors
    tokens_per_second: float | None
    compile_seconds: float | None
    timing_warmup_steps_excluded: int | None
    per_step_ms: dict[str, Any] | None  # median, mean, p10, p90 (ms), n
    step_ms: list[float | None] | None  # every measured step
    mfu: Mfu | None
    gpu_telemetry: dict[str, Any] | None


class Environment(TypedDict, total=False):
    """The parts of ``result["environment"]`` the readers use."""

    hostname: str | None
    device: str | None
    cpu_model: str | None
    python: str | None
    platform: str | None
    torch_num_threads: int | None
    packages: dict[str, Any] | None
    cuda: dict[str, Any] | None
    matmul_probe: dict[str, Any] | None  # gflops (GFLOP/s) before the run
    matmul_probe_after: dict[str, Any] | None
    matmul_probe_drift_percent: float | None


class Parameters(TypedDict, total=False):
    """``result["parameters"]``: counts of the model's parameters."""

    total: int | None
    trainable: int | None
    frozen: int | None
    trainable_percent: float | None
    groups: dict[str, Any] | None


class Data(TypedDict, total=False):
    """The parts of ``result["data"]`` the readers use: per split sizes and label counts."""

    num_labels: int | None
    train: dict[str, Any] | None
    validation: dict[str, Any] | None
    test: dict[str, Any] | None


class DataSource(TypedDict, total=False):
    """``result["data_source"]`` (and ``experiment.json``'s ``data``): what the data was read from,
    by content (:func:`oelm.data.identity.data_source`): the ``dataset``; per role (train,
    validation, test) its split ``{split, sha256 (over its files' hashes), files: [{path, bytes,
    sha256}]}``, ``held_out_of`` for a hold-out, or ``hub`` {id, config, split} for a Hub copy; the
    ``tokenizer`` {spec, sha256} (absent in older results)."""

    dataset: str
    splits: dict[str, dict[str, Any]]
    tokenizer: dict[str, Any] | None


class Executor(TypedDict, total=False):
    """The parts of ``result["executor"]`` the readers use: where and how a run trained (the rest,
    lanes, times, pids, is free)."""

    name: str
    node: str | None
    threads: int | None  # torch intra-op threads the run trained with (absent in older results)
    shared_node: bool
    overlapped: list[dict[str, Any]]


class ResultFile(TypedDict, total=False):
    """The schema of ``runs/<name>/result.json`` (a plain JSON object on disk).

    Identity: ``method``, ``seed``, ``run_name``, ``learning_rate``, ``stage`` ("sweep" |
    "final"), ``selected``, ``task``, ``model``. ``status`` is "finished" or "failed"; a failed
    run has ``failure`` {kind, message, step} and no numbers. A finished run has ``config``,
    ``method_config``, ``init_from``, ``tokenizer`` ({spec, vocab_size, sha256}:
    :func:`oelm.data.lm.tokenizer_record`; absent in older results), ``data`` (per split sizes,
    label counts), ``data_source`` (:class:`DataSource`: the data's content hashes), ``budget``
    (steps and steps_run: taken, planned_steps; samples, tokens, batch sizes, accumulation, world
    size), ``environment``,
    ``parameters`` (total / trainable / frozen, per group), ``projections``, ``performance``
    (:class:`Performance`), ``timing`` (see :func:`oelm.training.train`) and ``stop_signal``,
    and (with ``training.save_best_checkpoint``) ``checkpoint`` {path (relative to the run
    folder), sha256 (hex), bytes} of its best weights (:meth:`RunFolder.checkpoint_record
    <oelm.records.folder.RunFolder.checkpoint_record>`), checked by
    :meth:`~oelm.records.folder.RunFolder.verify_weights` whenever those weights are reused; a
    final run's ``predictions`` (:class:`Predictions`, None for a sweep run) and its attention
    ``diagnostics`` (:class:`Diagnostics`, None for a sweep run).
    """

    format: int  # the layout's version (oelm.records.result.RESULT_FORMAT; absent in older results: read as 1)
    method: str
    seed: int
    run_name: str
    learning_rate: float
    stage: Literal["sweep", "final"] | None
    selected: bool
    swept: bool
    task: str
    model: str
    status: Literal["finished", "failed"]
    failure: dict[str, Any]
    config: dict[str, Any]
    method_config: dict[str, Any]
    init_from: dict[str, Any] | None
    tokenizer: dict[str, Any] | None
    data: Data
    data_source: DataSource | None
    budget: dict[str, Any]
    environment: Environment
    parameters: Parameters
    projections: list[dict[str, Any]]
    performance: Performance
    timing: Timing
    stop_signal: str | None
    checkpoint: dict[str, Any] | None
    predictions: Predictions | None
    diagnostics: Diagnostics | None
    executor: Executor  # where it trained: name, node, threads (torch's), shared_node, overlapped


#: Fields of ``timing`` that count seconds, tokens per second or excluded steps: finite and >= 0 by meaning.
_NON_NEGATIVE_TIMING = ("total_seconds", "wall_seconds", "setup_seconds", "resumed_seconds", "train_seconds",
                        "data_seconds", "validation_seconds", "test_seconds", "predictions_seconds", "checkpoint_seconds",
                        "best_weights_seconds", "tokens_per_second", "compile_seconds", "timing_warmup_steps_excluded")


def _outside(value: Any, lowest: float, highest: float = math.inf) -> bool:
    """Whether a number (bools and None pass: the schema checks types) is not finite or outside [lowest, highest]."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return not math.isfinite(value) or not lowest <= value <= highest


def value_problem(raw: dict[str, Any], folder_name: str | None = None) -> str | None:
    """``"field <where> = <value> (<reason>)"`` for the first value of a ``result.json`` (``raw``,
    already fitting :class:`ResultFile`'s types) that its meaning rules out, None when every one fits:

    * ``performance``: the metric's values (``best_validation``, ``final_validation``, ``test``)
      inside the metric's range (:attr:`oelm.metrics.Metric.lowest` / ``highest``: accuracy 0-100 %,
      perplexity >= 1); ``token_accuracy`` 0-100 %; ``final_train_loss`` >= 0 (a cross-entropy,
      nats); ``steps`` and ``best_step`` >= 0;
    * ``seed`` >= 0, ``learning_rate`` > 0; every seconds / tokens-per-second field of ``timing``
      >= 0; all of them finite (JSON parsers read ``NaN`` and ``Infinity``);
    * ``run_name`` is ``folder_name`` (the run folder the file is in) when both are given: a record
      that names another run would be read as that run's (its weights, its predictions, its curves).
    """
    perf = raw.get("performance") or {}
    metric = METRICS.get(perf.get("metric"))
    low, high = (metric.lowest, metric.highest) if metric else (-math.inf, math.inf)
    checks: list[tuple[str, Any, float, float, str]] = [
        *((f"performance.{k}", perf.get(k), low, high, metric.range_text if metric else "")
          for k in ("best_validation", "final_validation", "test")),
        *((f"performance.token_accuracy.{k}", (perf.get("token_accuracy") or {}).get(k), 0.0, 100.0,
           "token accuracy is 0 to 100 %") for k in ("best_validation", "test")),
        ("performance.final_train_loss", perf.get("final_train_loss"), 0.0, math.inf, "a cross-entropy loss is at least 0"),
        *((f"performance.{k}", perf.get(k), 0, math.inf, "a step count is at least 0") for k in ("steps", "best_step")),
        ("seed", raw.get("seed"), 0, math.inf, "a seed is at least 0"),
        ("learning_rate", raw.get("learning_rate"), math.ulp(0.0), math.inf, "a learning rate is above 0"),
        *((f"timing.{k}", (raw.get("timing") or {}).get(k), 0.0, math.inf, "a time or a speed is at least 0")
          for k in _NON_NEGATIVE_TIMING),
    ]
    for where, value, lowest, highest, reason in checks:
        if _outside(value, lowest, highest):
            reason = reason if math.isfinite(value) else "not a finite number"
            return f"field {where} = {value!r:.60} ({reason})"
    name = raw.get("run_name")
    if folder_name is not None and isinstance(name, str) and name != folder_name:
        return (f"field run_name = {name!r:.60} (it names another run: the file is in the run folder {folder_name!r}, "
                "copied or edited by hand?)")
    return None
