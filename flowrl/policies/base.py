"""The Policy contract: what every model adapter (sd3, flux, wan, toy) provides.

A policy answers "what is v_θ(x, σ, c)" for one model family; samplers, objectives and the trainer only
talk to this contract, so model differences live in ``flowrl/policies/`` alone.

Adapters: peft *named* LoRA adapters on the transformer. ``"train"`` is the trainable adapter,
``"old"`` the sampling adapter (π_old, soft-updated towards "train"), and ``None`` is the frozen base with
all adapters disabled. ``with policy.adapter(name):`` switches which one ``velocity`` uses, without
copying weights; only the "train" adapter's parameters ever require grad.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol, Sequence, runtime_checkable

import torch
from torch import Tensor, nn

from flowrl.types import Cond


@runtime_checkable
class Policy(Protocol):
    family: str                 # "sd3" | "flux" | "wan" | "toy"
    device: torch.device
    dtype: torch.dtype          # model compute dtype; samplers keep float32 latents
    default_guidance: float     # the family's CFG / distilled-guidance default
    default_noise_level: float  # Flow-GRPO SDE `a` for this family (0.7 SD3.5, 0.9 FLUX)

    def encode(self, prompts: Sequence[str], negative_prompts: Sequence[str] | None = None,
               cfg: bool = True) -> Cond:
        """Text conditioning (B,...). With ``cfg`` the unconditional / negative part is filled too."""

    def latent_shape(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, ...]:
        """Per-sample latent shape for a pixel resolution, e.g. (C, H/8, W/8) or (C, F', H', W')."""

    def noise(self, generators: Sequence[torch.Generator], height: int, width: int,
              num_frames: int | None = None) -> Tensor:
        """Starting noise (B, ...) float32, row b drawn from ``generators[b]`` alone (reproducible per sample)."""

    def sigmas(self, num_steps: int, latents: Tensor) -> Tensor:
        """The (num_steps + 1,) float32 σ grid the family's diffusers pipeline uses for these latents
        (shift, FLUX resolution-dependent shift), ending with 0."""

    def velocity(self, x: Tensor, sigma: Tensor, cond: Cond, guidance: float | None = None) -> Tensor:
        """v(x, σ) (B, ...) float32. ``sigma`` is (B,) or a scalar in [0, 1]. CFG is applied inside:
        ``v_u + w·(v_c − v_u)`` when w > 1 and ``cond.uncond`` is set (FLUX: distilled guidance embedding)."""

    def decode(self, latents: Tensor) -> Tensor:
        """Pixels in [0, 1]: images (B, 3, H, W) or videos (B, F, 3, H, W)."""

    def adapter(self, name: str | None) -> AbstractContextManager:
        """Context in which ``velocity`` runs under adapter ``name`` ("train", "old") or the base (None)."""

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Parameters the optimizer updates (the "train" LoRA adapter, or all transformer weights)."""
