"""Weighted sum, then group normalisation: the single-reward pipeline applied to S = Σ_k w_k R_k.

S_i = Σ_{k: R_ik finite} w_k R_ik,   A = (S − mean_group S) / (std S + eps)
DiffusionNFT / FlowAWR multi-reward (``multi_score``, reference B §1.8) and Flow-Factory's "sum"
aggregation; GRPO baseline of GDPO's README (B §5.1). Inapplicable (NaN) rewards add nothing to S; a sample
with no applicable reward gets a NaN advantage.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.balancers.advantages import group_advantages
from flowrl.balancers.common import any_finite, check_inputs, on_cpu


@dataclass
class Config:
    std: str = "global"      # NFT / Flow-GRPO default (sample.global_std=True); "group" for Wan-style configs
    eps: float = 1e-4
    unbiased: bool = False   # numpy population std, as the anchors' stat tracker


@on_cpu
def balance(R: Tensor, group_ids: Tensor, weights=None, state: dict | None = None,
            cfg: Config | None = None, services=None) -> tuple[Tensor, dict]:
    cfg = cfg or Config()
    w = check_inputs(R, group_ids, weights)
    S = torch.where(torch.isfinite(R), R * w, torch.zeros_like(R)).sum(dim=1)
    S = torch.where(any_finite(R), S, torch.full_like(S, float("nan")))
    adv = group_advantages(S, group_ids, std=cfg.std, eps=cfg.eps, unbiased=cfg.unbiased)
    return adv, {"combined_reward_mean": torch.nanmean(S).detach()}
