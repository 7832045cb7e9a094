"""The MGDA min-norm problem on the probability simplex, from a K×K Gram matrix only.

    α* = argmin_{α ∈ Δ_K, α_k ≥ floor}  ½ αᵀ M α,     M_kl = g_k · g_l
(Sener & Koltun 2018, isl-org/MultiObjectiveOptimization@1c6d0d5 multi_task/min_norm_solvers.py; MARBLE solves
the same QP with SLSQP, ``pareto_balancer/mgda.py``.)

Solvers (all in float64):
- ``min_norm_pair``: Sener's closed form for K = 2 (``_min_norm_element_from2``).
- ``frank_wolfe``: Frank–Wolfe with exact line search (``find_min_norm_element_FW``) plus away steps, any K.
- ``exact``: enumerate the faces of the simplex and solve each face's KKT system; exact up to round-off, for
  K ≤ 12 (2^K − 1 faces).
A floor α_k ≥ f is handled by α = f·1 + (1 − K f)·β, β ∈ Δ_K (MARBLE: f·K > 1 → f = 1/K).
"""
from __future__ import annotations

import itertools

import torch
from torch import Tensor


def min_norm_pair(v11: float, v12: float, v22: float) -> float:
    """c minimising ||c·g1 + (1−c)·g2||² from v11=g1·g1, v12=g1·g2, v22=g2·g2 (Sener's edge values 0.999/0.001)."""
    if v12 >= v11:
        return 0.999
    if v12 >= v22:
        return 0.001
    return (v22 - v12) / (v11 + v22 - 2 * v12)


def _check_gram(M: Tensor) -> Tensor:
    if M.dim() != 2 or M.shape[0] != M.shape[1]:
        raise ValueError(f"Gram matrix must be square (K, K), got shape {tuple(M.shape)}")
    if not torch.isfinite(M).all():
        raise ValueError("Gram matrix has non-finite entries; drop invalid rewards before solving")
    return 0.5 * (M.double() + M.double().T)


def frank_wolfe(Q: Tensor, c: Tensor | None = None, max_iter: int = 2000, tol: float = 1e-12) -> Tensor:
    """argmin_{β∈Δ} ½βᵀQβ + cᵀβ by Frank–Wolfe with exact line search and away steps (Lacoste-Julien &
    Jaggi 2015; plain FW as in Sener's MGDA zig-zags when the optimum lies on a face), from the uniform point.
    Stops when the FW duality gap falls below ``tol``."""
    Q = _check_gram(Q)
    K = Q.shape[0]
    c = torch.zeros(K, dtype=torch.float64) if c is None else c.double()
    beta = torch.full((K,), 1.0 / K, dtype=torch.float64)
    for _ in range(max_iter):
        grad = Q @ beta + c
        s = int(torch.argmin(grad))
        d_fw = -beta.clone()
        d_fw[s] += 1.0
        gap = -float(grad @ d_fw)
        if gap < tol:
            break
        active = beta > 0
        v = int(torch.argmax(torch.where(active, grad, torch.full_like(grad, -float("inf")))))
        d_away = beta.clone()
        d_away[v] -= 1.0
        if gap >= -float(grad @ d_away) or beta[v] >= 1.0:
            d, gamma_max = d_fw, 1.0
        else:
            d, gamma_max = d_away, float(beta[v] / (1.0 - beta[v]))
        curv = float(d @ Q @ d)
        slope = float(grad @ d)
        gamma = gamma_max if curv <= 0 else min(gamma_max, -slope / curv)
        beta = (beta + gamma * d).clamp(min=0)
        beta = beta / beta.sum()
    return beta


def exact(Q: Tensor, c: Tensor | None = None, tol: float = 1e-10) -> Tensor:
    """argmin_{β∈Δ} ½βᵀQβ + cᵀβ by solving the KKT system on every face and keeping the best feasible point."""
    Q = _check_gram(Q)
    K = Q.shape[0]
    if K > 12:
        raise ValueError(f"exact simplex QP enumerates 2^K faces; K={K} is too many, use solver='frank_wolfe'")
    c = torch.zeros(K, dtype=torch.float64) if c is None else c.double()
    best, best_val = None, float("inf")
    for size in range(1, K + 1):
        for face in itertools.combinations(range(K), size):
            idx = torch.tensor(face)
            kkt = torch.zeros(size + 1, size + 1, dtype=torch.float64)
            kkt[:size, :size] = Q[idx][:, idx]
            kkt[:size, size] = 1.0
            kkt[size, :size] = 1.0
            rhs = torch.cat([-c[idx], torch.ones(1, dtype=torch.float64)])
            sol = torch.linalg.lstsq(kkt, rhs.unsqueeze(1), driver="gelsd").solution.flatten()[:size]
            if (sol < -tol).any() or abs(float(sol.sum()) - 1.0) > 1e-6:
                continue
            beta = torch.zeros(K, dtype=torch.float64)
            beta[idx] = sol.clamp(min=0)
            beta = beta / beta.sum()
            val = float(0.5 * beta @ Q @ beta + c @ beta)
            if val < best_val - 1e-14:
                best, best_val = beta, val
    return best


def solve_min_norm(M: Tensor, solver: str = "exact", floor: float = 0.0) -> Tensor:
    """α ∈ Δ_K (float64) minimising αᵀMα subject to α_k ≥ floor; ``solver`` is "exact" or "frank_wolfe"."""
    M = _check_gram(M)
    K = M.shape[0]
    floor = 1.0 / K if floor * K > 1 else max(floor, 0.0)
    s = 1.0 - K * floor
    Q = s * s * M                                # α = floor·1 + s·β
    c = s * floor * (M @ torch.ones(K, dtype=torch.float64))
    if solver == "exact":
        beta = exact(Q, c)
    elif solver == "frank_wolfe":
        beta = frank_wolfe(Q, c)
    else:
        raise ValueError(f"solver must be 'exact' or 'frank_wolfe', got {solver!r}")
    return floor + s * beta
