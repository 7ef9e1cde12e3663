"""What a matrix cost: its runs' measured time summed into run-hours, CPU core-hours and GPU-hours;
and where each final run's wall time went (:func:`time_split_blocks`).

Papers state the compute behind a comparison (GPU-hours, core-hours); a reviewer weighs a verdict
against it, and a reader plans a rerun by it. oelm sums the time every run measured itself
(``timing.total_seconds``: training, validation, checkpoints and the test evaluation, after the
warm-up step; model building and data preparation are not in it) over *every* run with a result,
sweep and final, failed included: the learning-rate sweep is part of what the comparison cost.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from oelm.records import RunRecord, round_parts

RULE = ("timing.total_seconds of every run with a result (sweep and final, failed included): training, validation, "
        "checkpoints and test, after the warm-up step; model building and data preparation excluded. CPU core-seconds = "
        "seconds x torch threads x processes; GPU-seconds = seconds x processes (one GPU each)")


def matrix_compute(records: Iterable[RunRecord]) -> dict[str, Any]:
    """The compute of the runs ``records`` (every run of a matrix: :meth:`oelm.records.MatrixFolder.results`).

    Returns:
        ``{"runs", "timed_runs", "run_seconds", "cpu_core_seconds", "gpu_seconds", "rule"}``:
        ``runs`` counts the records, ``timed_runs`` those with a ``total_seconds`` (a run that failed
        before its timing was written has none, and adds nothing); ``run_seconds`` is the plain sum
        (s); ``cpu_core_seconds`` the CPU runs' seconds x ``environment.torch_num_threads`` x
        ``timing.num_processes`` (1 where not recorded); ``gpu_seconds`` the CUDA runs' seconds x
        processes. Divide by 3,600 for hours.
    """
    runs = timed = 0
    seconds = core = gpu = 0.0
    for record in records:
        runs += 1
        total = record.total_seconds
        if total is None:
            continue
        timed += 1
        seconds += total
        processes = int(record.timing.get("num_processes") or 1)
        if str(record.device or "cpu").startswith("cuda"):
            gpu += total * processes
        else:
            core += total * int(record.torch_num_threads or 1) * processes
    return {"runs": runs, "timed_runs": timed, "run_seconds": seconds, "cpu_core_seconds": core, "gpu_seconds": gpu,
            "rule": RULE}


def compute_line(compute: dict[str, Any]) -> str:
    """One sentence for the report, e.g. ``"15 runs in all (the sweep's too, where there is one): 0.53
    run-hours, 1.06 CPU core-hours"``."""
    parts = [f"{compute['run_seconds'] / 3600:.2f} run-hours"]
    if compute["cpu_core_seconds"]:
        parts.append(f"{compute['cpu_core_seconds'] / 3600:.2f} CPU core-hours")
    if compute["gpu_seconds"]:
        parts.append(f"{compute['gpu_seconds'] / 3600:.2f} GPU-hours")
    untimed = compute["runs"] - compute["timed_runs"]
    tail = f" ({untimed} run(s) without a recorded time add nothing)" if untimed else ""
    return f"{compute['runs']} runs in all (the sweep's too, where there is one): {', '.join(parts)}{tail}"


def time_split_blocks(comparison: dict[str, Any]) -> list[tuple[str, list[tuple[str, Any]]]]:
    """The report's "Where the time went" section: per final run, its wall time split into set-up,
    training, data wait, validation, test, predictions, checkpoints and the rest (``time_split`` of
    its row in ``comparison.json``: :attr:`oelm.records.RunRecord.time_split`), as ``oelm run``
    prints it; ``[(title, blocks)]`` in the block format of :class:`oelm.report.render.Section`,
    [] when no run recorded it (older results)."""
    rows, names = [], None
    for method, m in comparison["methods"].items():
        for run in m.get("runs", []):
            split = run.get("time_split")
            if split:
                names = list(split)
                shown = round_parts(split)
                rows.append([method, str(run["seed"]), f"{sum(shown.values()):.1f}", *(f"{v:.1f}" for v in shown.values())])
    if not rows:
        return []
    text = ("Seconds of each run's wall time, adding up to it: set-up before the run's clock (the speed probe, the model, "
            "the loaders, the engine, the warm-up passes), the optimizer steps, waiting for the training loader, the "
            "validations (a final run keeps their per-example outcomes meanwhile), the test split, the predictions "
            "(kept at each best validation, then predictions.npz), checkpoints (resumable ones and the best weights), and "
            "the rest (resuming, logging, the speed probe after the run, its attention diagnostics). A resumed run counts "
            "its last process's set-up only. The process's own start-up, data preparation and this report are in the "
            "last line `oelm run` prints.")
    return [("Where the time went", [("text", text), ("table", (["method", "seed", "wall s", *(n.replace("_", " ") for n in names)],
                                                               rows))])]
