"""Faults on one process only, for the sharded runs of fsdp_worker.py: a reward that is NaN for rank 0's first
sample (that process then trains fewer rows than the other), and GRPO's loss made NaN on rank 0 (its optimizer
steps are skipped on every process). Importing registers the reward; the objective is loaded by file path."""
import torch

from flowrl.objectives.grpo import TRAINS_ON, Config  # noqa: F401
from flowrl.objectives.grpo import loss as grpo_loss
from flowrl.types import LossOut
from rewards import REWARDS


def rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def nan_on_rank0(batch):
    """Distinct values per sample (so advantages are not zero), NaN for rank 0's first sample."""
    r = torch.arange(len(batch), dtype=torch.float32) * (1 + rank())
    if rank() == 0:
        r[0] = float("nan")
    return r


def loss(policy, batch, cfg=None):
    out = grpo_loss(policy, batch, cfg)
    bad = torch.tensor(float("nan") if rank() == 0 else 0.0)
    return LossOut(out.loss + bad, {**out.metrics, "bad_term": bad})


if "test_nan_on_rank0" not in REWARDS.names():
    REWARDS.register("test_nan_on_rank0", nan_on_rank0)
