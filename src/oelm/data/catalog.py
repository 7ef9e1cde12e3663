"""The datasets oelm ships: one :class:`~oelm.data.dataset_spec.DatasetSpec` per task in :data:`SHIPPED`,
which :mod:`oelm.data.registry` registers when it is imported (this module imports nothing of the
registry). Counts and caveats: shared/data/MANIFEST.md and the Hub dataset cards."""

from __future__ import annotations

import dataclasses

from oelm.data.dataset_spec import DatasetSpec

#: The shipped specs by name, in the order they are defined here.
SHIPPED: dict[str, DatasetSpec] = {}


def _ship(spec: DatasetSpec) -> None:
    """Add ``spec`` to :data:`SHIPPED` (the registry registers them all on import)."""
    SHIPPED[spec.name] = spec


_PAIR = ("sentence1", "sentence2")
_NLI_LABELS = ("entailment", "neutral", "contradiction")
_NLI_HUB_COLUMNS = {"premise": "sentence1", "hypothesis": "sentence2"}

_ship(
    DatasetSpec(
        name="sst2",
        task_type="classification",
        metric="accuracy",
        hub_id="nyu-mll/glue",
        hub_config="sst2",
        local_files={
            "train": ("sst2/train.parquet",),
            "validation": ("sst2/validation.parquet",),
            "test": ("sst2/test_labeled.parquet",),
        },
        hub_splits={"train": "train", "validation": "validation"},  # the Hub's GLUE test is unlabeled
        label_names=("negative", "positive"),
        official_rows={"train": 67_349, "validation": 872, "test": 1_821},
        local_rows={"train": 67_349, "validation": 872, "test": 1_821},
        hub_columns={"sentence": "text"},
        notes=(
            "test = sst2/test_labeled.parquet: the GLUE test sentences (officially unlabeled) with labels from the "
            "canonical SST binary test set (a non-GLUE copy, clairett/pytorch-sentiment-classification), matched on "
            "normalized text (1,817 rows; 4 more differ by US/UK spelling). Report test numbers as offline analysis "
            "with that caveat; select models on validation. No Hub fallback for test (the Hub copy is unlabeled). "
            "Train/validation text is verbatim GLUE (trailing space kept)."
        ),
        source="GLUE SST-2 (Socher et al. 2013; Wang et al. 2019); shared/data/MANIFEST.md section 1",
    )
)

_ship(
    DatasetSpec(
        name="imdb",
        task_type="classification",
        metric="accuracy",
        hub_id="stanfordnlp/imdb",
        hub_config=None,
        local_files={"train": ("imdb/train.parquet",), "test": ("imdb/test.parquet",)},
        hub_splits={"train": "train", "test": "test"},
        label_names=("neg", "pos"),
        official_rows={"train": 25_000, "test": 25_000},
        local_rows={"train": 25_000, "test": 25_000},
        validation_holdout=0.1,
        notes=(
            "No official validation split: validation = a seeded 10% (2,500 reviews) of train, train = the other "
            "22,500. Local rows are sorted by (label, review_id): shuffle when training. Text keeps the <br /> tags."
        ),
        source="Maas et al. 2011, Large Movie Review Dataset v1.0; shared/data/MANIFEST.md section 4b",
    )
)

_ship(
    DatasetSpec(
        name="ag_news",
        task_type="classification",
        metric="accuracy",
        hub_id="fancyzhx/ag_news",
        hub_config=None,
        local_files={
            "train": ("ag_news/train_subset_alps10k_description_only.parquet",),
            "test": ("ag_news/test.parquet",),
        },
        hub_splits={"train": "train", "test": "test"},
        label_names=("World", "Sports", "Business", "Sci/Tech"),
        official_rows={"train": 120_000, "test": 7_600},
        local_rows={"train": 10_001, "test": 7_600},
        validation_holdout=0.1,
        notes=(
            "Local train is NOT the official 120,000-row train: it is the ALPS 10k sample (10,001 rows) with the "
            "description only (no title), while test text is title + ' ' + description as in the official release, "
            "so train and test differ in form. 10 train descriptions also occur verbatim in test (as in the original "
            "data). Validation = a seeded 10% of train. The Hub fallback train is the full 120k title+description set."
        ),
        source="Zhang, Zhao & LeCun 2015 (ag_news_csv); ALPS (Yuan et al. 2020) subset; shared/data/MANIFEST.md section 4a",
    )
)

_ship(
    DatasetSpec(
        name="xnli",
        task_type="classification",
        metric="accuracy",
        hub_id="facebook/xnli",
        hub_config="en",
        local_files={"validation": ("xnli/validation.parquet",), "test": ("xnli/test.parquet",)},
        hub_splits={"train": "train", "validation": "validation", "test": "test"},
        text_columns=_PAIR,
        label_names=_NLI_LABELS,
        official_rows={"train": 392_702, "validation": 2_490, "test": 5_010},
        local_rows={"validation": 2_490, "test": 5_010},
        hub_columns=_NLI_HUB_COLUMNS,
        row_filter={"language": "en"},
        notes=(
            "English only: the local files hold 15 languages (XTREME per-language files) and are filtered to "
            "language == 'en'. The local test split has no gold labels (XTREME removed them; label = -1): load it "
            "with allow_unlabeled=True for predictions only, and score on validation; the Hub copy of test is "
            "labeled. Train (MNLI, 392,702 pairs for English) is Hub only."
        ),
        source="Conneau et al. 2018, XNLI 1.0; shared/data/MANIFEST.md section 5b",
    )
)

_ship(
    DatasetSpec(
        name="mnli",
        task_type="classification",
        metric="accuracy",
        hub_id="nyu-mll/glue",
        hub_config="mnli",
        local_files={
            "train": ("mnli/train.parquet",),
            "validation": ("mnli/validation_matched.parquet",),
            "validation_matched": ("mnli/validation_matched.parquet",),
            "validation_mismatched": ("mnli/validation_mismatched.parquet",),
        },
        hub_splits={
            "train": "train",
            "validation": "validation_matched",
            "validation_matched": "validation_matched",
            "validation_mismatched": "validation_mismatched",
        },
        text_columns=_PAIR,
        label_names=_NLI_LABELS,
        official_rows={"train": 392_702, "validation_matched": 9_815, "validation_mismatched": 9_832},
        hub_columns=_NLI_HUB_COLUMNS,
        notes=(
            "Hub only: no MNLI file could be stored in shared/data (all over the 4 MiB limit). 'validation' is an "
            "alias of validation_matched. Local files, if you have them, are parquet with sentence1/sentence2/label."
        ),
        source="Williams et al. 2018, MultiNLI via GLUE; shared/data/MANIFEST.md section 5a",
    )
)

_ship(
    DatasetSpec(
        name="tinystories",
        task_type="language_modeling",
        metric="perplexity",
        hub_id="roneneldan/TinyStories",
        hub_config=None,
        local_files={
            "train": ("tinystories/train_head_2316.txt.gz",),
            "validation": ("tinystories/validation_head_sample.txt.gz",),
        },
        hub_splits={"train": "train", "validation": "validation"},
        label_column=None,
        official_rows={"train": 2_119_719, "validation": 21_990},
        local_rows={"train": 2_316, "validation": 714},
        local_formats={"train": "eot_text", "validation": "paragraph_stories"},
        text_fixes=("cp1252_mojibake", "single_newline_paragraphs"),
        notes=(
            "Head-only samples, not random ones: train = the first 2,316 stories of the official train split "
            "(exact story boundaries, <|endoftext|>-separated); validation = the first ~1,000 stories of the "
            "official validation split (21,990), exported with a blank line between stories AND between "
            "paragraphs, so story boundaries are not recoverable. oelm cuts that sample into 714 pseudo-stories "
            "(the first text, then one at each paragraph that begins 'Once upon a time'; on the train sample, where "
            "boundaries are known, that opening starts 55% of stories and begins a later paragraph in 3% of them; "
            "the sample's ~790k characters are about 890 train-length stories). So <|endoftext|> lands mostly on "
            "real boundaries and the missed ones get a newline: validation perplexity is comparable between oelm "
            "runs, not with published TinyStories numbers. All TinyStories text (local and Hub) is normalized to the "
            "train file's form: "
            "cp1252 mojibake of curly quotes/dashes is repaired (the validation sample has 'â€' 234 times) and "
            "blank lines between paragraphs become single newlines."
        ),
        source="Eldan & Li 2023, TinyStories (roneneldan/TinyStories); shared/data/MANIFEST.md sections 2 and 9",
    )
)

_WIKITEXT_NOTE = (
    "Documents are articles: the text is cut before each level-1 heading line ' = Title = ' and blank lines are "
    "dropped (a few formula lines that look like headings also start a new document, e.g. in 'Constant k filter'). "
)

_ship(
    DatasetSpec(
        name="wikitext-2",
        task_type="language_modeling",
        metric="perplexity",
        hub_id="Salesforce/wikitext",
        hub_config="wikitext-2-v1",
        local_files={
            "train": ("wikitext-2/wikitext-2-v1/train.txt.gz",),
            "validation": ("wikitext-2/wikitext-2-v1/valid.txt.gz",),
            "test": ("wikitext-2/wikitext-2-v1/test.txt.gz",),
        },
        hub_splits={"train": "train", "validation": "validation", "test": "test"},
        label_column=None,
        official_rows={"train": 36_718, "validation": 3_760, "test": 4_358},
        local_rows={"validation": 60, "test": 62},
        local_formats={"train": "wikitext", "validation": "wikitext", "test": "wikitext"},
        notes=(
            "The tokenized v1 variant (<unk> for rare words, ' @-@ ' splits, spaces around punctuation) in every "
            "split: local validation/test are wiki.valid/test.tokens; train is Hub only (wikitext-2-v1), never the "
            "raw variant, because a model trained on raw text never sees '<unk>' or '@-@' and would be scored "
            "unfairly on v1 text. For raw text use 'wikitext-2-raw'. Subword perplexity here is not the "
            "word-level perplexity of the literature. " + _WIKITEXT_NOTE
        ),
        source="Merity et al. 2016, WikiText; shared/data/MANIFEST.md section 3",
    )
)

_ship(
    DatasetSpec(
        name="wikitext-2-raw",
        task_type="language_modeling",
        metric="perplexity",
        hub_id="Salesforce/wikitext",
        hub_config="wikitext-2-raw-v1",
        local_files={
            "train": ("wikitext-2/wikitext-2-raw-v1/train.txt.gz",),
            "validation": ("wikitext-2/wikitext-2-raw-v1/valid.txt.gz",),
            "test": ("wikitext-2/wikitext-2-raw-v1/test.txt.gz",),
        },
        hub_splits={"train": "train", "validation": "validation", "test": "test"},
        label_column=None,
        official_rows={"train": 36_718, "validation": 3_760, "test": 4_358},
        local_rows={"test": 62},
        local_formats={"train": "wikitext", "validation": "wikitext", "test": "wikitext"},
        notes=(
            "The raw variant (no <unk>). Only test is stored locally (wiki.test.raw, CRLF normalized); train and "
            "validation are Hub only (wikitext-2-raw-v1). " + _WIKITEXT_NOTE
        ),
        source="Merity et al. 2016, WikiText; shared/data/MANIFEST.md section 3",
    )
)

_ship(
    DatasetSpec(
        name="wikitext-103",
        task_type="language_modeling",
        metric="perplexity",
        hub_id="Salesforce/wikitext",
        hub_config="wikitext-103-raw-v1",
        local_files={
            "train": ("wikitext-103/wikitext-103-raw-v1/train.txt.gz",),
            "validation": ("wikitext-103/wikitext-103-raw-v1/valid.txt.gz",),
            "test": ("wikitext-103/wikitext-103-raw-v1/test.txt.gz",),
        },
        hub_splits={"train": "train", "validation": "validation", "test": "test"},
        label_column=None,
        official_rows={"train": 1_801_350, "validation": 3_760, "test": 4_358},
        local_formats={"train": "wikitext", "validation": "wikitext", "test": "wikitext"},
        notes="Hub only (raw variant, about 540 MB; not stored in shared/data). " + _WIKITEXT_NOTE,
        source="Merity et al. 2016, WikiText; shared/data/MANIFEST.md section 3",
    )
)

_ship(
    DatasetSpec(
        name="openwebtext",
        task_type="language_modeling",
        metric="perplexity",
        hub_id="Skylion007/openwebtext",
        hub_config=None,
        local_files={"train": ("openwebtext/train.parquet",)},
        hub_splits={"train": "train"},
        label_column=None,
        official_rows={"train": 8_013_769},
        validation_holdout=0.0005,
        notes=(
            "Hub only (no real OpenWebText documents could be stored in shared/data). Train only upstream: "
            "validation = a seeded 0.05% of the documents (about 4,000, the nanoGPT convention), train = the rest."
        ),
        source="Gokaslan & Cohen 2019, OpenWebText; shared/data/MANIFEST.md section 6",
    )
)

# Gutenberg: one document per book; split by book AND author. Validation and test are the four
# shortest books whose author has no other book in the corpus (alternating by length), so no
# held-out author is seen in training. Evelina (incomplete in the source) stays in train.
_GUTENBERG_VALIDATION = ("HoraceWalpole__CastleOfOtranto", "MariaEdgeworth__CastleRackrent")
_GUTENBERG_TEST = ("WilliamBeckford__Vathek", "ClaraReeve__TheOldEnglishBaron")
_GUTENBERG_TRAIN = (
    "AnnRadcliffe__ASicilianRomance",
    "AnnRadcliffe__TheItalianVol1",
    "AnnRadcliffe__TheItalianVol2",
    "AnnRadcliffe__TheRomanceOfTheForest",
    "AnnRadcliffe__Udolpho",
    "CharlotteSmith__Emmeline",
    "ElizaHaywood__LoveInExcess",
    "FrancesBurney__Camilla",
    "FrancesBurney__CeciliaVol1",
    "FrancesBurney__CeciliaVol2",
    "FrancesBurney__CeciliaVol3",
    "FrancesBurney__Evelina",
    "FrancesBurney__TheWandererVol1",
    "FrancesBurney__TheWandererVol2",
    "FrancesBurney__TheWandererVol3",
    "FrancesBurney__TheWandererVol4",
    "FrancesBurney__TheWandererVol5",
    "HenryFielding__TomJones",
    "JaneAusten__PrideAndPrejudice",
    "MGLewis__TheMonk",
    "SamuelRichardson__Pamela",
    "TobiasSmollett__FerdinandFathom",
    "TobiasSmollett__HumphryClinker",
)


def _books(names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f"gutenberg/{n}.txt.gz" for n in names)


_ship(
    DatasetSpec(
        name="gutenberg",
        task_type="language_modeling",
        metric="perplexity",
        hub_id=None,
        hub_config=None,
        local_files={
            "train": _books(_GUTENBERG_TRAIN),
            "validation": _books(_GUTENBERG_VALIDATION),
            "test": _books(_GUTENBERG_TEST),
        },
        hub_splits={},
        label_column=None,
        official_rows={"train": 23, "validation": 2, "test": 2},
        local_rows={"train": 23, "validation": 2, "test": 2},
        local_formats={"train": "gutenberg", "validation": "gutenberg", "test": "gutenberg"},
        notes=(
            "27 18th-century English novels from Project Gutenberg, one document per book (about 4.97M GPT-2 tokens "
            "in all). Each book keeps only the text between the '*** START OF THE/THIS PROJECT GUTENBERG EBOOK' and "
            "'*** END OF ...' lines (header and licence removed). Split by book and author: validation = The Castle "
            "of Otranto + Castle Rackrent, test = Vathek + The Old English Baron (each about 3% of the text), train = "
            "the other 23 books. Front matter after the START line (title pages, prefaces) is kept. Evelina is "
            "incomplete in the source (stops mid-Volume II, no END line). Local only."
        ),
        source="Project Gutenberg via danwaterfield/DigHums; shared/data/MANIFEST.md section 10",
    )
)


# -- CPU stand-ins (configs/cpu/) --------------------------------------------------------------
# The original project's MNLI and XNLI runs train on MNLI's 392,702 English pairs, which are not
# in ``shared/data`` (Hub only). The only labelled local NLI data is the English XNLI validation
# split (2,490 pairs; the local XNLI test split has no gold labels). ``xnli-en-dev`` makes it a
# small NLI task of its own: a fixed 20% of those pairs (seeded hold-out, the same on every
# machine) is its validation split, the rest its training split. It is a stand-in with the same
# label set (entailment / neutral / contradiction), not the original benchmark: numbers on it are
# not comparable with published MNLI/XNLI accuracies.


def _xnli_en_dev() -> DatasetSpec:
    xnli = SHIPPED["xnli"]
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
_ship(XNLI_EN_DEV)
