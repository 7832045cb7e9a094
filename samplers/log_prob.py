"""Gaussian transition log-density and entropy, shared by rollout (π_old) and training (π_θ).

For ``x' ~ N(μ, s²I)`` per sample, element-wise
``log N(x'; μ, s²) = −(x'−μ)²/(2s²) − log s − ½·log 2π``,
reduced over all non-batch elements with ``reduce="mean"`` (Flow-GRPO / DanceGRPO / MixGRPO take the mean over
all latent elements, e.g. ``sde_step_with_logprob``, which is why their PPO clip ranges are ~1e-4) or ``"sum"``
(the true joint log-density of the latent).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from samplers.kernel import bcast

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
REDUCTIONS = ("mean", "sum")


def reduce_elements(t: Tensor, reduce: str) -> Tensor:
    """Mean or sum over every non-batch dim → (B,)."""
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}")
    dims = tuple(range(1, t.dim()))
    if not dims:
        return t
    return t.mean(dims) if reduce == "mean" else t.sum(dims)


def gaussian_log_prob(x_next: Tensor, mean: Tensor, std: Tensor, reduce: str = "mean") -> Tensor:
    """log N(x_next; mean, std²I) per sample, (B,) float32.

    ``std`` is (B,) (or a scalar) and must be > 0: a deterministic (ODE) step has no density.
    Element-wise ``−(x'−μ)²/(2s²) − log s − ½log 2π``, then ``reduce`` ("mean" = anchors, "sum" = joint).
    """
    x_next, mean = x_next.float(), mean.float()
    s = torch.as_tensor(std, dtype=torch.float32, device=mean.device)
    if s.dim() == 0:
        s = s.expand(mean.shape[0])
    if bool((s <= 0).any()):
        raise ValueError("gaussian_log_prob: std must be > 0; an ODE (deterministic) step has no log-prob. "
                         "Only score steps the plan marks stochastic.")
    sb = bcast(s, mean)
    elem = -((x_next - mean) ** 2) / (2 * sb**2) - torch.log(sb) - _HALF_LOG_2PI
    return reduce_elements(elem, reduce)



def gaussian_kernel_log_prob(x_next: Tensor, mean: Tensor, std: Tensor, reduce: str = "mean", cfg=None) -> Tensor:
    """The ``Kernel.log_prob`` of the Gaussian SDE kernels (flow_sde, dance_sde): :func:`gaussian_log_prob`;
    ``cfg`` is accepted for the common kernel signature and unused."""
    return gaussian_log_prob(x_next, mean, std, reduce)

def gaussian_entropy(std: Tensor, numel: int = 1, reduce: str = "mean") -> Tensor:
    """Entropy of N(μ, s²I_d): per element ``h = ½log(2πe) + log s``;
    ``reduce="sum"`` gives ``d·h`` for ``d = numel`` elements."""
    h = 0.5 * math.log(2 * math.pi * math.e) + torch.log(torch.as_tensor(std, dtype=torch.float32))
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}")
    return h if reduce == "mean" else h * numel


def trajectory_entropy(std: Tensor, numel: int = 1, reduce: str = "mean") -> Tensor:
    """Entropy of each stored step of a rollout, (B, K), from ``traj.std`` (B, K): per element
    ``½log(2πe) + log s`` (E-GRPO reports it for its merged step), or ×numel with "sum"."""
    if std.dim() != 2:
        raise ValueError(f"trajectory_entropy expects traj.std shaped (B, K), got {tuple(std.shape)}")
    return gaussian_entropy(std, numel, reduce)
