"""Dataset registry: task name → where the data lives, how it is laid out, how it is scored.

Every task oelm can train on is one :class:`DatasetSpec` in :data:`DATASETS`. A spec says

* where each split lives under a *data dir* (a folder laid out like ``shared/data``, see its
  ``MANIFEST.md``) and, as a fallback, on the Hugging Face Hub;
* which columns hold the text and the label, and what the labels mean;
* the documented row counts, and the caveats of the local copies (partial samples, test sets
  whose labels come from elsewhere, ...).

Lookup order for one split (used by :mod:`oelm.data.classification` and :mod:`oelm.data.lm`):

1. the data dir: the ``data_dir`` argument, else ``$OELM_DATA_DIR`` (:func:`resolve_data_dir`);
   a data dir that is set but does not exist is an error, not a silent fall-through;
2. the Hub, ``datasets.load_dataset(hub_id, hub_config, split=hub_splits[split])``, unless the
   Hub is offline (``HF_HUB_OFFLINE=1``), which is checked first so the failure is immediate;
3. otherwise :class:`~oelm.errors.DataNotFoundError`, naming the local path(s) looked for and
   the Hub id, and how to fix it.

Splits without a published validation set (IMDB, AG News, OpenWebText) get one by holding out a
fixed fraction of train (:attr:`DatasetSpec.validation_holdout`, :func:`holdout_indices`): a seeded
permutation, so "train" and "validation" are disjoint and identical on every machine.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, Mapping

import numpy as np

from oelm.errors import ConfigError, DataFormatError, DataNotFoundError

__all__ = [
    "DATASETS",
    "DatasetSpec",
    "available_splits",
    "find_local_files",
    "get_dataset_spec",
    "holdout_indices",
    "hub_offline",
    "load_hub_split",
    "register_dataset",
    "resolve_data_dir",
    "resolve_split",
]

#: File formats a split's local files can have (``DatasetSpec.local_formats``):
#:   parquet            one row per example/document (classification, or LM with a ``text`` column)
#:   eot_text           gzip'd text, documents separated by ``<|endoftext|>`` (official TinyStories .txt)
#:   paragraph_stories  gzip'd text, paragraphs *and* stories separated by a blank line (TinyStories
#:                      validation sample); see :func:`oelm.data.lm.split_paragraph_stories`
#:   wikitext           gzip'd WikiText file, one line per Hub row; documents = articles
#:   gutenberg          gzip'd Project Gutenberg book, one document per file, PG header/licence removed
LOCAL_FORMATS = ("parquet", "eot_text", "paragraph_stories", "wikitext", "gutenberg")

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


DATASETS: dict[str, DatasetSpec] = {}


def register_dataset(spec: DatasetSpec, *, overwrite: bool = False) -> None:
    """Add ``spec`` to :data:`DATASETS` under ``spec.name``.

    Raises:
        ConfigError: the name is taken by a different spec and ``overwrite`` is False.
    """
    old = DATASETS.get(spec.name)
    if old is not None and old != spec and not overwrite:
        raise ConfigError(f"dataset {spec.name!r} is already registered; pass overwrite=True to replace it")
    DATASETS[spec.name] = spec


def get_dataset_spec(name: str) -> DatasetSpec:
    """The registered spec for ``name``.

    Raises:
        ConfigError: unknown name (the message lists the registered ones).
    """
    try:
        return DATASETS[name]
    except KeyError:
        raise ConfigError(f"unknown dataset {name!r}; registered datasets: {', '.join(sorted(DATASETS))}") from None


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The data dir to read local files from: ``data_dir`` if given, else ``$OELM_DATA_DIR``, else None.

    Only resolves the name; whether the folder exists is checked by :func:`find_local_files`.
    """
    if data_dir is not None and str(data_dir) != "":
        return Path(data_dir).expanduser()
    env = os.environ.get("OELM_DATA_DIR", "").strip()
    return Path(env).expanduser() if env else None


def available_splits(spec: DatasetSpec) -> list[str]:
    """Every split name :func:`resolve_split` accepts for ``spec``."""
    splits = list(dict.fromkeys([*spec.local_files, *spec.hub_splits]))
    if spec.validation_holdout is not None and "validation" not in splits:
        splits.insert(1 if splits and splits[0] == "train" else 0, "validation")
    return splits


def resolve_split(spec: DatasetSpec, split: str) -> tuple[str, Literal["train", "validation"] | None]:
    """Where ``split`` comes from: ``(stored split, part)``.

    ``part`` is None for a stored split, or "train" / "validation" when the spec holds validation
    out of train (then the stored split is "train" and the caller keeps the matching part).

    Raises:
        ConfigError: the split does not exist for this dataset (the message lists those that do).
    """
    if spec.validation_holdout is not None and split in ("train", "validation"):
        return "train", split  # type: ignore[return-value]
    if split in spec.local_files or split in spec.hub_splits:
        return split, None
    raise ConfigError(f"dataset {spec.name!r} has no split {split!r}; available: {', '.join(available_splits(spec))}")


def holdout_indices(n: int, fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Split ``range(n)`` into (train, validation) row indices, each sorted ascending.

    ``round(fraction * n)`` rows (at least 1) go to validation, chosen by a seeded permutation.
    ``numpy.random.RandomState`` is used on purpose: its stream is frozen across NumPy versions,
    so the same seed gives the same hold-out everywhere.
    """
    n_val = min(max(1, round(fraction * n)), n - 1) if n > 1 else 0
    perm = np.random.RandomState(seed).permutation(n)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def hub_offline() -> bool:
    """True when the Hugging Face Hub must not be contacted (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``).

    The environment is read directly (``huggingface_hub`` only reads it once, at import), so a
    test or a user can switch the Hub off after import.
    """
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return True
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return False
    return bool(getattr(constants, "HF_HUB_OFFLINE", False))


def _dir_origin(data_dir: str | os.PathLike | None) -> str:
    if data_dir is not None and str(data_dir) != "":
        return "the data_dir argument"
    return "$OELM_DATA_DIR"


def _layout_hint(spec: DatasetSpec, split: str) -> str:
    example = spec.local_files.get(split) or next(iter(spec.local_files.values()), ())
    path = f"<dir>/{example[0]}" if example else f"<dir>/{spec.name}/..."
    return f"set OELM_DATA_DIR or data_dir to a folder laid out like shared/data: {path}"


def _label(spec: DatasetSpec, split: str, requested: str | None) -> str:
    if requested and requested != split:
        return f"{spec.name}/{requested} (held out from {split})"
    return f"{spec.name}/{split}"


def find_local_files(
    spec: DatasetSpec, split: str, data_dir: str | os.PathLike | None = None, requested: str | None = None
) -> list[Path] | None:
    """The local files of a *stored* split, or None when they are not there (then try the Hub).

    ``requested``: the split the caller asked for, when it differs (a hold-out of train); used in
    messages only.

    Raises:
        DataNotFoundError: a data dir is set but is not a folder, or only some of the split's
            files exist (a half-copied split is never silently replaced by the Hub copy).
        DataFormatError: a split's file path is a directory (or another non-file).
    """
    root = resolve_data_dir(data_dir)
    if root is None:
        return None
    if not root.is_dir():
        expected = ", ".join(str(root / p) for p in spec.local_files.get(split, ())) or str(root / spec.name)
        raise DataNotFoundError(
            f"{_label(spec, split, requested)}: data dir {root} (from {_dir_origin(data_dir)}) does not exist or is not a folder; "
            f"expected {expected}. Fix: {_layout_hint(spec, split)}, or unset it to use the Hugging Face Hub"
            + (f" ({spec.hub_id})" if spec.hub_id else "")
            + "."
        )
    rel = spec.local_files.get(split, ())
    paths = [root / p for p in rel]
    odd = [p for p in paths if p.exists() and not p.is_file()]
    if odd:  # not "not found": it is there, as the wrong kind of thing
        raise DataFormatError(f"{_label(spec, split, requested)}: {odd[0]} is a directory (or another non-file), not the "
                              f"{spec.local_format(split)} file of this split. Fix: replace it with the file from shared/data "
                              "(MANIFEST.md).")
    present = [p for p in paths if p.is_file()]
    if paths and len(present) == len(paths):
        return paths
    if present:
        missing = [str(p) for p in paths if not p.is_file()]
        raise DataNotFoundError(
            f"{_label(spec, split, requested)}: only {len(present)} of the {len(paths)} files of this split are under {root}; "
            f"missing: {', '.join(missing)}. Fix: copy the missing files (layout of shared/data, see its MANIFEST.md)."
        )
    return None


def _not_found(
    spec: DatasetSpec, split: str, data_dir: str | os.PathLike | None, why_not_hub: str, requested: str | None
) -> DataNotFoundError:
    root = resolve_data_dir(data_dir)
    rel = spec.local_files.get(split, ())
    hub = f"Hub {spec.hub_id}" + (f" (config {spec.hub_config})" if spec.hub_config else "") if spec.hub_id else "no Hub copy"
    if root is None and rel:  # the usual first miss (a plain shell): a short line, no notes
        return DataNotFoundError(
            f"{_label(spec, split, requested)}: no data dir is set; {hub}: {why_not_hub}. Fix: set OELM_DATA_DIR or "
            f"pass --data-dir DIR (oelm run/plan/inspect/report), a folder laid out like shared/data with <dir>/{rel[0]}."
        )
    if root is None:
        local = "no data dir is set (data_dir=None and $OELM_DATA_DIR is unset)"
    elif rel:
        local = f"not found under the data dir: {', '.join(str(root / p) for p in rel)}"
    else:
        local = f"this split is not stored locally in oelm's layout (data dir {root})"
    on_hub = bool(spec.hub_id) and split in spec.hub_splits
    if rel:
        fix = _layout_hint(spec, split) + (", or allow Hub access (oelm --online, or unset HF_HUB_OFFLINE; with network)" if on_hub else "")
    else:
        fix = "allow Hub access (oelm --online, or unset HF_HUB_OFFLINE; with network)" if on_hub else "use another split"
    note = f" Note: {spec.notes}" if spec.notes else ""
    return DataNotFoundError(f"{_label(spec, split, requested)}: {local}; {hub}: {why_not_hub}. Fix: {fix}.{note}")


def load_hub_split(spec: DatasetSpec, split: str, data_dir: str | os.PathLike | None = None, requested: str | None = None):
    """``datasets.load_dataset(spec.hub_id, spec.hub_config, split=spec.hub_splits[split])``.

    Call only when :func:`find_local_files` returned None. Returns a ``datasets.Dataset``.

    Raises:
        DataNotFoundError: no Hub copy of this split, the Hub is offline (checked before any
            network access, so this is immediate), or the download fails. The message names the
            local path(s) looked for, the Hub id and the fix.
    """
    if not spec.hub_id or split not in spec.hub_splits:
        why = "has no such split" if spec.hub_id else "not available"
        raise _not_found(spec, split, data_dir, why, requested)
    if hub_offline():
        raise _not_found(spec, split, data_dir, "not tried because the Hub is offline (HF_HUB_OFFLINE=1)", requested)
    hub_split = spec.hub_splits[split]
    try:
        import datasets

        return datasets.load_dataset(spec.hub_id, spec.hub_config, split=hub_split)
    except Exception as exc:  # network, auth, missing config, ... all mean: not available here
        why = f"download of split {hub_split!r} failed ({type(exc).__name__}: {exc})"
        raise _not_found(spec, split, data_dir, why, requested) from exc


# ---------------------------------------------------------------------------------------------
# The registered datasets. Counts and caveats: shared/data/MANIFEST.md and the Hub dataset cards.
# ---------------------------------------------------------------------------------------------

_PAIR = ("sentence1", "sentence2")
_NLI_LABELS = ("entailment", "neutral", "contradiction")
_NLI_HUB_COLUMNS = {"premise": "sentence1", "hypothesis": "sentence2"}

register_dataset(
    DatasetSpec(
        name="sst2",
        task_type="classification",
        metric="accuracy",
        hub_id="nyu-mll/glue",
        hub_config="sst2",
        local_files={
            "train": ("sst2/train.parquet",),
            "validation": ("sst2/validation.parquet",),
            "test": ("sst2/test_labeled.parquet",),
        },
        hub_splits={"train": "train", "validation": "validation"},  # the Hub's GLUE test is unlabeled
        label_names=("negative", "positive"),
        official_rows={"train": 67_349, "validation": 872, "test": 1_821},
        local_rows={"train": 67_349, "validation": 872, "test": 1_821},
        hub_columns={"sentence": "text"},
        notes=(
            "test = sst2/test_labeled.parquet: the GLUE test sentences (officially unlabeled) with labels from the "
            "canonical SST binary test set (a non-GLUE copy, clairett/pytorch-sentiment-classification), matched on "
            "normalized text (1,817 rows; 4 more differ by US/UK spelling). Report test numbers as offline analysis "
            "with that caveat; select models on validation. No Hub fallback for test (the Hub copy is unlabeled). "
            "Train/validation text is verbatim GLUE (trailing space kept)."
        ),
        source="GLUE SST-2 (Socher et al. 2013; Wang et al. 2019); shared/data/MANIFEST.md section 1",
    )
)

register_dataset(
    DatasetSpec(
        name="imdb",
        task_type="classification",
        metric="accuracy",
        hub_id="stanfordnlp/imdb",
        hub_config=None,
        local_files={"train": ("imdb/train.parquet",), "test": ("imdb/test.parquet",)},
        hub_splits={"train": "train", "test": "test"},
        label_names=("neg", "pos"),
        official_rows={"train": 25_000, "test": 25_000},
        local_rows={"train": 25_000, "test": 25_000},
        validation_holdout=0.1,
        notes=(
            "No official validation split: validation = a seeded 10% (2,500 reviews) of train, train = the other "
            "22,500. Local rows are sorted by (label, review_id): shuffle when training. Text keeps the <br /> tags."
        ),
        source="Maas et al. 2011, Large Movie Review Dataset v1.0; shared/data/MANIFEST.md section 4b",
    )
)

register_dataset(
    DatasetSpec(
        name="ag_news",
        task_type="classification",
        metric="accuracy",
        hub_id="fancyzhx/ag_news",
        hub_config=None,
        local_files={
            "train": ("ag_news/train_subset_alps10k_description_only.parquet",),
            "test": ("ag_news/test.parquet",),
        },
        hub_splits={"train": "train", "test": "test"},
        label_names=("World", "Sports", "Business", "Sci/Tech"),
        official_rows={"train": 120_000, "test": 7_600},
        local_rows={"train": 10_001, "test": 7_600},
        validation_holdout=0.1,
        notes=(
            "Local train is NOT the official 120,000-row train: it is the ALPS 10k sample (10,001 rows) with the "
            "description only (no title), while test text is title + ' ' + description as in the official release, "
            "so train and test differ in form. 10 train descriptions also occur verbatim in test (as in the original "
            "data). Validation = a seeded 10% of train. The Hub fallback train is the full 120k title+description set."
        ),
        source="Zhang, Zhao & LeCun 2015 (ag_news_csv); ALPS (Yuan et al. 2020) subset; shared/data/MANIFEST.md section 4a",
    )
)

register_dataset(
    DatasetSpec(
        name="xnli",
        task_type="classification",
        metric="accuracy",
        hub_id="facebook/xnli",
        hub_config="en",
        local_files={"validation": ("xnli/validation.parquet",), "test": ("xnli/test.parquet",)},
        hub_splits={"train": "train", "validation": "validation", "test": "test"},
        text_columns=_PAIR,
        label_names=_NLI_LABELS,
        official_rows={"train": 392_702, "validation": 2_490, "test": 5_010},
        local_rows={"validation": 2_490, "test": 5_010},
        hub_columns=_NLI_HUB_COLUMNS,
        row_filter={"language": "en"},
        notes=(
            "English only: the local files hold 15 languages (XTREME per-language files) and are filtered to "
            "language == 'en'. The local test split has no gold labels (XTREME removed them; label = -1): load it "
            "with allow_unlabeled=True for predictions only, and score on validation; the Hub copy of test is "
            "labeled. Train (MNLI, 392,702 pairs for English) is Hub only."
        ),
        source="Conneau et al. 2018, XNLI 1.0; shared/data/MANIFEST.md section 5b",
    )
)

register_dataset(
    DatasetSpec(
        name="mnli",
        task_type="classification",
        metric="accuracy",
        hub_id="nyu-mll/glue",
        hub_config="mnli",
        local_files={
            "train": ("mnli/train.parquet",),
            "validation": ("mnli/validation_matched.parquet",),
            "validation_matched": ("mnli/validation_matched.parquet",),
            "validation_mismatched": ("mnli/validation_mismatched.parquet",),
        },
        hub_splits={
            "train": "train",
            "validation": "validation_matched",
            "validation_matched": "validation_matched",
            "validation_mismatched": "validation_mismatched",
        },
        text_columns=_PAIR,
        label_names=_NLI_LABELS,
        official_rows={"train": 392_702, "validation_matched": 9_815, "validation_mismatched": 9_832},
        hub_columns=_NLI_HUB_COLUMNS,
        notes=(
            "Hub only: no MNLI file could be stored in shared/data (all over the 4 MiB limit). 'validation' is an "
            "alias of validation_matched. Local files, if you have them, are parquet with sentence1/sentence2/label."
        ),
        source="Williams et al. 2018, MultiNLI via GLUE; shared/data/MANIFEST.md section 5a",
    )
)

register_dataset(
    DatasetSpec(
        name="tinystories",
        task_type="language_modeling",
        metric="perplexity",
        hub_id="roneneldan/TinyStories",
        hub_config=None,
        local_files={
            "train": ("tinystories/train_head_2316.txt.gz",),
            "validation": ("tinystories/validation_head_sample.txt.gz",),
        },
        hub_splits={"train": "train", "validation": "validation"},
        label_column=None,
        official_rows={"train": 2_119_719, "validation": 21_990},
        local_rows={"train": 2_316, "validation": 714},
        local_formats={"train": "eot_text", "validation": "paragraph_stories"},
        text_fixes=("cp1252_mojibake", "single_newline_paragraphs"),
        notes=(
            "Head-only samples, not random ones: train = the first 2,316 stories of the official train split "
            "(exact story boundaries, <|endoftext|>-separated); validation = the first ~1,000 stories of the "
            "official validation split (21,990), exported with a blank line between stories AND between "
            "paragraphs, so story boundaries are not recoverable. oelm cuts that sample into 714 pseudo-stories "
            "(the first text, then one at each paragraph that begins 'Once upon a time'; on the train sample, where "
            "boundaries are known, that opening starts 55% of stories and begins a later paragraph in 3% of them; "
            "the sample's ~790k characters are about 890 train-length stories). So <|endoftext|> lands mostly on "
            "real boundaries and the missed ones get a newline: validation perplexity is comparable between oelm "
            "runs, not with published TinyStories numbers. All TinyStories text (local and Hub) is normalized to the "
            "train file's form: "
            "cp1252 mojibake of curly quotes/dashes is repaired (the validation sample has 'â€' 234 times) and "
            "blank lines between paragraphs become single newlines."
        ),
        source="Eldan & Li 2023, TinyStories (roneneldan/TinyStories); shared/data/MANIFEST.md sections 2 and 9",
    )
)

_WIKITEXT_NOTE = (
    "Documents are articles: the text is cut before each level-1 heading line ' = Title = ' and blank lines are "
    "dropped (a few formula lines that look like headings also start a new document, e.g. in 'Constant k filter'). "
)

register_dataset(
    DatasetSpec(
        name="wikitext-2",
        task_type="language_modeling",
        metric="perplexity",
        hub_id="Salesforce/wikitext",
        hub_config="wikitext-2-v1",
        local_files={
            "train": ("wikitext-2/wikitext-2-v1/train.txt.gz",),
            "validation": ("wikitext-2/wikitext-2-v1/valid.txt.gz",),
            "test": ("wikitext-2/wikitext-2-v1/test.txt.gz",),
        },
        hub_splits={"train": "train", "validation": "validation", "test": "test"},
        label_column=None,
        official_rows={"train": 36_718, "validation": 3_760, "test": 4_358},
        local_rows={"validation": 60, "test": 62},
        local_formats={"train": "wikitext", "validation": "wikitext", "test": "wikitext"},
        notes=(
            "The tokenized v1 variant (<unk> for rare words, ' @-@ ' splits, spaces around punctuation) in every "
            "split: local validation/test are wiki.valid/test.tokens; train is Hub only (wikitext-2-v1), never the "
            "raw variant, because a model trained on raw text never sees '<unk>' or '@-@' and would be scored "
            "unfairly on v1 text. For raw text use 'wikitext-2-raw'. Subword perplexity here is not the "
            "word-level perplexity of the literature. " + _WIKITEXT_NOTE
        ),
        source="Merity et al. 2016, WikiText; shared/data/MANIFEST.md section 3",
    )
)

register_dataset(
    DatasetSpec(
        name="wikitext-2-raw",
        task_type="language_modeling",
        metric="perplexity",
        hub_id="Salesforce/wikitext",
        hub_config="wikitext-2-raw-v1",
        local_files={
            "train": ("wikitext-2/wikitext-2-raw-v1/train.txt.gz",),
            "validation": ("wikitext-2/wikitext-2-raw-v1/valid.txt.gz",),
            "test": ("wikitext-2/wikitext-2-raw-v1/test.txt.gz",),
        },
        hub_splits={"train": "train", "validation": "validation", "test": "test"},
        label_column=None,
        official_rows={"train": 36_718, "validation": 3_760, "test": 4_358},
        local_rows={"test": 62},
        local_formats={"train": "wikitext", "validation": "wikitext", "test": "wikitext"},
        notes=(
            "The raw variant (no <unk>). Only test is stored locally (wiki.test.raw, CRLF normalized); train and "
            "validation are Hub only (wikitext-2-raw-v1). " + _WIKITEXT_NOTE
        ),
        source="Merity et al. 2016, WikiText; shared/data/MANIFEST.md section 3",
    )
)

register_dataset(
    DatasetSpec(
        name="wikitext-103",
        task_type="language_modeling",
        metric="perplexity",
        hub_id="Salesforce/wikitext",
        hub_config="wikitext-103-raw-v1",
        local_files={
            "train": ("wikitext-103/wikitext-103-raw-v1/train.txt.gz",),
            "validation": ("wikitext-103/wikitext-103-raw-v1/valid.txt.gz",),
            "test": ("wikitext-103/wikitext-103-raw-v1/test.txt.gz",),
        },
        hub_splits={"train": "train", "validation": "validation", "test": "test"},
        label_column=None,
        official_rows={"train": 1_801_350, "validation": 3_760, "test": 4_358},
        local_formats={"train": "wikitext", "validation": "wikitext", "test": "wikitext"},
        notes="Hub only (raw variant, about 540 MB; not stored in shared/data). " + _WIKITEXT_NOTE,
        source="Merity et al. 2016, WikiText; shared/data/MANIFEST.md section 3",
    )
)

register_dataset(
    DatasetSpec(
        name="openwebtext",
        task_type="language_modeling",
        metric="perplexity",
        hub_id="Skylion007/openwebtext",
        hub_config=None,
        local_files={"train": ("openwebtext/train.parquet",)},
        hub_splits={"train": "train"},
        label_column=None,
        official_rows={"train": 8_013_769},
        validation_holdout=0.0005,
        notes=(
            "Hub only (no real OpenWebText documents could be stored in shared/data). Train only upstream: "
            "validation = a seeded 0.05% of the documents (about 4,000, the nanoGPT convention), train = the rest."
        ),
        source="Gokaslan & Cohen 2019, OpenWebText; shared/data/MANIFEST.md section 6",
    )
)

# Gutenberg: one document per book; split by book AND author. Validation and test are the four
# shortest books whose author has no other book in the corpus (alternating by length), so no
# held-out author is seen in training. Evelina (incomplete in the source) stays in train.
_GUTENBERG_VALIDATION = ("HoraceWalpole__CastleOfOtranto", "MariaEdgeworth__CastleRackrent")
_GUTENBERG_TEST = ("WilliamBeckford__Vathek", "ClaraReeve__TheOldEnglishBaron")
_GUTENBERG_TRAIN = (
    "AnnRadcliffe__ASicilianRomance",
    "AnnRadcliffe__TheItalianVol1",
    "AnnRadcliffe__TheItalianVol2",
    "AnnRadcliffe__TheRomanceOfTheForest",
    "AnnRadcliffe__Udolpho",
    "CharlotteSmith__Emmeline",
    "ElizaHaywood__LoveInExcess",
    "FrancesBurney__Camilla",
    "FrancesBurney__CeciliaVol1",
    "FrancesBurney__CeciliaVol2",
    "FrancesBurney__CeciliaVol3",
    "FrancesBurney__Evelina",
    "FrancesBurney__TheWandererVol1",
    "FrancesBurney__TheWandererVol2",
    "FrancesBurney__TheWandererVol3",
    "FrancesBurney__TheWandererVol4",
    "FrancesBurney__TheWandererVol5",
    "HenryFielding__TomJones",
    "JaneAusten__PrideAndPrejudice",
    "MGLewis__TheMonk",
    "SamuelRichardson__Pamela",
    "TobiasSmollett__FerdinandFathom",
    "TobiasSmollett__HumphryClinker",
)


def _books(names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f"gutenberg/{n}.txt.gz" for n in names)


register_dataset(
    DatasetSpec(
        name="gutenberg",
        task_type="language_modeling",
        metric="perplexity",
        hub_id=None,
        hub_config=None,
        local_files={
            "train": _books(_GUTENBERG_TRAIN),
            "validation": _books(_GUTENBERG_VALIDATION),
            "test": _books(_GUTENBERG_TEST),
        },
        hub_splits={},
        label_column=None,
        official_rows={"train": 23, "validation": 2, "test": 2},
        local_rows={"train": 23, "validation": 2, "test": 2},
        local_formats={"train": "gutenberg", "validation": "gutenberg", "test": "gutenberg"},
        notes=(
            "27 18th-century English novels from Project Gutenberg, one document per book (about 4.97M GPT-2 tokens "
            "in all). Each book keeps only the text between the '*** START OF THE/THIS PROJECT GUTENBERG EBOOK' and "
            "'*** END OF ...' lines (header and licence removed). Split by book and author: validation = The Castle "
            "of Otranto + Castle Rackrent, test = Vathek + The Old English Baron (each about 3% of the text), train = "
            "the other 23 books. Front matter after the START line (title pages, prefaces) is kept. Evelina is "
            "incomplete in the source (stops mid-Volume II, no END line). Local only."
        ),
        source="Project Gutenberg via danwaterfield/DigHums; shared/data/MANIFEST.md section 10",
    )
)


# -- CPU stand-ins (configs/cpu/) --------------------------------------------------------------
# The original project's MNLI and XNLI runs train on MNLI's 392,702 English pairs, which are not
# in ``shared/data`` (Hub only). The only labelled local NLI data is the English XNLI validation
# split (2,490 pairs; the local XNLI test split has no gold labels). ``xnli-en-dev`` makes it a
# small NLI task of its own: a fixed 20% of those pairs (seeded hold-out, the same on every
# machine) is its validation split, the rest its training split. It is a stand-in with the same
# label set (entailment / neutral / contradiction), not the original benchmark: numbers on it are
# not comparable with published MNLI/XNLI accuracies.


def _xnli_en_dev() -> DatasetSpec:
    xnli = get_dataset_spec("xnli")
    return dataclasses.replace(
        xnli,
        name="xnli-en-dev",
        hub_id=None,
        hub_config=None,
        local_files={"train": xnli.local_files["validation"]},
        hub_splits={},
        official_rows={"train": 2_490},
        local_rows={"train": 2_490},
        validation_holdout=0.2,
        notes="CPU stand-in for MNLI/XNLI: the English XNLI validation pairs, 20% held out as validation. " + xnli.notes,
        source="Conneau et al. 2018, XNLI 1.0 (validation, English); shared/data/MANIFEST.md section 5b",
    )


XNLI_EN_DEV = _xnli_en_dev()
register_dataset(XNLI_EN_DEV)
