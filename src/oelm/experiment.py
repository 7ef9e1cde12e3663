"""The comparison protocol: run every (method, seed) of an experiment, then compare.

One experiment = one task, one model source, several methods, several seeds::

    outputs/<name>/
      config.yaml                      the resolved config
      runs/<method>-seed<k>/result.json, metrics.jsonl, tensorboard/, checkpoint/
      comparison.json                  each method against baseline
      report.md                        the comparison table

Rules kept here:
- the data (subsets, tokenization) is built once and shared by every run, so methods see
  exactly the same examples; each run's model is built fresh from its seed;
- runs are interleaved in a balanced order (seed 0: A B C, seed 1: C B A, ...) so slow drift of
  a shared machine hits every method alike;
- a finished run (its ``result.json`` exists) is never recomputed or overwritten;
- selection uses validation only; a test split, if configured, is evaluated once per run with
  the best-on-validation weights;
- every result file is written atomically.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import yaml
from torch.utils.data import DataLoader

from oelm.config import ExperimentConfig, MethodEntry
from oelm.errors import ConfigError, OELMError
from oelm.io import read_json, write_json_atomic, write_text_atomic
from oelm.method import apply_oelm
from oelm.report import compare_results, comparison_rows, render_report, write_comparison  # noqa: F401 (re-exported)

__all__ = [
    "PreparedData",
    "prepare_data",
    "build_model",
    "run_order",
    "run_experiment",
    "compare_results",
    "render_report",
    "write_comparison",
]


@dataclass
class PreparedData:
    """Tokenized splits shared by every run of an experiment."""

    metric: str  # "accuracy" | "perplexity"
    task_type: str  # "classification" | "language_modeling"
    tokenizer: Any
    train: torch.utils.data.Dataset
    validation: torch.utils.data.Dataset
    test: torch.utils.data.Dataset | None
    collate_fn: Callable | None
    num_labels: int | None
    label_names: list[str] | None
    summary: dict[str, Any]


def _cache_dir() -> Path:
    """Tokenizer and token caches: ``$OELM_CACHE_DIR``, default ``~/.cache/oelm``."""
    return Path(os.environ.get("OELM_CACHE_DIR", Path.home() / ".cache" / "oelm"))


def _load_splits(task, load: Callable, sample: Callable) -> dict[str, Any]:
    """train / validation (subsampled with the fixed ``subset_seed``) and the optional test split (whole)."""
    splits = {
        "train": sample(load(task.dataset, task.train_split, task.data_dir), task.train_samples, task.subset_seed),
        "validation": sample(load(task.dataset, task.validation_split, task.data_dir), task.validation_samples, task.subset_seed),
    }
    if task.test_split:
        splits["test"] = load(task.dataset, task.test_split, task.data_dir)
    return splits


def _gpt_tokenizer(config: ExperimentConfig, train_docs: list[str] | None):
    from oelm.data import get_lm_tokenizer

    spec = config.task.tokenizer or "gpt2"
    return get_lm_tokenizer(spec, train_docs, _cache_dir() / "tokenizers", data_dir=config.task.data_dir)


def prepare_data(config: ExperimentConfig, tokenizer=None) -> PreparedData:
    """Load, subsample and tokenize the task's splits once for the whole experiment.

    ``tokenizer``: the pretrained model's tokenizer; None for oelm's GPT (then
    ``task.tokenizer`` decides: local GPT-2 files or a BPE trained on the training split).

    Raises:
        DataNotFoundError / DataFormatError: from :mod:`oelm.data`.
        ConfigError: task and model do not fit together.
    """
    from oelm.data import get_dataset_spec

    task = config.task
    spec = get_dataset_spec(task.dataset)
    if spec.task_type == "classification":
        from oelm.data import classification_collator, encode_classification, load_classification, subsample

        frames = _load_splits(task, load_classification, subsample)
        if tokenizer is None:
            texts = [t for col in spec.text_columns for t in frames["train"][col].tolist()]
            tokenizer = _gpt_tokenizer(config, texts)
        encoded = {k: encode_classification(df, tokenizer, spec.text_columns, task.max_length) for k, df in frames.items()}
        label_names = list(spec.label_names) if spec.label_names else None
        num_labels = len(label_names) if label_names else int(max(int(df["label"].max()) for df in frames.values()) + 1)
        return PreparedData(
            metric=spec.metric,
            task_type=spec.task_type,
            tokenizer=tokenizer,
            train=encoded["train"],
            validation=encoded["validation"],
            test=encoded.get("test"),
            collate_fn=classification_collator(tokenizer),
            num_labels=num_labels,
            label_names=label_names,
            summary={k: {"examples": len(df)} for k, df in frames.items()},
        )

    from oelm.data import LMBlockDataset, load_documents, pack_documents, subsample

    docs = _load_splits(task, load_documents, subsample)
    if tokenizer is None:
        tokenizer = _gpt_tokenizer(config, docs["train"])
    blocks = {k: pack_documents(d, tokenizer, task.block_size, cache_dir=_cache_dir() / "tokens") for k, d in docs.items()}
    for k, b in blocks.items():
        if len(b) == 0:
            raise ConfigError(
                f"the {k} split of {task.dataset} has fewer tokens than one block (task.block_size={task.block_size}); "
                "lower task.block_size or use more documents"
            )
    return PreparedData(
        metric=spec.metric,
        task_type=spec.task_type,
        tokenizer=tokenizer,
        train=LMBlockDataset(blocks["train"]),
        validation=LMBlockDataset(blocks["validation"]),
        test=LMBlockDataset(blocks["test"]) if "test" in blocks else None,
        collate_fn=None,
        num_labels=None,
        label_names=None,
        summary={k: {"documents": len(docs[k]), "blocks": len(b), "tokens": int(b.numel())} for k, b in blocks.items()},
    )


def build_model(config: ExperimentConfig, data: PreparedData | None, *, task_type: str | None = None, num_labels: int | None = None):
    """A fresh model for one run (call after seeding). Returns ``(model, tokenizer)``."""
    task_type = task_type or (data.task_type if data else "classification")
    num_labels = num_labels if num_labels is not None else (data.num_labels if data else 2)
    hf_task = "sequence_classification" if task_type == "classification" else "causal_lm"
    if config.model.architecture:  # a user-declared registry entry (oelm.architecture_from_dict)
        from oelm.architectures import architecture_from_dict, register_architecture

        register_architecture(architecture_from_dict(config.model.architecture, source="model.architecture"))
    if config.model.pretrained:
        from oelm.models.pretrained import load_pretrained

        return load_pretrained(
            config.model.pretrained,
            hf_task,
            num_labels=num_labels,
            trust_remote_code=config.model.trust_remote_code,
            tokenizer=data.tokenizer if data else None,
        )
    from oelm.models.gpt import build_gpt

    tokenizer = data.tokenizer if data else None
    overrides = dict(config.model.gpt_overrides)
    if tokenizer is not None:
        overrides.setdefault("vocab_size", len(tokenizer))
        overrides.setdefault("pad_token_id", tokenizer.pad_token_id)
    needed = config.task.block_size if task_type == "language_modeling" else config.task.max_length
    overrides.setdefault("context_length", max(needed, 1))
    if hf_task == "sequence_classification":
        overrides.setdefault("num_labels", num_labels)
    try:
        model = build_gpt(config.model.gpt, hf_task, **overrides)
    except TypeError as exc:
        raise ConfigError(f"model.gpt_overrides: {exc}") from None
    return model, tokenizer


def run_order(methods: list[str], seeds: list[int]) -> list[tuple[str, int]]:
    """Balanced interleaving: seed 0 runs A B C, seed 1 runs C B A, seed 2 A B C, ..."""
    order = []
    for i, seed in enumerate(seeds):
        seq = methods if i % 2 == 0 else list(reversed(methods))
        order.extend((m, seed) for m in seq)
    return order


_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
DRIFT_WARNING_PERCENT = 10.0  # speed-probe change (start vs end of a run) that makes timings suspect


def run_name(method: str, seed: int) -> str:
    """Directory name of a run; user strings are sanitized so they cannot escape ``runs/``.

    A method name that is already safe (letters, digits, ``_ . -``, no leading dot) is kept as is;
    any other one (``"../x"``, ``"a/b"``, spaces, ...) is sanitized and gets 8 hex digits of the
    sha256 of the original name, so two different names never share a run directory.
    """
    safe = _SAFE.sub("_", method).strip("._")[:64] or "method"
    if safe != method:
        safe = f"{safe}-{hashlib.sha256(method.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"
    return f"{safe}-seed{seed}"


def _loaders(data: PreparedData, config: ExperimentConfig, seed: int) -> tuple[DataLoader, DataLoader, DataLoader | None]:
    """Train loader shuffled by ``seed`` (optionally length-grouped); evaluation loaders in
    length-sorted order, which wastes less compute on padding and cannot change a metric."""
    t = config.training
    g = torch.Generator().manual_seed(seed)
    kw = {"collate_fn": data.collate_fn, "num_workers": t.num_workers}
    lengths = getattr(data.train, "lengths", None)
    if t.group_by_length and lengths is not None:
        from transformers.trainer_pt_utils import LengthGroupedSampler

        sampler = LengthGroupedSampler(t.batch_size, lengths=lengths, generator=g)
        train = DataLoader(data.train, batch_size=t.batch_size, sampler=sampler, **kw)
    else:
        train = DataLoader(data.train, batch_size=t.batch_size, shuffle=True, generator=g, **kw)

    def eval_loader(ds):
        if ds is None:
            return None
        lens = getattr(ds, "lengths", None)
        order = sorted(range(len(ds)), key=lens.__getitem__) if lens is not None else None
        return DataLoader(ds, batch_size=t.eval_batch_size, sampler=order, shuffle=False, **kw)

    return train, eval_loader(data.validation), eval_loader(data.test)


def _run_one(config: ExperimentConfig, entry: MethodEntry, seed: int, data: PreparedData, run_dir: Path, log: Callable[[str], None]) -> dict:
    from accelerate.utils import set_seed

    from oelm.environment import capture_environment, probe_drift_percent
    from oelm.train import train

    device = "cuda" if torch.cuda.is_available() else "cpu"
    env_before = capture_environment(device, probe=True)
    set_seed(seed)
    model, _ = build_model(config, data)
    oelm_cfg = entry.oelm_config()
    report = apply_oelm(model, oelm_cfg, seed=seed)
    log(f"[{run_dir.name}] {report}")
    train_loader, val_loader, test_loader = _loaders(data, config, seed)
    lr = config.learning_rate(entry)
    result = train(
        model,
        train_loader,
        val_loader,
        metric=data.metric,
        config=config.training,
        learning_rate=lr,
        run_dir=run_dir,
        test_loader=test_loader,
        description=run_dir.name,
    )
    env_after = capture_environment(device, probe=True)
    before = (env_before.get("matmul_probe") or {}).get("gflops")
    after = (env_after.get("matmul_probe") or {}).get("gflops")
    environment = dict(env_before)
    environment["matmul_probe_after"] = env_after.get("matmul_probe")
    environment["load_average_after"] = env_after.get("load_average")
    environment["matmul_probe_drift_percent"] = probe_drift_percent(before, after) if before and after else None
    return {
        "method": entry.name,
        "seed": seed,
        "task": config.task.dataset,
        "model": config.model.display_name,
        "status": "finished",
        "config": config.model_dump(mode="json"),
        "method_config": oelm_cfg.to_dict() | {"learning_rate": lr},
        "data": data.summary,
        "environment": environment,
        "parameters": {
            "total": report.total,
            "trainable": report.trainable,
            "frozen": report.frozen,
            "trainable_percent": report.trainable_percent,
            "groups": report.groups,
        },
        "projections": report.projections,
        "performance": {
            "metric": result.metric,
            "best_validation": result.best_validation,
            "best_step": result.best_step,
            "final_validation": result.final_validation,
            "final_train_loss": result.final_train_loss,
            "test": result.test,
            "steps": result.steps,
        },
        "timing": result.timing,
    }


# Settings that change how a run is displayed or fed, never its numbers.
_COSMETIC_TRAINING_KEYS = ("progress_bar", "tensorboard", "num_workers", "log_every")


def _config_fingerprint(config: ExperimentConfig) -> dict[str, Any]:
    """The parts of a config that make results comparable (not seeds, the method list, output,
    or display-only training knobs)."""
    d = config.model_dump(mode="json")
    training = {k: v for k, v in d["training"].items() if k not in _COSMETIC_TRAINING_KEYS}
    return {"task": d["task"], "model": d["model"], "training": training}


def run_experiment(
    config: ExperimentConfig,
    output_dir: str | Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run every (method, seed) of ``config`` not finished yet, then write the comparison.

    Returns:
        The comparison dict (also written to ``comparison.json``; ``report.md`` beside it).

    Raises:
        ConfigError: ``output_dir`` holds results of a different task/model/training config.
        OELMError subclasses: data or model problems, raised before any run starts.
    """
    out = Path(output_dir or config.output_dir or Path("outputs") / config.name)
    out.mkdir(parents=True, exist_ok=True)
    fingerprint_path = out / "experiment.json"
    fingerprint = _config_fingerprint(config)
    if fingerprint_path.exists():
        previous = read_json(fingerprint_path).get("fingerprint")
        if previous != fingerprint:
            changed = sorted(k for k in fingerprint if previous is None or previous.get(k) != fingerprint[k])
            raise ConfigError(
                f"output directory {out} holds results of a different config (changed: {', '.join(changed)}); "
                "use another --output-dir, or restore the original config to resume"
            )
    write_json_atomic(fingerprint_path, {"name": config.name, "fingerprint": fingerprint})
    write_text_atomic(out / "config.yaml", yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))

    tokenizer = None
    if config.model.pretrained:
        from oelm.models.pretrained import load_tokenizer

        tokenizer = load_tokenizer(config.model.pretrained, trust_remote_code=config.model.trust_remote_code)
    log(f"preparing data: {config.task.dataset} ...")
    data = prepare_data(config, tokenizer)
    log(f"data: {data.summary}")

    entries = {m.name: m for m in config.methods}
    results: dict[str, list[dict]] = {m: [] for m in entries}
    for method, seed in run_order(list(entries), config.seeds):
        run_dir = out / "runs" / run_name(method, seed)
        result_path = run_dir / "result.json"
        if result_path.exists():
            log(f"[{run_dir.name}] finished earlier; kept ({result_path})")
            results[method].append(read_json(result_path))
            continue
        result = _run_one(config, entries[method], seed, data, run_dir, log)
        write_json_atomic(result_path, result)
        perf = result["performance"]
        log(
            f"[{run_dir.name}] best validation {perf['metric']} {perf['best_validation']:.4f} at step {perf['best_step']}, "
            f"{result['timing']['total_seconds']:.1f} s total"
        )
        results[method].append(result)

    return write_comparison(config, results, out)
