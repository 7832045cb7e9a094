"""MC-GRPO — the median baseline on the weighted reward sum (lotusroot-kim/MC-GRPO;
``advantages.median_advantages``).

    S_i = Σ_{k: R_ik finite} w_k R_ik,   m_p = median_{i∈p} S_i,   MAD_p = median_{i∈p} |S_i − m_p| + mad_eps
    A_i = (S_i − m_p) / MAD_p,  nonzero A of a group × n_p / #nonzero (compensate),  the median rollout → NaN

Sample G + 1 rollouts per prompt (train.group_size = G + 1): the median one carries no signal and is dropped
from the loss (a NaN advantage is never trained on), so G rollouts backpropagate. Robust to a few outlying
rewards, where the mean/std baseline is pulled by them. Computed in float64; |A| saturates at the float32
maximum when an outlier near 3e38 meets a tiny MAD (the objective clips at adv_clip_max anyway).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.balancers.advantages import median_advantages, saturate
from flowrl.balancers.common import check_inputs, on_cpu, weighted_total

NEEDS_REWARD_GRADIENTS = False       # the rewards alone (flowrl.contracts.Balancer)


@dataclass
class Config:
    mad_eps: float = 1e-3
    compensate: bool = True           # scale the nonzero advantages by n_p / #nonzero

    def __post_init__(self):
        if not self.mad_eps > 0:
            raise ValueError(f"mc_grpo mad_eps must be > 0 (it divides the advantages), got {self.mad_eps}")


@on_cpu
def balance(R: Tensor, group_ids: Tensor, weights=None, state: dict | None = None,
            cfg: Config | None = None, services=None) -> tuple[Tensor, dict]:
    cfg = cfg or Config()
    w = check_inputs(R, group_ids, weights).double()
    S = weighted_total(R, w)
    adv, keep = median_advantages(S, group_ids, mad_eps=cfg.mad_eps, compensate=cfg.compensate)
    adv = saturate(torch.where(keep, adv, torch.full_like(adv, float("nan"))), R.dtype)
    return adv, {"dropped_median": (~keep & torch.isfinite(S)).float().sum()}
