"""Reading experiment configs: ``key=value`` overrides merged into the file's mapping, and
Pydantic validation errors turned into one line per bad key (:mod:`oelm.config` uses both).

Override keys are dotted paths; a list entry is named by its index or, in a list of named entries,
by its name: ``training.epochs=2``, ``methods.0.learning_rate=1e-3``,
``methods.oelm_freeze.learning_rate=1e-3``. Values are parsed as YAML.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from oelm.errors import ConfigError

__all__ = ["parse_overrides", "merge", "format_validation_error"]


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
# `parallel.function-before[...]`): not a key the user wrote.
_UNION_BRANCH = re.compile(r"^(function-\w+\[.*\]|literal\[.*\]|int|float|str|bool|none|list\[.*\]|dict\[.*\]|tuple\[.*\])$")


def format_validation_error(err: ValidationError, source: str, root: type[BaseModel]) -> ConfigError:
    """One :class:`ConfigError` for ``err`` (raised validating ``root`` from ``source``): a header line, then
    one line per bad key with its message and the value given (unknown keys: the closest valid key)."""
    lines = [f"invalid experiment config {source}:"]
    seen: dict[str, int] = {}
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and _UNION_BRANCH.match(p)))
        path = ".".join(str(p) for p in loc) or "(top level)"
        e = dict(e, msg=e["msg"].removeprefix("Value error, "))
        if path in seen:  # another branch of the same union: one line, the alternatives joined
            i = seen[path]
            lines[i] = lines[i].replace(" (got ", f"; or {e['msg']} (got ", 1)
            continue
        seen[path] = len(lines)
        if e["type"] == "extra_forbidden":
            hint = ""
            model = _model_at(root, loc)
            if model is not None:
                close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(model.model_fields)}"
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
    return ConfigError("\n".join(lines))


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
