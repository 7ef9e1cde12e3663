"""The comparison protocol's public entry point, kept for its users: :func:`run_experiment` runs a
matrix (:func:`oelm.matrix.run_matrix`). The protocol itself lives in :mod:`oelm.matrix`: the plan
(:mod:`oelm.matrix.plan`), the output folder and run record (:mod:`oelm.records`), one run
(:mod:`oelm.matrix.run_one`) and the executors (:mod:`oelm.matrix.executors`).
"""

from __future__ import annotations

from oelm.data.prepare import PreparedData, prepare_data
from oelm.matrix.driver import run_matrix as run_experiment
from oelm.matrix.plan import plan_runs, run_order
from oelm.models.build import build_model, resolve_init_from
from oelm.records import PlannedRun, run_name

__all__ = ["PreparedData", "prepare_data", "build_model", "run_order", "run_name", "plan_runs", "PlannedRun",
           "resolve_init_from", "run_experiment"]
