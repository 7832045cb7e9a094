"""DARA — density-aware reweighting by inverse-sqrt active-group density (zhaihaotian/DARA@0459102
math/rdgdpo/advantages.py, @54024d0 docs/ALGORITHMS.md):

    active[p,k] = Σ_g |Â_k[p,g]| > τ   (τ = 1e-8),     π_k = mean_p active[p,k]
    w_k = min(w_max, sqrt(max_j π_j / π_k))  if π_k > 0 else 1          (w_max = 5)
    sym:  S = Σ_k w_k Â_k
    asym: S = Σ_k [ Â_k + (w_k − 1)·max(Â_k, 0) ]     (main variant: amplify positive advantages only)
    A = BN(S)   (GDPO normalisation, unbiased std, eps 1e-6)
Â_k: group mean / unbiased group std (eps 1e-6). π_k averages over the groups where reward k applies (NaN rewards
masked). Static ``weights`` scale Â_k first (DARA itself has none; default 1). Diagnostic ``alpha_<k>`` =
w_k w^static_k / Σ_j w_j w^static_j for ``sym`` (the weight on Â_k); ``asym`` weighs a reward's positive and
negative advantages differently (w_k vs 1), so no single per-reward weight exists and none is reported.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from flowrl.balancers.advantages import batch_normalize, saturate
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
    variant: Literal["asym", "sym"] = "asym"     # "asym" (main) | "sym"
    w_max: float = 5.0
    tau: float = 1e-8
    eps: float = 1e-6
    unbiased: bool = True

    def __post_init__(self):
        if self.variant not in ("asym", "sym"):
            raise ValueError(f"dara variant must be 'asym' or 'sym', got {self.variant!r}")
        check_range("dara w_max", self.w_max, ge=1)
        check_range("dara tau", self.tau, ge=0)
        check_range("dara eps", self.eps, gt=0)


def active_density(A_k: Tensor, group_ids: Tensor, tau: float) -> Tensor:
    """π_k (K,): the fraction of groups (where reward k applies) whose advantages are not all ~0."""
    inv, n = group_index(group_ids)
    K = A_k.shape[1]
    pi = torch.zeros(K, dtype=torch.float64)
    for k in range(K):
        col = A_k[:, k].double()
        fin = torch.isfinite(col)
        mass = torch.zeros(n, dtype=torch.float64).index_add_(0, inv[fin], col[fin].abs())
        applies = torch.zeros(n, dtype=torch.bool).index_put_((inv[fin],), torch.ones_like(inv[fin], dtype=torch.bool))
        if applies.any():
            pi[k] = (mass[applies] > tau).double().mean()
    return pi


def density_weights(pi: Tensor, w_max: float) -> Tensor:
    """w_k = min(w_max, sqrt(max π / π_k)), 1 where π_k = 0."""
    top = pi.max()
    return torch.where(pi > 0, (top / pi.clamp(min=1e-300)).sqrt().clamp(max=w_max), torch.ones_like(pi))


@on_cpu
def balance(R: Tensor, group_ids: Tensor, weights=None, state: dict | None = None,
            cfg: Config | None = None, services=None) -> tuple[Tensor, dict]:
    cfg = cfg or Config()
    if cfg.variant not in ("asym", "sym"):
        raise ValueError(f"dara variant must be 'asym' or 'sym', got {cfg.variant!r}")
    w_static = check_inputs(R, group_ids, weights).double()
    A_k = per_reward_advantages(R, group_ids, std="group", eps=cfg.eps, unbiased=cfg.unbiased).double()
    pi = active_density(A_k, group_ids, cfg.tau)
    w = density_weights(pi, cfg.w_max)
    A0 = torch.nan_to_num(A_k, nan=0.0) * w_static
    S = (A0 * w).sum(1) if cfg.variant == "sym" else (A0 + (w - 1) * A0.clamp(min=0)).sum(1)
    S = torch.where(any_finite(R), S, torch.full_like(S, float("nan")))
    diag = {f"density_{k}": pi[k].float() for k in range(R.shape[1])}
    diag.update({f"weight_{k}": w[k].float() for k in range(R.shape[1])})
    if cfg.variant == "sym":
        diag.update(alpha_diagnostics(w * w_static))
    return saturate(batch_normalize(S, eps=cfg.eps, unbiased=cfg.unbiased), R.dtype), diag
