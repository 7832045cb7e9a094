"""Few-step student schedules and DMD score-timestep sampling (Self-Forcing ``utils/scheduler.py``, ``model/dmd.py``).

Timesteps are on Wan's 0..1000 scale, σ = t / 1000. Shift: σ' = s·σ / (1 + (s−1)·σ)
(Self-Forcing ``utils/scheduler.py::set_timesteps``). Warping (``warp_denoising_step``) maps a nominal list
through the shifted dense grid, which is exact at these points: t' = 1000·shift(t/1000).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from samplers.schedule import shift_sigmas


def shift_sigma(sigma: Tensor, shift: float) -> Tensor:
    """σ' = s·σ / (1 + (s − 1)·σ) (the shared ``samplers.schedule.shift_sigmas``)."""
    return shift_sigmas(sigma, shift)


@dataclass(frozen=True)
class StepPreset:
    """A few-step list: nominal timesteps, whether to warp them through the shift, and the shift."""

    steps: tuple[float, ...]
    shift: float
    warp: bool


PRESETS: dict[str, StepPreset] = {
    # Self-Forcing configs/self_forcing_dmd.yaml: [1000, 750, 500, 250], warp, shift 5 → [1000, 937.5, 833.3, 625]
    "self_forcing": StepPreset((1000.0, 750.0, 500.0, 250.0), 5.0, True),
    # CausVid configs/wan_causal_dmd.yaml: [1000, 757, 522] (+ final 0), no warp, shift 8
    "causvid": StepPreset((1000.0, 757.0, 522.0), 8.0, False),
}


def denoising_timesteps(preset: str | StepPreset) -> Tensor:
    """The student's denoising timesteps (float32, descending), warped when the preset says so."""
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ValueError(f"unknown step preset {preset!r}; choose one of {sorted(PRESETS)} "
                             "or give steps/shift/warp explicitly")
        preset = PRESETS[preset]
    t = torch.tensor(preset.steps, dtype=torch.float64)
    if preset.warp:
        t = 1000.0 * shift_sigma(t / 1000.0, preset.shift)
    return t.float()


def sample_score_timestep(batch: int, shift: float, min_step: int = 20, max_step: int = 980,
                          generator: torch.Generator | None = None) -> Tensor:
    """DMD / critic timestep per sample: t ~ U{0..999}, shifted, clamped to [min_step, max_step]
    (Self-Forcing ``model/dmd.py``: ``min_step = 0.02·1000``, ``max_step = 0.98·1000``)."""
    t = torch.randint(0, 1000, (batch,), generator=generator).double()
    t = 1000.0 * shift_sigma(t / 1000.0, shift)
    return t.clamp(min_step, max_step).float()


def add_noise(x0: Tensor, noise: Tensor, sigma: Tensor) -> Tensor:
    """x_σ = (1 − σ)·x0 + σ·ε with σ (B,) broadcast over (B, C, F, H, W)."""
    s = torch.as_tensor(sigma, dtype=x0.dtype, device=x0.device).view(-1, *([1] * (x0.dim() - 1)))
    return (1 - s) * x0 + s * noise
