"""MARBLE — multi-aspect reward balance by a min-norm simplex QP, amortized (arXiv 2605.06507;
aim-uofa/MARBLE@1bf9543 train.py "Amortized MGDA", pre-release snapshot).

Per-reward advantages A_k = (R_k − mean_prompt R_k) / (std_all_valid R_k + 1e-4), NaN where inapplicable.
Given the K×K Gram matrix of per-reward loss gradients G_kl = g_k·g_l (asked of the loop through
``services.reward_gram(A_k)`` every ``solve_every`` calls: K extra backward passes; or ``proxy_gram``), with
cosine normalisation M_kl = G_kl/(|g_k||g_l|):

    α_new = argmin_{α∈Δ_K, α≥floor} ½ αᵀMα           (``min_norm.solve_min_norm``)
    α ← ρ·α + (1−ρ)·α_new                            (EMA, ρ = alpha_ema_decay = 0.7; first solve: α = α_new)
    A_i = Σ_k α_k · nan_to_num(A_k,i)                 (one backward reproduces Σ_k α_k ∇L(A_k), MARBLE)

Exactness needs Σα = 1 and a loss affine in A (NFT, AWR, AWM here). Rewards with a zero or non-finite
gradient norm get α = 0. ``apply="rescaled"`` fixes MARBLE's caveat (α solved on normalised gradients but
applied to raw ones) by α_k ← (α_k/|g_k|)/Σ_j(α_j/|g_j|). Static ``weights`` are folded into α and
renormalised so Σα = 1 stays true. State keys: ``alpha`` (K,), ``calls``, ``solves``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from flowrl.balancers.advantages import StdMode
from flowrl.balancers.common import any_finite, check_inputs, check_mixing_weights, on_cpu, per_reward_advantages
from flowrl.balancers.min_norm import solve_min_norm
from flowrl.balancers.services import NoServices, gradient_gram
from flowrl.config.validate import check_range

NEEDS_REWARD_GRADIENTS = True        # asks services.reward_gram (flowrl.contracts.Balancer)
__all__ = ["Config", "NEEDS_REWARD_GRADIENTS", "balance", "gradient_gram", "needs_gram", "proxy_gram",
           "reward_advantages", "solve_alpha"]


@dataclass
class Config:
    std: StdMode = "global"          # per reward: Flow-GRPO's group mean, std over the batch (global_std=True)
    eps: float = 1e-4
    unbiased: bool = False
    alpha_ema_decay: float = 0.7     # ρ; 0 = no smoothing
    alpha_floor: float = 0.0
    solver: Literal["exact", "frank_wolfe"] = "exact"   # MARBLE uses SLSQP; "exact" solves the same QP exactly
    normalize: bool = True           # solve on cosine Gram (normalised gradients), as MARBLE
    apply: Literal["raw", "rescaled"] = "raw"   # "raw" (MARBLE as released) | "rescaled" (consistent w/ normalize)
    solve_every: int = 10            # amortize_every_n: a fresh Gram every N calls
    warmup: int = 1                  # calls < warmup always solve

    def __post_init__(self):
        for name, allowed in (("std", get_args(StdMode)), ("solver", ("exact", "frank_wolfe")),
                              ("apply", ("raw", "rescaled"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"marble {name} must be one of {list(allowed)}, got {getattr(self, name)!r}")
        check_range("marble eps", self.eps, gt=0)
        check_range("marble alpha_ema_decay", self.alpha_ema_decay, ge=0, lt=1)
        check_range("marble alpha_floor", self.alpha_floor, ge=0, le=1)
        check_range("marble solve_every", self.solve_every, ge=1)
        check_range("marble warmup", self.warmup, ge=0)


def needs_gram(state: dict, cfg: Config | None = None) -> bool:
    """Whether the next ``balance`` call should be given a fresh Gram matrix (amortized schedule)."""
    cfg = cfg or Config()
    calls = state.get("calls", 0)
    return "alpha" not in state or calls < cfg.warmup or calls % cfg.solve_every == 0


def proxy_gram(A: Tensor, sample_weight: Tensor) -> Tensor:
    """On-policy output-space Gram proxy (our derivation, not in MARBLE's code): G_kl = Σ_i s_i A_ik A_il,
    s_i = 4t⁴|v_old,i − v_i|²/w_i² for NFT-type losses. A (N, K) with NaN → 0; s (N,) ≥ 0."""
    A0 = torch.nan_to_num(A.double(), nan=0.0)
    return A0.T @ (A0 * sample_weight.double().unsqueeze(1))


def reward_advantages(R: Tensor, group_ids: Tensor, cfg: Config | None = None) -> Tensor:
    """The per-reward advantages A_k (N, K) this balancer mixes (NaN where a reward does not apply)."""
    cfg = cfg or Config()
    return per_reward_advantages(R, group_ids, std=cfg.std, eps=cfg.eps, unbiased=cfg.unbiased)


def solve_alpha(gram: Tensor, cfg: Config) -> Tensor:
    """α (K,) from a raw Gram matrix: drop zero/non-finite rewards, normalise, solve, optionally rescale."""
    G = gram.double()
    norms2 = torch.diagonal(G).clone()
    ok = torch.isfinite(norms2) & (norms2 > 1e-24) & torch.isfinite(G).all(dim=1)
    alpha = torch.zeros(G.shape[0], dtype=torch.float64)
    if not ok.any():
        return torch.full_like(alpha, 1.0 / G.shape[0])
    idx = torch.nonzero(ok).flatten()
    Gs = G[idx][:, idx]
    norm = norms2[idx].sqrt()
    M = Gs / (norm[:, None] * norm[None, :]) if cfg.normalize else Gs
    a = solve_min_norm(M, cfg.solver, cfg.alpha_floor)
    if cfg.apply == "rescaled" and cfg.normalize:
        a = (a / norm) / (a / norm).sum()
    elif cfg.apply not in ("raw", "rescaled"):
        raise ValueError(f"marble apply must be 'raw' or 'rescaled', got {cfg.apply!r}")
    alpha[idx] = a
    return alpha


@on_cpu
def balance(R: Tensor, group_ids: Tensor, weights=None, state: dict | None = None,
            cfg: Config | None = None, services=None) -> tuple[Tensor, dict]:
    cfg = cfg or Config()
    state = {} if state is None else state
    w = check_inputs(R, group_ids, weights).double()
    check_mixing_weights(w, "marble")
    K = R.shape[1]
    A_k = per_reward_advantages(R, group_ids, std=cfg.std, eps=cfg.eps, unbiased=cfg.unbiased)
    gram = None
    if needs_gram(state, cfg):
        gram = (services or NoServices()).reward_gram(A_k).detach().cpu().double()
        if gram.shape != (K, K):
            raise ValueError(f"gram must be ({K}, {K}) for {K} rewards, got {tuple(gram.shape)}")
        new = solve_alpha(gram, cfg)
        old = state.get("alpha")
        rho = cfg.alpha_ema_decay
        state["alpha"] = new if old is None else rho * old.double() + (1 - rho) * new
        state["solves"] = state.get("solves", 0) + 1
    state["calls"] = state.get("calls", 0) + 1
    alpha = state.get("alpha", torch.full((K,), 1.0 / K, dtype=torch.float64))
    mixed = alpha * w
    mixed = mixed / mixed.sum() if mixed.sum() > 0 else w / w.sum()   # α zero on every weighted reward
    adv = (torch.nan_to_num(A_k.double(), nan=0.0) * mixed).sum(dim=1).to(R.dtype)
    adv = torch.where(any_finite(R), adv, torch.full_like(adv, float("nan")))
    diag = {f"alpha_{k}": mixed[k].float() for k in range(K)}
    diag["solved"] = torch.tensor(float(gram is not None))
    return adv, diag
