"""Restart sampling for rectified flow (Xu et al. 2023, arXiv 2306.14878).

Main pass: Euler ODE on the σ grid. After the main step that lands on t_min (snapped to the nearest grid σ),
repeat K times: a forward jump t_min → t_max with fresh noise, then an ODE pass back over ``n_steps`` uniform
sub-steps. The rectified-flow forward jump (marginal-preserving: if x_s ~ p_s then x_t ~ p_t exactly):

    x_t = ((1−t)/(1−s))·x_s + sqrt(t² − ((1−t)/(1−s))²·s²)·z,   z ~ N(0, I),  s = t_min < t = t_max

The jump's density does not depend on θ, so Restart gives exploration but no policy log-prob.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from flowrl.types import RolloutResult, VelocityFn
from samplers.rng import randn_rows
from samplers.schedule import check_grid


@dataclass(frozen=True)
class Interval:
    """One restart interval: jump from t_min up to t_max, ``n_steps`` ODE sub-steps back, repeated ``K`` times."""

    t_min: float
    t_max: float
    n_steps: int = 10
    K: int = 2

    def __post_init__(self):
        if not 0.0 < self.t_min < self.t_max < 1.0:
            raise ValueError(f"restart interval needs 0 < t_min < t_max < 1, got ({self.t_min}, {self.t_max})")
        if self.n_steps < 1 or self.K < 0:
            raise ValueError(f"restart interval needs n_steps >= 1 and K >= 0, got {self.n_steps}, {self.K}")


@dataclass
class Config:
    """Restart intervals in σ. Default: one interval as Restart's SD recipe (K=2, 10 sub-steps), mapped from
    VE t_min 0.1 / t_max 2 to rectified-flow σ = t/(1+t): (0.09, 0.67)."""

    intervals: tuple[Interval, ...] = field(default_factory=lambda: (Interval(0.09, 0.67, 10, 2),))


def forward_jump(x_s: Tensor, s: float, t: float, noise: Tensor) -> Tensor:
    """Noise x from σ = s up to σ = t > s, keeping the rectified-flow marginal (module docstring)."""
    if not 0.0 <= s < t <= 1.0:
        raise ValueError(f"forward_jump needs 0 <= s < t <= 1, got s={s}, t={t}")
    a = (1 - t) / (1 - s)
    return a * x_s.float() + math.sqrt(t * t - (a * s) ** 2) * noise


def _ode(velocity_fn: VelocityFn, x: Tensor, grid: Tensor) -> tuple[Tensor, int]:
    b = x.shape[0]
    for i in range(grid.numel() - 1):
        v = velocity_fn(x, grid[i].expand(b))
        x = x + (grid[i + 1] - grid[i]) * v.float()
    return x, grid.numel() - 1


def restart_sample(velocity_fn: VelocityFn, x1: Tensor, sigmas: Tensor, cfg: Config | None = None,
                   generators: Sequence[torch.Generator] | None = None) -> RolloutResult:
    """Euler ODE on ``sigmas`` with the configured restart loops; returns final latents and the NFE count."""
    cfg = cfg or Config()
    grid = check_grid(sigmas).to(x1.device)
    hooks: dict[int, list[Interval]] = {}
    for iv in cfg.intervals:
        j = int(torch.argmin((grid[1:-1] - iv.t_min).abs())) + 1 if grid.numel() > 2 else 1
        hooks.setdefault(j, []).append(iv)
    if any(iv.K for iv in cfg.intervals) and (generators is None or len(generators) != x1.shape[0]):
        raise ValueError("restart jumps need one generator per sample (samplers.rng.sample_generator)")
    x, nfe = x1.float(), 0
    for i in range(grid.numel() - 1):
        x, k = _ode(velocity_fn, x, grid[i:i + 2])
        nfe += k
        for iv in hooks.get(i + 1, []):
            s = float(grid[i + 1])
            back = torch.linspace(iv.t_max, s, iv.n_steps + 1, device=x.device)
            for _ in range(iv.K):
                x = forward_jump(x, s, iv.t_max, randn_rows(x.shape[1:], generators).to(x.device))
                x, k = _ode(velocity_fn, x, back)
                nfe += k
    return RolloutResult(x, grid, None, None, nfe)
