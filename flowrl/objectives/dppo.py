"""Flow-DPPO — the PPO ratio clip replaced by a mask on the exact per-step Gaussian KL to the old policy
(arXiv 2606.11025; Tencent-Hunyuan/UniRL ``FlowDPPO/`` and ``unirl/algorithms/flowdppo.py``
``_flowdppo_kl_adv_loss``, verl-omni ``flow_dppo``, Flow-Factory ``dppo``).

For trained stored step j of sample i, re-scored exactly as ``grpo`` (same kernel, Config and reduction), with
μ_old the rollout's stored mean and s the transition std (the same for both policies):

    r_i    = exp(log π_θ − log π_old)                                     the unclipped ratio
    KL_i   = mean_elems (μ_θ,i − μ_old,i)² / (2 s_i²)                     exact KL(π_old ‖ π_θ) per latent element
    drop_i = [KL_i ≥ τ] ∧ ([r_i > 1 ∧ A_i > 0] ∨ [r_i < 1 ∧ A_i < 0])      far from the old policy AND moving further
    ℓ_i    = −A_i · r_i · (1 − drop_i)
    loss   = mean_j [ masked_mean_i ℓ_i + β · masked_mean_i KL_ref,i ]

A step inside the trust region (KL < τ) always passes; outside it, a corrective step (r < 1 with A > 0, r > 1
with A < 0) still passes and only a step that pushes further is dropped (its term is 0 and still counts in the
mean, as UniRL's ``torch.where(keep, −A·r, 0).mean()``). The mask is not differentiated. τ is calibrated on the
element-MEAN KL (the paper's KL / D): 1e-5 in UniRL and verl-omni (the default), 1e-6 in Flow-Factory. The old
anchor (log π_old, μ_old) is the rollout's, frozen over every epoch and update of the iteration, which is what
lets Flow-DPPO take several updates per rollout (``train.updates_per_epoch``, ``train.inner_epochs``).
KL_ref (β > 0; 0 in every published recipe) is the exact Gaussian KL to the frozen base (``kl_form="gaussian"``,
UniRL's ``beta``: note it is ≈ 1/|dt| stronger than Flow-GRPO's form at equal β).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from flowrl.objectives import grpo
from flowrl.objectives.batch import TrainBatch, mean_elems
from flowrl.objectives.old_policy import OldUpdate, check_positive
from flowrl.objectives.sources import TRAJECTORY_ROWS
from flowrl.types import LossOut

TRAINS_ON = TRAJECTORY_ROWS
RATIO_BASED = True          # a ratio against the stored log-probs; no rollout correction: refused on lossy rollouts


@dataclass
class Config:
    kl_threshold: float = 1e-5        # τ (UniRL / verl-omni ``kl_mask_threshold``; Flow-Factory 1e-6)
    adv_clip_max: float = 5.0
    beta_kl: float = 0.0              # KL to the frozen base (UniRL ``beta``)
    kl_form: Literal["flow_grpo", "gaussian", "unscaled"] = "gaussian"   # of the KL to the base
    train_guidance: float | None = None   # None → the rollout's guidance; the SD3.5 recipe samples CFG-free
    old_update: OldUpdate = "on_policy"

    def __post_init__(self):
        check_positive("dppo", kl_threshold=self.kl_threshold, adv_clip_max=self.adv_clip_max)
        if self.kl_form not in grpo.KL_FORMS:
            raise ValueError(f"dppo kl_form must be one of {grpo.KL_FORMS}, got {self.kl_form!r}")
        if self.beta_kl < 0:
            raise ValueError(f"dppo beta_kl must be >= 0, got {self.beta_kl}")


def gaussian_kl(mean: Tensor, mean_old: Tensor, std: Tensor) -> Tensor:
    """KL_i = mean_elems (μ_θ − μ_old)² / (2 s²), (B,): the per-element KL of two Gaussians with one std s."""
    return mean_elems((mean.float() - mean_old.float()) ** 2) / (2 * std.float() ** 2)


def drop_mask(kl: Tensor, ratio: Tensor, adv: Tensor, threshold: float) -> Tensor:
    """drop = [KL ≥ τ] ∧ ([r > 1 ∧ A > 0] ∨ [r < 1 ∧ A < 0]), (B,) bool."""
    further = ((ratio > 1) & (adv > 0)) | ((ratio < 1) & (adv < 0))
    return (kl >= threshold) & further


def _step_terms(policy, batch: TrainBatch, j: int, how: grpo.StoredSteps, cfg: Config, adv: Tensor):
    """Per-sample terms of stored step j (module docstring)."""
    sc = grpo.score_step(policy, batch, j, how)
    ratio = torch.exp(sc.log_ratio)
    kl_old = gaussian_kl(sc.out.mean.detach(), batch.traj.mean[:, j], sc.out.std)
    drop = drop_mask(kl_old, ratio.detach(), adv, cfg.kl_threshold)
    terms = {"policy": torch.where(drop, torch.zeros_like(ratio), -adv * ratio), "ratio": ratio.detach(),
             "approx_kl": 0.5 * sc.log_ratio.detach() ** 2, "kl_old": kl_old, "masked": drop.float(),
             "masked_pos": (drop & (adv > 0)).float(), "masked_neg": (drop & (adv < 0)).float()}
    if cfg.beta_kl > 0:
        mean_ref = grpo.reference_mean(policy, batch, sc, how)
        terms["kl"] = grpo.mean_kl(sc.out.mean, mean_ref, sc.out.std, sc.sigma_next - sc.sigma, cfg.kl_form)
    return terms


def loss(policy, batch: TrainBatch, cfg: Config | None = None) -> LossOut:
    return grpo.trajectory_loss(policy, batch, cfg or Config(), "dppo", _step_terms)
