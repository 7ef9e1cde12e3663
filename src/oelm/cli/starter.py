"""``oelm init`` (a starter config to edit, or a research suite's: :mod:`oelm.config.suite`) and
``oelm configs`` (the shipped configs it starts from)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from oelm.cli.console import version
from oelm.errors import OELMError

__all__ = ["YAML_SUFFIXES", "cmd_configs", "cmd_init"]

#: What a config file's name ends with.
YAML_SUFFIXES = (".yaml", ".yml")


def cmd_configs(args: argparse.Namespace) -> int:
    """List the shipped experiment configs (name, description) that `oelm run NAME` accepts."""
    import yaml

    from oelm.configs import shipped_configs

    shipped = shipped_configs()
    width = max(map(len, shipped))
    print("shipped experiment configs (oelm run NAME, oelm init --template NAME):")
    for name, path in shipped.items():
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            data = None
        print(f"  {name:<{width}}  {data.get('description', '') if isinstance(data, dict) else ''}")
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    """Write a starter experiment config to edit (:func:`oelm.configs.starter_config`), or with
    ``--suite`` a research suite's config for ``--model`` and ``--task`` (:func:`oelm.config.suite.suite_config`).

    Raises:
        ConfigError: an unknown template, suite or task, or too few seeds. OELMError: PATH exists
            (without ``--force``), is a symbolic link (dangling or not), is not ``.yaml``, or cannot be
            written; ``--suite`` without ``--model`` / ``--task``, or with ``--template``.
    """
    from oelm.configs import starter_config

    if args.suite is None and (args.model or args.task or args.seeds is not None):
        raise OELMError("--model, --task and --seeds go with --suite (e.g. oelm init --suite frozen-attention "
                        "--model gpt-tiny --task tinystories)")
    if args.suite is not None and (not args.model or not args.task or args.template is not None):
        raise OELMError("--suite needs --model M and --task T and no --template, e.g. oelm init --suite frozen-attention "
                        "--model sentence-transformers/all-MiniLM-L6-v2 --task sst2")
    dest = Path(args.path)
    if dest.suffix not in YAML_SUFFIXES:
        raise OELMError(f"{dest}: give a path ending in .yaml")
    if dest.is_symlink():  # a dangling one would have the config written wherever it points
        raise OELMError(f"{dest} is a symbolic link (to {os.readlink(dest)}); oelm init writes plain files only: "
                        "give another PATH, or the link's target itself")
    if dest.exists() and not args.force:
        raise OELMError(f"{dest} exists; give another PATH, or --force to overwrite it")
    if args.suite is not None:
        from oelm.config.suite import DEFAULT_SEEDS, suite_config

        text = suite_config(args.suite, args.model, args.task, dest.stem,
                            DEFAULT_SEEDS if args.seeds is None else args.seeds, version())
    else:
        text = starter_config(args.template or "quickstart", dest.stem, version())
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise OELMError(f"cannot write {dest}: {exc.strerror or exc}") from None
    if args.suite:
        from oelm.config.suite import task_source

        source = f"suite {args.suite}, {args.model} on {task_source(args.task)[0]}"
    else:
        source = args.template or "quickstart"
    print(f"wrote {dest} ({source}); edit it, then: oelm run {dest}")
    return 0
