"""Reading experiment configs: YAML with no key given twice, ``key=value`` overrides merged into
the file's mapping, and Pydantic validation errors turned into one line per bad key
(:mod:`oelm.config` uses them all).

Override keys are dotted paths; a list entry is named by its index or, in a list of named entries,
by its name: ``training.epochs=2``, ``methods.0.learning_rate=1e-3``,
``methods.oelm_freeze.learning_rate=1e-3``. Values are parsed as YAML.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from oelm.config.aliases import TRAINER_ALIASES, canonical_training, trainer_hint
from oelm.config.training import TrainingConfig
from oelm.errors import ConfigError

__all__ = ["parse_overrides", "override_changes", "canonical_file", "override_sites", "merge", "format_validation_error",
           "safe_load_unique", "source_name"]


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The Pydantic model class holding the field at ``loc`` under ``root`` (for suggestions)."""
    model: type[BaseModel] | None = root
    for part in loc[:-1]:
        if model is None or isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        ann = field.annotation
        args = getattr(ann, "__args__", ()) or ()
        candidates = [ann, *args]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return model


# Pydantic names the branch of a union in an error's location (`normal_std.literal['matched']`,
# `parallel.function-before[...]`): not a key the user wrote. Never the first part of a location (a
# field of the root model), nor the last of an unknown-key error (the key as the user wrote it).
_UNION_BRANCH = re.compile(r"^(function-\w+\[.*\]|literal\[.*\]|int|float|str|bool|none|list\[.*\]|dict\[.*\]|tuple\[.*\])$")


def _blamed(path: str, msg: str, overrides: dict[str, str]) -> list[str]:
    """The command-line overrides (``key=value`` as typed) behind an error at ``path`` with message
    ``msg``: one that set ``path`` or a mapping above it, or, for a check across several keys of the
    mapping at ``path``, one that set a key below it which the message names."""
    found = []
    for site, item in overrides.items():
        if path == site or path.startswith(site + "."):
            found.append(item)
        elif (not path or site.startswith(path + ".")) and re.search(rf"\b{re.escape(site.rsplit('.', 1)[-1])}\b", msg):
            found.append(item)
    return found


def format_validation_error(err: ValidationError, source: str, root: type[BaseModel],
                            overrides: dict[str, str] | None = None) -> ConfigError:
    """One :class:`ConfigError` for ``err`` (raised validating ``root`` from ``source``): a header line, then
    one line per bad key with its message and the value given (unknown keys: the closest valid key).
    A line caused by a command-line override names it (``overrides``: :func:`override_sites`); when
    every line does, the header says the overrides are invalid, not the file."""
    lines = [f"invalid experiment config {source}:"]
    seen: dict[str, int] = {}
    blamed_lines = 0
    for e in err.errors():
        last = len(e["loc"]) - 1  # an unknown key ends its location, and may be named like a branch ("none")
        loc = tuple(p for i, p in enumerate(e["loc"]) if i == 0 or (i == last and e["type"] == "extra_forbidden")
                    or not (isinstance(p, str) and _UNION_BRANCH.match(p)))
        path = ".".join(str(p) for p in loc) or "(top level)"
        e = dict(e, msg=e["msg"].removeprefix("Value error, "))
        blamed = _blamed("" if path == "(top level)" else path, e["msg"], overrides or {})
        if blamed and path not in seen:
            blamed_lines += 1
        if path in seen:  # another branch of the same union: one line, the alternatives joined
            i = seen[path]
            lines[i] = lines[i].replace(" (got ", f"; or {e['msg']} (got ", 1)
            continue
        seen[path] = len(lines)
        if e["type"] == "extra_forbidden":
            hint = ""
            model = _model_at(root, loc)
            if model is not None:
                keys = list(model.model_fields)
                if model is TrainingConfig:  # Trainer's names are close to some (per_device_train_batch_sze)
                    guess = trainer_hint(str(loc[-1]), keys)
                    hint = f"; {guess}" if guess else f"; valid keys: {', '.join(keys)}"
                else:
                    close = difflib.get_close_matches(str(loc[-1]), keys, n=1)
                    hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(keys)}"
            lines.append(f"  - {path}: unknown key{hint}")
        elif e["type"] == "missing":
            lines.append(f"  - {path}: required key is missing")
        elif e["type"] == "value_error" and isinstance(e.get("input"), dict):
            # a check across several keys: its message names them (no "(got <the whole mapping>)")
            own_path = path == "(top level)" or e["msg"].startswith(f"{path}.")  # the message names the key itself
            lines.append(f"  - {e['msg']}" if own_path else f"  - {path}: {e['msg']}")
        else:
            got = e.get("input")
            got_s = repr(got) if not isinstance(got, dict) else "a mapping"
            lines.append(f"  - {path}: {e['msg']} (got {got_s})")
        if blamed:
            lines[-1] += f" [command line: {', '.join(blamed)}]"
    if blamed_lines == len(seen):
        lines[0] = f"invalid command-line override{'s' if blamed_lines > 1 else ''} for experiment config {source}:"
    return ConfigError("\n".join(lines))


_SHIPPED = Path(__file__).resolve().parents[1] / "configs"  # oelm.configs: the YAML files shipped as package data


def source_name(path: Path) -> str:
    """How an error names a config file: a shipped one by its name (as ``oelm run NAME`` takes it),
    not by its path inside site-packages; any other by its path."""
    try:
        return f"{Path(path).resolve().relative_to(_SHIPPED).with_suffix('').as_posix()} (shipped with oelm)"
    except ValueError:
        return str(path)


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """Turn ``["training.epochs=2", "seeds=[0,1]"]`` into a nested dict (values parsed as YAML).

    Raises:
        ConfigError: an override without ``=`` or with an empty key.
    """
    nested: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. training.epochs=2)")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: value is not valid YAML ({exc})") from None
        node = nested
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r} conflicts with an earlier override of {part!r}")
        node[parts[-1]] = value
    return nested


def override_changes(overrides: list[str]) -> dict[str, Any]:
    """:func:`parse_overrides` with Hugging Face Trainer's names in a ``training`` mapping (the
    experiment's or a method's) replaced by oelm's (:mod:`oelm.config.aliases`), so that
    ``training.per_device_train_batch_size=16`` overrides the file's ``batch_size``.

    Raises:
        ConfigError: as :func:`parse_overrides`, or a refused Trainer name (names the override).
    """
    for item in overrides:  # one at a time first, so that an error names its override
        try:
            _canonical_changes(parse_overrides([item]))
        except ValueError as err:
            raise ConfigError(f"override {item!r}: {err}") from None
    try:
        return _canonical_changes(parse_overrides(overrides))
    except ValueError as err:
        raise ConfigError(f"overrides {' '.join(overrides)}: {err}") from None


def _canonical_changes(changes: dict[str, Any], strict: bool = True) -> dict[str, Any]:
    """``changes`` (overrides, or a config file's mapping) with Trainer's names replaced by oelm's
    in its ``training`` mappings; ``strict=False`` leaves a mapping with a refused name as it is
    (validation reports it)."""
    def canonical(values: Any, where: str) -> Any:
        try:
            return canonical_training(values, where)
        except ValueError:
            if strict:
                raise
            return values

    changes = dict(changes)
    if isinstance(changes.get("training"), dict):
        changes["training"] = canonical(changes["training"], "training")
    def entry(e: Any) -> Any:
        if isinstance(e, dict) and isinstance(e.get("training"), dict):
            return e | {"training": canonical(e["training"], "methods.<method>.training")}
        return e

    methods = changes.get("methods")  # a list in a file; {index or name: ...} in overrides
    if isinstance(methods, dict):
        changes["methods"] = {k: entry(e) for k, e in methods.items()}
    elif isinstance(methods, list):
        changes["methods"] = [entry(e) for e in methods]
    return changes


def canonical_file(data: dict[str, Any]) -> dict[str, Any]:
    """A config file's mapping with Trainer's names replaced by oelm's where that raises nothing,
    before overrides are merged in (so that ``training.epochs=3`` replaces the file's
    ``num_train_epochs``)."""
    return _canonical_changes(data, strict=False)


def override_sites(overrides: list[str], data: dict[str, Any]) -> dict[str, str]:
    """Where each override landed in the merged config ``data``: the key path as validation errors
    name it (a list entry by its index, a Trainer name by oelm's) -> the override as typed."""
    sites = {}
    for item in overrides:
        parts = item.partition("=")[0].strip().split(".")
        if len(parts) >= 2 and parts[-2] == "training" and parts[-1] in TRAINER_ALIASES:
            parts[-1] = TRAINER_ALIASES[parts[-1]]
        node: Any = data
        for i, part in enumerate(parts):
            if isinstance(node, list) and not part.lstrip("-").isdigit():
                names = [e.get("name") if isinstance(e, dict) else None for e in node]
                parts[i] = str(names.index(part)) if part in names else part
            try:
                node = node[int(parts[i])] if isinstance(node, list) else node.get(part) if isinstance(node, dict) else None
            except (ValueError, IndexError):
                node = None
        sites[".".join(parts)] = item
    return sites


def _list_index(items: list, key: str, where: str) -> int:
    """The position in ``items`` that override part ``key`` names: an index (``methods.0``) or,
    in a list of named entries, a name (``methods.oelm_freeze``)."""
    if key.lstrip("-").isdigit():
        i = int(key)
        if not 0 <= i < len(items):
            raise ConfigError(f"override {where}.{key}: {where} has {len(items)} entries, so the index must be 0 to {len(items) - 1}")
        return i
    names = [item.get("name") for item in items if isinstance(item, dict)]
    if key in names:
        return names.index(key)
    named = f" or a name ({', '.join(map(str, names))})" if any(names) else ""
    raise ConfigError(f"override {where}.{key}: {where} is a list; give an index 0 to {len(items) - 1}{named}")


def merge(base: dict[str, Any], changes: dict[str, Any], where: str = "") -> dict[str, Any]:
    """``base`` with ``changes`` merged in: mappings key by key; a list entry by its index or
    name (``methods.0.learning_rate=1e-3``); anything else replaced."""
    out = dict(base)
    for k, v in changes.items():
        path = f"{where}.{k}" if where else k
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v, path)
        elif isinstance(v, dict) and isinstance(out.get(k), list):
            items = list(out[k])
            for key, change in v.items():
                i = _list_index(items, str(key), path)
                if isinstance(change, dict) and isinstance(items[i], dict):
                    items[i] = merge(items[i], change, f"{path}.{i}")
                else:
                    items[i] = change
            out[k] = items
        elif isinstance(v, dict) and v and all(str(key).isdigit() for key in v):
            raise ConfigError(f"override {path}.{next(iter(v))}: {path} is not a list in the config file (it is "
                              f"{'not set there' if k not in out else repr(out[k])}); set it whole, e.g. {path}=[0,1,2]")
        else:
            out[k] = v
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last one
    silently: a second ``training:`` block would drop the first one's settings)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice in one mapping (first on line {seen[key].line + 1}); "
                    "keep one", key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def safe_load_unique(text: str) -> Any:
    """``yaml.safe_load`` with :class:`_UniqueKeyLoader` (a SafeLoader: no Python objects)."""
    loader = _UniqueKeyLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
