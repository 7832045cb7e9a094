"""The regression kernel shared by the forward-process objectives (DiffusionNFT, FlowAWR, AWM).

All of them noise a stored clean latent forward, x_σ = (1−σ)x0 + σε, and regress v_θ(x_σ) onto a per-sample
**rectified target** around the rollout ("old") policy:

    v_tgt,i = v_old,i + c_i·(v_i − v_old,i),   v_i = ε_i − x0_i (the flow-matching target)
    ℓ_i     = λ_i · mean_elems (v_θ,i − v_tgt,i)²

Only the coefficient c and the (detached) per-sample weight λ differ:
- NFT (DiffusionNFT's implicit optimum):  c = A/(Cβ) = (2r−1)/β,  λ = Cβσ²/w
- AWR (FlowAWR energy target):            c = E,                  λ = σ²/w
- AWM (on-policy limit, v_old = sg(v_θ)): c = A,                  λ = dρ/dm (robust FM weighting)
with w = sg(mean_elems |x̂0_θ − x0|) ∨ 1e-5 the x0-space adaptive weight. σ²·mean(v_θ − v_tgt)² is the
x0-space error (x̂0 = x_σ − σ·v), which is how the anchors write these losses.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.objectives.batch import masked_mean, mean_elems


def _b(t: Tensor, like: Tensor) -> Tensor:
    return t.reshape(t.shape[0], *([1] * (like.dim() - 1))).to(like.dtype)


def forward_noise(x0: Tensor, eps: Tensor, sigma: Tensor) -> Tensor:
    """x_σ = (1−σ)·x0 + σ·ε, σ (B,)."""
    s = _b(sigma, x0)
    return (1 - s) * x0 + s * eps


def flow_target(x0: Tensor, eps: Tensor) -> Tensor:
    """v = ε − x0."""
    return eps - x0


def x0_prediction(x_t: Tensor, sigma: Tensor, v: Tensor) -> Tensor:
    """x̂0 = x_σ − σ·v."""
    return x_t - _b(sigma, x_t) * v


def rectified_target(v_old: Tensor, v: Tensor, coef: Tensor) -> Tensor:
    """v_tgt = v_old + c·(v − v_old), c (B,)."""
    return v_old + _b(coef, v) * (v - v_old)


def x0_abs_weight(x0_pred: Tensor, x0: Tensor, min_weight: float = 1e-5) -> Tensor:
    """w = sg(mean_elems |x̂0 − x0|).clamp(min) (B,), computed in float64 as DiffusionNFT does."""
    return mean_elems((x0_pred.detach().double() - x0.double()).abs()).clamp(min=min_weight).to(x0.dtype)


def rectified_regression(v_theta: Tensor, v_old: Tensor, v: Tensor, coef: Tensor, weight: Tensor) -> Tensor:
    """Per-sample ℓ_i = λ_i·mean_elems(v_θ − v_old − c_i(v − v_old))² (B,); v_old, coef, λ are not differentiated."""
    tgt = rectified_target(v_old.detach(), v, coef.detach())
    return weight.detach() * mean_elems((v_theta - tgt) ** 2)


@dataclass
class ForwardBatch:
    """A TrainBatch on the forward process: x_t = (1−t)·x0 + t·ε, target v = ε − x0, and the 0/1 sample mask."""

    x0: Tensor
    t: Tensor
    x_t: Tensor
    v: Tensor
    keep: Tensor


def forward_batch(batch, objective: str) -> ForwardBatch:
    """Noise ``batch.x0`` at ``batch.sigma`` with the batch's ε (float32); checks the fields ``objective`` needs."""
    batch.require("x0", "sigma", objective=objective)
    x0 = batch.x0.float()
    t = batch.sigma.float().to(x0.device)
    eps = batch.forward_noise()
    return ForwardBatch(x0, t, forward_noise(x0, eps, t), flow_target(x0, eps), batch.weights().to(x0.device))


def velocity_at(policy, adapter: str | None, fb: ForwardBatch, cond, guidance, grad: bool = False) -> Tensor:
    """v(x_t, t) float32 under ``adapter`` ("train", "old", None = the frozen base); no graph unless ``grad``."""
    with torch.set_grad_enabled(grad), policy.adapter(adapter):
        return policy.velocity(fb.x_t, fb.t, cond, guidance).float()


def anchor_penalty(policy, adapter: str | None, fb: ForwardBatch, cond, guidance, v_theta: Tensor) -> Tensor:
    """mean over kept samples of mean_elems (v_θ − sg(v_anchor))², v_anchor under ``adapter`` (None: the base —
    the anchors' "KL" to the reference)."""
    v_anchor = velocity_at(policy, adapter, fb, cond, guidance)
    return masked_mean(mean_elems((v_theta - v_anchor) ** 2), fb.keep)
