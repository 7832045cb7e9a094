"""Deterministic Euler step of the probability-flow ODE (diffusers FlowMatchEulerDiscreteScheduler.step).

    x' = x + (σ' − σ)·v            (std = 0)

Computed in float32 exactly as diffusers does (``sample.float() + dt·v`` with dt = σ' − σ in float32).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.types import StepOut
from samplers.kernel import Kernel, bcast, finish, step_inputs


@dataclass
class Config:
    """The ODE step has no knobs; the class exists so every kernel is configured the same way."""


def step(x: Tensor, v: Tensor, sigma: Tensor | float, sigma_next: Tensor | float, noise: Tensor | None = None,
         *, x_next: Tensor | None = None, cfg: Config | None = None) -> StepOut:
    """Euler step ``x' = x + (σ'−σ)·v``; ``noise`` is ignored (the step is deterministic), std = 0."""
    x, v, _, s, sn = step_inputs(x, v, sigma, sigma_next, None, x_next)
    mean = x + bcast(sn - s, x) * v
    std = torch.zeros_like(s)
    return finish(mean, std, x, None, None if x_next is None else x_next.float())


def log_prob(x_next: Tensor, mean: Tensor, std: Tensor, reduce: str = "mean", cfg: Config | None = None) -> Tensor:
    """An ODE step is a point mass: it has no log-density to score."""
    raise ValueError("the 'ode' kernel is deterministic and has no log-prob; use flow_sde, dance_sde or cps "
                     "for the steps you train on (the plan marks them stochastic)")


KERNEL = Kernel("ode", Config, step, log_prob, stochastic=False)
