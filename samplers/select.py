"""Candidate-pool selectors (keep K of N scout scores per prompt) and scout ranking-fidelity metrics.

Pure functions on tensors. ``scores`` is (N,) or (P, N): P prompts, N candidates each. A selector returns the
kept candidate indices, (K,) or (P, K) int64, **sorted ascending** in each row (a set, not a ranking).

Ranking and ties. Every selector ranks candidates by one total order: score descending, and among equal scores
the lower index first (``torch.sort(..., descending=True, stable=True)``). "Top m" is the first m of that order,
"bottom m" the last m, so a top set and a bottom set never overlap and a selection always has K distinct
indices (Sol-RL's ``select_indices_by_mode`` takes ``topk`` and ``bottomk`` separately, which can return a
candidate twice when scores tie; the discrete toy rewards tie often).

Selectors (Sol-RL, arXiv 2604.06916, code ``NVlabs/Sana`` ``train_scripts/sol_rl/train_utils.py``):

- ``best_worst``:      top ⌊K/2⌋ ∪ bottom K − ⌊K/2⌋ (Sol-RL's default, "24-in-96").
- ``mean_deviation``:  the K largest |r − r̄|, r̄ = mean of the prompt's N scores (float64); ties → lower index.
- ``extremes_random``: the top 1 and the bottom 1, then K − 2 drawn uniformly without replacement from the
  other N − 2 as ``torch.randperm(N − 2, generator=g)[:K − 2]`` over those candidates in index order (K = 1: the
  top 1 only). Prompts draw from ``g`` in row order.
- ``random``:          ``torch.randperm(N, generator=g)[:K]`` per prompt, rows in order.
- ``max_variance``:    the K-subset of maximum population variance (Pro-GRPO's Optimal Variance Filtering,
  arXiv 2512.15347). Exact: with scores sorted ascending, some optimal subset is the j lowest ∪ the K − j
  highest. Proof: fix a subset S and an element x ∈ S; the variance of S with x replaced by y is a quadratic in
  y with leading coefficient (K − 1)/K² > 0, hence strictly convex. If x lies strictly between two excluded
  scores a < x < b, replacing x by a or b strictly raises the variance, so an optimal S has no such x: its
  excluded scores form one contiguous run of the sorted order (scores equal to x can swap labels without
  changing the multiset). So the K + 1 prefix+suffix splits are searched; among equal variances the smallest j
  (the most top candidates) wins.

Metrics (per prompt, rows of (P, N) inputs; reference = the full policy's rewards of the same seeds):

- ``kendall_tau_b(a, b)`` = (n_c − n_d) / sqrt((n₀ − n₁)(n₀ − n₂)), n₀ = N(N − 1)/2, n₁/n₂ = pairs tied in a/b;
  = Σ_{i<j} sgn(a_i − a_j) sgn(b_i − b_j) / sqrt(Σ_{i<j} |sgn(a_i − a_j)| · Σ_{i<j} |sgn(b_i − b_j)|)
  (Kendall 1945; what ``scipy.stats.kendalltau`` computes). NaN when a or b is constant.
- ``top_bottom_hit_rate``: of the scout's top n_top, the fraction whose reference reward is ≥ the reference's
  n_top-th largest; of its bottom n_bottom, the fraction ≤ the reference's n_bottom-th smallest (tie-aware).
- ``selected_contrast``: (mean ref over scout-top − mean ref over scout-bottom) ÷ (the same gap with the
  reference's own top and bottom); 1 = oracle, about 0 = random, −1 = reversed; NaN when the reference is
  constant.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["SELECTORS", "best_worst", "extremes_random", "kendall_tau_b", "max_variance", "mean_deviation",
           "random", "rank_order", "select", "selected_contrast", "top_bottom_hit_rate"]


def _as_rows(scores: Tensor, name: str = "scores") -> tuple[Tensor, bool]:
    """(P, N) float view of (N,) or (P, N) scores, and whether the input was 1-D."""
    if not isinstance(scores, Tensor) or scores.dim() not in (1, 2) or not scores.is_floating_point():
        raise ValueError(f"{name} must be a 1-D (N,) or 2-D (P, N) float tensor, got "
                         f"{getattr(scores, 'shape', type(scores))}")
    if scores.shape[-1] == 0:
        raise ValueError(f"{name} must have at least one candidate (N ≥ 1)")
    if torch.isnan(scores).any():
        raise ValueError(f"{name} contains NaN; score every candidate before selecting")
    return (scores.unsqueeze(0), True) if scores.dim() == 1 else (scores, False)


def _check_k(k: int, n: int) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= n:
        raise ValueError(f"k must be an int in [1, N={n}], got {k!r}")


def _finish(idx: Tensor, squeeze: bool) -> Tensor:
    idx = idx.sort(dim=-1).values
    return idx.squeeze(0) if squeeze else idx


def rank_order(scores: Tensor) -> Tensor:
    """Candidate indices best first: score descending, ties → lower index first. (P, N) → (P, N)."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices


def best_worst(scores: Tensor, k: int, generator: torch.Generator | None = None) -> Tensor:
    """Top ⌊K/2⌋ ∪ bottom K − ⌊K/2⌋ of each row (Sol-RL ``best_worst``); indices sorted ascending."""
    rows, squeeze = _as_rows(scores)
    n = rows.shape[-1]
    _check_k(k, n)
    order = rank_order(rows)
    n_top = k // 2
    return _finish(torch.cat([order[:, :n_top], order[:, n - (k - n_top):]], dim=-1), squeeze)


def mean_deviation(scores: Tensor, k: int, generator: torch.Generator | None = None) -> Tensor:
    """The K candidates farthest from the prompt's mean score, |r − r̄| in float64; ties → lower index."""
    rows, squeeze = _as_rows(scores)
    _check_k(k, rows.shape[-1])
    r = rows.double()
    dev = (r - r.mean(dim=-1, keepdim=True)).abs()
    return _finish(rank_order(dev)[:, :k], squeeze)


def _need_generator(name: str, generator: torch.Generator | None) -> torch.Generator:
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"{name}: pass generator=torch.Generator (seeded) so the selection is reproducible")
    return generator


def extremes_random(scores: Tensor, k: int, generator: torch.Generator | None = None) -> Tensor:
    """Top 1 and bottom 1, plus K − 2 uniform draws from the rest (module docstring); K = 1 → top 1."""
    rows, squeeze = _as_rows(scores)
    n = rows.shape[-1]
    _check_k(k, n)
    g = _need_generator("extremes_random", generator)
    order = rank_order(rows).cpu()
    if k == 1:
        return _finish(order[:, :1].to(rows.device), squeeze)
    out = []
    for p in range(rows.shape[0]):
        keep = torch.ones(n, dtype=torch.bool)
        keep[order[p, 0]] = keep[order[p, -1]] = False
        rest = torch.nonzero(keep).squeeze(1)               # the other N − 2, index order
        fill = rest[torch.randperm(n - 2, generator=g, device=g.device)[:k - 2].cpu()]
        out.append(torch.cat([order[p, :1], order[p, -1:], fill]))
    return _finish(torch.stack(out).to(rows.device), squeeze)


def random(scores: Tensor, k: int, generator: torch.Generator | None = None) -> Tensor:
    """K candidates uniformly without replacement: ``randperm(N, generator=g)[:K]`` per row, rows in order."""
    rows, squeeze = _as_rows(scores)
    n = rows.shape[-1]
    _check_k(k, n)
    g = _need_generator("random", generator)
    picks = torch.stack([torch.randperm(n, generator=g, device=g.device)[:k].cpu() for _ in range(rows.shape[0])])
    return _finish(picks.to(rows.device), squeeze)


def max_variance(scores: Tensor, k: int, generator: torch.Generator | None = None) -> Tensor:
    """The K-subset of maximum variance (Pro-GRPO OVF): best of the K + 1 splits j lowest ∪ K − j highest."""
    rows, squeeze = _as_rows(scores)
    n = rows.shape[-1]
    _check_k(k, n)
    order = rank_order(rows).flip(-1)                      # ascending score (ties: higher index first)
    j = torch.arange(k + 1).unsqueeze(1)                     # j lowest, k − j highest
    slot = torch.arange(k).unsqueeze(0)
    pos = torch.where(slot < j, slot, n - k + slot)          # (k+1, k) positions in ascending order
    cand = order[:, pos.to(rows.device)]                     # (P, k+1, k) indices
    var = torch.gather(rows.double(), 1, cand.flatten(1)).view_as(cand).var(dim=-1, unbiased=False)
    best_j = torch.argmax(var, dim=-1)                       # first maximum = smallest j
    pick = cand[torch.arange(rows.shape[0], device=rows.device), best_j]
    return _finish(pick, squeeze)


Selector = Callable[..., Tensor]

SELECTORS: dict[str, Selector] = {
    "best_worst": best_worst,
    "mean_deviation": mean_deviation,
    "extremes_random": extremes_random,
    "random": random,
    "max_variance": max_variance,
}


def select(scores: Tensor, k: int, mode: str = "best_worst", generator: torch.Generator | None = None) -> Tensor:
    """Dispatch to ``SELECTORS[mode]``."""
    if mode not in SELECTORS:
        raise ValueError(f"selector mode must be one of {sorted(SELECTORS)}, got {mode!r}")
    return SELECTORS[mode](scores, k, generator=generator)


def _pair(a: Tensor, b: Tensor, name: str) -> tuple[Tensor, Tensor, bool]:
    ra, squeeze = _as_rows(a, f"{name}: scout")
    rb, _ = _as_rows(b, f"{name}: reference")
    if ra.shape != rb.shape:
        raise ValueError(f"{name}: scout and reference must have the same shape, got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    return ra, rb, squeeze


def kendall_tau_b(a: Tensor, b: Tensor) -> Tensor:
    """Kendall's τ-b between a and b per row (module docstring); () for 1-D inputs, (P,) for 2-D."""
    ra, rb, squeeze = _pair(a, b, "kendall_tau_b")
    n = ra.shape[-1]
    iu = torch.triu_indices(n, n, offset=1, device=ra.device)
    sa = torch.sign(ra[:, iu[0]].double() - ra[:, iu[1]].double())
    sb = torch.sign(rb[:, iu[0]].double() - rb[:, iu[1]].double())
    num = (sa * sb).sum(-1)
    den = torch.sqrt(sa.abs().sum(-1) * sb.abs().sum(-1))
    tau = torch.where(den > 0, num / den.clamp_min(1.0), torch.full_like(num, float("nan")))
    return tau.squeeze(0) if squeeze else tau


def _check_sides(n_top: int, n_bottom: int | None, n: int, name: str) -> int:
    n_bottom = n_top if n_bottom is None else n_bottom
    for side, val in (("n_top", n_top), ("n_bottom", n_bottom)):
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise ValueError(f"{name}: {side} must be an int ≥ 1, got {val!r}")
    if n_top + n_bottom > n:
        raise ValueError(f"{name}: n_top + n_bottom must be ≤ N={n}, got {n_top} + {n_bottom}")
    return n_bottom


def top_bottom_hit_rate(scout: Tensor, reference: Tensor, n_top: int,
                        n_bottom: int | None = None) -> tuple[Tensor, Tensor]:
    """(top hit, bottom hit) per row: the share of the scout's top n_top (bottom n_bottom) whose reference
    reward reaches the reference's n_top-th best (n_bottom-th worst) value. ``n_bottom`` defaults to n_top."""
    rs, rr, squeeze = _pair(scout, reference, "top_bottom_hit_rate")
    n = rs.shape[-1]
    n_bottom = _check_sides(n_top, n_bottom, n, "top_bottom_hit_rate")
    order = rank_order(rs)
    ref_sorted = rr.sort(dim=-1, descending=True).values
    top_ref = torch.gather(rr, 1, order[:, :n_top])
    bottom_ref = torch.gather(rr, 1, order[:, n - n_bottom:])
    top = (top_ref >= ref_sorted[:, n_top - 1:n_top]).double().mean(-1)
    bottom = (bottom_ref <= ref_sorted[:, n - n_bottom:n - n_bottom + 1]).double().mean(-1)
    return (top.squeeze(0), bottom.squeeze(0)) if squeeze else (top, bottom)


def _gap(reference: Tensor, order: Tensor, n_top: int, n_bottom: int) -> Tensor:
    r = reference.double()
    n = r.shape[-1]
    return torch.gather(r, 1, order[:, :n_top]).mean(-1) - torch.gather(r, 1, order[:, n - n_bottom:]).mean(-1)


def selected_contrast(scout: Tensor, reference: Tensor, n_top: int, n_bottom: int | None = None) -> Tensor:
    """Reference-reward gap between the scout's top n_top and bottom n_bottom ÷ the reference's own (oracle)
    gap, per row; NaN where the oracle gap is 0. ``n_bottom`` defaults to n_top."""
    rs, rr, squeeze = _pair(scout, reference, "selected_contrast")
    n_bottom = _check_sides(n_top, n_bottom, rs.shape[-1], "selected_contrast")
    gap = _gap(rr, rank_order(rs), n_top, n_bottom)
    oracle = _gap(rr, rank_order(rr), n_top, n_bottom)
    ratio = torch.where(oracle > 0, gap / oracle.clamp_min(torch.finfo(torch.float64).tiny),
                        torch.full_like(gap, float("nan")))
    return ratio.squeeze(0) if squeeze else ratio
