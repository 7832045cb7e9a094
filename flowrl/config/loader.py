"""Strict dataclass configs from YAML: ``from_dict``, dotted ``key=value`` overrides, tagged plugin sections.

The schema is plain dataclasses (docs/config.md). ``from_dict(cls, data, where)`` builds one strictly: an unknown
key or a wrong type raises ``ConfigError`` naming the key, where it came from (file or command line) and the
nearest valid key (difflib). A field whose metadata names a registry (``plugin_field``) is a tagged union:
``{kind: grpo, clip_range: 1e-4}`` resolves ``kind`` through that registry and builds the plugin module's own
``Config`` dataclass, so a plugin's settings live next to its code. Reusable by any module with its own config
(e.g. the distillation loop).
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from flowrl.config.convert import ConfigError, Source, config_error, convert, suggest_key


class _Loader(yaml.SafeLoader):
    """YAML 1.1 SafeLoader that also reads ``1e-4`` (no dot) as a float, as people write it."""


class _FastLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """The same rules on libyaml's parser (~10× faster) where PyYAML was built with it."""


for _cls in (_Loader, _FastLoader):
    _cls.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
        list("-+0123456789."),
    )


def parse_yaml(text: str) -> Any:
    """Valid YAML through libyaml; invalid YAML raises the pure-Python parser's error, which quotes the line."""
    try:
        return yaml.load(text, Loader=_FastLoader)
    except yaml.YAMLError:
        return yaml.load(text, Loader=_Loader)


@dataclass
class Plugin:
    """A resolved tagged-union section: the registry name and the plugin module's ``Config`` (or None)."""

    kind: str
    config: Any = None
    common: Any = None    # settings every plugin of this section takes (e.g. a policy's path and dtype)

    def __getattr__(self, name: str) -> Any:  # cfg.objective.clip_range reads through to the plugin's Config
        if name.startswith("__") or name in ("kind", "config", "common"):
            raise AttributeError(name)
        for part in (self.common, self.config):
            if part is not None and hasattr(part, name):
                return getattr(part, name)
        raise AttributeError(f"{self.kind!r} config has no field {name!r}")


def plugin_field(registry: str, default: str | None, common: type | None = None) -> Any:
    """A dataclass field holding a ``Plugin`` resolved through ``registry`` ("package:ATTR"); ``default`` kind.
    ``common``: a dataclass of keys every plugin of the section accepts besides its own Config's."""
    return field(default=None, metadata={"registry": registry, "default_kind": default, "common": common})


def nested_plugin(registry: str, default: str) -> Any:
    """A tagged section inside a plugin's own Config (e.g. an objective's ``timesteps: {kind: permuted}``):
    like ``plugin_field`` but with a usable default, ``Plugin(default, its Config())``, when the Config is built
    in Python rather than from YAML."""

    def make() -> Plugin:
        reg = resolve_registry(registry)
        cls = plugin_config_class(reg.get(default))
        return Plugin(default, cls() if cls is not None else None)

    return field(default_factory=make, metadata={"registry": registry, "default_kind": default, "common": None})


def resolve_registry(spec: str):
    """``"flowrl.objectives:OBJECTIVES"`` → the Registry object."""
    mod, attr = spec.split(":")
    try:
        return getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"registry {spec} is not available: {e}") from e


def plugin_config_class(obj: Any) -> type | None:
    """The ``Config`` dataclass of a registry entry: the object itself if it is one, its ``.Config``, or its
    module's ``Config``; None when the plugin takes no settings."""
    cls = getattr(obj, "Config", None)
    if cls is None and is_dataclass(obj) and isinstance(obj, type):
        return obj
    if cls is None:
        module = inspect.getmodule(obj)
        cls = getattr(module, "Config", None) if module is not None else None
    return cls if (cls is not None and is_dataclass(cls)) else None


def build_plugin(registry: str, data: Any, where: str, source: Source | None, default_kind: str | None,
                 common: type | None = None) -> Plugin:
    """Resolve a ``{kind: name, ...}`` section through ``registry`` and build the plugin's Config strictly
    (keys of the ``common`` dataclass are split off first and built into ``Plugin.common``)."""
    if isinstance(data, str):
        data = {"kind": data}
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise config_error(f"expected a mapping with 'kind', got {type(data).__name__}", where, source)
    data = dict(data)
    kind = data.pop("kind", default_kind)
    if kind is None:
        raise config_error("missing 'kind'", where, source)
    shared = None
    if common is not None:
        names = {f.name for f in fields(common)}
        shared = from_dict(common, {k: data.pop(k) for k in list(data) if k in names}, where, source)
    reg = resolve_registry(registry)
    try:
        obj = reg.get(str(kind))
    except KeyError as e:
        raise config_error(str(e), f"{where}.kind", source) from None
    cls = plugin_config_class(obj)
    if cls is None:
        if data:
            raise config_error(f"{kind!r} takes no settings, got {sorted(data)}", where, source)
        return Plugin(str(kind), None, shared)
    return Plugin(str(kind), from_dict(cls, data, where, source), shared)


def _hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of ``cls`` and its bases, each in its own module's namespace (a Config may extend
    another module's Config, e.g. GARDO's extends GRPO's)."""
    return typing.get_type_hints(cls)


def from_dict(cls: type, data: Any, where: str = "", source: Source | None = None):
    """Build dataclass ``cls`` from a (YAML-parsed) mapping, strictly: unknown keys and wrong types raise
    ``ConfigError`` naming the key and the nearest valid one. Missing keys take the dataclass defaults."""
    prefix = f"{where}." if where else ""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise config_error(f"expected a mapping for {cls.__name__}, got {data!r}", where or "<root>", source)
    hints = _hints(cls)
    valid = {f.name: f for f in fields(cls) if f.init and not f.name.startswith("_")}   # _x: internal state
    for key in data:
        if key not in valid:
            raise config_error("unknown key" + suggest_key(str(key), valid), prefix + str(key), source)
    kwargs = {}
    for name, f in valid.items():
        key = prefix + name
        if "build" in f.metadata:  # a custom section builder, e.g. the rewards mapping
            kwargs[name] = f.metadata["build"](data.get(name), key, source)
        elif "registry" in f.metadata:
            kwargs[name] = build_plugin(f.metadata["registry"], data.get(name), key, source,
                                        f.metadata["default_kind"], f.metadata.get("common"))
        elif name in data:
            kwargs[name] = convert(hints[name], data[name], key, source)
        elif is_dataclass(hints[name]) and f.default is MISSING:   # nested section: its plugin defaults resolve
            kwargs[name] = from_dict(hints[name], {}, key, source)
        elif f.default is MISSING and f.default_factory is MISSING:
            raise config_error("required key is missing", key, source)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:  # __post_init__ validation
        key, msg = blamed_field(str(e), prefix, list(valid))
        raise config_error(msg, key or where or "<root>", source) from None


def blamed_field(message: str, prefix: str, names: list[str]) -> tuple[str | None, str]:
    """(``prefix + name`` of the field a validation message is about, the message without that leading key):
    the field named first in the message, so an error is blamed on the override that set that field, not on
    the first override of the section. (None, message) when no field is named."""
    hits = []
    for name in names:
        m = re.search(rf"(?<![\w]){re.escape(prefix)}{re.escape(name)}(?![\w])", message) or \
            re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", message)
        if m:
            hits.append((m.start(), -len(m.group(0)), name, m))
    if not hits:
        return None, message
    _, _, name, m = min(hits)
    alone = m.start() == 0 and m.group(0) == prefix + name and not message[m.end():].startswith("[")
    rest = message[m.end():].lstrip(" :") if alone else message
    return prefix + name, rest or message


def to_dict(obj: Any) -> Any:
    """A plain YAML-ready structure; a Plugin becomes ``{kind, **its config}``."""
    if isinstance(obj, Plugin):
        out = {"kind": obj.kind}
        for part in (obj.common, obj.config):
            out.update(to_dict(part) if part is not None else {})
        return out
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in fields(obj) if not f.name.startswith("_")}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def dump_yaml(obj: Any) -> str:
    return yaml.safe_dump(to_dict(obj), sort_keys=False, default_flow_style=None)


def apply_overrides(data: dict, overrides: list[str], source: Source) -> dict:
    """Apply ``a.b.c=value`` (value parsed as a YAML scalar/flow) and ``~a.b`` (reset to default) to ``data``."""
    for text in overrides:
        if text.startswith("~"):
            path, value, reset = text[1:], None, True
        elif "=" in text:
            path, raw = text.split("=", 1)
            value, reset = parse_yaml(raw), False
        else:
            raise ConfigError(f"command-line override {text!r}: expected 'key=value' or '~key'")
        keys = path.strip().split(".")
        if not all(keys):
            raise ConfigError(f"command-line override {text!r}: empty key in {path!r}")
        source.overrides[".".join(keys)] = text
        node = data
        for k in keys[:-1]:
            child = node.get(k)
            if isinstance(child, str):  # `sampler.kernel: ode` shorthand becomes a mapping
                child = {"kind": child}
            if not isinstance(child, dict):
                child = {}
            node[k] = child
            node = child
        if reset:
            node.pop(keys[-1], None)
        else:
            node[keys[-1]] = value
    return data


def read_yaml_file(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        near = suggest_key(p.name, [q.name for q in p.parent.glob("*.yaml")]) if p.parent.is_dir() else ""
        raise ConfigError(f"config file not found: {path}" + (near if near.startswith("; did") else "")
                          + " (give a path to a YAML recipe, e.g. configs/default.yaml)")
    try:
        data = parse_yaml(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data


def load_yaml(cls: type, path: str | Path | None, overrides: list[str] | None = None):
    """Read a YAML recipe (or nothing), apply dotted overrides, and build ``cls`` strictly."""
    data = read_yaml_file(path) if path is not None else {}
    source = Source(str(path) if path is not None else None)
    apply_overrides(data, list(overrides or []), source)
    return from_dict(cls, data, "", source)


def replace_nested(obj: Any, **changes) -> Any:
    """``dataclasses.replace`` for dotted names: ``replace_nested(cfg, **{"train.lr": 1e-4})``."""
    groups: dict[str, dict] = {}
    direct = {}
    for k, v in changes.items():
        head, _, rest = k.partition(".")
        (groups.setdefault(head, {}).__setitem__(rest, v)) if rest else direct.__setitem__(head, v)
    for head, sub in groups.items():
        direct[head] = replace_nested(getattr(obj, head), **sub)
    if isinstance(obj, Plugin):
        names = {f.name for f in fields(obj.common)} if obj.common is not None else set()
        shared = {k: v for k, v in direct.items() if k in names}
        own = {k: v for k, v in direct.items() if k not in names}
        common = dataclasses.replace(obj.common, **shared) if shared else obj.common
        return Plugin(obj.kind, dataclasses.replace(obj.config, **own) if own else obj.config, common)
    if isinstance(obj, dict):
        return {**obj, **direct}
    return dataclasses.replace(obj, **direct)
