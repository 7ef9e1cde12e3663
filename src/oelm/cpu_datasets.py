"""Datasets for the CPU-scale counterparts of the original experiments (``configs/cpu/``).

The original project's MNLI and XNLI runs train on MNLI's 392,702 English pairs, which are not
in ``shared/data`` (Hub only). The only labelled local NLI data is the English XNLI validation
split (2,490 pairs; the local XNLI test split has no gold labels). ``xnli-en-dev`` makes it a
small NLI task of its own: a fixed 20% of those pairs (seeded hold-out, the same on every
machine) is its validation split, the rest its training split. It is a stand-in with the same
label set (entailment / neutral / contradiction), not the original benchmark: numbers on it are
not comparable with published MNLI/XNLI accuracies.
"""

from __future__ import annotations

import dataclasses

from oelm.data.registry import DATASETS, DatasetSpec, get_dataset_spec, register_dataset

__all__ = ["XNLI_EN_DEV"]


def _xnli_en_dev() -> DatasetSpec:
    xnli = get_dataset_spec("xnli")
    return dataclasses.replace(
        xnli,
        name="xnli-en-dev",
        hub_id=None,
        hub_config=None,
        local_files={"train": xnli.local_files["validation"]},
        hub_splits={},
        official_rows={"train": 2_490},
        local_rows={"train": 2_490},
        validation_holdout=0.2,
        notes="CPU stand-in for MNLI/XNLI: the English XNLI validation pairs, 20% held out as validation. " + xnli.notes,
        source="Conneau et al. 2018, XNLI 1.0 (validation, English); shared/data/MANIFEST.md section 5b",
    )


XNLI_EN_DEV = _xnli_en_dev()
if "xnli-en-dev" not in DATASETS:
    register_dataset(XNLI_EN_DEV)
