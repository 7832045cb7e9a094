"""GDPO — reward-decoupled normalisation (NVlabs/GDPO@41f74c5 trl grpo_trainer.py).

Â_k = (R_k − mean_group R_k) / (std_group R_k + eps)     (torch std, unbiased; eps 1e-4)
S   = Σ_k w_k Â_k,   A = BN(S) = (S − mean_all S) / (std_all S + eps)
Deviation, named: GDPO applies ``nan_to_num`` to R (an inapplicable reward counts as 0); here a NaN reward is
masked in its own column's statistics and contributes Â_k = 0 to S (rows with no applicable reward → NaN).
Diagnostic ``alpha_<k>`` = w_k / Σ_j w_j, the weight on reward k's standardised advantage (BN rescales S as a
whole and shifts it by a constant, which leaves the relative weights as they are).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.balancers.advantages import batch_normalize, saturate
from flowrl.balancers.common import alpha_diagnostics, any_finite, check_inputs, on_cpu, per_reward_advantages
from flowrl.config.validate import check_range

NEEDS_REWARD_GRADIENTS = False       # the rewards alone (flowrl.contracts.Balancer)


@dataclass
class Config:
    eps: float = 1e-4
    unbiased: bool = True

    def __post_init__(self):
        check_range("gdpo eps", self.eps, gt=0)


def decoupled_sum(R: Tensor, group_ids: Tensor, w: Tensor, cfg: Config) -> Tensor:
    """S = Σ_k w_k Â_k with NaN entries contributing 0; NaN rows where no reward applies."""
    A_k = per_reward_advantages(R, group_ids, std="group", eps=cfg.eps, unbiased=cfg.unbiased).double()
    S = (torch.nan_to_num(A_k, nan=0.0) * w.double()).sum(dim=1)         # float64: any finite weights
    return torch.where(any_finite(R), S, torch.full_like(S, float("nan")))


@on_cpu
def balance(R: Tensor, group_ids: Tensor, weights=None, state: dict | None = None,
            cfg: Config | None = None, services=None) -> tuple[Tensor, dict]:
    cfg = cfg or Config()
    w = check_inputs(R, group_ids, weights)
    S = decoupled_sum(R, group_ids, w, cfg)
    diag = {"sum_std": torch.nan_to_num(S).std().detach() if S.numel() > 1 else torch.zeros((), dtype=S.dtype)}
    diag.update(alpha_diagnostics(w))
    return saturate(batch_normalize(S, eps=cfg.eps, unbiased=cfg.unbiased), R.dtype), diag
