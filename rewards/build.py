"""Turn a registry name / ``module:attr`` / entry point plus kwargs into a ready, checked reward.

Construction rule for the resolved object ``obj``:
  * a class with a dataclass ``Config`` attribute → ``obj(obj.Config(**kwargs))``;
  * any other class → ``obj(**kwargs)``;
  * a function → ``functools.partial(obj, **kwargs)``, called as ``fn(batch)``;
  * any other callable (an instance) → used as is (kwargs must be empty).
``BoundReward`` adds the contract around it: lazy ``setup(device, dtype)``, input checks, batching on the
reward's device, errors that name the reward, and output normalisation.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

import torch
from torch import Tensor

from flowrl.registry import RegistryError, closest
from rewards.base import RewardError, RewardInput, check_input, normalize_output


def _config_error(name: str, cfg_cls: type, kwargs: dict, err: Exception) -> RewardError:
    valid = [f.name for f in dataclasses.fields(cfg_cls)]
    bad = [k for k in kwargs if k not in valid]
    hints = [f"{k!r} (did you mean {closest(k, valid)!r}?)" if closest(k, valid) else repr(k) for k in bad]
    what = f"unknown option(s) {', '.join(hints)}" if bad else str(err)
    return RewardError(f"reward {name!r}: {what}; valid options: {', '.join(valid)}")


def instantiate(obj: Any, kwargs: dict, name: str) -> Any:
    """Construct a reward from the resolved registry object following the module's rule."""
    kwargs = dict(kwargs or {})
    if inspect.isclass(obj):
        cfg_cls = getattr(obj, "Config", None)
        if cfg_cls is not None and dataclasses.is_dataclass(cfg_cls):
            try:
                cfg = cfg_cls(**kwargs)
            except TypeError as e:
                raise _config_error(name, cfg_cls, kwargs, e) from e
            return obj(cfg)
        try:
            return obj(**kwargs)
        except TypeError as e:
            raise RewardError(f"reward {name!r}: cannot construct {obj.__name__}(**{kwargs}): {e}") from e
    if inspect.isfunction(obj) or inspect.isbuiltin(obj) or isinstance(obj, functools.partial):
        return functools.partial(obj, **kwargs) if kwargs else obj
    if callable(obj):
        if kwargs:
            raise RewardError(f"reward {name!r} is an already-built object; it takes no kwargs, got {kwargs}")
        return obj
    raise RewardError(f"reward {name!r} resolved to {obj!r}, which is not callable")


def resolve(target: str) -> Any:
    """The object behind a registry name, entry point, ``module:attr`` or ``file.py:attr``."""
    from rewards import REWARDS

    try:
        return REWARDS.get(target)
    except RegistryError as e:
        raise RewardError(str(e)) from e


class BoundReward:
    """A reward with its device, dtype and batch size, enforcing the contract on every call."""

    def __init__(self, fn: Any, name: str, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, batch_size: int | None = None):
        self.fn, self.name = fn, name
        self.device, self.dtype = torch.device(device), dtype
        self.batch_size = batch_size
        self.accepts = tuple(getattr(fn, "accepts", ("image", "video")))
        self.shapes_world = bool(getattr(fn, "shapes_world", False))
        self._ready = False

    def setup(self) -> None:
        """Load the reward's weights on its device (once)."""
        if self._ready:
            return
        setup = getattr(self.fn, "setup", None)
        if callable(setup):
            try:
                setup(self.device, self.dtype)
            except RewardError:
                raise
            except Exception as e:
                raise RewardError(f"reward {self.name!r}: setup on {self.device} failed: "
                                  f"{type(e).__name__}: {e}") from e
        self._ready = True

    def _call_chunk(self, chunk: RewardInput) -> dict[str, Tensor]:
        chunk = dataclasses.replace(chunk, pixels=chunk.pixels.to(self.device, torch.float32))
        try:
            with torch.no_grad():
                out = self.fn(chunk)
        except RewardError:
            raise
        except Exception as e:
            raise RewardError(f"reward {self.name!r} raised {type(e).__name__}: {e}") from e
        return normalize_output(out, len(chunk), self.name)

    def __call__(self, batch: RewardInput) -> dict[str, Tensor]:
        """Scores ``{"score": (B,), <aspect>: (B,)}`` on CPU, computed in chunks of ``batch_size``."""
        check_input(batch, self.name, self.accepts)
        self.setup()
        n = len(batch)
        size = self.batch_size or max(n, 1)
        parts = [self._call_chunk(batch.select(range(i, min(i + size, n)))) for i in range(0, n, size)]
        if not parts:
            return {"score": torch.empty(0)}
        keys = list(parts[0])
        for p in parts[1:]:
            if list(p) != keys:
                raise RewardError(f"reward {self.name!r} returned different keys across batches: "
                                  f"{keys} vs {list(p)}")
        return {k: torch.cat([p[k] for p in parts]) for k in keys}


def build_reward(target: str, kwargs: dict | None = None, name: str | None = None,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                 batch_size: int | None = None) -> BoundReward:
    """Resolve ``target`` and construct it with ``kwargs``: a ready ``BoundReward`` (weights load on first call)."""
    name = name or target
    fn = instantiate(resolve(target), kwargs or {}, name)
    return BoundReward(fn, name, device=device, dtype=dtype, batch_size=batch_size)
