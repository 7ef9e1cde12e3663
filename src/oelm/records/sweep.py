"""``sweep.json`` (the learning-rate selection on validation), the grid and its growth, and which
runs are the final ones: :func:`final_runs`, the one selector that the plan
(:func:`oelm.matrix.plan.final_results`) and the report (:func:`oelm.report.load_results`) use."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Mapping

from typing_extensions import TypedDict  # pydantic validates it (typing.TypedDict only from Python 3.12)

from oelm.errors import DamagedFileError, OELMError
from oelm.io import check_format, read_json_object

from oelm.records.folder import MatrixFolder, run_name
from oelm.records.result import RunRecord

__all__ = ["SWEEP_FIX", "SWEEP_FORMAT", "read_sweep", "sweep_entry", "sweep_file", "selected_rates", "grid_edge", "grid_edge_note", "format_rates", "is_superseded",
           "superseded_final_runs", "final_runs", "is_automatic"]

#: What to do about a damaged ``sweep.json`` (derived from the runs' results, so it can be rewritten).
SWEEP_FIX = "delete it: `oelm run --collect` (or `oelm run`) with the same --output-dir writes it again from the runs"
#: Version of sweep.json's layout (its ``format``; files written before it have none and are read as 1).
SWEEP_FORMAT = 1


def grid_edge(learning_rates: Iterable[float], selected: float | None) -> str | None:
    """Where ``selected`` sits in the learning-rate grid it was chosen from: ``"low"`` (the
    smallest candidate), ``"high"`` (the largest) or None (an interior candidate, no selection,
    or a grid of fewer than 2 distinct rates, i.e. no sweep). A selection on an edge means the
    best rate may lie outside the grid, so a wider grid could change the result.

    ``learning_rates`` is every candidate tried, whatever its runs' status (the writer passes
    the configured grid; the report the rates of ``sweep.json``'s entries)."""
    grid = sorted({float(lr) for lr in learning_rates if lr is not None})
    if selected is None or len(grid) < 2:
        return None
    if math.isclose(selected, grid[0], rel_tol=1e-9):
        return "low"
    if math.isclose(selected, grid[-1], rel_tol=1e-9):
        return "high"
    return None


def format_rates(learning_rates: Iterable[float]) -> str:
    """A learning-rate grid as the reader sees it: sorted, distinct, ``[0.0005, 0.001, 0.002]``."""
    return "[" + ", ".join(f"{x:g}" for x in sorted({float(lr) for lr in learning_rates if lr is not None})) + "]"


def grid_edge_note(learning_rates: Iterable[float], edge: str) -> str:
    """The reader's note for a selection on ``edge`` (``"low"`` / ``"high"``, from :func:`grid_edge`)
    of ``learning_rates``: "selected learning rate 0.0001 is the lowest of its grid [0.0001, 0.0002];
    a wider grid could change the result" (no trailing period; the run log and the report's
    warnings prefix the method)."""
    grid = sorted({float(lr) for lr in learning_rates if lr is not None})
    lr, word = (grid[0], "lowest") if edge == "low" else (grid[-1], "highest")
    return (f"selected learning rate {lr:g} is the {word} of its grid {format_rates(grid)}; "
            "a wider grid could change the result")


class SweepEntry(TypedDict, total=False):
    """One sweep run in ``sweep.json``'s ``methods``: its rate, seed, best validation and status."""

    learning_rate: float | None
    seed: int | None
    best_validation: float | None
    selected: bool
    status: str | None


class GrowthValidation(TypedDict, total=False):
    """One rate of an automatic growth's ``validation``: its mean best validation over the sweep
    seeds' finished runs (the metric's unit; None when every run failed) and how many (``n``)."""

    learning_rate: float
    best_validation: float | None
    n: int


#: One growth of a method's learning-rate grid (``grid_growth`` in experiment.json / sweep.json):
#: ``from`` / ``to`` (the grids). A growth of the config's grid (a user added rates: experiment.json's
#: record) has ``at`` (UTC) and ``tested_final_runs`` (its final runs that had evaluated the test
#: split then). An automatic growth (``max_grid_growth``; sweep.json only) has ``automatic`` (true),
#: ``edge``, ``selected`` (the edge rate chosen), ``validation`` (per rate of ``from``), the cap
#: ``max_grid_growth``, and ``tested_final_runs`` always empty (it happens before any final run).
GridGrowth = TypedDict("GridGrowth", {  # functional form: "from" is a keyword
    "from": list[float], "to": list[float], "at": str | None, "tested_final_runs": list[str], "automatic": bool,
    "edge": str, "selected": float, "validation": list[GrowthValidation], "max_grid_growth": int}, total=False)


def is_automatic(growth: Mapping[str, Any]) -> bool:
    """Whether a ``grid_growth`` entry is an automatic growth (on validation, before any final run)."""
    return bool(growth.get("automatic"))


class SweepFile(TypedDict, total=False):
    """The parts of ``sweep.json`` that readers use (written by the matrix driver)."""

    format: int
    selected_learning_rates: dict[str, float]
    selected_at_grid_edge: dict[str, str | None]
    sweep_seeds: list[int]
    methods: dict[str, list[SweepEntry]]
    grid_growth: dict[str, list[GridGrowth]]


def sweep_entry(learning_rate: float, seed: int, record: RunRecord, selected: bool) -> dict[str, Any]:
    """One sweep run as ``sweep.json``'s ``methods`` lists it (:class:`SweepEntry`)."""
    return {"learning_rate": learning_rate, "seed": seed, "best_validation": record.best_validation,
            "selected": selected, "status": record.status}


def sweep_file(sweep_seeds: list[int], selected: dict[str, float], edges: dict[str, str | None],
               methods: dict[str, list[dict[str, Any]]], grid_growth: dict[str, Any] | None = None) -> dict[str, Any]:
    """``sweep.json``: the selection rule, the sweep seeds, per swept method the selected rate,
    whether it sits on the grid's edge (:func:`grid_edge`) and every sweep run (:func:`sweep_entry`),
    and ``grid_growth`` (only when a grid grew: per method experiment.json's record of the config's
    growth, then the automatic ones; :data:`GridGrowth`)."""
    return {
        "format": SWEEP_FORMAT,
        "selection_metric": "best_validation",
        "selection_rule": "mean over sweep seeds; highest accuracy / lowest perplexity; ties: first candidate",
        "sweep_seeds": sweep_seeds,
        "selected_learning_rates": selected,
        "selected_at_grid_edge": edges,
        "methods": methods,
    } | ({"grid_growth": grid_growth} if grid_growth else {})


def read_sweep(path: str | Path) -> dict[str, Any]:
    """``sweep.json`` at ``path``, its fields checked (:class:`SweepFile`, strict types).

    Raises:
        DamagedFileError: the file does not parse or a field has the wrong type; names the file,
            the field and the fix (:data:`SWEEP_FIX`: it is derived from the runs, so it can be rewritten).
        FileFormatError: its ``format`` is not :data:`SWEEP_FORMAT` (a newer oelm wrote it; none: 1).
    """
    from pydantic import TypeAdapter, ValidationError  # pydantic costs ~0.3 s: only when a sweep is read

    sweep = read_json_object(path, SWEEP_FIX)
    try:
        TypeAdapter(SweepFile).validate_python(sweep, strict=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise DamagedFileError(f"{path} is damaged: field {where} = {err.get('input')!r:.60} ({err['msg'].lower()}); "
                               f"{SWEEP_FIX}") from None
    check_format(path, sweep.get("format"), SWEEP_FORMAT, older=SWEEP_FIX, absent_is=1)
    return sweep


def selected_rates(folder: MatrixFolder) -> dict[str, float]:
    """``sweep.json``'s ``selected_learning_rates`` in ``folder`` ({} without a ``sweep.json``).

    Raises:
        DamagedFileError: ``sweep.json`` is damaged (:func:`read_sweep`)."""
    return (read_sweep(folder.sweep).get("selected_learning_rates") or {}) if folder.sweep.exists() else {}


def is_superseded(record: RunRecord, selected: Mapping[str, float]) -> bool:
    """Whether ``record`` is a final run of a swept method at a learning rate other than the one
    ``selected`` (``sweep.json``'s ``selected_learning_rates``) names now, in a run folder named
    for its rate (:func:`~oelm.records.folder.run_name` with a learning rate). That happens only when
    the method's learning-rate grid grew after its final runs had started and the new sweep moved
    the selection (``grid_growth`` in ``experiment.json``): such runs are kept on disk and left
    out of every comparison."""
    chosen = selected.get(record.method)
    lr = record.learning_rate
    if chosen is None or lr is None or not record.is_final:
        return False
    swept_run = record.name == run_name(record.method, record.seed, lr)  # named for its rate
    return swept_run and not math.isclose(float(lr), float(chosen), rel_tol=1e-9)


def superseded_final_runs(out: str | Path) -> list[dict[str, Any]]:
    """The superseded final runs under ``out`` (:func:`is_superseded` against ``out/sweep.json``),
    sorted by run name: ``method``, ``seed``, ``run_name``, ``learning_rate`` and ``test`` (its
    test value if it evaluated the test split, else None). Empty without a ``sweep.json``."""
    folder = MatrixFolder(out)
    if not folder.sweep.exists():
        return []
    selected = selected_rates(folder)
    return [{"method": r.method, "seed": r.seed, "run_name": r.name or run.name, "learning_rate": r.learning_rate,
             "test": r.test}
            for run, r in folder.iter_results() if is_superseded(r, selected)]


def final_runs(results: Mapping[str, RunRecord], selected: Mapping[str, float], *,
               methods: Iterable[str] | None = None, seeds: Iterable[int] | None = None,
               under: str | Path = "runs/") -> dict[str, list[RunRecord]]:
    """Per method, its final runs among ``results`` (run folder name -> record), sorted by seed.

    A final run is one of the selected configuration: ``stage == "final"`` (results written before
    the learning-rate sweep existed have no stage and count as final), or a sweep run that failed at
    the learning rate ``selected`` for its method (``sweep.json``'s ``selected_learning_rates``) —
    kept so the report lists the failure instead of silently dropping it. Sweep runs at other rates,
    and sweep runs not yet promoted, are not final. Final runs at a rate that is no longer selected
    (the method's grid grew and the selection moved: :func:`is_superseded`) are left out.

    Args:
        methods: the methods to keep, in this order, each present (empty when it has no final
            run); None: every method found, in the order of ``results``.
        seeds: the seeds to keep (the config's); None: every seed.
        under: the runs folder, for the error message.

    Raises:
        OELMError: two final runs of one method and seed (a copied run folder), naming both folders.
    """
    wanted = None if seeds is None else set(seeds)
    found: dict[str, list[RunRecord]] = {m: [] for m in methods} if methods is not None else {}
    where: dict[tuple[str, int], str] = {}  # (method, seed) -> the run folder that holds its final run
    for name, r in results.items():
        if methods is not None and r.method not in found or wanted is not None and r.seed not in wanted:
            continue
        final = r.stage in (None, "final")
        failed_at_selected = r.failed and selected.get(r.method) == r.learning_rate
        if (final and not is_superseded(r, selected)) or failed_at_selected:
            if (r.method, r.seed) in where:  # a copied run folder would count one seed twice in every mean
                raise OELMError(f"two final runs of {r.method} seed {r.seed} under {under}: {where[r.method, r.seed]} "
                                f"and {name} (a copied run folder?); move the one that does not belong out of runs/ "
                                "and rerun `oelm report`")
            where[r.method, r.seed] = name
            found.setdefault(r.method, []).append(r)
    return {method: sorted(runs, key=lambda r: r.seed) for method, runs in found.items()}
