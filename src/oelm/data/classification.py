"""Classification data: load a split as a DataFrame, subsample it, tokenize it, batch it.

    load_classification("sst2", "train")      → DataFrame[text, label]         (67,349 rows)
    subsample(df, 8000, seed=0)               → DataFrame                      (8,000 rows)
    encode_classification(df, tok, ("text",), max_length=128)
                                              → Dataset of unpadded examples
    DataLoader(ds, collate_fn=classification_collator(tok))
                                              → {input_ids: [B, T_batch], attention_mask: [B, T_batch],
                                                 (token_type_ids,) labels: [B]}

Padding is per batch (to the longest example in it), never to ``max_length``: on SST-2 the
median sentence is ~10 tokens, so padding everything to 128 would waste most of the compute.
``classification_collator(tok, buckets=length_buckets(128))`` pads to one of a few lengths
instead (16, 32, 64, 128), so compiled code and CUDA graphs see few shapes.

``encode_classification(..., cache_dir=dir)`` keeps the encodings in ``dir/cls-<key>.npz``
(:func:`encoding_cache_key`), so a later run of the same data skips the tokenizer.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import torch

from oelm.data.registry import DatasetSpec, find_local_files, get_dataset_spec, holdout_indices, load_hub_split, resolve_split
from oelm.data.sources import is_own_data
from oelm.data.tables import read_table
from oelm.data.text import check_texts, documents_digest
from oelm.data.tokenizers import tokenizer_record
from oelm.errors import ConfigError, DataFormatError

if TYPE_CHECKING:  # pandas (~0.4 s to import) is imported where a file is read, not with oelm.data
    import pandas as pd

__all__ = [
    "ClassificationDataset",
    "check_texts",
    "classification_collator",
    "encode_classification",
    "encoding_cache_key",
    "length_buckets",
    "load_classification",
    "held_out_rest",
    "subsample",
]


def load_classification(
    name: str,
    split: str,
    data_dir: str | os.PathLike | None = None,
    *,
    holdout_seed: int = 0,
    allow_unlabeled: bool = False,
) -> pd.DataFrame:
    """One split of a registered classification dataset.

    Args:
        name: registered dataset (``oelm.data.DATASETS``), e.g. "sst2".
        split: "train", "validation", "test", or a dataset-specific name ("validation_matched").
        data_dir: folder laid out like ``shared/data``; default ``$OELM_DATA_DIR``. When the split
            is not there, the Hub copy is used (unless ``HF_HUB_OFFLINE=1``).
        holdout_seed: seed of the train/validation hold-out, for datasets without a validation
            split (``spec.validation_holdout``); "train" then excludes exactly the validation rows.
        allow_unlabeled: accept rows with label -1 (no gold label, e.g. the XNLI test file) —
            for writing predictions only; such a split cannot be scored.

    Returns:
        DataFrame with columns ``spec.text_columns`` (str) + ``"label"`` (int64, in
        ``[0, len(label_names))``), index ``0..n-1``, rows in file order.

    Raises:
        ConfigError: unknown dataset or split, or a language-modelling dataset.
        DataNotFoundError: neither under the data dir nor reachable on the Hub.
        DataFormatError: missing columns (the message lists the columns found and expected),
            null or non-string text, non-integer or out-of-range labels, an unlabeled split
            (without ``allow_unlabeled``), or no rows (also: none left after a row filter or
            the validation hold-out).
    """
    spec = get_dataset_spec(name)
    if spec.task_type != "classification":
        raise ConfigError(f"dataset {name!r} is a {spec.task_type} task; use oelm.data.load_documents")
    stored, part = resolve_split(spec, split)
    paths = find_local_files(spec, stored, data_dir, split)
    if paths is not None:
        origin = ", ".join(str(p) for p in paths)
        frame = _read_tables(spec, split, paths, spec.local_format(stored))
        frame = _apply_row_filter(spec, split, frame, origin)
    else:
        frame = load_hub_split(spec, stored, data_dir, split).to_pandas()
        frame = frame.rename(columns=dict(spec.hub_columns))
        origin = f"Hub {spec.hub_id} ({spec.hub_config or 'default'}, split {spec.hub_splits[stored]})"
    df = _to_layout(spec, split, frame, origin, allow_unlabeled)
    if part is not None:
        train_idx, val_idx = holdout_indices(len(df), spec.validation_holdout, holdout_seed)
        df = df.iloc[val_idx if part == "validation" else train_idx].reset_index(drop=True)
        if df.empty:
            raise DataFormatError(
                f"{spec.name}/{split}: no rows left after holding out validation from the {len(train_idx) + len(val_idx)} "
                f"row(s) of {origin} ({spec.validation_holdout:g} of train becomes validation). "
                "Fix: use a train file with at least 2 rows (shared/data, MANIFEST.md)."
            )
    return df


def _read_tables(spec: DatasetSpec, split: str, paths: list[Path], fmt: str) -> pd.DataFrame:
    """The split's table files in format ``fmt`` (:mod:`oelm.data.tables`), one after another."""
    import pandas as pd

    fix = "Fix: check the file named in task.source.files." if is_own_data(spec) else None
    frames = [read_table(path, fmt, f"{spec.name}/{split}", spec.text_columns, fix) for path in paths]
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def _apply_row_filter(spec: DatasetSpec, split: str, frame: pd.DataFrame, origin: str) -> pd.DataFrame:
    for column, value in spec.row_filter.items():
        if column not in frame.columns:
            raise DataFormatError(
                f"{spec.name}/{split}: {origin} lacks column {column!r}, needed to keep rows with {column} == {value!r}; "
                f"found columns {list(frame.columns)}. Fix: use the file from shared/data (MANIFEST.md)."
            )
        frame = frame[frame[column] == value]
    return frame


def _to_layout(spec: DatasetSpec, split: str, frame: pd.DataFrame, origin: str, allow_unlabeled: bool) -> pd.DataFrame:
    """Select and check ``text_columns + label``; see :func:`load_classification` for the rules."""
    where = f"{spec.name}/{split} ({origin})"
    required = [*spec.text_columns, spec.label_column]
    missing = [c for c in required if c not in frame.columns]
    own = is_own_data(spec)
    if missing:
        layout = ("set task.source.text_columns and task.source.label_column to the file's columns" if own else
                  "Parquet laid out like shared/data: text columns + int64 label")
        raise DataFormatError(
            f"{where}: missing column(s) {missing}; found {list(frame.columns)}. Expected columns {required} ({layout})."
        )
    df = frame[required].rename(columns={spec.label_column: "label"}).reset_index(drop=True)
    if df.empty:
        filt = "".join(f" with {c} == {v!r}" for c, v in spec.row_filter.items())
        fix = "give a file with at least one example" if own else "use the file from shared/data (MANIFEST.md)"
        raise DataFormatError(f"{where}: the split has no rows{filt}. Fix: {fix}.")
    for column in spec.text_columns:
        nulls = int(df[column].isna().sum())
        if nulls:
            raise DataFormatError(f"{where}: column {column!r} has {nulls} missing text value(s); drop or fill them.")
        check_texts(df[column].tolist(), f"{where}: column {column!r}", "row")
        df[column] = df[column].astype(str)
    df["label"] = _integer_labels(df["label"], where, spec)
    unlabeled = int((df["label"] == -1).sum())
    if unlabeled and not allow_unlabeled:
        scope = "the split is unlabeled" if unlabeled == len(df) else f"{unlabeled} of {len(df)} rows are unlabeled"
        raise DataFormatError(
            f"{where}: {scope} (label = -1, no gold label), so it cannot be trained on or scored. "
            f"Use a labeled split, or pass allow_unlabeled=True to load it for predictions only. {spec.notes}".rstrip()
        )
    labels = df["label"][df["label"] != -1] if allow_unlabeled else df["label"]
    upper = len(spec.label_names) if spec.label_names else None
    bad = labels[(labels < 0) | (labels >= upper)] if upper else labels[labels < 0]
    if len(bad):
        allowed = f"0..{upper - 1} ({', '.join(spec.label_names)})" if upper else ">= 0"
        shown = sorted(set(bad.tolist()))[:5]
        raise DataFormatError(f"{where}: {len(bad)} label(s) out of range, e.g. {shown}; labels must be {allowed}.")
    return df


def _label_set(spec: DatasetSpec) -> str:
    if spec.label_names:
        return f"0..{len(spec.label_names) - 1} ({', '.join(f'{i} = {n}' for i, n in enumerate(spec.label_names))})"
    return "integers >= 0"


def _integer_labels(labels: pd.Series, where: str, spec: DatasetSpec) -> pd.Series:
    """Labels as int64 class ids. In your own data (``task.source``), labels given as text (a CSV
    of "negative" / "positive") become their index in ``spec.label_names`` when every one is among
    those names; shipped files hold int64 ids (MANIFEST.md), so text there is refused."""
    import pandas as pd

    if spec.label_names and is_own_data(spec) and not pd.api.types.is_numeric_dtype(labels) and not pd.api.types.is_bool_dtype(labels):
        ids = {name: i for i, name in enumerate(spec.label_names)}
        if labels.notna().all() and labels.map(lambda v: isinstance(v, str) and v in ids).all():
            return labels.map(ids).astype("int64")
        unknown = sorted({repr(v) for v in labels.tolist() if not (isinstance(v, str) and v in ids)})[:3]
        raise DataFormatError(
            f"{where}: column 'label' holds {', '.join(unknown)}, which is neither a class id {_label_set(spec)} nor one "
            f"of the label names {list(spec.label_names)}. Fix: map the labels to those ids or names."
        )
    if pd.api.types.is_bool_dtype(labels) or not pd.api.types.is_numeric_dtype(labels):
        shown = sorted({repr(v) for v in labels.dropna().tolist()[:1000]})[:3]
        raise DataFormatError(
            f"{where}: column 'label' must hold integer class ids {_label_set(spec)}, got dtype {labels.dtype} "
            f"(e.g. {', '.join(shown) or 'nothing'}). Fix: map the labels to those ids."
        )
    if labels.isna().any() or not np.all(np.equal(np.mod(labels.to_numpy(dtype=float), 1), 0)):
        raise DataFormatError(
            f"{where}: column 'label' must hold integer class ids {_label_set(spec)} "
            "(found missing or fractional values)."
        )
    return labels.astype("int64")


def subsample(data, n: int | None, seed: int):
    """A deterministic random subset of ``n`` rows (DataFrame) or items (list), in original order.

    ``n`` None or ``>= len(data)``: ``data`` unchanged. Not stratified: class balance follows the
    split's. The same ``(len(data), n, seed)`` always picks the same positions (legacy
    ``RandomState``, whose stream NumPy keeps frozen), whether ``data`` is a DataFrame of
    examples or a list of documents. A DataFrame comes back with its index reset.

    Raises:
        ConfigError: ``n`` is negative.
    """
    if n is None or n >= len(data):
        return data
    if n < 0:
        raise ConfigError(f"subsample size must be >= 0 or None, got {n}")
    return _take(data, np.sort(_subset_positions(len(data), n, seed)))


def _subset_positions(length: int, n: int, seed: int) -> np.ndarray:
    """The positions :func:`subsample` takes (legacy ``RandomState``: a frozen stream)."""
    return np.random.RandomState(seed).permutation(length)[:n]


def _take(data, idx):
    """Rows (DataFrame, index reset) or items (list) at positions ``idx``."""
    pd = sys.modules.get("pandas")  # a DataFrame exists only once pandas is imported
    if pd is not None and isinstance(data, pd.DataFrame):
        return data.iloc[list(idx)].reset_index(drop=True)
    return [data[i] for i in idx]


def held_out_rest(data, n: int, seed: int):
    """What :func:`subsample` ``(data, n, seed)`` leaves out, in original order: the items or rows
    a test set may use when it comes from the same split as a validation subset of ``n``.

    Raises:
        ConfigError: ``n`` is not below ``len(data)`` (nothing would be left for the test set).
    """
    if n is None or n >= len(data):
        raise ConfigError(
            f"task.validation_samples={n} takes the whole split ({len(data)} items), so nothing is left for a test set "
            f"drawn from the same split; set task.validation_samples below {len(data)}"
        )
    taken = set(_subset_positions(len(data), n, seed).tolist())
    return _take(data, [i for i in range(len(data)) if i not in taken])


class ClassificationDataset(torch.utils.data.Dataset):
    """Tokenized, unpadded examples: item i is ``{input_ids: list[int], attention_mask: list[int],
    [token_type_ids: list[int]], labels: int}``; lengths vary (<= max_length)."""

    def __init__(self, encodings: dict[str, list[list[int]]], labels: Sequence[int]):
        self.encodings = encodings
        self.labels = list(labels)

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def lengths(self) -> list[int]:
        """Tokens per example (for length-grouped batching and length-sorted evaluation)."""
        return [len(ids) for ids in self.encodings["input_ids"]]

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = {key: values[i] for key, values in self.encodings.items()}
        item["labels"] = self.labels[i]
        return item


def encode_classification(df: pd.DataFrame, tokenizer, text_columns: Sequence[str], max_length: int, *,
                          cache_dir: str | os.PathLike | None = None,
                          tokenizer_sha256: str | None = None, what: str | None = None) -> ClassificationDataset:
    """Tokenize every row (single text or sentence pair) without padding, truncated to ``max_length``.

    Sentence pairs are truncated longest-first, so both sentences keep tokens. Special tokens
    ([CLS]/[SEP] for BERT; none for GPT-2) are added by the tokenizer and count toward ``max_length``.

    ``cache_dir``: read the encodings from, or write them to, ``cache_dir/cls-<key>.npz``
    (:func:`encoding_cache_key`; ``tokenizer_sha256`` is the tokenizer's
    :func:`oelm.data.tokenizers.tokenizer_record` hash, computed when not given). The labels always come
    from ``df``. The file carries its identity (texts sha256, tokenizer, ``max_length``, rows, and
    ``what``, a label such as ``sst2/validation`` shown in messages). A cache file that cannot be
    read, does not fit (row count, lengths, ids outside the vocabulary) or encodes other texts
    (another split's file under this name) is warned about, deleted and written again.

    Raises:
        DataFormatError: ``df`` lacks a text column or the ``label`` column, or a text is not a
            ``str`` or not valid Unicode (:func:`check_texts`).
        ConfigError: not one or two text columns, or ``max_length`` < 1.
    """
    text_columns = tuple(text_columns)
    if not 1 <= len(text_columns) <= 2:
        raise ConfigError(f"text_columns must be one column or a sentence pair, got {text_columns}")
    if max_length < 1:
        raise ConfigError(f"max_length must be >= 1, got {max_length}")
    missing = [c for c in (*text_columns, "label") if c not in df.columns]
    if missing:
        raise DataFormatError(f"cannot encode: DataFrame lacks column(s) {missing}; found {list(df.columns)}")
    texts = [df[c].tolist() for c in text_columns]
    for column, values in zip(text_columns, texts):
        check_texts(values, f"cannot encode column {column!r}", "row")
    labels = df["label"].astype("int64").tolist()
    path = None
    identity = None
    if cache_dir is not None:
        key = encoding_cache_key(texts, tokenizer, text_columns, max_length, tokenizer_sha256)
        path = Path(cache_dir) / f"cls-{key}.npz"
        identity = _encoding_identity(texts, key, len(labels), max_length, what)
        cached = _load_encodings(path, len(labels), max_length, len(tokenizer), identity) if path.is_file() else None
        if cached is not None:  # written before this check existed, or by a tokenizer fixed since: checked too
            _check_every_row_has_tokens(cached["input_ids"], texts, tokenizer, what)
            return ClassificationDataset(cached, labels)
    encodings = dict(tokenizer(*texts, truncation=True, max_length=max_length, padding=False))
    _check_every_row_has_tokens(encodings["input_ids"], texts, tokenizer, what)
    if path is not None:
        _write_encodings(path, encodings, identity)
    return ClassificationDataset(encodings, labels)


def _check_every_row_has_tokens(input_ids: Sequence[Sequence[int]], texts: Sequence[Sequence[str]], tokenizer,
                                what: str | None) -> None:
    """Refuse rows that encode to no token: a batch of them has shape ``[B, 0]`` (a model's forward
    fails on it, deep inside), and a row of padding alone in a batch is attended by nothing.

    Raises:
        DataFormatError: one line naming the split, how many rows, the first row and its text, and
            the fix (every row empty: the tokenizer's files; some: an empty text in the data).
    """
    empty = [i for i, ids in enumerate(input_ids) if len(ids) == 0]
    if not empty:
        return
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    first = " / ".join(repr(column[empty[0]][:60]) for column in texts)
    fix = ("the tokenizer turns every text into nothing: check its files (a vocabulary, its merges) or use the "
           "model's own tokenizer" if len(empty) == len(input_ids) else
           "drop the rows whose text is empty (a classifier needs at least one token per example)")
    raise DataFormatError(f"{what or 'cannot encode'}: {len(empty)} of {len(input_ids)} rows have no token after "
                          f"tokenization by {name} (vocabulary of {len(tokenizer)}); the first is row {empty[0]}: {first}. "
                          f"Fix: {fix}.")


_ENCODING_FORMAT = "cls-encodings-v2"  # bump when the file layout or what encode_classification asks changes


def encoding_cache_key(texts: Sequence[Sequence[str]], tokenizer, text_columns: Sequence[str], max_length: int,
                       tokenizer_sha256: str | None = None) -> str:
    """The 24-hex-digit key of one split's cached encodings: sha256 over the texts (each column's
    :func:`oelm.data.text.documents_digest`), the tokenizer's identity (``tokenizer_sha256``, its
    :func:`oelm.data.tokenizers.tokenizer_record` hash, computed when None), what else decides the ids a
    call returns (the fast tokenizer's post-processor, which adds [CLS]/[SEP]; truncation side;
    model input names; class), ``max_length`` and the column names."""
    if tokenizer_sha256 is None:
        tokenizer_sha256 = tokenizer_record(tokenizer, "")["sha256"]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    processor = getattr(backend, "post_processor", None)
    post = processor.__getstate__().decode() if processor is not None else None  # its JSON, as in tokenizer.json
    parts = {
        "format": _ENCODING_FORMAT,
        "texts": [documents_digest(column) for column in texts],
        "tokenizer": tokenizer_sha256,
        "post_processor": post,
        "calls": [type(tokenizer).__name__, getattr(tokenizer, "truncation_side", None),
                  list(getattr(tokenizer, "model_input_names", []))],
        "max_length": int(max_length),
        "text_columns": list(text_columns),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def _encoding_identity(texts: Sequence[Sequence[str]], key: str, rows: int, max_length: int,
                       what: str | None) -> dict[str, Any]:
    """What one cached encoding file encodes (:func:`oelm.data.cache.identity_problem`): the texts'
    sha256 first, so a file of another split is named by its texts; ``key`` covers the rest."""
    texts_sha256 = hashlib.sha256("|".join(documents_digest(column) for column in texts).encode()).hexdigest()
    return {"what": what, "texts_sha256": texts_sha256, "rows": rows, "max_length": int(max_length), "key": key}


def _write_encodings(path: Path, encodings: dict[str, list[list[int]]], identity: dict[str, Any] | None = None) -> None:
    """One ``.npz``: ``names`` (the tokenizer's output keys, in order), ``offsets`` [rows + 1]
    (shared: every key has the same length per row), one flat int32 array per key, and
    ``identity`` (:func:`oelm.data.cache.identity_array`)."""
    from oelm.data.cache import identity_array, write_array_cache

    names = list(encodings)
    lengths = np.fromiter((len(row) for row in encodings[names[0]]), dtype=np.int64, count=len(encodings[names[0]]))
    arrays = {"names": np.array(names), "offsets": np.concatenate([[0], np.cumsum(lengths)])}
    if identity is not None:
        arrays["identity"] = identity_array(identity)
    for name in names:
        rows = encodings[name]
        arrays[f"flat_{name}"] = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int32, count=int(lengths.sum()))
    write_array_cache(path, arrays, "encoding cache")


def _load_encodings(path: Path, rows: int, max_length: int, vocab_size: int,
                    identity: dict[str, Any] | None = None) -> dict[str, list[list[int]]] | None:
    """The encodings cached at ``path``, or None (after a warning, the file deleted) when the file
    cannot be read, does not fit ``rows`` examples of at most ``max_length`` ids below
    ``vocab_size``, or (``identity`` given) encodes other texts."""
    from oelm.data.cache import FOREIGN, drop_damaged_cache, identity_problem, load_array_cache, read_identity

    arrays = load_array_cache(path)
    if arrays is None:
        return None
    names = [str(n) for n in arrays.get("names", np.zeros(0, dtype=str))]
    offsets = arrays.get("offsets")
    problem = None
    if not names or "input_ids" not in names or any(f"flat_{n}" not in arrays for n in names):
        problem = f"holds arrays {sorted(arrays)}, expected names, offsets and flat_<key> for input_ids and the rest"
    elif offsets is None or offsets.ndim != 1 or len(offsets) != rows + 1:
        problem = f"has offsets for {None if offsets is None else len(offsets) - 1} rows, the split has {rows}"
    elif offsets[0] != 0 or np.any(np.diff(offsets) < 0) or np.any(np.diff(offsets) > max_length):
        problem = f"has row lengths outside 0..{max_length}"
    elif any(arrays[f"flat_{n}"].shape != (int(offsets[-1]),) for n in names):
        problem = f"has flat arrays whose lengths differ from the offsets' total {int(offsets[-1])}"
    else:
        ids = arrays["flat_input_ids"]
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            problem = f"holds ids outside the tokenizer's {vocab_size} ids"
    if problem is not None:
        drop_damaged_cache(path, problem)
        return None
    foreign = identity_problem(read_identity(arrays), identity) if identity is not None else None
    if foreign is not None:
        drop_damaged_cache(path, foreign, FOREIGN)
        return None
    bounds = offsets.tolist()
    encodings = {}
    for name in names:
        flat = arrays[f"flat_{name}"].tolist()
        encodings[name] = [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    return encodings


def length_buckets(max_length: int, smallest: int = 16) -> tuple[int, ...]:
    """Padded lengths for :func:`classification_collator`: powers of two from ``smallest`` below
    ``max_length``, then ``max_length`` itself, e.g. ``128 -> (16, 32, 64, 128)``,
    ``100 -> (16, 32, 64, 100)``. A handful of shapes, so compiled code and CUDA graphs are reused.

    Raises:
        ConfigError: ``max_length`` or ``smallest`` below 1.
    """
    if max_length < 1 or smallest < 1:
        raise ConfigError(f"length buckets need max_length >= 1 and smallest >= 1, got {max_length} and {smallest}")
    sizes, size = [], smallest
    while size < max_length:
        sizes.append(size)
        size *= 2
    return (*sizes, max_length)


class _BucketedPadding:
    """Pad each batch to the smallest bucket that holds its longest example (longer: to that example)."""

    def __init__(self, tokenizer, buckets: Sequence[int]):
        from transformers import DataCollatorWithPadding

        self.buckets = tuple(sorted(set(int(b) for b in buckets)))
        self.longest = DataCollatorWithPadding(tokenizer=tokenizer, padding="longest", return_tensors="pt")
        self.fixed = {b: DataCollatorWithPadding(tokenizer=tokenizer, padding="max_length", max_length=b, return_tensors="pt")
                      for b in self.buckets}

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        longest = max(len(f["input_ids"]) for f in features)
        bucket = next((b for b in self.buckets if b >= longest), None)
        return (self.fixed[bucket] if bucket is not None else self.longest)(features)


def classification_collator(tokenizer, pad_to_multiple_of: int | None = None,
                            buckets: Sequence[int] | None = None) -> Callable[[list[dict]], dict[str, torch.Tensor]]:
    """A ``collate_fn`` that pads each batch to its longest example (``DataCollatorWithPadding``),
    or, with ``buckets``, to the smallest of those lengths that holds it (e.g.
    :func:`length_buckets`: every batch then has one of a few shapes, which compiled code and CUDA
    graphs reuse; the attention mask keeps the extra padding inert). ``buckets=None`` (default):
    per-batch longest, the fewest padded tokens (best for eager CPU runs).

    Output: ``input_ids`` / ``attention_mask`` (/ ``token_type_ids``) LongTensor ``[B, T_batch]``,
    ``labels`` LongTensor ``[B]``. Padding follows ``tokenizer.padding_side``.

    Raises:
        DataFormatError: the tokenizer has no pad token.
        ConfigError: both ``pad_to_multiple_of`` and ``buckets``, or a bucket below 1.
    """
    from transformers import DataCollatorWithPadding

    if tokenizer.pad_token is None:
        raise DataFormatError(
            f"tokenizer {type(tokenizer).__name__} has no pad token, so batches cannot be padded. Fix: "
            "tokenizer.pad_token = tokenizer.eos_token (GPT-2 style; the attention mask hides the padding), or "
            "tokenizer.add_special_tokens({'pad_token': '[PAD]'}) and resize the model's embeddings."
        )
    if buckets is not None:
        if pad_to_multiple_of is not None:
            raise ConfigError("classification_collator: give pad_to_multiple_of or buckets, not both")
        if not buckets or min(buckets) < 1:
            raise ConfigError(f"classification_collator: buckets must be lengths >= 1, got {list(buckets)}")
        return _BucketedPadding(tokenizer, buckets)
    return DataCollatorWithPadding(tokenizer=tokenizer, padding="longest", pad_to_multiple_of=pad_to_multiple_of, return_tensors="pt")
