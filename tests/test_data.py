"""oelm.data on the real files of shared/data (OELM_DATA_DIR), plus malformed copies in tmp_path.

Row counts and label sets are the ones documented in shared/data/MANIFEST.md. Tests that read real
files take the ``data_dir`` fixture (tests/conftest.py), which skips them when no data dir is set.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from oelm.data import (
    DATASETS,
    EOS_TOKEN,
    LMBlockDataset,
    available_splits,
    classification_collator,
    encode_classification,
    get_dataset_spec,
    get_lm_tokenizer,
    holdout_indices,
    load_classification,
    load_documents,
    load_gpt2_tokenizer,
    load_tokenizer_file,
    pack_documents,
    resolve_data_dir,
    save_tokenizer,
    subsample,
    tokenizer_record,
    train_bpe_tokenizer,
)
from oelm.data.lm import repair_cp1252_mojibake
from oelm.errors import ConfigError, DataFormatError, DataNotFoundError


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    # The Hub is never contacted by these tests: a missing split must fail at once.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def bert_tokenizer(data_dir):
    from transformers import BertTokenizerFast

    return BertTokenizerFast.from_pretrained(str(data_dir / "tokenizers" / "bert-base-uncased"))


@pytest.fixture(scope="session")
def gpt2_tokenizer(data_dir):
    return load_gpt2_tokenizer(data_dir)


# --- registry --------------------------------------------------------------------------------


def test_required_datasets_are_registered():
    required = {"sst2", "imdb", "ag_news", "xnli", "mnli", "tinystories", "wikitext-2", "wikitext-103", "openwebtext"}
    assert required <= set(DATASETS)
    assert get_dataset_spec("xnli").label_names == ("entailment", "neutral", "contradiction")
    assert get_dataset_spec("ag_news").label_names == ("World", "Sports", "Business", "Sci/Tech")
    assert get_dataset_spec("tinystories").metric == "perplexity"
    assert "validation" in available_splits(get_dataset_spec("imdb"))


def test_unknown_dataset_lists_registered_names():
    with pytest.raises(ConfigError, match="registered datasets: .*sst2"):
        get_dataset_spec("sst3")


def test_unknown_split_lists_available_splits():
    with pytest.raises(ConfigError, match="available: train, validation, test"):
        load_classification("sst2", "dev")


def test_resolve_data_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("OELM_DATA_DIR", str(tmp_path / "env"))
    assert resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"
    assert resolve_data_dir() == tmp_path / "env"
    monkeypatch.delenv("OELM_DATA_DIR")
    assert resolve_data_dir() is None


# --- classification: real splits -------------------------------------------------------------

CLASSIFICATION_SPLITS = [
    ("sst2", "train", 67_349, {0, 1}),
    ("sst2", "validation", 872, {0, 1}),
    ("sst2", "test", 1_821, {0, 1}),
    ("imdb", "test", 25_000, {0, 1}),
    ("ag_news", "test", 7_600, {0, 1, 2, 3}),
    ("xnli", "validation", 2_490, {0, 1, 2}),
]


@pytest.mark.parametrize("name,split,rows,labels", CLASSIFICATION_SPLITS)
def test_local_classification_split(data_dir, name, split, rows, labels):
    spec = get_dataset_spec(name)
    df = load_classification(name, split, data_dir)
    assert len(df) == rows == spec.local_rows[split]
    assert list(df.columns) == [*spec.text_columns, "label"]
    assert df["label"].dtype == np.int64
    assert set(df["label"].unique()) == labels
    assert all(isinstance(t, str) for t in df[spec.text_columns[0]].head())


def test_sst2_test_is_the_labeled_copy(data_dir):
    counts = load_classification("sst2", "test", data_dir)["label"].value_counts().to_dict()
    assert counts == {0: 912, 1: 909}  # MANIFEST: matches the published SST-2 test statistics
    assert "non-GLUE" in get_dataset_spec("sst2").notes


@pytest.mark.parametrize("name,total,val_rows", [("imdb", 25_000, 2_500), ("ag_news", 10_001, 1_000)])
def test_validation_holdout_partitions_train(data_dir, name, total, val_rows):
    spec = get_dataset_spec(name)
    train = load_classification(name, "train", data_dir)
    val = load_classification(name, "validation", data_dir)
    assert len(train) + len(val) == total == spec.local_rows["train"]
    assert len(val) == val_rows
    full = pd.read_parquet(data_dir / spec.local_files["train"][0])
    # a partition: every row of the file lands in exactly one of the two (texts counted with multiplicity)
    assert Counter(train["text"]) + Counter(val["text"]) == Counter(full["text"])
    again = load_classification(name, "validation", data_dir)
    other_seed = load_classification(name, "validation", data_dir, holdout_seed=1)
    assert again["text"].tolist() == val["text"].tolist()
    assert other_seed["text"].tolist() != val["text"].tolist()


def test_holdout_indices_are_disjoint_and_deterministic():
    train, val = holdout_indices(1_000, 0.1, seed=3)
    assert len(val) == 100 and len(train) == 900
    assert not set(train) & set(val) and set(train) | set(val) == set(range(1_000))
    assert np.array_equal(holdout_indices(1_000, 0.1, seed=3)[1], val)


def test_xnli_is_english_sentence_pairs(data_dir):
    df = load_classification("xnli", "validation", data_dir)
    assert df["label"].value_counts().to_dict() == {0: 830, 1: 830, 2: 830}
    assert df["sentence1"].map(str.isascii).mean() > 0.95  # the other 14 languages are filtered out


def test_xnli_test_is_unlabeled(data_dir):
    with pytest.raises(DataFormatError, match="unlabeled"):
        load_classification("xnli", "test", data_dir)
    df = load_classification("xnli", "test", data_dir, allow_unlabeled=True)
    assert len(df) == 5_010 and (df["label"] == -1).all()


# --- classification: errors ------------------------------------------------------------------


def test_hub_only_dataset_offline_fails_fast_with_path_and_hub_id(data_dir):
    start = time.perf_counter()
    with pytest.raises(DataNotFoundError) as info:
        load_classification("mnli", "validation_matched", data_dir)
    assert time.perf_counter() - start < 5
    message = str(info.value)
    assert str(data_dir / "mnli" / "validation_matched.parquet") in message
    assert "nyu-mll/glue" in message and "HF_HUB_OFFLINE" in message
    assert isinstance(info.value, FileNotFoundError)


def test_hub_only_lm_split_offline_fails_fast(data_dir):
    with pytest.raises(DataNotFoundError, match=r"wikitext-2-v1/train\.txt\.gz.*Salesforce/wikitext"):
        load_documents("wikitext-2", "train", data_dir)


def test_missing_data_dir_names_the_path(tmp_path):
    missing = tmp_path / "no-such-dir"
    with pytest.raises(DataNotFoundError, match=str(missing)):
        load_classification("sst2", "train", missing)


def test_no_data_dir_and_offline_names_layout(monkeypatch):
    monkeypatch.delenv("OELM_DATA_DIR", raising=False)
    with pytest.raises(DataNotFoundError, match=r"<dir>/sst2/train\.parquet"):
        load_classification("sst2", "train")


def _write_split(root: Path, rel: str, frame: pd.DataFrame) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(path)
    return root


def test_wrong_columns_name_the_missing_column(tmp_path):
    root = _write_split(tmp_path, "sst2/train.parquet", pd.DataFrame({"sentence": ["good", "bad"], "label": [1, 0]}))
    with pytest.raises(DataFormatError, match=r"sst2/train\.parquet\): missing column\(s\) \['text'\]"):
        load_classification("sst2", "train", root)


def test_out_of_range_labels(tmp_path):
    root = _write_split(tmp_path, "sst2/train.parquet", pd.DataFrame({"text": ["a", "b", "c"], "label": [0, 1, 2]}))
    with pytest.raises(DataFormatError, match=r"out of range, e\.g\. \[2\]"):
        load_classification("sst2", "train", root)


def test_empty_split(tmp_path):
    empty = pd.DataFrame({"text": pd.Series([], dtype=str), "label": pd.Series([], dtype="int64")})
    root = _write_split(tmp_path, "sst2/validation.parquet", empty)
    with pytest.raises(DataFormatError, match="no rows"):
        load_classification("sst2", "validation", root)


def test_subsample_is_deterministic():
    df = pd.DataFrame({"text": [str(i) for i in range(100)], "label": [i % 2 for i in range(100)]})
    a, b = subsample(df, 10, seed=0), subsample(df, 10, seed=0)
    assert len(a) == 10 and a.equals(b)
    assert not a.equals(subsample(df, 10, seed=1))
    assert subsample(df, None, 0) is df and subsample(df, 1_000, 0) is df


# --- classification: tokenization and batching -----------------------------------------------


def test_collator_pads_to_longest_in_batch(data_dir, bert_tokenizer):
    df = load_classification("sst2", "validation", data_dir).head(16)
    ds = encode_classification(df, bert_tokenizer, ("text",), max_length=128)
    lengths = [len(ds[i]["input_ids"]) for i in range(4)]
    assert len(set(lengths)) > 1  # unpadded
    batch = classification_collator(bert_tokenizer)([ds[i] for i in range(4)])
    assert batch["input_ids"].shape == (4, max(lengths)) and max(lengths) < 128
    assert batch["attention_mask"].sum(dim=1).tolist() == lengths
    assert batch["labels"].tolist() == df["label"].head(4).tolist()
    assert batch["input_ids"][0, 0].item() == bert_tokenizer.cls_token_id


def test_sentence_pairs_are_truncated_together(data_dir, bert_tokenizer):
    df = load_classification("xnli", "validation", data_dir).head(8)
    ds = encode_classification(df, bert_tokenizer, ("sentence1", "sentence2"), max_length=16)
    item = ds[0]
    assert len(item["input_ids"]) <= 16 and set(item["token_type_ids"]) == {0, 1}
    assert item["input_ids"].count(bert_tokenizer.sep_token_id) == 2


def test_collator_without_pad_token_says_how_to_fix(data_dir):
    from transformers import GPT2TokenizerFast

    tokenizer = GPT2TokenizerFast.from_pretrained(str(data_dir / "tokenizers" / "gpt2"))
    tokenizer.pad_token = None
    with pytest.raises(DataFormatError, match="pad_token = tokenizer.eos_token"):
        classification_collator(tokenizer)


# --- language modelling: documents -----------------------------------------------------------


def test_tinystories_train_stories(data_dir):
    docs = load_documents("tinystories", "train", data_dir)
    assert len(docs) == 2_316 == get_dataset_spec("tinystories").local_rows["train"]
    assert docs[0].startswith("One day, a little girl named Lily found a needle in her room.")
    assert not any(EOS_TOKEN in d or d != d.strip("\n") or "\n\n" in d for d in docs)


def test_tinystories_validation_sample_is_repaired(data_dir):
    docs = load_documents("tinystories", "validation", data_dir)
    assert len(docs) == get_dataset_spec("tinystories").local_rows["validation"]
    assert docs[0].startswith("Spot. Spot saw the shiny car")
    assert all(d.startswith("Once upon a time") for d in docs[1:])
    text = "\n".join(docs)
    assert "\u00e2\u20ac" not in text and "\n\n" not in text
    assert text.count("\u201c") == 80 and text.count("\u201d") == 81  # the 234 mojibake sequences, repaired


def test_repair_cp1252_mojibake():
    damaged = "\u00e2\u20ac\u0153Hi\u00e2\u20ac she said, it\u00e2\u20ac\u2122s"  # “Hi” she said, it’s
    assert repair_cp1252_mojibake(damaged) == "\u201cHi\u201d she said, it\u2019s"
    assert repair_cp1252_mojibake("caf\u00e9 \u2014 fine") == "caf\u00e9 \u2014 fine"


WIKITEXT_SPLITS = [("wikitext-2", "validation", 60), ("wikitext-2", "test", 62), ("wikitext-2-raw", "test", 62)]


@pytest.mark.parametrize("name,split,articles", WIKITEXT_SPLITS)
def test_wikitext_articles(data_dir, name, split, articles):
    docs = load_documents(name, split, data_dir)
    assert len(docs) == articles == get_dataset_spec(name).local_rows[split]
    assert docs[0].lstrip().startswith("= ")
    assert not any("\r" in d or "\n\n" in d for d in docs)
    assert ("<unk>" in docs[0]) == (name == "wikitext-2")


def test_gutenberg_books_without_licence(data_dir):
    sizes = {split: len(load_documents("gutenberg", split, data_dir)) for split in ("train", "validation", "test")}
    assert sizes == {"train": 23, "validation": 2, "test": 2}
    books = load_documents("gutenberg", "validation", data_dir)
    for book in books:
        assert "PROJECT GUTENBERG EBOOK" not in book.upper() and "Project Gutenberg License" not in book
    assert "Otranto" in books[0][:2_000] or "OTRANTO" in books[0][:2_000]


# --- language modelling: tokenizers and packing ----------------------------------------------


def test_gpt2_tokenizer_from_local_files(gpt2_tokenizer):
    assert gpt2_tokenizer("Hello world")["input_ids"] == [15496, 995]
    assert len(gpt2_tokenizer) == 50_257
    assert gpt2_tokenizer.pad_token == gpt2_tokenizer.eos_token == EOS_TOKEN


def test_gpt2_tokenizer_missing_files_offline(tmp_path):
    with pytest.raises(DataNotFoundError, match="tokenizers/gpt2/vocab.json"):
        load_gpt2_tokenizer(tmp_path)


def test_pack_documents_blocks_eos_and_roundtrip(data_dir, gpt2_tokenizer, tmp_path):
    docs = load_documents("tinystories", "train", data_dir)[:40]
    block = 64
    blocks = pack_documents(docs, gpt2_tokenizer, block, cache_dir=tmp_path)
    ids = [gpt2_tokenizer(d)["input_ids"] + [gpt2_tokenizer.eos_token_id] for d in docs]
    stream = [t for doc in ids for t in doc]
    assert blocks.dtype == torch.long and blocks.shape == (len(stream) // block, block)
    assert blocks.flatten().tolist() == stream[: blocks.numel()]  # eos after every document, tail dropped
    eos = gpt2_tokenizer.eos_token_id
    assert blocks.eq(eos).sum().item() == sum(1 for i, t in enumerate(stream[: blocks.numel()]) if t == eos)
    joined = "".join(d + EOS_TOKEN for d in docs)
    assert joined.startswith(gpt2_tokenizer.decode(blocks[0]))
    cached = list(tmp_path.glob("tokens-*.npz"))
    assert len(cached) == 1 and np.load(cached[0])["tokens"].dtype == np.uint16
    again = pack_documents(docs, gpt2_tokenizer, 2 * block, cache_dir=tmp_path)  # same stream, other block size
    assert again.flatten().tolist() == stream[: again.numel()] and len(list(tmp_path.glob("tokens-*.npz"))) == 1


def test_pack_fewer_tokens_than_a_block(gpt2_tokenizer):
    assert pack_documents(["Hi."], gpt2_tokenizer, 64).shape == (0, 64)


def test_lm_block_dataset(gpt2_tokenizer):
    blocks = pack_documents(["one two three four five six seven eight"] * 4, gpt2_tokenizer, 8)
    ds = LMBlockDataset(blocks)
    assert len(ds) == blocks.shape[0] and ds.block_size == 8
    item = ds[0]
    assert item["input_ids"].shape == (8,) and torch.equal(item["input_ids"], item["labels"])


def test_bpe_tokenizer_vocab_size_and_cache(data_dir, tmp_path, monkeypatch):
    docs = load_documents("tinystories", "train", data_dir)[:300]
    tokenizer = train_bpe_tokenizer(docs, 500, tmp_path)
    assert len(tokenizer) == 500
    assert tokenizer.eos_token == tokenizer.pad_token == EOS_TOKEN and tokenizer.eos_token_id == 0
    sample = docs[0]
    assert tokenizer.decode(tokenizer(sample)["input_ids"]) == sample  # byte-level: lossless
    assert len(list(tmp_path.glob("bpe-500-*/tokenizer.json"))) == 1

    import tokenizers.trainers

    def no_training(*args, **kwargs):
        raise AssertionError("the cached tokenizer should have been loaded")

    monkeypatch.setattr(tokenizers.trainers, "BpeTrainer", no_training)
    cached = get_lm_tokenizer("bpe-500", docs, tmp_path, data_dir)
    assert cached(sample)["input_ids"] == tokenizer(sample)["input_ids"]


def test_get_lm_tokenizer_rejects_bad_specs(data_dir):
    assert get_lm_tokenizer("gpt2", None, None, data_dir)("Hello world")["input_ids"] == [15496, 995]
    with pytest.raises(ConfigError, match="bpe-<vocab_size>"):
        get_lm_tokenizer("sentencepiece", ["a"], None, data_dir)
    with pytest.raises(ConfigError, match="training documents"):
        get_lm_tokenizer("bpe-1000", None, None, data_dir)


def test_a_saved_tokenizer_reloads_with_the_same_ids_and_record(data_dir, tmp_path, gpt2_tokenizer):
    """A tokenizer saved as tokenizer.json (what `oelm run` leaves for a fine-tuning config) gives
    the same ids and the same sha256 record; a BPE of the same size trained on other text does not."""
    stories = load_documents("tinystories", "train", data_dir)[:300]
    tokenizer = train_bpe_tokenizer(stories, 500, None)
    record = tokenizer_record(tokenizer, "bpe-500")
    assert record["vocab_size"] == 500 and len(record["sha256"]) == 64
    assert save_tokenizer(tokenizer, tmp_path / "out" / "tokenizer.json")
    for spec in (str(tmp_path / "out" / "tokenizer.json"), str(tmp_path / "out")):  # the file, or its folder
        reloaded = get_lm_tokenizer(spec, None, None, data_dir)
        assert reloaded.eos_token == reloaded.pad_token == EOS_TOKEN and reloaded.eos_token_id == tokenizer.eos_token_id
        for text in stories[:20]:
            assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]
        assert tokenizer_record(reloaded, "bpe-500")["sha256"] == record["sha256"]
    # transformers sets truncation on the backend per call: not part of the tokenizer's identity
    tokenizer(stories[0], truncation=True, max_length=8)
    assert tokenizer_record(tokenizer, "bpe-500") == record
    reviews = load_classification("sst2", "train", data_dir)["text"].tolist()[:2000]
    other = train_bpe_tokenizer(reviews, 500, None)
    assert len(other) == 500 and tokenizer_record(other, "bpe-500")["sha256"] != record["sha256"]
    # GPT-2's tokenizer survives the same round trip
    assert save_tokenizer(gpt2_tokenizer, tmp_path / "gpt2.json")
    gpt2_copy = load_tokenizer_file(tmp_path / "gpt2.json")
    assert gpt2_copy("Hello world")["input_ids"] == [15496, 995]
    assert tokenizer_record(gpt2_copy, "x")["sha256"] == tokenizer_record(gpt2_tokenizer, "x")["sha256"] != record["sha256"]


def test_a_tokenizer_file_that_cannot_be_used_is_named(tmp_path, data_dir):
    with pytest.raises(ConfigError, match=r"nothing\.json does not exist"):
        get_lm_tokenizer(str(tmp_path / "nothing.json"), None, None, data_dir)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="bad.json is not a tokenizer.json"):
        load_tokenizer_file(tmp_path / "bad.json")
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(tmp_path / "no_eos.json"))
    with pytest.raises(ConfigError, match="no_eos.json has no <\\|endoftext\\|>"):
        load_tokenizer_file(tmp_path / "no_eos.json")


# --- Hub fallback (simulated: the Hub is unreachable here) ------------------------------------


@pytest.fixture
def fake_hub(monkeypatch):
    """Pretend the Hub is online and serves ``tables[(hub_id, config, split)]``; records the calls.
    The Hub path goes through Hugging Face ``datasets`` (an install requirement, but absent from some
    GPU images: the GPU check runs without it), so these tests skip where it is not installed."""
    datasets = pytest.importorskip("datasets", reason="Hugging Face `datasets` is not installed: the Hub fallback cannot run here")

    import oelm.data.registry as registry

    tables: dict[tuple, dict] = {}
    calls: list[tuple] = []

    def load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        if (path, name, split) not in tables:
            raise ConnectionError("unreachable")
        return datasets.Dataset.from_dict(tables[(path, name, split)])

    monkeypatch.setattr(registry, "hub_offline", lambda: False)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return tables, calls


def test_hub_fallback_renames_columns(fake_hub, tmp_path):
    tables, calls = fake_hub
    tables[("nyu-mll/glue", "mnli", "validation_matched")] = {
        "premise": ["A man sleeps.", "A dog runs."],
        "hypothesis": ["Someone rests.", "A cat sits."],
        "label": [0, 2],
        "idx": [0, 1],
    }
    df = load_classification("mnli", "validation", tmp_path)  # alias of validation_matched
    assert calls == [("nyu-mll/glue", "mnli", "validation_matched")]
    assert list(df.columns) == ["sentence1", "sentence2", "label"] and df["label"].tolist() == [0, 2]


def test_hub_failure_is_data_not_found(fake_hub, tmp_path):
    with pytest.raises(DataNotFoundError, match="download of split 'train' failed .*ConnectionError") as info:
        load_classification("imdb", "validation", tmp_path)
    assert "imdb/validation (held out from train)" in str(info.value)
    assert isinstance(info.value.__cause__, ConnectionError)


def test_hub_fallback_lm_rows(fake_hub, tmp_path):
    tables, _ = fake_hub
    lines = ["", " = Alpha = \n", "", " Alpha text . \n", " = = Part = = \n", " more . \n", "", " = Beta = \n", " Beta text . \n"]
    tables[("Salesforce/wikitext", "wikitext-2-v1", "train")] = {"text": lines}
    assert load_documents("wikitext-2", "train", tmp_path) == [
        " = Alpha = \n Alpha text . \n = = Part = = \n more . ",
        " = Beta = \n Beta text . ",
    ]
    story = "Tom said \u00e2\u20ac\u0153hi\u00e2\u20ac.\n\nThe end."  # HF TinyStories: mojibake, blank-line paragraphs
    tables[("roneneldan/TinyStories", None, "validation")] = {"text": [story, "  "]}
    assert load_documents("tinystories", "validation", tmp_path) == ["Tom said \u201chi\u201d.\nThe end."]


def test_test_samples_draws_one_fixed_subset_of_the_test_split(data_dir):
    """task.test_samples: a random subset of the test split, the same on every call (subset_seed);
    None keeps the whole split (SST-2's labelled test set: 1,821 sentences)."""
    from oelm.config import ExperimentConfig
    from oelm.matrix.data import prepare_data

    def config(**task):
        return ExperimentConfig.model_validate({
            "name": "t", "methods": [{"name": "baseline"}], "model": {"gpt": "gpt-tiny"},
            "task": {"dataset": "sst2", "tokenizer": "bpe-512", "train_samples": 64, "validation_samples": 16,
                     "test_split": "test", "max_length": 32, **task}})

    def texts(data):
        return [tuple(data.test[i]["input_ids"]) for i in range(len(data.test))]

    whole = prepare_data(config())
    first, again = prepare_data(config(test_samples=100)), prepare_data(config(test_samples=100))
    assert len(whole.test) == 1821 and len(first.test) == 100 and first.summary["test"]["examples"] == 100
    assert texts(first) == texts(again) and set(texts(first)) <= set(texts(whole))
    with pytest.raises(ValueError, match="test_samples"):
        config(test_samples=0)


def test_a_test_split_equal_to_the_validation_split_is_its_held_out_rest(data_dir):
    """task.test_split = task.validation_split (one held-out split, as the local TinyStories
    sample has): validation is the validation_samples subset it always was, the test set is
    every other document of that split, and no document is in both. Without validation_samples
    the config is refused (the test set would be the validation set)."""
    from oelm.config import ExperimentConfig
    from oelm.data import load_documents, subsample
    from oelm.data.classification import held_out_rest
    from oelm.matrix.data import _load_splits

    def config(**task):
        return ExperimentConfig.model_validate({
            "name": "t", "methods": [{"name": "baseline"}], "model": {"gpt": "gpt-tiny"},
            "task": {"dataset": "tinystories", "tokenizer": "bpe-512", "train_samples": 50, "block_size": 64, **task}})

    full = load_documents("tinystories", "validation", data_dir)
    docs = _load_splits(config(validation_samples=300, test_split="validation").task, load_documents, subsample)
    assert docs["validation"] == subsample(full, 300, 0)  # the validation subset is unchanged
    assert len(docs["test"]) == len(full) - 300 > 0
    positions = list(range(len(full)))  # the same draw on positions: disjoint, and together the whole split
    val_at, test_at = set(subsample(positions, 300, 0)), set(held_out_rest(positions, 300, 0))
    assert not val_at & test_at and val_at | test_at == set(positions)
    assert docs["test"] == [full[i] for i in sorted(test_at)]

    fewer = _load_splits(config(validation_samples=300, test_split="validation", test_samples=100).task,
                         load_documents, subsample)
    assert len(fewer["test"]) == 100 and fewer["test"] == subsample(docs["test"], 100, 0)
    with pytest.raises(ValueError, match="task.validation_samples"):
        config(test_split="validation")
    with pytest.raises(ConfigError, match="nothing is left for a test set"):
        held_out_rest(full, len(full), 0)
