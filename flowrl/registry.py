"""Name → ``module:attr`` registries with lazy import and "did you mean" errors.

A registry maps short names (``"pickscore"``, ``"flow_sde"``) to import strings. ``resolve`` accepts a
registered name, a ``package.module:attr`` string, or a ``path/to/file.py:attr`` string, and imports
the target only when asked, so ``import flowrl`` stays cheap.
"""
from __future__ import annotations

import difflib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any


class RegistryError(KeyError):
    """A name that no registry entry, import path or file path resolves."""

    def __str__(self) -> str:  # KeyError quotes its message; print it plainly
        return str(self.args[0])


def closest(name: str, candidates) -> str | None:
    """The nearest candidate to ``name`` (difflib), or None."""
    hits = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.5)
    return hits[0] if hits else None


def _import_file(path: str, attr: str) -> Any:
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise RegistryError(f"plugin file not found: {path!r} (from {path}:{attr})")
    mod_name = f"flowrl_plugin_{file.stem}_{abs(hash(str(file)))}"
    if mod_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(mod_name, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        spec.loader.exec_module(module)
    return _getattr(sys.modules[mod_name], attr, f"{path}:{attr}")


def _getattr(module: Any, attr: str, where: str) -> Any:
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(module) if not n.startswith("_")]
            hint = closest(part, names)
            msg = f"{where}: module has no attribute {part!r}"
            raise RegistryError(msg + (f"; did you mean {hint!r}?" if hint else ""))
        obj = getattr(obj, part)
    return obj


def import_string(target: str) -> Any:
    """Import ``package.module:attr`` or ``path/to/file.py:attr`` and return the attribute."""
    if ":" not in target:
        raise RegistryError(f"{target!r} is not of the form 'module:attr' or 'file.py:attr'")
    mod, attr = target.rsplit(":", 1)
    if mod.endswith(".py") or "/" in mod:
        return _import_file(mod, attr)
    try:
        module = importlib.import_module(mod)
    except ModuleNotFoundError as e:
        raise RegistryError(f"cannot import {target!r}: {e}") from e
    return _getattr(module, attr, target)


class Registry:
    """A named set of lazily imported plugins.

    >>> SAMPLERS = Registry("sampler", {"ode": "samplers.ode:ode_step"})
    >>> SAMPLERS.get("ode")            # imports samplers.ode on first use
    """

    def __init__(self, kind: str, entries: dict[str, str] | None = None, entry_point_group: str | None = None):
        self.kind = kind
        self._entries: dict[str, str] = dict(entries or {})
        self._objects: dict[str, Any] = {}
        self._entry_point_group = entry_point_group

    def register(self, name: str, target: Any = None):
        """Register ``target`` (an object or a ``module:attr`` string) under ``name``; usable as a decorator."""
        if target is None:
            def deco(obj):
                self._objects[name] = obj
                return obj
            return deco
        if isinstance(target, str):
            self._entries[name] = target
        else:
            self._objects[name] = target
        return target

    def _entry_points(self) -> dict[str, Any]:
        if not self._entry_point_group:
            return {}
        from importlib.metadata import entry_points

        return {ep.name: ep for ep in entry_points(group=self._entry_point_group)}

    def names(self) -> list[str]:
        return sorted(set(self._entries) | set(self._objects) | set(self._entry_points()))

    def __contains__(self, name: str) -> bool:
        return name in self.names()

    def get(self, name: str) -> Any:
        """Resolve a registered name, an entry point, or an import string (``module:attr``, ``file.py:attr``)."""
        if name in self._objects:
            return self._objects[name]
        if name in self._entries:
            obj = import_string(self._entries[name])
            self._objects[name] = obj
            return obj
        if ":" in name:
            return import_string(name)
        eps = self._entry_points()
        if name in eps:
            obj = eps[name].load()
            self._objects[name] = obj
            return obj
        hint = closest(name, self.names())
        msg = f"unknown {self.kind} {name!r}"
        msg += f"; did you mean {hint!r}?" if hint else ""
        msg += f" Known: {', '.join(self.names())}. Or give 'module:attr' / 'path/file.py:attr'."
        raise RegistryError(msg)
