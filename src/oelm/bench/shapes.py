"""What ``oelm bench`` measures: the named shapes, the knobs, the model and the batches.

Shapes (:data:`BENCH_SHAPES`):

* ``cpu-bench`` — issue 12's CPU target: oelm's GPT, 4 × 256, 4 heads, FFN 1024, block 128,
  batch 8, a BPE-4096 vocabulary.
* ``dispatch-proxy`` — a step dominated by per-operator dispatch: 2 × 64, 2 heads, FFN 256,
  vocabulary 256, batch 2 × 32 tokens. Each matmul is microseconds, so the step costs what its
  operator calls cost — the regime of a launch-bound GPU step, measurable on a CPU.
* ``gpt2-124m`` — GPT-2 small: 12 × 768, 12 heads, FFN 3072, 1,024 tokens, vocabulary 50,304
  (50,257 padded to a multiple of 64), tied embeddings.
* ``bert-base-cls`` — a BERT-base-sized encoder (Hugging Face ``BertForSequenceClassification``
  built from a config, random weights): 12 × 768, 12 heads, FFN 3072, vocabulary 30,522,
  sequences of 128 tokens, 2 labels.
* ``minilm-cls`` — the demo's model shape (all-MiniLM-L6-v2, configs/quickstart.yaml) with random
  weights, so no weights need to travel: a BERT encoder 6 × 384, 12 heads, FFN 1536, vocabulary
  30,522, 64 tokens (SST-2 sentences are shorter), batch 32 as the demo trains, 2 labels.

The batch of the two large shapes is found automatically when not given (``batch_size=None``):
the largest power of two that fits, see :func:`oelm.bench.runners.find_batch_size`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from oelm.errors import ConfigError, DataNotFoundError

__all__ = ["BENCH_SHAPES", "COMPILE_MODES", "BenchConfig", "BenchShape", "parse_overrides"]

#: ``--compile-mode`` values: torch.compile's modes (``reduce-overhead`` = CUDA graphs).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class BenchShape:
    """A named benchmark shape: a model family and preset, overrides, and the batch that goes with it.

    ``family`` is ``"gpt"`` (oelm's decoder, causal LM on token blocks) or ``"bert"`` (a Hugging
    Face BERT encoder classifying sequences). ``batch_size`` None: found automatically (the
    largest that fits on a GPU; 1 on a CPU).
    """

    preset: str
    overrides: dict[str, Any]
    batch_size: int | None
    seq_len: int
    family: str = "gpt"


BENCH_SHAPES: dict[str, BenchShape] = {
    "cpu-bench": BenchShape(
        "gpt-tiny",
        {"num_layers": 4, "hidden_size": 256, "num_heads": 4, "intermediate_size": 1024, "context_length": 128,
         "vocab_size": 4096},
        batch_size=8, seq_len=128,
    ),
    "dispatch-proxy": BenchShape(
        "gpt-tiny",
        {"num_layers": 2, "hidden_size": 64, "num_heads": 2, "intermediate_size": 256, "context_length": 32,
         "vocab_size": 256},
        batch_size=2, seq_len=32,
    ),
    "gpt2-124m": BenchShape(
        "gpt-tiny",
        {"num_layers": 12, "hidden_size": 768, "num_heads": 12, "intermediate_size": 3072, "context_length": 1024,
         "vocab_size": 50304, "tie_word_embeddings": True},
        batch_size=None, seq_len=1024,
    ),
    "bert-base-cls": BenchShape(
        "bert-base",
        {"num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072,
         "vocab_size": 30522, "max_position_embeddings": 512, "num_labels": 2},
        batch_size=None, seq_len=128, family="bert",
    ),
    "minilm-cls": BenchShape(
        "minilm",
        {"num_hidden_layers": 6, "hidden_size": 384, "num_attention_heads": 12, "intermediate_size": 1536,
         "vocab_size": 30522, "max_position_embeddings": 512, "num_labels": 2},
        batch_size=32, seq_len=64, family="bert",
    ),
}


@dataclass
class BenchConfig:
    """Knobs of :func:`oelm.bench.run_bench`. ``None`` sizes come from the named shape / preset."""

    model: str = "cpu-bench"  # a BENCH_SHAPES name or an oelm GPT preset (gpt-tiny, gpt-medium-512)
    overrides: dict[str, Any] = field(default_factory=dict)  # model config fields, e.g. {"num_layers": 2}
    batch_size: int | None = None  # default: the shape's (auto for the real shapes), else 8
    seq_len: int | None = None  # tokens per block; default: the shape's, else the context length
    vocab_size: int | None = None  # default: the shape's / preset's
    steps: int = 50  # timed steps per runner
    warmup_steps: int = 5  # untimed steps per runner before them
    methods: tuple[str, ...] = ("baseline", "oelm_freeze")
    device: str = "auto"  # cpu | cuda | auto
    precision: str = "fp32"  # fp32 | bf16 (autocast)
    compile: bool = False  # torch.compile every model copy
    compile_mode: str | None = None  # a COMPILE_MODES entry (implies compile); None: torch's default
    data: str = "auto"  # auto | tinystories | random
    seed: int = 0
    learning_rate: float = 1e-4
    plain: bool = True  # also time the plain PyTorch loop (same math as the engine)
    profile: bool = True  # count operators per step (torch.profiler) for the baseline engine and the plain loop


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["num_layers=4", "model.gpt_overrides.dropout=0.1"]`` -> ``{"num_layers": 4, "dropout": 0.1}``.

    The syntax of ``oelm run``'s overrides (values read as YAML). A key is a model config field,
    bare or dotted as in an experiment YAML (``model.gpt_overrides.<field>``, or ``gpt.<field>``).

    Raises:
        ConfigError: an item without ``=``, or a dotted key that names no model config field.
    """
    import yaml

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"bench overrides (and --set) expect key=value, got {item!r}")
        for prefix in ("model.gpt_overrides.", "gpt_overrides.", "gpt."):
            if key.startswith(prefix):
                key = key[len(prefix):]
                break
        if "." in key:
            raise ConfigError(f"bench override {key!r}: dotted keys must be model.gpt_overrides.<field> "
                              "(or a bare model config field, e.g. num_layers=2)")
        out[key] = yaml.safe_load(value)
    return out


def resolve_device(name: str) -> torch.device:
    """``cpu`` | ``cuda[:i]`` | ``auto`` -> a device. Raises ConfigError for others, or CUDA without a GPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise ConfigError(f"unknown --device {name!r}; use cpu, cuda or auto")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {name} asked for, but torch sees no CUDA GPU; use --device cpu or auto")
    return torch.device(name)


def check(config: BenchConfig) -> None:
    """Raise ConfigError naming the first bad knob of ``config``."""
    from oelm.method.config import METHODS
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
    if config.compile_mode is not None and config.compile_mode not in COMPILE_MODES:
        raise ConfigError(f"unknown --compile-mode {config.compile_mode!r}; use {', '.join(COMPILE_MODES)}")
    if config.data not in ("auto", "tinystories", "random"):
        raise ConfigError(f"unknown --data {config.data!r}; use auto, tinystories or random")
    for name in ("steps", "batch_size", "seq_len", "vocab_size"):
        value = getattr(config, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if config.warmup_steps < 1:
        raise ConfigError(f"--warmup-steps must be >= 1 (the first step compiles and warms caches), got {config.warmup_steps}")


def family(config: BenchConfig) -> str:
    shape = BENCH_SHAPES.get(config.model)
    return shape.family if shape else "gpt"


def model_config(config: BenchConfig) -> tuple[Any, int | None, int]:
    """``(model config, batch size or None = auto, block length)`` of the benchmark.

    The model config is a :class:`oelm.models.gpt.GPTConfig` (family ``gpt``) or a
    ``transformers.BertConfig`` (family ``bert``).

    Raises:
        ConfigError: an unknown override key, or a block longer than a BERT's positions.
    """
    shape = BENCH_SHAPES.get(config.model)
    overrides = dict(shape.overrides) if shape else {}
    overrides.update(config.overrides)
    if config.vocab_size is not None:
        overrides["vocab_size"] = config.vocab_size
    batch = config.batch_size or (shape.batch_size if shape else 8)
    if family(config) == "bert":
        from transformers import BertConfig

        unknown = sorted(set(overrides) - set(BertConfig().to_dict()) - {"num_labels"})
        if unknown:
            raise ConfigError(f"unknown BertConfig override key(s) {', '.join(map(repr, unknown))} for {config.model}")
        bert = BertConfig(**overrides)
        seq_len = config.seq_len or shape.seq_len
        if seq_len > bert.max_position_embeddings:
            raise ConfigError(f"--seq-len {seq_len} exceeds max_position_embeddings={bert.max_position_embeddings} "
                              f"of {config.model}; lower it or set max_position_embeddings={seq_len}")
        return bert, batch, seq_len
    from oelm.models.gpt import gpt_config

    gpt = gpt_config(shape.preset if shape else config.model, **overrides)
    seq_len = config.seq_len or (shape.seq_len if shape else gpt.context_length)
    if seq_len > gpt.context_length:
        gpt = dataclasses.replace(gpt, context_length=seq_len)
    return gpt, batch, seq_len


def build_model(cfg: Any, seed: int) -> nn.Module:
    """A freshly initialized model of ``cfg``, seeded: a GPTConfig gives oelm's ``GPTForCausalLM``,
    a ``BertConfig`` Hugging Face's ``BertForSequenceClassification`` (random weights, no download)."""
    torch.manual_seed(seed)
    from oelm.models.gpt import GPTConfig, GPTForCausalLM

    if isinstance(cfg, GPTConfig):
        return GPTForCausalLM(cfg)
    from transformers import BertForSequenceClassification

    return BertForSequenceClassification(cfg)


def _cache_dir() -> Path:
    return Path(os.environ.get("OELM_CACHE_DIR", Path.home() / ".cache" / "oelm"))


def token_blocks(config: BenchConfig, vocab_size: int, seq_len: int, n_needed: int) -> tuple[torch.Tensor, str]:
    """``[n_blocks, seq_len]`` long token blocks and a description of where they came from.

    ``--data tinystories`` (or ``auto`` with a vocabulary of at least 257 ids and an LM shape)
    packs the local TinyStories train stories (``$OELM_DATA_DIR``), tokenized with a byte-level
    BPE of the model's vocabulary size trained on them (``bpe-<V>``, cached) when ``V < 50257``,
    else GPT-2's tokenizer; otherwise uniform random ids.

    Raises:
        DataNotFoundError: ``--data tinystories`` without the local files.
        ConfigError: ``--data tinystories`` with a vocabulary under 257 ids or a BERT shape.
    """
    if config.data == "tinystories" and (vocab_size < 257 or family(config) != "gpt"):
        raise ConfigError(f"--data tinystories needs an LM shape with a vocabulary of at least 257 ids "
                          f"(byte-level BPE); {config.model} has {vocab_size}: use --data random")
    if family(config) == "gpt" and (config.data == "tinystories" or (config.data == "auto" and vocab_size >= 257)):
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


def make_batches(blocks: torch.Tensor, batch_size: int, count: int, seed: int, num_labels: int | None = None
                 ) -> list[dict[str, torch.Tensor]]:
    """``count`` batches of ``batch_size`` blocks in a seeded order (cycling if there are too few).

    LM batches: ``{input_ids, labels}`` (labels = the ids, shifted in the model), each ``[B, T]``.
    Classification (``num_labels`` given): ``{input_ids [B, T], attention_mask [B, T] ones,
    labels [B] uniform in [0, num_labels)}``.
    """
    generator = torch.Generator().manual_seed(seed)
    order = torch.cat([torch.randperm(len(blocks), generator=generator)
                       for _ in range(-(-count * batch_size // len(blocks)))])
    out = []
    for i in range(count):
        ids = blocks[order[i * batch_size:(i + 1) * batch_size]]  # (B, T)
        if num_labels is None:
            out.append({"input_ids": ids, "labels": ids})
        else:
            out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                        "labels": torch.randint(0, num_labels, (len(ids),), generator=generator)})
    return out
