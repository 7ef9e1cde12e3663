"""Damaged caches (issue 26, item 4): a truncated token cache or a corrupt cached BPE
``tokenizer.json`` was a traceback naming no cache. Now the damaged file is named in a warning,
deleted and rebuilt, and the result equals the one built from scratch. (The token cache is an
``.npz`` of ``tokens`` and the ``identity`` of what they encode: tests/test_cache_identity.py.)

The caches are built in a temporary folder from real TinyStories documents, then damaged there.
"""

from __future__ import annotations

import numpy as np
import pytest

from oelm.data import load_documents
from oelm.data.lm import pack_documents, train_bpe_tokenizer


@pytest.fixture(scope="module")
def docs(data_dir) -> list[str]:
    return load_documents("tinystories", "train", data_dir)[:40]


def _only(folder, pattern):
    found = sorted(folder.glob(pattern))
    assert len(found) == 1, found
    return found[0]


def _rewrite_tokens(cache, change):
    """Rewrite the token cache ``cache`` with ``change(tokens)`` in place of its tokens, its identity kept:
    a file still well-formed, with damaged contents."""
    with np.load(cache) as npz:
        arrays = {name: npz[name] for name in npz.files}
    arrays["tokens"] = change(arrays["tokens"])
    with open(cache, "wb") as f:
        np.savez(f, **arrays)


def test_truncated_token_cache_is_named_deleted_and_rebuilt(docs, tmp_path):
    tokenizer = train_bpe_tokenizer(docs, 400, tmp_path / "tok")
    fresh = pack_documents(docs, tokenizer, 32, cache_dir=tmp_path / "tokens")
    cache = _only(tmp_path / "tokens", "tokens-*.npz")
    size = cache.stat().st_size
    with open(cache, "r+b") as f:
        f.truncate(size // 2)  # a copy cut short, a full disk
    with pytest.warns(UserWarning, match=rf"oelm cache {cache} is damaged \(\w+: .*\); deleting it and building it again"):
        again = pack_documents(docs, tokenizer, 32, cache_dir=tmp_path / "tokens")
    assert again.equal(fresh)
    assert cache.stat().st_size == size  # rebuilt whole


def test_token_cache_with_ids_outside_the_vocabulary_is_rebuilt(docs, tmp_path):
    tokenizer = train_bpe_tokenizer(docs, 400, tmp_path / "tok")
    fresh = pack_documents(docs, tokenizer, 32, cache_dir=tmp_path / "tokens")
    cache = _only(tmp_path / "tokens", "tokens-*.npz")

    def flip(stream):
        stream[5] = len(tokenizer) + 7  # bytes flipped on disk: still a valid .npz
        return stream

    _rewrite_tokens(cache, flip)
    with pytest.warns(UserWarning, match=rf"holds id {len(tokenizer) + 7}, outside the tokenizer's {len(tokenizer)} ids"):
        again = pack_documents(docs, tokenizer, 32, cache_dir=tmp_path / "tokens")
    assert again.equal(fresh)


def test_token_cache_of_another_dtype_is_rebuilt(docs, tmp_path):
    tokenizer = train_bpe_tokenizer(docs, 400, tmp_path / "tok")
    fresh = pack_documents(docs, tokenizer, 32, cache_dir=tmp_path / "tokens")
    cache = _only(tmp_path / "tokens", "tokens-*.npz")
    _rewrite_tokens(cache, lambda stream: stream.astype(np.float32))
    with pytest.warns(UserWarning, match="holds a float32 array .* expected 1-D uint16"):
        assert pack_documents(docs, tokenizer, 32, cache_dir=tmp_path / "tokens").equal(fresh)


@pytest.mark.parametrize("damage", ["truncate", "empty-vocab"])
def test_corrupt_cached_tokenizer_is_named_deleted_and_trained_again(docs, tmp_path, damage):
    first = train_bpe_tokenizer(docs, 400, tmp_path / "tok")
    cached = _only(tmp_path / "tok", "bpe-400-*/tokenizer.json")
    text = cached.read_text()
    if damage == "truncate":
        cached.write_text(text[: len(text) // 3])
        expected = r"tokenizer\.json: "
    else:  # valid JSON, but not the recipe's tokenizer any more
        import json

        data = json.loads(text)
        data["model"]["vocab"], data["model"]["merges"], data["added_tokens"] = {}, [], []
        cached.write_text(json.dumps(data))
        expected = r"tokenizer\.json has \d+ ids"
    with pytest.warns(UserWarning, match=rf"oelm cache {cached.parent} is damaged \({expected}"):
        again = train_bpe_tokenizer(docs, 400, tmp_path / "tok")
    sample = docs[0][:200]
    assert again(sample)["input_ids"] == first(sample)["input_ids"] and len(again) == len(first)
    assert cached.read_text() == text  # the same recipe on the same documents: the same file again


def test_a_cache_folder_that_cannot_be_written_is_a_warning_not_a_failure(docs, tmp_path):
    """OELM_CACHE_DIR pointing at a file (or a read-only folder): FileExistsError tracebacks before;
    the tokenizer and the blocks are computed anyway, as without a cache."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    with pytest.warns(UserWarning, match=rf"cannot write the tokenizer cache under {blocker} \(File exists\); going on without"):
        tokenizer = train_bpe_tokenizer(docs, 400, blocker)
    assert len(tokenizer) == len(train_bpe_tokenizer(docs, 400, None))
    with pytest.warns(UserWarning, match=rf"cannot write the token cache {blocker}/tokens-\w+\.npz \(File exists\)"):
        blocks = pack_documents(docs, tokenizer, 32, cache_dir=blocker)
    assert blocks.equal(pack_documents(docs, tokenizer, 32, cache_dir=None))


def test_a_directory_where_the_token_cache_belongs_is_replaced(docs, tmp_path):
    tokenizer = train_bpe_tokenizer(docs, 400, tmp_path / "tok")
    fresh = pack_documents(docs, tokenizer, 32, cache_dir=tmp_path / "tokens")
    cache = _only(tmp_path / "tokens", "tokens-*.npz")
    cache.unlink()
    cache.mkdir()
    with pytest.warns(UserWarning, match=rf"oelm cache {cache} is damaged \(a directory where the \.npz file belongs\)"):
        assert pack_documents(docs, tokenizer, 32, cache_dir=tmp_path / "tokens").equal(fresh)
    assert cache.is_file()
