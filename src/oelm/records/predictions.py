"""``predictions.npz``: the per-example predictions a final run saves, and their checksum record.

A final run of a matrix writes, beside its ``result.json``, one compressed NumPy archive
(``numpy.savez_compressed``; read with ``numpy.load(..., allow_pickle=False)``)::

    runs/<run name>/predictions.npz
      meta                     JSON text (a 0-d unicode array): format, task_type, metric, step, per split
                               {value, loss, n, token_accuracy (LM)} and the column meanings
      <split>/<column>         one 1-D array per column, one row per example (classification) or document (LM)

``<split>`` is ``validation`` (the best-on-validation weights, i.e. the selected step) and ``test``
(the same weights; the test split evaluated once) when the run has one. Columns:

* classification: ``index`` (int64, the example's row in the split as the matrix prepared it:
  the same for every method and seed of a matrix, so runs pair by example), ``label`` (int64),
  ``prediction`` (int64, argmax of the logits), ``margin`` (float32, the label's logit minus the
  largest other logit: > 0 when the prediction is right, up to ties) and ``loss`` (float32, the
  example's cross-entropy, nats);
* language modelling: ``document`` (int64, the document's number in the split's token stream:
  documents are separated by the tokenizer's end-of-text token, the first one counts as 0; a
  document cut by the end of the stream is kept), ``tokens`` (int64, the tokens of the document
  that were predicted: every token of a packed block but its first), ``loss`` (float64, the mean
  next-token NLL of those tokens, nats) and ``correct`` (int64, those predicted top-1 right).
  The split's perplexity is ``exp(sum(loss * tokens) / sum(tokens))`` and its token accuracy
  ``100 * sum(correct) / sum(tokens)``.

The run's ``result.json`` records ``predictions`` = ``{"path", "sha256", "bytes", "format"}``
(:func:`predictions_record`; declared in :class:`oelm.records.result.Predictions`), and
:func:`read_predictions` refuses a file that differs from it, as
:meth:`oelm.records.RunFolder.verify_weights` does for the best weights. The file's place in the
run folder is :attr:`oelm.records.RunFolder.predictions`.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from oelm.errors import ChecksumError, DamagedFileError, FileFormatError, RecordedFileMissingError
from oelm.io import atomic_path, check_format, inside, sha256_file
from oelm.records import RunFolder, RunRecord
from oelm.records.folder import PREDICTIONS_FILE

__all__ = [
    "PREDICTIONS_FILE", "PREDICTIONS_FORMAT", "CLASSIFICATION_COLUMNS", "LM_COLUMNS", "RunPredictions",
    "write_predictions", "write_predictions_file", "predictions_record", "read_predictions", "load_predictions_file",
]

#: Version of the layout above (``meta["format"]`` and the record's ``format``).
PREDICTIONS_FORMAT = 1

#: column -> dtype, per task type (the order they are written in).
CLASSIFICATION_COLUMNS = {"index": np.int64, "label": np.int64, "prediction": np.int64, "margin": np.float32,
                          "loss": np.float32}
LM_COLUMNS = {"document": np.int64, "tokens": np.int64, "loss": np.float64, "correct": np.int64}

_FIX = ("restore it from a copy, or delete the run's folder and rerun `oelm run` with the same --output-dir to train "
        "that run again; until then the report gives a seed-only interval for its method")


def _columns(task_type: str) -> dict[str, Any]:
    return CLASSIFICATION_COLUMNS if task_type == "classification" else LM_COLUMNS


@dataclass(frozen=True)
class RunPredictions:
    """One run's ``predictions.npz``, read back: ``meta`` (the JSON header) and ``splits``
    (split -> column -> 1-D array, rows aligned)."""

    meta: dict[str, Any]
    splits: dict[str, dict[str, np.ndarray]]

    @property
    def task_type(self) -> str:
        return self.meta["task_type"]

    def split(self, name: str) -> dict[str, np.ndarray] | None:
        """The columns of split ``name`` (``"validation"`` / ``"test"``), None when not saved."""
        return self.splits.get(name)


def write_predictions(run_dir: str | Path, task_type: str, splits: Mapping[str, Mapping[str, np.ndarray]],
                      meta: Mapping[str, Any]) -> Path:
    """Write ``run_dir/predictions.npz`` atomically (temp file, fsync, rename); returns its path.

    Args:
        task_type: ``"classification"`` or ``"language_modeling"`` (picks the columns).
        splits: split -> column -> 1-D array (every column of the task type, equal lengths).
        meta: JSON-able header fields (metric, step, per split value / loss / n, ...).

    Raises:
        ValueError: a column is missing or the columns of a split differ in length.
        OSError: the file cannot be written (the caller maps a full disk to its fault).
    """
    target = RunFolder(run_dir).predictions
    with atomic_path(target) as tmp:
        write_predictions_file(tmp, task_type, splits, meta)
    return target


def write_predictions_file(path: str | Path, task_type: str, splits: Mapping[str, Mapping[str, np.ndarray]],
                           meta: Mapping[str, Any], compress: bool = True) -> None:
    """Write the layout above to ``path`` as it is (not atomically: :func:`write_predictions`
    renames a temporary file; a checkpoint writes into its temporary directory). ``compress``:
    ``numpy.savez_compressed``, else ``numpy.savez`` (the same arrays, read back alike).

    Raises:
        ValueError: a column is missing or the columns of a split differ in length.
        OSError: the file cannot be written.
    """
    columns = _columns(task_type)
    arrays: dict[str, np.ndarray] = {}
    for split, cols in splits.items():
        missing = [c for c in columns if c not in cols]
        lengths = {len(cols[c]) for c in columns if c in cols}
        if missing or len(lengths) > 1:
            raise ValueError(f"predictions of split {split!r}: columns {missing or sorted(cols)} "
                             f"{'missing' if missing else 'of different lengths'}")
        for c, dtype in columns.items():
            arrays[f"{split}/{c}"] = np.ascontiguousarray(cols[c], dtype=dtype)
    header = {"format": PREDICTIONS_FORMAT, "task_type": task_type, "columns": list(columns), **dict(meta)}
    arrays["meta"] = np.array(json.dumps(header, sort_keys=True))
    with open(path, "wb") as fh:  # a file object: savez would append ".npz" to a path
        (np.savez_compressed if compress else np.savez)(fh, **arrays)


def predictions_record(run_dir: str | Path) -> dict[str, Any] | None:
    """``{"path": "predictions.npz", "sha256": <hex>, "bytes": <size>, "format": 1}`` of the
    predictions a finished run wrote in ``run_dir`` (for its ``result.json``); None when it wrote none."""
    path = RunFolder(run_dir).predictions
    if not path.is_file():
        return None
    return {"path": PREDICTIONS_FILE, "sha256": sha256_file(path), "bytes": path.stat().st_size,
            "format": PREDICTIONS_FORMAT}


def read_predictions(run_dir: str | Path, result: RunRecord | Mapping[str, Any]) -> RunPredictions | None:
    """The predictions of the run in ``run_dir``, checked against the record in its ``result``
    (its :class:`~oelm.records.RunRecord`, or ``result.json`` as a dict). None when the result
    records none (a sweep run, or a run written before oelm saved predictions).

    Raises:
        RecordedFileMissingError: the file is recorded but missing.
        ChecksumError: its size or sha256 differs from the record.
        DamagedFileError: it matches the record but cannot be read as a predictions file.
        FileFormatError: its layout version is not the one this oelm reads.
        OutsideFolderError: the recorded path leads outside the run folder (absolute, ``..``) or
            through a symbolic link (:func:`oelm.io.inside`): another matrix's file is never read.
        Each is one line naming the file, ``result.json`` and the fix.
    """
    folder = RunFolder(run_dir)
    record = (result if isinstance(result, RunRecord) else RunRecord(dict(result))).predictions
    if not isinstance(record, dict) or not record.get("sha256"):
        return None
    path = inside(folder.path, str(record.get("path", PREDICTIONS_FILE)), named_in=folder.result)
    if not path.is_file():
        raise RecordedFileMissingError(f"{path} is missing, but {folder.result} records it; {_FIX}")
    if path.stat().st_size != record.get("bytes", path.stat().st_size) or sha256_file(path) != record["sha256"]:
        raise ChecksumError(f"{path} is corrupted: its size or sha256 differs from the one recorded in "
                            f"{folder.result}; {_FIX}")
    try:
        return load_predictions_file(path)
    except FileFormatError:
        raise
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, json.JSONDecodeError) as exc:
        raise DamagedFileError(f"{path} is damaged ({str(exc).splitlines()[0][:120]}); {_FIX}") from None


def load_predictions_file(path: str | Path) -> RunPredictions:
    """Read a file of the layout above (no checksum: :func:`read_predictions` checks the record first).

    Raises:
        FileFormatError: its ``meta["format"]`` is not :data:`PREDICTIONS_FORMAT` (newer, older or
            absent; :func:`oelm.io.check_format`).
        OSError, zipfile.BadZipFile: not readable as an archive.
        ValueError, KeyError, json.JSONDecodeError: not the layout above (a column missing, lengths differ).
    """
    with np.load(path, allow_pickle=False) as npz:
        meta = json.loads(str(npz["meta"]))
        check_format(path, meta.get("format") if isinstance(meta, dict) else None, PREDICTIONS_FORMAT, older=_FIX)
        columns = _columns(meta["task_type"])
        splits: dict[str, dict[str, np.ndarray]] = {}
        for key in npz.files:
            if key != "meta":
                split, column = key.split("/", 1)
                splits.setdefault(split, {})[column] = npz[key]
    for split, cols in splits.items():
        if set(cols) != set(columns) or len({len(v) for v in cols.values()}) != 1:
            raise ValueError(f"split {split} has columns {sorted(cols)} of lengths {sorted({len(v) for v in cols.values()})}")
    return RunPredictions(meta, splits)
