"""Decay schedules of the sampling ("old") adapter and the eval EMA, as pure functions of the step.

The old adapter is soft-updated once per epoch: θ_old ← η·θ_old + (1−η)·θ (``soft_update_``), with η from
(DiffusionNFT train_nft_sd3.py ``return_decay``, AWM ``train_sd3_awm.py``, MARBLE ``train.py``):
- ``nft``      (decay_type=1, default):    η = min(0.001·step, 0.5)
- ``nft_ocr``  (decay_type=2, OCR, Wan):   η = 0 for step < 75, then min(0.0075·(step − 75), 0.999)
- ``on_policy`` (decay_type=0):            η = 0 (old = current after every update)
- ``marble``   (MARBLE's decay_type=1):    η = min(0.001·step, 0.95)
- ``awm``      (AWM's "ema" anchor):       η = min(0.001·step, 0.3)
and the evaluation EMA of the trainable weights: η = min((1+s)/(10+s), 0.9) (flow_grpo/ema.py).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

import torch
from torch import Tensor


def nft_decay(step: int) -> float:
    return min(0.001 * step, 0.5)


def nft_ocr_decay(step: int) -> float:
    return 0.0 if step < 75 else min(0.0075 * (step - 75), 0.999)


def on_policy_decay(step: int) -> float:
    return 0.0


def marble_decay(step: int) -> float:
    return min(0.001 * step, 0.95)


def awm_decay(step: int) -> float:
    return min(0.001 * step, 0.3)


def eval_ema_decay(step: int, max_decay: float = 0.9) -> float:
    return min((1 + step) / (10 + step), max_decay)


OldUpdate = Literal["on_policy", "nft", "nft_ocr", "marble", "awm"]   # an objective Config's ``old_update``


def check_positive(objective: str, **values: float) -> None:
    """Raise a one-line ValueError naming the first of ``values`` that is not > 0."""
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{objective} {name} must be > 0, got {value}")


SCHEDULES: dict[str, Callable[[int], float]] = {
    "nft": nft_decay, "nft_ocr": nft_ocr_decay, "on_policy": on_policy_decay,
    "marble": marble_decay, "awm": awm_decay, "eval_ema": eval_ema_decay,
}


def decay(schedule: str, step: int) -> float:
    """η of the named schedule at ``step`` (the global optimizer step)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown old-policy decay schedule {schedule!r}; known: {sorted(SCHEDULES)}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return SCHEDULES[schedule](step)


@torch.no_grad()
def soft_update_(old: Iterable[Tensor], new: Iterable[Tensor], eta: float) -> None:
    """In place θ_old ← η·θ_old + (1−η)·θ for paired tensors (η = 0 copies θ)."""
    old, new = list(old), list(new)
    if len(old) != len(new):
        raise ValueError(f"soft_update_: {len(old)} old tensors but {len(new)} new ones; pair them by name")
    for o, n in zip(old, new):
        o.mul_(eta).add_(n.detach().to(o.dtype), alpha=1 - eta)
