"""The experiment configs shipped with oelm (package data; ``configs/`` in the repository is a
link to this folder), by name.

A name is the path under ``configs/`` without ``.yaml``: ``quickstart``, ``tinystories-tiny``,
``evidence/sst2_minilm``, ``cpu/phase1_bert/sst2``. ``oelm run NAME`` runs one, ``oelm configs``
lists them, ``oelm init --template NAME`` copies one to edit (:func:`starter_config`).
"""

from __future__ import annotations

import re
from pathlib import Path

from oelm.errors import ConfigError

__all__ = ["shipped_configs", "resolve_config", "starter_config"]

_YAML = (".yaml", ".yml")


def shipped_configs() -> dict[str, Path]:
    """Every shipped config, name -> file, sorted by name."""
    root = Path(__file__).resolve().parent
    return {p.relative_to(root).with_suffix("").as_posix(): p for p in sorted(root.rglob("*.yaml"))}


def _key(arg: str) -> str:
    key = arg.removeprefix("./").removeprefix("configs/")
    return key[: -len(Path(key).suffix)] if Path(key).suffix in _YAML else key


def resolve_config(arg: str) -> Path:
    """The experiment YAML that ``arg`` names: the path when something is there, else the shipped
    config of that name (a ``.yaml`` suffix and a leading ``configs/`` are optional, so
    ``configs/quickstart.yaml`` works outside the repository too). A directory of a shipped
    config's name (an earlier ``--output-dir quickstart``) is the shipped config; any other
    directory is left to :func:`oelm.config.load_config`'s message.

    Raises:
        ConfigError: no such file and no shipped config of that name.
    """
    path = Path(arg).expanduser()
    shipped = shipped_configs()
    if path.is_dir() and _key(arg) in shipped:
        # a folder of that name (e.g. `--output-dir quickstart` of an earlier run) is never a config:
        # the shipped one is meant, so "rerun the same command" keeps working
        return shipped[_key(arg)]
    if path.exists():
        return path
    if _key(arg) in shipped:
        return shipped[_key(arg)]
    top = [name for name in shipped if "/" not in name]
    raise ConfigError(f"config {arg}: no such file, and no shipped config of that name (e.g. {', '.join(top)}; "
                      "`oelm configs` lists them all)")


def starter_config(template: str, name: str, version: str = "") -> str:
    """The text of a starter config: shipped ``template`` with a commented header on how to use
    it and its ``name`` field set to ``name`` (so its outputs do not mix with the template's).
    The result is validated before it is returned.

    Raises:
        ConfigError: unknown template, or the result does not validate (``name`` not allowed).
    """
    import yaml

    from oelm.config import config_from_dict

    shipped = shipped_configs()
    if _key(template) not in shipped:
        raise ConfigError(f"--template {template}: no shipped config of that name; `oelm configs` lists them")
    body = re.sub(r"^name: .*$", lambda _: f"name: {name}", shipped[_key(template)].read_text(encoding="utf-8"),
                  count=1, flags=re.M)
    config_from_dict(yaml.safe_load(body), source=f"oelm init from {template}")
    header = (
        f"# Starter experiment written by `oelm init`{f' (oelm {version})' if version else ''} from the shipped config "
        f"'{_key(template)}'.\n"
        "# Edit it, list its runs with `oelm plan THIS_FILE`, train and compare with `oelm run THIS_FILE`\n"
        "# (any field can be overridden there: key=value, e.g. seeds=[0,1,2] training.epochs=2).\n"
        "# Fields and their defaults: oelm.config (ExperimentConfig). Local data: OELM_DATA_DIR or --data-dir DIR.\n"
        "# Outputs go to output_dir, default outputs/<name>.\n\n"
    )
    return header + body
