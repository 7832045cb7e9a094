"""A test objective whose loss turns non-finite: GRPO's loss plus a NaN ``bad_term`` (loaded by file path)."""
import torch

from flowrl.objectives.grpo import NEEDS, Config, loss as grpo_loss  # noqa: F401
from flowrl.types import LossOut


def loss(policy, batch, cfg=None):
    out = grpo_loss(policy, batch, cfg)
    bad = torch.tensor(float("nan"))
    return LossOut(out.loss + bad, {**out.metrics, "bad_term": bad})
