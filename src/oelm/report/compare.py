"""Aggregate an experiment's runs into ``comparison.json`` and the original project's layout.

Inputs are what ``oelm run`` writes: per run ``runs/<name>/result.json`` (the
:class:`~oelm.records.RunRecord` objects passed in) and ``metrics.jsonl`` (read from the output
directory when it is given). Fields added by later versions of the runner are used when present
and never required: ``RunRecord.step_ms`` (every measured step), ``status`` / ``failure_kind``,
``learning_rate``, ``num_labels`` and ``sweep.json`` (whose
``selected_at_grid_edge`` is not read: the report recomputes it from the sweep's entries, so
outputs written before that key existed get it too).
"""

from __future__ import annotations

import math
import platform
from pathlib import Path
from typing import Any

from oelm.io import read_jsonl
from oelm.metrics import METRICS, get_metric
from oelm.records import MatrixFolder, RunRecord, grid_edge, read_sweep, superseded_final_runs
from oelm.report.budgets import budgets_comparison
from oelm.report.caveats import warnings_of
from oelm.report.compute import matrix_compute
from oelm.report.convergence import time_to_quality_comparison
from oelm.report.diagnostics_summary import diagnostics_comparison
from oelm.report.stats import (
    CHANCE_MARGIN_POINTS,
    best_at_last_evaluation,
    collapse_reasons,
    paired_difference,
    percent_change,
    step_time_stats,
    summarize,
    time_to_target,
)
from oelm.report.target_verdicts import targets_comparison
from oelm.report.uncertainty import uncertainty_comparison

__all__ = ["compare_results", "read_metrics", "run_records", "metrics_records", "num_labels_of",
           "majority_percent_of", "device_label", "learning_rate_of", "step_times_of", "mfu_reference"]

_NUMBER_FIELDS = ("loss", "accuracy", "perplexity", "elapsed_seconds", "step_ms", "tokens_per_second", "token_accuracy")
#: The finite values each number field can take by its meaning: a metric's range (oelm.metrics), a
#: token accuracy in %, losses, times and speeds >= 0. (NaN / inf stay: a diverged run logs them.)
_RANGES = {**{m.name: (m.lowest, m.highest) for m in METRICS.values()}, "token_accuracy": (0.0, 100.0),
           **dict.fromkeys(("loss", "elapsed_seconds", "step_ms", "tokens_per_second"), (0.0, math.inf))}


def _sound_record(r: dict[str, Any]) -> bool:
    """A record whose ``step`` is a whole number >= 0 and whose numbers (or nulls) fit their meaning (:data:`_RANGES`)."""
    def sound(key):
        v = r.get(key)
        if v is None:
            return True
        lowest, highest = _RANGES[key]
        return isinstance(v, (int, float)) and not isinstance(v, bool) and (not math.isfinite(v) or lowest <= v <= highest)

    step = r.get("step")
    return isinstance(step, int) and not isinstance(step, bool) and step >= 0 and all(sound(k) for k in _NUMBER_FIELDS)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Records of one ``metrics.jsonl`` (a missing file gives []; a torn last line, a line that is
    not an object, and a hand-edited record whose step or numbers are not numbers, or not sound: :func:`_sound_record`)."""
    return [r for r in read_jsonl(path) if _sound_record(r)]


def run_records(out: str | Path | None, record: RunRecord) -> list[dict[str, Any]]:
    """The ``metrics.jsonl`` records of ``record``'s run under ``out`` ([] when ``out`` is None,
    or the run has none): :meth:`oelm.records.MatrixFolder.metrics_of`."""
    return metrics_records(out, record.name, record.method, record.seed, record.learning_rate)


def metrics_records(out: str | Path | None, name: str | None, method: str, seed: int,
                    learning_rate: float | None = None) -> list[dict[str, Any]]:
    """The ``metrics.jsonl`` records of the run ``name`` (``method``, ``seed``, ``learning_rate``:
    how older outputs named its folder) under ``out``; [] when ``out`` is None or it has none."""
    path = None if out is None else MatrixFolder(out).metrics_of(name, method, seed, learning_rate)
    return [] if path is None else read_metrics(path)


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


def _at_chance(per_run: list[dict[str, Any]]) -> dict[str, Any]:
    """``at_chance_seeds`` (finished runs excluded only because they ended at chance: a result, not
    a failure) and ``at_chance_best_validation`` (their best validation summarized: what the report
    shows, marked, for a method with no sound run, instead of a blank; in no mean or gap). Absent
    when no run is at chance (comparisons written before stay as they were)."""
    runs = [r for r in per_run if r["collapse"] and all(x.startswith("at chance") for x in r["collapse"])]
    if not runs:
        return {}
    return {"at_chance_seeds": [r["seed"] for r in runs],
            "at_chance_best_validation": summarize([r["best_validation"] for r in runs])}


def _mfu(record: RunRecord) -> dict[str, Any]:
    """``timing.mfu`` of a run ({} when absent: older results, or FLOPs not derivable)."""
    return record.mfu


def _telemetry(record: RunRecord, key: str, stat: str = "median") -> float | None:
    """One statistic of ``timing.gpu_telemetry`` (None on CPU, or when NVML was not available)."""
    tel = record.gpu_telemetry
    return (tel.get(key) or {}).get(stat) if tel.get("available") else None


def num_labels_of(record: RunRecord) -> int | None:
    """Classes of a classification run: ``data.num_labels``, else the dataset registry's label names."""
    n = record.num_labels
    if isinstance(n, int) and n > 0:
        return n
    task = record.dataset
    if not task:
        return None
    try:
        from oelm.data import get_dataset_spec  # oelm.data loads torch: only for results without num_labels

        spec = get_dataset_spec(task)
    except Exception:  # an unregistered task in an old output: the chance rule is skipped
        return None
    return len(spec.label_names) if spec.label_names else None


def majority_percent_of(record: RunRecord) -> float | None:
    """The validation split's most frequent label in % of its examples (``None`` in outputs
    written before oelm recorded label counts, or for language modelling)."""
    value = record.validation_majority_percent
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def learning_rate_of(record: RunRecord) -> float | None:
    """``record.learning_rate``, else the method config's (older results)."""
    return record.method_learning_rate


def device_label(record: RunRecord) -> str:
    """Which machine and device a run used: ``host / device (GPU name or CPU model)``."""
    device = record.device or "?"
    name = (record.cuda or {}).get("name") or record.cpu_model or ""
    host = record.hostname or "?"
    return f"{host} / {device}" + (f" ({name})" if name else "")


def step_times_of(record: RunRecord, records: list[dict[str, Any]]) -> tuple[list[float], str]:
    """Every measured step time (``timing.step_ms``), else the step times logged at log steps."""
    if record.step_ms:
        return [float(x) for x in record.step_ms if x is not None], "every step"
    warm = record.timing_warmup_steps_excluded or 0
    logged = [r["step_ms"] for r in records if r.get("type") == "train" and r.get("step_ms") is not None and r.get("step", 0) > warm]
    return [float(x) for x in logged], "sampled at log steps"


def compare_results(config, results: dict[str, list[RunRecord]], out: str | Path | None = None) -> dict[str, Any]:
    """Aggregate each method over seeds, compare with ``baseline``, flag collapsed runs.

    Args:
        config: the :class:`~oelm.config.ExperimentConfig`.
        results: method -> its runs' records (:class:`~oelm.records.RunRecord`), any status.
        out: the output directory, to read each run's ``metrics.jsonl`` (time-to-target, the
            perplexity collapse rule, logged step times) and an optional ``sweep.json``.

    Per method (sound runs only; collapsed runs listed under ``excluded``): ``summarize`` (mean,
    std, n, 95% t interval) of best/final validation, test, total and train seconds, median step
    ms and tokens/s; ``step_times`` (:func:`~oelm.report.stats.step_time_stats` of all sound runs'
    steps pooled); parameters, learning rate, devices, speed-probe drift per seed;
    ``learning_rate_grid`` (the sorted rates of its learning-rate sweep, None when it was not
    swept) and ``selected_at_grid_edge`` (``"low"`` / ``"high"`` when the selected rate is the
    grid's smallest / largest, else None: see :func:`oelm.records.grid_edge`), computed from
    ``sweep.json``'s entries; an edge is also a warning (a wider grid could change the result).

    Against baseline, over the seeds both have a sound run of (``method_seeds``: the config's
    per-method seeds, when any): ``metric_gap`` (method − baseline means over them, in metric
    units: accuracy points or perplexity), ``metric_gap_relative_percent``,
    ``total_time_gap_percent`` and ``per_step_gap_percent`` ((method − baseline) / baseline in %;
    negative = faster), ``speedup`` (baseline mean total seconds / method's),
    ``parameters_saved_percent`` (trainable parameters fewer than baseline's, in % of baseline's),
    and paired by seed (:func:`~oelm.report.stats.paired_difference`, ``n`` pairs): ``paired_metric``
    (best validation), ``paired_test`` (test split, once per final run; n = 0 without one) and
    ``paired_seconds``. ``budgets``: converged or hit the cap, per final run (:mod:`oelm.report.budgets`).

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
    sweep_file = None if out is None else MatrixFolder(out).sweep
    sweep = read_sweep(sweep_file) if sweep_file is not None and sweep_file.is_file() else None
    methods, collapsed, records_of, still_improving = _methods(results, out, _sweep_grids(sweep))
    sound = {n: {r.seed: r for r in runs if r.seed in methods[n]["included_seeds"]} for n, runs in results.items() if n in methods}
    metric = next((r.metric for runs in results.values() for r in sorted(runs, key=lambda r: r.seed) if r.metric), None)
    higher = get_metric(metric).higher_is_better if metric else False
    all_results = [r for runs in results.values() for r in runs]
    comparison = {
        "name": config.name,
        "task": config.task.dataset,
        "model": config.model.display_name,
        "metric": metric,
        "higher_is_better": higher,
        "seeds": config.seeds,
        **_method_seeds(config),
        "methods": methods,
        "vs_baseline": _gaps_to_baseline(methods, sound),
        "time_to_target": _time_to_target(methods, records_of, metric, higher) if out is not None else None,
        "collapsed": collapsed,
        "collapse_rule": _collapse_rule(all_results),
        "sweep": sweep,
        "superseded": superseded_final_runs(out) if out is not None else [],
        "best_at_last_step": still_improving,
        "reference": dict(config.reference),
        "reference_source": config.reference_source,
        "environment": _environment(all_results),
        "execution": _execution(all_results),
        "host": platform.node(),
        "compute": matrix_compute(MatrixFolder(out).results().values()) if out is not None else None,  # sweep too
    }
    # sections only where the runs recorded what they need (saved predictions; training seconds per
    # validation): {} for results of older oelm versions, whose comparison stays as it was
    comparison.update(uncertainty_comparison(comparison, results, out))
    comparison.update(time_to_quality_comparison(comparison, results, records_of))
    comparison.update(targets_comparison(getattr(config, "targets", None), comparison))  # the config's targets: block
    comparison.update(diagnostics_comparison(comparison, results, out))  # runs with attention diagnostics
    comparison.update(budgets_comparison(results, records_of))  # per final run: converged, or hit its budget's cap
    comparison["warnings"] = warnings_of(comparison)
    return comparison


def _methods(results: dict[str, list[RunRecord]], out: str | Path | None, grids: dict[str, dict[str, Any]]):
    """Per method with runs: its summary (:func:`_method_summary`); the collapsed runs (method,
    seed, reasons); each run's ``metrics.jsonl`` records by (method, seed); and per method the
    seeds whose best validation is at their last scheduled evaluation (still improving)."""
    methods: dict[str, Any] = {}
    collapsed: list[dict[str, Any]] = []
    records_of: dict[tuple[str, int], list[dict]] = {}
    still_improving: dict[str, list[int]] = {}
    for name, runs in results.items():
        if not runs:
            continue
        runs = sorted(runs, key=lambda r: r.seed)
        records = {r.seed: run_records(out, r) for r in runs}
        records_of.update({(name, seed): recs for seed, recs in records.items()})
        methods[name] = _method_summary(runs, records, grids.get(name))
        collapsed += [{"method": name, **x} for x in methods[name]["excluded"]]
        last = [r.seed for r in runs if best_at_last_evaluation(r, records[r.seed])]
        if last:
            still_improving[name] = last
    return methods, collapsed, records_of, still_improving


def _run_row(r: RunRecord, reasons: list[str]) -> dict[str, Any]:
    """One run of a method in ``comparison.json``: identity, status, its numbers, where it ran and
    why it is excluded (``collapse``: empty when sound); ``stopped_early_at`` only when it did."""
    row = {
        "seed": r.seed,
        "run_name": r.name,
        "status": r.status,
        "best_validation": r.best_validation,
        "final_validation": r.final_validation,
        "test": r.test,
        "total_seconds": r.total_seconds,
        "learning_rate": learning_rate_of(r),
        "device": device_label(r),
        "collapse": reasons,
    }
    if r.early_stopped:  # only then: comparisons of runs without early stopping stay as they were
        row["stopped_early_at"] = r.steps
    if r.time_split is not None:  # where its wall time went (absent in results written before oelm recorded it)
        row["wall_seconds"], row["time_split"] = r.wall_seconds, r.time_split
    return row


def _method_summary(runs: list[RunRecord], records: dict[int, list[dict]], grid: dict[str, Any] | None) -> dict[str, Any]:
    """One method of ``comparison.json``: its runs (sorted by seed) with ``records`` (seed ->
    ``metrics.jsonl`` records), collapsed ones excluded from every summary (:func:`summarize`:
    mean, std, n, 95% t interval), step times pooled over the sound runs, and its sweep's ``grid``."""
    sound, excluded, per_run, steps_all, step_source = [], [], [], [], None
    for r in runs:
        recs = records[r.seed]
        reasons = collapse_reasons(r, recs, num_labels=num_labels_of(r), majority_percent=majority_percent_of(r))
        per_run.append(_run_row(r, reasons))
        if reasons:
            excluded.append({"seed": r.seed, "reasons": reasons})
            continue
        sound.append(r)
        times, step_source = step_times_of(r, recs)
        steps_all.extend(times)

    def col(get):
        return summarize([get(r) for r in sound])

    mfu_runs = [r for r in sound if _mfu(r).get("mfu") is not None]
    return {
        "seeds": [r.seed for r in runs],
        "included_seeds": [r.seed for r in sound],
        "excluded": excluded,
        **_at_chance(per_run),
        "best_validation": col(lambda r: r.best_validation),
        "final_validation": col(lambda r: r.final_validation),
        "test": col(lambda r: r.test),
        "total_seconds": col(lambda r: r.total_seconds),
        "train_seconds": col(lambda r: r.train_seconds),
        "steps": col(lambda r: r.steps),
        "step_ms_median": col(lambda r: r.median_step_ms),
        "tokens_per_second": col(lambda r: r.tokens_per_second),
        # % of step + data-stall time the device sat idle waiting for a batch, and the loader workers
        "data_stall_percent": col(_data_stall_percent),
        "num_workers": sorted({w for w in map(_loader_workers, sound) if w is not None}),
        # model FLOPs utilization in % (timing.mfu.mfu is a fraction) and the peak it was taken against
        "mfu_percent": col(lambda r: None if _mfu(r).get("mfu") is None else 100.0 * _mfu(r)["mfu"]),
        "mfu_peak_source": sorted({str(_mfu(r).get("peak_source")) for r in mfu_runs}),
        # what the MFU is a fraction of, in words (the measured probe on CPU, not the hardware peak)
        "mfu_reference": sorted({mfu_reference(_mfu(r).get("peak_source"), _mfu(r).get("peak_precision")) for r in mfu_runs}),
        "compile_seconds": col(lambda r: r.compile_seconds),
        "gpu_utilization_percent_median": col(lambda r: _telemetry(r, "gpu_utilization_percent")),
        "gpu_temperature_c_max": col(lambda r: _telemetry(r, "temperature_c", "max")),
        "step_times": step_time_stats(steps_all) | {"source": step_source},
        "parameters": runs[0].parameters,
        "learning_rate": learning_rate_of(runs[0]),
        **(grid or {"learning_rate_grid": None, "selected_at_grid_edge": None}),
        "devices": sorted({device_label(r) for r in runs}),
        "probe_drift_percent": {r.seed: r.drift_percent for r in runs},
        "runs": per_run,
    }


def _method_seeds(config) -> dict[str, Any]:
    """``method_seeds`` (method -> its seeds) for the methods whose config entry names its own
    ``seeds``; {} when none does (comparisons of such configs stay as they were)."""
    own = {m.name: config.seeds_of(m) for m in config.methods if getattr(m, "seeds", None) is not None}
    return {"method_seeds": own} if own else {}


def _gaps_to_baseline(methods: dict[str, Any], sound: dict[str, dict[int, RunRecord]]) -> dict[str, Any]:
    """Per method but ``baseline``: its gaps to baseline (see :func:`compare_results`); {} without
    a baseline. Every gap is over the seeds both have a sound run of (``sound``: method -> seed ->
    record): the means of each over those seeds (with equal seeds: the methods' own means), and the
    paired statistics pair those runs by seed."""
    base = methods.get("baseline")
    if not base:
        return {}
    base_runs = {r["seed"]: r for r in base["runs"] if not r["collapse"]}

    def paired(mine: dict[int, dict], key: str) -> dict[str, Any]:
        return paired_difference({s: r[key] for s, r in base_runs.items()}, {s: r[key] for s, r in mine.items()})

    gaps: dict[str, Any] = {}
    for name, m in methods.items():
        if name == "baseline":
            continue
        common = sorted(set(sound["baseline"]) & set(sound.get(name, {})))

        def means(get) -> tuple[float | None, float | None]:
            return tuple(summarize([get(sound[who][s]) for s in common])["mean"] for who in ("baseline", name))

        bv, mv = means(lambda r: r.best_validation)
        bt, mt = means(lambda r: r.total_seconds)
        bs, ms = means(lambda r: r.median_step_ms)
        btr = (base["parameters"] or {}).get("trainable")
        mtr = (m["parameters"] or {}).get("trainable")
        mine = {r["seed"]: r for r in m["runs"] if not r["collapse"]}
        gaps[name] = {
            "metric_gap": None if bv is None or mv is None else mv - bv,
            "metric_gap_relative_percent": percent_change(mv, bv),
            "total_time_gap_percent": percent_change(mt, bt),
            "per_step_gap_percent": percent_change(ms, bs),
            "speedup": (bt / mt) if bt and mt else None,
            "parameters_saved_percent": 100.0 * (btr - mtr) / btr if btr and mtr is not None else None,
            "paired_metric": paired(mine, "best_validation"),
            "paired_seconds": paired(mine, "total_seconds"),
            # the held-out number a claim is judged on: each final run's test split, evaluated once
            "paired_test": paired(mine, "test"),
        }
    return gaps


def _time_to_target(methods: dict[str, Any], records_of: dict[tuple[str, int], list[dict]], metric: str | None,
                    higher: bool) -> dict[str, Any] | None:
    """Time to target (MLPerf "time to quality"): the target is baseline's mean final validation
    over its sound seeds; per method and sound seed the first evaluation reaching it
    (:func:`~oelm.report.stats.time_to_target`), and how many reached it in how many steps and
    seconds. None without a baseline value."""
    base = methods.get("baseline")
    if not base or base["final_validation"]["mean"] is None:
        return None
    target = base["final_validation"]["mean"]
    ttt: dict[str, Any] = {"metric": metric, "target": target, "higher_is_better": higher, "methods": {}}
    for name, m in methods.items():
        per_seed = {r["seed"]: time_to_target(records_of[(name, r["seed"])], metric, target, higher)
                    for r in m["runs"] if not r["collapse"]}
        hit = [v for v in per_seed.values() if v is not None]
        ttt["methods"][name] = {
            "runs": per_seed,
            "reached": len(hit),
            "n": len(per_seed),
            "steps": summarize([v["step"] for v in hit]),
            "seconds": summarize([v["seconds"] for v in hit]),
        }
    return ttt


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
    shared = sorted(r.name or f"{r.method}-seed{r.seed}" for r in results if r.shared_node)
    most = max((sum(o.get("node") == r.node for o in r.overlapped) for r in results), default=1)
    return {
        "executors": sorted({r.executor_name for r in results}),
        "nodes": sorted({n for r in results if (n := r.node)}),
        "shared_node_runs": shared,
        "most_overlapped_runs": most,  # the most other runs one final run overlapped on its node
        "timing_grade": not shared,
    }


def _collapse_rule(results: list[RunRecord]) -> dict[str, Any]:
    """The chance line the collapse rule used: its margin (points), the labels, the validation majority class (%)."""
    return {
        "chance_margin_points": CHANCE_MARGIN_POINTS,
        "num_labels": next((n for n in (num_labels_of(r) for r in results) if n), None),
        "validation_majority_class_percent": max(
            (p for p in (majority_percent_of(r) for r in results) if p is not None), default=None),
    }


def _environment(results: list[RunRecord]) -> dict[str, Any]:
    """What the runs ran on: devices, versions and the speed probe per run."""
    first = results[0] if results else RunRecord({})
    return {
        "devices": sorted({device_label(r) for r in results}),
        "python": first.python_version,
        "platform": first.platform,
        "packages": first.packages or {},
        "cpu_model": first.cpu_model,
        "torch_num_threads": first.torch_num_threads,
        "cuda": {k: first.cuda.get(k) for k in ("name", "torch_cuda", "cudnn", "driver_version")} if first.cuda else None,
        "mixed_precision": sorted({str(r.mixed_precision) for r in results}),
        "probe": [
            {
                "run": f"{r.method}-seed{r.seed}",
                "method": r.method,
                "gflops_before": r.probe_gflops,
                "gflops_after": r.probe_gflops_after,
                "drift_percent": r.drift_percent,
            }
            for r in results
        ],
    }


def _data_stall_percent(record: RunRecord) -> float | None:
    """``100 * data_stall_seconds / (train_seconds + data_stall_seconds)`` of a run: the share of its
    steps' span the device sat idle waiting for a batch; None when not recorded."""
    stall, train = record.data_stall_seconds, record.train_seconds
    if stall is None or not train:
        return None
    return 100.0 * stall / (train + stall)


def _loader_workers(record: RunRecord) -> int | None:
    """The training loader's worker processes: ``timing.num_workers``, else (results written before
    oelm recorded it) the run's ``training.num_workers`` when it was a number; None when unknown."""
    if record.loader_workers is not None:
        return int(record.loader_workers)
    configured = record.configured_num_workers
    return configured if isinstance(configured, int) and not isinstance(configured, bool) else None
