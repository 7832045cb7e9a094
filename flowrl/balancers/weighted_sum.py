"""Weighted sum, then group normalisation: the single-reward pipeline applied to S = Σ_k w_k R_k.

S_i = Σ_{k: R_ik finite} w_k R_ik,   A = (S − mean_group S) / (std S + eps)
DiffusionNFT / FlowAWR multi-reward (``flow_grpo/rewards.py`` ``multi_score``) and Flow-Factory's "sum"
aggregation; GRPO baseline of GDPO's README ("Original trl"). Inapplicable (NaN) rewards add nothing to S; a sample
with no applicable reward gets a NaN advantage.

Diagnostic ``alpha_<k>`` = w_k s_k / Σ_j w_j s_j, s_k the std of reward k's finite values: since
S − mean_group S = Σ_k w_k s_k Â_k with Â_k = (R_k − mean_group R_k)/s_k, this is the weight the sum puts
on reward k's own standardised advantage (exact when every reward applies to every sample). It shows the
implicit reweighting by reward scale that per-reward normalisation (GDPO, MARBLE) removes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

import torch
from torch import Tensor

from flowrl.balancers.advantages import StdMode, finite_std, group_advantages, saturate
from flowrl.balancers.common import alpha_diagnostics, check_inputs, on_cpu, weighted_total
from flowrl.config.validate import check_range

NEEDS_REWARD_GRADIENTS = False       # the rewards alone (flowrl.contracts.Balancer)


@dataclass
class Config:
    std: StdMode = "global"  # NFT / Flow-GRPO default (sample.global_std=True); "group" for Wan-style configs
    eps: float = 1e-4        # > 0: with 0 a group without spread would divide 0 by 0
    unbiased: bool = False   # numpy population std, as the anchors' stat tracker

    def __post_init__(self):
        if self.std not in get_args(StdMode):
            raise ValueError(f"weighted_sum std must be one of {list(get_args(StdMode))}, got {self.std!r}")
        check_range("weighted_sum eps", self.eps, gt=0)


@on_cpu
def balance(R: Tensor, group_ids: Tensor, weights=None, state: dict | None = None,
            cfg: Config | None = None, services=None) -> tuple[Tensor, dict]:
    cfg = cfg or Config()
    w = check_inputs(R, group_ids, weights).double()
    S = weighted_total(R, w)
    adv = saturate(group_advantages(S, group_ids, std=cfg.std, eps=cfg.eps, unbiased=cfg.unbiased), R.dtype)
    return adv, {"combined_reward_mean": torch.nanmean(S).detach(), **effective_weights(R, w, cfg.unbiased)}


def effective_weights(R: Tensor, w: Tensor, unbiased: bool) -> dict:
    """``alpha_<k>`` = w_k s_k / Σ_j w_j s_j (module docstring); w_k / Σ w when no reward has any spread."""
    ws = torch.stack([w[k].double() * finite_std(R[:, k].double(), unbiased) for k in range(R.shape[1])])
    return alpha_diagnostics(ws) or alpha_diagnostics(w)
