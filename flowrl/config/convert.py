"""Check a YAML-parsed value against a dataclass field's annotation: the strict converters ``from_dict`` uses.

``convert(tp, value, where, source)`` dispatches on the annotation's origin (union, ``Literal``, list/tuple,
dict), then on nested dataclasses and scalars (float, int, str, bool, None), each in its own small converter.
The only conversions are int→float and list→tuple; anything else that does not match raises
``ConfigError`` naming the key and where it came from (file or command line).
"""
from __future__ import annotations

import difflib
import types
import typing
from dataclasses import is_dataclass
from typing import Any, Literal, Union

from flowrl.errors import FlowRLError


class ConfigError(FlowRLError, ValueError):
    """A config that does not match its schema; the message names the key, its source and the fix."""


class Source:
    """Where each dotted key came from: the YAML file, or a command-line override."""

    def __init__(self, file: str | None = None):
        self.file = file
        self.overrides: dict[str, str] = {}

    def of(self, key: str) -> str:
        for k, text in self.overrides.items():
            if key == k or key.startswith(k + ".") or k.startswith(key + "."):
                return f"command-line override {text!r}"
        return f"file {self.file}" if self.file else "the given dict"


def config_error(msg: str, key: str, source: Source | None) -> ConfigError:
    """The ``ConfigError`` for ``key``: ``"<key>: <msg> (in <file or override>)"``."""
    where = source.of(key) if source else "config"
    return ConfigError(f"{key}: {msg} (in {where})")


def suggest_key(name: str, valid) -> str:
    """``"; did you mean 'x'?"`` for the nearest valid name, else the list of valid names."""
    valid = list(valid)
    hit = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
    if hit:
        return f"; did you mean {hit[0]!r}?"
    return f"; valid keys: {', '.join(sorted(valid))}" if valid else "; this section takes no keys"


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert_union(tp: Any, value: Any, where: str, source: Source | None) -> Any:
    """``X | Y | None``: null where the union allows it, else the first member type the value converts to."""
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    for member in args:
        if member is type(None):
            continue
        try:
            return convert(member, value, where, source)
        except ConfigError:
            continue
    raise config_error(f"expected {_type_name(tp)}, got {value!r}", where, source)


def _convert_literal(tp: Any, value: Any, where: str, source: Source | None) -> Any:
    """``Literal[a, b]``: the value itself when it is one of the allowed values."""
    args = typing.get_args(tp)
    if value not in args:
        hint = suggest_key(str(value), map(str, args))
        raise config_error(f"expected one of {list(args)}, got {value!r}" + hint, where, source)
    return value


def _convert_sequence(tp: Any, value: Any, where: str, source: Source | None) -> Any:
    """``list[T]``, ``tuple[T, ...]`` or fixed ``tuple[A, B]``: each item converted; list→tuple for tuples."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if not isinstance(value, (list, tuple)):
        raise config_error(f"expected a list, got {value!r}", where, source)
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(args) != len(value):
            raise config_error(f"expected {len(args)} items, got {len(value)}", where, source)
        return tuple(convert(a, v, f"{where}[{i}]", source) for i, (a, v) in enumerate(zip(args, value)))
    item = args[0] if args else Any
    out = [convert(item, v, f"{where}[{i}]", source) for i, v in enumerate(value)]
    return tuple(out) if origin is tuple else out


def _convert_mapping(tp: Any, value: Any, where: str, source: Source | None) -> Any:
    """``dict[str, V]``: string keys, each value converted to ``V``."""
    args = typing.get_args(tp)
    if not isinstance(value, dict):
        raise config_error(f"expected a mapping, got {value!r}", where, source)
    vt = args[1] if args else Any
    return {str(k): convert(vt, v, f"{where}.{k}", source) for k, v in value.items()}


def _convert_dataclass(tp: Any, value: Any, where: str, source: Source | None) -> Any:
    """A nested section: an instance passes through, a mapping is built strictly by ``from_dict``."""
    from flowrl.config.loader import from_dict  # from_dict and convert recurse into each other

    if isinstance(value, tp):
        return value
    return from_dict(tp, value, where, source)


def _convert_float(tp: Any, value: Any, where: str, source: Source | None) -> float:
    """A float field also takes an int (YAML ``1``); a bool is refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise config_error(f"expected a float, got {value!r} ({type(value).__name__})", where, source)
    return float(value)


def _convert_int(tp: Any, value: Any, where: str, source: Source | None) -> int:
    """An int field takes an int only (not a bool, not a float)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise config_error(f"expected an int, got {value!r} ({type(value).__name__})", where, source)
    return value


def _convert_exact(tp: Any, value: Any, where: str, source: Source | None) -> Any:
    """A ``str`` or ``bool`` field takes a value of exactly that type."""
    if not isinstance(value, tp):
        raise config_error(f"expected a {tp.__name__}, got {value!r} ({type(value).__name__})", where, source)
    return value


def _convert_none(tp: Any, value: Any, where: str, source: Source | None) -> None:
    """A ``None`` annotation (a member of ``X | None`` tried on its own) takes only null."""
    if value is not None:
        raise config_error(f"expected null, got {value!r}", where, source)
    return None


# (annotation origins, converter): generic annotations dispatch on ``typing.get_origin``.
_BY_ORIGIN = (
    ((Union, types.UnionType), _convert_union),
    ((Literal,), _convert_literal),
    ((list, tuple), _convert_sequence),
    ((dict,), _convert_mapping),
)
# (plain annotations, converter): scalar annotations dispatch on the type itself.
_SCALARS = (
    ((float,), _convert_float),
    ((int,), _convert_int),
    ((str, bool), _convert_exact),
    ((type(None),), _convert_none),
)


def convert(tp: Any, value: Any, where: str, source: Source | None) -> Any:
    """Check ``value`` against annotation ``tp`` (YAML-parsed); converts only int→float and list→tuple."""
    if tp in (dict, list, tuple):            # bare annotations: any items
        tp = {dict: dict[str, Any], list: list[Any], tuple: tuple[Any, ...]}[tp]
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    for origins, convert_kind in _BY_ORIGIN:
        if origin in origins:
            return convert_kind(tp, value, where, source)
    if is_dataclass(tp):
        return _convert_dataclass(tp, value, where, source)
    for kinds, convert_kind in _SCALARS:
        if tp in kinds:
            return convert_kind(tp, value, where, source)
    raise config_error(f"unsupported annotation {tp!r} in the schema", where, source)
