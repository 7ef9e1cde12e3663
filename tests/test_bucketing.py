"""Classification batches padded to a few fixed lengths (``classification_collator(buckets=...)``):
every batch has one of the bucket lengths, and on real SST-2 sentences a model's logits, loss and
accuracy equal those of batches padded only to their longest example (the attention mask makes
the extra padding inert)."""

from __future__ import annotations

import pytest
import torch

from oelm.data.classification import classification_collator, encode_classification, length_buckets, load_classification
from oelm.errors import ConfigError


def test_length_buckets_are_powers_of_two_up_to_max_length():
    assert length_buckets(128) == (16, 32, 64, 128)
    assert length_buckets(100) == (16, 32, 64, 100)
    assert length_buckets(512, smallest=64) == (64, 128, 256, 512)
    assert length_buckets(8) == (8,)
    with pytest.raises(ConfigError, match="max_length >= 1"):
        length_buckets(0)


@pytest.fixture(scope="module")
def sst2(data_dir):
    from transformers import BertTokenizerFast

    tokenizer = BertTokenizerFast.from_pretrained(str(data_dir / "tokenizers" / "bert-base-uncased"))
    frame = load_classification("sst2", "validation", data_dir)  # 872 sentences
    return tokenizer, encode_classification(frame, tokenizer, ("text",), max_length=128)


def _batches(dataset, collate, size=32):
    return [collate([dataset[i] for i in range(s, min(s + size, len(dataset)))]) for s in range(0, len(dataset), size)]


def test_bucketed_batches_have_few_shapes(sst2):
    tokenizer, data = sst2
    buckets = length_buckets(128)
    bucketed = _batches(data, classification_collator(tokenizer, buckets=buckets))
    longest = _batches(data, classification_collator(tokenizer))
    assert {b["input_ids"].shape[1] for b in bucketed} <= set(buckets)
    assert len({b["input_ids"].shape[1] for b in longest}) > len(buckets)  # what bucketing is for
    for b, ref in zip(bucketed, longest):
        n = ref["input_ids"].shape[1]
        assert b["input_ids"].shape[1] == min(x for x in buckets if x >= n)
        assert torch.equal(b["input_ids"][:, :n], ref["input_ids"]) and torch.equal(b["labels"], ref["labels"])
        assert b["attention_mask"].sum() == ref["attention_mask"].sum()  # only masked padding added
        assert (b["input_ids"][:, n:] == tokenizer.pad_token_id).all()


def test_bucketed_batches_give_the_same_metrics_on_sst2(sst2):
    """A BERT classifier (random weights, 2 layers) scores SST-2 validation the same either way."""
    from transformers import BertConfig, BertForSequenceClassification

    tokenizer, data = sst2
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, num_hidden_layers=2,
                                                     num_attention_heads=4, intermediate_size=128, num_labels=2,
                                                     initializer_range=0.5)).eval()  # outputs that vary by sentence

    def scores(collate):
        logits, losses, labels = [], [], []
        with torch.no_grad():
            for batch in _batches(data, collate):
                out = model(**batch)
                logits.append(out.logits)
                losses.append(out.loss * len(batch["labels"]))
                labels.append(batch["labels"])
        logits, labels = torch.cat(logits), torch.cat(labels)
        return logits, float(sum(losses)) / len(labels), float((logits.argmax(-1) == labels).float().mean())

    ref_logits, ref_loss, ref_acc = scores(classification_collator(tokenizer))
    logits, loss, acc = scores(classification_collator(tokenizer, buckets=length_buckets(128)))
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-5)
    assert loss == pytest.approx(ref_loss, rel=1e-5) and acc == ref_acc
    # the comparison has teeth: without the attention mask the padding would change the logits
    no_mask = classification_collator(tokenizer, buckets=(128,))
    batch = no_mask([data[i] for i in range(32)])
    with torch.no_grad():
        unmasked = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"]).logits
    assert not torch.allclose(unmasked, ref_logits[:32], atol=1e-2)
    assert ref_logits.std(0).min() > 0.1 and set(ref_logits.argmax(-1).tolist()) == {0, 1}  # logits that differ by sentence


def test_bad_buckets_are_refused(sst2):
    tokenizer, _ = sst2
    with pytest.raises(ConfigError, match="not both"):
        classification_collator(tokenizer, pad_to_multiple_of=8, buckets=(16,))
    with pytest.raises(ConfigError, match="lengths >= 1"):
        classification_collator(tokenizer, buckets=(0, 16))


# --- training.length_buckets: wired into a run's loaders, and the compiled graphs counted ---------

def _tiny_config(tmp_path, data_dir, training: str):
    from oelm.config import config_from_dict
    import yaml

    return config_from_dict(yaml.safe_load(
        "name: bucketed\n"
        f"task: {{dataset: sst2, data_dir: {data_dir}, tokenizer: bpe-512, train_samples: 64, validation_samples: 32,"
        " max_length: 64}\n"
        "model: {gpt: gpt-tiny, gpt_overrides: {hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64,"
        " dropout: 0.0}}\n"
        "methods: [{name: baseline, learning_rate: 1.0e-3}]\nseeds: [0]\n"
        f"training: {{batch_size: 16, eval_batch_size: 16, progress_bar: false, tensorboard: false, {training}}}\n"))


@pytest.mark.parametrize("training, bucketed", [
    ("length_buckets: true", True),
    ("length_buckets: false, compile: default", False),
    ("compile: reduce-overhead", True),  # None (default): on when compiled
    ("max_steps: 2", False),  # None, eager: per-batch longest, as before
])
def test_length_buckets_setting_decides_the_loaders_padding(tmp_path, data_dir, monkeypatch, training, bucketed):
    from oelm.matrix.data import make_loaders, prepare_data

    monkeypatch.setenv("OELM_CACHE_DIR", str(tmp_path / "cache"))
    config = _tiny_config(tmp_path, data_dir, training)
    data = prepare_data(config)
    assert data.length_buckets == (16, 32, 64)
    lengths = set()
    for loader in make_loaders(data, config.training, seed=0)[:2]:
        lengths |= {batch["input_ids"].shape[1] for batch in loader}
    assert lengths <= set(data.length_buckets) if bucketed else not lengths <= set(data.length_buckets)


@pytest.mark.slow
def test_compiled_run_records_its_graphs_and_recompilations(tmp_path, data_dir, monkeypatch):
    """A compiled CPU run with buckets: the result's timing counts the graphs compiled (warm-up
    included) and those compiled after the warm-up; the same run eager records None.

    Dynamo's AOT-eager backend stands in for inductor here: the graphs and recompilations are
    Dynamo's to count whichever backend runs them, and inductor's C++ code generation (~50 s on one
    core) is covered by tests/test_training_engine.py."""
    import functools

    import torch

    from oelm.matrix import run_matrix

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    monkeypatch.setenv("OELM_CACHE_DIR", str(tmp_path / "cache"))
    config = _tiny_config(tmp_path, data_dir, "max_steps: 4, eval_every: 2, compile: default, length_buckets: true")
    run_matrix(config, tmp_path / "out")
    import json

    (result,) = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("runs/*/result.json")]
    assert result["status"] == "finished"
    timing = result["timing"]
    assert timing["compile_mode"] == "default"
    assert timing["compiled_graphs"] >= 1
    assert 0 <= timing["recompilations"] <= timing["compiled_graphs"]
