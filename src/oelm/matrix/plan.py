"""The protocol as a plan: from a config and the results found so far, which runs exist, which
are ready to start now, and the learning-rate selection. Pure functions: no training, no files.

Protocol (one experiment = one task, one model source, several methods, several seeds):

1. **Sweep**: a method with several learning-rate candidates trains each candidate on the sweep
   seeds, validation only. All sweep runs are ready at once.
2. **Selection**: once every sweep run of a method has a result, the candidate with the best mean
   ``best_validation`` over the sweep seeds (failed runs excluded; ties: the first candidate).
   **Growth** (``max_grid_growth`` > 0): while the selected rate is the highest (lowest) of the grid
   tried, the next rate beyond it (x2 / ÷2) joins the grid, its sweep runs train, and the rate is
   selected again, at most ``max_grid_growth`` added rates per method. The grid is a function of
   the config and the sweep results (:func:`select_learning_rates`), so every executor, ``--only``
   and ``--collect`` see the same plan with no state of their own. A method's selection is final
   (and its final runs may start) once it is interior, the cap is reached, or no run finished.
3. **Final**: every seed of the method (its ``seeds``, else the experiment's) at the selected
   rate (a method with one rate: at once), the test split
   evaluated once with the best-on-validation weights. The sweep run at the selected rate is that
   seed's final run: it is *promoted* (test evaluated from its checkpoint), not retrained. Without
   a test split there is nothing to evaluate: no promote task, its record is marked final
   (:func:`marked_final`).

Runs of a stage follow :func:`run_order` (seed 0: A B C, seed 1: C B A, ...), so slow drift of a
shared machine hits every method alike; :func:`ready_runs` lists ready runs in that order.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal

from oelm.config import ExperimentConfig
from oelm.metrics import get_metric
from oelm.records import PlannedRun, RunRecord, final_runs, grid_edge, run_name, sweep_entry

__all__ = ["run_order", "plan_runs", "Selection", "select_learning_rates", "select", "next_rate", "growth_entry", "RunTask", "ready_runs",
           "marked_final", "final_results", "unfinished_final_runs", "why_not_ready"]


def run_order(methods: list, seeds: list[int]) -> list[tuple[Any, int]]:
    """Balanced interleaving: seed 0 runs A B C, seed 1 runs C B A, seed 2 A B C, ...

    ``methods`` may be any labels (method names, or (method, learning rate) pairs in a sweep)."""
    order = []
    for i, seed in enumerate(seeds):
        seq = methods if i % 2 == 0 else list(reversed(methods))
        order.extend((m, seed) for m in seq)
    return order


def plan_runs(config: ExperimentConfig, selected: dict[str, float] | None = None,
              grids: dict[str, list[float]] | None = None) -> list[PlannedRun]:
    """Every run of the matrix in execution order: the sweep stage (methods with several
    learning-rate candidates, on the sweep seeds), then the final stage (every method at its
    selected learning rate, on its seeds (:meth:`~oelm.config.ExperimentConfig.seeds_of`);
    methods not yet selected are left out). Both stages use the balanced order of :func:`run_order`.

    Args:
        selected: method -> its final selected rate (:attr:`Selection.selected`).
        grids: method -> the rates its sweep tries, grown ones included (:attr:`Selection.grids`);
            a method not in it: its configured candidates.
    """
    selected, grids = selected or {}, grids or {}
    swept = {m.name for m in config.methods if len(config.learning_rate_candidates(m)) > 1}
    units = [(m.name, lr) for m in config.methods if m.name in swept
             for lr in grids.get(m.name) or config.learning_rate_candidates(m)]
    plan = [
        PlannedRun(m, lr, seed, "sweep", run_name(m, seed, lr))
        for (m, lr), seed in run_order(units, config.sweep_seed_list())
    ]
    finals = [m.name for m in config.methods if m.name not in swept or m.name in selected]
    seeds = {m.name: config.seeds_of(m) for m in config.methods}
    for m, seed in run_order(finals, config.seeds):
        if seed not in seeds[m]:
            continue
        if m not in swept:
            plan.append(PlannedRun(m, config.learning_rate(_entry(config, m)), seed, "final", run_name(m, seed)))
        else:
            plan.append(PlannedRun(m, selected[m], seed, "final", run_name(m, seed, selected[m])))
    return plan


def select(metric: str | None, by_lr: dict[float, list[float]]) -> float | None:
    """The learning rate with the best mean validation (ties: the first candidate); None when no
    candidate has a value (every run failed)."""
    best_lr, best = None, None
    for lr, values in by_lr.items():
        if not values:
            continue
        mean = statistics.fmean(values)
        if best is None or get_metric(metric).better(mean, best):
            best_lr, best = lr, mean
    return best_lr


@dataclass
class Selection:
    """The state of the learning-rate selection.

    Attributes:
        selected: method -> selected learning rate (swept methods whose selection is final and
            has a finished run).
        complete: swept methods whose selection is final (selected, or every run failed).
        edges: method -> ``"low"`` / ``"high"`` / None (:func:`oelm.records.grid_edge`) of the
            final selection in its grid (grown rates included).
        summary: method -> one entry per sweep run (learning_rate, seed, best_validation,
            selected, status): ``sweep.json``'s ``methods``.
        grids: swept method -> the rates its sweep tries now: the configured candidates, then each
            rate the growth added (every swept method, final or not).
        growth: method -> each automatic growth of its grid so far (:func:`growth_entry`).
    """

    selected: dict[str, float] = field(default_factory=dict)
    complete: set[str] = field(default_factory=set)
    edges: dict[str, str | None] = field(default_factory=dict)
    summary: dict[str, list[dict]] = field(default_factory=dict)
    grids: dict[str, list[float]] = field(default_factory=dict)
    growth: dict[str, list[dict]] = field(default_factory=dict)


def select_learning_rates(config: ExperimentConfig, metric: str, results: dict[str, RunRecord],
                          pending: Iterable[str] = ()) -> Selection:
    """Per swept method whose sweep runs all have a result (and none of them is ``pending``, i.e.
    about to be retried), the candidate with the best mean best-validation over the sweep seeds
    (failed runs excluded), the grid grown first while the choice sits on its edge (module
    docstring, step 2; :func:`_select_method`).

    Args:
        metric: the task's metric name (``accuracy``, ``perplexity``): its direction picks the best.
        results: run name -> record of every run found so far.
        pending: run names that are ready or training now (a failed run being retried).
    """
    pending = set(pending)
    out = Selection()
    for m in config.methods:
        if len(config.learning_rate_candidates(m)) > 1:
            _select_method(config, m, metric, results, pending, out)
    return out


def next_rate(grid: list[float], edge: str) -> float:
    """The rate a grid grows by at ``edge``: twice its highest (``"high"``), half its lowest (``"low"``)."""
    return max(grid) * 2 if edge == "high" else min(grid) / 2


def growth_entry(grid: list[float], edge: str, choice: float, by_lr: dict[float, list[float]], cap: int) -> dict[str, Any]:
    """One automatic growth as ``sweep.json``'s ``grid_growth`` lists it: ``automatic`` (true),
    ``from`` / ``to`` (the sorted grids), ``edge``, ``selected`` (the edge rate that was chosen),
    ``validation`` (per rate of ``from``: the mean best validation over the sweep seeds' finished
    runs, in the metric's unit, and their count ``n``), ``max_grid_growth`` (the cap) and
    ``tested_final_runs`` (always empty: the plan grows a grid only before any final run)."""
    values = [{"learning_rate": lr, "best_validation": statistics.fmean(v) if v else None, "n": len(v)}
              for lr, v in sorted(by_lr.items())]
    return {"automatic": True, "from": sorted(grid), "to": sorted([*grid, next_rate(grid, edge)]), "edge": edge,
            "selected": choice, "validation": values, "max_grid_growth": cap, "tested_final_runs": []}


def _select_method(config: ExperimentConfig, method, metric: str, results: dict[str, RunRecord], pending: set[str],
                   out: Selection) -> None:
    """:func:`select_learning_rates` for one swept method, into ``out``. From the configured grid:
    once each of its sweep runs has a result, select; while the choice is on the grid's edge and
    fewer than ``max_grid_growth`` rates were added, add :func:`next_rate` and go on (the growth is
    replayed from the results on every call). A grid does not begin a new growth once the method has
    a final run (a matrix finished before the cap was raised keeps its selection and its caveat)."""
    grid, seeds, name = config.learning_rate_candidates(method), config.sweep_seed_list(), method.name
    has_final = any(r.method == name and r.is_final for r in results.values())
    growth: list[dict] = []
    while True:
        out.grids[name] = list(grid)
        if growth:
            out.growth[name] = list(growth)
        cells = {(lr, s): results.get(run_name(name, s, lr)) for lr in grid for s in seeds}
        if any(r is None or run_name(name, s, lr) in pending for (lr, s), r in cells.items()):
            return
        by_lr = {lr: [cells[lr, s].best_validation for s in seeds if cells[lr, s].finished] for lr in grid}
        choice = select(metric, by_lr)
        edge = grid_edge(grid, choice)
        if edge is not None and len(growth) < config.max_grid_growth:
            new = next_rate(grid, edge)
            if not has_final or any(run_name(name, s, new) in results for s in seeds):  # a growth begun before stays
                growth.append(growth_entry(grid, edge, choice, by_lr, config.max_grid_growth))
                grid = [*grid, new]
                continue
        out.complete.add(name)
        if choice is not None:
            out.selected[name] = choice
        out.edges[name] = edge
        out.summary[name] = [sweep_entry(lr, s, r, lr == choice) for (lr, s), r in cells.items()]
        return


@dataclass(frozen=True)
class RunTask:
    """One unit of work for an executor: ``run`` and what to do with it.

    ``action`` ``"train"`` trains (or continues) the run, evaluating the test split once at the
    end when ``evaluate_test`` (a final run of a config with a test split); ``"promote"``
    evaluates the test split of the finished sweep run ``run`` names (the selected rate) and
    marks it final.
    """

    run: PlannedRun
    action: Literal["train", "promote"] = "train"
    evaluate_test: bool = False

    @property
    def name(self) -> str:
        return self.run.name

    def to_dict(self) -> dict[str, Any]:
        r = self.run
        return {"name": r.name, "method": r.method, "seed": r.seed, "learning_rate": r.learning_rate,
                "stage": r.stage, "action": self.action, "evaluate_test": self.evaluate_test}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunTask":
        return cls(PlannedRun(d["method"], d["learning_rate"], d["seed"], d["stage"], d["name"]), d["action"],
                   bool(d.get("evaluate_test", d["stage"] == "final")))


def _wants_training(record: RunRecord | None, name: str, retry: set[str]) -> bool:
    """No result yet, or a failed one that is to be retried (``retry``: names of failed runs
    this invocation retries once)."""
    return record is None or (record.failed and name in retry)


def ready_runs(config: ExperimentConfig, metric: str, results: dict[str, RunRecord], *,
               retry: Iterable[str] = (), busy: Iterable[str] = ()) -> tuple[list[RunTask], Selection]:
    """The runs that can start now, in plan order, and the selection they were planned with.

    Args:
        results: run name -> record of every run with a ``result.json``.
        retry: failed runs to train again (``--retry-failed``: each once per invocation; the
            caller removes a name once it is retried).
        busy: runs training now (left out; a method's final runs wait for its busy sweep runs).
    """
    retry, busy = set(retry), set(busy)
    tested = config.task.test_split is not None
    retried = {n for n in retry if n in results and results[n].failed}  # their results do not count yet
    selection = select_learning_rates(config, metric, results, pending=retried | busy)
    plan = plan_runs(config, selection.selected, selection.grids)
    ready = [RunTask(r) for r in plan
             if r.stage == "sweep" and r.name not in busy and _wants_training(results.get(r.name), r.name, retry)]
    for run in plan:
        if run.stage != "final" or run.name in busy:
            continue
        record = results.get(run.name)
        swept = len(config.learning_rate_candidates(_entry(config, run.method))) > 1 and run.seed in config.sweep_seed_list()
        if not swept:
            if _wants_training(record, run.name, retry):
                ready.append(RunTask(run, evaluate_test=tested))
        elif tested and record is not None and record.finished and not record.is_final:
            ready.append(RunTask(run, "promote", evaluate_test=True))
        # a swept seed's run that failed at the selected rate is that seed's (failed) final run;
        # without a test split a finished one is marked final where it lies (marked_final)
    return ready, selection


def marked_final(config: ExperimentConfig, selection: Selection, results: dict[str, RunRecord]) -> list[PlannedRun]:
    """Without a test split: the finished sweep runs at a method's selected rate that are not yet
    marked final. Each is its seed's final run as it is (nothing to evaluate); the caller marks its
    record (``stage: final``, ``selected``), no task is planned for it. Empty with a test split
    (those are :func:`ready_runs`' ``promote`` tasks)."""
    if config.task.test_split is not None:
        return []
    found = []
    for run in plan_runs(config, selection.selected, selection.grids):
        record = results.get(run.name)
        if run.stage == "final" and record is not None and record.stage == "sweep" and record.finished:
            found.append(run)
    return found


def _entry(config: ExperimentConfig, method: str):
    return next(m for m in config.methods if m.name == method)


def final_results(config: ExperimentConfig, selection: Selection, results: dict[str, RunRecord]) -> dict[str, list[RunRecord]]:
    """Per method (config order), the records of its final runs that exist, over its seeds
    (:meth:`~oelm.config.ExperimentConfig.seeds_of`): :func:`oelm.records.final_runs` (the
    report's selector too) at the selection made. A sweep run not yet promoted is not a final result.

    Raises:
        OELMError: two final runs of one method and seed (a copied run folder)."""
    found = final_runs(results, selection.selected, methods=[m.name for m in config.methods], seeds=config.seeds)
    return {m: [r for r in runs if r.seed in config.seeds_of(m)] for m, runs in found.items()}


def unfinished_final_runs(config: ExperimentConfig, selection: Selection, results: dict[str, RunRecord]) -> list[str]:
    """Final runs (or methods still sweeping, as ``<method> (sweep)``) without a final result."""
    missing = [f"{m.name} (sweep)" for m in config.methods
               if len(config.learning_rate_candidates(m)) > 1 and m.name not in selection.complete]
    for run in plan_runs(config, selection.selected, selection.grids):
        record = results.get(run.name)
        if run.stage == "final" and not (record is not None and (record.is_final or record.failed)):
            missing.append(run.name)
    return missing


def why_not_ready(config: ExperimentConfig, metric: str, results: dict[str, RunRecord], name: str) -> str:
    """One line saying why run ``name`` is not in :func:`ready_runs` (for ``oelm run --only``)."""
    record = results.get(name)
    if record is not None and record.failed:
        return f"run {name} failed earlier ({record.failure_kind}); pass --retry-failed to train it again"
    if record is not None:
        return f"run {name} is done ({record.stage} run, {record.status}; runs/{name}/result.json exists)"
    selection = select_learning_rates(config, metric, results)
    plan = plan_runs(config, selection.selected, selection.grids)
    for m in config.methods:
        grid = selection.grids.get(m.name, [])
        if m.name in selection.grids and m.name not in selection.complete and any(
                name == run_name(m.name, s, lr) for s in config.seeds_of(m) for lr in grid):
            left = [r.name for r in plan if r.stage == "sweep" and r.method == m.name and r.name not in results]
            return (f"run {name} is not ready: it is a final run of {m.name}, whose learning-rate sweep is not finished "
                    f"(runs left: {', '.join(left)}); train those first (see `oelm plan`)")
    known = sorted({r.name for r in plan})
    return f"run {name} is not a run of this matrix now; its runs: {', '.join(known)}"
