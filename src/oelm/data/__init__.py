"""Task data: the dataset registry, classification batching, LM tokenization and packing.

    from oelm.data import load_classification, encode_classification, classification_collator
    from oelm.data import load_documents, get_lm_tokenizer, pack_documents, LMBlockDataset

Local files come from a data dir laid out like ``shared/data`` (``data_dir`` argument or
``$OELM_DATA_DIR``); the Hugging Face Hub is the fallback. See :mod:`oelm.data.registry` for the
lookup rules and each dataset's caveats (``get_dataset_spec(name).notes``).
"""

from oelm.data.classification import (
    ClassificationDataset,
    classification_collator,
    encode_classification,
    length_buckets,
    load_classification,
    subsample,
)
from oelm.data.lm import (
    EOS_TOKEN,
    LMBlockDataset,
    documents_digest,
    get_lm_tokenizer,
    load_documents,
    load_gpt2_tokenizer,
    load_tokenizer_file,
    pack_documents,
    save_tokenizer,
    tokenizer_record,
    train_bpe_tokenizer,
)
from oelm.data.registry import (
    DATASETS,
    DatasetSpec,
    available_splits,
    get_dataset_spec,
    holdout_indices,
    register_dataset,
    resolve_data_dir,
)

__all__ = [
    "DATASETS",
    "EOS_TOKEN",
    "ClassificationDataset",
    "DatasetSpec",
    "LMBlockDataset",
    "available_splits",
    "classification_collator",
    "documents_digest",
    "encode_classification",
    "get_dataset_spec",
    "get_lm_tokenizer",
    "holdout_indices",
    "length_buckets",
    "load_classification",
    "load_documents",
    "load_gpt2_tokenizer",
    "load_tokenizer_file",
    "pack_documents",
    "register_dataset",
    "resolve_data_dir",
    "save_tokenizer",
    "subsample",
    "tokenizer_record",
    "train_bpe_tokenizer",
]
