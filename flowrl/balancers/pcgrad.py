"""PCGrad — gradient surgery as per-reward advantage weights from the K×K gradient Gram (Yu et al., "Gradient
Surgery for Multi-Task Learning", NeurIPS 2020, arXiv 2001.06782, Algorithm 1).

PCGrad, for each task i, projects g_i onto the normal plane of every g_j (j ≠ i, in a random order) it still
conflicts with, sequentially, then sums:

    g_i' ← g_i;   for j in π_i:  if g_i'·g_j < 0:  g_i' ← g_i' − (g_i'·g_j / |g_j|²) g_j;      g = Σ_i g_i'

Every g_i' stays a linear combination g_i' = Σ_k C_ik g_k and g_i'·g_j = (C_i G)_j with G_kl = g_k·g_l, so the
surgery runs on the Gram alone (``pcgrad_coefficients``): g = Σ_k c_k g_k, c = Σ_i C_i. Projections only ever
add |g_i'·g_j|/|g_j|² ≥ 0 to C_ij and C_ii = 1, so c_k ≥ 1 and s = Σ_k c_k ≥ K > 0.

From coefficients to one advantage (MARBLE's affine trick, arXiv 2605.06507). g_k = ∇L(A_k) is the objective's
gradient for reward k's advantages A_k. For a loss affine in A (NFT, AWR, AWM here; Flow-GRPO's clipped ratio
loss on its first, on-policy step), L(A) = a + A·b with a constant term a that does not depend on A, so

    Σ_k c_k ∇L(A_k) = s·∇a + (Σ_k c_k A_k)·∇b = s·∇L(Σ_k c̄_k A_k),      c̄_k = c_k / s.

The balancer returns A = Σ_k c̄_k nan_to_num(A_k): one backward gives PCGrad's direction exactly, scaled by
1/s; the constant term (NFT's trust-region part at r = ½) comes out once, as in the single-reward loss. The
factor s is reported as ``scale`` (diagnostic); it is not applied: AdamW is invariant to a constant gradient
scale and the update's norm is clipped anyway. Caveats shared with MARBLE's amortized step: the Gram comes from one
micro-batch, each g_k averages over the samples where reward k applies, while the mixed loss averages over all
samples (NaN → 0), and the objective clips A once, after mixing.

Randomness: the orders π_i come from a generator seeded by (``seed``, the number of earlier calls kept in the
checkpointed state), so a resumed run draws the same orders. Algorithm 1 as published excludes j = i; the TF
release iterates all tasks including i (a no-op unless g_i' has turned against g_i). Static ``weights`` w
scale the per-reward gradients before surgery (G ← diag(w) G diag(w); coefficient on g_k: c_k w_k). A reward
whose gradient is zero on the micro-batch conflicts with nothing and keeps c = w. With ``solve_every`` > 1
the normalised coefficients of the last solve are reused in between (an amortisation PCGrad itself does
not have). State keys: ``coef`` (K,), ``scale``, ``calls``, ``solves``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.balancers.common import any_finite, check_inputs, on_cpu, per_reward_advantages
from flowrl.balancers.services import NoServices
from samplers.rng import derived_generator

NEEDS_REWARD_GRADIENTS = True        # asks services.reward_gram (flowrl.contracts.Balancer)


@dataclass
class Config:
    std: str = "global"      # per-reward advantages as MARBLE's (one global-std stat tracker per reward)
    eps: float = 1e-4
    unbiased: bool = False
    seed: int = 0            # seeds the random projection orders (with the call count)
    solve_every: int = 1     # a fresh Gram every N calls (1 = PCGrad as published: every step)

    def __post_init__(self):
        if self.solve_every < 1:
            raise ValueError(f"pcgrad solve_every must be ≥ 1, got {self.solve_every}")


def needs_gram(state: dict, cfg: Config | None = None) -> bool:
    """Whether the next call asks for a fresh Gram (the first call and every ``solve_every``-th)."""
    cfg = cfg or Config()
    return "coef" not in state or state.get("calls", 0) % cfg.solve_every == 0


def random_orders(K: int, gen: torch.Generator) -> list[list[int]]:
    """For each task i, the other tasks j ≠ i in a uniformly random order (one permutation per i)."""
    orders = []
    for i in range(K):
        others = [j for j in range(K) if j != i]
        orders.append([others[p] for p in torch.randperm(K - 1, generator=gen).tolist()])
    return orders


def pcgrad_coefficients(gram: Tensor, orders: list[list[int]]) -> tuple[Tensor, int]:
    """C (K, K) float64 with g_i' = Σ_k C_ik g_k after PCGrad's sequential projections in ``orders``, and the
    number of projections made. Non-finite rows/columns of the Gram, and gradients with |g_j|² ≤ 1e-24·max_k |g_k|²
    (as MARBLE), count as zero gradients: projecting onto a vanishing g_j would put an unbounded coefficient on it."""
    G = torch.nan_to_num(gram.double(), nan=0.0, posinf=0.0, neginf=0.0)
    K = G.shape[0]
    if G.shape != (K, K) or len(orders) != K:
        raise ValueError(f"gram must be square (K, K) with one order per task, got {tuple(G.shape)} and "
                         f"{len(orders)} orders")
    C = torch.eye(K, dtype=torch.float64)
    floor = 1e-24 * float(torch.diagonal(G).max().clamp(min=0)) if K else 0.0
    projections = 0
    for i in range(K):
        for j in orders[i]:
            dot = float(C[i] @ G[:, j])
            if dot < 0 and G[j, j] > floor and G[j, j] > 0:
                C[i, j] -= dot / float(G[j, j])
                projections += 1
    return C, projections


def solve_coefficients(gram: Tensor, w: Tensor, orders: list[list[int]]) -> tuple[Tensor, float, int]:
    """(c̄ (K,) summing to 1, s = Σ c, projections) for the weighted gradients w_k g_k, as weights on g_k."""
    Gw = gram.double() * w[:, None] * w[None, :]
    C, projections = pcgrad_coefficients(Gw, orders)
    c = C.sum(0) * w
    s = float(c.sum())
    return c / s, s, projections


@on_cpu
def balance(R: Tensor, group_ids: Tensor, weights=None, state: dict | None = None,
            cfg: Config | None = None, services=None) -> tuple[Tensor, dict]:
    cfg = cfg or Config()
    state = {} if state is None else state
    w = check_inputs(R, group_ids, weights).double()
    if (w < 0).any() or not (w > 0).any():
        raise ValueError(f"pcgrad reward weights must be ≥ 0 with at least one > 0, got {w.tolist()}")
    K = R.shape[1]
    A_k = per_reward_advantages(R, group_ids, std=cfg.std, eps=cfg.eps, unbiased=cfg.unbiased)
    solved = needs_gram(state, cfg)
    if solved:
        gram = (services or NoServices()).reward_gram(A_k).detach().cpu().double()
        if gram.shape != (K, K):
            raise ValueError(f"gram must be ({K}, {K}) for {K} rewards, got {tuple(gram.shape)}")
        gen = derived_generator(cfg.seed, state.get("calls", 0), namespace="flowrl-pcgrad")
        coef, scale, projections = solve_coefficients(gram, w, random_orders(K, gen))
        state.update(coef=coef, scale=scale, projections=projections, solves=state.get("solves", 0) + 1)
    state["calls"] = state.get("calls", 0) + 1
    coef = state["coef"].double()
    adv = (torch.nan_to_num(A_k.double(), nan=0.0) * coef).sum(dim=1).to(R.dtype)
    adv = torch.where(any_finite(R), adv, torch.full_like(adv, float("nan")))
    diag = {f"alpha_{k}": coef[k].float() for k in range(K)}
    diag.update(scale=torch.tensor(float(state["scale"])), solved=torch.tensor(float(solved)),
                projections=torch.tensor(float(state["projections"])))
    return adv, diag
