"""DiffusionNFT — online diffusion RL on the forward process (Zheng et al., arXiv 2509.16117;
NVlabs/DiffusionNFT@24af555 scripts/train_nft_sd3.py L862–971).

Per stored clean latent x0, training σ = t and fresh ε:
    x_t = (1−t)x0 + tε,  v = ε − x0,  v_old = v_{θ_old}(x_t) (adapter "old", no grad),  v_θ (adapter "train")
    r   = clamp(clamp(A, −C, C)/C/2 + 1/2, 0, 1)                      (optimality probability, C = 5)
    v⁺  = β v_θ + (1−β) sg(v_old),   v⁻ = (1+β) sg(v_old) − β v_θ     (implicit positive / negative policies)
    x̂0^± = x_t − t v^±,   w^± = sg(mean|x̂0^± − x0|) ∨ 1e-5,   L^± = mean (x̂0^± − x0)² / w^±
    policy = mean_B  C·[r L⁺ + (1−r) L⁻] / β,      kl = mean_B mean (v_θ − v_ref)²   (v_ref: adapters off)
    loss   = policy + β_KL · kl
Two betas: ``beta`` is NFT's β (inverse step size of the implicit policies: 1.0, 0.1 for OCR / multi-reward),
``beta_kl`` the weight of the KL to the frozen base (1e-4).
With equal weights the policy loss equals (Cβt²/w)·|v_θ − v_tgt|² + const, v_tgt = v_old + A/(Cβ)·(v − v_old)
(the anchor's L862–971), i.e. the shared rectified regression with c = A/(Cβ); ``form="target"`` trains exactly that.
The loss is affine in A for |A| ≤ C (what MARBLE's amortized α relies on). Rollouts are CFG-free
(guidance 1.0, the recipe's ``sampler.guidance``); training forwards use the conditional branch only
(``train_guidance=1.0``). NFT trains on the forward process of the rollouts' clean latents (``TRAINS_ON``) at
per-sample permuted σ's (99 % of the schedule, ``timesteps``), and samples from the soft-updated "old" adapter
(``old_update = nft``: η = min(0.001·step, 0.5)) — ``objective: {kind: nft}`` alone is DiffusionNFT.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from flowrl.config.loader import nested_plugin
from flowrl.objectives.batch import TrainBatch, masked_mean, mean_elems
from flowrl.objectives.old_policy import OldUpdate, check_positive
from flowrl.objectives.regression import (
    anchor_penalty,
    forward_batch,
    rectified_regression,
    velocity_at,
    x0_abs_weight,
    x0_prediction,
)
from flowrl.objectives.sources import FORWARD_PROCESS
from flowrl.types import LossOut

TRAINS_ON = FORWARD_PROCESS
TIMESTEPS = "flowrl.objectives.timesteps:TIMESTEPS"
ADV_MODES = ("all", "positive_only", "negative_only", "one_only", "binary")


@dataclass
class Config:
    beta: float = 1.0             # NFT β (config.beta); 0.1 for OCR and multi-reward
    beta_kl: float = 1e-4         # KL to the frozen base (config.train.beta)
    adv_clip_max: float = 5.0     # C
    adv_mode: str = "all"         # "all" | "positive_only" | "negative_only" | "one_only" | "binary"
    adaptive_weight: bool = True  # w^± as above; False → w = 1
    form: str = "two_branch"      # "two_branch" (the anchor's loss) | "target" (closed-form rectified regression)
    train_guidance: float | None = 1.0   # CFG-free training forwards
    min_weight: float = 1e-5
    timesteps: Any = nested_plugin(TIMESTEPS, "permuted")   # per-sample permuted 99 % of the schedule
    old_update: OldUpdate = "nft"     # decay_type 1: η = min(0.001·step, 0.5)

    def __post_init__(self):
        check_positive("nft", beta=self.beta, adv_clip_max=self.adv_clip_max)
        if self.adv_mode not in ADV_MODES:
            raise ValueError(f"nft adv_mode must be one of {ADV_MODES}, got {self.adv_mode!r}")
        if self.form not in ("two_branch", "target"):
            raise ValueError(f"nft form must be 'two_branch' or 'target', got {self.form!r}")


def optimality_probability(adv: Tensor, clip_max: float = 5.0, mode: str = "all") -> Tensor:
    """r = clamp(A'/C/2 + 1/2, 0, 1), A' = clamp(A, −C, C) after the ``adv_mode`` transform (L910–929)."""
    a = adv.clamp(-clip_max, clip_max)
    if mode == "positive_only":
        a = a.clamp(min=0)
    elif mode == "negative_only":
        a = a.clamp(max=0)
    elif mode == "one_only":
        a = torch.where(a > 0, torch.ones_like(a), torch.zeros_like(a))
    elif mode == "binary":
        a = torch.sign(a)
    return (a / clip_max / 2 + 0.5).clamp(0, 1)


def two_branch_loss(v_theta: Tensor, v_old: Tensor, x_t: Tensor, t: Tensor, x0: Tensor, r: Tensor,
                    cfg: Config) -> Tensor:
    """Per-sample C·[r L⁺ + (1−r) L⁻]/β with the implicit velocities (module docstring). (B,)"""
    v_old = v_old.detach()
    v_pos = cfg.beta * v_theta + (1 - cfg.beta) * v_old
    v_neg = (1 + cfg.beta) * v_old - cfg.beta * v_theta
    x0_pos, x0_neg = x0_prediction(x_t, t, v_pos), x0_prediction(x_t, t, v_neg)
    ones = torch.ones_like(t)
    w_pos = x0_abs_weight(x0_pos, x0, cfg.min_weight) if cfg.adaptive_weight else ones
    w_neg = x0_abs_weight(x0_neg, x0, cfg.min_weight) if cfg.adaptive_weight else ones
    l_pos = mean_elems((x0_pos - x0) ** 2) / w_pos
    l_neg = mean_elems((x0_neg - x0) ** 2) / w_neg
    return cfg.adv_clip_max * (r * l_pos + (1 - r) * l_neg) / cfg.beta


def target_loss(v_theta: Tensor, v_old: Tensor, v: Tensor, x_t: Tensor, t: Tensor, x0: Tensor, r: Tensor,
                cfg: Config) -> Tensor:
    """Per-sample (Cβt²/w)·|v_θ − v_old − (2r−1)/β·(v − v_old)|², w from x̂0_θ. (B,)"""
    w = x0_abs_weight(x0_prediction(x_t, t, v_theta), x0, cfg.min_weight) if cfg.adaptive_weight else 1.0
    weight = cfg.adv_clip_max * cfg.beta * t**2 / w
    return rectified_regression(v_theta, v_old, v, (2 * r - 1) / cfg.beta, weight)


def loss(policy, batch: TrainBatch, cfg: Config | None = None) -> LossOut:
    cfg = cfg or Config()
    fb = forward_batch(batch, "nft")
    x0, t, x_t, keep = fb.x0, fb.t, fb.x_t, fb.keep
    r = optimality_probability(torch.nan_to_num(batch.advantages.float()), cfg.adv_clip_max, cfg.adv_mode)
    r = r.to(x0.device)
    v_old = velocity_at(policy, "old", fb, batch.cond, cfg.train_guidance)
    v_theta = velocity_at(policy, "train", fb, batch.cond, cfg.train_guidance, grad=True)
    if cfg.form == "two_branch":
        per = two_branch_loss(v_theta, v_old, x_t, t, x0, r, cfg)
    else:
        per = target_loss(v_theta, v_old, fb.v, x_t, t, x0, r, cfg)
    policy_loss = masked_mean(per, keep)
    total, metrics = policy_loss, {"policy_loss": policy_loss.detach()}
    if cfg.beta_kl > 0:
        kl = anchor_penalty(policy, None, fb, batch.cond, cfg.train_guidance, v_theta)
        total = total + cfg.beta_kl * kl
        metrics["kl"] = kl.detach()
    metrics["old_deviation"] = masked_mean(mean_elems((v_theta - v_old) ** 2), keep).detach()
    metrics["r_mean"] = masked_mean(r, keep).detach()
    return LossOut(total, metrics)
