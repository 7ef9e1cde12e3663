"""Cached classification encodings and tokenizer hashes (issue 25, item 5: the data phase of a
short run's start-up). ``encode_classification(..., cache_dir=)`` keeps a split's encodings on
disk, keyed by its texts, the tokenizer's identity, ``max_length`` and the text columns;
:func:`oelm.data.tokenizers.tokenizer_record` remembers its hash under the tokenizer's serialized state.
Both must give exactly what a fresh computation gives, and a damaged file is rebuilt.

Real data: SST-2 validation (872 sentences) and the local BERT tokenizer.
"""

from __future__ import annotations

import warnings

import pytest

from oelm.data import load_classification
from oelm.data.classification import encode_classification
from oelm.data.tokenizers import _IDENTITY_DIGESTS, tokenizer_record


@pytest.fixture(scope="module")
def bert_tokenizer(data_dir):
    from transformers import BertTokenizerFast

    return BertTokenizerFast.from_pretrained(str(data_dir / "tokenizers" / "bert-base-uncased"))


@pytest.fixture(scope="module")
def sst2_validation(data_dir):
    return load_classification("sst2", "validation", data_dir)


def _tokenizer_must_not_run(monkeypatch, tokenizer):
    def refuse(*args, **kwargs):
        raise AssertionError("the tokenizer ran: the encodings were not read from the cache")

    monkeypatch.setattr(type(tokenizer), "__call__", refuse)


def _items(dataset):
    return [dataset[i] for i in range(len(dataset))]


def test_cached_encodings_equal_a_fresh_encoding_and_skip_the_tokenizer(bert_tokenizer, sst2_validation, tmp_path, monkeypatch):
    fresh = encode_classification(sst2_validation, bert_tokenizer, ("text",), 128)
    written = encode_classification(sst2_validation, bert_tokenizer, ("text",), 128, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("cls-*.npz"))) == 1
    _tokenizer_must_not_run(monkeypatch, bert_tokenizer)
    read = encode_classification(sst2_validation, bert_tokenizer, ("text",), 128, cache_dir=tmp_path)
    assert len(read) == len(fresh) == 872
    assert list(read.encodings) == list(fresh.encodings) == ["input_ids", "token_type_ids", "attention_mask"]
    assert read.encodings == written.encodings == fresh.encodings  # ids, masks and token types, row by row
    assert read.labels == fresh.labels == sst2_validation["label"].tolist()
    assert _items(read) == _items(fresh)


def test_another_max_length_or_other_texts_is_another_entry(bert_tokenizer, sst2_validation, tmp_path):
    long = encode_classification(sst2_validation, bert_tokenizer, ("text",), 128, cache_dir=tmp_path)
    short = encode_classification(sst2_validation, bert_tokenizer, ("text",), 16, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("cls-*.npz"))) == 2
    assert max(short.lengths) == 16 < max(long.lengths)
    assert short.encodings == encode_classification(sst2_validation, bert_tokenizer, ("text",), 16).encodings
    fewer = sst2_validation.iloc[:100].reset_index(drop=True)
    part = encode_classification(fewer, bert_tokenizer, ("text",), 128, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("cls-*.npz"))) == 3 and len(part) == 100
    assert part.encodings["input_ids"] == long.encodings["input_ids"][:100]


@pytest.mark.parametrize("damage", ["truncate", "garbage", "other rows"])
def test_a_damaged_encoding_cache_is_named_deleted_and_rebuilt(bert_tokenizer, sst2_validation, tmp_path, damage):
    fresh = encode_classification(sst2_validation, bert_tokenizer, ("text",), 64, cache_dir=tmp_path)
    (path,) = tmp_path.glob("cls-*.npz")
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(b"not a zip file" * 10)
    else:  # a well-formed file of another split under this key: its row count does not fit
        fewer = sst2_validation.iloc[:10].reset_index(drop=True)
        encode_classification(fewer, bert_tokenizer, ("text",), 64, cache_dir=tmp_path / "other")
        (other,) = (tmp_path / "other").glob("cls-*.npz")
        path.write_bytes(other.read_bytes())
    with pytest.warns(UserWarning, match=rf"oelm cache {path} is damaged .*deleting it and building it again"):
        again = encode_classification(sst2_validation, bert_tokenizer, ("text",), 64, cache_dir=tmp_path)
    assert again.encodings == fresh.encodings
    assert path.is_file()  # rebuilt: the next call reads it back, without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert encode_classification(sst2_validation, bert_tokenizer, ("text",), 64, cache_dir=tmp_path).encodings == fresh.encodings


def test_tokenizer_hash_is_remembered_without_changing_it(bert_tokenizer, tmp_path, monkeypatch):
    import oelm.data.tokenizers as tokenizers

    _IDENTITY_DIGESTS.clear()
    fresh = tokenizer_record(bert_tokenizer, "bert")  # no folder: computed (and remembered in this process)
    _IDENTITY_DIGESTS.clear()
    written = tokenizer_record(bert_tokenizer, "bert", tmp_path)
    (path,) = tmp_path.glob("*.sha256")
    assert path.read_text() == fresh["sha256"] == written["sha256"]

    def refuse(identity):
        raise AssertionError("the tokenizer was hashed again")

    monkeypatch.setattr(tokenizers, "_identity_digest", refuse)
    _IDENTITY_DIGESTS.clear()
    assert tokenizer_record(bert_tokenizer, "bert", tmp_path) == fresh  # from the file
    assert tokenizer_record(bert_tokenizer, "bert") == fresh  # from this process's memory


def test_a_changed_tokenizer_is_hashed_again_and_a_damaged_hash_file_rebuilt(data_dir, tmp_path):
    from transformers import BertTokenizerFast

    tokenizer = BertTokenizerFast.from_pretrained(str(data_dir / "tokenizers" / "bert-base-uncased"))
    before = tokenizer_record(tokenizer, "bert", tmp_path)
    tokenizer.add_tokens(["oelmnewtoken"])  # other ids for that text: the identity must change
    after = tokenizer_record(tokenizer, "bert", tmp_path)
    assert after["sha256"] != before["sha256"] and len(list(tmp_path.glob("*.sha256"))) == 2

    path = next(p for p in tmp_path.glob("*.sha256") if p.read_text() == after["sha256"])
    path.write_text("0" * 10)
    _IDENTITY_DIGESTS.clear()
    with pytest.warns(UserWarning, match=rf"oelm cache {path} is damaged .*not a sha256 hex digest"):
        assert tokenizer_record(tokenizer, "bert", tmp_path) == after
    assert path.read_text() == after["sha256"]


def test_a_cache_folder_that_cannot_be_written_is_a_warning_not_a_failure(bert_tokenizer, sst2_validation, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    fresh = encode_classification(sst2_validation, bert_tokenizer, ("text",), 32)
    with pytest.warns(UserWarning, match=rf"cannot write the encoding cache {blocker}/cls-\w+\.npz \(File exists\)"):
        assert encode_classification(sst2_validation, bert_tokenizer, ("text",), 32, cache_dir=blocker).encodings == fresh.encodings
    _IDENTITY_DIGESTS.clear()
    with pytest.warns(UserWarning, match=rf"cannot write the tokenizer hash cache {blocker}/\w+\.sha256"):
        assert tokenizer_record(bert_tokenizer, "bert", blocker) == tokenizer_record(bert_tokenizer, "bert")


def test_prepare_data_reads_the_cached_encodings(data_dir, bert_tokenizer, monkeypatch):
    """The second prepare of the same task reads every split from the cache ($OELM_CACHE_DIR,
    a per-session temp folder in the tests) and gives the same examples and tokenizer record."""
    from oelm.config import ExperimentConfig
    from oelm.matrix.data import cache_dir, prepare_data

    config = ExperimentConfig.model_validate({
        "name": "t", "methods": [{"name": "baseline"}], "model": {"pretrained": "bert-base-uncased"},
        "task": {"dataset": "sst2", "train_samples": 300, "validation_samples": 50, "max_length": 48}})
    first = prepare_data(config, bert_tokenizer)
    assert len(list((cache_dir() / "encodings").glob("cls-*.npz"))) >= 2
    _tokenizer_must_not_run(monkeypatch, bert_tokenizer)
    again = prepare_data(config, bert_tokenizer)
    assert _items(again.train) == _items(first.train) and _items(again.validation) == _items(first.validation)
    assert again.tokenizer_record == first.tokenizer_record
    assert first.tokenizer_record["sha256"] == tokenizer_record(bert_tokenizer, "x")["sha256"]
