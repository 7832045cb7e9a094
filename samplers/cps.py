"""Coefficients-Preserving Sampling step (Wang et al. 2025, arXiv 2509.05952; FlowCPS ``sd3_sde_with_logprob.py``).

    x̂0 = x − σ·v,   x̂1 = x + (1−σ)·v
    s  = σ'·sin(η·π/2)
    μ  = (1 − σ')·x̂0 + sqrt(σ'² − s²)·x̂1
    x' = μ + s·ε

The signal coefficient (1−σ') and the total noise variance σ'² are both preserved; η = 0 is the Euler step
exactly (μ = x + (σ'−σ)·v algebraically), η = 1 a full re-noise.

Log-prob normalisation (``Config.log_prob``):
  * ``"anchor"`` (default, what FlowCPS / upstream Flow-GRPO ``sde_type='cps'`` use): ``−reduce((x'−μ)²)``,
    with no 1/(2s²) and no log-normaliser. Not a density; its PPO ratios need the anchor's clip range 1e-5.
  * ``"gaussian"``: the normalised ``log N(x'; μ, s²I)``, comparable with the other SDE kernels.
The rollout engine stores whatever ``log_prob`` returns and the GRPO objective recomputes it with the same
function and config, so the two always agree; choose ``"gaussian"`` to reuse SDE-mode clip ranges.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.types import StepOut
from samplers.kernel import Kernel, bcast, finish, step_inputs
from samplers.log_prob import gaussian_log_prob, reduce_elements

LOG_PROBS = ("anchor", "gaussian")


@dataclass
class Config:
    noise_level: float = 0.8      # η ∈ [0, 1]; upstream README: "a typical setting is noise_level = 0.8"
    log_prob: str = "anchor"      # "anchor": −mean((x'−μ)²);  "gaussian": normalised log N

    def __post_init__(self):
        if not 0.0 <= self.noise_level <= 1.0:
            raise ValueError(f"cps noise_level (η) must be in [0, 1] (s = σ'·sin(η·π/2)), got {self.noise_level}")
        if self.log_prob not in LOG_PROBS:
            raise ValueError(f"cps log_prob must be one of {LOG_PROBS}, got {self.log_prob!r}")


def step(x: Tensor, v: Tensor, sigma: Tensor | float, sigma_next: Tensor | float, noise: Tensor | None = None,
         *, x_next: Tensor | None = None, cfg: Config | None = None) -> StepOut:
    """One CPS step σ → σ' (equations in the module docstring). η = 0 returns the Euler step bit-for-bit."""
    cfg = cfg or Config()
    x, v, noise, s, sn = step_inputs(x, v, sigma, sigma_next, noise, x_next)
    if cfg.noise_level == 0.0:   # exact Euler (the closed form below equals it only up to rounding)
        mean = x + bcast(sn - s, x) * v
        return finish(mean, torch.zeros_like(s), x, None, None if x_next is None else x_next.float())
    std = sn * math.sin(cfg.noise_level * math.pi / 2)
    x0_hat = x - bcast(s, x) * v
    x1_hat = x + bcast(1 - s, x) * v
    mean = bcast(1 - sn, x) * x0_hat + bcast(torch.sqrt(sn**2 - std**2), x) * x1_hat
    return finish(mean, std, x, noise, None if x_next is None else x_next.float())


def log_prob(x_next: Tensor, mean: Tensor, std: Tensor, reduce: str = "mean", cfg: Config | None = None) -> Tensor:
    """``cfg.log_prob == "anchor"``: ``−reduce((x'−μ)²)`` (FlowCPS); ``"gaussian"``: normalised log N(x'; μ, s²I)."""
    cfg = cfg or Config()
    if cfg.log_prob == "gaussian":
        return gaussian_log_prob(x_next, mean, std, reduce)
    return -reduce_elements((x_next.float() - mean.float()) ** 2, reduce)


KERNEL = Kernel("cps", Config, step, log_prob)
