"""``oelm bench``: step time, throughput, MFU and the OELM-Freeze / baseline step ratio.

What runs, in one process, on the same batches::

    for step in range(warmup_steps + steps):          # order alternates A B P, P B A, ...
        engine step of each method's model copy       # baseline, oelm_freeze, ...
        plain step of one more baseline copy          # the reference: a minimal PyTorch loop

* An **engine step** is :func:`oelm.train.optimizer_step` itself, on an engine built by
  :func:`oelm.train.build_engine` (the code ``oelm run`` trains with): batch to device, forward
  under autocast, backward, gradient clipping (norm 1.0, ``TrainingConfig`` default), the
  non-finite gradient check, ``optimizer.step()``, LR scheduler step,
  ``zero_grad(set_to_none=True)``; optimizer from :func:`oelm.train.build_optimizer`.
* The **plain step** is ``loss = model(**batch).loss; loss.backward(); opt.step();
  opt.zero_grad()`` with AdamW over the ``requires_grad`` parameters (same fused / foreach
  implementation as the engine's, so the comparison is about the loop, not the optimizer
  kernel; under autocast when the precision is bf16).
* Every step is timed by its own :class:`oelm.timing.StepTimer` (CUDA events on a GPU,
  ``perf_counter`` on CPU). The first ``warmup_steps`` steps (``torch.compile``, allocator,
  kernel selection) are excluded; with ``--compile`` the first step of each model (which
  compiles) is reported separately as ``compile_seconds``.

Figures: per runner ``ms/step`` (median, p10, p90), tokens/s, MFU (:func:`oelm.environment.mfu_record`:
datasheet peak of the GPU, else the measured matmul peak), peak step memory (CUDA only: the
allocator's peak during the step above what was allocated when it began); across runners,
the **median of per-step ratios** ``method / baseline`` (each ratio taken between steps that
ran next to each other, so slow drifts of the machine cancel) and the engine overhead
``median(engine baseline / plain) - 1`` in percent. ``theory_ratio`` is
:func:`oelm.flops.executed_flops_per_token` of the method over that of the baseline (only the
skipped weight gradients of frozen tensors; the smaller optimizer comes on top).

After the steps, every frozen tensor of every method copy is compared byte for byte with its
value before the first step (``frozen_bit_identical``).

Data: ``--data tinystories`` packs the local TinyStories train stories (``$OELM_DATA_DIR``) into
blocks, tokenized with a byte-level BPE of the model's vocabulary size trained on them
(``bpe-<V>``, cached) when ``V < 50257``, else GPT-2's tokenizer; ``--data random`` draws
uniform token ids; ``auto`` (default) takes TinyStories when it is there (and the vocabulary
has at least 257 ids).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from oelm.errors import ConfigError, DataNotFoundError

__all__ = ["BENCH_SHAPES", "BenchConfig", "BenchShape", "format_bench", "run_bench"]


@dataclass(frozen=True)
class BenchShape:
    """A named benchmark shape: an oelm GPT preset, overrides, and the batch that goes with it."""

    preset: str
    overrides: dict[str, Any]
    batch_size: int
    seq_len: int


BENCH_SHAPES: dict[str, BenchShape] = {
    # Issue 12's CPU target: oelm's GPT, 4 layers, hidden 256, 4 heads, FFN 1024, block 128,
    # batch 8, a BPE-4096 vocabulary.
    "cpu-bench": BenchShape(
        "gpt-tiny",
        {"num_layers": 4, "hidden_size": 256, "num_heads": 4, "intermediate_size": 1024, "context_length": 128,
         "vocab_size": 4096},
        batch_size=8, seq_len=128,
    ),
}


@dataclass
class BenchConfig:
    """Knobs of :func:`run_bench`. ``None`` sizes come from the named shape / preset."""

    model: str = "cpu-bench"  # a BENCH_SHAPES name or an oelm GPT preset (gpt-tiny, gpt-medium-512)
    overrides: dict[str, Any] = field(default_factory=dict)  # GPTConfig fields, e.g. {"num_layers": 2}
    batch_size: int | None = None  # default: the shape's, else 8
    seq_len: int | None = None  # tokens per block; default: the shape's, else the context length
    vocab_size: int | None = None  # default: the shape's / preset's
    steps: int = 50  # timed steps per runner
    warmup_steps: int = 5  # untimed steps per runner before them
    methods: tuple[str, ...] = ("baseline", "oelm_freeze")
    device: str = "auto"  # cpu | cuda | auto
    precision: str = "fp32"  # fp32 | bf16 (autocast)
    compile: bool = False  # torch.compile every model copy
    data: str = "auto"  # auto | tinystories | random
    seed: int = 0
    learning_rate: float = 1e-4
    plain: bool = True  # also time the plain PyTorch loop


# -- set-up ------------------------------------------------------------------------------------


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise ConfigError(f"unknown --device {name!r}; use cpu, cuda or auto")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {name} asked for, but torch sees no CUDA GPU; use --device cpu or auto")
    return torch.device(name)


def _check(config: BenchConfig) -> None:
    from oelm.method import METHODS
    from oelm.models.gpt import PRESETS

    if config.model not in BENCH_SHAPES and config.model not in PRESETS:
        valid = ", ".join([*BENCH_SHAPES, *PRESETS])
        raise ConfigError(f"unknown bench model {config.model!r}; valid: {valid}")
    unknown = [m for m in config.methods if m not in METHODS]
    if unknown:
        raise ConfigError(f"unknown method(s) {', '.join(unknown)}; named methods: {', '.join(METHODS)}")
    if "baseline" not in config.methods:
        raise ConfigError("--methods must include baseline (the ratios and the engine overhead are relative to it)")
    if len(set(config.methods)) != len(config.methods):
        raise ConfigError(f"--methods lists a method twice: {','.join(config.methods)}")
    if config.precision not in ("fp32", "bf16"):
        raise ConfigError(f"unknown --precision {config.precision!r}; use fp32 or bf16")
    if config.data not in ("auto", "tinystories", "random"):
        raise ConfigError(f"unknown --data {config.data!r}; use auto, tinystories or random")
    for name in ("steps", "batch_size", "seq_len", "vocab_size"):
        value = getattr(config, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if config.warmup_steps < 1:
        raise ConfigError(f"--warmup-steps must be >= 1 (the first step compiles and warms caches), got {config.warmup_steps}")


def _gpt_config(config: BenchConfig):
    """The GPTConfig, batch size and block length of the benchmark."""
    from oelm.models.gpt import gpt_config

    shape = BENCH_SHAPES.get(config.model)
    preset = shape.preset if shape else config.model
    overrides = dict(shape.overrides) if shape else {}
    overrides.update(config.overrides)
    if config.vocab_size is not None:
        overrides["vocab_size"] = config.vocab_size
    gpt = gpt_config(preset, **overrides)
    batch = config.batch_size or (shape.batch_size if shape else 8)
    seq_len = config.seq_len or (shape.seq_len if shape else gpt.context_length)
    if seq_len > gpt.context_length:
        gpt = dataclasses.replace(gpt, context_length=seq_len)
    return gpt, batch, seq_len


def _cache_dir() -> Path:
    return Path(os.environ.get("OELM_CACHE_DIR", Path.home() / ".cache" / "oelm"))


def _token_blocks(config: BenchConfig, vocab_size: int, seq_len: int, n_needed: int) -> tuple[torch.Tensor, str]:
    """``[n_blocks, seq_len]`` long token blocks and a description of where they came from.

    Raises:
        DataNotFoundError: ``--data tinystories`` without the local files.
    """
    if config.data == "tinystories" and vocab_size < 257:
        raise ConfigError(f"--data tinystories needs a vocabulary of at least 257 ids (byte-level BPE), got {vocab_size}")
    if config.data == "tinystories" or (config.data == "auto" and vocab_size >= 257):
        from oelm.data.lm import get_lm_tokenizer, load_documents, pack_documents

        try:
            docs = load_documents("tinystories", "train")
        except DataNotFoundError:
            if config.data == "tinystories":
                raise
        else:
            spec = "gpt2" if vocab_size >= 50257 else f"bpe-{vocab_size}"
            tokenizer = get_lm_tokenizer(spec, docs, _cache_dir() / "tokenizers")
            blocks = pack_documents(docs, tokenizer, seq_len, _cache_dir() / "tokens")
            if len(blocks) and int(blocks.max()) < vocab_size:
                return blocks, f"tinystories train, {spec} tokenizer, {len(blocks)} blocks of {seq_len}"
    generator = torch.Generator().manual_seed(config.seed)
    return torch.randint(0, vocab_size, (n_needed, seq_len), generator=generator), "random token ids"


def _batches(blocks: torch.Tensor, batch_size: int, count: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """``count`` batches of ``batch_size`` blocks in a seeded order (cycling if there are too few)."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.cat([torch.randperm(len(blocks), generator=generator)
                       for _ in range(-(-count * batch_size // len(blocks)))])
    out = []
    for i in range(count):
        ids = blocks[order[i * batch_size:(i + 1) * batch_size]]  # (B, T)
        out.append({"input_ids": ids, "labels": ids})
    return out


# -- the two steps -----------------------------------------------------------------------------


@dataclass
class _Runner:
    """One model copy with its optimizer, step kind and timer."""

    name: str
    kind: str  # "engine" | "plain"
    model: nn.Module  # what is called (compiled or not)
    base: nn.Module  # the nn.Module (for FLOPs, frozen tensors)
    optimizer: torch.optim.Optimizer
    scheduler: Any
    timer: Any
    frozen_before: dict[str, bytes]
    step_memory_mib: float | None = None
    compile_seconds: float | None = None
    losses: list[float] = field(default_factory=list)
    engine: Any = None  # oelm.train's engine (kind "engine")
    state: Any = None  # its TrainState


def _engine_step(r: _Runner, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """oelm's training step: :func:`oelm.train.optimizer_step` itself (forward, backward,
    clipping, the NaN check's accumulator, AdamW, schedule), timed by the engine's own timer."""
    from oelm.train import optimizer_step

    return optimizer_step(r.engine, r.state, batch, iter(()))


def _plain_step(r: _Runner, batch: dict[str, torch.Tensor], device: torch.device, autocast) -> torch.Tensor:
    """The reference: the minimal PyTorch training step."""
    x = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    with autocast():
        loss = r.model(**x).loss
    loss.backward()
    r.optimizer.step()
    r.optimizer.zero_grad()
    return loss


def _frozen_bytes(model: nn.Module) -> dict[str, bytes]:
    return {n: p.detach().cpu().contiguous().numpy().tobytes() for n, p in model.named_parameters() if not p.requires_grad}


def _make_runners(config: BenchConfig, gpt, device: torch.device, batches: list[dict[str, torch.Tensor]]) -> list[_Runner]:
    """One runner per method (the engine: :func:`oelm.train.build_engine` over a copy of one
    initial model, the method applied) and the plain loop's runner (baseline weights, AdamW with
    the engine's kernel choice, no schedule, no clipping)."""
    from torch.utils.data import DataLoader

    from oelm.config import TrainingConfig
    from oelm.method import apply_oelm
    from oelm.models.gpt import GPTForCausalLM
    from oelm.timing import StepTimer
    from oelm.train import TrainState, build_engine, build_optimizer

    torch.manual_seed(config.seed)
    template = GPTForCausalLM(gpt)
    training = TrainingConfig(
        learning_rate=config.learning_rate, max_steps=len(batches), timing_warmup_steps=config.warmup_steps,
        timing_warmup_passes=0, compile=config.compile, tensorboard=False, progress_bar=False,
        mixed_precision="bf16" if config.precision == "bf16" else "no",
    )
    # The engine's loader only sizes the schedule: the bench feeds the same batches to every runner.
    sizing = DataLoader(list(range(len(batches))), batch_size=1)
    runners = []
    for name in [*config.methods, *(["plain"] if config.plain else [])]:
        base = copy.deepcopy(template)
        apply_oelm(base, "baseline" if name == "plain" else name, seed=config.seed)
        base.to(device).train()
        if name == "plain":
            engine_opt = build_optimizer(base, config.learning_rate, training)
            impl = {k: engine_opt.defaults.get(k) for k in ("fused", "foreach")}
            optimizer = torch.optim.AdamW([p for p in base.parameters() if p.requires_grad], lr=config.learning_rate,
                                          **{k: v for k, v in impl.items() if v is not None})
            model = torch.compile(base) if config.compile else base
            runners.append(_Runner(name, "plain", model, base, optimizer, None,
                                   StepTimer(device, warmup_steps=config.warmup_steps), _frozen_bytes(base)))
            continue
        engine = build_engine(base, sizing, config=training, learning_rate=config.learning_rate)
        runners.append(_Runner(name, "engine", engine.model, base, engine.optimizer, engine.scheduler, engine.timer,
                               _frozen_bytes(base), engine=engine, state=TrainState()))
    return runners


# -- the benchmark -----------------------------------------------------------------------------


def _median_ratio(numerator: list[float], denominator: list[float]) -> dict:
    from oelm.timing import summarize_step_times

    ratios = [a / b for a, b in zip(numerator, denominator) if b > 0]
    s = summarize_step_times(ratios)
    return {"median": s["median"], "p10": s["p10"], "p90": s["p90"], "n": s["n"]}


def run_bench(config: BenchConfig, progress: bool = True) -> dict:
    """Run the interleaved benchmark; returns every figure as a JSON-serializable dict.

    Keys: ``config`` (the knobs, resolved), ``model`` (GPTConfig dict, batch size, seq_len,
    FLOPs per token), ``data``, ``device``, ``environment`` (:func:`oelm.environment.capture_environment`
    without the probe), ``runners`` (name -> ``kind``, ``per_step_ms`` {median, mean, p10, p90, n},
    ``step_times_ms`` (timed steps), ``tokens_per_second``, ``mfu`` (:func:`mfu_record`),
    ``peak_step_memory_mib`` (CUDA) , ``compile_seconds``, ``final_loss``,
    ``frozen_tensors``, ``frozen_bit_identical``), ``ratios`` (method -> median/p10/p90/n of
    per-step ``method / baseline``, and ``theory``), ``engine_overhead_percent`` (median of
    per-step ``engine baseline / plain`` minus 1, in %, or None without the plain loop),
    ``process_max_rss_mib``, ``wall_seconds``.

    Raises:
        ConfigError: an unknown model, method, precision, data source or device, or bad sizes.
        DataNotFoundError: ``data="tinystories"`` and the local files are missing.
    """
    from oelm.environment import capture_environment, mfu_record
    from oelm.flops import executed_flops_per_token, model_flops_per_token
    from oelm.train import autocast_context

    _check(config)
    device = _resolve_device(config.device)
    gpt, batch_size, seq_len = _gpt_config(config)
    total = config.warmup_steps + config.steps
    blocks, data_source = _token_blocks(config, gpt.vocab_size, seq_len, total * batch_size)
    batches = _batches(blocks, batch_size, total, config.seed)
    runners = _make_runners(config, gpt, device, batches)
    autocast = autocast_context(device, "bf16" if config.precision == "bf16" else "no")
    tokens = batch_size * seq_len
    flops = model_flops_per_token(runners[0].base, seq_len)
    mfu_record(flops, None, device, config.precision)  # probe the peak (if needed) now, not between steps

    from tqdm.auto import tqdm

    start = time.perf_counter()
    for i, batch in enumerate(tqdm(batches, desc="oelm bench (interleaved steps)", disable=not progress or None)):
        order = runners if i % 2 == 0 else runners[::-1]  # A B P, P B A: no runner always goes first
        for r in order:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                allocated = torch.cuda.memory_allocated(device)
            first = time.perf_counter()
            if r.kind == "engine":
                loss = _engine_step(r, batch)  # timed inside, by the engine's own timer
            else:
                r.timer.start_step()
                loss = _plain_step(r, batch, device, autocast)
                r.timer.end_step(tokens=tokens, samples=batch_size)
            if i == 0 and config.compile:
                from oelm.timing import cuda_synchronize_if_needed

                cuda_synchronize_if_needed(device)
                r.compile_seconds = time.perf_counter() - first
            if device.type == "cuda":
                peak = (torch.cuda.max_memory_allocated(device) - allocated) / 2**20
                r.step_memory_mib = max(r.step_memory_mib or 0.0, peak)
            if i == total - 1:
                r.losses.append(float(loss.detach()))
    for r in runners:
        r.timer.flush()
    wall = time.perf_counter() - start

    by_name = {r.name: r for r in runners}
    base_ms = by_name["baseline"].timer.measured_step_times_ms
    result_runners = {}
    for r in runners:
        summary = r.timer.summary()
        frozen_after = _frozen_bytes(r.base)
        result_runners[r.name] = {
            "kind": r.kind,
            "per_step_ms": summary["per_step_ms"],
            "step_times_ms": r.timer.measured_step_times_ms,
            "tokens_per_second": summary["tokens_per_second"],
            "mfu": mfu_record(flops, summary["tokens_per_second"], device, config.precision),
            "peak_step_memory_mib": r.step_memory_mib,
            "compile_seconds": r.compile_seconds,
            "final_loss": r.losses[-1] if r.losses else None,
            "frozen_tensors": len(r.frozen_before),
            "frozen_bit_identical": frozen_after == r.frozen_before,
        }
    base_exec = executed_flops_per_token(by_name["baseline"].base, seq_len)
    ratios = {
        m: {**_median_ratio(by_name[m].timer.measured_step_times_ms, base_ms),
            "theory": executed_flops_per_token(by_name[m].base, seq_len) / base_exec}
        for m in config.methods if m != "baseline"
    }
    overhead = None
    if config.plain:
        plain = _median_ratio(base_ms, by_name["plain"].timer.measured_step_times_ms)
        overhead = (plain["median"] - 1.0) * 100.0 if plain["median"] is not None else None
    return {
        "config": {**dataclasses.asdict(config), "methods": list(config.methods), "device": str(device)},
        "model": {"gpt_config": gpt.to_dict(), "batch_size": batch_size, "seq_len": seq_len,
                  "tokens_per_step": tokens, "flops_per_token": flops},
        "data": data_source,
        "device": str(device),
        "environment": capture_environment(device, probe=False),
        "runners": result_runners,
        "ratios": ratios,
        "engine_overhead_percent": overhead,
        "grad_nonfinite": any(bool(r.engine.grad_nonfinite) for r in runners if r.engine is not None),
        "process_max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "wall_seconds": wall,
    }


# -- output ------------------------------------------------------------------------------------


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_bench(result: dict) -> tuple[list[str], list[list[str]], list[str]]:
    """``(header, rows, lines)`` of the bench table and the summary lines under it."""
    header = ["runner", "ms/step", "p10", "p90", "tokens/s", "MFU %", "step MiB", "compile s", "frozen intact"]
    rows = []
    for name, r in result["runners"].items():
        s = r["per_step_ms"]
        m = r["mfu"]["mfu"]
        frozen = f"yes ({r['frozen_tensors']})" if r["frozen_tensors"] and r["frozen_bit_identical"] else (
            "NO" if r["frozen_tensors"] else "-")
        rows.append(["plain loop" if r["kind"] == "plain" else name, _fmt(s["median"], ".1f"), _fmt(s["p10"], ".1f"), _fmt(s["p90"], ".1f"),
                     _fmt(r["tokens_per_second"], ",.0f"), _fmt(None if m is None else 100 * m, ".1f"),
                     _fmt(r["peak_step_memory_mib"], ",.0f"), _fmt(r["compile_seconds"], ".1f"), frozen])
    lines = []
    for method, ratio in result["ratios"].items():
        lines.append(
            f"{method} / baseline step time: {_fmt(ratio['median'], '.3f')} (median of per-step ratios over "
            f"{ratio['n']} interleaved steps; p10 {_fmt(ratio['p10'], '.3f')}, p90 {_fmt(ratio['p90'], '.3f')}; "
            f"FLOP theory {ratio['theory']:.3f})"
        )
    if result["engine_overhead_percent"] is not None:
        lines.append(f"engine overhead vs plain PyTorch loop: {result['engine_overhead_percent']:+.1f}% "
                     "(median of per-step engine-baseline / plain ratios)")
    any_mfu = next(iter(result["runners"].values()))["mfu"]
    lines.append(f"MFU: {any_mfu['flops_per_token']:.3g} FLOP/token (PaLM 6N + 12LHT) against "
                 f"{_fmt(any_mfu['peak_flops'] and any_mfu['peak_flops'] / 1e12, '.3g')} TFLOP/s "
                 f"({any_mfu['peak_source']}, {any_mfu['peak_precision']})")
    lines.append(f"data: {result['data']}; device: {result['device']}; "
                 f"torch threads: {result['environment']['torch_num_threads']}; "
                 f"load average (1 min): {_fmt((result['environment']['load_average'] or {}).get('1min'), '.2f')}")
    return header, rows, lines
