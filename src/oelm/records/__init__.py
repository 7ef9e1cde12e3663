"""The run record and the run folder: the ground floor that every writer (a run, the matrix
driver) and every reader (the plan, the report, ``oelm monitor``, ``init_from``; outside the library,
the claims table of research/)
goes through. One module per file on disk:

- :mod:`~oelm.records.folder`: :class:`MatrixFolder` / :class:`RunFolder` (every path of a matrix
  and of a run, the listings of runs, which runs hold results), :func:`run_name`, :class:`PlannedRun`,
  :func:`step_checkpoints`;
- :mod:`~oelm.records.result`: ``result.json``: the typed :class:`RunRecord`, the validated read
  and the writer's constructors (:func:`finished_result`, :func:`failed_result`);
  :mod:`~oelm.records.schema`: its schema (:class:`ResultFile`), every field declared;
- :mod:`~oelm.records.status`: ``status.json``;
- :mod:`~oelm.records.sweep`: ``sweep.json``, the learning-rate grid, and :func:`final_runs`;
- :mod:`~oelm.records.predictions`: ``predictions.npz``, a final run's per-example predictions, and
  its checksum record (numpy; imported where it is read or written, not from here).

It imports nothing of oelm but :mod:`oelm.errors` and :mod:`oelm.io` (and no torch, no pydantic
until a file is read), so every layer may import it.
"""

from oelm.records.folder import (
    BEST_CHECKPOINT, DIAGNOSTICS_FILE, PREDICTIONS_FILE, MatrixFolder, PlannedRun, RunFolder, run_name, step_checkpoints,
)
from oelm.records.result import (
    DAMAGED_RESULT_FIX, RunRecord, ResultFile, budget_record, failed_result, finished_result, read_record, run_identity,
    round_parts, time_split_text, write_record,
)
from oelm.records.status import read_status, utc_now, write_status
from oelm.records.sweep import (
    SWEEP_FIX, final_runs, format_rates, grid_edge, grid_edge_note, is_automatic, is_superseded, read_sweep, selected_rates,
    superseded_final_runs, sweep_entry, sweep_file,
)

__all__ = [
    "BEST_CHECKPOINT", "DIAGNOSTICS_FILE", "PREDICTIONS_FILE", "MatrixFolder", "PlannedRun", "RunFolder", "run_name",
    "step_checkpoints",
    "DAMAGED_RESULT_FIX", "RunRecord", "ResultFile", "budget_record", "failed_result", "finished_result", "read_record",
    "run_identity", "round_parts", "time_split_text", "write_record",
    "read_status", "utc_now", "write_status",
    "SWEEP_FIX", "final_runs", "format_rates", "grid_edge", "grid_edge_note", "is_automatic", "is_superseded", "read_sweep",
    "selected_rates", "superseded_final_runs", "sweep_entry", "sweep_file",
]
