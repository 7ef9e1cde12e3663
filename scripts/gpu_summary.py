"""SUMMARY.md of a `make gpu-check` folder (scripts/gpu_check.sh calls it last).

    python scripts/gpu_summary.py OUT

Reads what the check wrote into OUT — ``steps.tsv`` (step, exit status, seconds, log),
``env.json``, ``bench-*.json`` and ``<comparison>/runs/*/result.json`` — and writes
``OUT/SUMMARY.md``: every step with its status, the GPU and software, the benchmark numbers, and
per run the throughput (``timing.tokens_per_second``), the median step time
(``timing.per_step_ms.median``, ms, warm-up steps excluded), ``timing.mfu`` and the GPU telemetry
(``timing.gpu_telemetry``: median utilization %, max memory used GiB, median power W, max
temperature °C, median SM clock MHz). Numbers are copied from those files, never computed
here; a missing file or key shows as "–". Standard library only.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

DASH = "–"


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _get(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _num(v: Any, digits: int = 1) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return DASH if v is None else str(v)
    return f"{v:,.{digits}f}"


def _mfu(v: Any) -> str:
    """``timing.mfu``: a fraction, or a record holding one under ``mfu``."""
    if isinstance(v, dict):
        v = v.get("mfu", v.get("value"))
    return f"{100 * v:.1f}%" if isinstance(v, (int, float)) and not isinstance(v, bool) else DASH


def steps_table(out: Path) -> list[str]:
    path = out / "steps.tsv"
    if not path.is_file():
        return ["No steps.tsv: the check did not run its steps."]
    lines = ["| step | status | seconds | log |", "|---|---|---|---|"]
    with path.open(newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            code = row["exit_status"]
            if code == "skipped":  # GPU_CHECK_DEADLINE had passed: the step never started
                lines.append(f"| {row['step']} | skipped (time limit) | – | – |")
                continue
            status = ("ok" if code == "0" else "**FAILED** (exit 124: time limit)" if code == "124"
                      else f"**FAILED** (exit {code})")
            lines.append(f"| {row['step']} | {status} | {row['seconds']} | [{row['log']}]({row['log']}) |")
    return lines


def environment_lines(out: Path) -> list[str]:
    env = _load(out / "env.json")
    if not isinstance(env, dict):
        return ["env.json missing or unreadable."]
    pkgs = env.get("packages") or {}
    cuda = env.get("cuda") or {}
    probe = env.get("matmul_probe") or {}
    return [
        f"- GPU: {cuda.get('name') or DASH} (driver {cuda.get('driver_version') or DASH}, CUDA {cuda.get('torch_cuda') or DASH}, "
        f"cuDNN {cuda.get('cudnn') or DASH})",
        f"- torch {pkgs.get('torch') or DASH}, transformers {pkgs.get('transformers') or DASH}, "
        f"accelerate {pkgs.get('accelerate') or DASH}, oelm {pkgs.get('oelm') or DASH}; python {env.get('python') or DASH}",
        f"- host {env.get('hostname') or DASH}, {env.get('cpu_count') or DASH} CPUs; matmul probe "
        f"{_num(probe.get('gflops'), 0)} GFLOP/s ({probe.get('dtype') or DASH}, n={probe.get('size') or DASH})",
    ]


def bench_lines(out: Path) -> list[str]:
    paths = sorted(out.glob("bench-*.json"))
    if not paths:
        return ["No benchmark JSON (see the bench steps' logs)."]
    lines = []
    for path in paths:
        data = _load(path)
        lines.append(f"**{path.name}**")
        if not isinstance(data, dict):
            lines += ["", "unreadable", ""]
            continue
        lines += ["", "| key | value |", "|---|---|"]
        for key, value in data.items():
            if isinstance(value, dict) and "median" in value:
                value = f"median {_num(value['median'], 3)}"
            elif isinstance(value, (dict, list)):
                continue  # nested records: in the JSON file
            lines.append(f"| {key} | {_num(value, 3) if isinstance(value, float) else value} |")
        lines.append("")
        lines += runner_lines(data)
    return lines


def runner_lines(data: dict) -> list[str]:
    """`oelm bench`'s runners (engine per method, plain PyTorch loop) and its per-step ratios."""
    runners = data.get("runners")
    if not isinstance(runners, dict) or not runners:
        return []
    lines = ["| runner | ms/step (median) | p10 | p90 | tokens/s | MFU | step MiB | compile s | frozen bit-identical |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in runners.items():
        ms = r.get("per_step_ms") or {}
        lines.append(f"| {name} | {_num(ms.get('median'), 2)} | {_num(ms.get('p10'), 2)} | {_num(ms.get('p90'), 2)} | "
                     f"{_num(r.get('tokens_per_second'), 0)} | {_mfu(r.get('mfu'))} | {_num(r.get('peak_step_memory_mib'), 0)} | "
                     f"{_num(r.get('compile_seconds'), 1)} | {r.get('frozen_bit_identical', DASH)} |")
    lines.append("")
    for method, ratio in (data.get("ratios") or {}).items():
        lines.append(f"{method} / baseline step time: median {_num(ratio.get('median'), 3)} of {ratio.get('n', DASH)} "
                     f"interleaved per-step ratios (p10 {_num(ratio.get('p10'), 3)}, p90 {_num(ratio.get('p90'), 3)}); "
                     f"FLOP theory {_num(ratio.get('theory'), 3)}")
    ep = data.get("engine_plain")
    if isinstance(ep, dict):
        lines.append(f"engine / plain loop (same math): median {_num(ep.get('median'), 3)} of {ep.get('n', DASH)} per-step "
                     f"ratios (p10 {_num(ep.get('p10'), 3)}, p90 {_num(ep.get('p90'), 3)}; best steps {_num(ep.get('best'), 3)})"
                     + _verdict(ep))
    mfu = next((r.get("mfu") for r in runners.values() if isinstance(r.get("mfu"), dict)), None)
    if mfu:
        lines.append(f"MFU against {_num((mfu.get('peak_flops') or 0) / 1e12, 3)} TFLOP/s ({mfu.get('peak_source')}, "
                     f"{mfu.get('peak_precision')}){_peak(mfu)}")
    ops = data.get("operators")
    if isinstance(ops, dict):
        extra = ", ".join(f"{k} +{v}" for k, v in (ops.get("extra") or {}).items()) or "none"
        lines.append(f"operators per step: engine {ops.get('engine', DASH)}, plain {ops.get('plain', DASH)}; engine extra: {extra}")
    lines.append("")
    return lines


def _verdict(ep: dict) -> str:
    """The engine / plain interval and verdict `oelm bench` wrote (none in files older than it)."""
    ci = ep.get("ci95")
    if not ci:
        return ""
    target, v = ep.get("target", 1.03), ep.get("verdict")
    said = {"meets": f"meets <= {target}", "misses": f"misses <= {target}"}.get(v, f"no verdict on <= {target} (the interval spans it)")
    return f"; 95% CI {_num(ci[0], 3)}-{_num(ci[1], 3)}: {said}"


def _peak(m: dict) -> str:
    if m.get("after_gflops") is not None:
        return f"; probed {_num(m.get('before_gflops'), 0)} / {_num(m.get('after_gflops'), 0)} GFLOP/s before / after the steps"
    if m.get("peak_age_s") is not None:
        return (f"; measured {_num(m['peak_age_s'] / 3600, 1)} h earlier at load {_num(m.get('peak_load_1min'), 1)}, "
                f"load now {_num(m.get('load_1min'), 1)}")
    return ""


def matrix_lines(out: Path) -> list[str]:
    """Each comparison's test accuracy per method (mean, 95% CI, seeds) beside the published figure,
    and how its runs shared the GPU (``lanes.json`` of scripts/gpu_lanes.py)."""
    lines = []
    for path in sorted(out.glob("*/comparison.json")):
        c = _load(path)
        if not isinstance(c, dict):
            continue
        ref = c.get("reference") or {}
        lines += [f"**{path.parent.name}** ({c.get('model') or DASH}, {c.get('metric') or DASH}; "
                  f"timing-grade: {_get(c, 'execution', 'timing_grade')})", "",
                  "| method | test mean | 95% CI | seeds | best validation mean | published |", "|---|---|---|---|---|---|"]
        for method, m in (c.get("methods") or {}).items():
            t, ci = m.get("test") or {}, (m.get("test") or {}).get("ci95")
            lines.append(f"| {method} | {_num(t.get('mean'), 2)} | {f'{_num(ci[0], 2)}-{_num(ci[1], 2)}' if ci else DASH} | "
                         f"{t.get('n', 0)} of {len(m.get('seeds') or [])} | {_num(_get(m, 'best_validation', 'mean'), 2)} | "
                         f"{_num(ref.get(method), 2) if ref.get(method) is not None else DASH} |")
        lanes = _load(path.parent / "lanes.json")
        if isinstance(lanes, dict):
            pred = "; ".join(f"{p['lanes']} lane(s) {_num(p['steps_per_s'], 2)} steps/s"
                             for p in _get(lanes, "measurement", "predictions") or [])
            lines += ["", f"Runs side by side: {lanes.get('lanes')} lane(s)" + (f" (measured: {pred})" if pred else "")
                      + "; " + ", ".join(f"{r['name']} exit {r['exit_status']} in {_num(r['seconds'], 0)} s" for r in lanes.get("runs") or [])]
        lines += [f"Warning: {w}" for w in (c.get("warnings") or [])[:6]] + [""]
    return lines or ["No comparison with a comparison.json (part scale writes imdb/)."]


def runs_table(out: Path) -> list[str]:
    results = sorted(out.glob("*/runs/*/result.json"))
    if not results:
        return ["No runs (see the tinystories/sst2 steps' logs)."]
    lines = [
        "| comparison | run | status | best val | test | tokens/s | step ms (median) | MFU | GPU util % (median) | "
        "GPU mem GiB (max) | power W (median) | temp °C (max) | SM MHz (median) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for path in results:
        r = _load(path)
        comparison, run = path.parts[-4], path.parent.name
        if not isinstance(r, dict):
            lines.append(f"| {comparison} | {run} | unreadable result.json |" + " |" * 10)
            continue
        t = r.get("timing") or {}
        tel = t.get("gpu_telemetry") or {}
        if tel.get("available"):
            telemetry = [_num(_get(tel, "gpu_utilization_percent", "median"), 0), _num(_get(tel, "memory_used_gib", "max"), 2),
                         _num(_get(tel, "power_w", "median"), 0), _num(_get(tel, "temperature_c", "max"), 0),
                         _num(_get(tel, "sm_clock_mhz", "median"), 0)]
        else:
            telemetry = [f"n/a ({tel.get('reason')})" if tel.get("reason") else DASH] + [DASH] * 4
        lines.append(
            f"| {comparison} | {run} | {r.get('status', DASH)} | {_get(r, 'performance', 'metric') or ''} "
            f"{_num(_get(r, 'performance', 'best_validation'), 3)} | {_num(_get(r, 'performance', 'test'), 3)} | "
            f"{_num(t.get('tokens_per_second'), 0)} | {_num(_get(t, 'per_step_ms', 'median'), 2)} | {_mfu(t.get('mfu'))} | "
            + " | ".join(telemetry) + " |"
        )
    return lines


def summary(out: Path) -> str:
    parts = [
        f"# GPU check: {out.name}",
        "",
        "Written by `make gpu-check` (scripts/gpu_check.sh); numbers copied from the files next to this one.",
        "",
        "## Steps",
        "",
        *steps_table(out),
        "",
        "## Environment",
        "",
        *environment_lines(out),
        "",
        "## Benchmarks (`oelm bench`; the shape, precision and compile mode are in each file's name)",
        "",
        *bench_lines(out),
        "",
        "## Matrices (test split evaluated once per run)",
        "",
        *matrix_lines(out),
        "",
        "## Runs (`oelm run`, bf16)",
        "",
        *runs_table(out),
        "",
    ]
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/gpu_summary.py OUT", file=sys.stderr)
        return 2
    out = Path(argv[0])
    text = summary(out)
    (out / "SUMMARY.md").write_text(text)
    print(f"wrote {out / 'SUMMARY.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
