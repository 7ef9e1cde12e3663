"""Config values that used to pass validation and then train something else than asked (issue 26,
item 4): a method's own training.learning_rate, non-finite floats, booleans taken for numbers,
seeds numpy cannot take, Adam betas outside [0, 1), an init_from that is not safetensors, empty
paths, list-index overrides. Each is used as written or refused with one line naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file

from oelm.config import config_from_dict, load_config
from oelm.errors import ConfigError

TINY_GPT = {"gpt": "gpt-tiny", "gpt_overrides": {"num_layers": 1, "hidden_size": 32, "num_heads": 2}}


def _config(**changes) -> dict:
    base = {
        "name": "bad-values",
        "task": {"dataset": "sst2", "train_samples": 64, "validation_samples": 32, "max_length": 32},
        "model": dict(TINY_GPT),
        "methods": [{"name": "baseline"}, {"name": "oelm_freeze"}],
        "training": {"max_steps": 2, "batch_size": 8},
    }
    base.update(changes)
    return base


def _yaml_file(tmp_path: Path, text: str) -> Path:
    """A config file whose ``training``/top-level lines come from ``text`` (YAML, so `.inf`,
    `true` and friends are read exactly as a user's file would be)."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_config(), sort_keys=False) + text)
    return path


def _refused(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    lines = str(info.value).splitlines()
    assert len(lines) == 2, lines  # "invalid experiment config ...:" and one line for the one bad value
    return lines[1]


# --- a method's own learning rate ---------------------------------------------------------------


def test_method_training_learning_rate_is_its_candidate():
    config = config_from_dict(_config(
        methods=[{"name": "baseline", "training": {"learning_rate": 5e-3}}, {"name": "oelm_freeze"}],
        learning_rates=[1e-4, 3e-4]))
    rates = {m.name: config.learning_rate_candidates(m) for m in config.methods}
    assert rates == {"baseline": [5e-3], "oelm_freeze": [1e-4, 3e-4]}
    assert config.training_for(config.methods[0]).learning_rate == 5e-3


def test_method_rate_given_twice_is_refused():
    line = _refused(_config(methods=[{"name": "baseline", "learning_rate": 1e-3, "training": {"learning_rate": 5e-3}}]))
    assert "methods.0" in line and "learning_rate and training.learning_rate" in line and "keep one" in line


def test_run_trains_at_the_methods_rate_and_records_the_batch_it_ran(tmp_path, data_dir):
    """End to end on real SST-2: the method's training.learning_rate is the rate result.json and
    every metrics.jsonl line show (constant schedule, no warmup), and a batch_size above the 12
    training examples is recorded as the 12 that ran."""
    from oelm.cli import main

    cfg = tmp_path / "lr.yaml"
    cfg.write_text(yaml.safe_dump(_config(
        name="method-lr",
        task={"dataset": "sst2", "tokenizer": "bpe-300", "train_samples": 12, "validation_samples": 16, "max_length": 24},
        methods=[{"name": "baseline", "training": {"learning_rate": 5e-3}}],
        seeds=[0],
        training={"max_steps": 2, "batch_size": 64, "schedule": "constant", "warmup_steps": 0, "eval_every": 2,
                  "log_every": 1, "timing_warmup_passes": 0, "progress_bar": False, "tensorboard": False},
    ), sort_keys=False))
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--output-dir", str(out)]) == 0
    run = out / "runs" / "baseline-seed0"
    result = json.loads((run / "result.json").read_text())
    assert result["learning_rate"] == 5e-3 and result["method_config"]["learning_rate"] == 5e-3
    logged = {json.loads(line).get("learning_rate") for line in (run / "metrics.jsonl").read_text().splitlines()}
    assert logged - {None} == {5e-3}
    assert result["budget"]["batch_size"] == 12 and result["budget"]["batch_size_configured"] == 64
    assert result["budget"]["global_batch_size"] == 12


# --- non-finite floats, booleans, ranges -------------------------------------------------------


@pytest.mark.parametrize("text, field", [
    ("learning_rates: [1.0e-3, .inf]\n", "learning_rates.1"),
    ("reference: {baseline: .nan}\n", "reference.baseline"),
])
def test_non_finite_top_level_values_are_refused(tmp_path, text, field):
    with pytest.raises(ConfigError) as info:
        load_config(_yaml_file(tmp_path, text))
    assert f"{field}: Input should be a finite number" in str(info.value)


@pytest.mark.parametrize("override, field", [
    ("training.learning_rate=.inf", "training.learning_rate"),
    ("training.learning_rate=.nan", "training.learning_rate"),
    ("training.weight_decay=.inf", "training.weight_decay"),
    ("training.epochs=.inf", "training.epochs"),
    ("training.max_grad_norm=.inf", "training.max_grad_norm"),
    ("training.early_stopping_min_delta=.inf", "training.early_stopping_min_delta"),
    ("methods.0.learning_rate=.inf", "methods.0.learning_rate"),
    ("methods.1.learning_rates=[.inf, 1.0e-3]", "methods.1.learning_rates.0"),
    ("methods.1.normal_std=.inf", "methods.1.normal_std"),
])
def test_non_finite_rates_and_ratios_are_refused(tmp_path, override, field):
    with pytest.raises(ConfigError) as info:
        load_config(_yaml_file(tmp_path, ""), [override])
    lines = str(info.value).splitlines()
    assert len(lines) == 2 and lines[1].startswith(f"  - {field}: ") and "finite number" in lines[1]


def test_a_methods_training_rate_must_be_finite_too():
    line = _refused(_config(methods=[{"name": "baseline", "training": {"learning_rate": float("inf")}}]))
    assert "methods[baseline].training.learning_rate" in line and "finite" in line


@pytest.mark.parametrize("override, field", [
    ("seeds=[true]", "seeds.0"),
    ("training.max_steps=true", "training.max_steps"),
    ("training.batch_size=true", "training.batch_size"),
    ("training.epochs=true", "training.epochs"),
    ("training.eval_every=false", "training.eval_every"),
    ("task.max_length=true", "task.max_length"),
    ("training.adam_betas=[0.9, true]", "training.adam_betas.1"),
])
def test_booleans_are_not_numbers(tmp_path, override, field):
    with pytest.raises(ConfigError) as info:
        load_config(_yaml_file(tmp_path, ""), [override])
    lines = str(info.value).splitlines()
    assert len(lines) == 2 and lines[1].startswith(f"  - {field}: expected a number, not the boolean")


@pytest.mark.parametrize("override", ["seeds=[1.5]", "seeds=['1']", "training.max_steps=2.5"])
def test_integers_are_not_floats_or_strings(tmp_path, override):
    with pytest.raises(ConfigError, match="Input should be a valid integer"):
        load_config(_yaml_file(tmp_path, ""), [override])


@pytest.mark.parametrize("override, bound", [
    ("seeds=[-1]", "greater than or equal to 0"),
    (f"seeds=[{2**32}]", f"less than {2**32}"),
    ("task.subset_seed=-3", "greater than or equal to 0"),
    ("sweep_seeds=[-1]", "greater than or equal to 0"),
])
def test_seeds_numpy_cannot_take_are_refused(tmp_path, override, bound):
    with pytest.raises(ConfigError) as info:
        load_config(_yaml_file(tmp_path, ""), [override])
    assert bound in str(info.value)


def test_largest_seed_numpy_takes_is_accepted():
    assert config_from_dict(_config(seeds=[0, 2**32 - 1])).seeds == [0, 2**32 - 1]


@pytest.mark.parametrize("betas, index, bound", [
    ([1.5, 0.999], 0, "less than 1"), ([0.9, 1.0], 1, "less than 1"), ([0.9, -0.1], 1, "greater than or equal to 0"),
])
def test_adam_betas_outside_zero_one_are_refused(betas, index, bound):
    line = _refused(_config(training={"max_steps": 2, "adam_betas": betas}))
    assert line.startswith(f"  - training.adam_betas.{index}: ") and bound in line


def test_adam_beta_zero_is_accepted():
    assert config_from_dict(_config(training={"adam_betas": [0.0, 0.99]})).training.adam_betas == (0.0, 0.99)


# --- paths ------------------------------------------------------------------------------------------


def test_init_from_a_file_that_is_not_safetensors_is_refused(tmp_path):
    notes = tmp_path / "weights.txt"
    notes.write_text("not weights, but long enough to have eight bytes\n")
    line = _refused(_config(init_from=str(notes)))
    assert str(notes) in line and "safetensors header" in line


def test_init_from_template_names_the_bad_file_of_one_method(tmp_path):
    good = {"w": torch.zeros(2)}
    save_file(good, str(tmp_path / "baseline.safetensors"))
    (tmp_path / "oelm_freeze.safetensors").write_bytes(b"\x00" * 64)  # truncated / zeroed download
    line = _refused(_config(init_from=str(tmp_path / "{method}.safetensors")))
    assert str(tmp_path / "oelm_freeze.safetensors") in line


def test_init_from_a_real_safetensors_file_is_accepted(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.ones(3, 3)}, str(path))
    assert config_from_dict(_config(init_from=str(path))).init_from == str(path)


@pytest.mark.parametrize("changes, field", [
    ({"output_dir": ""}, "output_dir"),
    ({"init_from": "  "}, "init_from"),
    ({"model": {"pretrained": ""}}, "model.pretrained"),
    ({"task": {"dataset": "sst2", "tokenizer": ""}}, "task.tokenizer"),
    ({"task": {"dataset": "sst2", "data_dir": ""}}, "task.data_dir"),
])
def test_empty_paths_are_refused_not_taken_for_here(changes, field):
    line = _refused(_config(**changes))
    assert line.startswith(f"  - {field}: is empty")


# --- overrides of list entries -----------------------------------------------------------------------


def test_list_index_override_sets_that_entry(tmp_path):
    path = _yaml_file(tmp_path, "")
    config = load_config(path, ["methods.1.learning_rate=2.0e-3", "methods.baseline.freeze=false"])
    assert [config.learning_rate_candidates(m) for m in config.methods] == [[1e-4], [2e-3]]
    assert config.methods[0].freeze is False


def test_list_index_override_gets_the_fields_own_message(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(_yaml_file(tmp_path, ""), ["methods.0.learning_rate=-1"])
    assert "methods.0.learning_rate: Input should be greater than 0 (got -1)" in str(info.value)
    assert "should be a valid list" not in str(info.value)


@pytest.mark.parametrize("override, message", [
    ("methods.2.learning_rate=1", "override methods.2: methods has 2 entries, so the index must be 0 to 1"),
    ("methods.adam.learning_rate=1", "give an index 0 to 1 or a name (baseline, oelm_freeze)"),
    ("seeds.0=4", "override seeds.0: seeds is not a list in the config file"),
])
def test_bad_list_index_override_says_what_exists(tmp_path, override, message):
    with pytest.raises(ConfigError) as info:
        load_config(_yaml_file(tmp_path, ""), [override])
    assert message in str(info.value) and len(str(info.value).splitlines()) == 1


def test_union_field_errors_are_one_line_without_pydantic_branch_names():
    line = _refused(_config(methods=[{"name": "baseline", "normal_std": "wide"}]))
    assert line.startswith("  - methods.0.normal_std: ") and "'matched'" in line and "function-" not in line


def test_init_from_file_damaged_after_validation_is_refused_when_the_run_starts(tmp_path):
    from oelm.matrix.assemble import resolve_init_from

    path = tmp_path / "model.safetensors"
    save_file({"w": torch.ones(64, 64)}, str(path))
    config = config_from_dict(_config(init_from=str(path)))
    assert resolve_init_from(config, "baseline", 0) == path
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 100)  # e.g. a copy still being written
    with pytest.raises(ConfigError, match=r"init_from: the file .*model\.safetensors is damaged: its header describes"):
        resolve_init_from(config, "baseline", 0)


# --- dataset and splits, checked when the config is read -------------------------------------------


@pytest.mark.parametrize("task, line", [
    ({"dataset": "sst-2"}, "  - task.dataset: unknown dataset 'sst-2'; registered datasets: ag_news,"),
    ({"dataset": "sst2", "validation_split": "dev"}, "  - task.validation_split: dataset 'sst2' has no split 'dev'; available: train, validation, test"),
    ({"dataset": "sst2", "test_split": "test_labeled"}, "  - task.test_split: dataset 'sst2' has no split 'test_labeled'"),
])
def test_unknown_dataset_or_split_is_refused_when_the_config_is_read(task, line):
    assert _refused(_config(task=task)).startswith(line)


def test_dataset_with_a_held_out_validation_split_accepts_it():
    config = config_from_dict(_config(task={"dataset": "ag_news", "validation_split": "validation"}))
    assert config.task.validation_split == "validation"


# --- absurd sizes ----------------------------------------------------------------------------------


def test_a_model_too_large_for_this_machine_is_refused_before_allocating():
    """hidden_size 2**20 is 4.4e12 parameters: torch's allocator traceback before; now one line
    with the parameter count, the bytes training needs and what the machine has (shapes counted
    on the meta device, so nothing is allocated)."""
    from oelm.matrix.model import build_model

    config = config_from_dict(_config(model={"gpt": "gpt-tiny", "gpt_overrides": {"num_layers": 1, "hidden_size": 2**20, "num_heads": 2}}))
    with pytest.raises(ConfigError) as info:
        build_model(config, None, task_type="classification", num_labels=2)
    msg = str(info.value)
    assert "\n" not in msg and "hidden_size': 1048576" in msg and "parameters: training needs at least" in msg
    assert "but this machine has" in msg and "lower hidden_size" in msg


def test_a_model_that_fits_is_built_with_the_same_weights_as_without_the_size_check():
    from oelm.matrix.model import build_model
    from oelm.models.gpt import build_gpt

    config = config_from_dict(_config())
    torch.manual_seed(3)
    model, _ = build_model(config, None, task_type="classification", num_labels=2)
    torch.manual_seed(3)
    direct = build_gpt("gpt-tiny", "sequence_classification", num_layers=1, hidden_size=32, num_heads=2, num_labels=2,
                       context_length=32)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), direct.state_dict().values()))


# --- silently dropped or misattributed keys ------------------------------------------------------


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path):
    """PyYAML keeps the last of two `training:` blocks: the first one's max_steps vanished."""
    path = tmp_path / "twice.yaml"
    path.write_text(yaml.safe_dump(_config(), sort_keys=False) + "training: {batch_size: 16}\n")
    first = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if line.startswith("training:"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert "\n" not in msg and f"config file {path} is not valid YAML at line" in msg
    assert f"key 'training' is given twice in one mapping (first on line {first}); keep one" in msg


def test_an_unknown_base_names_the_base_not_the_method():
    line = _refused(_config(methods=[{"name": "baseline"}, {"name": "my_variant", "base": "oelm_froze"}]))
    assert line.startswith("  - methods.1: method 'my_variant': base 'oelm_froze' is not a named method (baseline,")


def test_reference_numbers_for_methods_not_in_the_config_are_refused():
    line = _refused(_config(reference={"baseline": 4.27, "oelm_frozen": 4.69}))
    assert "reference names ['oelm_frozen'], which are not methods of this config (baseline, oelm_freeze)" in line


@pytest.mark.parametrize("tokenizer, message", [
    ("gpt3", "unknown tokenizer 'gpt3'; use 'gpt2', 'bpe-<vocab_size>'"),
    ("bpe-abc", "unknown tokenizer 'bpe-abc'"),
    ("bpe-100", "'bpe-100': a byte-level BPE needs vocab_size >= 257"),
])
def test_tokenizer_names_are_checked_when_the_config_is_read(tokenizer, message):
    line = _refused(_config(task={"dataset": "sst2", "tokenizer": tokenizer}))
    assert line.startswith("  - task.tokenizer: ") and message in line


def test_tokenizer_paths_are_left_for_when_they_are_loaded():
    # a pretraining run may write the file later (stage 2 of a pretrain-then-fine-tune pair)
    config = config_from_dict(_config(task={"dataset": "sst2", "tokenizer": "../outputs/pre/tokenizer.json"}))
    assert config.task.tokenizer == "../outputs/pre/tokenizer.json"


def test_test_samples_without_a_test_split_is_refused():
    line = _refused(_config(task={"dataset": "sst2", "test_samples": 100}))
    assert "task.test_samples=100 is set but task.test_split is not" in line


def test_more_samples_than_the_split_holds_says_all_are_used(tmp_path, data_dir):
    """Real SST-2 validation sentences as the train split of a small copy of the data dir (and 64
    training sentences as its validation split: one file as two splits is refused, issue 46)."""
    import shutil

    import pandas as pd

    from oelm.matrix.data import prepare_data

    (tmp_path / "sst2").mkdir()
    shutil.copyfile(data_dir / "sst2" / "validation.parquet", tmp_path / "sst2" / "train.parquet")
    pd.read_parquet(data_dir / "sst2" / "train.parquet").iloc[:64].to_parquet(tmp_path / "sst2" / "validation.parquet")
    config = config_from_dict(_config(task={"dataset": "sst2", "data_dir": str(tmp_path), "tokenizer": "bpe-300",
                                            "train_samples": 5000, "validation_samples": 16, "max_length": 16}))
    with pytest.warns(UserWarning, match=r"task\.train_samples=5000 is more than the 872 items of sst2/train: all 872 are used"):
        data = prepare_data(config)
    assert data.summary["train"]["examples"] == 872 and data.summary["validation"]["examples"] == 16


def test_the_duplicate_key_loader_is_still_a_safe_loader(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.yaml"
    path.write_text(f"name: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(path)
    assert not marker.exists()


def test_a_gpt_vocab_smaller_than_the_tokenizer_is_refused(data_dir):
    """gpt_overrides.vocab_size 100 with GPT-2's real 50,257-id tokenizer: IndexError at step 1 before."""
    from types import SimpleNamespace

    from oelm.data.lm import get_lm_tokenizer
    from oelm.matrix.model import build_model

    tokenizer = get_lm_tokenizer("gpt2", None, None, data_dir=str(data_dir))
    config = config_from_dict(_config(model={"gpt": "gpt-tiny", "gpt_overrides": {**TINY_GPT["gpt_overrides"], "vocab_size": 100}}))
    data = SimpleNamespace(tokenizer=tokenizer, task_type="classification", num_labels=2)
    with pytest.raises(ConfigError) as info:
        build_model(config, data)
    assert "model.gpt_overrides.vocab_size=100 is smaller than the tokenizer (50,257 ids, task.tokenizer='gpt2')" in str(info.value)


# --- giant and hostile values (issue 37, item 7) -------------------------------------------------


@pytest.mark.parametrize("override, field", [
    ({"training": {"max_steps": 2, "num_workers": 10**9}}, "training.num_workers"),
    ({"executor": {"cpus_per_run": 1e12}}, "executor.cpus_per_run"),
    ({"executor": {"name": "ray", "gpus_per_run": 1e9}}, "executor.gpus_per_run"),
    ({"executor": {"name": "ray", "max_retries": 10**9}}, "executor.max_retries"),
])
def test_giant_worker_thread_and_retry_counts_are_refused_when_the_config_is_read(override, field):
    line = _refused(_config(**override))
    assert line.strip().startswith(f"- {field}: ") and "less than or equal to" in line, line


def _run_refused(capsys, tmp_path: Path, *args: str) -> str:
    """``oelm run`` refused with exit status 2 and one line, before the output folder exists."""
    from oelm.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(_config(), sort_keys=False))
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--output-dir", str(out), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("oelm: error: "), err
    assert not out.exists()
    return err[0]


def test_more_loader_workers_than_cores_is_refused_before_any_data(capsys, tmp_path):
    from oelm.matrix.executors import cpu_cores

    cores = cpu_cores()
    line = _run_refused(capsys, tmp_path, f"training.num_workers={cores + 1}")
    assert f"training.num_workers={cores + 1}" in line and f"use at most {cores}, or \"auto\"" in line


def test_more_threads_per_run_than_cores_is_refused_before_any_data(capsys, tmp_path):
    from oelm.matrix.executors import cpu_cores

    cores = cpu_cores()
    line = _run_refused(capsys, tmp_path, "--cpus-per-run", str(cores * 4))
    assert f"--cpus-per-run {cores * 4}" in line and f"use --cpus-per-run {cores} or less" in line


# --- the research methods (issue 36) -------------------------------------------------------------


@pytest.mark.parametrize("model, methods, expected", [
    ({"pretrained": "sentence-transformers/all-MiniLM-L6-v2"}, [{"name": "fixed_attention"}],
     "method 'fixed_attention': fixed_attention replaces the attention scores inside oelm's own GPT"),
    ({"pretrained": "sentence-transformers/all-MiniLM-L6-v2"}, [{"name": "mimetic_vo_trained"}],
     "method 'mimetic_vo_trained': mimetic_value_output sets the value/output projections of oelm's own GPT"),
    (TINY_GPT, [{"name": "m", "base": "oelm_freeze", "mimetic_value_output": True}],
     "true only with init='mimetic'"),
    (TINY_GPT, [{"name": "reservoir", "reservoir_layers": [0, 3]}], "reservoir_layers [0, 3] names layer(s) [3]"),
    (TINY_GPT, [{"name": "reservoir", "reservoir_layers": "every_other"}], "reservoir_layers"),
    (TINY_GPT, [{"name": "m", "base": "oelm_freeze", "init": "mimetic", "targets": ["key"]}],
     "init='mimetic' sets query and key together"),
    (TINY_GPT, [{"name": "m", "base": "oelm_freeze", "init": "mimetc"}], "'orthogonalize_rescaled', 'polar', 'random_orthogonal'"),
    (TINY_GPT, [{"name": "oelm_temperature", "head_temperature": -1}], "head_temperature"),
    (TINY_GPT, [{"name": "oelm_temperature", "head_temperature": "norm"}], "head_temperature"),
    (TINY_GPT, [{"name": "t", "base": "oelm_temperature", "targets": ["query"]}],
     "head_temperature scales each query head's logits"),
])
def test_research_method_misuse_is_refused_in_one_line(model, methods, expected):
    assert expected in _refused(_config(model=model, methods=[{"name": "baseline"}, *methods]))


@pytest.mark.parametrize("key", ["none", "int", "str", "bool", "float"])
def test_an_unknown_key_named_like_a_type_is_named(key):
    """Pydantic labels union branches `none`, `int`, ... in error locations, and those labels are
    dropped from the line; a user's own key of that name is not a label (found by
    tests/test_properties.py: {"none": None} raised IndexError instead of ConfigError)."""
    assert _refused(_config(**{key: None})).startswith(f"  - {key}: unknown key; valid keys: name,")
    task = _config()["task"] | {key: 1}
    assert _refused(_config(task=task)).startswith(f"  - task.{key}: unknown key; valid keys: dataset,")
