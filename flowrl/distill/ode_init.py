"""ODE-regression initialisation of the causal student from teacher trajectories (CausVid,
Self-Forcing ``model/ode_regression.py``).

CausVid ``generate_ode_pairs.py``: a many-step teacher ODE (shift 8, CFG 6.0 in the standard form
x̂ = x̂_u + 6(x̂_c − x̂_u)) from noise; keep the latents at the student's timesteps and the final x0.
``ode_regression.py``: per block pick one stored step (constant within a block), run the causal student once
over the full sequence with the block-causal mask and per-frame timesteps, and regress onto x0:

    L = MSE( x̂0_θ(x_{t_b}, t_b), x0 )
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.distill.causal_wan import CausalWan, x0_from_flow
from flowrl.distill.dmd import ScoreFn, cfg_combine
from flowrl.distill.rollout import chunk_slices
from flowrl.distill.schedule import shift_sigma


@dataclass
class Config:
    """CausVid ODE-pair defaults (50 steps, shift 8, CFG 6.0 standard form)."""

    teacher_steps: int = 50
    teacher_shift: float = 8.0
    guidance_scale: float = 6.0
    cfg_convention: str = "standard"


def teacher_sigmas(num_steps: int, shift: float) -> Tensor:
    """Shifted teacher grid σ_i = shift(1 − i/N), i = 0..N (float64, ends at 0)."""
    return shift_sigma(torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64), shift)


@torch.no_grad()
def teacher_trajectory(teacher: ScoreFn, noise: Tensor, text: Tensor, text_neg: Tensor | None, cfg: Config,
                       keep_timesteps: Tensor) -> tuple[Tensor, Tensor]:
    """Euler ODE x_{i+1} = x_i + (σ_{i+1} − σ_i)·v̂ with CFG (the sampling engine's flat rollout,
    ``samplers.rollout``); returns (stored (S, B, ...) latents at the grid points nearest ``keep_timesteps``,
    their actual timesteps (S,)), the last row being x0 at t = 0."""
    from samplers.rollout import rollout

    sig = teacher_sigmas(cfg.teacher_steps, cfg.teacher_shift)
    keep = [int((sig - float(t) / 1000).abs().argmin()) for t in keep_timesteps]
    stored: dict[int, Tensor] = {}
    calls = [0]

    def velocity(x: Tensor, sigma: Tensor) -> Tensor:
        i, calls[0] = calls[0], calls[0] + 1               # call i is made at grid point i
        if i in keep:
            stored[i] = x
        t = sigma * 1000
        v = teacher(x, t, text)
        if text_neg is not None and cfg.guidance_scale != 1.0:
            v = cfg_combine(v, teacher(x, t, text_neg), cfg.guidance_scale, cfg.cfg_convention)
        return v

    x = rollout(velocity, noise.float(), sig.float(), store=False).latents
    latents = torch.stack([stored[i] for i in keep] + [x])
    return latents, torch.tensor([float(sig[i]) * 1000 for i in keep] + [0.0])


def ode_regression_loss(student: CausalWan, latents: Tensor, timesteps: Tensor, text: Tensor,
                        generator: torch.Generator | None = None) -> Tensor:
    """Per block, a random stored step; one block-causal pass; MSE of x̂0 to the trajectory's x0."""
    target = latents[-1]
    b, _, f = target.shape[:3]
    slices = chunk_slices(f, student.chunk_frames)
    idx = torch.randint(0, latents.shape[0] - 1, (b, len(slices)), generator=generator)
    x = torch.empty_like(target)
    t = torch.empty(b, f)
    for k, sl in enumerate(slices):
        for i in range(b):
            x[i, :, sl] = latents[idx[i, k], i, :, sl]
            t[i, sl] = timesteps[idx[i, k]]
    t = t.to(x.device)
    x0 = x0_from_flow(x, student(x, t, text), t / 1000)
    return torch.nn.functional.mse_loss(x0, target)
