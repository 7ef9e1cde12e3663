"""A documented public alias: :func:`run_experiment` runs a matrix (:func:`oelm.matrix.run_matrix`),
importable from ``oelm.experiment`` as before the protocol became the :mod:`oelm.matrix` package.
Nothing inside oelm imports this module. The protocol lives in :mod:`oelm.matrix`: the plan
(:mod:`oelm.matrix.plan`), one run (:mod:`oelm.matrix.run_one`), the executors
(:mod:`oelm.matrix.executors`); the output folder and run record in :mod:`oelm.records`.
"""

from __future__ import annotations

from oelm.matrix.assemble import resolve_init_from
from oelm.matrix.data import PreparedData, prepare_data
from oelm.matrix.driver import run_matrix as run_experiment
from oelm.matrix.model import build_model
from oelm.matrix.plan import plan_runs, run_order
from oelm.records import PlannedRun, run_name

__all__ = ["PreparedData", "prepare_data", "build_model", "run_order", "run_name", "plan_runs", "PlannedRun",
           "resolve_init_from", "run_experiment"]
