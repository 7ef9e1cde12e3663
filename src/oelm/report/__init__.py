"""Reporting: statistics over seeds, plots, ``report.md`` / ``report.html`` and JSON exports.

``write_comparison(config, results, out)`` is called at the end of every ``oelm run`` and by
``oelm report DIR``; it writes into ``out``:

* ``comparison.json`` — every number of the report (:func:`compare_results`), with the
  warnings a reader needs (:func:`comparison_warnings`, which ``oelm run`` prints too);
* ``original_layout.json`` — the original project's layout (:func:`original_layout`);
* ``report.md`` with its plots under ``report_files/*.png``;
* ``report.html`` — the same content as one page with inline CSS and no external URL; its plots are
  the same ``report_files/*.png``, linked relatively (the folder opens without a network).

Modules: :mod:`oelm.report.stats` (the statistics and their formulas), :mod:`.compare`
(aggregation of run results), :mod:`.caveats` (the warnings), :mod:`.plots` (matplotlib figures),
:mod:`.render` (markdown/HTML), :mod:`.layout` (``original_layout.json``).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oelm.io import inside, write_bytes_atomic, write_json_atomic, write_text_atomic

__all__ = ["write_comparison", "compare_results", "comparison_warnings", "original_layout", "comparison_rows", "render_report",
           "load_results", "PLOTS_ENV", "REPORT_PLOTS", "plots_wanted"]

#: Environment variable: ``0`` leaves the plots out of the report (every table and number stays).
PLOTS_ENV = "OELM_REPORT_PLOTS"


#: Every plot a report draws, by its file name under ``report_files/``. A report written without one of
#: them (``$OELM_REPORT_PLOTS=0``, or no step times any more) deletes an older copy of it, so the folder
#: never holds a plot its report.md does not link; other files there are left alone.
REPORT_PLOTS = ("learning_curves.png", "final_metric.png", "step_times.png", "convergence.png", "attention_entropy.png")


def plots_wanted() -> bool:
    """Whether reports draw their plots (``report_files/*.png``): ``$OELM_REPORT_PLOTS`` unset or
    ``1`` (the default) yes, ``0`` no.

    Without them, report.md and report.html keep every section, table and number and say where the
    plots went (the learning curves, the best-validation bars, step-time boxes, the convergence and
    attention-entropy plots are left out); comparison.json is the same either way. Drawing them is
    most of a report's time after its first (~1.7 s of a warm 2.1 s for 4 runs on a small CPU,
    matplotlib's text layout): the test suite turns them off (tests/conftest.py) except in the
    tests that read them. ``OELM_REPORT_PLOTS=1 oelm report DIR`` draws them later from the runs.

    Raises:
        ConfigError: any other value, in one line naming the variable and the two it takes.
    """
    from oelm.errors import env_switch

    return env_switch(PLOTS_ENV, "draw the report's plots, the default", "no plots: every table stays")


# Imported on first use (module ``__getattr__``, PEP 562): the statistics need scipy and the plots
# matplotlib (~1.5 s together), which `oelm run` needs only once its runs are done and which
# `import oelm.report` alone should not pay for. name -> the module that defines it.
_LAZY = {
    **dict.fromkeys(("compare_results", "run_records", "step_times_of"), "oelm.report.compare"),
    "original_layout": "oelm.report.layout",
    "comparison_warnings": "oelm.report.caveats",
    **dict.fromkeys(("build_sections", "comparison_rows", "render_html", "render_markdown"), "oelm.report.render"),
}

if TYPE_CHECKING:
    from oelm.records import RunRecord
    from oelm.report.caveats import comparison_warnings
    from oelm.report.compare import compare_results, run_records, step_times_of
    from oelm.report.layout import original_layout
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


def load_results(out: str | Path) -> dict[str, list[RunRecord]]:
    """method -> the final runs under ``out`` (``runs/*/result.json``), sorted by seed: the
    selector the plan uses too (:func:`oelm.records.final_runs`), at the learning rates
    ``sweep.json`` selected. A sweep run that failed at the selected rate counts (the report lists
    the failure instead of silently dropping it); sweep runs at other rates are summarized from
    ``sweep.json``; superseded final runs (:func:`oelm.records.is_superseded`) are left out.

    Raises:
        DamagedFileError: a ``result.json`` or ``sweep.json`` is damaged (names it).
        OELMError: two final runs of one method and seed (a copied run folder), naming both folders.
    """
    from oelm.records import MatrixFolder, final_runs, selected_rates

    folder = MatrixFolder(out)
    return final_runs(folder.results(), selected_rates(folder), under=folder.runs)


def write_comparison(config, results: dict[str, list[RunRecord]], out: str | Path) -> dict[str, Any]:
    """Compare ``results`` (method -> its final runs' records) and write comparison.json,
    original_layout.json, report.md (+ report_files/*.png) and report.html atomically into
    ``out``; a plot of :data:`REPORT_PLOTS` that this report does not draw is deleted there (an older
    report's copy would sit beside a report.md that no longer links it). Returns the comparison.

    Raises:
        OELMError: a file cannot be written (a read-only folder, a full disk): one line naming the
            file and the fix; files already written are whole (atomic writes).
        DamagedFileError: ``sweep.json`` is damaged (names it)."""
    from oelm.records import MatrixFolder
    from oelm.report.compare import compare_results, run_records, step_times_of
    from oelm.report.layout import original_layout
    from oelm.report.render import build_sections, render_html, render_markdown

    out = Path(out)
    folder = MatrixFolder(out)
    comparison = compare_results(config, results, out)
    step_ms: dict[str, list[float]] = {}
    for name, runs in results.items():
        keep = set(comparison["methods"].get(name, {}).get("included_seeds", []))
        step_ms[name] = [t for r in runs if r.seed in keep for t in step_times_of(r, run_records(out, r))[0]]
    sections = build_sections(comparison, out, step_ms)
    md, images = render_markdown(comparison, sections)
    try:
        write_json_atomic(folder.comparison, comparison)
        write_json_atomic(folder.original_layout, original_layout(comparison))
        for rel, png in images.items():
            write_bytes_atomic(inside(out, rel), png)  # report_files/ planted as a link: refused
        write_text_atomic(folder.report_md, md)
        write_text_atomic(folder.report_html, render_html(comparison, sections))
        if (out / "report_files").is_dir():  # last: until the new report.md is written, the old one links them
            for stale in set(REPORT_PLOTS) - {Path(rel).name for rel in images}:  # drawn by an earlier report
                inside(out, Path("report_files") / stale).unlink(missing_ok=True)
    except OSError as exc:  # a read-only folder, a full disk: the runs' files are untouched
        from oelm.errors import OELMError

        raise OELMError(f"cannot write the report into {out} ({exc.strerror or exc}: {exc.filename or out}); make it "
                        "writable (or free space), or copy the folder elsewhere and run `oelm report` on the copy") from None
    return comparison
