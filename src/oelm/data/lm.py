"""Language-modelling data: documents → tokenizer → one token stream → fixed-length blocks.

    load_documents("tinystories", "train")          → list[str]        (2,316 stories)
    get_lm_tokenizer("bpe-8192", docs, cache_dir)   → tokenizer        (trained once, then cached)
    pack_documents(docs, tok, block_size=256)       → LongTensor [num_blocks, 256]
    LMBlockDataset(blocks)[i]                       → {input_ids: [256], labels: [256]}

Packing (GPT-2 / nanoGPT practice): every document is tokenized, followed by one
``<|endoftext|>``, the results are concatenated, the tail that does not fill a block is
dropped, and the stream is cut into rows. A block can therefore span two documents; attention
is not masked at the ``<|endoftext|>`` (the model learns to reset there). ``labels`` equal
``input_ids``: the model shifts them by one internally (Hugging Face convention), so each block
of T tokens gives T - 1 next-token predictions.

The token stream of a (tokenizer, documents) pair is cached on disk as ``.npy`` (uint16 when the
vocabulary has at most 65,536 ids, else int32), so the Gutenberg corpus (~5M GPT-2 tokens) is
tokenized once per machine.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from oelm.data.registry import (
    DatasetSpec,
    find_local_files,
    get_dataset_spec,
    holdout_indices,
    load_hub_split,
    resolve_split,
)
from oelm.data.cache import load_token_cache, write_token_cache
from oelm.data.sources import is_own_data
from oelm.data.tables import TABLE_FORMATS, read_table
from oelm.data.text import check_texts, documents_digest
from oelm.data.tokenizers import (  # the tokenizers live there; their names stay importable from here
    EOS_TOKEN,
    get_lm_tokenizer,
    load_gpt2_tokenizer,
    load_tokenizer_file,
    save_tokenizer,
    tokenizer_record,
    train_bpe_tokenizer,
)
from oelm.errors import ConfigError, DataFormatError

__all__ = [
    "EOS_TOKEN",
    "LMBlockDataset",
    "documents_digest",
    "get_lm_tokenizer",
    "load_documents",
    "load_gpt2_tokenizer",
    "load_tokenizer_file",
    "pack_documents",
    "repair_cp1252_mojibake",
    "save_tokenizer",
    "split_paragraph_stories",
    "split_wikitext_articles",
    "strip_gutenberg_boilerplate",
    "tokenizer_record",
    "train_bpe_tokenizer",
]


# ---------------------------------------------------------------------------------------------
# Documents
# ---------------------------------------------------------------------------------------------


def load_documents(name: str, split: str, data_dir: str | os.PathLike | None = None, *, holdout_seed: int = 0) -> list[str]:
    """The documents (stories, articles, books) of one split of a language-modelling dataset.

    Local files under the data dir first (format per ``spec.local_formats``), else the Hub copy
    (rows of the ``text`` column; WikiText rows are lines and are regrouped into articles), else
    :class:`~oelm.errors.DataNotFoundError`. ``spec.text_fixes`` are applied to every document
    from either source; whitespace-only documents are dropped. For datasets with
    ``validation_holdout`` (OpenWebText) "validation" is a seeded fraction of the train documents
    and "train" the rest.

    Returns:
        list of non-empty str, in source order.

    Raises:
        ConfigError: unknown dataset or split, or a classification dataset.
        DataNotFoundError: neither under the data dir nor reachable on the Hub.
        DataFormatError: an unreadable file, a Gutenberg file without its START line, or no documents.
    """
    spec = get_dataset_spec(name)
    if spec.task_type != "language_modeling":
        raise ConfigError(f"dataset {name!r} is a {spec.task_type} task; use oelm.data.load_classification")
    stored, part = resolve_split(spec, split)
    fmt = spec.local_format(stored)
    paths = find_local_files(spec, stored, data_dir, split)
    if paths is not None:
        origin = ", ".join(str(p) for p in paths)
        docs = _read_local_documents(spec, split, paths, fmt)
    else:
        dataset = load_hub_split(spec, stored, data_dir, split)
        origin = f"Hub {spec.hub_id} ({spec.hub_config or 'default'}, split {spec.hub_splits[stored]})"
        column = spec.text_columns[0]
        if column not in dataset.column_names:
            raise DataFormatError(f"{spec.name}/{split}: {origin} has no column {column!r}; found {dataset.column_names}")
        rows = list(dataset[column])
        docs = split_wikitext_articles("".join(rows)) if fmt == "wikitext" else rows  # WikiText Hub rows are lines
    docs = [_apply_fixes(d, spec.text_fixes) for d in docs]
    docs = [d for d in docs if d and not d.isspace()]
    if not docs:
        fix = "give files with text in them" if is_own_data(spec) else "use the file(s) from shared/data (MANIFEST.md)"
        raise DataFormatError(f"{spec.name}/{split}: no documents in {origin}. Fix: {fix}.")
    if part is not None:
        train_idx, val_idx = holdout_indices(len(docs), spec.validation_holdout, holdout_seed)
        docs = [docs[i] for i in (val_idx if part == "validation" else train_idx)]
        if not docs:
            raise DataFormatError(
                f"{spec.name}/{split}: no documents left after holding out validation from the "
                f"{len(train_idx) + len(val_idx)} document(s) of {origin}. Fix: use at least 2 training documents."
            )
    return docs


def _read_text(spec: DatasetSpec, split: str, path: Path) -> str:
    kind = "gzip-compressed" if path.suffix == ".gz" else "plain"
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        text = raw.decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise DataFormatError(
            f"{spec.name}/{split}: cannot read {path} as {kind} UTF-8 text "
            f"({type(exc).__name__}: {exc}). Fix: replace it with the file from shared/data (MANIFEST.md has the sha256)."
        ) from exc
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _read_local_documents(spec: DatasetSpec, split: str, paths: list[Path], fmt: str) -> list[str]:
    if fmt in TABLE_FORMATS:
        column = spec.text_columns[0]
        docs: list[str] = []
        own = is_own_data(spec)
        for path in paths:
            frame = read_table(path, fmt, f"{spec.name}/{split}", (column,),
                               "Fix: check the file named in task.source.files." if own else None)
            if column not in frame.columns:
                fix = " Fix: set task.source.text_columns to the column that holds the documents." if own else ""
                raise DataFormatError(f"{spec.name}/{split}: {path} lacks column {column!r}; found {list(frame.columns)}.{fix}")
            texts = frame[column].dropna().tolist()
            check_texts(texts, f"{spec.name}/{split}: {path}: column {column!r}", "row")
            docs.extend(texts)
        return docs
    docs = []
    for path in paths:
        text = _read_text(spec, split, path)
        if fmt == "eot_text":
            docs.extend(piece.strip("\n") for piece in text.split(EOS_TOKEN))
        elif fmt == "paragraph_stories":
            docs.extend(split_paragraph_stories(text))
        elif fmt == "wikitext":
            docs.extend(split_wikitext_articles(text))
        elif fmt == "gutenberg":
            try:
                docs.append(strip_gutenberg_boilerplate(text))
            except ValueError as exc:
                raise DataFormatError(f"{spec.name}/{split}: {path}: {exc}") from None
        else:  # pragma: no cover - DatasetSpec validates local_formats
            raise ConfigError(f"{spec.name}/{split}: unknown local format {fmt!r}")
    return docs


# TinyStories' validation sample: the HF export wrote `story.strip() + "\n\n"` and the HF text
# separates paragraphs with "\n\n" too, so a blank line is either. Most stories open with this.
_STORY_OPENING = "Once upon a time"


def split_paragraph_stories(text: str) -> list[str]:
    """Cut text whose paragraphs *and* stories are separated by blank lines into pseudo-stories.

    A new document starts at every paragraph that begins with "Once upon a time"; paragraphs of
    one document are joined by a single newline (the official TinyStories .txt form). On the
    TinyStories train sample, where boundaries are known, that opening starts 55% of stories and
    begins a later paragraph in 3% of them: the cut is mostly right, but some documents hold
    more than one story.
    """
    paragraphs = [p.strip("\n") for p in re.split(r"\n[ \t]*\n", text)]
    docs: list[list[str]] = []
    for paragraph in paragraphs:
        if not paragraph.strip():
            continue
        if not docs or paragraph.lstrip().startswith(_STORY_OPENING):
            docs.append([])
        docs[-1].append(paragraph)
    return ["\n".join(d) for d in docs]


# A level-1 WikiText heading line: " = Title = " (sections are " = = Title = = ").
_WIKI_ARTICLE_HEADING = re.compile(r"^ ?= [^=].* = ?$")


def split_wikitext_articles(text: str) -> list[str]:
    """WikiText lines → articles, cut before every level-1 heading line; blank lines dropped.

    Works on the stored files (one line per Hub row) and on the Hub rows joined with "".
    """
    articles: list[list[str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if not articles or _WIKI_ARTICLE_HEADING.match(line):
            articles.append([])
        articles[-1].append(line)
    return ["\n".join(a) for a in articles]


_PG_START = re.compile(r"^\*\*\*\s*START OF (?:THE|THIS) PROJECT GUTENBERG EBOOK.*$", re.IGNORECASE | re.MULTILINE)
_PG_END = re.compile(r"^\*\*\*\s*END OF (?:THE|THIS) PROJECT GUTENBERG EBOOK.*$", re.IGNORECASE | re.MULTILINE)


def strip_gutenberg_boilerplate(text: str) -> str:
    """The book text of a Project Gutenberg file: the lines between ``*** START OF THE/THIS PROJECT
    GUTENBERG EBOOK ... ***`` and ``*** END OF ...``, stripped (no END line: up to the end of the file).

    Raises:
        ValueError: no START line (the PG header and licence could not be told from the book).
    """
    start = _PG_START.search(text)
    if start is None:
        raise ValueError("no '*** START OF THE PROJECT GUTENBERG EBOOK' line, so the PG header cannot be removed")
    end = _PG_END.search(text, start.end())
    return text[start.end() : end.start() if end else len(text)].strip()


# UTF-8 bytes E2 80 xx read as cp1252 give "â€" + one character. The byte 0x9D (of ” U+201D) has
# no cp1252 character, so that one shows up as a bare "â€" followed by the next real character.
_MOJIBAKE = re.compile("\u00e2\u20ac(.?)", re.DOTALL)


def _unmojibake(match: re.Match) -> str:
    tail = match.group(1)
    try:
        return ("\u00e2\u20ac" + tail).encode("cp1252").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return "\u201d" + tail  # the lost 0x9D: a closing double quote


def repair_cp1252_mojibake(text: str) -> str:
    """Undo UTF-8-read-as-cp1252 damage of the General Punctuation block (‘ ’ “ ” – — …).

    "â€™" → "’", "â€œ" → "“", bare "â€" → "”" (its third byte 0x9D is not in cp1252). Clean text
    is unchanged ("â€" never occurs in correct English text).
    """
    return _MOJIBAKE.sub(_unmojibake, text) if "\u00e2\u20ac" in text else text


def _apply_fixes(doc: str, fixes: Sequence[str]) -> str:
    if "cp1252_mojibake" in fixes:
        doc = repair_cp1252_mojibake(doc)
    if "single_newline_paragraphs" in fixes:
        doc = re.sub(r"\n[ \t]*\n+", "\n", doc)
    return doc


def _tokenizer_fingerprint(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    state = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    return hashlib.sha256(f"{state}|eos={tokenizer.eos_token_id}".encode()).hexdigest()


def _encode_stream(documents: Sequence[str], tokenizer, dtype: np.dtype, batch: int = 1024) -> np.ndarray:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    eos = np.array([tokenizer.eos_token_id], dtype=dtype)
    parts: list[np.ndarray] = []
    for start in range(0, len(documents), batch):
        chunk = list(documents[start : start + batch])
        if backend is not None:  # Rust batch encoding; no "longer than model_max_length" warnings
            ids = [e.ids for e in backend.encode_batch(chunk, add_special_tokens=False)]
        else:
            ids = tokenizer(chunk, add_special_tokens=False)["input_ids"]
        for doc_ids in ids:
            parts.append(np.asarray(doc_ids, dtype=dtype))
            parts.append(eos)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def pack_documents(
    documents: Sequence[str], tokenizer, block_size: int, cache_dir: str | os.PathLike | None = None, *,
    what: str | None = None,
) -> torch.LongTensor:
    """Tokenize, append ``<|endoftext|>`` after each document, concatenate, cut into blocks.

    Returns:
        LongTensor ``[num_blocks, block_size]``, ``num_blocks = total_tokens // block_size``
        (the tail remainder is dropped; 0 blocks if there are fewer tokens than one block).

    The concatenated stream is cached as ``cache_dir/tokens-<key>.npz`` (uint16 for vocabularies
    of <= 65,536 ids, else int32), ``key`` = hash of the tokenizer (its full serialized state:
    vocab, merges, normalizer) and :func:`documents_digest`; the cache is independent of
    ``block_size``. The file carries its identity (documents sha256 and count, tokenizer, tokens,
    and ``what``, a label such as ``tinystories/train`` shown in messages). A damaged cache file
    (truncated, wrong dtype, ids outside the vocabulary) or one whose identity is not these
    documents' (another split's file under this name) is deleted, with a warning, and the stream
    encoded again (:mod:`oelm.data.cache`).

    Raises:
        DataFormatError: the tokenizer has no eos token, or a document is not a ``str`` or not
            valid Unicode (a lone surrogate).
        ConfigError: ``block_size`` < 1.
    """
    if block_size < 1:
        raise ConfigError(f"block_size must be >= 1, got {block_size}")
    check_texts(documents, "cannot pack documents", "document")
    if tokenizer.eos_token_id is None:
        raise DataFormatError(
            f"tokenizer {type(tokenizer).__name__} has no eos token to separate documents; set tokenizer.eos_token"
        )
    dtype = np.dtype(np.uint16) if len(tokenizer) <= 65_536 else np.dtype(np.int32)
    path, identity = None, None
    if cache_dir is not None:
        digest, tokenizer_digest = documents_digest(documents), _tokenizer_fingerprint(tokenizer)
        key = hashlib.sha256(f"{tokenizer_digest}|{digest}".encode()).hexdigest()[:24]
        path = Path(cache_dir) / f"tokens-{key}.npz"
        identity = {"what": what, "documents_sha256": digest, "documents": len(documents), "tokenizer": tokenizer_digest,
                    "dtype": dtype.name}
    stream = load_token_cache(path, dtype, len(tokenizer), identity) if path is not None and path.is_file() else None
    if stream is None:
        stream = _encode_stream(documents, tokenizer, dtype)
        if path is not None:
            write_token_cache(path, stream, identity)
    n_blocks = len(stream) // block_size
    return torch.from_numpy(stream[: n_blocks * block_size].astype(np.int64)).view(n_blocks, block_size)


class LMBlockDataset(torch.utils.data.Dataset):
    """Packed blocks for causal LM training: item i is ``{"input_ids": LongTensor[block_size],
    "labels": the same tensor}`` (the model shifts labels internally). ``eos_token_id``: the
    end-of-text id :func:`pack_documents` put after each document (None: unknown), by which the
    final runs' per-document predictions tell documents apart."""

    def __init__(self, blocks: torch.Tensor, eos_token_id: int | None = None):
        if blocks.dim() != 2 or blocks.dtype != torch.long:
            got = f"{blocks.dtype} {tuple(blocks.shape)}"
            raise DataFormatError(f"LMBlockDataset needs a LongTensor [num_blocks, block_size], got {got}")
        self.blocks = blocks
        self.eos_token_id = eos_token_id

    @property
    def block_size(self) -> int:
        return self.blocks.shape[1]

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        block = self.blocks[i]
        return {"input_ids": block, "labels": block}
