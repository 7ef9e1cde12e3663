"""Data files that are there as the wrong kind of thing (issue 26, item 5): a split's file path
that is a directory was reported as "not found under the data dir" (and the Hub suggested); it
is one line saying what is there and what to put instead."""

from __future__ import annotations

import pytest

from oelm.data import load_classification, load_documents
from oelm.errors import DataFormatError


@pytest.mark.parametrize("dataset, rel, load", [
    ("sst2", "sst2/train.parquet", load_classification),
    ("tinystories", "tinystories/train_head_2316.txt.gz", load_documents),
])
def test_a_split_file_that_is_a_directory_is_named(tmp_path, dataset, rel, load):
    (tmp_path / rel).mkdir(parents=True)
    with pytest.raises(DataFormatError) as info:
        load(dataset, "train", tmp_path)
    msg = str(info.value)
    assert "\n" not in msg and f"{tmp_path / rel} is a directory (or another non-file), not the" in msg
    assert "not found" not in msg and "Fix: replace it with the file from shared/data" in msg
