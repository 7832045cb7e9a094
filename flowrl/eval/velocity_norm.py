"""The velocity norm: one definition for NormGuard's training penalty (``flowrl.objectives.normguard``) and the
velocity-norm hacking statistic of the evaluations (``eval/velocity_rms``).

RL fine-tuning of flow generators inflates the per-step velocity norm ‖v_θ‖ by 5–15 % over the reference under
NFT, AWM and DPO (NormGuard, Pan et al., arXiv 2606.27771). The norm used for both is the root
mean square over a sample's latent elements,

    ‖v‖ = sqrt(mean_elems v²)                                           (B,)

which differs from the Euclidean norm by the constant sqrt(D): ratios ‖v_θ‖/‖v_ref‖ are the same, and penalty
weights and alarm bands do not depend on the resolution.
"""
from __future__ import annotations

from torch import Tensor

__all__ = ["velocity_norm"]


def velocity_norm(v: Tensor) -> Tensor:
    """‖v‖ = sqrt(mean over every non-batch element of v²), (B,) float32."""
    if v.dim() < 2:
        raise ValueError(f"velocity_norm: v must be (B, ...) with at least one latent dim, got {tuple(v.shape)}")
    return v.float().flatten(1).square().mean(1).sqrt()
