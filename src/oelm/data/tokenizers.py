"""Tokenizers of oelm's language-modelling runs and their identities.

    load_gpt2_tokenizer(data_dir)                   → GPT-2's byte-level BPE (local files, else the Hub)
    train_bpe_tokenizer(docs, 8192, cache_dir)      → a byte-level BPE trained on ``docs`` (cached)
    get_lm_tokenizer("bpe-8192" | "gpt2" | path)    → the tokenizer ``task.tokenizer`` names
    tokenizer_record(tokenizer, spec, cache_dir)    → {spec, vocab_size, sha256} for result.json

Every tokenizer here uses ``<|endoftext|>`` (:data:`EOS_TOKEN`) as eos and padding. Split out of
:mod:`oelm.data.lm` (documents, packing), which re-exports every name.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Sequence

from oelm.data.cache import FOREIGN, drop_damaged_cache, identity_problem, linked_entry, load_digest_cache, write_text_cache
from oelm.data.text import check_texts, documents_digest
from oelm.data.registry import hub_offline, resolve_data_dir
from oelm.errors import ConfigError, DataNotFoundError
from oelm.io import disk_writes

__all__ = [
    "EOS_TOKEN",
    "get_lm_tokenizer",
    "load_gpt2_tokenizer",
    "load_tokenizer_file",
    "save_tokenizer",
    "tokenizer_record",
    "train_bpe_tokenizer",
]

#: End-of-document token of GPT-2 and of oelm's trained BPE tokenizers (also used as padding).
EOS_TOKEN = "<|endoftext|>"


def load_gpt2_tokenizer(data_dir: str | os.PathLike | None = None):
    """GPT-2's byte-level BPE tokenizer (50,257 ids) from ``<data_dir>/tokenizers/gpt2/{vocab.json,merges.txt}``.

    Falls back to the Hub (``openai-community/gpt2``) when the files are not there and the Hub is
    online. ``<|endoftext|>`` (id 50256) is bos, eos, unk **and pad**: GPT-2 has no pad token, and
    padded positions are masked by the attention mask, so reusing eos is harmless.
    ``"Hello world"`` → ``[15496, 995]``.

    Raises:
        DataNotFoundError: files absent and the Hub offline or unreachable.
    """
    from transformers import GPT2TokenizerFast

    root = resolve_data_dir(data_dir)
    folder = root / "tokenizers" / "gpt2" if root is not None else None
    if folder is not None and (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        tokenizer = GPT2TokenizerFast.from_pretrained(str(folder))
    else:
        expected = f"{folder}/vocab.json and merges.txt" if folder else "<data_dir>/tokenizers/gpt2/vocab.json and merges.txt"
        if folder is not None:
            where = f"not found: {expected}"
        else:
            where = f"no data dir is set (data_dir=None and $OELM_DATA_DIR is unset); expected {expected}"
        fix = "Fix: set OELM_DATA_DIR or data_dir to a folder laid out like shared/data"
        if hub_offline():
            raise DataNotFoundError(f"GPT-2 tokenizer {where}; Hub openai-community/gpt2 not tried (HF_HUB_OFFLINE=1). {fix}.")
        try:
            tokenizer = GPT2TokenizerFast.from_pretrained("openai-community/gpt2")
        except Exception as exc:
            raise DataNotFoundError(f"GPT-2 tokenizer {where}; Hub openai-community/gpt2 failed ({exc}). {fix}.") from exc
    tokenizer.model_max_length = 1024  # GPT-2's context length; packing never asks the tokenizer to truncate
    tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _wrap_bpe(tokenizer_file: Path):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_file), bos_token=EOS_TOKEN, eos_token=EOS_TOKEN, unk_token=EOS_TOKEN, pad_token=EOS_TOKEN
    )


def load_tokenizer_file(path: str | os.PathLike):
    """A byte-level BPE tokenizer saved as ``tokenizer.json`` (``tokenizers`` format), e.g. the one
    an ``oelm run`` of oelm's GPT saved in its output folder (:func:`save_tokenizer`).

    ``path`` is the file or a folder holding ``tokenizer.json``. ``<|endoftext|>`` is bos, eos, unk
    and pad, as for the tokenizers oelm trains and for GPT-2's. This is how a fine-tuning config
    uses its pretraining's tokenizer (``task.tokenizer: <pretraining output>/tokenizer.json``):
    a BPE retrained on the fine-tuning text would give the same ids to other tokens.

    Raises:
        ConfigError: no such file, it is not a ``tokenizers`` JSON file, or its vocabulary has
            no ``<|endoftext|>`` (names the file).
    """
    file = Path(path).expanduser()
    if file.is_dir():
        file = file / "tokenizer.json"
    if not file.is_file():
        raise ConfigError(
            f"task.tokenizer: {file} does not exist; name 'gpt2', 'bpe-<vocab_size>' or a tokenizer.json file "
            "(an `oelm run` of oelm's GPT saves its tokenizer as <output_dir>/tokenizer.json)"
        )
    from tokenizers import Tokenizer

    try:
        backend = Tokenizer.from_file(str(file))
    except Exception as exc:  # tokenizers raises a bare Exception for malformed JSON
        raise ConfigError(f"task.tokenizer: {file} is not a tokenizer.json of the tokenizers library ({exc})") from exc
    if backend.token_to_id(EOS_TOKEN) is None:  # checked before wrapping: transformers would add it as a new id
        raise ConfigError(f"task.tokenizer: {file} has no {EOS_TOKEN} token, which oelm's GPT uses as eos and pad")
    return _wrap_bpe(file)


def save_tokenizer(tokenizer, path: str | os.PathLike) -> bool:
    """Write a fast tokenizer's ``tokenizer.json`` to ``path`` atomically (a concurrent reader
    sees the old file or the whole new one). Returns False (and writes nothing) for a tokenizer
    without a ``tokenizers`` backend."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        with disk_writes(tmp):  # tokenizers' own error on a full disk: OSError ENOSPC
            backend.save(tmp)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return True


def tokenizer_record(tokenizer, spec: str, cache_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """What identifies a tokenizer in a run's ``result.json``: ``{"spec", "vocab_size", "sha256"}``.

    ``sha256`` covers what decides which id a piece of text gets: for a fast tokenizer its
    model (vocabulary and merges), normalizer, pre-tokenizer and added tokens, not the
    truncation or padding state that ``transformers`` sets on each call; for a slow one, its
    vocabulary. Equal hashes mean the same ids for the same text, so ``init_from`` compares them.

    A fast tokenizer's ``sha256`` (~0.1 s to compute for BERT's vocabulary) is remembered under
    the sha256 of its whole serialized state (``backend_tokenizer.to_str()``, which determines
    it): in this process and, with ``cache_dir``, in ``cache_dir/<state hash>.sha256``. A damaged
    file there is warned about, deleted and rewritten.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        serialized = backend.to_str()
        state = hashlib.sha256(serialized.encode()).hexdigest()
        remembered = Path(cache_dir) / f"{state}.sha256" if cache_dir is not None else None
        digest = _IDENTITY_DIGESTS.get(state) or (load_digest_cache(remembered) if remembered is not None else None)
        if digest is None:
            full = json.loads(serialized)
            digest = _identity_digest({k: full.get(k) for k in ("model", "normalizer", "pre_tokenizer", "added_tokens")})
        if remembered is not None and not remembered.is_file():
            write_text_cache(remembered, digest, "tokenizer hash cache")
        _IDENTITY_DIGESTS[state] = digest
    else:
        digest = _identity_digest({"vocab": tokenizer.get_vocab()})
    return {"spec": spec, "vocab_size": len(tokenizer), "sha256": digest}


#: sha256 of a fast tokenizer's serialized state -> its tokenizer_record sha256 (this process)
_IDENTITY_DIGESTS: dict[str, str] = {}


def _identity_digest(identity: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


_BPE_RECIPE = "bytelevel-bpe-v1"  # bump when train_bpe_tokenizer's recipe changes: old caches become unused


def train_bpe_tokenizer(documents: Sequence[str], vocab_size: int, cache_dir: str | os.PathLike | None, *,
                        what: str | None = None):
    """Train a GPT-2-style byte-level BPE tokenizer on ``documents`` (``tokenizers`` library).

    The vocabulary is the 256 byte symbols, ``<|endoftext|>`` (id 0; eos, bos and pad) and learned
    merges up to ``vocab_size`` ids. Byte-level means no unknown tokens. If the corpus runs out
    of pairs seen twice before ``vocab_size``, the vocabulary is smaller (a warning says so; size
    the model with ``len(tokenizer)``).

    Cached under ``cache_dir/bpe-<vocab_size>-<key>/tokenizer.json``, ``key`` = hash of (recipe,
    ``vocab_size``, :func:`documents_digest`); a second call with the same inputs loads it
    (``cache_dir`` None: no cache). Beside it, ``identity.json`` says what it was trained on
    (documents sha256 and count, ``vocab_size``, recipe, the sha256 of the tokenizer.json, and
    ``what``, a label such as ``tinystories/train`` shown in messages). A cached tokenizer.json that
    cannot be read, or whose identity is not this call's (another corpus's tokenizer under this
    name), is deleted, with a warning, and the tokenizer trained again.

    Raises:
        ConfigError: ``vocab_size`` < 257 or no documents.
        DataFormatError: a document is not a ``str`` or not valid Unicode (a lone surrogate).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 257:
        raise ConfigError(f"bpe vocab_size must be >= 257 (256 bytes + <|endoftext|>), got {vocab_size}")
    if not documents:
        raise ConfigError("train_bpe_tokenizer needs at least one training document")
    check_texts(documents, "cannot train a BPE tokenizer", "document")
    digest = documents_digest(documents)
    # "identity": caches written before they carried identity.json get another key, so none is read unchecked
    key = hashlib.sha256(f"{_BPE_RECIPE}|{vocab_size}|{digest}|identity".encode()).hexdigest()[:16]
    target = Path(cache_dir) / f"bpe-{vocab_size}-{key}" / "tokenizer.json" if cache_dir is not None else None
    identity = {"what": what, "documents_sha256": digest, "documents": len(documents), "vocab_size": vocab_size,
                "recipe": _BPE_RECIPE}
    if target is not None and target.is_file():
        cached = _cached_bpe(target, identity)
        if cached is not None:
            return cached

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents, trainer=trainer, length=len(documents))
    if tokenizer.get_vocab_size() < vocab_size:
        warnings.warn(
            f"BPE training stopped at {tokenizer.get_vocab_size()} ids (< requested {vocab_size}): the corpus has no "
            "more pairs seen twice. Size the model with len(tokenizer).",
            stacklevel=2,
        )
    return _uncached_bpe(tokenizer) if target is None else _cache_bpe(tokenizer, target, identity)


def _uncached_bpe(tokenizer):
    """The trained ``tokenizer`` as a transformers tokenizer, through a temporary file."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save(str(Path(tmp) / "tokenizer.json"))
        return _wrap_bpe(Path(tmp) / "tokenizer.json")


def _cache_bpe(tokenizer, target: Path, identity: dict[str, Any]):
    """Save the trained ``tokenizer`` to ``target`` (``tokenizer.json``, ``identity.json`` beside
    it: :func:`train_bpe_tokenizer`) atomically and return it read back. A cache folder that cannot
    be created or a full disk under it is a warning, and the tokenizer is returned uncached."""
    try:
        target.parent.parent.mkdir(parents=True, exist_ok=True)
        tmp_dir = Path(tempfile.mkdtemp(dir=target.parent.parent, prefix=".tmp-bpe-"))
    except OSError as exc:  # the cache is an optimisation: go on without it
        warnings.warn(f"cannot write the tokenizer cache under {target.parent.parent} ({exc.strerror or exc}); going on "
                      "without caching (set OELM_CACHE_DIR to a writable folder)", stacklevel=3)
        return _uncached_bpe(tokenizer)
    try:
        with disk_writes(tmp_dir):
            tokenizer.save(str(tmp_dir / "tokenizer.json"))
            tokenizer_sha256 = hashlib.sha256((tmp_dir / "tokenizer.json").read_bytes()).hexdigest()
            (tmp_dir / _BPE_IDENTITY).write_text(json.dumps(identity | {"tokenizer_json_sha256": tokenizer_sha256},
                                                            sort_keys=True))
    except OSError as exc:  # a full disk under the cache: no cache, as for a folder that cannot be written
        shutil.rmtree(tmp_dir, ignore_errors=True)
        warnings.warn(f"cannot write the tokenizer cache under {target.parent.parent} ({exc.strerror or exc}); going on "
                      "without caching (set OELM_CACHE_DIR to a folder with space)", stacklevel=3)
        return _uncached_bpe(tokenizer)
    try:
        os.replace(tmp_dir, target.parent)  # atomic: a concurrent run sees either nothing or the whole cache
    except OSError:  # another process finished first (its cache is identical), or a damaged one is in the way
        cached = _cached_bpe(target, identity) if target.is_file() else None
        trained = cached if cached is not None else _wrap_bpe(tmp_dir / "tokenizer.json")  # read whole: tmp_dir goes
        shutil.rmtree(tmp_dir, ignore_errors=True)
        return trained
    return _wrap_bpe(target)


_BPE_IDENTITY = "identity.json"  # beside a cached tokenizer.json: what it was trained on


def _cached_bpe(target: Path, identity: dict[str, Any]):
    """The cached BPE at ``target`` when it loads, has the recipe's layout and was trained on the
    corpus ``identity`` describes; else None, after a warning and deleting its folder (where the
    folder cannot be deleted, the warning says so and the caller trains without the cache)."""
    if linked_entry(target, depth=3) or linked_entry(target.parent / _BPE_IDENTITY, depth=3):
        return None
    problem = None
    try:
        found = json.loads((target.parent / _BPE_IDENTITY).read_text(encoding="utf-8"))
        found = found if isinstance(found, dict) else None
    except (OSError, ValueError):
        found = None
    try:
        cached = _wrap_bpe(target)
    except Exception as exc:  # tokenizers raises a bare Exception for a malformed tokenizer.json
        problem = f"{target.name}: {' '.join(str(exc).split())[:200]}"
    else:
        if cached.eos_token_id != 0 or len(cached) <= 256:  # the recipe's layout: <|endoftext|> is id 0
            problem = f"{target.name} has {len(cached)} ids and {EOS_TOKEN} at id {cached.eos_token_id}"
    state = "is damaged"
    if problem is None:
        problem, state = identity_problem(found, identity), FOREIGN
    if problem is None and found.get("tokenizer_json_sha256") != hashlib.sha256(target.read_bytes()).hexdigest():
        problem = f"{target.name} is not the file its {_BPE_IDENTITY} describes (sha256 differs)"
    if problem is None:
        return cached
    drop_damaged_cache(target.parent, problem, state)
    return None


_BPE_SPEC = re.compile(r"^bpe-(\d+)$")


def get_lm_tokenizer(
    spec: str,
    documents: Sequence[str] | None,
    cache_dir: str | os.PathLike | None,
    data_dir: str | os.PathLike | None = None,
    *,
    what: str | None = None,
):
    """The tokenizer named by ``spec``: "gpt2" (local GPT-2 files, :func:`load_gpt2_tokenizer`),
    "bpe-<N>", e.g. "bpe-8192" (:func:`train_bpe_tokenizer` on ``documents``, the training split),
    or the path of a ``tokenizer.json`` (or of a folder holding one; :func:`load_tokenizer_file`).

    Raises:
        ConfigError: an unknown spec, "bpe-<N>" without documents, or a tokenizer file that is
            missing or unusable.
        DataNotFoundError: GPT-2 files missing (see :func:`load_gpt2_tokenizer`).
    """
    if spec == "gpt2":
        return load_gpt2_tokenizer(data_dir)
    match = _BPE_SPEC.match(spec)
    if match is None:
        if spec.endswith(".json") or "/" in spec or os.sep in spec:
            return load_tokenizer_file(spec)
        raise ConfigError(f"unknown tokenizer {spec!r}; use 'gpt2', 'bpe-<vocab_size>' (e.g. 'bpe-8192') or the path of "
                          "a tokenizer.json")
    if not documents:
        raise ConfigError(f"tokenizer {spec!r} is trained on the training documents, but none were given")
    return train_bpe_tokenizer(documents, int(match.group(1)), cache_dir, what=what)


# ---------------------------------------------------------------------------------------------
# Packing
# ---------------------------------------------------------------------------------------------
