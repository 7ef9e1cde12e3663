"""The run record: the typed :class:`RunRecord` every reader of ``runs/<name>/result.json``
uses, the validated read (against :class:`~oelm.records.schema.ResultFile`), and the writer's one
constructor of a finished (or failed) result, checked by the same schema before the atomic write.

Result keys are spelled here (and in the JSON / HTML writers) only: readers ask the record's
properties (``record.best_validation``, ``record.total_seconds``, ...), never string keys.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oelm.errors import DamagedFileError
from oelm.io import check_format, json_value, read_json_object, write_json_atomic

from oelm.records.schema import (  # re-exported: the schema lives beside the record
    Data, DataSource, Diagnostics, Environment, EvalRecord, Executor, Mfu, Parameters, Performance, Predictions, ResultFile, Timing,
    TokenAccuracy, value_problem,
)

if TYPE_CHECKING:
    from oelm.records.folder import PlannedRun

__all__ = ["ResultFile", "Performance", "TokenAccuracy", "Predictions", "Diagnostics", "DataSource", "EvalRecord", "RunRecord", "read_record", "write_record", "validate_result", "budget_record",
           "finished_result", "failed_result", "run_identity", "round_parts", "time_split_text", "DAMAGED_RESULT_FIX", "RESULT_FORMAT"]

#: What to do about a damaged ``result.json`` (ends the error of ``oelm report`` and readers).
DAMAGED_RESULT_FIX = ("restore it from a copy, or rerun `oelm run` with the same --output-dir: it moves the run's "
                      "folder to runs/.damaged/ and trains that run again")

#: Version of result.json's layout (its ``format``; results written before it have none and are read as 1).
RESULT_FORMAT = 1


@functools.lru_cache(maxsize=1)
def _result_schema():
    from pydantic import TypeAdapter  # pydantic costs ~0.3 s: only when a record is read or written

    return TypeAdapter(ResultFile)


def _schema_problem(raw: dict[str, Any]) -> str | None:
    """``"field <where> = <value> (<reason>)"`` for the first field of ``raw`` that does not fit
    :class:`ResultFile` (strict types: a number where a number belongs; unknown keys are free),
    None when it fits."""
    from pydantic import ValidationError

    try:
        _result_schema().validate_python(raw, strict=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        return f"field {where} = {err.get('input')!r:.60} ({err['msg'].lower()})"
    return None


def read_record(path: str | os.PathLike, fix: str = DAMAGED_RESULT_FIX) -> "RunRecord":
    """The :class:`RunRecord` of the ``result.json`` at ``path``, its fields checked against
    :class:`ResultFile` (strict types: a number where a number belongs; unknown keys are free),
    then against their meaning (:func:`~oelm.records.schema.value_problem`: a perplexity >= 1, an
    accuracy 0-100 %, finite non-negative times; in a matrix's ``runs/<name>/``, a ``run_name``
    that is ``<name>``), so that no reader averages an impossible value.

    Raises:
        DamagedFileError: the file does not parse, is not an object, or a field has the wrong
            type or an impossible value; one line naming the file, the field and its value, and ``fix``.
        FileFormatError: its ``format`` is not :data:`RESULT_FORMAT` (a newer oelm wrote it; none: 1).
        OSError: the file cannot be read.
    """
    raw = read_json_object(path, fix)
    where = Path(path).parent
    problem = _schema_problem(raw) or value_problem(raw, where.name if where.parent.name == "runs" else None)
    if problem:
        raise DamagedFileError(f"{path} is damaged: {problem}; {fix}")
    check_format(path, raw.get("format"), RESULT_FORMAT, older=fix, absent_is=1)
    return RunRecord(raw)


def validate_result(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` as it will be on disk (NaN/Inf as null), checked against :class:`ResultFile` and the
    values' meaning (:func:`~oelm.records.schema.value_problem`), as readers check it.

    Raises:
        ValueError: a field does not fit the schema or its meaning (a bug in the writer: nothing is written)."""
    on_disk = json_value(raw | {"format": RESULT_FORMAT})  # what is written now is of this layout
    problem = _schema_problem(on_disk) or value_problem(on_disk)
    if problem:
        raise ValueError(f"refusing to write a run result that does not fit its schema or meaning: {problem}")
    return on_disk


def write_record(path: str | os.PathLike, record: "RunRecord") -> None:
    """Write ``record`` to ``path`` (a ``result.json``) atomically, after checking it against the
    schema readers check it with (:func:`validate_result`): what is written can be read back."""
    write_json_atomic(path, validate_result(record.raw))


def run_identity(run: "PlannedRun", task: str, model: str) -> dict[str, Any]:
    """The identity block every result starts with: method, seed, run name (the folder under
    ``runs/``, through which readers find ``metrics.jsonl``), learning rate, stage, selected, task
    (the dataset) and model (its display name)."""
    return {
        "method": run.method,
        "seed": run.seed,
        "run_name": run.name,
        "learning_rate": run.learning_rate,
        "stage": run.stage,
        "selected": run.stage == "final",
        "task": task,
        "model": model,
    }


def finished_result(identity: dict[str, Any], *, config: dict[str, Any], method_config: dict[str, Any],
                    init_from: dict[str, Any] | None, tokenizer: dict[str, Any] | None, data: dict[str, Any],
                    budget: dict[str, Any], environment: dict[str, Any], report: Any, train: Any,
                    checkpoint: dict[str, Any] | None, predictions: dict[str, Any] | None = None,
                    diagnostics: dict[str, Any] | None = None, data_source: dict[str, Any] | None = None) -> "RunRecord":
    """The record of a finished run: the writer's one constructor.

    Args:
        identity: :func:`run_identity`.
        config: the resolved experiment config (``model_dump(mode="json")``).
        method_config: the method's settings with its ``learning_rate``.
        init_from: what ``init_from`` loaded (path, tensors loaded and skipped), or None.
        tokenizer: ``{spec, vocab_size, sha256}`` of an oelm GPT's tokenizer, or None.
        data: per split sizes and label counts (``PreparedData.summary``).
        data_source: what the data was read from, by content (:func:`oelm.data.identity.data_source`:
            per split the sha256 of its files, and the tokenizer's sha256), or None.
        budget: steps (taken and planned), samples, tokens, batch sizes as run, accumulation,
            processes, epochs, max_steps.
        environment: the host before the run, with the speed probe after it and its drift (%).
        report: the method's :class:`~oelm.method.ParameterReport` (total / trainable / frozen
            counts, trainable %, groups, projections).
        train: the :class:`~oelm.training.TrainResult` (metric values in the metric's unit,
            steps, early stop, a language model's token accuracy (%), ``timing``,
            ``stop_signal``: a SIGTERM/SIGINT that arrived during the final evaluation: the run
            is complete and kept, the matrix stops after it).
        checkpoint: ``{path, sha256, bytes}`` of the best weights, or None.
        predictions: ``{path, sha256, bytes, format}`` of a final run's per-example predictions
            (:func:`oelm.records.predictions.predictions_record`), or None.
        diagnostics: a final run's attention diagnostics of its best weights
            (:class:`~oelm.records.schema.Diagnostics`), or None.

    Returns:
        The :class:`RunRecord` (``status`` "finished"); :func:`write_record` checks it against
        the schema before writing.
    """
    return RunRecord({
        "format": RESULT_FORMAT,
        **identity,
        "status": "finished",
        "config": config,
        "method_config": method_config,
        "init_from": init_from,
        "tokenizer": tokenizer,
        "data": data,
        "data_source": data_source,
        "budget": budget,
        "environment": environment,
        "parameters": {
            "total": report.total,
            "trainable": report.trainable,
            "frozen": report.frozen,
            "trainable_percent": report.trainable_percent,
            "groups": report.groups,
        },
        "projections": report.projections,
        "performance": {
            "metric": train.metric,
            "best_validation": train.best_validation,
            "best_step": train.best_step,
            "final_validation": train.final_validation,
            "final_train_loss": train.final_train_loss,
            "test": train.test,
            "steps": train.steps,
            "early_stopped": train.early_stopped,
            "token_accuracy": train.token_accuracy,
        },
        "timing": train.timing,
        "stop_signal": train.stop_signal,
        "checkpoint": checkpoint,
        "predictions": predictions,
        "diagnostics": diagnostics,
    })


def failed_result(identity: dict[str, Any], *, config: dict[str, Any], kind: str, message: str,
                  step: int | None) -> "RunRecord":
    """The record of a run that ended in a fault the matrix goes on from (``kind`` nan / oom /
    disk_full at ``step``): identity, ``status`` "failed", ``failure`` and the config; no numbers."""
    return RunRecord({"format": RESULT_FORMAT, **identity, "selected": False, "status": "failed",
                      "failure": {"kind": kind, "message": message, "step": step}, "config": config})


def budget_record(*, steps: int, planned_steps: int, samples: Any, tokens: Any, batch_size: int,
                  batch_size_configured: int, gradient_accumulation_steps: int, num_processes: int,
                  epochs: Any, max_steps: Any) -> dict[str, Any]:
    """A finished result's ``budget``: optimizer steps taken (``steps``, ``steps_run``: fewer than
    ``planned_steps`` after an early stop), samples and tokens seen, the micro-batch as run (the
    configured one capped at the training set) and as configured, accumulation, processes, the
    global batch (examples per optimizer step over all processes: the batch the learning rate
    sees), and the configured epochs / max_steps."""
    return {
        "steps": steps,
        "planned_steps": planned_steps,
        "steps_run": steps,
        "samples": samples,
        "tokens": tokens,
        "batch_size": batch_size,
        "batch_size_configured": batch_size_configured,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "num_processes": num_processes,
        "global_batch_size": batch_size * gradient_accumulation_steps * num_processes,
        "epochs": epochs,
        "max_steps": max_steps,
    }


#: ``RunRecord.promoted``'s default for ``predictions``: keep what the record has.
_KEEP = object()


def _get(section: str, key: str, doc: str | None = None) -> property:
    """A property reading ``raw[section][key]`` (None when either is absent)."""
    return property(lambda self: (self.raw.get(section) or {}).get(key), doc=doc)


@dataclass(frozen=True)
class RunRecord:
    """A run's ``result.json``, typed (schema: :class:`ResultFile`).

    ``raw`` is the JSON object as written (only the writer and the JSON writers touch it); the
    properties are what readers use: identity (``method``, ``seed``, ``learning_rate``,
    ``stage``, ``name``), ``status`` ("finished" | "failed"), the performance numbers
    (``best_validation``, ``test``: the metric's unit, accuracy % or perplexity), the timing
    figures (seconds, ms, tokens/s), where it ran (``executor``) and the other sections
    (``timing``, ``environment``, ``parameters``, ``data``, ``config``, ``method_config``:
    ``{}`` when absent).
    """

    raw: dict[str, Any] = field(repr=False)

    method = property(lambda self: self.raw.get("method"))
    seed = property(lambda self: self.raw.get("seed"))
    learning_rate = property(lambda self: self.raw.get("learning_rate"))
    stage = property(lambda self: self.raw.get("stage"))
    name = property(lambda self: self.raw.get("run_name"))
    status = property(lambda self: self.raw.get("status", "finished"))
    finished = property(lambda self: self.status == "finished")
    failed = property(lambda self: self.status == "failed")
    is_final = property(lambda self: self.stage == "final")
    selected = property(lambda self: self.raw.get("selected"))
    performance = property(lambda self: self.raw.get("performance") or {})
    best_validation = property(lambda self: self.performance.get("best_validation"))
    best_step = property(lambda self: self.performance.get("best_step"))
    final_validation = property(lambda self: self.performance.get("final_validation"))
    test = property(lambda self: self.performance.get("test"))
    metric = property(lambda self: self.performance.get("metric"))
    steps = property(lambda self: self.performance.get("steps"), doc="Optimizer steps taken.")
    early_stopped = property(lambda self: bool(self.performance.get("early_stopped")))
    planned_steps = property(lambda self: (self.raw.get("budget") or {}).get("planned_steps"),
                             doc="Optimizer steps its budget planned (None in older results).")
    failure = property(lambda self: self.raw.get("failure"))
    failure_kind = property(lambda self: (self.raw.get("failure") or {}).get("kind"), doc="nan, oom, disk_full, ...")
    failure_step = property(lambda self: (self.raw.get("failure") or {}).get("step"))
    stop_signal = property(lambda self: self.raw.get("stop_signal"))
    executor = property(lambda self: self.raw.get("executor") or {})
    checkpoint = property(lambda self: self.raw.get("checkpoint"),
                          doc="``{path, sha256, bytes}`` of the best weights (None when not recorded).")
    tokenizer = property(lambda self: self.raw.get("tokenizer"), doc="``{spec, vocab_size, sha256}`` or None.")
    vocab_size = property(lambda self: (self.tokenizer or {}).get("vocab_size"),
                          doc="The oelm GPT tokenizer's ids (None for a pretrained model's, or in older results).")
    predictions = property(lambda self: self.raw.get("predictions"),
                           doc="``{path, sha256, bytes, format}`` of a final run's predictions.npz (None when not saved).")
    diagnostics = property(lambda self: self.raw.get("diagnostics"),
                           doc="A final run's attention diagnostics (:class:`Diagnostics`; None when not recorded).")
    diagnostics_mean = property(lambda self: (self.diagnostics or {}).get("mean"),
                                doc="Their means over sites and heads (:class:`DiagnosticsMean`), None without them "
                                    "(or when they were skipped or failed).")
    token_accuracy = property(lambda self: self.performance.get("token_accuracy") or {},
                              doc="A language model's token accuracy (%): best_validation, test ({} for classification).")
    token_accuracy_best_validation = property(lambda self: self.token_accuracy.get("best_validation"))
    token_accuracy_test = property(lambda self: self.token_accuracy.get("test"))
    task = property(lambda self: self.raw.get("task"), doc="The dataset's name (None in older results).")
    config = property(lambda self: self.raw.get("config") or {}, doc="The resolved experiment config, as a dict.")
    method_config = property(lambda self: self.raw.get("method_config") or {}, doc="The method's config, as a dict.")
    data = property(lambda self: self.raw.get("data") or {},
                    doc="Per split sizes and label counts (majority_class_percent in %), num_labels.")
    data_source = property(lambda self: self.raw.get("data_source"),
                           doc="What the data was read from, by content (:class:`DataSource`; None in older results).")
    parameters = property(lambda self: self.raw.get("parameters") or {},
                          doc="Parameter counts: total / trainable / frozen, trainable_percent (%), per group.")
    environment = property(lambda self: self.raw.get("environment") or {},
                           doc="Host, device, versions; the matmul speed probe (GFLOP/s) and its drift (%).")
    timing = property(lambda self: self.raw.get("timing") or {},
                      doc="Seconds (total_seconds, train_seconds, ...), step times (ms), tokens/s, MFU, GPU telemetry.")
    total_seconds = _get("timing", "total_seconds", "Seconds after the warm-up, summed over resumes.")
    wall_seconds = _get("timing", "wall_seconds", "The run's wall time (s; None in older results): see :attr:`time_split`.")
    train_seconds = _get("timing", "train_seconds")
    compile_seconds = _get("timing", "compile_seconds")
    tokens_per_second = _get("timing", "tokens_per_second")
    data_stall_seconds = _get("timing", "data_stall_seconds", "Seconds the device sat idle waiting for a batch.")
    mixed_precision = _get("timing", "mixed_precision")
    timing_device = _get("timing", "device")
    loader_workers = _get("timing", "num_workers", "The training loader's worker processes (None in older results).")
    step_ms = _get("timing", "step_ms", "Every measured step time (ms), None where not recorded.")
    timing_warmup_steps_excluded = _get("timing", "timing_warmup_steps_excluded")
    median_step_ms = property(lambda self: (self.timing.get("per_step_ms") or {}).get("median"))
    mfu = property(lambda self: self.timing.get("mfu") or {},
                   doc="``timing.mfu``: mfu (a fraction), peak_source, peak_precision ({} when absent).")
    mfu_peak_age_s = property(lambda self: self.mfu.get("peak_age_s"),
                              doc="Seconds between the measured MFU peak and the run's end (None: a datasheet "
                                  "peak, or an older result).")
    mfu_peak_load_1min = property(lambda self: self.mfu.get("peak_load_1min"),
                                  doc="The 1-minute load average when the measured MFU peak was taken.")
    mfu_load_1min = property(lambda self: self.mfu.get("load_1min"),
                             doc="The 1-minute load average when the run's MFU was computed.")
    gpu_telemetry = property(lambda self: self.timing.get("gpu_telemetry") or {})
    drift_percent = _get("environment", "matmul_probe_drift_percent", "Speed-probe change over the run (%).")
    probe_gflops = property(lambda self: (self.environment.get("matmul_probe") or {}).get("gflops"))
    probe_gflops_after = property(lambda self: (self.environment.get("matmul_probe_after") or {}).get("gflops"))
    final_train_loss = property(lambda self: self.performance.get("final_train_loss"))
    num_labels = _get("data", "num_labels", "Classes of a classification task (None in older results, or LM).")
    validation_majority_percent = property(
        lambda self: (self.data.get("validation") or {}).get("majority_class_percent"),
        doc="The validation split's most frequent label in % of its examples (None in older results, or LM).")
    dataset = property(lambda self: self.task or (self.config.get("task") or {}).get("dataset"),
                       doc="The dataset's name: ``task``, else the config's ``task.dataset``.")
    method_learning_rate = property(
        lambda self: self.learning_rate if self.learning_rate is not None else self.method_config.get("learning_rate"),
        doc="``learning_rate``, else the method config's (older results).")
    device = property(lambda self: self.timing.get("device") or self.environment.get("device"),
                      doc="Where it trained (``cuda:0``, ``cpu``): the timing's, else the environment's.")
    hostname = _get("environment", "hostname")
    cpu_model = _get("environment", "cpu_model")
    python_version = _get("environment", "python")
    platform = _get("environment", "platform")
    packages = _get("environment", "packages", "Versions of the packages that matter (torch, transformers, ...).")
    torch_num_threads = _get("environment", "torch_num_threads")
    cuda = _get("environment", "cuda", "The GPU: name, torch_cuda, cudnn, driver_version, ... (None on CPU).")
    executor_name = property(lambda self: self.executor.get("name", "local"))
    node = property(lambda self: self.executor.get("node"), doc="The host it trained on (its executor's node).")
    threads = property(lambda self: self.executor.get("threads"),
                       doc="The torch intra-op threads it trained with (None in older results).")
    shared_node = property(lambda self: bool(self.executor.get("shared_node")),
                           doc="Whether another run trained on its node meanwhile (its times are not speed evidence).")
    started_unix = property(lambda self: self.executor.get("started_unix"),
                            doc="When its last process began the run (seconds since the epoch; None in older results).")
    overlapped = property(lambda self: self.executor.get("overlapped") or [],
                          doc="The runs that trained meanwhile: ``{run, node}`` each.")
    configured_num_workers = property(
        lambda self: ((self.config.get("training") or {}).get("num_workers", 0)),
        doc="``training.num_workers`` as configured (an int or \"auto\").")

    @property
    def early_stopping_patience(self) -> int | None:
        """``training.early_stopping_patience`` the run trained with: its method's ``training:``
        override in the recorded config, else the experiment's (None: no early stopping, or not recorded)."""
        config = self.config
        entry = next((m for m in config.get("methods") or [] if isinstance(m, dict) and m.get("name") == self.method), {})
        training = (entry.get("training") or {}) if isinstance(entry, dict) else {}
        if "early_stopping_patience" in training:
            return training["early_stopping_patience"]
        return (config.get("training") or {}).get("early_stopping_patience")

    @property
    def time_split(self) -> dict[str, float] | None:
        """Where the run's wall time (:attr:`wall_seconds`) went, in seconds that add up to it:
        ``setup`` (before the run's clock: the speed probe, the model, the loaders, the engine, the
        warm-up passes), ``training`` (the optimizer steps), ``data_wait`` (for the training
        loader's batches), ``validation``, ``test``, ``predictions`` (a final run's, kept and
        written), ``checkpoints`` (resumable ones and the best weights) and ``other`` (the rest:
        resuming, logging, the speed probe after the run, its attention diagnostics). None for a
        result written before oelm recorded its wall time. A resumed run counts the set-up of its
        last process only."""
        t = self.timing
        if t.get("wall_seconds") is None:
            return None
        parts = {"setup": t.get("setup_seconds"), "training": t.get("train_seconds"), "data_wait": t.get("data_seconds"),
                 "validation": t.get("validation_seconds"), "test": t.get("test_seconds"),
                 "predictions": t.get("predictions_seconds"),
                 "checkpoints": (t.get("checkpoint_seconds") or 0.0) + (t.get("best_weights_seconds") or 0.0)}
        parts = {name: float(seconds or 0.0) for name, seconds in parts.items()}
        return parts | {"other": max(0.0, float(t["wall_seconds"]) - sum(parts.values()))}

    def key(self) -> tuple[str, float, int]:
        """``(method, learning rate, seed)``: the cell of the matrix this run fills."""
        return (self.method, self.learning_rate, self.seed)

    def placed(self, executor: dict[str, Any]) -> "RunRecord":
        """This record with its ``executor`` block (where and when it trained, the runs beside it)."""
        return RunRecord(self.raw | {"executor": executor})

    def promoted(self, test: float | None, test_seconds: float | None, *, token_accuracy_test: float | None = None,
                 predictions: Any = _KEEP, diagnostics: Any = _KEEP) -> "RunRecord":
        """This finished sweep run promoted to its seed's final run: ``test`` (evaluated once from
        the best checkpoint, the metric's unit; None without a test split) and
        ``timing.test_seconds``; a language model's test token accuracy (%) when given;
        ``predictions`` (its predictions.npz record) and ``diagnostics`` (its attention
        diagnostics) when given; stage final, selected, swept."""
        timing = {} if test_seconds is None else {"timing": self.timing | {"test_seconds": test_seconds}}
        if timing and self.wall_seconds is not None:  # the test pass is part of the final run's time
            timing["timing"]["wall_seconds"] = self.wall_seconds + test_seconds
        performance = self.performance | {"test": test}
        if token_accuracy_test is not None:
            performance["token_accuracy"] = self.token_accuracy | {"test": token_accuracy_test}
        saved = {} if predictions is _KEEP else {"predictions": predictions}
        saved |= {} if diagnostics is _KEEP else {"diagnostics": diagnostics}
        return RunRecord(self.raw | {"performance": performance} | timing | saved
                         | {"stage": "final", "selected": True, "swept": True})

    def retrained_without_weights(self, sweep: "RunRecord", sweep_result: str) -> "RunRecord":
        """This final run, trained again because the selected sweep run ``sweep`` lost its best
        weights: selected, swept, and ``retrained_without_weights`` {the lost run's best
        validation, where its ``result.json`` was moved (relative to the matrix folder)}."""
        return RunRecord(self.raw | {"selected": True, "swept": True, "retrained_without_weights": {
            "sweep_best_validation": sweep.best_validation, "sweep_result": sweep_result}})


def round_parts(parts: dict[str, float], digits: int = 1) -> dict[str, float]:
    """``parts`` (name -> seconds) rounded to ``digits`` decimals cumulatively (each part is the
    difference of the rounded running sums), so that the rounded parts add up to the rounded total
    and none turns negative."""
    scale, total, previous, rounded = 10 ** digits, 0.0, 0, {}
    for name, seconds in parts.items():
        total += seconds
        upto = round(total * scale)
        rounded[name], previous = (upto - previous) / scale, upto
    return rounded


def time_split_text(parts: dict[str, float]) -> str:
    """``"41.2 s = setup 2.1 + training 6.3 + data wait 0.0 + ... + other 1.3"``: ``parts`` (name ->
    seconds, e.g. :attr:`RunRecord.time_split`; ``_`` shown as a space) and their sum, with one
    decimal, rounded by :func:`round_parts` so that the parts shown add up to the total shown."""
    shown = round_parts(parts)
    return f"{sum(shown.values()):.1f} s = " + " + ".join(f"{name.replace('_', ' ')} {v:.1f}" for name, v in shown.items())
