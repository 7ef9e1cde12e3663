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
