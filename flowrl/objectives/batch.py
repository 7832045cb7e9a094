"""``TrainBatch``: what the trainer hands an objective's ``loss`` for one micro-step."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from flowrl.types import Cond, Trajectory


@dataclass
class TrainBatch:
    """One micro-batch of B samples.

    cond:       prompt conditioning (B); ``cond.uncond`` is needed only for CFG training forwards.
    advantages: (B,) float, one per sample (a balancer's output, or AWR energies from
                ``awr.prepare_advantages``). NaN entries are masked out of the loss.
    x0:         (B, ...) clean rollout latents — forward-process objectives (``NEEDS == "x0"``: nft, awr, awm).
    sigma:      (B,) the training σ of each sample for this micro-step (forward-process objectives; pick them
                with ``flowrl.objectives.timesteps``).
    noise:      (B, ...) ε for the forward noising x_σ = (1−σ)x0 + σε; None → drawn with ``generator``.
    traj:       the stored SDE steps of the rollout — GRPO (``NEEDS == "trajectory"``).
    steps:      GRPO: indices into traj's K axis trained in this call (one index = per-step training, several =
                a window averaged in one call); None = all stored steps.
    guidance:   CFG scale the rollout used (GRPO trains with it unless its Config sets ``train_guidance``).
    kernel, kernel_cfg, reduce: the step kernel (a ``samplers`` Kernel or its registry name), its Config instance
                and the log-prob reduction the rollout used; GRPO re-scores the stored steps with exactly these.
    mask:       (B,) bool, samples that count (zero-std filtering, MC-GRPO's dropped median); None = all.
    generator:  torch.Generator for ``noise`` when it is None, or one per row (each row's ε from its own).
    extras:     per-sample (B,) values the objective's ``prepare_advantages`` asked the loop to carry (GARDO's gate).
    path:       (B, S+1, ...) the boundary states of a deterministic rollout and ``grid`` its (S+1,) σ's — TDM-R1
                (``steps`` then holds the one boundary k trained in this call).
    """

    cond: Cond
    advantages: Tensor
    x0: Tensor | None = None
    sigma: Tensor | None = None
    noise: Tensor | None = None
    traj: Trajectory | None = None
    steps: Sequence[int] | Tensor | None = None
    guidance: float | None = None
    kernel: Any = None
    kernel_cfg: Any = None
    reduce: str = "mean"
    mask: Tensor | None = None
    generator: torch.Generator | list[torch.Generator] | None = None
    extras: dict = field(default_factory=dict)
    path: Tensor | None = None
    grid: Tensor | None = None

    def __len__(self) -> int:
        return self.advantages.shape[0]

    def weights(self) -> Tensor:
        """(B,) float 0/1: ``mask`` and finite advantage."""
        keep = torch.isfinite(self.advantages)
        if self.mask is not None:
            keep = keep & self.mask.to(keep.device).bool()
        return keep.float()

    def require(self, *names: str, objective: str) -> None:
        """Raise a clear error if a field the objective needs is missing or mis-shaped."""
        b = len(self)
        if self.advantages.dim() != 1:
            raise ValueError(f"{objective}: advantages must be (B,), got {tuple(self.advantages.shape)}")
        for n in names:
            val = getattr(self, n)
            if val is None:
                raise ValueError(f"{objective}: TrainBatch.{n} is None; the trainer must fill it for this objective")
            if isinstance(val, Tensor) and val.shape[0] != b:
                raise ValueError(f"{objective}: TrainBatch.{n} has {val.shape[0]} rows but advantages has {b}")
        if "sigma" in names and self.sigma.shape != (b,):
            raise ValueError(f"{objective}: TrainBatch.sigma must be (B,)=({b},), got {tuple(self.sigma.shape)}")

    def forward_noise(self) -> Tensor:
        """ε (B, ...) for the forward process: ``noise`` or fresh draws from ``generator``."""
        if self.noise is not None:
            return self.noise.float()
        if isinstance(self.generator, (list, tuple)):        # one generator per row
            rows = [torch.randn(self.x0.shape[1:], generator=g, dtype=torch.float32, device=g.device)
                    for g in self.generator]
            return torch.stack(rows).to(self.x0.device)
        dev = self.generator.device if self.generator is not None else self.x0.device
        return torch.randn(self.x0.shape, generator=self.generator, dtype=torch.float32, device=dev).to(self.x0.device)


def mean_elems(t: Tensor) -> Tensor:
    """Mean over every non-batch dim → (B,)."""
    return t.flatten(1).mean(dim=1)


def masked_mean(per_sample: Tensor, weights: Tensor) -> Tensor:
    """Σ w_i ℓ_i / max(Σ w_i, 1): the mean over the samples that count (0 when none do)."""
    ell = torch.where(weights > 0, per_sample, torch.zeros_like(per_sample))
    return (ell * weights).sum() / weights.sum().clamp(min=1.0)
