"""Which σ each sample is trained at, for the forward-process objectives (DiffusionNFT
``train_nft_sd3.py``, AWM ``train_sd3_awm.py``, VideoAWR ``train_wan2_1_awr.py``).

All pick indices into the rollout's own discrete schedule ``sigmas[:-1]`` (the σ's a step starts from; the
final 0 is never trained) and return indices; ``sigmas_at`` turns them into σ values.

A forward-process objective's Config holds one of the samplers below as its ``timesteps`` field (a tagged
section, ``{kind: permuted, fraction: 0.99}``); ``sampler.columns(num_steps, batch, generator)`` gives the
(B, T) indices the loop trains, column j at inner step j. Each sampler's defaults are its anchor's. ``generator``
may be one per row (the loop's per-sample draws): per-sample samplers then draw row b from generator b alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.registry import Registry


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


def logit_normal(batch: int, generator=None, mean: float = 0.0, std: float = 1.0, lo: float = 0.0,
                 hi: float = 0.99) -> Tensor:
    """Continuous σ (B,) float32: raw = sigmoid(mean + std·N(0, 1)) clamped to [0.01, 1 − 1e-6], then
    σ = 1 − (lo + raw·(hi − lo)) (Flow-Factory ``TimeSampler.logit_normal_shifted``, shift 1, ``timestep_range``
    0.99 → σ ∈ [0.0199, 1]; verl-omni draws the same logit-normal(0, 1) through diffusers'
    ``compute_density_for_timestep_sampling``). ``generator`` may be one per row."""
    if not 0.0 <= lo < hi <= 1.0 or std <= 0:
        raise ValueError(f"logit-normal timesteps need 0 <= lo < hi <= 1 and std > 0, got lo={lo}, hi={hi}, std={std}")
    if isinstance(generator, (list, tuple)):
        z = torch.cat([torch.randn(1, generator=g, device=g.device).cpu() for g in generator])
    else:
        z = torch.randn(batch, generator=generator)
    raw = torch.sigmoid(z * std + mean).clamp(0.01, 1 - 1e-6)
    return (1 - (lo + raw * (hi - lo))).float()


def per_row(draw, generators: list) -> Tensor:
    """Row b of the (B, T) columns from ``draw(generators[b])`` (a (1, T) tensor) alone."""
    return torch.cat([draw(g) for g in generators])


@dataclass
class Permuted:
    """DiffusionNFT: per sample, ``int(S·fraction)`` distinct steps in random order (99 % of the schedule)."""

    fraction: float = 0.99

    def columns(self, num_steps: int, batch: int, generator=None) -> Tensor:
        if isinstance(generator, list):
            return per_row(lambda g: permuted_subset(num_steps, 1, self.fraction, g), generator)
        return permuted_subset(num_steps, batch, self.fraction, generator)


@dataclass
class Decoupled:
    """VideoAWR Decoupled Timestep Rectification: one independent step per rollout among the noisiest 51 %."""

    fraction: float = 0.51

    def columns(self, num_steps: int, batch: int, generator=None) -> Tensor:
        if isinstance(generator, list):
            return per_row(lambda g: decoupled(num_steps, 1, self.fraction, g).unsqueeze(1), generator)
        return decoupled(num_steps, batch, self.fraction, generator).unsqueeze(1)


@dataclass
class Stratified:
    """AWM: ``count`` steps (6), one per stratum of the first ``int(S·fraction)`` steps, shared by the batch."""

    count: int = 6
    fraction: float = 0.9

    def __post_init__(self):
        if self.count < 1:
            raise ValueError(f"stratified timesteps count must be >= 1, got {self.count}")

    def columns(self, num_steps: int, batch: int, generator=None) -> Tensor:
        """Shared by the micro-batch (AWM); with per-row generators, drawn from its first row's."""
        hi = _count(num_steps, self.fraction)
        g = generator[0] if isinstance(generator, list) else generator
        return stratified(0, hi, min(self.count, hi), g).unsqueeze(0).expand(batch, -1)


TIMESTEPS = Registry("timestep sampler", {
    "permuted": "flowrl.objectives.timesteps:Permuted",
    "decoupled": "flowrl.objectives.timesteps:Decoupled",
    "stratified": "flowrl.objectives.timesteps:Stratified",
})
