"""SA-MRPO — saturation-aware reweighting of decoupled per-reward advantages, as SA-GDPO in the NVlabs/GDPO trl
fork (@41f74c5 trl/trainer/grpo_trainer.py ``apply_sa_gdpo``; the SA-MRPO paper's code is not public):

    s_k  = clamp( (mean R_k − R_k^min) / max(R_k^max − R_k^min, 1e-4), 0, 1 )     (batch saturation)
    w'_k = w_k · (1 − s_k)^γ,     A = BN( Σ_k w'_k Â_k )                           (γ = 1)
Â_k as in GDPO (group mean, unbiased group std, eps 1e-4). R^min/R^max are the user's per-reward bounds; when
not given, the batch's own finite min/max are used (a named deviation: then s_k measures position within the
batch range, not saturation against a known ceiling). NaN rewards are masked per reward. Diagnostic
``alpha_<k>`` = w'_k / Σ_j w'_j, the weight on reward k's standardised advantage (as for GDPO).
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
    gamma: float = 1.0
    reward_min: tuple[float, ...] | None = None
    reward_max: tuple[float, ...] | None = None
    eps: float = 1e-4
    unbiased: bool = True

    def __post_init__(self):
        check_range("sa_mrpo gamma", self.gamma, ge=0)
        check_range("sa_mrpo eps", self.eps, gt=0)
        if self.reward_min is not None and self.reward_max is not None:
            if len(self.reward_min) != len(self.reward_max) or any(
                    not lo < hi for lo, hi in zip(self.reward_min, self.reward_max)):
                raise ValueError(f"sa_mrpo reward_min must be below reward_max, one pair per reward, got "
                                 f"{list(self.reward_min)} and {list(self.reward_max)}")


def saturation(R: Tensor, cfg: Config) -> Tensor:
    """s_k (K,) in [0, 1] from the finite entries of each column."""
    K = R.shape[1]
    out = torch.zeros(K, dtype=torch.float64)
    for k in range(K):
        col = R[:, k][torch.isfinite(R[:, k])].double()
        if col.numel() == 0:
            continue
        lo = float(cfg.reward_min[k]) if cfg.reward_min is not None else float(col.min())
        hi = float(cfg.reward_max[k]) if cfg.reward_max is not None else float(col.max())
        out[k] = ((col.mean() - lo) / max(hi - lo, 1e-4)).clamp(0, 1)
    return out


@on_cpu
def balance(R: Tensor, group_ids: Tensor, weights=None, state: dict | None = None,
            cfg: Config | None = None, services=None) -> tuple[Tensor, dict]:
    cfg = cfg or Config()
    w = check_inputs(R, group_ids, weights).double()
    for name in ("reward_min", "reward_max"):
        bound = getattr(cfg, name)
        if bound is not None and len(bound) != R.shape[1]:
            raise ValueError(f"sa_mrpo {name} has {len(bound)} entries for {R.shape[1]} rewards; give one per reward")
    s = saturation(R, cfg)
    w_eff = w * (1 - s) ** cfg.gamma
    A_k = per_reward_advantages(R, group_ids, std="group", eps=cfg.eps, unbiased=cfg.unbiased)
    S = (torch.nan_to_num(A_k.double(), nan=0.0) * w_eff).sum(dim=1)
    S = torch.where(any_finite(R), S, torch.full_like(S, float("nan")))
    diag = {f"saturation_{k}": s[k].float() for k in range(R.shape[1])}
    diag.update({f"weight_{k}": w_eff[k].float() for k in range(R.shape[1])})
    diag.update(alpha_diagnostics(w_eff))
    return saturate(batch_normalize(S, eps=cfg.eps, unbiased=cfg.unbiased), R.dtype), diag
