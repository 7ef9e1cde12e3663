"""Per-example predictions of a final run: collected during an evaluation pass
(:class:`PredictionCollector`, handed to :func:`oelm.training.evaluation.evaluate`), kept as a
:class:`SplitPredictions` and saved to ``predictions.npz`` (:func:`write_final_predictions`; the
layout is :mod:`oelm.records.predictions`).

A final run keeps the outcomes of every validation while it runs and holds on to those of the best
one (in memory, and in every resumable checkpoint: :func:`save_best_predictions`), so the file is
written from the evaluations the run makes anyway: no pass over the validation split after training.

Classification keeps one row per example (label, argmax prediction, logit margin, loss); language
modelling one row per document of the split's token stream (predicted tokens, mean next-token
NLL, tokens predicted top-1 right), so the report can resample test examples or documents
(:mod:`oelm.report.uncertainty`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch
import torch.nn.functional as F
from accelerate import Accelerator

from oelm.errors import OELMError
from oelm.metrics import get_metric
from oelm.records import RunFolder
from oelm.records.predictions import load_predictions_file, write_predictions, write_predictions_file
from oelm.training.faults import raise_disk_full

__all__ = ["BEST_PREDICTIONS_FILE", "PredictionCollector", "SplitPredictions", "collector_for", "example_order",
           "load_best_predictions", "save_best_predictions", "write_final_predictions"]

#: The best validation's predictions inside a resumable checkpoint (``checkpoints/step-<N>/``).
BEST_PREDICTIONS_FILE = "best_predictions.npz"


def example_order(loader: Iterable) -> list[int]:
    """The dataset rows ``loader`` yields, in order (the evaluation loaders sort examples by
    length). Reads the loader's batch sampler, also when Accelerate wrapped it in its shard
    sampler; a loader without one is taken to be sequential."""
    batches = getattr(loader, "batch_sampler", None)
    inner = getattr(batches, "batch_sampler", batches)  # accelerate's BatchSamplerShard wraps the loader's own
    sampler = getattr(inner, "sampler", None)
    return [int(i) for i in sampler] if sampler is not None else list(range(len(loader.dataset)))


@dataclass(frozen=True)
class SplitPredictions:
    """One split's per-example predictions from one evaluation pass.

    Attributes:
        task_type: ``"classification"`` or ``"language_modeling"``.
        columns: column -> 1-D array, rows aligned (the columns of :mod:`oelm.records.predictions`).
        summary: what the pass measured: ``{"value", "loss", "n", "token_accuracy" (LM), "rows"}``.
        step: the optimizer step of the weights evaluated.
        eos_token_id: LM: the end-of-text id that numbered the documents; None for classification.
    """

    task_type: str
    columns: dict[str, np.ndarray]
    summary: dict[str, Any]
    step: int
    eos_token_id: int | None = None


class PredictionCollector:
    """Per-example outcomes of one evaluation pass, gathered over processes.

    ``add`` is called by :func:`~oelm.training.evaluation.evaluate` once per batch with the
    model's logits; with several processes each batch's rows are gathered with Accelerate's
    ``gather_for_metrics`` (which drops the examples repeated to even out the shards), so the
    rows follow the loader's global order. :meth:`columns` turns them into the columns of
    :mod:`oelm.records.predictions`.

    Args:
        task_type: ``"classification"`` or ``"language_modeling"``.
        eos_token_id: LM only: the end-of-text id that separates the packed documents (a
            dataset's ``eos_token_id``); None makes every row (block) one document.
    """

    def __init__(self, task_type: str, eos_token_id: int | None = None) -> None:
        self.task_type = task_type
        self.eos_token_id = eos_token_id
        self.result: dict[str, float] | None = None  # what evaluate() returned for the pass that filled it
        self._rows: list[dict[str, torch.Tensor]] = []

    @torch.no_grad()
    def add(self, batch: dict[str, torch.Tensor], logits: torch.Tensor, accelerator: Accelerator | None = None,
            predicted: torch.Tensor | None = None) -> None:
        """Record one batch: ``logits`` (B, C) for classification, (B, T, V) for LM; ``batch``
        holds ``labels`` (B,) / (B, T) and, for LM, ``input_ids`` (B, T). ``predicted``: the
        argmax of ``logits`` over the last dimension, (B,) / (B, T), when the caller has it
        already (:func:`~oelm.training.evaluation.evaluate` counts the right ones with it)."""
        predicted = logits.argmax(-1) if predicted is None else predicted
        rows = (self._classification(batch, logits, predicted) if self.task_type == "classification"
                else self._lm(batch, logits, predicted))
        if accelerator is not None and accelerator.num_processes > 1:
            rows = accelerator.gather_for_metrics(rows)
        self._rows.append({k: v.cpu() for k, v in rows.items()})

    @staticmethod
    def _classification(batch: dict[str, torch.Tensor], logits: torch.Tensor,
                        predicted: torch.Tensor) -> dict[str, torch.Tensor]:
        logits, labels = logits.float(), batch["labels"]
        true_logit = logits.gather(1, labels[:, None]).squeeze(1)
        others = logits.masked_fill(F.one_hot(labels, logits.shape[1]).bool(), float("-inf"))
        return {"label": labels, "prediction": predicted, "margin": true_logit - others.max(-1).values,
                "loss": F.cross_entropy(logits, labels, reduction="none")}

    def _lm(self, batch: dict[str, torch.Tensor], logits: torch.Tensor, predicted: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per row: sums over its document segments (a segment = the predicted tokens of one
        document inside the row), and the row's end-of-text count (to number documents across rows).

        The next-token NLL is a cross-entropy over the transposed ``[B, V, T-1]`` view of the
        logits, as the predictions file has always computed it, so ``predictions.npz`` is
        byte-identical to the one the former second pass over the best weights wrote (issue 48).
        Flattening the contiguous logits instead (the model's own loss kernel) is about 4x faster
        on this step but differs by float32 rounding (a few ulp): kept out for that reason."""
        ids, target = batch["input_ids"], batch["labels"][:, 1:]  # logits[:, t] predicts labels[:, t + 1]
        width = ids.shape[1]
        scores = logits[:, :-1].float()  # (B, T-1, V)
        nll = F.cross_entropy(scores.transpose(1, 2), target, ignore_index=-100, reduction="none")  # (B, T-1)
        valid = target != -100
        correct = (predicted[:, :-1] == target) & valid
        if self.eos_token_id is None:
            is_eos = torch.zeros_like(ids, dtype=torch.bool)
        else:
            is_eos = ids == self.eos_token_id
        # the target at position t belongs to the document that the end-of-text tokens before t number
        segment = is_eos.long().cumsum(1)[:, :-1]  # (B, T-1)

        def per_segment(values: torch.Tensor) -> torch.Tensor:
            return torch.zeros(ids.shape[0], width, dtype=torch.float64, device=ids.device).scatter_add_(
                1, segment, values.double())

        return {"loss": per_segment(nll * valid), "tokens": per_segment(valid), "correct": per_segment(correct),
                "eos": is_eos.sum(1)}

    def columns(self, order: list[int], dataset: Any = None) -> dict[str, np.ndarray]:
        """The collected rows as the columns of :mod:`oelm.records.predictions`. ``order``: the dataset
        rows the loader yielded (:func:`example_order`); ``dataset``: checked against (its
        ``labels``, classification) so a mismatch of order cannot pass unseen.

        Raises:
            OELMError: the rows do not match ``order`` or the dataset (a bug, not bad input).
        """
        rows = {k: torch.cat([r[k] for r in self._rows]).numpy() for k in self._rows[0]} if self._rows else {}
        n = len(next(iter(rows.values()))) if rows else 0
        if n != len(order):
            raise OELMError(f"the evaluation yielded {n} examples but its loader lists {len(order)}")
        index = np.asarray(order, dtype=np.int64)
        if self.task_type == "classification":
            labels = getattr(dataset, "labels", None)
            if labels is not None and not np.array_equal(np.asarray(labels)[index], rows["label"]):
                raise OELMError("the gathered predictions are not in the loader's order (labels differ)")
            return {"index": index, **{k: rows[k] for k in ("label", "prediction", "margin", "loss")}}
        return _documents(index, rows)

    def split(self, loader: Any, step: int) -> SplitPredictions:
        """The pass over ``loader`` that filled this collector (its ``result`` set by
        :func:`~oelm.training.evaluation.evaluate`), with the weights of ``step``, as a :class:`SplitPredictions`.

        Raises:
            OELMError: the rows do not match the loader's order (:meth:`columns`).
        """
        columns = self.columns(example_order(loader), loader.dataset)
        rows = len(next(iter(columns.values())))
        return SplitPredictions(self.task_type, columns, _split_summary(self.result, rows), step, self.eos_token_id)


def _documents(index: np.ndarray, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-row segment sums -> one row per document (numbered over the whole stream: the rows are
    consecutive blocks of it, so a row's first segment continues the previous row's last document)."""
    by_row = np.argsort(index, kind="stable")
    if not np.array_equal(index[by_row], np.arange(len(index))):
        raise OELMError("LM predictions need every block of the split (rows 0..n-1), got a subset")
    offsets = np.concatenate([[0], np.cumsum(rows["eos"][by_row])[:-1]]).astype(np.int64)  # documents before each row
    width = rows["tokens"].shape[1]
    doc = (offsets[:, None] + np.arange(width)[None, :]).ravel()
    sums = {k: np.bincount(doc, weights=rows[k][by_row].ravel()) for k in ("loss", "tokens", "correct")}
    keep = sums["tokens"] > 0  # a document whose only token opened a block predicted nothing
    tokens = np.rint(sums["tokens"][keep]).astype(np.int64)
    return {"document": np.flatnonzero(keep).astype(np.int64), "tokens": tokens,
            "loss": sums["loss"][keep] / tokens, "correct": np.rint(sums["correct"][keep]).astype(np.int64)}


def _split_summary(result: dict[str, float], examples: int) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k in ("value", "loss", "n", "token_accuracy")} | {"rows": examples}


def collector_for(loader: Any, metric: str) -> PredictionCollector:
    """A :class:`PredictionCollector` for an evaluation of ``loader`` on ``metric`` (the task type
    from the metric; for LM the end-of-text id its dataset knows)."""
    task_type = "classification" if get_metric(metric).unit == "%" else "language_modeling"
    return PredictionCollector(task_type, getattr(loader.dataset, "eos_token_id", None))


def write_final_predictions(run_dir: Path, metric: str, splits: dict[str, SplitPredictions], *,
                            is_main: bool = True) -> dict[str, Any]:
    """Write ``run_dir/predictions.npz`` (rank 0: ``is_main``) from ``splits`` (``"validation"``:
    the best validation's, and ``"test"`` when the run has one: the same weights' one test pass).

    Returns:
        Per split ``{"value", "loss", "n", "token_accuracy" (LM), "rows"}``.

    Raises:
        RunFaultError: kind ``disk_full`` (the file names it).
    """
    validation = splits["validation"]
    summaries = {name: split.summary for name, split in splits.items()}
    meta = {"metric": get_metric(metric).name, "step": validation.step, "splits": summaries,
            "eos_token_id": validation.eos_token_id}
    if is_main:
        try:
            write_predictions(run_dir, validation.task_type, {name: split.columns for name, split in splits.items()}, meta)
        except OSError as exc:
            raise_disk_full(exc, RunFolder(run_dir).predictions, validation.step)
            raise
    return summaries


def save_best_predictions(path: Path, best: SplitPredictions, metric: str) -> None:
    """Write the best validation's predictions to ``path`` inside a checkpoint being written (the
    layout of ``predictions.npz`` with its ``validation`` split only, uncompressed), so a resumed
    run writes them without evaluating the best weights again.

    Raises:
        OSError: the file cannot be written (the checkpoint maps a full disk to its fault).
    """
    meta = {"metric": get_metric(metric).name, "step": best.step, "splits": {"validation": best.summary},
            "eos_token_id": best.eos_token_id}
    write_predictions_file(path, best.task_type, {"validation": best.columns}, meta, compress=False)


def load_best_predictions(path: Path) -> SplitPredictions:
    """Inverse of :func:`save_best_predictions` (the checkpoint's manifest has checked the file's sha256).

    Raises:
        OSError, ValueError, KeyError: not a predictions file (:func:`oelm.records.predictions.load_predictions_file`).
    """
    saved = load_predictions_file(path)
    return SplitPredictions(saved.task_type, saved.splits["validation"], saved.meta["splits"]["validation"],
                            int(saved.meta["step"]), saved.meta.get("eos_token_id"))
