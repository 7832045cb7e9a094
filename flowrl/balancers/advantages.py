"""Group statistics that turn rewards (B,) into advantages (B,): pure functions on tensors.

Groups are integer ids (B,): equal ids came from the same prompt. A NaN reward means "does not apply to this
sample": it is left out of every statistic and its advantage is NaN, so callers can mask it
(``torch.isfinite``) or zero it (``nan_to_num``).

Conventions of the anchors (flow_grpo ``stat_tracking.py``, NVlabs/GDPO, MC-GRPO):
- Flow-GRPO / DiffusionNFT: ``A = (r − mean_group r) / (std + 1e-4)``, std over the whole batch
  (``global_std=True``) or within the group, numpy ``np.std`` i.e. the population std (``unbiased=False``).
- GDPO / LLM stacks use torch ``.std`` (unbiased).
- MC-GRPO: median baseline over G+1 rollouts, MAD scale, the median rollout dropped (``grpo_trainer_gsm.py``).
Finite float32 rewards of any size give finite advantages: the statistics and differences are taken in
float64 (a float32 r − mean overflows near 3e38), and a scale of exactly 0 (a constant group with eps = 0)
gives A = 0, the limit of a group without spread, instead of 0/0.
Tree (BranchGRPO per-depth, TempFlow per-sibling) advantages live with the trees, ``samplers.tree_credit``.
"""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

StdMode = Literal["group", "global", "none"]


def _check(r: Tensor, group_ids: Tensor) -> Tensor:
    if r.dim() != 1:
        raise ValueError(f"rewards must be 1-D (B,), got shape {tuple(r.shape)}; pass one reward column at a time")
    if group_ids.shape != r.shape:
        raise ValueError(f"group_ids shape {tuple(group_ids.shape)} must equal rewards shape {tuple(r.shape)}")
    if group_ids.dtype.is_floating_point:
        raise ValueError("group_ids must be an integer tensor (one id per prompt), got floating point")
    return torch.unique(group_ids, return_inverse=True)[1]


def group_stats(r: Tensor, group_ids: Tensor, unbiased: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample (mean, std, count) of the finite rewards in each sample's group.

    mean_g = Σ_{i∈g} r_i / n_g,  std_g = sqrt(Σ (r_i − mean_g)² / (n_g − ddof)),  ddof = 1 if unbiased.
    Groups with no finite reward give NaN mean; std is 0 where n_g − ddof ≤ 0.
    """
    inv = _check(r, group_ids)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    valid = torch.isfinite(r)
    x = torch.where(valid, r, torch.zeros_like(r)).double()
    zeros = torch.zeros(n_groups, dtype=torch.float64, device=r.device)
    cnt = zeros.index_add(0, inv, valid.double())
    tot = zeros.index_add(0, inv, x)
    mean = tot / cnt  # NaN for an all-NaN group
    dev2 = torch.where(valid, (x - mean[inv]) ** 2, torch.zeros_like(x))
    ss = zeros.index_add(0, inv, dev2)
    denom = cnt - (1.0 if unbiased else 0.0)
    std = torch.where(denom > 0, (ss / denom.clamp(min=1)).sqrt(), torch.zeros_like(ss))
    return mean[inv].to(r.dtype), std[inv].to(r.dtype), cnt[inv].to(r.dtype)


def finite_std(x: Tensor, unbiased: bool = False) -> Tensor:
    """Std of the finite entries of ``x`` (0-d); 0 when fewer than 1 (+1 if unbiased) finite entries."""
    v = x[torch.isfinite(x)].double()
    if v.numel() - int(unbiased) <= 0:
        return torch.zeros((), dtype=x.dtype, device=x.device)
    return v.std(unbiased=unbiased).to(x.dtype)


def batch_normalize(x: Tensor, eps: float = 1e-4, unbiased: bool = True) -> Tensor:
    """BN(x) = (x − mean_all x) / (std_all x + eps) over the finite entries (GDPO, NVlabs/GDPO); in float64,
    returned in x's dtype; 0 where the scale is exactly 0 (no spread and eps = 0)."""
    v = x[torch.isfinite(x)]
    if v.numel() == 0:
        return x.clone()
    xd = x.double()
    scale = finite_std(xd, unbiased) + eps
    out = (xd - v.double().mean()) / scale if scale > 0 else torch.where(torch.isnan(xd), xd, torch.zeros_like(xd))
    return saturate(out, x.dtype)


def group_advantages(
    r: Tensor,
    group_ids: Tensor,
    *,
    std: StdMode = "global",
    eps: float = 1e-4,
    clip: float | None = None,
    unbiased: bool = False,
) -> Tensor:
    """A_i = (r_i − mean_{group(i)} r) / (s + eps)  (Flow-GRPO ``PerPromptStatTracker``, ``stat_tracking.py``).

    s = std of all finite rewards in the batch (``std="global"``, Flow-GRPO/NFT default), of the sample's
    group (``"group"``: Wan, flux_fast), or 1 with no eps (``"none"``: mean-centering only).
    NaN rewards are excluded from every statistic and give NaN advantages. ``clip`` clamps A to ±clip.
    Computed in float64; returned in r's dtype, |A| saturating at its largest finite value (``std="none"``
    on rewards near the float32 limit).
    """
    if not eps >= 0:
        raise ValueError(f"advantage eps must be ≥ 0 (it is added to the std), got {eps}")
    x = r.double()
    mean, gstd, _ = group_stats(x, group_ids, unbiased)
    if std == "global":
        scale = finite_std(x, unbiased) + eps
    elif std == "group":
        scale = gstd + eps
    elif std == "none":
        scale = torch.ones((), dtype=x.dtype, device=r.device)
    else:
        raise ValueError(f"std must be 'group', 'global' or 'none', got {std!r}")
    adv = torch.where(scale > 0, (x - mean) / scale.clamp(min=torch.finfo(x.dtype).tiny), torch.zeros_like(x))
    adv = saturate(torch.where(torch.isnan(x), x, adv), r.dtype)
    return clip_advantages(adv, clip) if clip is not None else adv


def saturate(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x`` cast to ``dtype`` with ±inf-producing values clamped to its largest finite magnitude (NaN kept)."""
    if not dtype.is_floating_point:
        raise ValueError(f"saturate: expected a floating dtype, got {dtype}")
    big = torch.finfo(dtype).max
    return x.clamp(-big, big).to(dtype) if torch.finfo(x.dtype).max > big else x.to(dtype)


def clip_advantages(adv: Tensor, max_abs: float) -> Tensor:
    """clamp(A, −max_abs, +max_abs) (``adv_clip_max = 5`` in every GRPO anchor); NaN stays NaN."""
    if max_abs <= 0:
        raise ValueError(f"advantage clip must be > 0, got {max_abs}")
    return adv.clamp(-max_abs, max_abs)


def zero_std_mask(r: Tensor, group_ids: Tensor, tol: float = 0.0) -> Tensor:
    """Keep-mask (B,) bool: False for samples whose group has no reward spread (std ≤ tol) or a NaN reward.

    Flow-GRPO drops such samples from training since their advantage is 0 at every step (``train_sd3.py``).
    """
    _, std, _ = group_stats(r, group_ids)
    return (std > tol) & torch.isfinite(r)


def zero_std_ratio(r: Tensor, group_ids: Tensor, tol: float = 0.0) -> float:
    """Fraction of groups whose rewards have no spread (Flow-GRPO's logged ``zero_std_ratio``)."""
    inv = _check(r, group_ids)
    keep = zero_std_mask(r, group_ids, tol)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    any_keep = torch.zeros(n_groups, dtype=torch.bool, device=r.device).index_put_((inv,), keep, accumulate=True)
    return float((~any_keep).float().mean()) if n_groups else 0.0


def median_advantages(
    r: Tensor, group_ids: Tensor, *, mad_eps: float = 1e-3, compensate: bool = True
) -> tuple[Tensor, Tensor]:
    """MC-GRPO median baseline over G+1 rollouts per prompt (lotusroot-kim/MC-GRPO).

    m_p = median_g r,  MAD_p = median_g |r − m_p| + mad_eps,  A = (r − m_p) / MAD_p;
    with ``compensate`` the nonzero advantages of a group are scaled by n_p / #nonzero (n_p = G+1).
    Returns (A (B,), keep (B,) bool): keep is False on the median rollout (dropped from the loss, so G
    rollouts backprop) and on NaN rewards. For even group sizes the lower median is used (torch.median).
    """
    inv = _check(r, group_ids)
    adv = torch.full_like(r, float("nan"), dtype=torch.float64)
    keep = torch.isfinite(r).clone()
    for g in inv.unique():
        idx = torch.nonzero((inv == g) & torch.isfinite(r)).flatten()
        if idx.numel() == 0:
            continue
        vals = r[idx].double()
        med, arg = vals.median(dim=0)
        mad = (vals - med).abs().median() + mad_eps
        a = (vals - med) / mad
        nonzero = a != 0
        if compensate and nonzero.any():
            a = torch.where(nonzero, a * idx.numel() / nonzero.sum(), a)
        adv[idx] = a
        keep[idx[arg]] = False
    return saturate(adv, r.dtype), keep
