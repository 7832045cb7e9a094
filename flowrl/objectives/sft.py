"""SFT and reward-filtered fine-tuning (RAFT): the flow-matching loss on each group's top-k samples, or on a fixed
image dataset (flow_grpo ``scripts/train_sd3_sft.py`` L800–837 with ``PerPromptStatTracker.update(type='sft')``;
Flow-Factory ``SFTTrainer`` for demonstrations; Dong et al., RAFT, arXiv 2304.06767).

Per row at its own σ ~ logit-normal(0, 1) and ε (``pairs.LogitNormalForward``):
    x_σ = (1−σ)x0 + σε,   A_i = 1[s_i ≥ the k-th largest s of its group]      (online; offline A_i = 1)
    L   = mean_rows A_i · mean_elems (v_θ(x_σ) − (ε − x0))²
The mean runs over every row of the group, kept or not, as in flow_grpo, so with one winner in K rows the winner's
gradient is 1/K of plain SFT on it alone. s is the balancer's advantage (for one reward: the reward's order); ties
at the k-th score are all kept (flow_grpo's rule for k = 1). The loss weight w(σ) is 1 (diffusers'
``compute_loss_weighting_for_sd3('logit_normal')``). Online, rollouts come from the current weights
(``old_update: on_policy``; flow_grpo's OnlineSFT refreshes its sampler every ~40 steps, offline never); with
``data`` (a JSONL / folder, ``flowrl.data.preferences``) it trains on the records' ``chosen`` images without
rollouts.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.objectives.batch import TrainBatch, mean_elems
from flowrl.objectives.old_policy import OldUpdate, check_positive
from flowrl.objectives.pairs import LOGIT_NORMAL_FORWARD
from flowrl.objectives.regression import forward_batch, velocity_at
from flowrl.types import LossOut

TRAINS_ON = LOGIT_NORMAL_FORWARD


@dataclass
class Config:
    top_k: int = 1                    # rows kept per group (flow_grpo: the argmax)
    logit_mean: float = 0.0           # σ ~ logit-normal(mean, std) on [0, sigma_range]
    logit_std: float = 1.0
    sigma_range: float = 0.99
    samples_per_row: int = 1          # σ draws per row per step
    train_guidance: float | None = 1.0
    data: str | None = None           # offline: a demonstration / preference JSONL (its chosen images)
    old_update: OldUpdate = "on_policy"

    def __post_init__(self):
        check_positive("sft", top_k=self.top_k, logit_std=self.logit_std, sigma_range=self.sigma_range,
                       samples_per_row=self.samples_per_row)


def trains_on(cfg: Config):
    if cfg.data is None:
        return LOGIT_NORMAL_FORWARD
    from flowrl.objectives.offline import OfflineSource

    return OfflineSource(cfg.data, "images", LOGIT_NORMAL_FORWARD)


def top_k_mask(scores: Tensor, group_ids: Tensor, k: int) -> Tensor:
    """A (N,) float: 1 where a finite score is ≥ the k-th largest finite score of its group, else 0; NaN stays NaN."""
    out = torch.where(torch.isfinite(scores), torch.zeros_like(scores), scores)
    for g in group_ids.unique():
        rows = torch.nonzero((group_ids == g) & torch.isfinite(scores)).flatten()
        if rows.numel():
            kth = scores[rows].sort(descending=True).values[min(k, rows.numel()) - 1]
            out[rows] = (scores[rows] >= kth).to(out.dtype)
    return out


def prepare_advantages(adv: Tensor, group_ids: Tensor, cfg: Config | None = None, context=None) -> Tensor:
    """The top-k indicator per group (module docstring)."""
    return top_k_mask(adv.float(), group_ids, (cfg or Config()).top_k)


def loss(policy, batch: TrainBatch, cfg: Config | None = None) -> LossOut:
    cfg = cfg or Config()
    fb = forward_batch(batch, "sft")
    a = torch.nan_to_num(batch.advantages.float()).to(fb.x0.device) * fb.keep
    v_theta = velocity_at(policy, "train", fb, batch.cond, cfg.train_guidance, grad=True)
    err = mean_elems((v_theta - fb.v) ** 2)
    total = (a * err).sum() / fb.keep.sum().clamp(min=1.0)
    kept = a > 0
    fm = err[kept].mean().detach() if kept.any() else torch.tensor(0.0)
    return LossOut(total, {"policy_loss": total.detach(), "fm_loss_kept": fm, "kept_frac": kept.float().mean()})
