"""Differentiable toy video rewards for offline runs and tests of reward-aware distillation (Stream-R1 saliency
needs ∂r/∂pixels; the model-based rewards in ``rewards/`` need downloaded weights). Reward contract:
``fn(RewardInput) -> Tensor[B]`` on videos (B, F, 3, H, W) in [0, 1]; use as ``flowrl.distill.toy_rewards:NAME``.
"""
from __future__ import annotations

from torch import Tensor

from flowrl.types import RewardInput


def frame_smoothness(batch: RewardInput) -> Tensor:
    """r = −mean_f |v_{f+1} − v_f|: a motion-smoothness proxy (0 for a static video)."""
    px = batch.pixels
    return -(px[:, 1:] - px[:, :-1]).abs().mean(dim=(1, 2, 3, 4))


def colorfulness(batch: RewardInput) -> Tensor:
    """r = mean over pixels of the channel standard deviation: a visual-quality proxy (0 for grey video)."""
    return batch.pixels.std(dim=2).mean(dim=(1, 2, 3))
