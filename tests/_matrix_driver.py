"""``oelm run`` of a tiny matrix in this process, each training step slowed by a sleep (test only),
so a test can kill it at chosen points. Changes no number: the sleep is a forward pre-hook.

    python tests/_matrix_driver.py OUT_DIR SLEEP_SECONDS [key=value ...]

Exit status: `oelm run`'s (0 finished, 130 interrupted, 2 error).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import oelm.matrix.run_one
from oelm.cli import main

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tinystories-tiny.yaml"


def _slowed(build):
    def build_run_model(*args, **kwargs):
        model, *rest = build(*args, **kwargs)
        model.register_forward_pre_hook(lambda m, a, k: time.sleep(SLEEP) if m.training else None, with_kwargs=True)
        return (model, *rest)

    return build_run_model


if __name__ == "__main__":
    out, SLEEP, overrides = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
    oelm.matrix.run_one.build_run_model = _slowed(oelm.matrix.run_one.build_run_model)
    sys.exit(main(["run", str(CONFIG), "--output-dir", out, *overrides]))
