"""AWM — Advantage Weighted Matching, the on-policy limit of the rectified regression (Xue et al.,
arXiv 2509.25050; scxue/advantage_weighted_matching@be51372 scripts/train_sd3_awm.py L210–252, L1293–1352).

Per sample, σ = t, fresh ε, x_t = (1−t)x0 + tε, v = ε − x0, m = mean (v_θ − v)² (float64):
    ρ(m)  = [(m + 1e-10)^p − (1e-10)^p]·t/p       ("ghuber", p = 0.25; "uniform": m, "t": t·m, "t2": t²·m)
    log p = −ρ(m),   ratio = exp(log p − sg(log p)) ≡ 1        (on-policy: old log-probs = detached current)
    A'    = clamp(A, −C, C)/C · advantage_max
    policy = mean_B max(−A'·ratio, −A'·clip(ratio, 1−ε, 1+ε))  ⇒  ∇ = mean_B A'·∇ρ(m)
    loss   = policy + β_ref·mean|v_θ − v_base|² + ema_beta·mean|v_θ − v_ema|²
Here the policy term is computed by the shared rectified regression with v_old = sg(v_θ), c = A' and
λ = sg(ρ'(m)), whose gradient is exactly A'·∇ρ(m) (the value differs from the PPO form's −A', which carries no
information). The AWM "ema" anchor is a slow copy of the trained weights; here it is the "old" adapter,
soft-updated with ``old_policy.awm_decay`` (η = min(0.001·step, 0.3)). Rollouts use the current policy.
Timesteps: 6 per micro-batch, stratified over the schedule (``timesteps: {kind: stratified, count: 6}``).
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
)
from flowrl.objectives.sources import FORWARD_PROCESS
from flowrl.types import LossOut

TRAINS_ON = FORWARD_PROCESS
TIMESTEPS = "flowrl.objectives.timesteps:TIMESTEPS"
WEIGHTINGS = ("ghuber", "uniform", "t", "t2")


@dataclass
class Config:
    adv_clip_max: float = 5.0
    advantage_max: float = 1.0
    weighting: str = "ghuber"
    ghuber_power: float = 0.25
    beta_ref: float = 1e-3         # GenEval (OCR 3e-3, PickScore 1e-4)
    ema_beta: float = 1.0          # pull toward the slow "old"/ema adapter
    train_guidance: float | None = 1.0
    timesteps: Any = nested_plugin(TIMESTEPS, "stratified")   # 6 stratified σ's per micro-batch
    old_update: OldUpdate = "awm"     # the slow "ema" anchor: η = min(0.001·step, 0.3)

    def __post_init__(self):
        check_positive("awm", adv_clip_max=self.adv_clip_max)
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"awm weighting must be one of {WEIGHTINGS}, got {self.weighting!r}")


def fm_penalty(m: Tensor, t: Tensor, cfg: Config) -> Tensor:
    """ρ(m) = −log p, the robust t-weighted flow-matching loss per sample (B,)."""
    if cfg.weighting == "ghuber":
        p = cfg.ghuber_power
        return ((m + 1e-10) ** p - 1e-10**p) * t / p
    scale = {"uniform": torch.ones_like(t), "t": t, "t2": t**2}[cfg.weighting]
    return m * scale


def fm_penalty_slope(m: Tensor, t: Tensor, cfg: Config) -> Tensor:
    """dρ/dm per sample (B,), detached: t·(m + 1e-10)^(p−1) for ghuber."""
    m = m.detach()
    if cfg.weighting == "ghuber":
        return t * (m + 1e-10) ** (cfg.ghuber_power - 1)
    return {"uniform": torch.ones_like(t), "t": t, "t2": t**2}[cfg.weighting]


def scaled_advantages(adv: Tensor, cfg: Config) -> Tensor:
    """A' = clamp(A, −C, C)/C · advantage_max."""
    return adv.clamp(-cfg.adv_clip_max, cfg.adv_clip_max) / cfg.adv_clip_max * cfg.advantage_max


def loss(policy, batch: TrainBatch, cfg: Config | None = None) -> LossOut:
    cfg = cfg or Config()
    fb = forward_batch(batch, "awm")
    adv = scaled_advantages(torch.nan_to_num(batch.advantages.float()), cfg).to(fb.x0.device)
    v_theta = velocity_at(policy, "train", fb, batch.cond, cfg.train_guidance, grad=True)
    m = mean_elems((v_theta.double() - fb.v.double()) ** 2)
    slope = fm_penalty_slope(m, fb.t.double(), cfg).float()
    per = rectified_regression(v_theta, v_theta.detach(), fb.v, adv, slope)
    policy_loss = masked_mean(per, fb.keep)
    total = policy_loss
    metrics = {"policy_loss": policy_loss.detach(), "fm_loss": masked_mean(m.float(), fb.keep).detach()}
    for name, adapter, weight in (("kl", None, cfg.beta_ref), ("ema_kl", "old", cfg.ema_beta)):
        if weight > 0:
            reg = anchor_penalty(policy, adapter, fb, batch.cond, cfg.train_guidance, v_theta)
            total = total + weight * reg
            metrics[name] = reg.detach()
    return LossOut(total, metrics)
