"""Which σ each sample is trained at, for the forward-process objectives (reference B §1.4, §2.1, §2.4).

All pick indices into the rollout's own discrete schedule ``sigmas[:-1]`` (the σ's a step starts from; the
final 0 is never trained) and return indices; ``sigmas_at`` turns them into σ values.
"""
from __future__ import annotations

import torch
from torch import Tensor


def _count(num_steps: int, fraction: float) -> int:
    n = int(num_steps * fraction)
    if not 1 <= n <= num_steps:
        raise ValueError(f"timestep fraction {fraction} of {num_steps} steps trains {n} steps; need 1..{num_steps}")
    return n


def permuted_subset(num_steps: int, batch: int, fraction: float = 0.99,
                    generator: torch.Generator | None = None) -> Tensor:
    """DiffusionNFT: per sample, a random permutation of the schedule's steps, first ``int(S·fraction)`` kept
    (0.99 → 9 of 10). Returns (B, T) long; column j is the step trained at inner iteration j."""
    n = _count(num_steps, fraction)
    keys = torch.rand(batch, num_steps, generator=generator)
    return keys.argsort(dim=1)[:, :n]


def stratified(lo: int, hi: int, count: int = 6, generator: torch.Generator | None = None) -> Tensor:
    """AWM: ``count`` indices, one uniform draw per stratum of ``linspace(lo, hi, count+1).long()``, shared by the
    micro-batch (AWM GenEval/OCR ``discrete_wo_init``: lo=1, hi=int(14·0.9)=12; PickScore ``discrete``: lo=0).
    Returns (count,) long, each in [lo, hi)."""
    if hi - lo < count:
        raise ValueError(f"stratified timesteps: {count} strata need hi − lo ≥ {count}, got [{lo}, {hi})")
    bounds = torch.linspace(lo, hi, count + 1).long()
    width = (bounds[1:] - bounds[:-1]).clamp(min=1)
    u = torch.rand(count, generator=generator)
    return bounds[:-1] + (u * width).long().clamp(max=width - 1)


def decoupled(num_steps: int, batch: int, fraction: float = 0.51,
              generator: torch.Generator | None = None) -> Tensor:
    """VideoAWR Decoupled Timestep Rectification (``ultra_flash``): one index per rollout, drawn independently
    and uniformly from the ``int(S·fraction)`` noisiest steps (20 steps · 0.51 → indices 0..9). (B,) long."""
    n = _count(num_steps, fraction)
    return torch.randint(0, n, (batch,), generator=generator)


def sigmas_at(sigmas: Tensor, idx: Tensor) -> Tensor:
    """σ values ``sigmas[idx]`` of the (S+1,) schedule, any idx shape; refuses the terminal σ index S."""
    if int(idx.max()) >= sigmas.numel() - 1:
        raise ValueError(f"timestep index {int(idx.max())} is the schedule's terminal σ; train only steps < "
                         f"{sigmas.numel() - 1}")
    return sigmas[idx]
