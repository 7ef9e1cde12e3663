"""Reporting: statistics over seeds, plots, ``report.md`` / ``report.html`` and JSON exports.

``write_comparison(config, results, out)`` is called at the end of every ``oelm run`` and by
``oelm report DIR``; it writes into ``out``:

* ``comparison.json`` — every number of the report (:func:`compare_results`), with the
  warnings a reader needs (:func:`comparison_warnings`, which ``oelm run`` prints too);
* ``original_layout.json`` — the original project's layout (:func:`original_layout`);
* ``report.md`` with its plots under ``report_files/*.png``;
* ``report.html`` — the same content in one self-contained file (plots embedded as base64 PNG).

Modules: :mod:`oelm.report.stats` (the statistics and their formulas), :mod:`.compare`
(aggregation of run results), :mod:`.plots` (matplotlib figures), :mod:`.render` (markdown/HTML).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oelm.io import write_bytes_atomic, write_json_atomic, write_text_atomic

__all__ = ["write_comparison", "compare_results", "comparison_warnings", "original_layout", "comparison_rows", "render_report",
           "load_results"]

# Imported on first use (module ``__getattr__``, PEP 562): the statistics need scipy and the plots
# matplotlib (~1.5 s together), which `oelm run` needs only once its runs are done and which
# `import oelm.report` alone should not pay for. name -> the module that defines it.
_LAZY = {
    **dict.fromkeys(("compare_results", "comparison_warnings", "original_layout", "run_records", "step_times_of"),
                    "oelm.report.compare"),
    **dict.fromkeys(("build_sections", "comparison_rows", "render_html", "render_markdown"), "oelm.report.render"),
}

if TYPE_CHECKING:
    from oelm.report.compare import compare_results, comparison_warnings, original_layout, run_records, step_times_of
    from oelm.report.render import build_sections, comparison_rows, render_html, render_markdown


def __getattr__(name: str) -> Any:
    """``oelm.report.<name>`` for the lazily imported names (see ``_LAZY``)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def render_report(comparison: dict[str, Any], out: str | Path | None = None) -> str:
    """``report.md`` text for ``comparison`` (without plots when ``out`` is None)."""
    from oelm.report.render import build_sections, render_markdown

    text, _ = render_markdown(comparison, build_sections(comparison, Path(out) if out else None))
    return text


def load_results(out: str | Path) -> dict[str, list[dict]]:
    """method -> the final runs under ``out`` (``runs/*/result.json``), sorted by seed.

    A final run is one of the selected configuration: ``stage == "final"`` (results written before
    the learning-rate sweep existed have no stage and count as final), or a sweep run that failed at
    the learning rate later selected for its method (``sweep.json``) — kept so the report lists the
    failure instead of silently dropping it. Sweep runs at other learning rates are left out; they
    are summarized from ``sweep.json``. Final runs at a rate that is no longer selected (the
    method's grid grew and the selection moved: :func:`oelm.runs.is_superseded`) are left out.

    Raises:
        DamagedFileError: a ``result.json`` or ``sweep.json`` is damaged (names it).
        OELMError: two final runs of one method and seed (a copied run folder), naming both folders.
    """
    from oelm.errors import OELMError
    from oelm.matrix.store import MatrixFolder, RunRecord
    from oelm.runs import is_superseded, read_sweep

    folder = MatrixFolder(out)
    selected = (read_sweep(folder.sweep).get("selected_learning_rates") or {}) if folder.sweep.exists() else {}
    records: dict[str, list[RunRecord]] = {}
    where: dict[tuple[str, int], str] = {}  # (method, seed) -> the run folder that holds its final run
    for run, r in folder.iter_results():
        final = r.stage in (None, "final")
        failed_at_selected = r.failed and selected.get(r.method) == r.learning_rate
        if (final and not is_superseded(r, selected)) or failed_at_selected:
            if (r.method, r.seed) in where:  # a copied run folder would count one seed twice in every mean
                raise OELMError(f"two final runs of {r.method} seed {r.seed} under {folder.runs}: {where[r.method, r.seed]} "
                                f"and {run.name} (a copied run folder?); move the one that does not belong out of runs/ "
                                "and rerun `oelm report`")
            where[r.method, r.seed] = run.name
            records.setdefault(r.method, []).append(r)
    return {method: [r.raw for r in sorted(runs, key=lambda r: r.seed)] for method, runs in records.items()}


def write_comparison(config, results: dict[str, list[dict]], out: str | Path) -> dict[str, Any]:
    """Compare ``results`` (method -> run results) and write comparison.json, original_layout.json,
    report.md (+ report_files/*.png) and report.html atomically into ``out``. Returns the comparison.

    Raises:
        OELMError: a file cannot be written (a read-only folder, a full disk): one line naming the
            file and the fix; files already written are whole (atomic writes).
        DamagedFileError: ``sweep.json`` is damaged (names it)."""
    from oelm.matrix.store import RunRecord
    from oelm.report.compare import compare_results, original_layout, run_records, step_times_of
    from oelm.report.render import build_sections, render_html, render_markdown

    out = Path(out)
    comparison = compare_results(config, results, out)
    step_ms: dict[str, list[float]] = {}
    for name, runs in results.items():
        keep = set(comparison["methods"].get(name, {}).get("included_seeds", []))
        step_ms[name] = [t for r in map(RunRecord, runs) if r.seed in keep for t in step_times_of(r, run_records(out, r))[0]]
    sections = build_sections(comparison, out, step_ms)
    md, images = render_markdown(comparison, sections)
    try:
        write_json_atomic(out / "comparison.json", comparison)
        write_json_atomic(out / "original_layout.json", original_layout(comparison))
        for rel, png in images.items():
            write_bytes_atomic(out / rel, png)
        write_text_atomic(out / "report.md", md)
        write_text_atomic(out / "report.html", render_html(comparison, sections))
    except OSError as exc:  # a read-only folder, a full disk: the runs' files are untouched
        from oelm.errors import OELMError

        raise OELMError(f"cannot write the report into {out} ({exc.strerror or exc}: {exc.filename or out}); make it "
                        "writable (or free space), or copy the folder elsewhere and run `oelm report` on the copy") from None
    return comparison
