"""The step-kernel bundle and the broadcasting helpers every kernel shares.

A kernel is a pure function ``step(x, v, sigma, sigma_next, noise=None, *, x_next=None, cfg) -> StepOut``
plus a ``log_prob(x_next, mean, std, reduce, cfg)`` that scores a transition.  The rollout engine calls
``step`` with fresh ``noise``; the objective calls ``step`` again with the stored ``x_next`` (so the
mean is recomputed under the current weights) and the same ``log_prob``, so rollout-time and
training-time log-probs come from one function.  All math runs in float32.

A multistep ODE kernel (``history > 0``, e.g. DPM-Solver++(2M), ``samplers.dpm_solver``) also takes the data
prediction of the previous step on the row's own path, ``history = (x̂0_prev (B, ...), σ_prev float)`` or None
(first order), with ``x̂0 = x − σ·v`` (``data_prediction``). The engines (``samplers.rollout``,
``samplers.tree``) carry one x̂0 per row along deterministic steps and reset it (``history=None``) after a
stochastic step — the noise jump breaks the finite difference ``(x̂0 − x̂0_prev)/h`` the second-order term is
built on — and at the start of a compressed ODE tail (MixGRPO-Flash starts its tail fresh).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from flowrl.types import StepOut


@dataclass(frozen=True)
class Kernel:
    """A registered step kernel: its name, ``Config`` class, ``step`` and ``log_prob`` functions.

    stochastic: False for the deterministic ODE step (which has no log-prob).
    history: how many previous steps' x̂0 the ``step`` takes as ``history`` (0: a one-step kernel; 1: a
    second-order multistep kernel). The engines read this flag, never the kernel's name.
    """

    name: str
    Config: type
    step: Callable[..., StepOut]
    log_prob: Callable[..., Tensor]
    stochastic: bool = True
    history: int = 0

    def config(self, **overrides: Any):
        """``Config(**overrides)`` with a clear error for an unknown key."""
        known = set(self.Config.__dataclass_fields__)
        bad = sorted(set(overrides) - known)
        if bad:
            raise TypeError(f"kernel {self.name!r}: unknown config key(s) {bad}; known: {sorted(known)}")
        return self.Config(**overrides)


def per_sample(sigma: Tensor | float, x: Tensor) -> Tensor:
    """σ as a float32 (B,) tensor on x's device; accepts a Python float, a 0-d or a (B,) tensor."""
    b = x.shape[0]
    s = torch.as_tensor(sigma, dtype=torch.float32, device=x.device)
    if s.dim() == 0:
        return s.expand(b)
    if s.shape != (b,):
        raise ValueError(f"sigma must be a scalar or shaped (B,)=({b},), got {tuple(s.shape)}; "
                         "pass one σ per sample")
    return s


def bcast(t: Tensor, x: Tensor) -> Tensor:
    """A (B,) tensor viewed as (B, 1, 1, ...) to broadcast against x."""
    return t.view(t.shape[0], *([1] * (x.dim() - 1)))


def data_prediction(x: Tensor, v: Tensor, sigma: Tensor | float) -> Tensor:
    """x̂0 = x − σ·v per row, float32 (σ a float, 0-d or (B,) tensor)."""
    x = x.to(torch.float32)
    return x - bcast(per_sample(sigma, x), x) * v.to(torch.float32)


def as_f32(*ts: Tensor | None) -> list[Tensor | None]:
    """Each tensor upcast to float32 (None passes through)."""
    return [None if t is None else t.to(torch.float32) for t in ts]


def check_pair(x: Tensor, v: Tensor, other: Tensor | None, what: str) -> None:
    """Shapes of x, v and noise / x_next must agree."""
    if v.shape != x.shape:
        raise ValueError(f"velocity shape {tuple(v.shape)} != latents shape {tuple(x.shape)}")
    if other is not None and other.shape != x.shape:
        raise ValueError(f"{what} shape {tuple(other.shape)} != latents shape {tuple(x.shape)}")


def step_inputs(x: Tensor, v: Tensor, sigma, sigma_next, noise: Tensor | None, x_next: Tensor | None):
    """A kernel step's inputs in float32 with their shapes checked: (x, v, noise, σ (B,), σ' (B,))."""
    x, v, noise = as_f32(x, v, noise)
    check_pair(x, v, noise if x_next is None else x_next, "noise" if x_next is None else "x_next")
    return x, v, noise, per_sample(sigma, x), per_sample(sigma_next, x)


def require_positive_sigma(s: Tensor, kernel: str, why: str) -> None:
    """Refuse σ = 0 for an SDE step (the last step to σ = 0 should be ODE)."""
    if bool((s <= 0).any()):
        raise ValueError(f"{kernel}: σ must be > 0 ({why}); the last step to σ=0 should be ODE")


def reverse_sde_mean(x: Tensor, v: Tensor, sigma: Tensor, dt: Tensor, g: Tensor) -> Tensor:
    """Mean of the reverse-SDE step shared by Flow-GRPO and DanceGRPO (``sde_step_with_logprob``, ``flux_step``):
    ``μ = x + dt·[v + (g²/(2σ))·x̂1]`` with ``x̂1 = x + (1−σ)·v``, written as
    ``x·(1 + g²·dt/(2σ)) + v·(1 + g²(1−σ)/(2σ))·dt``. σ, dt, g are per sample (B,)."""
    g2_2s = g**2 / (2 * sigma)
    return x * bcast(1 + g2_2s * dt, x) + v * bcast((1 + g2_2s * (1 - sigma)) * dt, x)


def finish(mean: Tensor, std: Tensor, x: Tensor, noise: Tensor | None, x_next: Tensor | None) -> StepOut:
    """x_next = given x_next, else mean + std·noise (mean when noise is None)."""
    if noise is not None and x_next is not None:
        raise ValueError("pass either noise (to sample) or x_next (to score a stored step), not both")
    if x_next is None:
        x_next = mean if noise is None else mean + bcast(std, x) * noise
    return StepOut(x_next, mean, std)


def resolve_kernel(kernel: Kernel | str) -> Kernel:
    """A Kernel, or the ``samplers.KERNELS`` entry of that name."""
    if isinstance(kernel, Kernel):
        return kernel
    from samplers import KERNELS  # lazy: the registry module imports this one's package

    return KERNELS.get(kernel)
