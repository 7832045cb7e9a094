"""Shared input checks and per-reward group normalisation for the balancers (GDPO's notation).

Contract every balancer keeps (``tests/reliability/test_balancer_fuzz.py``): for any finite rewards (NaN =
"does not apply"), any grouping (including an empty batch) and finite weights, the advantages hold no ±inf —
or the balancer raises a one-line ``ValueError``. ±inf rewards are refused here (the advantage stage maps a
failed reward to NaN first); ``on_cpu`` refuses an advantage that still came out infinite.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import Tensor

from flowrl.balancers.advantages import group_advantages


def check_inputs(R: Tensor, group_ids: Tensor, weights: Tensor | Sequence[float] | None) -> Tensor:
    """Validate R (N, K) and group_ids (N,); return the weights as a (K,) tensor (default all ones)."""
    if R.dim() != 2 or R.shape[1] == 0:
        raise ValueError(f"rewards R must be (N, K) (samples × rewards, K ≥ 1), got shape {tuple(R.shape)}; "
                         "use R.unsqueeze(1) for a single reward")
    if group_ids.shape != (R.shape[0],):
        raise ValueError(f"group_ids must be ({R.shape[0]},) to match R, got {tuple(group_ids.shape)}")
    if torch.isinf(R).any():
        k = int(torch.nonzero(torch.isinf(R))[0, 1])
        raise ValueError(f"rewards R hold ±inf (column {k}); a failed or inapplicable reward must be NaN")
    if weights is None:
        return torch.ones(R.shape[1], dtype=R.dtype)
    w = torch.as_tensor(weights, dtype=R.dtype).flatten()
    if w.numel() != R.shape[1]:
        raise ValueError(f"{w.numel()} reward weights for {R.shape[1]} reward columns; give one weight per reward")
    if not torch.isfinite(w).all():
        raise ValueError(f"reward weights must be finite, got {w.tolist()}")
    return w


def check_mixing_weights(w: Tensor, balancer: str) -> None:
    """A balancer that mixes rewards by α_k·w_k / Σ_j α_j·w_j needs w ≥ 0 with some w > 0 (else 0/0)."""
    if (w < 0).any() or not (w > 0).any():
        raise ValueError(f"{balancer} reward weights must be ≥ 0 with at least one > 0, got {w.tolist()}")


def group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """(inverse (N,) mapping each sample to its group 0..G−1, G); G = 0 for an empty batch."""
    inv = torch.unique(group_ids, return_inverse=True)[1]
    return inv, (int(inv.max()) + 1 if inv.numel() else 0)


def per_reward_advantages(R: Tensor, group_ids: Tensor, std: str = "group", eps: float = 1e-4,
                          unbiased: bool = True) -> Tensor:
    """Â_k = (R_k − mean_group R_k) / (std R_k + eps) per column, NaN where R is NaN: (N, K)."""
    cols = [group_advantages(R[:, k], group_ids, std=std, eps=eps, unbiased=unbiased) for k in range(R.shape[1])]
    return torch.stack(cols, dim=1)


def weighted_total(R: Tensor, w: Tensor) -> Tensor:
    """S_i = Σ_{k: R_ik finite} w_k R_ik in float64 (float32 sums overflow near 3e38), NaN where no reward
    applies: (N,)."""
    Rd = R.double()
    S = torch.where(torch.isfinite(Rd), Rd * w.double(), torch.zeros_like(Rd)).sum(dim=1)
    return torch.where(any_finite(R), S, torch.full_like(S, float("nan")))


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
        if torch.isinf(adv).any():
            name = balance.__module__.rsplit(".", 1)[-1]
            raise ValueError(f"balancer {name}: advantages overflow to ±inf for rewards up to "
                             f"{float(torch.nan_to_num(R.abs(), nan=0.0).max()):.3g}; rescale the rewards")
        return adv.to(R.device), diag

    return wrapper
