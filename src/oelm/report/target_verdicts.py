"""A config's ``targets:`` (:mod:`oelm.config.quality_targets`) checked against the comparison: each bound
on a method's gap to baseline is *pass*, *fail* or *undecided* by its 95% interval.

The gap. Classification: accuracy points, method − baseline. Language modelling: the perplexity
ratio method / baseline. The interval, in this order of preference:

* **seeds × examples** — the interval of ``comparison["uncertainty"]``
  (:func:`oelm.report.uncertainty.paired_interval`) when both methods saved predictions for every
  seed: it covers the seeds *and* the test set's sampling error;
* **seed-only interval (t)** — else, the 95% Student-t interval of the per-seed gaps from each run's
  ``result.json`` value (:func:`oelm.report.stats.summarize`), paired by seed: test values when
  every paired run has one, else best validation (the selection split: optimistic, said so).

The verdict of one bound: **pass** when the whole interval meets it, **fail** when none of it
does, **undecided** when the interval straddles the bound (``point`` still says which side the
estimate is on) or rests on one seed (no seed interval; a bootstrap over one seed's examples would
leave the seeds' spread out). A target passes when every bound passes and
fails when any bound fails.
"""

from __future__ import annotations

from typing import Any, Sequence

from oelm.config.quality_targets import QUALITY_BOUNDS
from oelm.report.stats import summarize

__all__ = ["targets_comparison", "targets_blocks", "bound_result"]

_SEEDS_EXAMPLES = "seeds × examples"
_SEED_ONLY = "seed-only interval (t)"


def bound_result(kind: str, bound: float, estimate: float | None, ci: Sequence[float] | None) -> tuple[str, str | None]:
    """``(result, point)`` of one bound: ``kind`` ``"min"`` (the gap must be >= ``bound``) or
    ``"max"`` (<=); ``result`` is "pass" / "fail" / "undecided" by the interval ``ci`` (see the
    module docstring), ``point`` "pass" / "fail" by ``estimate`` alone (None without one)."""
    def meets(x: float) -> bool:
        return x >= bound if kind == "min" else x <= bound

    point = None if estimate is None else ("pass" if meets(estimate) else "fail")
    if not ci or ci[0] is None or ci[1] is None:
        return "undecided", point
    low, high = ci
    if meets(low) and meets(high):
        return "pass", point
    if not meets(low) and not meets(high):
        return "fail", point
    return "undecided", point


def _seed_gap(comparison: dict[str, Any], name: str, ratio: bool) -> dict[str, Any]:
    """Per-seed gaps of ``name`` to baseline from the runs' result values (sound runs of both)."""
    def values(method: str, field: str) -> dict[int, float]:
        m = comparison["methods"].get(method) or {}
        keep = set(m.get("included_seeds") or [])
        return {r["seed"]: r[field] for r in m.get("runs", []) if r["seed"] in keep and r.get(field) is not None}

    paired = sorted(set(values("baseline", "best_validation")) & set(values(name, "best_validation")))
    base, mine = values("baseline", "test"), values(name, "test")
    field, split = (("test", "test") if paired and all(s in base and s in mine for s in paired)
                    else ("best_validation", "validation"))
    base, mine = values("baseline", field), values(name, field)
    seeds = [s for s in paired if not ratio or base[s]]
    stat = summarize([mine[s] / base[s] if ratio else mine[s] - base[s] for s in seeds])
    return {"gap": stat["mean"], "ci95": stat["ci95"], "n": stat["n"], "seeds": seeds, "split": split if seeds else None,
            "interval": _SEED_ONLY}


def _interval_of(comparison: dict[str, Any], name: str, ratio: bool) -> dict[str, Any]:
    """The gap and interval a target of ``name`` is judged on (module docstring)."""
    u = comparison.get("uncertainty") or {}
    entry = (u.get("methods") or {}).get(name) or {}
    if entry.get("interval") == "seeds × examples" and entry.get("ci95"):
        return {"gap": entry["gap"], "ci95": list(entry["ci95"]), "n": len(entry.get("seeds") or []),
                "seeds": list(entry.get("seeds") or []), "split": u.get("split"), "interval": _SEEDS_EXAMPLES}
    return _seed_gap(comparison, name, ratio)


def targets_comparison(targets: dict[str, Any], comparison: dict[str, Any]) -> dict[str, Any]:
    """``{"targets": {...}}`` for ``comparison.json``, or ``{}`` without targets (comparisons of
    configs without a ``targets:`` block stay as they were).

    ``targets``: the config's block (method -> :class:`oelm.config.quality_targets.QualityTarget`). Per method:
    ``bounds`` (name -> value), ``gap``, ``ci95``, ``interval`` (which: module docstring), ``split``,
    ``n`` (seed pairs), ``seeds``, ``checks`` (per bound: ``bound``, ``value``, ``result``, ``point``,
    ``gap_name`` in words) and ``result`` (pass / fail / undecided; "no sound runs" when the method or
    baseline has no sound run).
    """
    if not targets:
        return {}
    ratio = comparison.get("metric") == "perplexity"
    out: dict[str, Any] = {}
    for name, target in targets.items():
        bounds = target.bounds() if hasattr(target, "bounds") else dict(target)
        have = name in comparison["methods"] and "baseline" in comparison["methods"]
        found = _interval_of(comparison, name, ratio) if have else {"gap": None, "ci95": None, "n": 0, "seeds": [],
                                                                   "split": None, "interval": _SEED_ONLY}
        checks = []
        for bound, value in bounds.items():
            ci = found["ci95"] if found["n"] >= 2 else None  # one seed: no verdict (module docstring)
            result, point = bound_result(QUALITY_BOUNDS[bound][1], value, found["gap"], ci)
            checks.append({"bound": bound, "value": value, "gap_name": QUALITY_BOUNDS[bound][2], "result": result,
                           "point": point})
        results = {c["result"] for c in checks}
        overall = ("no sound runs" if found["gap"] is None else "fail" if "fail" in results
                   else "pass" if results == {"pass"} else "undecided")
        out[name] = {"bounds": bounds, **found, "checks": checks, "result": overall}
    return {"targets": {"confidence": 95.0, "methods": out,
                        "rule": "pass: the whole 95% interval meets the bound; fail: none of it does; undecided: it "
                                "straddles the bound or rests on one seed"}}


def _show(x: float | None, ratio: bool) -> str:
    if x is None:
        return "–"
    return f"{x:.4f}" if ratio else f"{x:+.2f}"


def targets_blocks(comparison: dict[str, Any]) -> list[tuple[str, list[tuple[str, Any]]]]:
    """The report's "Targets" section for ``comparison["targets"]`` (blocks as
    :class:`oelm.report.render.Section` holds them); [] without targets."""
    t = comparison.get("targets")
    if not t:
        return []
    ratio = comparison.get("metric") == "perplexity"
    header = ["method", "target", "gap to baseline", "95% interval", "interval", "split", "seeds", "result (estimate alone)"]
    rows = []
    for name, m in t["methods"].items():
        for c in m["checks"]:
            sign = "≥" if c["bound"].endswith("_min") else "≤"
            ci = m.get("ci95")
            rows.append([name, f"{c['gap_name'].split(' (')[0]} {sign} {c['value']:g}", _show(m.get("gap"), ratio),
                         "n/a" if not ci else f"[{_show(ci[0], ratio)}, {_show(ci[1], ratio)}]", m["interval"],
                         m.get("split") or "–", str(m.get("n", 0)),
                         f"**{c['result']}**" + (f" ({c['point']})" if c.get("point") else "")])
    text = ("Each target of the config's `targets:` block, checked against the gap to baseline "
            + ("(perplexity ratio, method / baseline)" if ratio else "(accuracy points, method − baseline)")
            + f". {t['rule'][0].upper()}{t['rule'][1:]}. The interval is the seeds × examples one where both methods "
            "saved predictions for every seed (the seeds' and the test set's Student-t half-widths in quadrature: it "
            "covers the test set's sampling error too), else the Student-t interval "
            "over seeds alone (\"seed-only interval\"); a validation split is the one that selected each run's best step (optimistic).")
    return [("Targets", [("text", text), ("table", (header, rows))])]
