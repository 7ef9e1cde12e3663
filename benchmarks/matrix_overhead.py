"""Per-run overhead of an executor: the seconds a run spends outside its training loop, from the
moment the driver hands it to the executor (``executor.submitted_unix``) to the end of its result
(``executor.finished_unix``), less the loop's own ``timing.total_seconds``. For the Ray executor
that covers task dispatch, a worker process's start, its data preparation (token caches make it
short) and the model build; for the local executor the model build alone (the driver prepared
the data once). Issue 24's target: Ray's overhead at most 5 s a run beyond the local executor's.

    python benchmarks/matrix_overhead.py LOCAL_OUT RAY_OUT

Run both matrices with the same config and ``--cpus-per-run``, Ray with ``--parallel`` no larger
than its CPUs (so no run waits in Ray's queue for a free CPU, which is not overhead).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def overheads(out: Path) -> dict[str, float]:
    """Run name -> seconds outside the training loop (see the module docstring)."""
    found = {}
    for path in sorted(Path(out).glob("runs/*/result.json")):
        r = json.loads(path.read_text())
        ex, total = r.get("executor") or {}, (r.get("timing") or {}).get("total_seconds")
        if r.get("status") == "finished" and ex.get("submitted_unix") and total is not None:
            found[path.parent.name] = ex["finished_unix"] - ex["submitted_unix"] - total
    return found


def main(local: str, ray: str) -> None:
    a, b = overheads(Path(local)), overheads(Path(ray))
    print(f"{'run':32s} {'local s':>8s} {'ray s':>8s} {'ray - local':>12s}")
    for name in sorted(set(a) & set(b)):
        print(f"{name:32s} {a[name]:8.2f} {b[name]:8.2f} {b[name] - a[name]:12.2f}")
    extra = [b[n] - a[n] for n in set(a) & set(b)]
    if extra:
        print(f"Ray overhead beyond the local executor: median {statistics.median(extra):.2f} s, max {max(extra):.2f} s a run "
              f"(target <= 5 s)")


if __name__ == "__main__":
    main(*sys.argv[1:3])
