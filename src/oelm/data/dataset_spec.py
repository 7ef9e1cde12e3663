"""What one task is: :class:`DatasetSpec` (where each split lives, its layout, columns, labels,
row counts and caveats) and the formats and text repairs a spec may name. The registry
(:mod:`oelm.data.registry`) keeps the specs by name; the catalog (:mod:`oelm.data.catalog`) holds
the ones oelm ships."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Mapping

from oelm.errors import ConfigError

__all__ = ["DatasetSpec", "LOCAL_FORMATS", "TEXT_FIXES"]

#: File formats a split's local files can have (``DatasetSpec.local_formats``):
#:   parquet            one row per example/document (classification, or LM with a ``text`` column)
#:   eot_text           gzip'd text, documents separated by ``<|endoftext|>`` (official TinyStories .txt)
#:   paragraph_stories  gzip'd text, paragraphs *and* stories separated by a blank line (TinyStories
#:                      validation sample); see :func:`oelm.data.lm.split_paragraph_stories`
#:   wikitext           gzip'd WikiText file, one line per Hub row; documents = articles
#:   gutenberg          gzip'd Project Gutenberg book, one document per file, PG header/licence removed
#:   csv, tsv, jsonl    tables like parquet, in those formats (oelm.data.tables; your own data)
LOCAL_FORMATS = ("parquet", "eot_text", "paragraph_stories", "wikitext", "gutenberg", "csv", "tsv", "jsonl")

#: Text repairs a spec can ask for (``DatasetSpec.text_fixes``), applied to every document from
#: every source (local file or Hub) so all splits share one format; see :mod:`oelm.data.lm`.
TEXT_FIXES = ("cp1252_mojibake", "single_newline_paragraphs")


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True, kw_only=True)
class DatasetSpec:
    """Everything oelm needs to know about one task. All paths are relative to the data dir.

    Row counts: ``official_rows`` are the published split sizes (dataset cards / papers; for
    WikiText, Hub rows = lines); ``local_rows`` are what :func:`~oelm.data.load_classification`
    (rows, before any validation hold-out) or :func:`~oelm.data.load_documents` (documents)
    return from the files under ``shared/data`` — tests check them.
    """

    name: str
    task_type: Literal["classification", "language_modeling"]
    metric: Literal["accuracy", "perplexity"]
    hub_id: str | None
    hub_config: str | None
    local_files: Mapping[str, tuple[str, ...]]  # split -> file paths relative to the data dir
    hub_splits: Mapping[str, str]  # our split name -> Hub split name
    text_columns: tuple[str, ...] = ("text",)  # or ("sentence1", "sentence2") for sentence pairs
    label_column: str | None = "label"  # column in the local files; always called "label" on output
    label_names: tuple[str, ...] | None = None  # label i means label_names[i]
    official_rows: Mapping[str, int] = field(default_factory=dict)
    validation_holdout: float | None = None  # no validation split: this fraction of train becomes it
    notes: str = ""  # caveats of the local copies; read them before reporting numbers
    source: str = ""  # citation / dataset card / MANIFEST section
    # --- beyond the core interface ---
    local_rows: Mapping[str, int] = field(default_factory=dict)  # rows/documents in shared/data's files
    local_formats: Mapping[str, str] = field(default_factory=dict)  # split -> one of LOCAL_FORMATS (default parquet)
    hub_columns: Mapping[str, str] = field(default_factory=dict)  # Hub column -> our column (premise -> sentence1)
    row_filter: Mapping[str, str] = field(default_factory=dict)  # local rows kept: column == value (XNLI language)
    text_fixes: tuple[str, ...] = ()  # repairs from TEXT_FIXES applied to LM documents

    def __post_init__(self) -> None:
        for name in ("local_files", "hub_splits", "official_rows", "local_rows", "local_formats", "hub_columns", "row_filter"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))
        object.__setattr__(self, "local_files", _frozen({k: tuple(v) for k, v in self.local_files.items()}))
        where = f"dataset spec {self.name!r}"
        if self.task_type not in ("classification", "language_modeling"):
            raise ConfigError(f"{where}: task_type must be 'classification' or 'language_modeling', got {self.task_type!r}")
        expected_metric = "accuracy" if self.task_type == "classification" else "perplexity"
        if self.metric != expected_metric:
            raise ConfigError(f"{where}: a {self.task_type} task is scored by {expected_metric!r}, got metric={self.metric!r}")
        if self.task_type == "classification" and not self.label_column:
            raise ConfigError(f"{where}: a classification task needs label_column")
        if not 1 <= len(self.text_columns) <= 2:
            raise ConfigError(f"{where}: text_columns must name one column or a sentence pair, got {self.text_columns}")
        if self.validation_holdout is not None and not 0.0 < self.validation_holdout < 1.0:
            raise ConfigError(f"{where}: validation_holdout must be a fraction in (0, 1), got {self.validation_holdout}")
        bad_formats = {s: f for s, f in self.local_formats.items() if f not in LOCAL_FORMATS}
        if bad_formats:
            raise ConfigError(f"{where}: unknown local_formats {bad_formats}; known: {', '.join(LOCAL_FORMATS)}")
        bad_fixes = [f for f in self.text_fixes if f not in TEXT_FIXES]
        if bad_fixes:
            raise ConfigError(f"{where}: unknown text_fixes {bad_fixes}; known: {', '.join(TEXT_FIXES)}")

    def local_format(self, split: str) -> str:
        return self.local_formats.get(split, "parquet")
