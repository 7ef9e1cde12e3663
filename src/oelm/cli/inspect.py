"""``oelm inspect``: where each model's query/key projections are and the parameter table per
method. Like every command module, it imports transformers and the model code inside the functions
that use them, so that ``oelm --help`` stays fast."""

from __future__ import annotations

import argparse
from pathlib import Path

from oelm.cli.console import print_table
from oelm.cli.starter import YAML_SUFFIXES
from oelm.configs import resolve_config
from oelm.errors import ConfigError, OELMError, UnsupportedModelError

__all__ = ["cmd_inspect"]

def _inspect_model_source(name: str, config_only: bool, trust_remote_code: bool = False):
    """A Hugging Face model for ``oelm inspect MODEL``: its checkpoint class (``config.architectures``,
    a transformers model class only), random weights from ``config.json`` when ``config_only``.

    ``trust_remote_code`` reaches every transformers loader as given: with False (the default)
    code shipped with the checkpoint (``auto_map`` in config.json) never runs, and transformers
    never stops to ask ("Do you wish to run the custom code? [y/N]").

    Raises:
        DataNotFoundError: no local directory, packaged checkpoint or Hub copy of ``name``.
        DataFormatError: a local directory transformers cannot load (says what is wrong with it,
            e.g. config.json needs custom code).
    """
    import transformers
    from transformers import AutoConfig, AutoModel

    from oelm.models.pretrained import _not_found, resolve_pretrained

    source = resolve_pretrained(name)
    try:
        hf_config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise _not_found(name, exc) from None
    # config.json is data: only a transformers model class it names is used, no other attribute
    classes = (getattr(transformers, a, None) for a in (hf_config.architectures or []) if isinstance(a, str))
    cls = next((c for c in classes if isinstance(c, type) and issubclass(c, transformers.PreTrainedModel)), None)
    try:
        if config_only:
            return cls(hf_config) if cls is not None else AutoModel.from_config(hf_config, trust_remote_code=trust_remote_code)
        return (cls or AutoModel).from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise _not_found(name, exc) from None


def _print_sites(title: str, sites) -> None:
    rows = [
        [s.query_name if t == "query" else s.key_name, s.kind, str(s.layer), t, "x".join(map(str, s.shape(t))),
         str(s.heads(t)), str(s.head_dim), s.fused or "no"]
        for s in sites for t in ("query", "key")
    ]
    print_table(title, ["module", "kind", "layer", "target", "shape", "heads", "head_dim", "fused"], rows)


def _shipped(name: str) -> bool:
    """Whether ``name`` is a shipped config's name (``quickstart``, ``evidence/sst2_minilm``)."""
    try:
        resolve_config(name)
    except ConfigError:
        return False
    return True


def _inspect_checkpoint(name: str, args: argparse.Namespace) -> int:
    """``oelm inspect MODEL``: the checkpoint ``name`` (its weights, or random ones with
    ``--config-only``), the Q/K projections found, and per method (``--method``, else every named
    method, naming those that do not apply) the parameter table."""
    import copy

    from accelerate.utils import set_seed

    from oelm.architectures import find_attention_projections
    from oelm.method.apply import apply_oelm
    from oelm.method.config import METHODS

    set_seed(0)
    model = _inspect_model_source(name, args.config_only)
    base = copy.deepcopy(model)
    sites = find_attention_projections(model)
    weights = "random weights from config.json" if args.config_only else "checkpoint weights"
    print(f"{name}: {type(model).__name__} (model_type={model.config.model_type!r}, {weights})")
    _print_sites("attention query/key projections found", sites)
    for method in args.method or list(METHODS):
        if method not in METHODS:
            raise OELMError(f"unknown method {method!r}; named methods: {', '.join(METHODS)}")
        model = copy.deepcopy(base)
        try:
            report = apply_oelm(model, METHODS[method], seed=0)
        except UnsupportedModelError as exc:
            if args.method:  # asked for by name: the refusal is the answer
                raise
            print(f"\n== {name} / {method}: not applicable: {exc}")  # e.g. fixed_attention (oelm's GPT only)
            continue
        print(f"\n== {name} / {method}")
        if report.projections:
            worst = max(p["max_orthogonality_error"] for p in report.projections)
            frozen = sum(p["frozen"] for p in report.projections)
            print(f"{frozen}/{len(report.projections)} projections frozen; max |WWᵀ-I| per head: {worst:.1e}")
        print(report.table())
        print(report)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from accelerate.utils import set_seed

    from oelm.method.apply import apply_oelm
    from oelm.method.config import METHODS

    target = args.target
    if target is not None and Path(target).suffix in YAML_SUFFIXES:
        target = str(resolve_config(target))  # a YAML path that is not there is "no such file", not a Hub id
    elif target is not None and not Path(target).expanduser().exists() and _shipped(target):
        target = str(resolve_config(target))  # a shipped config by name, as `oelm run NAME` takes it
    elif target is not None and target.startswith(("/", "./", "../", "~")) and not Path(target).expanduser().exists():
        raise OELMError(f"{target}: no such file or directory (give a model directory, a Hub id or an experiment YAML)")
    is_config = target is not None and Path(target).is_file() and Path(target).suffix in YAML_SUFFIXES
    if target is not None and not is_config or (target is None and args.model and args.config_only):
        return _inspect_checkpoint(target or args.model, args)

    from oelm.config import load_config
    from oelm.matrix.model import build_model

    if is_config:
        config = load_config(target)
    else:
        from oelm.config import config_from_dict

        if not (args.model or args.gpt):
            raise OELMError("give a MODEL (Hub id, local dir), a CONFIG file, --model NAME_OR_DIR or --gpt PRESET")
        model_cfg = {"pretrained": args.model} if args.model else {"gpt": args.gpt, "gpt_overrides": {"vocab_size": 50257}}
        config = config_from_dict(
            {"name": "inspect", "task": {"dataset": "sst2"}, "model": model_cfg, "methods": [{"name": "baseline"}]}
        )
    # a config: its methods; --gpt / --model alone: every named method, as for MODEL (those that do not
    # apply are named, not fatal); --method: those, and a refusal is the answer
    every = not is_config and not args.method
    methods = args.method or (list(METHODS) if every else [m.name for m in config.methods])
    entries = {m.name: m for m in config.methods} if is_config else {}
    for name in methods:
        set_seed(0)
        model, _ = build_model(config, None, task_type="classification", num_labels=args.num_labels)
        cfg = entries[name].oelm_config() if name in entries else METHODS.get(name)
        if cfg is None:
            raise OELMError(f"unknown method {name!r}; named methods: {', '.join(METHODS)}")
        try:
            report = apply_oelm(model, cfg, seed=0)
        except UnsupportedModelError as exc:
            if not every:
                raise
            print(f"\n== {config.model.display_name} / {name}: not applicable: {exc}")
            continue
        print(f"\n== {config.model.display_name} / {name}")
        if report.projections:
            rows = [
                [p["module"], p["kind"], str(p["layer"]), p["target"], "x".join(map(str, p["shape"])), str(p["num_heads"]),
                 str(p["head_dim"]), p["fused"] or "no", "yes" if p["frozen"] else "no", f"{p['max_orthogonality_error']:.1e}"]
                for p in report.projections
            ]
            print_table("query/key projections found", ["module", "kind", "layer", "target", "shape", "heads", "head_dim", "fused", "frozen", "max |WWᵀ-I|"], rows)
        print(report.table())
        print(report)
    return 0
