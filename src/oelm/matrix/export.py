"""``oelm export RUN_DIR OUT``: a finished run's best weights as a Hugging Face model folder that a
stock ``AutoModelFor...from_pretrained(OUT)`` loads with no oelm import, with a model card.

The run's model is built as its matrix built it (:func:`oelm.matrix.assemble.build_run_model`:
the config's model, the method applied, its LoRA adapter), its best-on-validation weights
(``checkpoint/model.safetensors``, checked against the size and sha256 ``result.json`` records)
are loaded strictly, and the method is merged out: PEFT's ``merge_and_unload`` for a LoRA adapter,
then :func:`oelm.merge_and_unload` (a split fused Q/K/V fused back into the architecture's own
module, ``oelm_temperature``'s learned head temperatures folded into the query rows). The plain
model's own ``save_pretrained`` writes ``config.json`` and ``model.safetensors``; the tokenizer's
files, ``README.md`` (the model card: YAML metadata as the Hub reads it, then the run's method,
data, metrics, environment and the command that reproduces it) and ``oelm_config.yaml`` (the
matrix's config, for that command) go beside them. Everything is written to a temporary folder
beside ``OUT`` and renamed into place, so ``OUT`` is whole or absent.

oelm's own GPT (``model.gpt``) is not a ``transformers`` class: a stock loader could build it only
with ``trust_remote_code`` and code shipped beside the weights, which oelm does not do. Exporting
one is refused with one line naming :func:`oelm.models.build_gpt` and the run's weights file instead.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import yaml

from oelm.config import ExperimentConfig, load_config
from oelm.errors import ConfigError, OELMError
from oelm.records import MatrixFolder, RunFolder, RunRecord

__all__ = ["export_run", "model_card", "card_metadata"]

_PIPELINE = {"classification": "text-classification", "language_modeling": "text-generation"}
_HF_TASK = {"classification": ("text-classification", "Text Classification"),
            "language_modeling": ("text-generation", "Text Generation")}


def _finished_run(run_dir: Path) -> tuple[RunFolder, RunRecord, ExperimentConfig]:
    """The run folder, its finished record and its matrix's config.

    Raises:
        OELMError: not a run folder of an ``oelm run`` output directory, or the run did not finish.
    """
    folder = RunFolder(run_dir)
    if not folder.result.is_file():
        if MatrixFolder(run_dir).config.is_file():
            names = ", ".join(f.name for f in MatrixFolder(run_dir).runs_with_results()) or "none finished yet"
            raise OELMError(f"{run_dir} is a matrix's output folder; give one run's folder: {run_dir}/runs/<run> ({names})")
        raise OELMError(f"{run_dir} is not an oelm run folder (no result.json); give OUTPUT_DIR/runs/<run> of `oelm run`")
    record = folder.read_result()
    if not record.finished:
        raise OELMError(f"{run_dir}: the run {record.status} ({record.failure_kind}); only a finished run's best weights "
                        "can be exported (`oelm run --retry-failed` trains it again)")
    matrix = MatrixFolder(run_dir.resolve().parent.parent)
    if not matrix.config.is_file():
        raise OELMError(f"{run_dir} is not inside an `oelm run` output folder (no {matrix.config}); export the run "
                        "where `oelm run` wrote it")
    return folder, record, load_config(matrix.config)


def _check_out(out: Path) -> None:
    if out.is_symlink():  # the export would land wherever it points
        raise OELMError(f"{out} is a symbolic link; give a new folder for the export (nothing was written)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OELMError(f"{out} exists and is not an empty folder; give a new folder for the export (nothing was written)")


def export_run(run_dir: str | Path, out: str | Path, log: Callable[[str], None] = print) -> Path:
    """Write the finished run ``run_dir``'s best weights as a Hugging Face model folder ``out``.

    Args:
        run_dir: ``OUTPUT_DIR/runs/<run>`` of ``oelm run`` (a finished run with best weights).
        out: a new (or empty) folder.

    Returns:
        ``out``, holding ``config.json``, ``model.safetensors``, the tokenizer's files, ``README.md``
        and ``oelm_config.yaml``.

    Raises:
        OELMError: not a finished run's folder; ``out`` is not new; the run is oelm's GPT.
        ChecksumError / RecordedFileMissingError: the best weights differ from ``result.json``'s
            record, or are missing.
        ConfigError: the run saved no best weights (``training.save_best_checkpoint: false``).
    """
    from safetensors.torch import load_model  # the matrix's heavy imports stay out of `oelm --help`

    from oelm.matrix.assemble import build_run_model
    from oelm.matrix.data import prepare_data
    from oelm.models.pretrained import load_tokenizer
    from oelm.method.merge import merge_and_unload

    run_dir, out = Path(run_dir), Path(out)
    folder, record, config = _finished_run(run_dir)
    _check_out(out)
    if config.model.gpt:
        raise OELMError(f"{run_dir} trained oelm's own GPT (model.gpt: {config.model.gpt}), which is not a transformers "
                        "class: no stock from_pretrained loads it without trust_remote_code and shipped code. Use it "
                        f"with oelm instead: oelm.models.build_gpt(...) then safetensors.torch.load_model(model, "
                        f"'{folder.best_weights}')")
    weights = folder.verify_weights(record, f"delete {folder.path} and rerun `oelm run` to train it again")
    if not weights.is_file():
        raise ConfigError(f"{run_dir} has no best weights ({weights}): it ran with training.save_best_checkpoint: false; "
                          "rerun it with the default (true) to export it")
    entry = next((m for m in config.methods if m.name == record.method), None)
    if entry is None:
        raise OELMError(f"{run_dir}: method {record.method!r} is not in the matrix's config.yaml; export the run with "
                        "the config it was trained with")
    config = config.model_copy(update={"init_from": None})  # the best weights hold every tensor already
    tokenizer = load_tokenizer(config.model.pretrained, trust_remote_code=config.model.trust_remote_code)
    log(f"preparing data: {config.task.dataset} (the labels and the model's head) ...")
    data = prepare_data(config, tokenizer)
    model, _, _, _ = build_run_model(config, entry, record.seed, data)
    load_model(model, str(weights))  # strict: every tensor the run saved, no more, no fewer
    if hasattr(model, "peft_config"):  # a LoRA method: fold the adapter into the weights first
        model = model.merge_and_unload()
    model = merge_and_unload(model)
    if data.label_names:
        model.config.id2label = dict(enumerate(data.label_names))
        model.config.label2id = {name: i for i, name in enumerate(data.label_names)}
    _write_folder(out, model, data.tokenizer, record, config, folder)
    log(f"exported {folder.name} to {out}: AutoModelFor{'SequenceClassification' if data.task_type == 'classification' else 'CausalLM'}"
        f".from_pretrained({str(out)!r}) loads it without oelm")
    return out


def _write_folder(out: Path, model: Any, tokenizer: Any, record: RunRecord, config: ExperimentConfig,
                  folder: RunFolder) -> None:
    """Every file into a temporary folder beside ``out``, then one rename (``out`` whole or absent)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    try:
        tmp.chmod(0o777 & ~umask)  # a folder as mkdir makes it (mkdtemp's is private)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        shutil.copyfile(MatrixFolder(folder.path.resolve().parent.parent).config, tmp / "oelm_config.yaml")
        (tmp / "README.md").write_text(model_card(record, config), encoding="utf-8")
        if out.exists():
            out.rmdir()  # empty (checked): the rename takes its place
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fraction(record: RunRecord, value: float | None) -> float | None:
    """A metric as the Hub's model-index and ``evaluate`` write it: accuracy a fraction (0-1), perplexity as is."""
    if value is None:
        return None
    return round(value / 100, 6) if record.metric == "accuracy" else value


def card_metadata(record: RunRecord, config: ExperimentConfig):
    """The model card's metadata as ``huggingface_hub.ModelCardData`` (the Hub's own model card
    fields, written as the card's YAML front matter: ``library_name``, ``pipeline_tag``,
    ``base_model``, ``datasets``, ``metrics``, ``tags``, and ``eval_results``, the ``model-index``
    whose results are the run's validation metric (best: the one the weights were selected on) and
    its test metric; accuracy as a fraction, as ``evaluate`` and the Hub's leaderboards write it)."""
    from huggingface_hub import EvalResult, ModelCardData  # comes with transformers; only when a card is written

    from oelm.data.registry import get_dataset_spec  # the data registry loads only when a card is written

    task_type = "classification" if record.metric == "accuracy" else "language_modeling"
    try:
        spec = get_dataset_spec(config.task.dataset)
    except (KeyError, ValueError, OELMError):
        spec = None
    dataset_id = spec.hub_id if spec is not None and spec.hub_id else config.task.dataset
    results = [EvalResult(task_type=_HF_TASK[task_type][0], task_name=_HF_TASK[task_type][1],
                          dataset_type=dataset_id, dataset_name=config.task.dataset, dataset_split=split,
                          dataset_config=spec.hub_config if spec is not None else None,
                          metric_type=record.metric, metric_value=_fraction(record, value),
                          metric_name=f"{split} {record.metric}")
               for split, value in (("validation", record.best_validation), ("test", record.test)) if value is not None]
    return ModelCardData(library_name="transformers", pipeline_tag=_PIPELINE[task_type],
                         base_model=config.model.pretrained, datasets=[dataset_id], metrics=[record.metric],
                         tags=["oelm", "orthogonal-elm", f"oelm-{record.method}"],
                         model_name=f"{config.name}-{record.name}", eval_results=results)


def model_card(record: RunRecord, config: ExperimentConfig) -> str:
    """``README.md`` of an exported run: :func:`card_metadata` as YAML front matter, then the
    method, the data, the metrics (the run's unit: accuracy %, perplexity), the environment and the
    command that reproduces the run."""
    meta = card_metadata(record, config)
    env, unit = record.environment, "%" if record.metric == "accuracy" else ""
    packages = env.get("packages") or {}
    cuda = env.get("cuda") or {}
    method_config = yaml.safe_dump(record.method_config, sort_keys=False).strip()
    hub = meta.datasets[0]
    splits = ", ".join(f"{k} {v['examples']}" for k, v in record.data.items() if isinstance(v, dict) and "examples" in v)
    lines = [
        "---", meta.to_yaml(), "---", "",
        f"# {config.name}: {record.name}", "",
        f"`{config.model.pretrained}` fine-tuned on `{config.task.dataset}` with oelm's method `{record.method}` "
        f"(seed {record.seed}, learning rate {record.method_learning_rate}), exported by `oelm export`. "
        "The method is merged out: this is a plain transformers model (`AutoModelFor...from_pretrained` loads it; "
        "no oelm import, no `trust_remote_code`).", "",
        "## Method", "",
        "Orthogonal ELM (oelm): the attention query/key projections get a head-wise orthogonal initialization and "
        "are frozen while everything else trains (method `baseline`: nothing frozen). The method's settings:", "",
        "```yaml", method_config, "```", "",
        "## Data", "",
        f"Dataset `{config.task.dataset}`" + (f" (Hugging Face `{hub}`)" if hub != config.task.dataset else "")
        + f"; examples per split: {splits or 'see result.json'}.",
        "",
        "## Metrics", "",
        f"| split | {record.metric} |", "|---|---|",
        f"| validation (best, step {record.best_step}: these weights) | {record.best_validation:.4f}{unit} |",
        *([f"| test (once, with these weights) | {record.test:.4f}{unit} |"] if record.test is not None else []),
        "", f"Optimizer steps: {record.steps}. Model selection used the validation split only.", "",
        "## Environment", "",
        f"- oelm {packages.get('oelm', env.get('oelm_version', '?'))}, torch {packages.get('torch', '?')}, "
        f"transformers {packages.get('transformers', '?')}, Python {env.get('python', '?')}",
        f"- device: {record.device or '?'}" + (f" ({cuda.get('name')})" if cuda.get("name") else "")
        + f", CPU {env.get('cpu_model', '?')}",
        f"- training time: {record.total_seconds:.1f} s" if record.total_seconds is not None else "- training time: ?",
        "", "## Reproduce", "",
        "```bash",
        "pip install oelm",
        f"oelm run oelm_config.yaml --output-dir reproduce --only {record.name}",
        "```", "",
        "`oelm_config.yaml` is the matrix's config, beside this card. Local data is read from `--data-dir` / "
        "`OELM_DATA_DIR`.", "",
    ]
    return "\n".join(lines)
