"""Experiment configs: validation errors name the key; every shipped config builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from oelm.config import ExperimentConfig, load_config, parse_overrides
from oelm.errors import ConfigError

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").rglob("*.yaml"))

MINIMAL = """
name: t
task: {dataset: sst2}
model: {pretrained: sentence-transformers/all-MiniLM-L6-v2}
methods: [{name: baseline}]
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_shipped_config_validates(path):
    config = load_config(path)
    assert config.methods and config.seeds
    names = [m.name for m in config.methods]
    assert "baseline" in names
    for m in config.methods:
        m.oelm_config()  # each method resolves to an OELMConfig


def test_shipped_configs_include_the_required_ones():
    root = Path(__file__).resolve().parents[1] / "configs"
    names = {str(p.relative_to(root)) for p in CONFIGS}
    assert {"quickstart.yaml", "tinystories-tiny.yaml", "original/phase1_bert/sst2.yaml", "original/phase1_bert/mnli.yaml",
            "original/phase1_bert/xnli_en.yaml", "original/phase2_gpt_lm/tinystories.yaml"} <= names


def test_original_configs_carry_the_original_settings():
    root = Path(__file__).resolve().parents[1] / "configs" / "original"
    for t in ("sst2", "mnli", "xnli_en"):
        c = load_config(root / "phase1_bert" / f"{t}.yaml")
        assert c.training.batch_size == 32 and c.training.epochs == 3 and c.training.warmup_ratio == 0.1
        assert c.task.max_length == 128
        lrs = {m.name: c.learning_rate(m) for m in c.methods}
        assert lrs["baseline"] == 2e-5 and lrs["oelm_freeze"] == 1e-4
    g = load_config(root / "phase2_gpt_lm" / "tinystories.yaml")
    assert g.model.gpt == "gpt-medium-512" and g.task.block_size == 512 and g.training.batch_size == 8
    assert g.training.warmup_steps == 1000 and g.training.schedule == "cosine"
    assert {m.name: g.learning_rate(m) for m in g.methods}["oelm_freeze"] == 1e-3
    assert g.reference == {"baseline": 4.27, "oelm_freeze": 4.69, "oelm_random": 4.97}


def test_unknown_key_suggests_the_closest(tmp_path):
    p = write(tmp_path, MINIMAL + "training: {lerning_rate: 0.1}\n")
    with pytest.raises(ConfigError) as err:
        load_config(p)
    assert "training.lerning_rate" in str(err.value) and "'learning_rate'" in str(err.value)


def test_wrong_type_and_range_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"training\.batch_size"):
        load_config(write(tmp_path, MINIMAL + "training: {batch_size: many}\n"))
    with pytest.raises(ConfigError, match=r"training\.learning_rate"):
        load_config(write(tmp_path, MINIMAL + "training: {learning_rate: -1}\n"))


@pytest.mark.parametrize("value", [0, -2])
def test_early_stopping_patience_must_be_positive_or_null(tmp_path, value):
    with pytest.raises(ConfigError, match=r"training\.early_stopping_patience: Input should be greater than 0"):
        load_config(write(tmp_path, MINIMAL + f"training: {{early_stopping_patience: {value}}}\n"))
    c = load_config(write(tmp_path, MINIMAL + "training: {early_stopping_patience: null}\n"))
    assert c.training.early_stopping_patience is None


def test_early_stopping_min_delta_must_not_be_negative(tmp_path):
    with pytest.raises(ConfigError, match=r"training\.early_stopping_min_delta: Input should be greater than or equal to 0"):
        load_config(write(tmp_path, MINIMAL + "training: {early_stopping_patience: 3, early_stopping_min_delta: -0.1}\n"))
    c = load_config(write(tmp_path, MINIMAL + "training: {early_stopping_patience: 3, early_stopping_min_delta: 0.5}\n"))
    assert c.training.early_stopping_patience == 3 and c.training.early_stopping_min_delta == 0.5


def test_malformed_yaml_reports_line(tmp_path):
    with pytest.raises(ConfigError, match=r"not valid YAML at line \d+"):
        load_config(write(tmp_path, "name: t\ntask: {dataset: sst2\nmodel: x\n"))


def test_missing_file_and_empty_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="empty"):
        load_config(write(tmp_path, ""))


def test_missing_required_and_model_source(tmp_path):
    with pytest.raises(ConfigError, match=r"task: required key is missing"):
        load_config(write(tmp_path, "name: t\nmodel: {gpt: gpt-tiny}\nmethods: [{name: baseline}]\n"))
    with pytest.raises(ConfigError, match="exactly one of model.pretrained"):
        load_config(write(tmp_path, MINIMAL.replace("{pretrained: sentence-transformers/all-MiniLM-L6-v2}", "{}")))


def test_unknown_method_and_custom_method(tmp_path):
    with pytest.raises(ConfigError, match="not a named method"):
        load_config(write(tmp_path, MINIMAL.replace("baseline", "oelm_frezee")))
    text = MINIMAL.replace("[{name: baseline}]", "[{name: baseline}, {name: wide_random, base: oelm_random, normal_std: matched}]")
    c = load_config(write(tmp_path, text))
    cfg = c.methods[1].oelm_config()
    assert cfg.method == "wide_random" and cfg.init == "normal" and cfg.normal_std == "matched"


def test_split_fused_is_a_method_setting_that_reaches_apply_oelm(tmp_path):
    """`split_fused: false` in a method entry keeps GPT-2's fused c_attn in baseline (the default
    splits it into output-identical q/k/v Linear layers), and it is part of the config fingerprint."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.pytorch_utils import Conv1D

    from oelm.matrix.output import config_fingerprint as _config_fingerprint
    from oelm.method import apply_oelm

    text = MINIMAL.replace("[{name: baseline}]", "[{name: baseline, split_fused: false}, {name: oelm_freeze}]")
    c = load_config(write(tmp_path, text))
    fused, split = c.methods[0].oelm_config(), c.methods[1].oelm_config()
    assert fused.split_fused is False and split.split_fused is True
    tiny = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=16)
    kept = GPT2LMHeadModel(tiny)
    apply_oelm(kept, fused, seed=0)
    assert isinstance(kept.transformer.h[0].attn.c_attn, Conv1D)
    default = GPT2LMHeadModel(tiny)
    apply_oelm(default, c.methods[0].oelm_config().replace(split_fused=True), seed=0)
    assert not isinstance(default.transformer.h[0].attn.c_attn, Conv1D)
    plain = load_config(write(tmp_path, MINIMAL.replace("[{name: baseline}]", "[{name: baseline}, {name: oelm_freeze}]")))
    assert _config_fingerprint(plain)["methods"]["baseline"] != _config_fingerprint(c)["methods"]["baseline"]
    with pytest.raises(ConfigError, match="split_fused"):
        load_config(write(tmp_path, MINIMAL.replace("[{name: baseline}]", "[{name: baseline, split_fused: maybe}]")))


def test_overrides(tmp_path):
    c = load_config(write(tmp_path, MINIMAL), ["training.epochs=2.5", "seeds=[0,1,2]", "task.train_samples=100"])
    assert c.training.epochs == 2.5 and c.seeds == [0, 1, 2] and c.task.train_samples == 100
    assert parse_overrides(["a.b=1", "a.c=x"]) == {"a": {"b": 1, "c": "x"}}
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["training.epochs"])
    with pytest.raises(ConfigError, match="training.epoch"):
        load_config(write(tmp_path, MINIMAL), ["training.epoch=2"])


def test_duplicate_methods_rejected(tmp_path):
    with pytest.raises(ConfigError, match="duplicate"):
        load_config(write(tmp_path, MINIMAL.replace("[{name: baseline}]", "[{name: baseline}, {name: baseline}]")))


def test_schema_defaults():
    c = ExperimentConfig.model_validate({"name": "x", "task": {"dataset": "sst2"}, "model": {"gpt": "gpt-tiny"}, "methods": [{"name": "baseline"}]})
    assert c.training.max_grad_norm == 1.0 and c.training.weight_decay == 0.01 and c.seeds == [0, 1, 2]
    assert c.training.early_stopping_patience is None and c.training.early_stopping_min_delta == 0.0  # never stop early
    assert c.sweep_seed_list() == [0] and c.learning_rate_candidates(c.methods[0]) == [c.training.learning_rate]


@pytest.mark.parametrize("name", ["sst2", "mnli", "xnli_en"])
def test_original_bert_configs_build_on_the_bert_base_architecture(name):
    """bert-base-uncased cannot be downloaded here; BertConfig() is its architecture (vocab 30,522,
    hidden 768, 12 layers, 12 heads), so each config's methods are applied to that."""
    from transformers import BertConfig, BertForSequenceClassification

    from oelm.data import get_dataset_spec
    from oelm.method import apply_oelm

    config = load_config(Path(__file__).resolve().parents[1] / "configs" / "original" / "phase1_bert" / f"{name}.yaml")
    num_labels = len(get_dataset_spec(config.task.dataset).label_names)
    for entry in config.methods:
        model = BertForSequenceClassification(BertConfig(num_labels=num_labels))
        report = apply_oelm(model, entry.oelm_config(), seed=0)
        if entry.name == "baseline":
            assert report.frozen == 0
        else:
            assert report.frozen == 12 * 2 * (768 * 768 + 768)
            if num_labels == 3:  # the original project's "87.1% trainable"
                assert round(report.trainable_percent, 1) == 87.1


def test_original_gpt_config_builds():
    from oelm.matrix.model import build_model
    from oelm.method import apply_oelm

    config = load_config(Path(__file__).resolve().parents[1] / "configs" / "original" / "phase2_gpt_lm" / "tinystories.yaml")
    model, _ = build_model(config, None, task_type="language_modeling")
    assert (model.config.hidden_size, model.config.num_layers, model.config.num_heads, model.config.context_length) == (512, 6, 8, 512)
    report = apply_oelm(model, config.methods[1].oelm_config(), seed=0)
    assert report.frozen == 6 * 2 * (512 * 512 + 512)


def test_learning_rate_candidates_and_sweep_seeds(tmp_path):
    text = MINIMAL.replace("[{name: baseline}]", "[{name: baseline, learning_rates: [1.0e-4, 3.0e-4]}, {name: oelm_freeze, learning_rate: 2.0e-4}, {name: oelm_random}]")
    c = load_config(write(tmp_path, text + "learning_rates: [5.0e-4, 1.0e-3]\nsweep_seeds: [0, 1]\n"))
    assert [c.learning_rate_candidates(m) for m in c.methods] == [[1e-4, 3e-4], [2e-4], [5e-4, 1e-3]]
    assert c.learning_rate(c.methods[0]) == 1e-4 and c.sweep_seed_list() == [0, 1]
    with pytest.raises(ConfigError, match="sweep_seeds"):
        load_config(write(tmp_path, MINIMAL + "seeds: [0]\nsweep_seeds: [3]\n"))
    with pytest.raises(ConfigError, match="duplicates"):
        load_config(write(tmp_path, MINIMAL.replace("[{name: baseline}]", "[{name: baseline, learning_rates: [1.0e-4, 1.0e-4]}]")))
    with pytest.raises(ConfigError, match="learning_rates"):
        load_config(write(tmp_path, MINIMAL.replace("[{name: baseline}]", "[{name: baseline, learning_rates: [-1.0]}]")))


def test_method_training_overrides_are_validated(tmp_path):
    text = MINIMAL.replace("[{name: baseline}]", "[{name: baseline}, {name: oelm_freeze, training: {max_steps: 7}}]")
    c = load_config(write(tmp_path, text + "training: {max_steps: 5}\n"))
    assert c.training_for(c.methods[0]).max_steps == 5 and c.training_for(c.methods[1]).max_steps == 7
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(write(tmp_path, MINIMAL.replace("[{name: baseline}]", "[{name: baseline, training: {max_stepz: 3}}]")))
    with pytest.raises(ConfigError, match=r"methods\[baseline\]\.training\.max_steps"):
        load_config(write(tmp_path, MINIMAL.replace("[{name: baseline}]", "[{name: baseline, training: {max_steps: -3}}]")))


def test_sweep_with_test_split_needs_the_best_checkpoint(tmp_path):
    text = MINIMAL.replace("{dataset: sst2}", "{dataset: sst2, test_split: test}").replace(
        "[{name: baseline}]", "[{name: baseline, learning_rates: [1.0e-4, 3.0e-4]}]")
    with pytest.raises(ConfigError, match="save_best_checkpoint"):
        load_config(write(tmp_path, text + "training: {save_best_checkpoint: false}\n"))


def test_an_error_names_the_override_that_caused_it_not_the_shipped_file(tmp_path):
    """A typo on the command line of a shipped config: the error says which ``key=value`` it was
    and names the config as ``oelm run`` takes it, not by its path inside site-packages."""
    from oelm.configs import resolve_config

    path = resolve_config("quickstart")
    with pytest.raises(ConfigError) as info:
        load_config(path, ["training.epochs=abc", "methods.oelm_freeze.learning_rate=-1"])
    text = str(info.value)
    assert str(path) not in text and "site-packages" not in text
    header, *lines = text.splitlines()
    assert header == "invalid command-line overrides for experiment config quickstart (shipped with oelm):"
    assert len(lines) == 2
    assert any("training.epochs: " in x and x.endswith("[command line: training.epochs=abc]") for x in lines)
    assert any("methods.1.learning_rate" in x and x.endswith("[command line: methods.oelm_freeze.learning_rate=-1]")
               for x in lines)
    with pytest.raises(ConfigError, match=r"seeds has duplicates.*\[command line: seeds=\[0,0\]\]"):
        load_config(path, ["seeds=[0,0]"])
    # an error in the file itself is the file's: its path, no override blamed
    bad = write(tmp_path, MINIMAL + "training: {epoch: 2}\n")
    with pytest.raises(ConfigError) as info:
        load_config(bad, ["training.batch_size=8"])
    assert str(info.value).startswith(f"invalid experiment config {bad}:") and "command line" not in str(info.value)
    # a cross-key check blames the override whose key it names
    with pytest.raises(ConfigError, match=r"test_split is not.*\[command line: task.test_samples=5\]"):
        load_config(write(tmp_path, MINIMAL), ["task.test_samples=5"])


def test_research_methods_from_yaml_reach_apply_oelm(tmp_path):
    """`methods: - name: oelm_rescaled`, `init: mimetic` and reservoir layers are usable from a config."""
    from oelm.method import apply_oelm
    from oelm.models.gpt import build_gpt

    text = MINIMAL.replace("{pretrained: sentence-transformers/all-MiniLM-L6-v2}", "{gpt: gpt-tiny}").replace(
        "[{name: baseline}]", "[{name: baseline}, {name: oelm_rescaled}, {name: fixed_attention}, "
        "{name: mim, base: oelm_freeze, init: mimetic}, {name: res, base: reservoir, reservoir_layers: [0]}]")
    c = load_config(write(tmp_path, text))
    configs = {m.name: m.oelm_config() for m in c.methods}
    assert configs["oelm_rescaled"].init == "orthogonalize_rescaled" and configs["fixed_attention"].fixed_attention
    assert configs["mim"].init == "mimetic" and configs["mim"].freeze and configs["res"].reservoir_layers == (0,)
    model = build_gpt("gpt-tiny", "causal_lm", vocab_size=64, num_layers=2)
    report = apply_oelm(model, configs["res"], seed=0)
    assert not any(p.requires_grad for p in model.transformer.h[0].parameters())
    assert all(p.requires_grad for p in model.transformer.h[1].parameters()) and report.frozen > 0


def test_committed_matrices_keep_their_method_fingerprints():
    """The fields added for the research methods are left out of OELMConfig.to_dict at their defaults, as
    are max_grid_growth and a method's seeds, so a matrix run before them (its experiment.json) still
    resumes and its records read as before."""
    import json

    from oelm.matrix.output import config_fingerprint

    results = Path(__file__).resolve().parents[1] / "docs" / "results"
    checked = 0
    for experiment in sorted(results.glob("*/experiment.json")):
        recorded = json.loads(experiment.read_text()).get("fingerprint")
        if recorded:
            config = load_config(experiment.with_name("config.yaml"))
            fingerprint = config_fingerprint(config)
            assert fingerprint["methods"] == recorded["methods"], experiment
            # defaults left out: max_grid_growth only where the config sets it
            assert ("max_grid_growth" in fingerprint) == bool(config.max_grid_growth), experiment
            assert set(fingerprint) <= set(recorded), experiment
            checked += 1
    assert checked >= 5
