"""Evaluation: the metric over a loader (:func:`evaluate`), and the loop's validations with best
weights and early stopping."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Iterable

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader

from oelm.errors import OELMError
from oelm.metrics import Metric, get_metric
from oelm.training.faults import is_oom, oom_error
from oelm.training.metrics_log import log_train
from oelm.training.precision import Precision
from oelm.training.prediction_collector import PredictionCollector, SplitPredictions, collector_for
from oelm.training.run_timing import training_progress

if TYPE_CHECKING:
    from oelm.training.engine import Engine
    from oelm.training.state import TrainState

__all__ = ["early_stop_due", "evaluate", "evaluate_predictions", "evaluate_test", "stop_early", "token_accuracy_fields",
           "token_accuracy_of", "validate"]


def cpu_copy(model: nn.Module) -> dict[str, torch.Tensor]:
    """A CPU copy of ``model``'s state dict (the best weights kept in memory)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: Iterable[dict[str, torch.Tensor]], metric: Metric | str,
    mixed_precision: str | Precision = "no", accelerator: Accelerator | None = None,
    predictions: PredictionCollector | None = None,
) -> dict[str, float]:
    """Evaluate ``model`` on ``loader`` (under autocast when ``mixed_precision`` is bf16/fp16: a
    mode string, or the engine's :class:`~oelm.training.precision.Precision`).

    With an ``accelerator`` of several processes, ``loader`` is that process's shard (as
    Accelerate prepared it): per-example sums are gathered with ``gather_for_metrics``, which
    drops the examples Accelerate repeated to even out the shards, so every example counts once
    and every process returns the same numbers.

    ``predictions`` (:class:`~oelm.training.prediction_collector.PredictionCollector`) is handed every
    batch's logits, to keep per-example outcomes (the final runs' ``predictions.npz``), and the
    returned dict as its ``result``.

    Returns:
        ``{"value": accuracy % or perplexity, "loss": mean loss, "n": examples or tokens}``;
        language modelling adds ``"token_accuracy"``: next-token top-1 accuracy in % of the
        predicted tokens (the argmax of the logits at position t equals token t + 1; positions
        labelled -100 are not counted). Perplexity is ``exp`` of the token-weighted mean
        next-token NLL.

    Raises:
        OELMError: the loader is empty.
    """
    metric = get_metric(metric)
    classification = metric.unit == "%"
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    precision = mixed_precision if isinstance(mixed_precision, Precision) else Precision(mixed_precision, device)
    autocast = precision.autocast
    if accelerator is not None and accelerator.num_processes > 1:
        loss_sum, count, correct = _gathered_sums(model, loader, classification, autocast, accelerator, predictions)
    else:  # summed on the device in float64/int64 (the same arithmetic as Python floats): one sync at the end
        loss_total = torch.zeros((), dtype=torch.float64, device=device)  # sum of mean loss x n
        counts = torch.zeros(2, dtype=torch.int64, device=device)  # n, correct
        for batch in loader:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with autocast():
                out = model(**batch)
            labels = batch["labels"]
            predicted = out.logits.argmax(dim=-1)  # (B,) classes, (B, T) next tokens
            if classification:
                n = torch.tensor(labels.numel(), device=device)
                counts[1] += (predicted == labels).sum()
            else:
                n = (labels[:, 1:] != -100).sum()
                counts[1] += (predicted[:, :-1] == labels[:, 1:]).sum()  # -100 never equals an id
            loss_total += out.loss.double() * n
            if predictions is not None:
                predictions.add(batch, out.logits, predicted=predicted)
            counts[0] += n
        loss_sum, count, correct = float(loss_total), int(counts[0]), int(counts[1])
    model.train(was_training)
    if count == 0:
        raise OELMError("the evaluation split is empty")
    mean_loss = loss_sum / count
    if classification:
        result = {"value": 100.0 * correct / count, "loss": mean_loss, "n": count}
    else:
        result = {"value": math.exp(min(mean_loss, 700.0)), "loss": mean_loss, "n": count, "token_accuracy": 100.0 * correct / count}
    if predictions is not None:
        predictions.result = result
    return result


def _gathered_sums(model, loader, classification: bool, autocast, accelerator: Accelerator,
                   predictions: PredictionCollector | None = None) -> tuple[float, int, int]:
    """(loss sum, examples or tokens, correct) over every process's shard, each example once."""
    import torch.nn.functional as F

    device = accelerator.device
    rows: list[torch.Tensor] = []
    for batch in loader:
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with autocast():
            logits = model(**batch).logits.float()
        labels = batch["labels"]
        predicted = logits.argmax(-1)  # (B,) classes, (B, T) next tokens
        if classification:
            loss = F.cross_entropy(logits, labels, reduction="none")  # (B,)
            stats = torch.stack([loss, torch.ones_like(loss), (predicted == labels).float()], dim=1)
        else:  # logits[:, t] predicts labels[:, t + 1]; -100 is ignored
            target = labels[:, 1:]
            nll = F.cross_entropy(logits[:, :-1].transpose(1, 2), target, ignore_index=-100, reduction="none")  # (B, T-1)
            valid = (target != -100).float()
            right = (predicted[:, :-1] == target).float()  # -100 never equals an id
            stats = torch.stack([nll.sum(1), valid.sum(1), right.sum(1)], dim=1)
        rows.append(accelerator.gather_for_metrics(stats).double().sum(0))  # (3,) per batch, over processes
        if predictions is not None:
            predictions.add(batch, logits, accelerator, predicted=predicted)
    if not rows:
        return 0.0, 0, 0
    total = torch.stack(rows).sum(0)
    return float(total[0]), int(total[1]), int(total[2])


def evaluate_predictions(model: nn.Module, loader: DataLoader, metric: Metric | str, mixed_precision: str | Precision = "no",
                         accelerator: Accelerator | None = None, *, step: int) -> SplitPredictions:
    """Evaluate ``loader`` once (:func:`evaluate`) keeping its per-example outcomes, ``model``
    holding the weights of ``step``: a promoted sweep run's validation split, or a resumed run's
    whose checkpoint predates the predictions kept during validation.

    Raises:
        OELMError: the loader is empty.
    """
    collector = collector_for(loader, get_metric(metric).name)
    evaluate(model, loader, metric, mixed_precision, accelerator=accelerator, predictions=collector)
    return collector.split(loader, step)


def validate(engine: "Engine", state: "TrainState", loader: DataLoader, at_step: int) -> None:
    """Evaluate on the validation loader, log it, keep the weights when they are the best, and
    count validations without an improvement (early stopping). The value is the same on every
    process (reduced over them in :func:`evaluate`), so every rank keeps the same best and count.
    A final run (``engine.keep_predictions``) keeps the best validation's per-example outcomes
    too (``engine.best_predictions``), gathered over processes in the loader's order as the sums are.

    Raises:
        RunFaultError: kind ``oom``, naming ``training.eval_batch_size``.
    """
    collector = collector_for(loader, engine.metric.name) if engine.keep_predictions else None
    with engine.phases.measure("validation"):
        try:
            result = evaluate(engine.model, loader, engine.metric.name, engine.precision, accelerator=engine.accelerator,
                              predictions=collector)
        except Exception as exc:
            if is_oom(exc):
                raise oom_error(exc, next(iter(loader)), at_step, "eval_batch_size", "validation") from exc
            raise
    state.last_eval = result
    record = {"type": "eval", "step": at_step, engine.metric.name: result["value"], "loss": result["loss"],
              **token_accuracy_fields(result), "elapsed_seconds": time.perf_counter() - engine.t_start,
              **training_progress(engine)}
    engine.log.write(record)
    state.history.append(record)
    if state.best_value is None or engine.metric.better(result["value"], state.best_value):
        state.best_value, state.best_step = result["value"], at_step
        engine.best_state = cpu_copy(engine.unwrapped)
        if collector is not None:
            with engine.phases.measure("predictions"):
                engine.best_predictions = collector.split(loader, at_step)
    reference = state.early_stopping_reference
    if reference is None or engine.metric.improves(result["value"], reference, engine.config.early_stopping_min_delta):
        state.early_stopping_reference, state.evals_without_improvement = result["value"], 0
    else:
        state.evals_without_improvement += 1


def validated_at(state: "TrainState", step: int) -> bool:
    """Was the model validated at ``step`` already (so the weights of that step are covered)?"""
    evals = [r for r in state.history if r.get("type") == "eval"]
    return state.last_eval is not None and bool(evals) and evals[-1]["step"] == step


def early_stop_due(engine: "Engine", state: "TrainState") -> bool:
    """Has the run gone ``early_stopping_patience`` validations without an improvement? Every
    process counts from the same reduced validation values; on several processes they also agree
    by an all-reduce (any says stop: all stop), so none can be left waiting in a collective."""
    patience = engine.config.early_stopping_patience
    if patience is None:
        return False
    due = state.evals_without_improvement >= patience
    if engine.world_size > 1:
        flag = torch.tensor(float(due), device=engine.device)
        due = bool(engine.accelerator.reduce(flag, "sum") > 0)
    return due


def stop_early(engine: "Engine", state: "TrainState") -> None:
    """Log the steps since the last train line (as at the last planned step) and the
    ``early_stop`` record; the caller leaves the loop and the run ends as a finished one."""
    if state.running_n:
        log_train(engine, state)
    record = {"type": "early_stop", "step": state.step, "planned_steps": engine.total_steps,
              "evals_without_improvement": state.evals_without_improvement,
              "patience": engine.config.early_stopping_patience, "min_delta": engine.config.early_stopping_min_delta,
              "best_step": state.best_step, f"best_{engine.metric.name}": state.best_value,
              "elapsed_seconds": time.perf_counter() - engine.t_start}
    engine.log.write(record)
    state.history.append(record)


def evaluate_test(engine: "Engine", state: "TrainState", test_loader: DataLoader | None,
                  predictions: PredictionCollector | None = None) -> float | None:
    """Evaluate the test split once (with the weights loaded: the best on validation) and log it
    at the best step; ``predictions`` collects its per-example outcomes. Returns its value, or
    None without a test split."""
    if test_loader is None:
        return None
    with engine.phases.measure("test"):
        result = evaluate(engine.model, test_loader, engine.metric.name, engine.precision, accelerator=engine.accelerator,
                          predictions=predictions)
    record = {"type": "test", "step": state.best_step, engine.metric.name: result["value"], **token_accuracy_fields(result)}
    engine.log.write(record)
    state.history.append(record)
    return result["value"]


def token_accuracy_fields(result: dict[str, float]) -> dict[str, float]:
    """``{"token_accuracy": %}`` of a language-modelling evaluation; {} for classification."""
    return {"token_accuracy": result["token_accuracy"]} if "token_accuracy" in result else {}


def token_accuracy_of(history: list[dict], best_step: int) -> dict[str, float | None] | None:
    """``{"best_validation": %, "test": % or None}``: the LM token accuracy of the validation at
    ``best_step`` and of the test evaluation in a run's ``history``; None when its evaluations
    have none (classification)."""
    best = [r for r in history if r.get("type") == "eval" and r.get("step") == best_step and "token_accuracy" in r]
    if not best:
        return None
    test = [r for r in history if r.get("type") == "test" and "token_accuracy" in r]
    return {"best_validation": best[-1]["token_accuracy"], "test": test[-1]["token_accuracy"] if test else None}
