"""Advantage-Weighted Rectification — FlowAWR (Fuzm7/FlowAWR@05e993a scripts/train_awr_sd3.py,
flow_grpo/stat_tracking.py ``update(exp=True)``) and VideoAWR (scripts/train_wan2_1_awr.py, config/wan.py).

Energies per prompt group of size k (``prepare_advantages``, on the whole epoch before micro-batching):
    a_i = clip(A_i, −C, C)/τ,  p = softmax_group(a),  e_i = p_i − 1/k          (Σ_group e = 0)
    E_i = e_i / max(std_group(e) + 1e-4, 1e-2)   if hard_gating (rule-based OCR / GenEval rewards)
        = k·e_i                                  otherwise;      E_i = clip(E_i, −3, 3)
Loss on the forward process of the stored x0 (x_t = (1−t)x0 + tε, v = ε − x0):
    v_tgt = v_old + E·(v − v_old)   ⇔   x0_tgt = x̂0_old + E·(x0 − x̂0_old)
    w     = sg(mean|x̂0_θ − x0|) ∨ 1e-5     (uses x0, not x0_tgt)
    loss  = mean_B mean (x̂0_θ − x0_tgt)²/w + β_KL·mean|v_θ − v_ref|²
i.e. the shared rectified regression with c = E, λ = t²/w. E = 0 regresses onto the rollout policy.
FlowAWR (image) trains at per-sample permuted σ's like DiffusionNFT (``timesteps: permuted``) and samples from the
soft-updated "old" adapter (``old_update: nft``, decay_type 1). VideoAWR: the old adapter samples WITH CFG
(``sampler.guidance``) but the anchor v_old is unguided (``train_guidance=1.0``, ``train.cfg=False``), each rollout
is trained at its own independently drawn σ (``timesteps: decoupled``, Decoupled Timestep Rectification), and the
old adapter follows ``old_update: nft_ocr`` (decay_type 2). The group std of e is the population std
(numpy, as the anchor's stat tracker) — an assumption where the source is not explicit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from flowrl.config.loader import nested_plugin
from flowrl.objectives.batch import TrainBatch, masked_mean
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


@dataclass
class Config:
    beta_kl: float = 1e-4          # train.beta
    adv_clip_max: float = 5.0
    temperature: float = 1.0       # τ
    hard_gating: bool = False      # True in the OCR / GenEval presets
    energy_min: float = -3.0
    energy_max: float = 3.0
    train_guidance: float | None = 1.0   # unguided anchor and trainable forward
    min_weight: float = 1e-5
    timesteps: Any = nested_plugin(TIMESTEPS, "permuted")   # FlowAWR; VideoAWR: {kind: decoupled}
    old_update: OldUpdate = "nft"     # decay_type 1 (SD3); VideoAWR nft_ocr

    def __post_init__(self):
        check_positive("awr", temperature=self.temperature, adv_clip_max=self.adv_clip_max)


def group_energies(adv: Tensor, cfg: Config | None = None) -> Tensor:
    """Energies E (k,) of one group's finite advantages (module docstring)."""
    cfg = cfg or Config()
    k = adv.numel()
    p = torch.softmax(adv.double().clamp(-cfg.adv_clip_max, cfg.adv_clip_max) / cfg.temperature, dim=0)
    e = p - 1.0 / k
    if cfg.hard_gating:
        e = e / max(float(e.std(unbiased=False)) + 1e-4, 1e-2)
    else:
        e = k * e
    return e.clamp(cfg.energy_min, cfg.energy_max).to(adv.dtype)


def prepare_advantages(adv: Tensor, group_ids: Tensor, cfg: Config | None = None, context=None) -> Tensor:
    """Advantages (B,) → energies (B,) per prompt group; NaN advantages are left out of their group and stay NaN.
    The trainer calls this on the full set of rollouts, before splitting it into micro-batches."""
    if group_ids.shape != adv.shape:
        raise ValueError(f"group_ids shape {tuple(group_ids.shape)} must equal advantages shape {tuple(adv.shape)}")
    out = torch.full_like(adv, float("nan"))
    finite = torch.isfinite(adv)
    for g in group_ids.unique():
        idx = torch.nonzero((group_ids == g) & finite).flatten()
        if idx.numel():
            out[idx] = group_energies(adv[idx], cfg)
    return out


def loss(policy, batch: TrainBatch, cfg: Config | None = None) -> LossOut:
    """``batch.advantages`` holds the energies E (``prepare_advantages``)."""
    cfg = cfg or Config()
    fb = forward_batch(batch, "awr")
    keep = fb.keep
    energy = torch.nan_to_num(batch.advantages.float()).to(fb.x0.device)
    v_old = velocity_at(policy, "old", fb, batch.cond, cfg.train_guidance)
    v_theta = velocity_at(policy, "train", fb, batch.cond, cfg.train_guidance, grad=True)
    w = x0_abs_weight(x0_prediction(fb.x_t, fb.t, v_theta), fb.x0, cfg.min_weight)
    per = rectified_regression(v_theta, v_old, fb.v, energy, fb.t**2 / w)
    policy_loss = masked_mean(per, keep)
    total, metrics = policy_loss, {"policy_loss": policy_loss.detach(), "energy_abs": masked_mean(energy.abs(), keep)}
    if cfg.beta_kl > 0:
        kl = anchor_penalty(policy, None, fb, batch.cond, cfg.train_guidance, v_theta)
        total = total + cfg.beta_kl * kl
        metrics["kl"] = kl.detach()
    return LossOut(total, metrics)
