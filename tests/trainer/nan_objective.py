"""A test objective whose loss turns non-finite: GRPO's loss plus a NaN ``bad_term`` (loaded by file path)."""
import torch

from flowrl.objectives.grpo import TRAINS_ON, Config  # noqa: F401
from flowrl.objectives.grpo import loss as grpo_loss
from flowrl.types import LossOut


def loss(policy, batch, cfg=None):
    out = grpo_loss(policy, batch, cfg)
    bad = torch.tensor(float("nan"))
    return LossOut(out.loss + bad, {**out.metrics, "bad_term": bad})
