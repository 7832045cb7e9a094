"""GRPO-Guard — ratio normalisation per step and regulated clipping for Flow-GRPO (Wang et al., arXiv 2510.22319;
FG@9745241 ``scripts/train_sd3_GRPO_Guard.py`` with ``config.rationorm``, ``config/grpo_guard.py``).

For trained stored step j of sample i, re-scored exactly as ``grpo`` (same kernel, Config and log-prob reduction):
μ_θ and the transition std s = g·sqrt|dt| from ``kernel.step``, μ_old the rollout's stored mean, and
δ = log π_θ(x_{j+1}) − log π_old(x_{j+1}). Then

    b_i = reduce_elems (μ_θ,i − μ_old,i)² / (2 s_i²)          ratio-mean bias, PER SAMPLE (reduce = the rollout's)
    r_i = exp((δ_i + b_i) · s_i)                              RatioNorm
    ℓ_i = max(−A_i r_i, −A_i clip(r_i, 1 − ε, 1 + ε)) / |dt_i|  clipping on the normalised ratio, re-weighted by 1/|dt|
    loss = mean_j [ masked_mean_i ℓ_i + β · masked_mean_i KL_i ]   (KL as ``grpo``: Flow-GRPO's form, to the base)

Why: both transitions are Gaussians with the same std s, so with x' = μ_old + s·ε,
δ = mean(ε·D)/s − mean(D²)/(2s²), D = μ_θ − μ_old: the log-ratio is biased below 0 by b, and both parts grow as
s → 0 (late steps), so a fixed clip ε clips late steps far more often (the over-optimisation GRPO-Guard names).
(δ + b)·s = mean((x' − μ_old)·(μ_θ − μ_old))/s = mean(ε·D) has mean 0 and a spread that does not depend on s;
the 1/|dt| factor restores the gradient magnitude of steps whose μ moves by O(|dt|). The cancellation needs a
normalised Gaussian log-density with one s for both policies: ``flow_sde`` and ``dance_sde``, not ``cps``.

The per-sample reduction: the anchor reduces b with ``.mean(dim=tuple(range(1, log_prob.ndim)))``; log π is 1-D,
so that is an empty dim tuple and torch averages b over the WHOLE batch (flow_grpo issue #244, confirmed by the
author). Here b_i uses only sample i's latent elements. The anchor's scale s and |dt| are batch means; every sample
of one step shares them on a flat rollout, and here each sample uses its own (exact when σ differ per sample,
e.g. tree edges). Defaults are ``general_ocr_sd3_rationorm``: ε = 2e-6, β = 0 (lr 1e-4, fp16, 16 GPUs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal  # noqa: F401  (Literal: the inherited annotations resolve here)

import torch
from torch import Tensor

from flowrl.objectives import grpo
from flowrl.objectives.batch import TrainBatch
from flowrl.objectives.old_policy import OldUpdate  # noqa: F401  (an inherited annotation, resolved by the loader)
from flowrl.objectives.sources import TRAJECTORY_ROWS
from flowrl.types import LossOut

TRAINS_ON = TRAJECTORY_ROWS
RATIO_BASED = True          # a ratio against the stored log-probs; no rollout correction: refused on lossy rollouts
UNNORMALISED_KERNELS = ("cps",)     # log π without the Gaussian normaliser: the bias b does not cancel there


@dataclass
class Config(grpo.Config):
    """``grpo``'s settings with GRPO-Guard's published defaults (clip 2e-6, no KL)."""

    clip_range: float = 2e-6
    beta_kl: float = 0.0
    objective: ClassVar[str] = "grpo_guard"


def ratio_mean_bias(mean: Tensor, mean_old: Tensor, std: Tensor, reduce: str = "mean") -> Tensor:
    """b_i = reduce over sample i's elements of (μ_θ − μ_old)², over 2 s_i²; (B,). ``reduce``: "mean" | "sum"."""
    if reduce not in ("mean", "sum"):
        raise ValueError(f"grpo_guard: reduce must be 'mean' or 'sum', got {reduce!r}")
    sq = (mean.float() - mean_old.float()).flatten(1).square()
    per = sq.mean(1) if reduce == "mean" else sq.sum(1)
    return per / (2 * std.float() ** 2)


def normalised_log_ratio(log_ratio: Tensor, bias: Tensor, std: Tensor) -> Tensor:
    """RatioNorm's log r = (δ + b)·s, (B,)."""
    return (log_ratio + bias) * std.float()


def _step_terms(policy, batch: TrainBatch, j: int, how: grpo.StoredSteps, cfg: Config, adv: Tensor):
    """Per-sample terms of stored step j (module docstring)."""
    if getattr(how.kernel, "name", None) in UNNORMALISED_KERNELS:
        raise ValueError(f"grpo_guard: kernel {how.kernel.name!r} has an unnormalised log-prob, so RatioNorm's "
                         "bias does not cancel; sample with flow_sde or dance_sde")
    sc = grpo.score_step(policy, batch, j, how)
    std = sc.out.std.float()
    bias = ratio_mean_bias(sc.out.mean, batch.traj.mean[:, j], std, batch.reduce)
    ratio = torch.exp(normalised_log_ratio(sc.log_ratio, bias, std))
    dt = (sc.sigma_next - sc.sigma).abs()
    terms = {"policy": grpo.clipped_surrogate(adv, ratio, cfg.clip_range) / dt, "ratio": ratio.detach(),
             "clipped": ((ratio - 1).abs() > cfg.clip_range).float(),
             "approx_kl": 0.5 * sc.log_ratio.detach() ** 2, "ratio_bias": bias.detach()}
    if cfg.beta_kl > 0:
        mean_ref = grpo.reference_mean(policy, batch, sc, how)
        terms["kl"] = grpo.mean_kl(sc.out.mean, mean_ref, sc.out.std, sc.sigma_next - sc.sigma, cfg.kl_form)
    return terms


def loss(policy, batch: TrainBatch, cfg: Config | None = None) -> LossOut:
    return grpo.trajectory_loss(policy, batch, cfg or Config(), "grpo_guard", _step_terms)
