"""Attention diagnostics of a matrix's final runs (:mod:`oelm.method.diagnostics`): once at the end of each
final run, from its best-on-validation weights, into ``result.json`` (:func:`run_diagnostics`); and
after the fact, for runs that finished without them, from each run's saved best weights into
``runs/<run>/diagnostics.json`` (:func:`diagnose_output`, ``oelm diagnose OUTPUT_DIR``), which the
report reads when ``result.json`` has none. A finished run's ``result.json`` is never rewritten.

The batch is the first :data:`~oelm.method.diagnostics.DIAGNOSTIC_EXAMPLES` examples of the matrix's
validation split (dataset order: the same for every run); the overlap's reference is the pretrained
checkpoint's Q/K (``model.pretrained``; none for a model trained from scratch).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import torch

from oelm.config import ExperimentConfig
from oelm.errors import OELMError
from oelm.io import write_json_atomic
from oelm.matrix.assemble import build_run_model
from oelm.matrix.data import PreparedData
from oelm.matrix.model import build_model
from oelm.method.diagnostics import attention_diagnostics, diagnostic_batch, qk_weights
from oelm.records import MatrixFolder, RunFolder, RunRecord
from oelm.report.diagnostics_summary import recorded_diagnostics
from oelm.runtime.distributed import is_main_process, num_processes

__all__ = ["run_diagnostics", "diagnose_output"]

_REFERENCE: dict[str, Any] = {}  # one model's pretrained Q/K, kept for the runs of one matrix


def _reference(config: ExperimentConfig, data: PreparedData) -> dict[str, Any] | None:
    """The pretrained checkpoint's Q/K (:func:`~oelm.method.diagnostics.qk_weights`), loaded once per
    process and model (the global RNG is left as it was); None for a model trained from scratch."""
    if not config.model.pretrained:
        return None
    key = json.dumps(config.model.model_dump(mode="json"), sort_keys=True)
    if key not in _REFERENCE:
        _REFERENCE.clear()
        with torch.random.fork_rng(devices=[]):  # the classifier head's fresh init draws from it
            model, _ = build_model(config, data)
        _REFERENCE[key] = qk_weights(model)
    return _REFERENCE[key]


def run_diagnostics(model: torch.nn.Module, config: ExperimentConfig, data: PreparedData,
                    log: Callable[[str], None] = print) -> dict[str, Any] | None:
    """The ``diagnostics`` of a final run whose ``model`` holds its best weights: the fixed batch
    (``batch``), the overlap's ``reference`` and every field of
    :func:`~oelm.method.diagnostics.attention_diagnostics`; ``seconds``: the whole pass, the reference's
    loading included (in no run timing: it runs after them).

    Rank 0 alone computes them (None on the other ranks: they write no result). An FSDP job is
    skipped (``{"skipped": ...}``): its parameters are sharded, and one rank's forward would wait for
    the others; ``oelm diagnose`` computes them afterwards from the saved weights.
    Diagnostics are a reading of a finished run: an error in them (a custom architecture oelm cannot
    read, say) is recorded as ``{"error": "<type>: <message>"}`` and logged, and the run is kept.
    """
    if not is_main_process():
        return None
    if num_processes() > 1 and config.training.distributed == "fsdp":
        return {"skipped": "FSDP shards the parameters; run `oelm diagnose OUTPUT_DIR` after the matrix"}
    started = time.perf_counter()
    try:
        batch = diagnostic_batch(data.validation, data.collate_fn)
        found = attention_diagnostics(model, batch, reference=_reference(config, data))
    except Exception as exc:  # never lose a trained run to its diagnostics
        log(f"attention diagnostics failed ({type(exc).__name__}: {exc}); the run is kept without them")
        return {"error": f"{type(exc).__name__}: {exc}"}
    n = len(batch["input_ids"])
    return {"batch": {"split": "validation", "examples": n,
                      "rule": f"the first {n} examples of the validation split, in dataset order"},
            "reference": f"pretrained {config.model.pretrained}" if config.model.pretrained else None, **found,
            "seconds": round(time.perf_counter() - started, 3)}  # the reference's loading included


def _diagnose_one(config: ExperimentConfig, data: PreparedData, folder: RunFolder, record: RunRecord,
                  log: Callable[[str], None]) -> Path | None:
    """Write the run's ``diagnostics.json`` (:attr:`RunFolder.diagnostics
    <oelm.records.RunFolder.diagnostics>`) from its best weights; None when it cannot (logged)."""
    from safetensors.torch import load_model

    entry = next((m for m in config.methods if m.name == record.method), None)
    if entry is None:
        log(f"[{folder.name}] method {record.method!r} is not in config.yaml; skipped")
        return None
    try:
        ckpt = folder.verify_weights(record, f"delete {folder.path} and rerun `oelm run` to train it again")
    except OELMError as exc:
        log(f"[{folder.name}] skipped: {exc}")
        return None
    if not ckpt.is_file():
        log(f"[{folder.name}] skipped: no best weights ({ckpt})")
        return None
    model, _, _, _ = build_run_model(config, entry, record.seed, data)
    load_model(model, str(ckpt))
    if torch.cuda.is_available():
        model.to("cuda")
    found = run_diagnostics(model, config, data, log)
    write_json_atomic(folder.diagnostics, {"run_name": folder.name, "method": record.method, "seed": record.seed,
                                           "checkpoint_sha256": (record.checkpoint or {}).get("sha256"),
                                           "diagnostics": found})
    mean = found.get("mean") or {}
    log(f"[{folder.name}] {folder.diagnostics}: entropy {mean.get('entropy')} nats (uniform {mean.get('uniform_entropy')}), "
        f"logit scale {mean.get('logit_scale')}, effective rank {mean.get('qk_effective_rank')}, "
        f"overlap {mean.get('overlap')}")
    return folder.diagnostics


def diagnose_output(out: str | Path, log: Callable[[str], None] = print, *, force: bool = False) -> list[Path]:
    """``oelm diagnose OUTPUT_DIR``: attention diagnostics for every finished final run under ``out``
    that has none (in ``result.json`` or a ``diagnostics.json`` of its current weights; ``force``:
    recompute the file anyway), from its ``checkpoint/model.safetensors``. Returns the files written.

    Raises:
        OELMError: ``out`` has no config.yaml, or no final run; data or model problems as ``oelm run``.
    """
    from oelm.config import load_config
    from oelm.matrix.output import prepare_matrix_data
    from oelm.report import load_results

    out = Path(out)
    matrix = MatrixFolder(out)
    if not matrix.config.is_file():
        raise OELMError(f"{out} is not an oelm output directory (no config.yaml); pass the --output-dir of `oelm run`")
    config = load_config(matrix.config)
    todo = []
    finals = [record for runs in load_results(out).values() for record in runs if record.finished and record.name]
    for record in finals:
        folder = matrix.run(record.name)
        try:
            kept = not force and recorded_diagnostics(folder, record) is not None
        except OELMError as exc:  # damaged, or computed from weights trained again since
            log(f"[{folder.name}] {str(exc).split('; ')[0]}: computing it again")
            kept = False
        if kept:
            log(f"[{folder.name}] has diagnostics already; kept")
            continue
        todo.append((folder, record))
    if not finals:
        log(f"nothing to do: no final run under {out} has finished yet (diagnostics are of final runs)")
        return []
    if not todo:
        log(f"nothing to do: every finished final run under {out} has its diagnostics")
        return []
    data = prepare_matrix_data(config, out, log, save_tokenizer=False)
    written = [_diagnose_one(config, data, folder, record, log) for folder, record in todo]
    return [p for p in written if p is not None]
