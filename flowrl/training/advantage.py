"""The advantage stage: R (N, K) → A (N,) through the configured balancer, then the objective's own mapping.

Groups are the iteration's prompts (rows p·G … p·G + G − 1 share prompt p); a group may span processes, and
every process computes the same A from the gathered R. ±inf rewards are treated as not applicable (NaN) here; a
sample whose advantage is not finite is left out of the update. A balancer that needs more than the rewards
(MARBLE's per-reward gradient Gram) asks ``services`` for it (``flowrl.balancers.services``).
"""
from __future__ import annotations

import torch
from torch import Tensor

from flowrl.balancers.advantages import zero_std_ratio


class AdvantageStage:
    def __init__(self, balancer, balancer_cfg, reward_weights: Tensor, objective, objective_cfg, state: dict, *,
                 prompts_per_iter: int, group_size: int):
        self.balancer, self.bcfg, self.weights = balancer, balancer_cfg, reward_weights
        self.objective, self.ocfg, self.state = objective, objective_cfg, state
        self.groups = torch.arange(prompts_per_iter).repeat_interleave(group_size)

    def run(self, R: Tensor, services) -> tuple[Tensor, dict]:
        """A (N,) for the whole iteration, and the advantage metrics."""
        finite = torch.where(torch.isinf(R), torch.full_like(R, float("nan")), R)
        adv, diag = self.balancer.balance(finite, self.groups, self.weights, self.state, self.bcfg,
                                          services=services)
        adv = self.objective.prepare_advantages(adv, self.groups, self.ocfg)
        total = torch.nansum(torch.where(torch.isfinite(finite), finite, torch.zeros_like(finite)), 1)
        metrics = {"adv/mean": torch.nanmean(adv), "adv/abs_mean": torch.nanmean(adv.abs()),
                   "adv/zero_std_frac": zero_std_ratio(total, self.groups)}
        metrics.update({f"adv/{k}": v for k, v in diag.items() if torch.as_tensor(v).numel() == 1})
        return adv, metrics
