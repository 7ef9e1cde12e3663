"""``oelm bench``: step time, throughput, MFU, the OELM-Freeze / baseline step ratio and the
engine's overhead over a plain PyTorch loop doing the same math.

What runs, in one process, on the same batches::

    for step in range(warmup_steps + steps):          # order alternates A B P, P B A, ...
        engine step of each method's model copy       # baseline, oelm_freeze, ...
        plain step of one more baseline copy          # the reference: a hand-written loop, same math

(:mod:`oelm.bench.runners` says what each step does; :mod:`oelm.bench.shapes` lists the shapes,
from the dispatch-bound CPU proxy to GPT-2 124M and a BERT-base-sized classifier.) Every step is
timed by its own :class:`oelm.runtime.timing.StepTimer` (CUDA events on a GPU, ``perf_counter`` on CPU);
the first ``warmup_steps`` are excluded; with compile, the first step of each runner (which
compiles) is reported apart as ``compile_seconds``.

Figures: per runner ``ms/step`` (median, p10, p90), tokens/s, MFU (:func:`oelm.runtime.environment.mfu_record`:
datasheet peak of the GPU, else the measured matmul peak), peak step memory (CUDA: the
allocator's peak during the step above what was allocated when it began); across runners, the
**median of per-step ratios** ``method / baseline`` (each between steps that ran next to each
other, so slow drifts of the machine cancel), and ``engine / plain`` the same way (plus the
ratio of the best steps). ``theory`` is :func:`oelm.architectures.flops.executed_flops_per_token` of the
method over the baseline's. After the steps, one more step of the baseline engine and of the
plain loop runs under ``torch.profiler``: operators per step, and the ones the engine calls more
often, by name (:mod:`oelm.bench.operators`). Every frozen tensor is compared byte for byte with
its value before the first step (``frozen_bit_identical``).
"""

from __future__ import annotations

import dataclasses
import gc
import resource
import time

import torch

from oelm.bench import runners as _runners
from oelm.bench.operators import count_operators, operator_diff
from oelm.bench.shapes import (BENCH_SHAPES, COMPILE_MODES, BenchConfig, BenchShape, build_model, check, family,
                               make_batches, model_config, parse_overrides, resolve_device, token_blocks)

__all__ = ["BENCH_SHAPES", "COMPILE_MODES", "BenchConfig", "BenchShape", "format_bench", "parse_overrides", "run_bench"]


#: Issue 25's target for the engine's overhead: engine / plain loop <= 1.03 per step.
ENGINE_PLAIN_TARGET = 1.03


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free confidence interval for the median of ``values``: the order statistics
    ``x_(k)`` and ``x_(n-k+1)`` with the largest ``k`` such that ``P(Binomial(n, 1/2) < k) <= (1 -
    confidence) / 2`` (the sign-test interval; e.g. Hollander & Wolfe, *Nonparametric Statistical
    Methods*, sec. 3.6). It assumes the values are exchangeable, which interleaving the runners
    step by step is for. None when ``n`` is too small for that confidence (n < 6 at 95%)."""
    from math import comb

    xs = sorted(values)
    n, tail, k, below = len(xs), (1.0 - confidence) / 2.0, 0, 0.0
    for j in range(n + 1):
        p = comb(n, j) / 2.0**n
        if below + p > tail:
            break
        below, k = below + p, j + 1
    return (xs[k - 1], xs[n - k]) if k >= 1 else None


def verdict(interval: tuple[float, float] | None, target: float) -> str:
    """``"meets"`` (the whole interval at or under ``target``), ``"misses"`` (the whole interval
    over it) or ``"undecided"`` (the interval spans it, or there is none): no verdict the
    interval cannot support."""
    if interval is None or interval[0] <= target < interval[1]:
        return "undecided"
    return "meets" if interval[1] <= target else "misses"


def _median_ratio(numerator: list[float], denominator: list[float]) -> dict:
    from oelm.runtime.timing import summarize_step_times

    ratios = [a / b for a, b in zip(numerator, denominator) if b > 0]
    s = summarize_step_times(ratios)
    best = min(numerator) / min(denominator) if numerator and denominator and min(denominator) > 0 else None
    interval = median_interval(ratios)
    return {"median": s["median"], "p10": s["p10"], "p90": s["p90"], "n": s["n"], "best": best,
            "ci95": list(interval) if interval else None}


def _interleaved_peak(device: torch.device, precision: str, before: dict | None) -> dict | None:
    """Where no datasheet peak applies (a CPU): the matmul peak probed before the steps and again
    after them, averaged, so the MFU's reference met the same load as the run (a cached peak may
    come from a loaded moment: issue 33 saw 132 GFLOP/s cached against ~230 quiet)."""
    from oelm.runtime.environment import matmul_column, peak_flops, probe_peak

    if device.type == "cuda" and peak_flops(device, matmul_column(device, precision)) is not None:
        return None
    probe = probe_peak(device, matmul_column(device, precision), budget_seconds=0.5)
    if before is None:
        return probe
    return {**before, "gflops": (before["gflops"] + probe["gflops"]) / 2.0, "before_gflops": before["gflops"],
            "after_gflops": probe["gflops"], "after_load_1min": probe.get("load_1min")}


def _gpt_or_bert(cfg, gpt_name: str, bert_name: str):
    """A field of a GPTConfig, or its BertConfig name."""
    return getattr(cfg, gpt_name) if hasattr(cfg, gpt_name) else getattr(cfg, bert_name)


def _step(r: _runners.Runner, batch: dict[str, torch.Tensor], device: torch.device, autocast, tokens: int) -> torch.Tensor:
    """One timed step of ``r`` (the engine times itself)."""
    if r.kind == "engine":
        return _runners.engine_step(r, batch)
    r.timer.start_step()
    loss = _runners.plain_step(r, batch, device, autocast)
    r.timer.end_step(tokens=tokens, samples=int(batch["input_ids"].shape[0]))
    return loss


def _auto_batch_size(config: BenchConfig, template, names: list[str], device: torch.device, seq_len: int,
                     vocab_size: int, num_labels: int | None, autocast, mode: str | None) -> int:
    """The largest power-of-two batch at which one step of every runner fits (all resident at
    once, as in the bench); probed eagerly, from ``2**19 / seq_len`` sequences down. With CUDA
    graphs (``reduce-overhead``, ``max-autotune``) each runner's graph keeps its activations
    resident, so the eager batch is divided by the number of runners (down to a power of two).
    On a CPU: 1 (host memory does not run out before the machine swaps: nothing to probe)."""
    if device.type != "cuda":
        return 1

    def fits(batch_size: int) -> None:
        rs = _runners.make_runners(template, names, device=device, steps=2, warmup_steps=1, precision=config.precision,
                                   learning_rate=config.learning_rate, seed=config.seed, compile_mode=None)
        ids = torch.randint(0, vocab_size, (batch_size, seq_len))
        batch = make_batches(ids, batch_size, 1, config.seed, num_labels)[0]
        for r in rs:
            _step(r, batch, device, autocast, batch_size * seq_len)
        torch.cuda.synchronize(device)

    found = _runners.find_batch_size(fits, max(1, 2**19 // seq_len))
    if mode in ("reduce-overhead", "max-autotune"):
        found = 1 << max(0, (found // len(names)).bit_length() - 1) if found >= len(names) else 1
    gc.collect()
    torch.cuda.empty_cache()
    return found


def run_bench(config: BenchConfig, progress: bool = True) -> dict:
    """Run the interleaved benchmark; returns every figure as a JSON-serializable dict.

    Keys: ``config`` (the knobs, resolved: ``compile`` true whenever a ``compile_mode`` is),
    ``model`` (family, config dict, ``num_layers``, ``hidden_size``, batch size and whether it was
    found automatically, seq_len, FLOPs per token; ``gpt_config`` for oelm's GPT), ``data``, ``device``, ``environment``
    (:func:`oelm.runtime.environment.capture_environment` without the probe), ``runners`` (name -> ``kind``,
    ``per_step_ms`` {median, mean, p10, p90, n}, ``step_times_ms``, ``tokens_per_second``, ``mfu``,
    ``peak_step_memory_mib`` (CUDA), ``compile_seconds``, ``final_loss``, ``frozen_tensors``,
    ``frozen_bit_identical``), ``ratios`` (method -> median/p10/p90/n/best of per-step
    ``method / baseline``, and ``theory``), ``engine_plain`` (median/p10/p90/n/best of per-step
    engine-baseline / plain, or None without the plain loop), ``engine_overhead_percent``
    (its median minus 1, in %), ``operators`` (:func:`oelm.bench.operators.operator_diff` of one
    profiled step, or None), ``grad_nonfinite``, ``process_max_rss_mib``, ``wall_seconds``.

    Raises:
        ConfigError: an unknown model, method, precision, compile mode, data source or device, or bad sizes.
        DataNotFoundError: ``data="tinystories"`` and the local files are missing.
    """
    from oelm.runtime.environment import capture_environment
    from oelm.architectures.flops import model_flops_per_token
    from oelm.training import autocast_context

    check(config)
    device = resolve_device(config.device)
    cfg, batch_size, seq_len = model_config(config)
    num_labels = cfg.num_labels if family(config) == "bert" else None
    mode = config.compile_mode or ("default" if config.compile else None)
    autocast = autocast_context(device, "bf16" if config.precision == "bf16" else "no")
    template = build_model(cfg, config.seed)
    names = [*config.methods, *(["plain"] if config.plain else [])]
    auto_batch = batch_size is None
    if auto_batch:
        batch_size = _auto_batch_size(config, template, names, device, seq_len, cfg.vocab_size, num_labels, autocast, mode)
    total = config.warmup_steps + config.steps
    blocks, data_source = token_blocks(config, cfg.vocab_size, seq_len, total * batch_size)
    batches = make_batches(blocks, batch_size, total, config.seed, num_labels)
    runners = _runners.make_runners(template, names, device=device, steps=total, warmup_steps=config.warmup_steps,
                                    precision=config.precision, learning_rate=config.learning_rate, seed=config.seed,
                                    compile_mode=mode)
    tokens = batch_size * seq_len
    flops = model_flops_per_token(runners[0].base, seq_len)
    peak_before = _interleaved_peak(device, config.precision, None)  # now, not between steps

    wall = _interleave(runners, batches, device, autocast, tokens, mode, progress)
    peak = _interleaved_peak(device, config.precision, peak_before) if peak_before is not None else None

    by_name = {r.name: r for r in runners}
    result_runners = {r.name: _runner_figures(r, flops, device, config.precision, peak) for r in runners}
    ratios = _method_ratios(config.methods, by_name, seq_len)
    engine_plain = operators = None
    if config.plain:
        engine_plain, operators = _engine_plain(by_name, config.profile, batches[-1], device, autocast, tokens)
    overhead = None if engine_plain is None or engine_plain["median"] is None else (engine_plain["median"] - 1.0) * 100.0
    return {
        "config": {**dataclasses.asdict(config), "methods": list(config.methods), "device": str(device),
                   "compile": mode is not None, "compile_mode": mode},
        "model": {"family": family(config), "config": cfg.to_dict(), "num_layers": _gpt_or_bert(cfg, "num_layers", "num_hidden_layers"),
                  "hidden_size": cfg.hidden_size, "batch_size": batch_size, "auto_batch_size": auto_batch,
                  "seq_len": seq_len, "tokens_per_step": tokens, "flops_per_token": flops,
                  **({"gpt_config": cfg.to_dict()} if family(config) == "gpt" else {})},
        "data": data_source,
        "device": str(device),
        "environment": capture_environment(device, probe=False),
        "runners": result_runners,
        "ratios": ratios,
        "engine_plain": engine_plain,
        "engine_overhead_percent": overhead,
        "operators": operators,
        "grad_nonfinite": any(bool(r.engine.grad_nonfinite if r.engine is not None else r.grad_nonfinite) for r in runners),
        "process_max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "wall_seconds": wall,
    }


def _interleave(runners: list[_runners.Runner], batches: list[dict[str, torch.Tensor]], device: torch.device,
                autocast, tokens: int, mode: str | None, progress: bool) -> float:
    """The timed steps: every batch through every runner, the order alternating (A B P, P B A) so
    no runner always goes first. Records on each runner its step times (its timer), the first
    step's ``compile_seconds`` (with a compile ``mode``), ``step_memory_mib`` (CUDA) and the last
    step's loss. Returns the wall seconds of the whole loop."""
    from tqdm.auto import tqdm

    from oelm.runtime.timing import cuda_synchronize_if_needed

    total = len(batches)
    start = time.perf_counter()
    for i, batch in enumerate(tqdm(batches, desc="oelm bench (interleaved steps)", disable=not progress or None)):
        order = runners if i % 2 == 0 else runners[::-1]  # A B P, P B A: no runner always goes first
        for r in order:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                allocated = torch.cuda.memory_allocated(device)
            first = time.perf_counter()
            loss = _step(r, batch, device, autocast, tokens)
            if i == 0 and mode is not None:
                cuda_synchronize_if_needed(device)
                r.compile_seconds = time.perf_counter() - first
            if device.type == "cuda":
                peak = (torch.cuda.max_memory_allocated(device) - allocated) / 2**20
                r.step_memory_mib = max(r.step_memory_mib or 0.0, peak)
            if i == total - 1:
                r.losses.append(float(loss.detach()))
    for r in runners:
        r.timer.flush()
    return time.perf_counter() - start


def _runner_figures(r: _runners.Runner, flops: float, device: torch.device, precision: str, peak: dict | None) -> dict:
    """One runner's entry of ``result["runners"]`` (see :func:`run_bench`), from its timed steps."""
    from oelm.runtime.environment import mfu_record

    summary = r.timer.summary()
    return {
        "kind": r.kind,
        "per_step_ms": summary["per_step_ms"],
        "step_times_ms": r.timer.measured_step_times_ms,
        "tokens_per_second": summary["tokens_per_second"],
        "mfu": mfu_record(flops, summary["tokens_per_second"], device, precision, peak_record=peak),
        "peak_step_memory_mib": r.step_memory_mib,
        "compile_seconds": r.compile_seconds,
        "final_loss": r.losses[-1] if r.losses else None,
        "frozen_tensors": len(r.frozen_before),
        "frozen_bit_identical": _runners.frozen_bytes(r.base) == r.frozen_before,
    }


def _method_ratios(methods, by_name: dict[str, _runners.Runner], seq_len: int) -> dict:
    """``result["ratios"]``: per method other than the baseline, the median of per-step
    ``method / baseline`` (:func:`_median_ratio`) and ``theory``, the ratio of executed FLOPs per token."""
    from oelm.architectures.flops import executed_flops_per_token

    base_ms = by_name["baseline"].timer.measured_step_times_ms
    base_exec = executed_flops_per_token(by_name["baseline"].base, seq_len)
    return {
        m: {**_median_ratio(by_name[m].timer.measured_step_times_ms, base_ms),
            "theory": executed_flops_per_token(by_name[m].base, seq_len) / base_exec}
        for m in methods if m != "baseline"
    }


def _engine_plain(by_name: dict[str, _runners.Runner], profile: bool, batch: dict[str, torch.Tensor],
                  device: torch.device, autocast, tokens: int) -> tuple[dict, dict | None]:
    """``result["engine_plain"]`` (the baseline engine over the plain loop, per step, with its
    verdict against :data:`ENGINE_PLAIN_TARGET`) and, with ``profile``, ``result["operators"]``:
    one more untimed step of each under ``torch.profiler`` on ``batch`` (else None)."""
    base_ms = by_name["baseline"].timer.measured_step_times_ms
    engine_plain = _median_ratio(base_ms, by_name["plain"].timer.measured_step_times_ms)
    engine_plain.update(target=ENGINE_PLAIN_TARGET, verdict=verdict(engine_plain["ci95"], ENGINE_PLAIN_TARGET))
    operators = None
    if profile:  # after every figure above: these steps are not timed
        counts = {n: count_operators(lambda r=by_name[n]: _step(r, batch, device, autocast, tokens))
                  for n in ("baseline", "plain")}
        operators = operator_diff(counts["baseline"], counts["plain"])
    return engine_plain, operators

# -- output ------------------------------------------------------------------------------------


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ci(ratio: dict) -> str:
    ci = ratio.get("ci95")
    return f"95% CI {ci[0]:.3f}-{ci[1]:.3f}, " if ci else "too few steps for a 95% CI, "


def verdict_line(ep: dict) -> str:
    """The engine / plain verdict against its target, only as far as the interval supports it."""
    target, v = ep.get("target", ENGINE_PLAIN_TARGET), ep.get("verdict")
    if v == "meets":
        return f"meets the <= {target} target (the whole interval is at or under it)"
    if v == "misses":
        return f"misses the <= {target} target (the whole interval is over it)"
    return (f"no verdict on the <= {target} target: the interval spans it (or there is none); "
            f"more steps than {ep.get('n')} (--steps), on a quieter machine, narrow it")


def peak_note(m: dict) -> str:
    """A measured peak's provenance: probed beside the run, or cached with its age and load."""
    if m.get("peak_source") == "measured-interleaved" and m.get("after_gflops") is not None:
        return (f"; probed before {m.get('before_gflops', 0) / 1e3:.3g} and after {m['after_gflops'] / 1e3:.3g} TFLOP/s "
                f"the steps, load {_fmt(m.get('peak_load_1min'), '.1f')} -> {_fmt(m.get('after_load_1min'), '.1f')}")
    if m.get("peak_age_s") is not None:
        return (f"; measured {m['peak_age_s'] / 3600:.1f} h ago at load {_fmt(m.get('peak_load_1min'), '.1f')}, "
                f"load now {_fmt(m.get('load_1min'), '.1f')}")
    return ""


def format_bench(result: dict) -> tuple[list[str], list[list[str]], list[str]]:
    """``(header, rows, lines)`` of the bench table and the summary lines under it."""
    header = ["runner", "ms/step", "p10", "p90", "tokens/s", "MFU %", "step MiB", "compile s", "frozen intact"]
    rows = []
    for name, r in result["runners"].items():
        s = r["per_step_ms"]
        m = r["mfu"]["mfu"]
        frozen = f"yes ({r['frozen_tensors']})" if r["frozen_tensors"] and r["frozen_bit_identical"] else (
            "NO" if r["frozen_tensors"] else "-")
        rows.append(["plain loop" if r["kind"] == "plain" else name, _fmt(s["median"], ".2f"), _fmt(s["p10"], ".2f"),
                     _fmt(s["p90"], ".2f"), _fmt(r["tokens_per_second"], ",.0f"), _fmt(None if m is None else 100 * m, ".2f"),
                     _fmt(r["peak_step_memory_mib"], ",.0f"), _fmt(r["compile_seconds"], ".1f"), frozen])
    lines = []
    for method, ratio in result["ratios"].items():
        lines.append(
            f"{method} / baseline step time: {_fmt(ratio['median'], '.3f')} ({_ci(ratio)}median of per-step ratios over "
            f"{ratio['n']} interleaved steps; p10 {_fmt(ratio['p10'], '.3f')}, p90 {_fmt(ratio['p90'], '.3f')}; "
            f"FLOP theory {ratio['theory']:.3f})"
        )
    ep = result.get("engine_plain")
    if ep is not None:
        lines.append(f"engine / plain loop (same math): {_fmt(ep['median'], '.3f')} ({_ci(ep)}median of {ep['n']} per-step "
                     f"ratios; p10 {_fmt(ep['p10'], '.3f')}, p90 {_fmt(ep['p90'], '.3f')}; best step / best step "
                     f"{_fmt(ep['best'], '.3f')}); {verdict_line(ep)}")
    ops = result.get("operators")
    if ops is not None:
        extra = ", ".join(f"{k} +{v}" for k, v in ops["extra"].items()) or "none"
        fewer = ", ".join(f"{k} {v}" for k, v in ops["fewer"].items()) or "none"
        lines.append(f"operators per step (torch.profiler, aten calls): engine {ops['engine']}, plain {ops['plain']}; "
                     f"engine extra: {extra}; engine fewer: {fewer}")
    any_mfu = next(iter(result["runners"].values()))["mfu"]
    lines.append(f"MFU: {any_mfu['flops_per_token']:.3g} FLOP/token (PaLM 6N + 12LHT) against "
                 f"{_fmt(any_mfu['peak_flops'] and any_mfu['peak_flops'] / 1e12, '.3g')} TFLOP/s "
                 f"({any_mfu['peak_source']}, {any_mfu['peak_precision']}{peak_note(any_mfu)})")
    m = result["model"]
    lines.append(f"batch {m['batch_size']}{' (found automatically)' if m.get('auto_batch_size') else ''}; "
                 f"data: {result['data']}; device: {result['device']}; "
                 f"torch threads: {result['environment']['torch_num_threads']}; "
                 f"load average (1 min): {_fmt((result['environment']['load_average'] or {}).get('1min'), '.2f')}")
    return header, rows, lines
