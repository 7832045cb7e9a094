"""DanceGRPO constant-η SDE step (Xue et al. 2025, arXiv 2505.07818; DanceGRPO ``train_grpo_flux.py``).

    dσ = σ' − σ < 0,  Δ = −dσ,  x̂0 = x − σ·v,  score = −(x − (1−σ)·x̂0)/σ²  (= −x̂1/σ)
    μ  = x + dσ·(v − ½η²·score)  = x + dσ·[v + η²/(2σ)·x̂1]
    x' = μ + η·sqrt(Δ)·ε,   std s = η·sqrt(Δ)

The same drift family as Flow-GRPO with a constant diffusion coefficient g ≡ η (η = 0.3 in the launch scripts).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.types import StepOut
from samplers.kernel import Kernel, finish, require_positive_sigma, reverse_sde_mean, step_inputs
from samplers.log_prob import gaussian_kernel_log_prob


@dataclass
class Config:
    noise_level: float = 0.3   # η (DanceGRPO FLUX/Qwen/Wan scripts; 0.25 for HunyuanVideo)

    def __post_init__(self):
        if self.noise_level < 0:
            raise ValueError(f"dance_sde noise_level (η) must be >= 0, got {self.noise_level}")


def step(x: Tensor, v: Tensor, sigma: Tensor | float, sigma_next: Tensor | float, noise: Tensor | None = None,
         *, x_next: Tensor | None = None, cfg: Config | None = None) -> StepOut:
    """One DanceGRPO SDE step σ → σ' (equations in the module docstring)."""
    cfg = cfg or Config()
    x, v, noise, s, sn = step_inputs(x, v, sigma, sigma_next, noise, x_next)
    require_positive_sigma(s, "dance_sde", "the score divides by σ²")
    ds = sn - s
    eta = torch.full_like(s, cfg.noise_level)
    mean = reverse_sde_mean(x, v, s, ds, eta)
    std = eta * torch.sqrt(-ds)
    return finish(mean, std, x, noise, None if x_next is None else x_next.float())


log_prob = gaussian_kernel_log_prob
KERNEL = Kernel("dance_sde", Config, step, log_prob)
