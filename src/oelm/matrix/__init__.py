"""The comparison protocol written once, run by any executor.

- :mod:`~oelm.matrix.plan`: config + results found so far -> the runs, which are ready, the
  learning-rate selection (pure functions).
- :mod:`~oelm.matrix.run_one`: train exactly one planned run; :mod:`~oelm.matrix.assemble` builds
  its model (``init_from`` weights, the method) from the config's fresh model
  (:mod:`~oelm.matrix.model`); the config's data is :mod:`~oelm.matrix.data`.
- :mod:`~oelm.matrix.executors`: where a ready run trains (local, Ray).
- :mod:`~oelm.matrix.driver`: the plan driven by an executor; ``oelm plan`` / ``--only`` /
  ``--collect`` for batch systems.
- :mod:`~oelm.matrix.output`: the driver's files (config, fingerprint, plan, selection).
- :mod:`~oelm.matrix.diagnose`: attention diagnostics of the final runs (in-run, and ``oelm diagnose``).

Names are imported on first use, so that ``import oelm.matrix`` does not load torch. The output
folder and the run record (read by every layer) live in :mod:`oelm.records`.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "run_matrix": "driver", "plan_matrix": "driver", "run_only": "driver", "collect": "driver", "time_lines": "driver",
    "RunTask": "plan", "plan_runs": "plan", "ready_runs": "plan", "run_order": "plan", "select_learning_rates": "plan",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'oelm.matrix' has no attribute {name!r}")
    return getattr(importlib.import_module(f"oelm.matrix.{_WHERE[name]}"), name)
