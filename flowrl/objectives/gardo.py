"""GARDO — Gated and Adaptive Regularization with Diversity-aware Optimization (He et al., arXiv 2512.24138;
yifan123/flow_grpo@94e23ee ``scripts/train_sd3_gardo.py``, ``flow_grpo/stat_tracking.py`` ``type='gardo'``;
reference G §2.5). Flow-GRPO with three changes, each a pure function here:

1. Gated KL. Only the most uncertain samples are regularised. With win rates w(x)_i = (#{j ≠ i: x_j < x_i} +
   ½#{j ≠ i: x_j = x_i}) / (N − 1) over the N samples of an iteration, r the trained (proxy) reward and a_1..a_K
   auxiliary rewards that are scored but not trained on (the anchor: Aesthetic and ImageReward beside OCR/GenEval),

       u_i    = mean_k w(a_k)_i − w(r)_i
       gate_i = u_i > q,  q = the (1 − f) quantile of {u_j : u_j ≥ 0}               (``uncertainty_gate``)

   The released script computes u as rank(r) − mean_k rank(a_k) with rank 1 the highest, which is (N − 1)·u here
   (tie-free; the quantile does not change). Its sign gates the samples the auxiliary rewards rate above the
   proxy; the paper's text, which was not read, may define the direction the other way. The fraction f starts at
   0.1 and adapts (``adapt_fraction``, the script's RiskCompensator): f ← 1.1·f when the mean non-negative u
   exceeds the largest of the last 20 such means, 0.9·f when below the smallest, clipped to [0.02, 0.2].
2. Adaptive reference. The KL is to a reference weight set ("ref" adapter), not the frozen base, Flow-GRPO's form
   per gated sample and averaged over the gated samples of the batch (``gated_mean``):
       KL = mean_{i: gate_i} mean_elems (μ_θ,i − μ_ref,i)² / (2 g_i²)
   and the reference is refreshed, ref ← θ, when an iteration's KL exceeded ``kl_threshold`` or ``reset_every``
   iterations after the last refresh (``should_refresh``; the script's ``kl_thres`` / ``reset_freq``).
3. Diversity-aware advantages, without the std normalisation (``diversity_advantages``). Unit-normalised image
   features φ (the anchor: DINOv3), per prompt group g:
       d_i = min_{j ≠ i, j ∈ g} (1 − φ_i·φ_j),      A_i = (r_i − mean_g r) · (d_i / mean_g d  if r_i ≥ mean_g r, else 1)
   so good samples far from their group's others are amplified; below-average ones keep their plain advantage.

The per-step loss is Flow-GRPO's clipped surrogate plus β·``gated_mean``(KL_i, gate) with μ_ref from
``grpo.reference_mean(..., adapter="ref")``. Not registered as an objective yet: the loop hands an objective
neither the auxiliary rewards and image features (parts 1 and 3) nor a per-sample gate in its TrainBatch, and
does not checkpoint a "ref" adapter (docs/objectives.md, "Guards against reward hacking", lists what is missing).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Config:
    fraction: float = 0.1          # f: initial share of non-negative-uncertainty samples regularised (RiskCompensator)
    fraction_min: float = 0.02
    fraction_max: float = 0.2
    fraction_step: float = 0.1     # α: f ← f·(1 ± α)
    history: int = 20              # iterations of mean uncertainty remembered
    kl_threshold: float = 5e-4     # refresh the reference when the gated KL exceeds this (the script's kl_thres)
    reset_every: int = 100         # … or this many iterations after the last refresh (the script's reset_freq)

    def __post_init__(self):
        if not 0 < self.fraction_min <= self.fraction <= self.fraction_max < 1:
            raise ValueError("gardo needs 0 < fraction_min <= fraction <= fraction_max < 1, got "
                             f"{self.fraction_min}, {self.fraction}, {self.fraction_max}")
        if self.reset_every < 1 or self.history < 1:
            raise ValueError(f"gardo reset_every and history must be >= 1, got {self.reset_every}, {self.history}")


def win_rates(x: Tensor) -> Tensor:
    """w_i = (#{j ≠ i: x_j < x_i} + ½·#{j ≠ i: x_j = x_i}) / (N − 1), (N,) float64; needs N ≥ 2."""
    n = x.numel()
    if n < 2:
        raise ValueError(f"win_rates needs at least 2 samples, got {n}")
    x = x.double().flatten()
    less = (x[None, :] < x[:, None]).sum(1).double()
    ties = (x[None, :] == x[:, None]).sum(1).double() - 1
    return (less + 0.5 * ties) / (n - 1)


def uncertainty(proxy: Tensor, auxiliary: Tensor) -> Tensor:
    """u_i = mean_k w(a_k)_i − w(r)_i (module docstring); proxy (N,), auxiliary (N, K)."""
    if auxiliary.dim() != 2 or auxiliary.shape[0] != proxy.shape[0] or auxiliary.shape[1] < 1:
        raise ValueError(f"uncertainty: auxiliary must be (N, K>=1) with N = {proxy.shape[0]}, "
                         f"got {tuple(auxiliary.shape)}")
    aux = torch.stack([win_rates(auxiliary[:, k]) for k in range(auxiliary.shape[1])], 1).mean(1)
    return aux - win_rates(proxy)


def uncertainty_gate(u: Tensor, fraction: float) -> Tensor:
    """gate_i = u_i > the (1 − fraction) quantile of the non-negative u (numpy's linear percentile); (N,) bool."""
    nonneg = u[u >= 0]
    if nonneg.numel() == 0:
        return torch.zeros_like(u, dtype=torch.bool)
    return u > torch.quantile(nonneg.double(), 1 - fraction).to(u.dtype)


def adapt_fraction(fraction: float, mean_u: float, history: list[float], cfg: Config) -> tuple[float, list]:
    """One RiskCompensator update: (new fraction, new history of mean non-negative uncertainties)."""
    if history:
        if mean_u > max(history):
            fraction *= 1 + cfg.fraction_step
        elif mean_u < min(history):
            fraction *= 1 - cfg.fraction_step
    fraction = min(max(fraction, cfg.fraction_min), cfg.fraction_max)
    return fraction, (history + [mean_u])[-cfg.history:]


def nearest_neighbour_distance(features: Tensor, group_ids: Tensor) -> Tensor:
    """d_i = min over the other members j of i's group of 1 − cos(φ_i, φ_j), (N,) float64; a group of one gets 1."""
    phi = features.double().flatten(1)
    phi = phi / phi.norm(dim=1, keepdim=True).clamp(min=1e-12)
    dist = 1 - (phi @ phi.T).clamp(-1, 1)
    same = (group_ids[:, None] == group_ids[None, :]) & ~torch.eye(len(group_ids), dtype=torch.bool)
    d = torch.where(same, dist, torch.full_like(dist, float("inf"))).min(1).values
    return torch.where(torch.isfinite(d), d, torch.ones_like(d))


def diversity_advantages(rewards: Tensor, group_ids: Tensor, features: Tensor) -> Tensor:
    """A_i = (r_i − mean_g r)·(d_i / mean_g d if r_i ≥ mean_g r else 1), (N,) float64 (module docstring)."""
    r = rewards.double()
    d = nearest_neighbour_distance(features, group_ids)
    adv = torch.empty_like(r)
    for g in group_ids.unique():
        m = group_ids == g
        centred = r[m] - r[m].mean()
        scale = torch.where(centred < 0, torch.ones_like(centred), d[m] / d[m].mean().clamp(min=1e-12))
        adv[m] = centred * scale
    return adv


def should_refresh(kl: float, iterations_since: int, cfg: Config) -> bool:
    """ref ← θ when the iteration's gated KL exceeded the threshold or ``reset_every`` iterations have passed."""
    return kl > cfg.kl_threshold or iterations_since > cfg.reset_every


def gated_mean(per_sample: Tensor, gate: Tensor) -> Tensor:
    """Mean of ``per_sample`` over the gated samples (0 when none is gated)."""
    g = gate.to(per_sample.device).float()
    return (per_sample * g).sum() / g.sum().clamp(min=1.0)
