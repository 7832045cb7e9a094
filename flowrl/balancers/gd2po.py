"""GD²PO — conflict-aware masking and query reweighting (Qwen-Applications/GD2PO@f1ad765
tool-calling/verl/trainer/ppo/ray_trainer.py), per rollout i with per-reward advantages
a_k = Â_k (group mean / unbiased group std, eps 1e-4; NaN → 0):

    conflict_i = (∃k a_k > 1e-8) ∧ (∃k a_k < −1e-8)
    hard  (gdpo_filter_group_ratio):               keep_i = ¬conflict_i
    ratio (gdpo_filter_ratio_conflict_group_ratio): ρ_i = Σ_k a_k / (Σ_k |a_k| + 1e-8);
                                                    keep_i = ¬(conflict_i ∧ |ρ_i| < τ)
    q_p = (#kept in group p) / G_p,     S_i = q_p · Σ_k w_k a_k
    A = masked_whiten(S, keep) = (S − mean_kept S) / sqrt(var_kept S + 1e-8)  on kept rollouts, 0 on dropped
τ = 0.2 (the config default; the scripts use 0.8). verl's masked variance is unbiased. A rollout with no
applicable reward is dropped. Diagnostic ``alpha_<k>`` = w_k / Σ_j w_j, the weight on a kept rollout's a_k
(the masking and q_p act on rollouts, not on rewards).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from flowrl.balancers.advantages import saturate
from flowrl.balancers.common import (
    alpha_diagnostics,
    any_finite,
    check_inputs,
    group_index,
    on_cpu,
    per_reward_advantages,
)
from flowrl.config.validate import check_range

NEEDS_REWARD_GRADIENTS = False       # the rewards alone (flowrl.contracts.Balancer)


@dataclass
class Config:
    mode: Literal["hard", "ratio"] = "ratio"       # "hard" | "ratio"
    tau: float = 0.2
    eps: float = 1e-4
    unbiased: bool = True

    def __post_init__(self):
        if self.mode not in ("hard", "ratio"):
            raise ValueError(f"gd2po mode must be 'hard' or 'ratio', got {self.mode!r}")
        check_range("gd2po tau", self.tau, ge=0, le=1)
        check_range("gd2po eps", self.eps, gt=0)


def keep_mask(a: Tensor, cfg: Config) -> Tensor:
    """(N,) bool: rollouts whose per-reward advantages a (N, K) do not conflict (or agree strongly enough)."""
    conflict = (a > 1e-8).any(1) & (a < -1e-8).any(1)
    if cfg.mode == "hard":
        return ~conflict
    if cfg.mode == "ratio":
        rho = a.sum(1) / (a.abs().sum(1) + 1e-8)
        return ~(conflict & (rho.abs() < cfg.tau))
    raise ValueError(f"gd2po mode must be 'hard' or 'ratio', got {cfg.mode!r}")


def masked_whiten(x: Tensor, keep: Tensor, shift_mean: bool = True) -> Tensor:
    """(x − mean_keep x)·rsqrt(var_keep x + 1e-8) on kept entries (unbiased var), 0 elsewhere (verl)."""
    v = x[keep]
    if v.numel() == 0:
        return torch.zeros_like(x)
    mean = v.mean()
    var = v.var(unbiased=True) if v.numel() > 1 else torch.zeros((), dtype=x.dtype)
    out = (x - mean if shift_mean else x) * torch.rsqrt(var + 1e-8)
    return torch.where(keep, out, torch.zeros_like(out))


@on_cpu
def balance(R: Tensor, group_ids: Tensor, weights=None, state: dict | None = None,
            cfg: Config | None = None, services=None) -> tuple[Tensor, dict]:
    cfg = cfg or Config()
    w = check_inputs(R, group_ids, weights).double()
    a = torch.nan_to_num(per_reward_advantages(R, group_ids, std="group", eps=cfg.eps,
                                               unbiased=cfg.unbiased).double(), nan=0.0)
    keep = keep_mask(a, cfg) & any_finite(R)
    inv, n = group_index(group_ids)
    kept = torch.zeros(n, dtype=torch.float64).index_add_(0, inv, keep.double())
    size = torch.zeros(n, dtype=torch.float64).index_add_(0, inv, torch.ones_like(keep, dtype=torch.float64))
    q = (kept / size)[inv]
    S = q * (a * w).sum(1)
    adv = saturate(masked_whiten(S, keep), R.dtype)
    return adv, {"drop_frac": 1 - keep.double().mean().float(), "keep": keep, **alpha_diagnostics(w)}
