"""Deterministic multistep ODE kernels: the ``Kernel`` bundle plus the one-step history the engine carries.

A multistep kernel's ``step`` also takes the data prediction of the previous step on the node's own path:

    step(x, v, sigma, sigma_next, noise=None, *, x_next=None, cfg=None, history=None) -> StepOut
    history = (x̂0_prev (B, ...), σ_prev float)  or None (the step falls back to first order)

with ``x̂0 = x − σ·v`` (flow data prediction, ``flowrl.types``). The rollout engine (``samplers.tree``) keeps
one x̂0 per frontier row, hands it to the row's children along deterministic edges, and resets it
(``history=None``) after a stochastic edge — the noise jump breaks the finite difference
``(x̂0 − x̂0_prev)/h`` the second-order term is built on — and at the start of a compressed ODE tail
(MixGRPO-Flash starts its tail fresh).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from samplers.kernel import Kernel, bcast, per_sample


@dataclass(frozen=True)
class MultistepKernel(Kernel):
    """A deterministic kernel whose ``step`` accepts ``history`` (previous x̂0 and σ on the same path)."""

    history: int = 1


def is_multistep(kernel) -> bool:
    """True for kernels that take the engine's ``history`` (a ``MultistepKernel`` or any ``history > 0``)."""
    return int(getattr(kernel, "history", 0)) > 0


def data_prediction(x: Tensor, v: Tensor, sigma: Tensor | float) -> Tensor:
    """x̂0 = x − σ·v per row, float32 (σ a float, 0-d or (B,) tensor)."""
    x = x.to(torch.float32)
    return x - bcast(per_sample(sigma, x), x) * v.to(torch.float32)


def uniform_sigma(sigma: Tensor | float, x: Tensor, what: str = "sigma") -> float:
    """σ as one Python float; raises when the rows of a (B,) σ differ (one σ per multistep call)."""
    s = per_sample(sigma, x)
    first = float(s[0])
    if bool((s != first).any()):
        raise ValueError(f"multistep kernel: every row must share one {what} per call, got {s.tolist()}")
    return first
