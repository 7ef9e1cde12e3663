"""Task data for an experiment: load, subsample and tokenize each split once; build the loaders.

Every run of an experiment shares one :class:`PreparedData`, so all methods and seeds see
exactly the same examples; only the training order depends on a run's seed (:func:`make_loaders`).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader

from oelm.config import ExperimentConfig, TrainingConfig
from oelm.data.classification import (
    classification_collator, encode_classification, held_out_rest, length_buckets, load_classification, subsample,
)
from oelm.data.identity import data_source
from oelm.data.lm import LMBlockDataset, get_lm_tokenizer, load_documents, pack_documents, tokenizer_record
from oelm.data.registry import get_dataset_spec
from oelm.errors import ConfigError, DataFormatError
from oelm.io import cache_dir  # where the caches live (the name stays importable from here)

__all__ = ["PreparedData", "prepare_data", "make_loaders", "loader_workers", "cache_dir", "label_summary"]


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
    #: :func:`oelm.data.lm.tokenizer_record` of ``tokenizer`` (spec, vocab_size, sha256): in every
    #: run's result.json, and compared with an ``init_from`` checkpoint's.
    tokenizer_record: dict[str, Any] | None = None
    #: Classification: the padded lengths ``training.length_buckets`` pads batches to
    #: (:func:`oelm.data.classification.length_buckets` of ``task.max_length``); None for LM.
    length_buckets: tuple[int, ...] | None = None
    #: :func:`oelm.data.identity.data_source`: the content hash of every split's files and the
    #: tokenizer's sha256; recorded in experiment.json and result.json, compared on every rerun.
    source: dict[str, Any] | None = None


def _load_splits(task, load: Callable, sample: Callable) -> dict[str, Any]:
    """train / validation / the optional test split, each subsampled (``*_samples``) with the fixed ``subset_seed``.

    A ``test_split`` equal to ``validation_split`` is the part of that split the validation subset
    did not take (:func:`oelm.data.classification.held_out_rest`): disjoint from validation."""
    def take(split: str, key: str):
        rows = load(task.dataset, split, task.data_dir)
        asked = getattr(task, key)
        if asked is not None and asked > len(rows):  # all are used; say so rather than imply `asked` examples
            warnings.warn(f"task.{key}={asked} is more than the {len(rows)} items of {task.dataset}/{split}: all "
                          f"{len(rows)} are used (the run's data summary records the count)", stacklevel=3)
        return sample(rows, asked, task.subset_seed)

    splits = {"train": take(task.train_split, "train_samples"), "validation": take(task.validation_split, "validation_samples")}
    if task.test_split and task.test_split == task.validation_split:
        # one held-out split: validation is its validation_samples subset (as above), test the rest
        full = load(task.dataset, task.validation_split, task.data_dir)
        splits["test"] = sample(held_out_rest(full, task.validation_samples, task.subset_seed), task.test_samples, task.subset_seed)
    elif task.test_split:
        splits["test"] = take(task.test_split, "test_samples")
    return splits


def _gpt_tokenizer(config: ExperimentConfig, train_docs: list[str] | None):
    spec = config.task.tokenizer or "gpt2"
    return get_lm_tokenizer(spec, train_docs, cache_dir() / "tokenizers", data_dir=config.task.data_dir,
                            what=f"{config.task.dataset}/{config.task.train_split}")


def _what(task, role: str) -> str:
    """``dataset/split`` of one role (train, validation, test) of ``task``: the label a cache file
    carries in its identity (:mod:`oelm.data.cache`)."""
    split = {"train": task.train_split, "validation": task.validation_split}.get(role, task.test_split)
    held_out = " (held-out rest)" if role == "test" and task.test_split == task.validation_split else ""
    return f"{task.dataset}/{split}{held_out}"


def label_summary(frame, label_names: list[str] | None) -> dict[str, Any]:
    """Examples, examples per label and the majority label's share (%) of one split.

    The share is what a constant predictor scores; the report's collapse rule uses the
    validation split's share as chance level when it exceeds ``100 / num_labels``.
    """
    counts = frame["label"].value_counts().sort_index()
    names = {i: (label_names[i] if label_names and 0 <= int(i) < len(label_names) else str(int(i))) for i in counts.index}
    n = len(frame)
    return {
        "examples": n,
        "label_counts": {names[i]: int(c) for i, c in counts.items()},
        "majority_class_percent": 100.0 * int(counts.max()) / n if n else None,
    }


def prepare_data(config: ExperimentConfig, tokenizer=None) -> PreparedData:
    """Load, subsample and tokenize the task's splits once for the whole experiment.

    ``tokenizer``: the pretrained model's tokenizer; None for oelm's GPT (then
    ``task.tokenizer`` decides: local GPT-2 files or a BPE trained on the training split).

    Raises:
        DataNotFoundError / DataFormatError: from :mod:`oelm.data`.
        ConfigError: task and model do not fit together.
    """
    task = config.task
    spec = get_dataset_spec(task.dataset)
    tokenizer_spec = config.model.pretrained if tokenizer is not None and config.model.pretrained else (task.tokenizer or "gpt2")
    if spec.task_type == "classification":
        frames = _load_splits(task, load_classification, subsample)
        if tokenizer is None:
            texts = [t for col in spec.text_columns for t in frames["train"][col].tolist()]
            tokenizer = _gpt_tokenizer(config, texts)
        record = tokenizer_record(tokenizer, tokenizer_spec, cache_dir() / "tokenizer-hashes")
        encoded = {k: encode_classification(df, tokenizer, spec.text_columns, task.max_length, cache_dir=cache_dir() / "encodings",
                                            tokenizer_sha256=record["sha256"], what=_what(task, k)) for k, df in frames.items()}
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
            summary={k: label_summary(df, label_names) for k, df in frames.items()},
            tokenizer_record=record,
            length_buckets=length_buckets(task.max_length),
            source=data_source(task, spec, record, cache_dir() / "file-hashes"),
        )

    docs = _load_splits(task, load_documents, subsample)
    if tokenizer is None:
        tokenizer = _gpt_tokenizer(config, docs["train"])
    blocks = {k: pack_documents(d, tokenizer, task.block_size, cache_dir=cache_dir() / "tokens", what=_what(task, k))
              for k, d in docs.items()}
    for k, b in blocks.items():
        sample_doc = next((d for d in docs[k] if d.strip()), None)
        if len(b) == 0 and sample_doc is not None and not tokenizer(sample_doc[:200])["input_ids"]:
            raise DataFormatError(
                f"the tokenizer of {tokenizer_spec} turns text into no tokens at all ({sample_doc[:40]!r} -> []): it has no "
                "vocabulary; give a complete tokenizer (tokenizer.json, or vocab.json and merges.txt)"
            )
        if len(b) == 0:
            raise ConfigError(
                f"the {k} split of {task.dataset} has fewer tokens than one block (task.block_size={task.block_size}); "
                "lower task.block_size or use more documents"
            )
    record = tokenizer_record(tokenizer, tokenizer_spec, cache_dir() / "tokenizer-hashes")
    return PreparedData(
        metric=spec.metric,
        task_type=spec.task_type,
        tokenizer=tokenizer,
        train=LMBlockDataset(blocks["train"], tokenizer.eos_token_id),
        validation=LMBlockDataset(blocks["validation"], tokenizer.eos_token_id),
        test=LMBlockDataset(blocks["test"], tokenizer.eos_token_id) if "test" in blocks else None,
        collate_fn=None,
        num_labels=None,
        label_names=None,
        summary={k: {"documents": len(docs[k]), "blocks": len(b), "tokens": int(b.numel())} for k, b in blocks.items()},
        tokenizer_record=record,
        source=data_source(task, spec, record, cache_dir() / "file-hashes"),
    )



def bucketed_lengths(training: TrainingConfig) -> bool:
    """Whether classification batches are padded to fixed lengths: ``training.length_buckets``,
    or, when it is None, whether the model is compiled (``training.compile`` not false)."""
    if training.length_buckets is not None:
        return training.length_buckets
    return training.compile is not False


# "auto" DataLoader workers on CUDA: at most this many per training process (batches here are
# pre-tokenized, so collation is padding or slicing; more workers only hold memory)
AUTO_MAX_WORKERS = 4


def loader_workers(setting: int | str, *, cuda: bool | None = None, cores: int | None = None,
                   local_processes: int | None = None) -> int:
    """DataLoader worker processes for ``training.num_workers`` = ``setting``.

    An int is used as given. ``"auto"``: 0 on CPU (the cores run the model; a worker would compete
    with it and import torch again); on CUDA ``min(AUTO_MAX_WORKERS, cores // local_processes - 1)``,
    one core per process left for the training loop itself.

    Args:
        cuda: whether training runs on CUDA; None = ``torch.cuda.is_available()`` (as the run does).
        cores: usable CPU cores; None = this process's CPU affinity.
        local_processes: training processes on this machine; None = ``$LOCAL_WORLD_SIZE`` (torchrun,
            accelerate launch) or 1.
    """
    if setting != "auto":
        return int(setting)
    if not (torch.cuda.is_available() if cuda is None else cuda):
        return 0
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if local_processes is None:
        local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(0, min(AUTO_MAX_WORKERS, cores // max(1, local_processes) - 1))


def make_loaders(data: PreparedData, training: TrainingConfig, seed: int) -> tuple[DataLoader, DataLoader, DataLoader | None]:
    """Train loader shuffled by ``seed`` (optionally length-grouped); evaluation loaders in
    length-sorted order, which wastes less compute on padding and cannot change a metric.

    Workers: :func:`loader_workers` of ``training.num_workers``; with workers, the training
    loader's stay alive across epochs (``persistent_workers``). Batches and their order do not
    depend on the number of workers."""
    t = training
    g = torch.Generator().manual_seed(seed)
    collate = data.collate_fn
    if data.length_buckets and bucketed_lengths(t):
        collate = classification_collator(data.tokenizer, buckets=data.length_buckets)
    workers = loader_workers(t.num_workers)
    kw = {"collate_fn": collate, "num_workers": workers}
    train_kw = kw | {"persistent_workers": workers > 0}
    lengths = getattr(data.train, "lengths", None)
    if t.group_by_length and lengths is not None:
        from transformers.trainer_pt_utils import LengthGroupedSampler

        sampler = LengthGroupedSampler(t.batch_size, lengths=lengths, generator=g)
        train = DataLoader(data.train, batch_size=t.batch_size, sampler=sampler, **train_kw)
    else:
        train = DataLoader(data.train, batch_size=t.batch_size, shuffle=True, generator=g, **train_kw)

    def eval_loader(ds):
        if ds is None:
            return None
        lens = getattr(ds, "lengths", None)
        order = sorted(range(len(ds)), key=lens.__getitem__) if lens is not None else None
        return DataLoader(ds, batch_size=t.eval_batch_size, sampler=order, shuffle=False, **kw)

    return train, eval_loader(data.validation), eval_loader(data.test)

