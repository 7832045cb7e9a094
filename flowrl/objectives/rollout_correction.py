"""Rollout correction: importance-sampling weights, rejection masks and drift metrics of a lossy rollout.

A lossy rollout accelerator (``flowrl.accelerators``) samples the stored SDE transitions with a cheaper
π_rollout instead of the exact "old" policy π_old. Per stored step j of sample i (verl
``verl/trainer/ppo/rollout_corr_helper.py``, decoupled mode; Flow-GRPO's log-prob is the mean over latent
elements, which is why verl's thresholds transfer):

    λ_ij = clamp(log π_old(x_{j+1}|x_j) − log π_rollout(x_{j+1}|x_j), −20, 20)
    IS   token:    w_ij = e^{λ_ij}            sequence: w_i = exp Σ_j λ_ij   (broadcast over j)
         TIS  (threshold U, a float):  w ← min(w, U)                        (default U = 2.0)
         IcePop ("L_U"):               w ← w · 1[L ≤ w ≤ U]
    RS   k1 = −λ, k2 = ½λ², k3 = e^λ − 1 − λ; modes token_k*, seq_sum_k*, seq_mean_k*, seq_max_k{2,3};
         k1 thresholds are ratio bounds "L_U" (keep iff log L ≤ stat ≤ log U; one value U means L = 1/U),
         k2 / k3 take an upper bound; several modes (comma-separated) are combined with AND
    W_ij = w_ij · keep_ij   (detached; a rejected row keeps its place in the mean's denominator)

Drift metrics (``rollout_corr/``): kl = mean(log π_rollout − log π_old), k3_kl = mean(e^λ − λ − 1),
chi2_token = mean(e^{2λ}) − 1, chi2_seq = mean_i(e^{2Σ_jλ_ij}) − 1, log_ratio_abs_mean = mean|λ|, the IS weights'
mean/max/min, the TIS clipped fraction, eff_sample_size = 1/mean((w/w̄)²), rs_masked_fraction (transitions) and
rs_seq_masked_fraction (samples with a rejected transition). Defaults: VO ``diffusion_trainer.yaml`` L94–121
(``rollout_is_threshold 2.0``); recommended RS ``seq_mean_k1 "0.5_2.0"`` (VO rollout_correction doc); an RS
sequence-masked fraction staying above ~5 % signals a drifting backend (``DRIFT_WARN``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

LAMBDA_CLAMP = 20.0
DRIFT_WARN = 0.05                  # rs_seq_masked_fraction above this for WARN_AFTER iterations → a warning
WARN_AFTER = 3
RS_MODES = tuple(f"{agg}_k{k}" for agg in ("token", "seq_sum", "seq_mean") for k in (1, 2, 3)) + (
    "seq_max_k2", "seq_max_k3")


@dataclass
class RolloutCorrection:
    """``sampler.correction``: how a ratio-based objective corrects a lossy rollout (module docstring)."""

    is_level: Literal["token", "sequence"] | None = "sequence"   # None: no IS weight (rejection only)
    is_threshold: float | str = 2.0      # U (TIS) or "L_U" (IcePop)
    rs: str | None = None                # rejection modes, comma-separated (e.g. "seq_mean_k1"); None: off
    rs_threshold: float | str | None = None   # k1: "L_U" or U (L = 1/U); k2 / k3: U

    def __post_init__(self):
        if self.is_level not in ("token", "sequence", None):
            raise ValueError(f"sampler.correction.is_level must be token, sequence or null, got {self.is_level!r}")
        bounds(self.is_threshold, "sampler.correction.is_threshold")
        for mode in rs_modes(self.rs):
            if self.rs_threshold is None:
                raise ValueError(f"sampler.correction.rs={self.rs!r} needs rs_threshold (e.g. \"0.5_2.0\")")
            lo, _ = bounds(self.rs_threshold, "sampler.correction.rs_threshold")
            if not mode.endswith("k1") and lo is not None:
                raise ValueError(f"sampler.correction.rs mode {mode} takes one upper bound, got "
                                 f"rs_threshold={self.rs_threshold!r}")


def rs_modes(rs: str | None) -> list[str]:
    """The comma-separated rejection modes of ``rs``; a one-line error naming an unknown one."""
    modes = [m.strip() for m in (rs or "").split(",") if m.strip()]
    for m in modes:
        if m not in RS_MODES:
            raise ValueError(f"sampler.correction.rs: unknown mode {m!r}; choose from {', '.join(RS_MODES)}")
    return modes


def bounds(threshold: float | str, where: str) -> tuple[float | None, float]:
    """(L, U) of a threshold: a number U → (None, U); a string "L_U" → (L, U) with 0 < L ≤ U."""
    try:
        if isinstance(threshold, str) and "_" in threshold:
            lo, hi = (float(v) for v in threshold.split("_"))
        else:
            lo, hi = None, float(threshold)
    except ValueError:
        raise ValueError(f"{where} must be a number U or a string \"L_U\", got {threshold!r}") from None
    if hi <= 0 or (lo is not None and not 0 < lo <= hi):
        raise ValueError(f"{where} must satisfy 0 < L ≤ U, got {threshold!r}")
    return lo, hi


def log_ratio(logp_old: Tensor, logp_rollout: Tensor) -> Tensor:
    """λ = clamp(log π_old − log π_rollout, ±20), (B, K) float32."""
    return (logp_old.float() - logp_rollout.float()).clamp(-LAMBDA_CLAMP, LAMBDA_CLAMP)


def is_weights(lam: Tensor, level: str | None, threshold: float | str) -> tuple[Tensor, Tensor]:
    """(w (B, K) after TIS / IcePop, the raw weights before the threshold); level None → ones."""
    if level is None:
        ones = torch.ones_like(lam)
        return ones, ones
    raw = lam.exp() if level == "token" else lam.sum(1, keepdim=True).clamp(-LAMBDA_CLAMP, LAMBDA_CLAMP).exp()
    raw = raw.expand_as(lam)
    lo, hi = bounds(threshold, "is_threshold")
    if lo is None:
        return raw.clamp(max=hi), raw                                  # TIS
    return raw * ((raw >= lo) & (raw <= hi)).float(), raw             # IcePop


def rs_statistic(lam: Tensor, mode: str) -> Tensor:
    """The statistic of rejection mode ``mode`` (B, K): token-level, or per sample broadcast over K."""
    agg, k = mode.rsplit("_k", 1)
    stat = {"1": -lam, "2": 0.5 * lam ** 2, "3": lam.exp() - 1 - lam}[k]
    if agg == "token":
        return stat
    red = {"seq_sum": stat.sum(1, keepdim=True), "seq_mean": stat.mean(1, keepdim=True),
           "seq_max": stat.amax(1, keepdim=True)}[agg]
    return red.expand_as(lam)


def rs_keep(lam: Tensor, rs: str | None, threshold: float | str | None) -> Tensor:
    """(B, K) 0/1 mask of the transitions every rejection mode keeps (AND); all ones without ``rs``."""
    keep = torch.ones_like(lam, dtype=torch.bool)
    for mode in rs_modes(rs):
        stat = rs_statistic(lam, mode)
        lo, hi = bounds(threshold, "rs_threshold")
        if mode.endswith("k1"):
            lo = 1.0 / hi if lo is None else lo
            keep &= (stat >= math.log(lo)) & (stat <= math.log(hi))
        else:
            keep &= stat <= hi
    return keep.float()


def correction_weights(logp_old: Tensor, logp_rollout: Tensor, cfg: RolloutCorrection) -> tuple[Tensor, dict]:
    """W (B, K) = IS · RS keep (detached) and the drift metrics (module docstring)."""
    lam = log_ratio(logp_old, logp_rollout).detach()
    w, raw = is_weights(lam, cfg.is_level, cfg.is_threshold)
    keep = rs_keep(lam, cfg.rs, cfg.rs_threshold)
    return w * keep, drift_metrics(lam, w, raw, keep)


def drift_metrics(lam: Tensor, w: Tensor, raw: Tensor, keep: Tensor) -> dict[str, float]:
    """``rollout_corr/*`` figures of one batch of λ's, IS weights and the RS mask."""
    seq = lam.sum(1).clamp(-LAMBDA_CLAMP, LAMBDA_CLAMP)
    w_norm = w / w.mean().clamp(min=1e-12)
    return {
        "rollout_corr/kl": float((-lam).mean()),
        "rollout_corr/k3_kl": float((lam.exp() - lam - 1).mean()),
        "rollout_corr/chi2_token": float((2 * lam).exp().mean() - 1),
        "rollout_corr/chi2_seq": float((2 * seq).exp().mean() - 1),
        "rollout_corr/log_ratio_abs_mean": float(lam.abs().mean()),
        "rollout_corr/is_mean": float(w.mean()), "rollout_corr/is_max": float(w.max()),
        "rollout_corr/is_min": float(w.min()),
        "rollout_corr/is_clipped_fraction": float((raw != w).float().mean()),
        "rollout_corr/eff_sample_size": float(1.0 / (w_norm ** 2).mean().clamp(min=1e-12)),
        "rollout_corr/rs_masked_fraction": float(1 - keep.mean()),
        "rollout_corr/rs_seq_masked_fraction": float((keep.min(1).values < 1).float().mean()),
    }
