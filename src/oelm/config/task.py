"""The data and the model of an experiment config (:mod:`oelm.config`): ``task:``
(:class:`TaskConfig`, with your own data in ``task.source``: :class:`DatasetSource`) and ``model:``
(:class:`ModelConfig`). Names, splits, tokenizers and GPT presets are checked when the config is
read; the checks that import torch or the data registry only in the full pass (not the keys-only
pass of :func:`oelm.config.config_from_dict`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from oelm.config.fields import Float, Int, Seed, StrictModel, Text, keys_only
from oelm.errors import ConfigError

__all__ = ["DatasetSource", "ModelConfig", "TaskConfig"]


class DatasetSource(StrictModel):
    """Your own dataset (``task.source``): local files, or a Hugging Face ``datasets`` id, with its
    columns. Registered under ``task.dataset`` and then loaded and checked like a shipped dataset
    (:mod:`oelm.data.sources`)."""

    files: dict[str, Text | list[Text]] | None = Field(
        None, description="Split -> file (or files): .csv, .tsv, .jsonl, .parquet (tables with the text and label "
        "columns), or .txt / .txt.gz (language modelling; documents separated by <|endoftext|>, else one per file). "
        "Relative paths are resolved against the working directory when the config is read.")
    hub: Text | None = Field(None, description="A Hugging Face datasets id (datasets.load_dataset), instead of files.")
    hub_config: Text | None = Field(None, description="The Hub dataset's configuration name (e.g. sst2 for nyu-mll/glue).")
    hub_splits: dict[str, Text] | None = Field(
        None, description="Our split -> the Hub's split name; default train, validation and test as named.")
    type: Literal["classification", "language_modeling"] | None = Field(
        None, description="Default: language_modeling for .txt files, classification otherwise.")
    text_columns: list[Text] = Field(
        default_factory=lambda: ["text"], min_length=1, max_length=2,
        description="The text column, or two for sentence pairs (e.g. [premise, hypothesis]).")
    label_column: Text = Field("label", description="Classification: the column of class ids (0..n-1) or label names.")
    label_names: list[Text] | None = Field(
        None, min_length=2, description="Classification: the name of class 0, 1, ...; labels may then be these names.")
    validation_holdout: Float | None = Field(
        None, gt=0, lt=1, description="No validation file: this fraction of train becomes validation (seeded, disjoint).")

    @field_validator("files")
    @classmethod
    def _absolute_paths(cls, files: dict[str, str | list[str]] | None) -> dict[str, str | list[str]] | None:
        # resolved once, when the config is read: the runs (another process, a Ray worker) read the same files
        if files is None:
            return None

        def absolute(path: str) -> str:
            return str(Path(path).expanduser().absolute())

        return {split: absolute(p) if isinstance(p, str) else [absolute(x) for x in p] for split, p in files.items()}


class TaskConfig(StrictModel):
    """Which data, how much of it, and how it is tokenized."""

    dataset: str = Field(description="Registered dataset name (oelm.data.DATASETS), e.g. sst2, tinystories; with "
                         "task.source, the name you give your own data.")
    source: DatasetSource | None = Field(
        None, description="Your own data: files (CSV, TSV, JSON lines, Parquet, text) or a Hugging Face datasets id, "
        "with its columns; registered under task.dataset.")
    data_dir: Text | None = Field(None, description="Folder laid out like shared/data; default: $OELM_DATA_DIR.")
    train_split: str = "train"
    validation_split: str = "validation"
    test_split: str | None = Field(
        None, description="Evaluated once at the end with the best checkpoint; never used for selection. May name "
        "validation_split itself: the test set is then the rest of that split, disjoint from the validation_samples "
        "subset (for data with one held-out split, such as the local TinyStories sample).")
    train_samples: Int | None = Field(None, gt=0, description="Random training subset (documents for LM); None = all.")
    validation_samples: Int | None = Field(None, gt=0, description="Random validation subset; None = all.")
    test_samples: Int | None = Field(
        None, gt=0, description="Random subset of test_split (the same for every run); None = all. For test sets too large to "
        "evaluate on CPU (IMDB: 25,000 reviews).")
    subset_seed: Seed = Field(0, description="Seed of the subsets; fixed across methods and seeds so all runs see the same data.")
    max_length: Int = Field(128, gt=0, description="Classification: truncation length in tokens.")
    block_size: Int = Field(256, gt=1, description="Language modelling: tokens per packed block.")
    tokenizer: Text | None = Field(
        None,
        description="Language modelling / oelm GPT: 'gpt2' (local files under <data_dir>/tokenizers/gpt2), "
        "'bpe-<vocab_size>' trained on the training split, or the path of a tokenizer.json (e.g. the one a "
        "pretraining `oelm run` saved as <output_dir>/tokenizer.json, for init_from). Pretrained models use their "
        "own tokenizer.",
    )


    @model_validator(mode="after")
    def _known_dataset_and_splits(self, info: ValidationInfo) -> "TaskConfig":
        # Refused when the config is read, not after the output folder and the lock exist.
        if keys_only(info):
            return self
        from oelm.data.registry import get_dataset_spec, resolve_split

        try:
            if self.source is not None:  # your own data: registered now, so every reader finds it by name
                from oelm.data.sources import register_source

                spec = register_source(self.dataset, self.source.model_dump())
            else:
                spec = get_dataset_spec(self.dataset)
        except ConfigError as err:
            raise ValueError(f"task.dataset: {err}" if self.source is None else str(err)) from None
        for key in ("train_split", "validation_split", "test_split"):
            split = getattr(self, key)
            if split is not None:
                try:
                    resolve_split(spec, split)
                except ConfigError as err:
                    hint = (f"; name its file in task.source.files.{split}" + (
                        " or hold validation out of train (task.source.validation_holdout: 0.1)" if key == "validation_split"
                        else "")) if self.source is not None and self.source.files else ""
                    raise ValueError(f"task.{key}: {err}{hint}") from None
        from oelm.data.identity import split_file_problem  # the data layer: the full pass only, as the registry above

        problem = split_file_problem(self, spec)
        if problem:
            raise ValueError(f"task: {problem}")
        return self

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer_spec(cls, value: str | None) -> str | None:
        # A name is checked now; a path may be written later (by the pretraining run), so it is checked when loaded.
        if value is None or "/" in value or value.endswith(".json") or Path(value).expanduser().exists():
            return value
        match = re.fullmatch(r"bpe-(\d+)", value)
        if value != "gpt2" and not match:
            raise ValueError(f"unknown tokenizer {value!r}; use 'gpt2', 'bpe-<vocab_size>' (e.g. 'bpe-8192') or the path of a "
                             "tokenizer.json")
        if match and int(match.group(1)) < 257:
            raise ValueError(f"{value!r}: a byte-level BPE needs vocab_size >= 257 (256 bytes + <|endoftext|>)")
        return value

    @model_validator(mode="after")
    def _held_out_test(self) -> "TaskConfig":
        if self.test_samples is not None and self.test_split is None:
            raise ValueError(f"task.test_samples={self.test_samples} is set but task.test_split is not; name the test split "
                             "(e.g. test_split: test) or remove test_samples")
        if self.test_split is not None and self.test_split == self.validation_split and self.validation_samples is None:
            raise ValueError(
                f"task.test_split is the validation split ({self.test_split!r}) but task.validation_samples is not set: "
                "set task.validation_samples below the split's size, so the test set is the held-out rest of it"
            )
        return self


class ModelConfig(StrictModel):
    """Exactly one of ``pretrained`` (a Hugging Face id or local dir) and ``gpt`` (an oelm GPT preset)."""

    pretrained: Text | None = Field(None, description="Hugging Face model id or local directory.")
    gpt: Text | None = Field(None, description="oelm GPT preset: gpt-tiny, gpt-medium-512.")
    gpt_overrides: dict[str, Any] = Field(default_factory=dict, description="GPTConfig fields to override.")
    trust_remote_code: bool = False
    architecture: dict[str, Any] | None = Field(
        None,
        description="Registry entry for a model type oelm does not know (oelm.architecture_from_dict keys: "
        "model_type, attention_pattern, query, key, num_heads, ...); registered when the model is built.",
    )

    @model_validator(mode="after")
    def _one_source(self, info: ValidationInfo) -> "ModelConfig":
        if (self.pretrained is None) == (self.gpt is None):
            raise ValueError("set exactly one of model.pretrained (Hugging Face id / local dir) and model.gpt (preset name)")
        if self.gpt is not None:
            if keys_only(info):
                return self
            # Catch an unknown preset or a bad override (e.g. hidden_size not divisible by
            # num_heads) when the config is read, not when the first run builds its model.
            from oelm.models.gpt import gpt_config

            gpt_config(self.gpt, **self.gpt_overrides)
        elif self.gpt_overrides:
            raise ValueError("gpt_overrides applies to model.gpt only; a pretrained model keeps its own config.json")
        return self

    @property
    def display_name(self) -> str:
        return self.pretrained or f"oelm-{self.gpt}"
