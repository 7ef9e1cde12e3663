"""Cache files carry the identity of what they encode (issue 37, item 4): a token cache, a
classification encoding or a trained BPE of *other* data under this entry's name (a copy, a
restored backup, a cache folder shared between machines) is named in a warning and rebuilt, never
used; and a read-only cache folder with a damaged entry is a warning and a rebuild without the
cache, not a traceback.

Before, the token cache and the BPE carried nothing (a copied file was used as it was), and an
encoding was only checked for its row count: another split's file with as many rows was used.
Real data: TinyStories stories and SST-2 validation sentences; the local BERT tokenizer.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest

from oelm.data import load_classification, load_documents
from oelm.data.classification import encode_classification
from oelm.data.lm import pack_documents, train_bpe_tokenizer


@pytest.fixture(scope="module")
def stories(data_dir) -> dict[str, list[str]]:
    return {"train": load_documents("tinystories", "train", data_dir)[:40],
            "validation": load_documents("tinystories", "validation", data_dir)[:40]}


@pytest.fixture(scope="module")
def bert_tokenizer(data_dir):
    from transformers import BertTokenizerFast

    return BertTokenizerFast.from_pretrained(str(data_dir / "tokenizers" / "bert-base-uncased"))


@pytest.fixture(scope="module")
def sentences(data_dir):
    frame = load_classification("sst2", "validation", data_dir)
    return frame.iloc[:100].reset_index(drop=True), frame.iloc[100:200].reset_index(drop=True)


def _only(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    assert len(found) == 1, found
    return found[0]


@contextlib.contextmanager
def read_only(folder: Path):
    """``folder`` made read-only as a read-only mount makes it: for root (whom permission bits do
    not stop) a read-only bind mount of the folder on itself, else ``chmod -R a-w``; skipped where
    neither can be done."""
    if os.geteuid() != 0:
        subprocess.run(["chmod", "-R", "a-w", str(folder)], check=True)
        try:
            yield
        finally:
            subprocess.run(["chmod", "-R", "u+w", str(folder)], check=True)
        return
    if shutil.which("mount") is None or subprocess.run(["mount", "--bind", str(folder), str(folder)],
                                                       capture_output=True).returncode != 0:
        pytest.skip("root cannot make a folder read-only here (no bind mount: needs CAP_SYS_ADMIN)")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True).returncode != 0:
            pytest.skip("root cannot remount a bind mount read-only here")
        probe = folder / ".probe"
        with pytest.raises(OSError):
            probe.write_text("x")  # the folder really is read-only
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_token_cache_of_another_split_under_this_name_is_rebuilt(stories, tmp_path):
    tokenizer = train_bpe_tokenizer(stories["train"], 400, tmp_path / "tok")
    fresh = pack_documents(stories["train"], tokenizer, 32, cache_dir=tmp_path / "a", what="tinystories/train")
    pack_documents(stories["validation"], tokenizer, 32, cache_dir=tmp_path / "b", what="tinystories/validation")
    mine, other = _only(tmp_path / "a", "tokens-*.npz"), _only(tmp_path / "b", "tokens-*.npz")
    shutil.copyfile(other, mine)  # the validation stream under the train stream's name: a valid file of other data
    with pytest.warns(UserWarning, match=rf"oelm cache {mine} holds other data \(encodes tinystories/validation \(documents "
                                         r"sha256 \w{12}\), not tinystories/train \(documents sha256 \w{12}\)\); deleting"):
        again = pack_documents(stories["train"], tokenizer, 32, cache_dir=tmp_path / "a", what="tinystories/train")
    assert again.equal(fresh)
    with warnings.catch_warnings():  # rebuilt: read back without a word
        warnings.simplefilter("error")
        assert pack_documents(stories["train"], tokenizer, 32, cache_dir=tmp_path / "a").equal(fresh)


def test_an_encoding_of_other_sentences_with_as_many_rows_is_rebuilt(bert_tokenizer, sentences, tmp_path):
    first, second = sentences  # 100 SST-2 sentences each: the row count cannot tell them apart
    fresh = encode_classification(first, bert_tokenizer, ("text",), 64, cache_dir=tmp_path / "a", what="sst2/validation")
    encode_classification(second, bert_tokenizer, ("text",), 64, cache_dir=tmp_path / "b", what="sst2/other")
    mine, other = _only(tmp_path / "a", "cls-*.npz"), _only(tmp_path / "b", "cls-*.npz")
    shutil.copyfile(other, mine)
    with pytest.warns(UserWarning, match=rf"oelm cache {mine} holds other data \(encodes sst2/other \(texts sha256 \w{{12}}\), "
                                         r"not sst2/validation"):
        again = encode_classification(first, bert_tokenizer, ("text",), 64, cache_dir=tmp_path / "a", what="sst2/validation")
    assert again.encodings == fresh.encodings
    assert again.encodings["input_ids"] != encode_classification(second, bert_tokenizer, ("text",), 64).encodings["input_ids"]


@pytest.mark.parametrize("copied", ["folder", "tokenizer.json only"])
def test_a_tokenizer_trained_on_other_documents_under_this_name_is_trained_again(stories, tmp_path, copied):
    first = train_bpe_tokenizer(stories["train"], 400, tmp_path / "a", what="tinystories/train")
    train_bpe_tokenizer(stories["validation"], 400, tmp_path / "b", what="tinystories/validation")
    mine, other = _only(tmp_path / "a", "bpe-400-*"), _only(tmp_path / "b", "bpe-400-*")
    for name in (["tokenizer.json", "identity.json"] if copied == "folder" else ["tokenizer.json"]):
        shutil.copyfile(other / name, mine / name)
    expected = (r"encodes tinystories/validation \(documents sha256 \w{12}\), not tinystories/train" if copied == "folder"
                else r"tokenizer\.json is not the file its identity\.json describes")
    with pytest.warns(UserWarning, match=rf"oelm cache {mine} holds other data \({expected}"):
        again = train_bpe_tokenizer(stories["train"], 400, tmp_path / "a", what="tinystories/train")
    assert again.backend_tokenizer.to_str() == first.backend_tokenizer.to_str()


def test_a_damaged_entry_in_a_read_only_cache_is_a_warning_and_a_rebuild(stories, bert_tokenizer, sentences, tmp_path):
    """Every kind of cache file cut short, in a folder that cannot be written: before, deleting the
    damaged entry raised (OSError: Read-only file system / Permission denied)."""
    cache = tmp_path / "cache"
    tokenizer = train_bpe_tokenizer(stories["train"], 400, cache / "tokenizers")
    blocks = pack_documents(stories["train"], tokenizer, 32, cache_dir=cache / "tokens")
    encoded = encode_classification(sentences[0], bert_tokenizer, ("text",), 64, cache_dir=cache / "encodings")
    damaged = [_only(cache / "tokenizers", "bpe-400-*/tokenizer.json"), _only(cache / "tokens", "tokens-*.npz"),
               _only(cache / "encodings", "cls-*.npz")]
    for path in damaged:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    with read_only(cache), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again_tokenizer = train_bpe_tokenizer(stories["train"], 400, cache / "tokenizers")
        again_blocks = pack_documents(stories["train"], again_tokenizer, 32, cache_dir=cache / "tokens")
        again_encoded = encode_classification(sentences[0], bert_tokenizer, ("text",), 64, cache_dir=cache / "encodings")
        assert all(path.read_bytes() for path in damaged)  # still there, still damaged: nothing could be written
    messages = [str(w.message) for w in caught]
    for path in (damaged[0].parent, damaged[1], damaged[2]):
        assert any(m.startswith(f"oelm cache {path} is damaged") and "cannot be deleted" in m for m in messages), (path, messages)
    assert again_tokenizer.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()
    assert again_blocks.equal(blocks)
    assert again_encoded.encodings == encoded.encodings
