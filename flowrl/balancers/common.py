"""Shared input checks and per-reward group normalisation for the balancers (reference B §5 notation)."""
from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import Tensor

from flowrl.balancers.advantages import group_advantages


def check_inputs(R: Tensor, group_ids: Tensor, weights: Tensor | Sequence[float] | None) -> Tensor:
    """Validate R (N, K) and group_ids (N,); return the weights as a (K,) tensor (default all ones)."""
    if R.dim() != 2:
        raise ValueError(f"rewards R must be (N, K) (samples × rewards), got shape {tuple(R.shape)}; "
                         "use R.unsqueeze(1) for a single reward")
    if group_ids.shape != (R.shape[0],):
        raise ValueError(f"group_ids must be ({R.shape[0]},) to match R, got {tuple(group_ids.shape)}")
    if weights is None:
        return torch.ones(R.shape[1], dtype=R.dtype)
    w = torch.as_tensor(weights, dtype=R.dtype).flatten()
    if w.numel() != R.shape[1]:
        raise ValueError(f"{w.numel()} reward weights for {R.shape[1]} reward columns; give one weight per reward")
    return w


def per_reward_advantages(R: Tensor, group_ids: Tensor, std: str = "group", eps: float = 1e-4,
                          unbiased: bool = True) -> Tensor:
    """Â_k = (R_k − mean_group R_k) / (std R_k + eps) per column, NaN where R is NaN: (N, K)."""
    cols = [group_advantages(R[:, k], group_ids, std=std, eps=eps, unbiased=unbiased) for k in range(R.shape[1])]
    return torch.stack(cols, dim=1)


def any_finite(R: Tensor) -> Tensor:
    """(N,) bool: the sample has at least one applicable reward."""
    return torch.isfinite(R).any(dim=1)


def alpha_diagnostics(weights: Tensor) -> dict:
    """``alpha_<k>`` = weights_k / Σ_j weights_j: a balancer's effective weight on reward k's standardised
    advantage (logged ``adv/alpha_<k>``); empty when the weights do not sum to a positive number."""
    w = weights.double()
    total = float(w.sum())
    return {f"alpha_{k}": (w[k] / total).float() for k in range(w.numel())} if total > 0 else {}


def on_cpu(balance):
    """Run a balancer on CPU (rewards are (N, K), tiny) and return the advantages on R's device."""

    @functools.wraps(balance)
    def wrapper(R: Tensor, group_ids: Tensor, *args, **kwargs):
        kwargs = {k: (v.detach().cpu() if isinstance(v, Tensor) else v) for k, v in kwargs.items()}
        adv, diag = balance(R.detach().cpu(), group_ids.cpu(), *args, **kwargs)
        return adv.to(R.device), diag

    return wrapper
