"""Exponential moving average of a parameter list, swappable in for evaluation and checkpoints.

Update (Flow-GRPO ``EMAModuleWrapper``, flow_grpo ``flow_grpo/ema.py``): every
``update_interval``-th optimiser step — when ``(step + 1) % update_interval == 0`` —

    β_t = min((1 + step) / (10 + step), decay)   if warmup else decay
    ema ← β_t·ema + (1 − β_t)·θ

Defaults are Flow-GRPO's: decay 0.9, update every 8 steps, warmup on ("affects the previous 20×8=160
steps"). ``store``/``copy_to``/``restore`` swap the averaged values into the live parameters and back.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass
class Config:
    decay: float = 0.9
    update_interval: int = 8
    warmup: bool = True


def ema_decay(step: int, decay: float, warmup: bool) -> float:
    """β_t = min((1 + t)/(10 + t), decay) with warmup, else decay (Flow-GRPO ``get_current_decay``)."""
    return min((1 + step) / (10 + step), decay) if warmup else decay


class EMA:
    """Shadow copies of ``params`` (float32, on ``device`` or the parameter's device)."""

    def __init__(self, params: Iterable[nn.Parameter], decay: float = Config.decay,
                 update_interval: int = Config.update_interval, warmup: bool = Config.warmup,
                 device: torch.device | str | None = None):
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"EMA decay must be in [0, 1], got {decay}")
        if update_interval < 1:
            raise ValueError(f"EMA update_interval must be >= 1, got {update_interval}")
        self.params = list(params)
        self.decay, self.update_interval, self.warmup = decay, update_interval, warmup
        self.shadow = [p.detach().to(device or p.device, torch.float32, copy=True) for p in self.params]
        self.num_updates = 0
        self._stored: list[Tensor] | None = None

    @torch.no_grad()
    def update(self, step: int) -> bool:
        """Fold the live parameters into the average if ``step`` is an update step; returns whether it was."""
        if (step + 1) % self.update_interval != 0:
            return False
        beta = ema_decay(step, self.decay, self.warmup)
        for s, p in zip(self.shadow, self.params):
            s.mul_(beta).add_(p.detach().to(s.device, torch.float32), alpha=1.0 - beta)
        self.num_updates += 1
        return True

    @torch.no_grad()
    def copy_to(self, params: Iterable[nn.Parameter] | None = None) -> None:
        """Write the averages into ``params`` (default: the tracked parameters)."""
        for s, p in zip(self.shadow, self.params if params is None else list(params), strict=True):
            p.copy_(s.to(p.device, p.dtype))

    def store(self) -> None:
        """Remember the live values (to ``restore`` after evaluating with the averages)."""
        self._stored = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def restore(self) -> None:
        """Put back the values saved by ``store``."""
        if self._stored is None:
            raise RuntimeError("EMA.restore() called without a preceding EMA.store()")
        for saved, p in zip(self._stored, self.params):
            p.copy_(saved)
        self._stored = None

    def state_dict(self) -> dict:
        return {"shadow": [s.clone() for s in self.shadow], "num_updates": self.num_updates,
                "decay": self.decay, "update_interval": self.update_interval, "warmup": self.warmup}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        shadow = state["shadow"]
        if len(shadow) != len(self.shadow):
            raise ValueError(f"EMA state has {len(shadow)} tensors but this EMA tracks {len(self.shadow)} parameters")
        for s, t in zip(self.shadow, shadow):
            if s.shape != t.shape:
                raise ValueError(f"EMA state tensor shape {tuple(t.shape)} != parameter shape {tuple(s.shape)}")
            s.copy_(t)
        self.num_updates = int(state["num_updates"])
        self.decay, self.update_interval, self.warmup = state["decay"], state["update_interval"], state["warmup"]
