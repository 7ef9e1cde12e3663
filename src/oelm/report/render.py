"""``report.md`` and a self-contained ``report.html`` from one comparison.

Both are rendered from the same list of sections (:func:`build_sections`), so they always say
the same thing. Both link the same plot files under ``report_files/`` (written beside them by
:func:`oelm.report.write_comparison`); the HTML, rendered from the autoescaped Jinja2 template
``templates/report.html.j2``, has inline CSS and no external URL, so the report's folder opens
anywhere without a network. The plots are files, not base64 copies inside the page: the copies
made the committed report.html files 6.8 MiB of the 29 MiB tree that travels with every GPU
command (docs/scaling.md).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oelm.records import format_rates, is_automatic
from oelm.report import PLOTS_ENV, plots_wanted
from oelm.report.budgets import runs_blocks
from oelm.report.compare import metrics_records, mfu_reference
from oelm.report.compute import compute_line, time_split_blocks
from oelm.report.convergence import convergence_blocks
from oelm.report.diagnostics_summary import diagnostics_blocks
from oelm.report.target_verdicts import targets_blocks
from oelm.report.uncertainty import uncertainty_blocks

__all__ = ["Section", "comparison_rows", "build_sections", "render_markdown", "render_html", "curves_from_runs"]


def _plots():
    """:mod:`oelm.report.plots`, imported when the first plot is drawn (matplotlib costs ~0.6 s)."""
    from oelm.report import plots

    return plots


@dataclass
class Section:
    """A titled part of the report: paragraphs, tables ``(header, rows)``, images ``(name, png, alt)``."""

    title: str
    blocks: list[tuple[str, Any]] = field(default_factory=list)

    def text(self, s: str) -> "Section":
        self.blocks.append(("text", s))
        return self

    def table(self, header: list[str], rows: list[list[str]]) -> "Section":
        self.blocks.append(("table", (header, rows)))
        return self

    def image(self, name: str, png: bytes, alt: str) -> "Section":
        self.blocks.append(("image", (name, png, alt)))
        return self

    def items(self, items: list[str]) -> "Section":
        self.blocks.append(("list", items))
        return self


def _num(v: Any, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def _fmt(stat: dict | None, digits: int = 2) -> str:
    """``mean ± std`` (std only with more than one seed); "–" without a value."""
    if not stat or stat.get("mean") is None:
        return "–"
    s = f"{stat['mean']:.{digits}f}"
    return s + (f" ± {stat['std']:.{digits}f}" if stat.get("n", 0) > 1 else "")


def _ci(stat: dict | None, digits: int = 2) -> str:
    if not stat or not stat.get("ci95"):
        return "n/a"
    lo, hi = stat["ci95"]
    return f"[{lo:.{digits}f}, {hi:.{digits}f}]"


def _signed(v: float | None, digits: int = 2, suffix: str = "") -> str:
    return "–" if v is None else f"{v:+.{digits}f}{suffix}"


def _paired_cells(paired: dict | None) -> list[str]:
    """Δ mean, 95% CI and p of a :func:`~oelm.report.stats.paired_difference` ("–" without pairs)."""
    if not paired or not paired.get("n"):
        return ["–", "–", "–"]
    return [_signed(paired.get("mean")), _ci(paired), _p(paired.get("p_value"))]


def _pairs(paired: dict | None) -> str:
    """The seed pairs of a :func:`~oelm.report.stats.paired_difference` ("–" for baseline's own row)."""
    return "–" if not paired else str(paired.get("n", 0))


def _gap_cell(gap: dict[str, Any], m: dict[str, Any], base: dict[str, Any] | None) -> str:
    """The Δ vs baseline cell: the gap over the seeds both methods ran, with their count ``(n=k)``
    when it is not each method's own (per-method seeds, or a collapsed seed)."""
    cell = _signed(gap.get("metric_gap"))
    n = (gap.get("paired_metric") or {}).get("n")
    own = {len(x.get("included_seeds", x.get("seeds", []))) for x in (m, base or {})}
    return cell if n is None or gap.get("metric_gap") is None or own == {n} else f"{cell} (n={n})"


def _p(p: float | None) -> str:
    if p is None:
        return "n/a"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def comparison_rows(comparison: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the comparison table (report and console), in the original project's
    layout — method, our metric, the published number beside it, the gap to baseline, trainable
    share, time and its gap — plus the 95% CI, step time, throughput and learning rate."""
    metric = comparison["metric"] or "metric"
    unit = " (%)" if metric == "accuracy" else ""
    header = [
        "method", f"best val {metric}{unit}", "95% CI", "Δ vs baseline", "trainable %", "total s", "Δ time %",
        "step ms (median)", "Δ step %", "tokens/s", "lr", "seeds",
    ]
    if comparison.get("reference"):
        header.insert(3, "published")
    rows = []
    for name, m in comparison["methods"].items():
        gap = comparison["vs_baseline"].get(name, {})
        params = m.get("parameters") or {}
        seeds = f"{len(m['included_seeds'])}/{len(m['seeds'])}" if "included_seeds" in m else str(len(m.get("seeds", [])))
        row = [
            name,
            _best_cell(m),
            _ci(m["best_validation"]),
            _gap_cell(gap, m, comparison["methods"].get("baseline")),
            _num(params.get("trainable_percent")),
            _fmt(m["total_seconds"], 1),
            _signed(gap.get("total_time_gap_percent"), 1),
            _fmt(m["step_ms_median"], 1),
            _signed(gap.get("per_step_gap_percent"), 1),
            _fmt(m["tokens_per_second"], 0),
            "–" if m.get("learning_rate") is None else f"{m['learning_rate']:g}",
            seeds,
        ]
        if comparison.get("reference"):
            ref = comparison["reference"].get(name)
            row.insert(3, "–" if ref is None else f"{ref:g}")
        rows.append(row)
    return header, rows


def _best_cell(m: dict[str, Any]) -> str:
    """The best-validation cell: mean ± std of the sound seeds; for a method whose every finished
    run ended at chance, their mean marked "(at chance)" (in no mean or Δ), not a blank."""
    at_chance = m.get("at_chance_best_validation") or {}
    if m["best_validation"].get("mean") is None and at_chance.get("mean") is not None:
        return f"{_fmt(at_chance)} (at chance)"
    return _fmt(m["best_validation"])


def curves_from_runs(out: Path, comparison: dict[str, Any]) -> dict[str, dict[str, list[dict[int, tuple[float, float]]]]]:
    """Per method and sound seed, step -> (value, elapsed_seconds) of train loss and validation
    metric; under ``"at_chance"`` the same for its runs that ended at chance (drawn apart, dashed)."""
    metric = comparison.get("metric")
    curves: dict[str, dict[str, list]] = {}
    for method, m in comparison["methods"].items():
        runs = {r["seed"]: r for r in m.get("runs", [])}

        def of(seeds: list[int]) -> dict[str, list]:
            found: dict[str, list] = {"train": [], "eval": []}
            for seed in seeds:
                run = runs.get(seed, {})
                recs = metrics_records(out, run.get("run_name"), method, seed, run.get("learning_rate", m.get("learning_rate")))
                for kind, key in (("train", "loss"), ("eval", metric)):
                    found[kind].append({
                        int(r["step"]): (float(r[key]), float(r.get("elapsed_seconds") or 0.0))
                        for r in recs
                        if r.get("type") == kind and isinstance(r.get(key), (int, float))
                    })
            return found

        curves[method] = of(m.get("included_seeds", m["seeds"]))
        if m.get("at_chance_seeds"):
            curves[method]["at_chance"] = of(m["at_chance_seeds"])
    return curves


def build_sections(comparison: dict[str, Any], out: Path | None, step_ms: dict[str, list[float]] | None = None) -> list[Section]:
    """Every section of the report, in reading order (plots only when ``out`` holds the runs)."""
    c = comparison
    metric = c.get("metric") or "metric"
    unit = " (%)" if metric == "accuracy" else ""
    sections = [_summary_section(c, metric)]
    if c.get("warnings"):
        sections.append(Section("Warnings").items(c["warnings"]))
    sections.append(_comparison_section(c, metric, unit))
    if c.get("vs_baseline"):
        sections.append(_paired_section(c["vs_baseline"], metric))
    sections += [Section(title, blocks) for title, blocks in runs_blocks(c, unit)]
    if c.get("sweep"):
        sections.append(_sweep_section(c["sweep"], metric))
    sections += _plot_sections(c, out, metric)
    sections.append(_step_time_section(c, step_ms))
    optional = (_utilization_section(c), _time_to_target_section(c.get("time_to_target"), metric, unit))
    sections += [s for s in optional if s is not None]
    # present only when the runs saved predictions / training seconds per validation / the config has targets /
    # the runs recorded attention diagnostics / their wall time
    optional_blocks = (uncertainty_blocks(c) + convergence_blocks(c) + targets_blocks(c) + diagnostics_blocks(c)
                       + time_split_blocks(c))
    sections += [Section(title, blocks) for title, blocks in optional_blocks]
    parameters = _parameters_section(c)
    sections += [parameters] if parameters is not None else []
    sections.append(_environment_section(c))
    return sections


def _summary_section(c: dict[str, Any], metric: str) -> Section:
    return Section("Summary").text(
        f"Task **{c['task']}**, model **{c['model']}**, methods {', '.join(c['methods'])}, seeds {c['seeds']}"
        + "".join(f"; {n}: seeds {seeds}" for n, seeds in (c.get("method_seeds") or {}).items()) + ". "
        f"The headline number is the best validation {metric} of each run (selected on the validation split only; "
        "a test split, where configured, is evaluated once with the selected weights). "
        "Values are mean ± sample std (ddof=1) over the sound seeds; 95% CI = mean ± t(0.975, n−1)·s/√n (Student t). "
        "Δ columns are method − baseline (time and step: relative, negative = faster), over the seeds both ran."
    )


def _comparison_section(c: dict[str, Any], metric: str, unit: str) -> Section:
    """The headline table (:func:`comparison_rows`), the published numbers' source, the test split's paired gaps."""
    header, rows = comparison_rows(c)
    s = Section("Comparison").table(header, rows)
    if any(r[1].endswith("(at chance)") for r in rows):
        s.text("(at chance): no run of that method counts in the means; those that finished ended at or below chance "
               "(the collapse rule under Runs). Their mean is shown for reference, in no Δ; their learning curves are dashed.")
    if c.get("reference_source"):
        s.text(f"Published numbers: {c['reference_source']}. They come from the original setting (model size, data, "
               "budget); a CPU-scale run is not expected to match them, only to show the same ordering.")
    if any(m["test"]["mean"] is not None for m in c["methods"].values()):
        # the paired test gap is what a claim is judged on (each final run's test split, evaluated once)
        gaps = c.get("vs_baseline") or {}
        rows = [[n, _fmt(m["test"]), _ci(m["test"]), _pairs((gaps.get(n) or {}).get("paired_test")),
                 *_paired_cells((gaps.get(n) or {}).get("paired_test"))] for n, m in c["methods"].items()]
        s.table(["method", f"test {metric}{unit}", "95% CI", "pairs", "Δ vs baseline, paired by seed", "95% CI", "p"], rows)
    return s


def _paired_section(vs_baseline: dict[str, Any], metric: str) -> Section:
    s = Section("Difference to baseline, paired by seed")
    s.text("Per seed, method − baseline; mean with 95% CI (Student t) and the two-sided p-value of a **paired t-test** "
           "(scipy.stats.ttest_rel). With fewer than 2 seed pairs there is no interval and no p-value (n/a).")
    rows = []
    for n, g in vs_baseline.items():
        pm, ps = g.get("paired_metric") or {}, g.get("paired_seconds") or {}
        rows.append([n, str(pm.get("n", 0)), _signed(pm.get("mean")), _ci(pm), _p(pm.get("p_value")),
                     _signed(ps.get("mean"), 1), _ci(ps, 1), _p(ps.get("p_value")), _num(g.get("speedup"), 3)])
    s.table(["method", "pairs", f"Δ best val {metric}", "95% CI", "p", "Δ total s", "95% CI", "p", "speedup ×"], rows)
    return s


def _sweep_section(sw: dict[str, Any], metric: str) -> Section:
    s = Section("Learning-rate sweep (validation only)")
    s.text(f"Selection metric: {sw.get('selection_metric', metric)}; the selected learning rate of each method is marked. "
           "The test split is never used for this choice.")
    rows = []
    for n, entries in (sw.get("methods") or {}).items():
        for e in entries:
            rows.append([n, f"{e.get('learning_rate'):g}" if e.get("learning_rate") is not None else "–", str(e.get("seed", "–")),
                         _num(e.get("best_validation")), str(e.get("status", "–")), "✔" if e.get("selected") else ""])
    s.table(["method", "lr", "seed", f"best val {metric}", "status", "selected"], rows)
    for n, steps in (sw.get("grid_growth") or {}).items():
        for g in steps:
            if is_automatic(g):
                means = ", ".join(f"{v['learning_rate']:g}: {_num(v.get('best_validation'))}" for v in g.get("validation") or [])
                s.text(f"{n}: the grid grew on validation from {format_rates(g['from'])} to {format_rates(g['to'])}, before "
                       f"any final run evaluated the test split: the selected rate {g['selected']:g} was the "
                       f"{'highest' if g['edge'] == 'high' else 'lowest'} of its grid (mean best validation {means}); "
                       f"automatic growth, at most {g.get('max_grid_growth')} rate(s) (max_grid_growth).")
            else:
                s.text(f"{n}: the grid grew from {format_rates(g['from'])} to {format_rates(g['to'])} ({g.get('at')}) and the "
                       "rate was selected again; see the warnings.")
    return s


def _plot_sections(c: dict[str, Any], out: Path | None, metric: str) -> list[Section]:
    """The learning curves (when ``out`` holds the runs' metrics) and the best-validation plot; with
    ``$OELM_REPORT_PLOTS=0`` (:func:`oelm.report.plots_wanted`) one line saying the plots are off."""
    if not plots_wanted():
        return [Section("Plots").text(f"Plots are off ({PLOTS_ENV}=0): every table and number of the report is here; "
                                      f"`{PLOTS_ENV}=1 oelm report DIR` draws the plots from the runs.")]
    sections = []
    if out is not None:
        curves = curves_from_runs(out, c)
        if any(v for m in curves.values() for part in (m, m.get("at_chance") or {}) for v in part.get("eval", []) + part.get("train", [])):
            sections.append(Section("Learning curves").image("learning_curves.png", _plots().learning_curves(curves, metric),
                                                             "train loss and validation metric vs step and wall time"))
    if any(m["best_validation"]["mean"] is not None for m in c["methods"].values()):
        sections.append(Section("Best validation metric with 95% CI").image(
            "final_metric.png", _plots().final_metric_bars(c),
            "best validation metric per method: bars from zero, and means with 95% confidence intervals on a zoomed axis")
            .text("Left: the means as bars on an axis from zero, so bar lengths compare honestly. Right: the same means "
                  "with their 95% intervals and every seed, on an axis cut to the data (its start is in the panel's "
                  "title): differences look larger there than they are."))
    return sections


def _step_time_section(c: dict[str, Any], step_ms: dict[str, list[float]] | None) -> Section:
    s = Section("Step time")
    rows = []
    for n, m in c["methods"].items():
        st = m.get("step_times") or {}
        rows.append([n, str(st.get("n", 0)), _num(st.get("median"), 1), _num(st.get("q1"), 1), _num(st.get("q3"), 1),
                     _num(st.get("iqr"), 1), _num(st.get("cv"), 3), st.get("source") or "–"])
    s.table(["method", "steps", "median ms", "Q1", "Q3", "IQR ms", "CV", "source"], rows)
    s.text("Warm-up steps are excluded. CV = sample std / mean. \"sampled at log steps\": older runs kept only the step "
           "time at each log line, not every step.")
    if step_ms and any(step_ms.values()) and plots_wanted():
        s.image("step_times.png", _plots().step_time_boxes(step_ms), "box plots of step time per method")
    return s


def _time_to_target_section(t: dict[str, Any] | None, metric: str, unit: str) -> Section | None:
    if not t:
        return None
    s = Section("Time to target (MLPerf-style)")
    cmp = "≥" if t["higher_is_better"] else "≤"
    s.text(f"Target: baseline's mean final validation {metric} = {t['target']:.3f}{unit}. For each run, the first "
           f"validation evaluation with {metric} {cmp} target: its step and wall time since the run began (evaluation "
           "time included). Means are over the seeds that reached it.")
    rows = []
    for n, x in t["methods"].items():
        per = ", ".join(
            f"s{seed}: " + ("not reached" if v is None else f"{v['step']} steps / {_num(v['seconds'], 1)} s")
            for seed, v in x["runs"].items()
        )
        rows.append([n, f"{x['reached']}/{x['n']}", _num(x["steps"]["mean"], 1) if x["reached"] else "not reached",
                     _num(x["seconds"]["mean"], 1) if x["reached"] else "not reached", per])
    s.table(["method", "reached", "mean steps", "mean seconds", "per seed"], rows)
    return s


def _parameters_section(c: dict[str, Any]) -> Section | None:
    groups = sorted({g for m in c["methods"].values() for g in ((m.get("parameters") or {}).get("groups") or {})})
    if not groups:
        return None
    s = Section("Parameters per group (trainable / total)")
    names = list(c["methods"])
    rows = []
    for g in groups:
        row = [g]
        for n in names:
            d = ((c["methods"][n].get("parameters") or {}).get("groups") or {}).get(g)
            row.append("–" if d is None else f"{d['trainable']:,} / {d['total']:,}")
        rows.append(row)
    row = ["all"]
    for n in names:
        p = c["methods"][n].get("parameters") or {}
        row.append(f"{p.get('trainable', 0):,} / {p.get('total', 0):,} ({_num(p.get('trainable_percent'))}%)")
    rows.append(row)
    s.table(["group", *names], rows)
    return s


def _environment_section(c: dict[str, Any]) -> Section:
    env = c.get("environment") or {}
    s = Section("Environment")
    pk = env.get("packages") or {}
    compute = [f"Compute: {compute_line(c['compute'])}"] if c.get("compute") else []  # older comparisons have none
    items = [*compute, f"Devices: {'; '.join(env.get('devices') or []) or '–'}",
             f"Python {env.get('python') or '–'} on {env.get('platform') or '–'}; torch threads {env.get('torch_num_threads', '–')}",
             "Packages: " + ", ".join(f"{k} {v}" for k, v in pk.items() if v),
             f"Mixed precision: {', '.join(env.get('mixed_precision') or []) or '–'}"]
    if env.get("cuda"):
        items.append("CUDA: " + ", ".join(f"{k} {v}" for k, v in env["cuda"].items() if v))
    items.append(f"Report host: {c.get('host', '–')}")
    s.items(items)
    probe = env.get("probe") or []
    if compute:
        s.text(f"Compute counts {c['compute']['rule']}.")
    if probe:
        s.table(["run", "probe GFLOP/s before", "after", "drift %"],
                [[p["run"], _num(p["gflops_before"], 1), _num(p["gflops_after"], 1), _signed(p["drift_percent"], 1)] for p in probe])
        s.text("The probe times a fixed matrix multiply before and after each run; a change above 10% means the machine's "
               "speed drifted during the run.")
    return s


def _utilization_section(c: dict[str, Any]) -> Section | None:
    """Tokens/s, MFU and GPU telemetry per method (means over sound seeds); None when no run has
    an MFU, a compile time or GPU telemetry (older results)."""
    keys = ("mfu_percent", "compile_seconds", "gpu_utilization_percent_median")
    if not any((m.get(k) or {}).get("mean") is not None for m in c["methods"].values() for k in keys):
        return None
    s = Section("Throughput and utilization")
    rows = [[n, _fmt(m["tokens_per_second"], 0), _fmt(m.get("mfu_percent"), 1),
             "; ".join(m.get("mfu_reference") or [mfu_reference(p) for p in m.get("mfu_peak_source") or []]) or "–",
             _fmt(m.get("compile_seconds"), 1), _fmt(m.get("gpu_utilization_percent_median"), 0),
             _fmt(m.get("gpu_temperature_c_max"), 0)]
            for n, m in c["methods"].items()]
    s.table(["method", "tokens/s", "MFU %", "MFU of (reference peak)", "compile s", "GPU util % (median)", "GPU °C (max)"], rows)
    s.text("MFU = model FLOPs per token (6N + 12·L·H·T, PaLM appendix B) x tokens/s / a reference peak, named in the "
           "table: on a GPU its datasheet peak for the run's precision; on a CPU (or a GPU without a datasheet figure) "
           "the speed of oelm's measured matmul probe, not the hardware's peak, so a CPU MFU of 50% or more means "
           "\"half of what one large matrix multiply reaches here\", not half the processor's capability. "
           "Compile time is outside every step and total time. "
           "GPU figures are sampled through NVML about once a second during training.")
    return s


def _md_cell(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def render_markdown(comparison: dict[str, Any], sections: list[Section], image_dir: str = "report_files") -> tuple[str, dict[str, bytes]]:
    """Markdown text and the images it links (``image_dir/<name>`` -> PNG bytes)."""
    lines = [f"# {comparison['name']}: {comparison['task']} with {comparison['model']}", ""]
    images: dict[str, bytes] = {}
    for sec in sections:
        lines += [f"## {sec.title}", ""]
        for kind, body in sec.blocks:
            if kind == "text":
                lines += [body, ""]
            elif kind == "list":
                lines += [f"- {_md_cell(i)}" for i in body] + [""]
            elif kind == "table":
                header, rows = body
                lines.append("| " + " | ".join(_md_cell(h) for h in header) + " |")
                lines.append("|" + "|".join("---" for _ in header) + "|")
                lines += ["| " + " | ".join(_md_cell(x) for x in r) + " |" for r in rows]
                lines.append("")
            elif kind == "image":
                name, png, alt = body
                images[f"{image_dir}/{name}"] = png
                lines += [f"![{alt}]({image_dir}/{name})", ""]
    return "\n".join(lines).rstrip() + "\n", images


def _anchor(title: str) -> str:
    """A section's HTML id: the first word of its title, lower case ("Step time" -> ``step``)."""
    return title.lower().split()[0].strip(":,()")


@functools.cache
def _html_environment():
    """The Jinja2 environment of ``templates/`` (autoescaped, undefined names are errors)."""
    # Imported here, not at the top: `import oelm` and the markdown report need no Jinja2 (start-up time).
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("oelm.report", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters.update(anchor=_anchor)
    return env


def render_html(comparison: dict[str, Any], sections: list[Section], image_dir: str = "report_files") -> str:
    """One HTML page with inline CSS and no external URL; each plot an ``<img>`` of the PNG file
    ``image_dir/<name>`` relative to the page (the files :func:`render_markdown` returns for the
    same ``image_dir``, which the caller writes beside the page).

    Rendered from the Jinja2 template ``oelm/report/templates/report.html.j2`` with autoescaping,
    so every name, warning, cell and alt text is escaped (a plot's file name is URL-quoted too);
    each block kind of a :class:`Section` has one macro there, so a new section needs no template
    change.

    Raises:
        jinja2.UndefinedError: a section holds a block of a kind the template has no macro for.
    """
    return _html_environment().get_template("report.html.j2").render(comparison=comparison, sections=sections,
                                                                     image_dir=image_dir)
