"""Aggregate an experiment's runs into ``comparison.json`` and the original project's layout.

Inputs are what ``oelm run`` writes: per run ``runs/<method>-seed<k>/result.json`` (the results
dicts passed in) and ``metrics.jsonl`` (read from the output directory when it is given).
Fields added by later versions of the runner are used when present and never required:
``result["timing"]["step_ms"]`` (every measured step), ``result["status"]`` / ``["failure"]``,
``result["learning_rate"]``, ``result["data"]["num_labels"]`` and ``sweep.json`` (whose
``selected_at_grid_edge`` is not read: the report recomputes it from the sweep's entries, so
outputs written before that key existed get it too).
"""

from __future__ import annotations

import math
import statistics
import platform
from pathlib import Path
from typing import Any

from oelm.io import read_jsonl
from oelm.matrix.store import RunRecord
from oelm.metrics import get_metric
from oelm.runs import DRIFT_WARNING_PERCENT, format_rates, grid_edge, grid_edge_note, read_sweep, run_name, superseded_final_runs
from oelm.report.convergence import time_to_quality_comparison
from oelm.report.diagnostics import diagnostics_comparison
from oelm.report.uncertainty import uncertainty_comparison
from oelm.report.stats import (
    CHANCE_MARGIN_POINTS,
    best_at_last_evaluation,
    collapse_reasons,
    paired_difference,
    step_time_stats,
    summarize,
    time_to_target,
)

# A GPU idle for more than this % of its training time waiting for batches gets a warning (CPU runs
# do not: there a loader worker would compete with the model for the same cores).
DATA_STALL_WARNING_PERCENT = 5.0

__all__ = ["compare_results", "original_layout", "read_metrics", "run_records", "num_labels_of", "majority_percent_of", "device_label", "learning_rate_of", "step_times_of", "mfu_reference", "comparison_warnings"]

_NUMBER_FIELDS = ("loss", "accuracy", "perplexity", "elapsed_seconds", "step_ms", "tokens_per_second")


def _sound_record(r: dict[str, Any]) -> bool:
    """A record whose ``step`` is a whole number and whose number fields are numbers (or null)."""
    def number(v):
        return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))

    step = r.get("step")
    return isinstance(step, int) and not isinstance(step, bool) and all(number(r.get(k)) for k in _NUMBER_FIELDS)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Records of one ``metrics.jsonl`` (a missing file gives []; a torn last line, a line that is
    not an object, and a hand-edited record whose step or numbers are not numbers are skipped)."""
    return [r for r in read_jsonl(path) if _sound_record(r)]


def run_records(out: str | Path | None, record: RunRecord) -> list[dict[str, Any]]:
    """The ``metrics.jsonl`` records of ``record``'s run under ``out`` ([] when ``out`` is None).

    The run folder is ``record.name``; results written before ``run_name`` existed are found
    under ``<method>-lr<lr>-seed<k>`` (swept methods) or ``<method>-seed<k>``.
    """
    if out is None:
        return []
    runs = Path(out) / "runs"
    names = [record.name] if record.name else []
    if record.learning_rate is not None:
        names.append(run_name(record.method, record.seed, record.learning_rate))
    names.append(run_name(record.method, record.seed))
    for name in names:
        if (runs / name / "metrics.jsonl").exists():
            return read_metrics(runs / name / "metrics.jsonl")
    return []


def mfu_reference(peak_source: str | None, precision: str | None = None) -> str:
    """What an MFU figure is a fraction of, for a reader: ``timing.mfu.peak_source``
    (``"measured-probe"``, ``"datasheet:<GPU>"``) and ``peak_precision`` -> "the measured fp32
    matmul probe (not the hardware peak)" / "the H100 SXM datasheet peak for bf16"; "–" for None."""
    if peak_source in (None, "None"):
        return "–"
    if peak_source == "measured-probe":
        return f"the measured {precision + ' ' if precision else ''}matmul probe (not the hardware peak)"
    if str(peak_source).startswith("datasheet:"):
        return f"the {peak_source.split(':', 1)[1]} datasheet peak" + (f" for {precision}" if precision else "")
    return str(peak_source)


def _mfu(record: RunRecord) -> dict[str, Any]:
    """``timing.mfu`` of a run ({} when absent: older results, or FLOPs not derivable)."""
    return record.timing.get("mfu") or {}


def _telemetry(record: RunRecord, key: str, stat: str = "median") -> float | None:
    """One statistic of ``timing.gpu_telemetry`` (None on CPU, or when NVML was not available)."""
    tel = record.timing.get("gpu_telemetry") or {}
    return (tel.get(key) or {}).get(stat) if tel.get("available") else None


def num_labels_of(record: RunRecord) -> int | None:
    """Classes of a classification run: ``data.num_labels``, else the dataset registry's label names."""
    n = record.data.get("num_labels")
    if isinstance(n, int) and n > 0:
        return n
    task = record.task or (record.config.get("task") or {}).get("dataset")
    if not task:
        return None
    try:
        from oelm.data import get_dataset_spec

        spec = get_dataset_spec(task)
    except Exception:  # an unregistered task in an old output: the chance rule is skipped
        return None
    return len(spec.label_names) if spec.label_names else None


def majority_percent_of(record: RunRecord) -> float | None:
    """The validation split's most frequent label in % of its examples (``None`` in outputs
    written before oelm recorded label counts, or for language modelling)."""
    value = (record.data.get("validation") or {}).get("majority_class_percent")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def learning_rate_of(record: RunRecord) -> float | None:
    """``record.learning_rate``, else ``record.method_config["learning_rate"]``."""
    lr = record.learning_rate
    return lr if lr is not None else record.method_config.get("learning_rate")


def device_label(record: RunRecord) -> str:
    """Which machine and device a run used: ``host / device (GPU name or CPU model)``."""
    env = record.environment
    device = record.timing.get("device") or env.get("device") or "?"
    name = (env.get("cuda") or {}).get("name") or env.get("cpu_model") or ""
    host = env.get("hostname") or "?"
    return f"{host} / {device}" + (f" ({name})" if name else "")


def step_times_of(record: RunRecord, records: list[dict[str, Any]]) -> tuple[list[float], str]:
    """Every measured step time (``timing.step_ms``), else the step times logged at log steps."""
    timing = record.timing
    if timing.get("step_ms"):
        return [float(x) for x in timing["step_ms"] if x is not None], "every step"
    warm = timing.get("timing_warmup_steps_excluded") or 0
    logged = [r["step_ms"] for r in records if r.get("type") == "train" and r.get("step_ms") is not None and r.get("step", 0) > warm]
    return [float(x) for x in logged], "sampled at log steps"


def _pct(a: float | None, b: float | None) -> float | None:
    """(a - b) / b in %."""
    if a is None or b is None or b == 0:
        return None
    return 100.0 * (a - b) / b


def compare_results(config, results: dict[str, list[dict]], out: str | Path | None = None) -> dict[str, Any]:
    """Aggregate each method over seeds, compare with ``baseline``, flag collapsed runs.

    Args:
        config: the :class:`~oelm.config.ExperimentConfig`.
        results: method -> run results (``result.json`` dicts, read as :class:`RunRecord`), any status.
        out: the output directory, to read each run's ``metrics.jsonl`` (time-to-target, the
            perplexity collapse rule, logged step times) and an optional ``sweep.json``.

    Per method (sound runs only; collapsed runs listed under ``excluded``): ``summarize`` (mean,
    std, n, 95% t interval) of best/final validation, test, total and train seconds, median step
    ms and tokens/s; ``step_times`` (:func:`~oelm.report.stats.step_time_stats` of all sound runs'
    steps pooled); parameters, learning rate, devices, speed-probe drift per seed;
    ``learning_rate_grid`` (the sorted rates of its learning-rate sweep, None when it was not
    swept) and ``selected_at_grid_edge`` (``"low"`` / ``"high"`` when the selected rate is the
    grid's smallest / largest, else None: see :func:`oelm.runs.grid_edge`), computed from
    ``sweep.json``'s entries; an edge is also a warning (a wider grid could change the result).

    Against baseline: ``metric_gap`` (method − baseline means, in metric units: accuracy points
    or perplexity), ``metric_gap_relative_percent``, ``total_time_gap_percent`` and
    ``per_step_gap_percent`` ((method − baseline) / baseline in %; negative = faster),
    ``speedup`` (baseline mean total seconds / method's), ``parameters_saved_percent``
    (trainable parameters fewer than baseline's, in % of baseline's), and paired by seed
    (:func:`~oelm.report.stats.paired_difference`): ``paired_metric`` (best validation),
    ``paired_test`` (test split, evaluated once per final run; n = 0 without one) and
    ``paired_seconds`` (total seconds).

    ``steps``: ``summarize`` of the optimizer steps each sound run trained (fewer than planned
    when it stopped early). When two methods' mean steps differ, their total seconds cover
    different amounts of training: a warning says so (compare step ms for speed per step and time
    to target for time to a quality).

    ``best_at_last_step``: method -> the seeds of its runs (collapsed ones included) that did not
    stop early and whose best validation is at their last scheduled evaluation
    (:func:`~oelm.report.stats.best_at_last_evaluation`: still improving when the budget ended, so
    a longer run could change the comparison); also a warning.

    Time to target: the target is baseline's mean final validation value over its sound seeds;
    per method and seed the first evaluation reaching it (step, seconds), or None.
    """
    results = {name: [RunRecord(r) for r in runs] for name, runs in results.items()}
    higher = None
    metric = None
    sweep = read_sweep(Path(out) / "sweep.json") if out is not None and (Path(out) / "sweep.json").is_file() else None
    grids = _sweep_grids(sweep)
    methods: dict[str, Any] = {}
    collapsed: list[dict[str, Any]] = []
    records_of: dict[tuple[str, int], list[dict]] = {}
    still_improving: dict[str, list[int]] = {}  # method -> seeds whose best validation is at their last scheduled evaluation
    for name, runs in results.items():
        if not runs:
            continue
        runs = sorted(runs, key=lambda r: r.seed)
        sound, excluded, per_run, steps_all, step_source = [], [], [], [], None
        for r in runs:
            recs = run_records(out, r)
            records_of[(name, r.seed)] = recs
            perf = r.performance
            metric = metric or r.metric
            reasons = collapse_reasons(r, recs, num_labels=num_labels_of(r), majority_percent=majority_percent_of(r))
            per_run.append({
                "seed": r.seed,
                "run_name": r.name,
                "status": r.status,
                "best_validation": r.best_validation,
                "final_validation": perf.get("final_validation"),
                "test": r.test,
                "total_seconds": r.timing.get("total_seconds"),
                "learning_rate": learning_rate_of(r),
                "device": device_label(r),
                "collapse": reasons,
            })
            if perf.get("early_stopped"):  # only then: comparisons of runs without early stopping stay as they were
                per_run[-1]["stopped_early_at"] = perf.get("steps")
            if best_at_last_evaluation(r, recs):
                still_improving.setdefault(name, []).append(r.seed)
            if reasons:
                excluded.append({"seed": r.seed, "reasons": reasons})
                collapsed.append({"method": name, "seed": r.seed, "reasons": reasons})
                continue
            sound.append(r)
            times, step_source = step_times_of(r, recs)
            steps_all.extend(times)

        def col(get):
            return summarize([get(r) for r in sound])

        def timing(key):
            return lambda r: r.timing.get(key)

        groups = runs[0].parameters
        methods[name] = {
            "seeds": [r.seed for r in runs],
            "included_seeds": [r.seed for r in sound],
            "excluded": excluded,
            "best_validation": col(lambda r: r.best_validation),
            "final_validation": col(lambda r: r.performance.get("final_validation")),
            "test": col(lambda r: r.test),
            "total_seconds": col(timing("total_seconds")),
            "train_seconds": col(timing("train_seconds")),
            "steps": col(lambda r: r.performance.get("steps")),
            "step_ms_median": col(lambda r: (r.timing.get("per_step_ms") or {}).get("median")),
            "tokens_per_second": col(timing("tokens_per_second")),
            # % of step + data-stall time the device sat idle waiting for a batch, and the loader workers
            "data_stall_percent": col(_data_stall_percent),
            "num_workers": sorted({w for w in map(_loader_workers, sound) if w is not None}),
            # model FLOPs utilization in % (timing.mfu.mfu is a fraction) and the peak it was taken against
            "mfu_percent": col(lambda r: None if _mfu(r).get("mfu") is None else 100.0 * _mfu(r)["mfu"]),
            "mfu_peak_source": sorted({str(_mfu(r).get("peak_source")) for r in sound if _mfu(r).get("mfu") is not None}),
            # what the MFU is a fraction of, in words (the measured probe on CPU, not the hardware peak)
            "mfu_reference": sorted({mfu_reference(_mfu(r).get("peak_source"), _mfu(r).get("peak_precision"))
                                     for r in sound if _mfu(r).get("mfu") is not None}),
            "compile_seconds": col(timing("compile_seconds")),
            "gpu_utilization_percent_median": col(lambda r: _telemetry(r, "gpu_utilization_percent")),
            "gpu_temperature_c_max": col(lambda r: _telemetry(r, "temperature_c", "max")),
            "step_times": step_time_stats(steps_all) | {"source": step_source},
            "parameters": groups,
            "learning_rate": learning_rate_of(runs[0]),
            **(grids.get(name) or {"learning_rate_grid": None, "selected_at_grid_edge": None}),
            "devices": sorted({device_label(r) for r in runs}),
            "probe_drift_percent": {r.seed: r.environment.get("matmul_probe_drift_percent") for r in runs},
            "runs": per_run,
        }
    higher = get_metric(metric).higher_is_better if metric else False

    base = methods.get("baseline")
    gaps: dict[str, Any] = {}
    if base:
        base_runs = {r["seed"]: r for r in base["runs"] if not r["collapse"]}
        for name, m in methods.items():
            if name == "baseline":
                continue
            bv, mv = base["best_validation"]["mean"], m["best_validation"]["mean"]
            bt, mt = base["total_seconds"]["mean"], m["total_seconds"]["mean"]
            bs, ms = base["step_ms_median"]["mean"], m["step_ms_median"]["mean"]
            btr = (base["parameters"] or {}).get("trainable")
            mtr = (m["parameters"] or {}).get("trainable")
            mine = {r["seed"]: r for r in m["runs"] if not r["collapse"]}
            gaps[name] = {
                "metric_gap": None if bv is None or mv is None else mv - bv,
                "metric_gap_relative_percent": _pct(mv, bv),
                "total_time_gap_percent": _pct(mt, bt),
                "per_step_gap_percent": _pct(ms, bs),
                "speedup": (bt / mt) if bt and mt else None,
                "parameters_saved_percent": 100.0 * (btr - mtr) / btr if btr and mtr is not None else None,
                "paired_metric": paired_difference(
                    {s: r["best_validation"] for s, r in base_runs.items()}, {s: r["best_validation"] for s, r in mine.items()}
                ),
                "paired_seconds": paired_difference(
                    {s: r["total_seconds"] for s, r in base_runs.items()}, {s: r["total_seconds"] for s, r in mine.items()}
                ),
                # the held-out number a claim is judged on: each final run's test split, evaluated once
                "paired_test": paired_difference(
                    {s: r["test"] for s, r in base_runs.items()}, {s: r["test"] for s, r in mine.items()}
                ),
            }

    ttt = None
    if base and base["final_validation"]["mean"] is not None and out is not None:
        target = base["final_validation"]["mean"]
        ttt = {"metric": metric, "target": target, "higher_is_better": higher, "methods": {}}
        for name, m in methods.items():
            per_seed = {}
            for r in m["runs"]:
                if r["collapse"]:
                    continue
                per_seed[r["seed"]] = time_to_target(records_of[(name, r["seed"])], metric, target, higher)
            hit = [v for v in per_seed.values() if v is not None]
            ttt["methods"][name] = {
                "runs": per_seed,
                "reached": len(hit),
                "n": len(per_seed),
                "steps": summarize([v["step"] for v in hit]),
                "seconds": summarize([v["seconds"] for v in hit]),
            }

    all_results = [r for runs in results.values() for r in runs]
    comparison = {
        "name": config.name,
        "task": config.task.dataset,
        "model": config.model.display_name,
        "metric": metric,
        "higher_is_better": higher,
        "seeds": config.seeds,
        "methods": methods,
        "vs_baseline": gaps,
        "time_to_target": ttt,
        "collapsed": collapsed,
        "collapse_rule": {
            "chance_margin_points": CHANCE_MARGIN_POINTS,
            "num_labels": next((n for n in (num_labels_of(r) for r in all_results) if n), None),
            "validation_majority_class_percent": max(
                (p for p in (majority_percent_of(r) for r in all_results) if p is not None), default=None),
        },
        "sweep": sweep,
        "superseded": superseded_final_runs(out) if out is not None else [],
        "best_at_last_step": still_improving,
        "reference": dict(config.reference),
        "reference_source": config.reference_source,
        "environment": _environment(all_results),
        "execution": _execution(all_results),
        "host": platform.node(),
    }
    # sections only where the runs recorded what they need (saved predictions; training seconds per
    # validation): {} for results of older oelm versions, whose comparison stays as it was
    comparison.update(uncertainty_comparison(comparison, results, out))
    comparison.update(time_to_quality_comparison(comparison, results, records_of))
    comparison.update(diagnostics_comparison(comparison, results, out))  # runs with attention diagnostics
    comparison["warnings"] = _warnings(comparison)
    return comparison


def _sweep_grids(sweep: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Per swept method of ``sweep.json``: ``learning_rate_grid`` (every rate its entries tried,
    sorted, whatever their status) and ``selected_at_grid_edge`` of the selected rate (the entry
    marked ``selected``, else ``selected_learning_rates``). Computed, never read from the file."""
    out: dict[str, dict[str, Any]] = {}
    for name, entries in ((sweep or {}).get("methods") or {}).items():
        grid = sorted({e["learning_rate"] for e in entries if e.get("learning_rate") is not None})
        chosen = next((e["learning_rate"] for e in entries if e.get("selected") and e.get("learning_rate") is not None),
                      (sweep.get("selected_learning_rates") or {}).get(name))
        out[name] = {"learning_rate_grid": grid, "selected_at_grid_edge": grid_edge(grid, chosen)}
    return out


def _execution(results: list[RunRecord]) -> dict[str, Any]:
    """How the final runs were placed (each result's ``executor``): the executors and nodes,
    and the runs that trained beside another run on the same node (shared cores or GPUs), whose
    step times are therefore not speed evidence. ``timing_grade``: no such run (a local or
    ``--parallel 1`` matrix)."""
    shared = sorted(r.name or f"{r.method}-seed{r.seed}" for r in results if r.executor.get("shared_node"))
    most = max((sum(o.get("node") == r.executor.get("node") for o in r.executor.get("overlapped") or [])
                for r in results), default=1)
    return {
        "executors": sorted({r.executor.get("name", "local") for r in results}),
        "nodes": sorted({n for r in results if (n := r.executor.get("node"))}),
        "shared_node_runs": shared,
        "most_overlapped_runs": most,  # the most other runs one final run overlapped on its node
        "timing_grade": not shared,
    }


def _environment(results: list[RunRecord]) -> dict[str, Any]:
    """What the runs ran on: devices, versions and the speed probe per run."""
    envs = [(r, r.environment) for r in results]
    first = envs[0][1] if envs else {}
    return {
        "devices": sorted({device_label(r) for r, _ in envs}),
        "python": first.get("python"),
        "platform": first.get("platform"),
        "packages": first.get("packages") or {},
        "cpu_model": first.get("cpu_model"),
        "torch_num_threads": first.get("torch_num_threads"),
        "cuda": {k: (first.get("cuda") or {}).get(k) for k in ("name", "torch_cuda", "cudnn", "driver_version")} if first.get("cuda") else None,
        "mixed_precision": sorted({str(r.timing.get("mixed_precision")) for r, _ in envs}),
        "probe": [
            {
                "run": f"{r.method}-seed{r.seed}",
                "method": r.method,
                "gflops_before": (e.get("matmul_probe") or {}).get("gflops"),
                "gflops_after": (e.get("matmul_probe_after") or {}).get("gflops"),
                "drift_percent": e.get("matmul_probe_drift_percent"),
            }
            for r, e in envs
        ],
    }


def comparison_warnings(comparison: dict[str, Any]) -> list[str]:
    """The warnings ``oelm report`` prints for ``comparison`` (what :func:`compare_results`
    returns, or a ``comparison.json`` read back), one sentence each: runs on different devices,
    the machine's speed drifting during runs or between methods, runs that shared a machine,
    collapsed runs, a learning rate on the edge of its grid, a grid that grew, runs still improving
    at their last evaluation, totals over different step counts, a GPU waiting for data
    (``DATA_STALL_WARNING_PERCENT``), superseded final runs.

    Recomputed from the comparison's fields with the current rules; a comparison that lacks them
    (written by an older oelm) gives its stored ``warnings``. ``[]`` when there is nothing to warn of.
    """
    try:
        return _warnings(comparison)
    except (KeyError, TypeError, AttributeError):
        return [str(w) for w in comparison.get("warnings") or []]


def _warnings(c: dict[str, Any]) -> list[str]:
    """Reasons a reader should distrust part of the comparison (devices, drift within a run or
    between methods' runs, collapses, a
    learning rate selected on the edge of its grid, a grid that grew, superseded final runs, runs
    whose best validation is at their last scheduled evaluation)."""
    out = []
    devices = c["environment"]["devices"]
    if len(devices) > 1:
        out.append(f"runs of this comparison ran on different devices ({'; '.join(devices)}): timings are not comparable.")
    drifted = [
        f"{p['run']}: {p['drift_percent']:+.0f}%"
        for p in c["environment"]["probe"]
        if p["drift_percent"] is not None and abs(p["drift_percent"]) > DRIFT_WARNING_PERCENT
    ]
    if drifted:
        out.append(
            f"the matrix-multiply speed probe changed by more than {DRIFT_WARNING_PERCENT:.0f}% between the start and end "
            f"of some runs ({'; '.join(drifted)}): the machine's speed drifted, so time differences of that size are not evidence."
        )
    speeds: dict[str, list[float]] = {}
    for p in c["environment"]["probe"]:
        if p.get("gflops_before"):
            speeds.setdefault(p["method"], []).append(p["gflops_before"])
    medians = {name: statistics.median(v) for name, v in speeds.items()}
    if len(medians) > 1 and max(medians.values()) > (1 + DRIFT_WARNING_PERCENT / 100) * min(medians.values()):
        out.append(
            f"the matrix-multiply speed probe at the start of each method's runs differs by more than {DRIFT_WARNING_PERCENT:.0f}% "
            f"between methods (median GFLOP/s: {', '.join(f'{n} {v:.1f}' for n, v in medians.items())}): the methods met the "
            "machine at different speeds (run at different times or beside different loads), so step-time and total-time "
            "differences of that size are not evidence."
        )
    shared = (c.get("execution") or {}).get("shared_node_runs") or []
    if shared:
        out.append(
            f"{len(shared)} final run(s) trained beside other runs on the same machine (one overlapped up to "
            f"{c['execution']['most_overlapped_runs']} others, executor {', '.join(c['execution']['executors'])}; "
            f"{', '.join(shared)}): they shared its cores or GPUs, so their step times and total times are not speed "
            "evidence; rerun with --parallel 1 (or the local executor) for timings."
        )
    for x in c["collapsed"]:
        out.append(f"{x['method']} seed {x['seed']} excluded from the means: {'; '.join(x['reasons'])}.")
    for name, m in c["methods"].items():
        if m.get("selected_at_grid_edge"):
            out.append(f"{name}: {grid_edge_note(m['learning_rate_grid'], m['selected_at_grid_edge'])}.")
    for name, steps in ((c.get("sweep") or {}).get("grid_growth") or {}).items():
        for g in steps:
            tested = g.get("tested_final_runs") or []
            out.append(f"{name}: its learning-rate grid grew from {format_rates(g['from'])} to {format_rates(g['to'])} ({g.get('at')}) "
                       "and the rate was selected again on validation"
                       + (f"; {len(tested)} final run(s) had already evaluated the test split ({', '.join(tested)}), "
                          "so the grid grew after test results existed." if tested else "; no test result existed then."))
    for name, seeds in (c.get("best_at_last_step") or {}).items():
        out.append(f"{name}: best validation at the last evaluation of the budget in seed(s) {', '.join(map(str, seeds))}: "
                   "still improving when training ended, so a longer budget could change the comparison.")
    steps = {name: (m.get("steps") or {}).get("mean") for name, m in c["methods"].items()}
    known = {name: v for name, v in steps.items() if v is not None}
    if len(set(known.values())) > 1:
        out.append("total seconds (and Δ time %) cover different numbers of training steps, since runs stopped early at "
                   f"different points (mean steps: {', '.join(f'{n} {v:,.0f}' for n, v in known.items())}): they say when "
                   "each method stopped, not how fast it trains; compare step ms for speed and time to target for time to a quality.")
    for name, m in c["methods"].items():
        stall = (m.get("data_stall_percent") or {}).get("mean")
        if stall is not None and stall > DATA_STALL_WARNING_PERCENT and any("cuda" in d for d in m.get("devices") or []):
            workers = "/".join(map(str, m.get("num_workers") or [])) or "?"
            out.append(f"{name}: the GPU waited for data {stall:.0f}% of its training time (timing.data_stall_seconds, mean "
                       f"over seeds) with {workers} DataLoader worker(s): step times and tokens/s are partly data loading; "
                       "raise training.num_workers so batches are ready before each step.")
    by_method: dict[tuple[str, float], list[str]] = {}
    for r in c.get("superseded") or []:
        by_method.setdefault((r["method"], r["learning_rate"]), []).append(r["run_name"])
    for (name, lr), runs in by_method.items():
        out.append(f"{name}: {len(runs)} final run(s) at learning rate {lr:g}, no longer selected after its grid grew, "
                   f"are left out of every mean ({', '.join(runs)}).")
    return out



def _data_stall_percent(record: RunRecord) -> float | None:
    """``100 * data_stall_seconds / (train_seconds + data_stall_seconds)`` of a run: the share of its
    steps' span the device sat idle waiting for a batch; None when not recorded."""
    stall, train = record.timing.get("data_stall_seconds"), record.timing.get("train_seconds")
    if stall is None or not train:
        return None
    return 100.0 * stall / (train + stall)


def _loader_workers(record: RunRecord) -> int | None:
    """The training loader's worker processes: ``timing.num_workers``, else (results written before
    oelm recorded it) the run's ``training.num_workers`` when it was a number; None when unknown."""
    if record.timing.get("num_workers") is not None:
        return int(record.timing["num_workers"])
    configured = ((record.raw.get("config") or {}).get("training") or {}).get("num_workers", 0)
    return configured if isinstance(configured, int) and not isinstance(configured, bool) else None


def _finite_or_none(v: Any) -> Any:
    return v if isinstance(v, (int, float)) and math.isfinite(v) else None


def original_layout(comparison: dict[str, Any], method: str = "oelm_freeze") -> dict[str, Any]:
    """The original project's JSON layout: ``{"baseline", <method>, "comparison"}``.

    Per method (means over its sound seeds): ``best_<metric>``, ``final_<metric>``, ``test_<metric>``,
    ``total_time_seconds``, ``avg_step_time_ms`` (mean of the per-run median step times),
    ``trainable_params``, ``total_params``, ``trainable_percent``, ``learning_rate``, ``seeds``.

    ``comparison`` (``method`` against baseline):

    * ``accuracy_gap`` — method − baseline best validation, in metric units (accuracy points, or
      perplexity for language modelling; the key keeps the original name);
    * ``time_analysis.total_gap_seconds`` — method − baseline mean total seconds (negative = faster);
    * ``time_analysis.total_gap_percent`` — that gap in % of baseline's total seconds;
    * ``time_analysis.per_step_gap`` — method − baseline median step time, in ms;
    * ``time_analysis.speedup_ratio`` — baseline total seconds / method total seconds (> 1 = faster).

    Missing methods or values are None.
    """
    metric = comparison.get("metric") or "metric"

    def block(name: str) -> dict[str, Any] | None:
        m = comparison["methods"].get(name)
        if not m:
            return None
        p = m.get("parameters") or {}
        return {
            f"best_{metric}": m["best_validation"]["mean"],
            f"final_{metric}": m["final_validation"]["mean"],
            f"test_{metric}": m["test"]["mean"],
            "total_time_seconds": m["total_seconds"]["mean"],
            "avg_step_time_ms": m["step_ms_median"]["mean"],
            "trainable_params": p.get("trainable"),
            "total_params": p.get("total"),
            "trainable_percent": p.get("trainable_percent"),
            "learning_rate": m.get("learning_rate"),
            "seeds": m["included_seeds"],
        }

    base, other = block("baseline"), block(method)
    comp: dict[str, Any] = {"method": method, "metric": metric, "accuracy_gap": None, "time_analysis": {
        "total_gap_seconds": None, "total_gap_percent": None, "per_step_gap": None, "speedup_ratio": None}}
    if base and other:
        def diff(key):
            a, b = other[key], base[key]
            return None if a is None or b is None else a - b

        bt, mt = base["total_time_seconds"], other["total_time_seconds"]
        comp["accuracy_gap"] = diff(f"best_{metric}")
        comp["time_analysis"] = {
            "total_gap_seconds": diff("total_time_seconds"),
            "total_gap_percent": _pct(mt, bt),
            "per_step_gap": diff("avg_step_time_ms"),
            "speedup_ratio": bt / mt if bt and mt else None,
        }
    return {"baseline": base, method: other, "comparison": comp}
