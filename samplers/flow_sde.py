"""Flow-GRPO reverse-SDE step (Liu et al. 2025, arXiv 2505.05470; flow_grpo ``sd3_sde_with_logprob.py``).

    dt = σ' − σ < 0,   g = a·sqrt(σ / (1 − σ̃)),   σ̃ = σ except at σ = 1 where σ̃ = σ_1
    μ  = x·(1 + g²·dt/(2σ)) + v·(1 + g²(1−σ)/(2σ))·dt     = x + [v + g²/(2σ)·x̂1]·dt,  x̂1 = x + (1−σ)v
    x' = μ + g·sqrt(−dt)·ε,   std s = g·sqrt(−dt)

σ=1 rule: Flow-GRPO replaces the 1−σ in the denominator by 1−sigmas[1] at σ=1. The grid's first step goes
1 → sigmas[1], so by default σ̃ = σ' there (identical for the first grid step); set ``sigma_at_one`` to
override (e.g. an E-GRPO merged step leaving σ=1).

Wan variant (Flow-GRPO's Wan2.1 copy, ``variant="wan"``): ``g = σ_min + (σ_max − σ_min)·σ`` with
σ_max = sigmas[1], σ_min = sigmas[-1] of the grid (use :func:`wan_config`), times ``noise_level`` (1.0 there).

Default ``a`` per model (Flow-GRPO configs): SD3.5 0.7, FLUX 0.9 (see ``NOISE_LEVEL``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.types import StepOut
from samplers.kernel import Kernel, finish, require_positive_sigma, reverse_sde_mean, step_inputs
from samplers.log_prob import gaussian_kernel_log_prob

NOISE_LEVEL = {"sd3": 0.7, "flux": 0.9, "qwen_image": 1.2, "wan": 1.0}
"""Flow-GRPO's published ``a`` per model family (flow_grpo ``config/base.py``, ``config/grpo.py``)."""

VARIANTS = ("flow_grpo", "wan")


@dataclass
class Config:
    noise_level: float = 0.7          # "a" (SD3.5 default; FLUX 0.9)
    variant: str = "flow_grpo"        # "flow_grpo": g = a·sqrt(σ/(1−σ)); "wan": g = a·(σ_min + (σ_max−σ_min)σ)
    sigma_at_one: float | None = None  # σ̃ used in 1−σ̃ when σ = 1 (None: σ', i.e. sigmas[1] on a grid step)
    sigma_max: float | None = None    # wan variant: sigmas[1] of the grid
    sigma_min: float = 0.0            # wan variant: sigmas[-1] of the grid

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"flow_sde variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.noise_level < 0:
            raise ValueError(f"flow_sde noise_level must be >= 0, got {self.noise_level}")
        if self.variant == "wan" and self.sigma_max is None:
            raise ValueError("flow_sde variant 'wan' needs sigma_max (= sigmas[1]); build it with wan_config(sigmas)")


def wan_config(sigmas: Tensor, noise_level: float = 1.0) -> Config:
    """Config of Flow-GRPO's Wan variant for a σ grid: σ_max = sigmas[1], σ_min = sigmas[-1]."""
    return Config(noise_level=noise_level, variant="wan", sigma_max=float(sigmas[1]), sigma_min=float(sigmas[-1]))


def diffusion_coefficient(sigma: Tensor, sigma_next: Tensor, cfg: Config) -> Tensor:
    """g(σ) per sample (B,): ``a·sqrt(σ/(1−σ̃))`` (σ=1 rule above) or the Wan linear rule."""
    if cfg.variant == "wan":
        return cfg.noise_level * (cfg.sigma_min + (cfg.sigma_max - cfg.sigma_min) * sigma)
    at_one = sigma_next if cfg.sigma_at_one is None else torch.full_like(sigma, cfg.sigma_at_one)
    denom_sigma = torch.where(sigma >= 1.0, at_one, sigma)
    return cfg.noise_level * torch.sqrt(sigma / (1 - denom_sigma))


def step(x: Tensor, v: Tensor, sigma: Tensor | float, sigma_next: Tensor | float, noise: Tensor | None = None,
         *, x_next: Tensor | None = None, cfg: Config | None = None) -> StepOut:
    """One Flow-GRPO SDE step σ → σ' (equations in the module docstring); samples with ``noise`` or scores
    a given ``x_next``; with neither, x_next = μ."""
    cfg = cfg or Config()
    x, v, noise, s, sn = step_inputs(x, v, sigma, sigma_next, noise, x_next)
    require_positive_sigma(s, "flow_sde", "the drift divides by σ")
    dt = sn - s
    g = diffusion_coefficient(s, sn, cfg)
    mean = reverse_sde_mean(x, v, s, dt, g)
    std = g * torch.sqrt(-dt)
    return finish(mean, std, x, noise, None if x_next is None else x_next.float())


log_prob = gaussian_kernel_log_prob
KERNEL = Kernel("flow_sde", Config, step, log_prob)
