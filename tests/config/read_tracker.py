"""Which config fields a run reads: every dataclass in a loaded ``RunConfig`` is swapped, in place, for a subclass
whose attribute reads record ``<dotted path>``. Reads made while serialising the config (``to_dict``: the resolved
config.yaml, the logger's copy) do not count."""
from __future__ import annotations

import copy
import dataclasses
from contextlib import contextmanager

import flowrl.config as config_pkg
import flowrl.config.loader as loader
from flowrl.config.loader import Plugin

_SUBCLASSES: dict[type, type] = {}


class Tracker:
    def __init__(self):
        self.paths: dict[int, str] = {}       # id(instance) → its dotted path
        self.keep: list = []                  # instances stay alive, so ids stay unique
        self.read: set[str] = set()
        self.fields: set[str] = set()         # every leaf field path
        self.paused = 0

    def record(self, obj, name: str) -> None:
        path = self.paths.get(id(obj))
        if path is not None and not self.paused:
            self.read.add(f"{path}.{name}" if path else name)

    def unread(self) -> set[str]:
        return self.fields - self.read


def _tracked_class(cls: type, tracker: Tracker) -> type:
    names = {f.name for f in dataclasses.fields(cls)}

    def __getattribute__(self, name):           # noqa: N807
        if name in names:
            tracker.record(self, name)
        return object.__getattribute__(self, name)

    def __deepcopy__(self, memo):                # a stage's private copy of its config still reports reads
        new = object.__new__(type(self))
        memo[id(self)] = new
        for k, v in object.__getattribute__(self, "__dict__").items():
            object.__setattr__(new, k, copy.deepcopy(v, memo))
        path = tracker.paths.get(id(self))
        if path is not None:
            tracker.paths[id(new)] = path
            tracker.keep.append(new)
        return new

    sub = type(cls.__name__, (cls,), {"__getattribute__": __getattribute__, "__deepcopy__": __deepcopy__,
                                      "__module__": cls.__module__})
    _SUBCLASSES[sub] = cls
    return sub


def _walk(obj, path: str, tracker: Tracker) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            _walk(v, f"{path}.{k}", tracker)
        return
    if not (dataclasses.is_dataclass(obj) and not isinstance(obj, type)):
        return
    values = {f.name: object.__getattribute__(obj, f.name) for f in dataclasses.fields(obj)}
    if not isinstance(obj, Plugin):
        object.__setattr__(obj, "__class__", _tracked_class(type(obj), tracker))
    tracker.paths[id(obj)] = path
    tracker.keep.append(obj)
    for name, value in values.items():
        child = f"{path}.{name}" if path else name
        if isinstance(obj, Plugin):               # its kind was consumed by the loader (it chose the Config)
            _walk(value, path, tracker)           # a plugin's own / common fields read as <section>.<field>
        elif (dataclasses.is_dataclass(value) and not isinstance(value, type)) or isinstance(value, dict):
            _walk(value, child, tracker)
        else:
            tracker.fields.add(child)


@contextmanager
def tracking(cfg):
    """Track reads of ``cfg``'s fields inside the block; yields the Tracker."""
    tracker = Tracker()
    _walk(cfg, "", tracker)
    original = loader.to_dict

    def quiet_to_dict(obj):
        tracker.paused += 1
        try:
            return original(obj)
        finally:
            tracker.paused -= 1

    loader.to_dict, config_pkg.to_dict = quiet_to_dict, quiet_to_dict
    try:
        yield tracker
    finally:
        loader.to_dict, config_pkg.to_dict = original, original
