"""Credit assignment on a rollout tree: pure functions on (N,) node tensors (parent ids < child ids).

Backups (leaf rewards R → node values V; a node with one child takes its child's value in every form):

    mean        V(n) = mean_{ℓ ∈ leaves(n)} R(ℓ)                    BranchGRPO ``compute_node_rewards_from_leaves``
    softmax     V(n) = Σ_c softmax_c(α·log π(c|n))·V(c)              BranchGRPO --tree_prob_weighted, α = 1
    logmeanexp  V(n) = (1/λ)·log( (1/|C(n)|)·Σ_c exp(λ·V(c)) )      DTS soft Bellman (arXiv 2506.20701)
                λ → 0: mean of the children's values; λ → ∞: their max (DTS*); both limits exact here.

Advantages of the nodes reached by stochastic edges (an edge parent → c carries A(c)):

    A(c) = (V(c) − b(c)) / (s + eps),  0 where the comparison set has one node or s < min_std,  then clip
    depth     b = mean of V over the stochastic nodes of c's depth in c's tree group (BranchGRPO)
    siblings  b = mean of V over c's stochastic siblings (TempFlow / E-GRPO per-step groups)
    parent    b = V(parent(c))  (TD-like; with the mean backup and equal subtrees it equals the sibling form)
    leaves    only leaves, b = mean over the leaves of the tree group (plain GRPO over final samples)
    s: "group" = std of the comparison set ("parent": of the group's leaf rewards), "global" = std of all leaf
    rewards (Flow-GRPO), "none" = 1 (no eps); ``unbiased`` picks torch.std's (n − 1) or the population form.

``depth`` with std "group" is BranchGRPO's per-(tree, depth) normalisation
(``compute_hierarchical_advantages_by_depth``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from samplers.tree_edges import trained_edges
from samplers.tree_spec import Backup, TreeAdvantage, TreeSpec
from samplers.tree_store import TreeBatch


def _levels(depth: Tensor):
    """Node ids grouped by depth, deepest first (children before parents)."""
    for d in range(int(depth.max()), 0, -1):
        yield torch.nonzero(depth == d).flatten()


def _check_tree(parent: Tensor, depth: Tensor, leaf_values: Tensor) -> Tensor:
    if not (parent.shape == depth.shape == leaf_values.shape) or parent.dim() != 1:
        raise ValueError(f"parent, depth and leaf_values must all be (N,), got {tuple(parent.shape)}, "
                         f"{tuple(depth.shape)}, {tuple(leaf_values.shape)}")
    leaf = torch.ones_like(parent, dtype=torch.bool)
    leaf[parent[parent >= 0]] = False
    if bool(torch.isnan(leaf_values[leaf]).any()):
        raise ValueError("backup: every leaf needs a reward (leaf_values is NaN at a leaf)")
    return leaf


def backup_mean(parent: Tensor, depth: Tensor, leaf_values: Tensor) -> Tensor:
    """V(n) = mean of the leaf rewards below n (leaf_values is read at leaves only)."""
    leaf = _check_tree(parent, depth, leaf_values)
    total = torch.where(leaf, leaf_values.double(), torch.zeros((), dtype=torch.float64))
    count = leaf.double()
    for ids in _levels(depth):
        total.index_add_(0, parent[ids], total[ids])
        count.index_add_(0, parent[ids], count[ids])
    return (total / count).to(leaf_values.dtype)


def _group_max(values: Tensor, index: Tensor, n: int) -> Tensor:
    out = torch.full((n,), -math.inf, dtype=values.dtype)
    return out.scatter_reduce(0, index, values, reduce="amax", include_self=True)


def backup_softmax(parent: Tensor, depth: Tensor, leaf_values: Tensor, log_prob: Tensor,
                   alpha: float = 1.0) -> Tensor:
    """V(n) = Σ_c softmax_c(α·log π(c|n))·V(c); log π must be finite wherever a node has several children."""
    leaf = _check_tree(parent, depth, leaf_values)
    values = torch.where(leaf, leaf_values.double(), torch.zeros((), dtype=torch.float64))
    n = parent.numel()
    has_parent = parent[parent >= 0]
    n_kids = torch.zeros(n, dtype=torch.long).index_add_(0, has_parent, torch.ones_like(has_parent))
    for ids in _levels(depth):
        p = parent[ids]
        lp = log_prob[ids].double()
        several = n_kids[p] > 1
        if bool((several & ~torch.isfinite(lp)).any()):
            raise ValueError("softmax backup: a node with several children has a child without log-prob "
                             "(a deterministic edge); use the mean or logmeanexp backup for such trees")
        logit = torch.where(several, alpha * lp, torch.zeros_like(lp))
        w = torch.exp(logit - _group_max(logit, p, n)[p])
        z = torch.zeros(n, dtype=torch.float64).index_add_(0, p, w)
        acc = torch.zeros(n, dtype=torch.float64).index_add_(0, p, w * values[ids])
        values[p] = (acc / z)[p]
    return values.to(leaf_values.dtype)


def log_mean_exp(values: Tensor, lam: float, dim: int = -1) -> Tensor:
    """(1/λ)·log mean exp(λ·values) along ``dim``; λ = 0 gives the mean, λ = inf the max."""
    if lam == 0:
        return values.mean(dim)
    if math.isinf(lam):
        return values.amax(dim)
    return (torch.logsumexp(lam * values, dim) - math.log(values.shape[dim])) / lam


def backup_log_mean_exp(parent: Tensor, depth: Tensor, leaf_values: Tensor, lam: float) -> Tensor:
    """V(n) = (1/λ)·log mean_c exp(λ·V(c)) over n's children (soft Bellman backup of DTS)."""
    if lam < 0:
        raise ValueError(f"logmeanexp backup: λ must be >= 0, got {lam}")
    leaf = _check_tree(parent, depth, leaf_values)
    values = torch.where(leaf, leaf_values.double(), torch.zeros((), dtype=torch.float64))
    n = parent.numel()
    for ids in _levels(depth):
        p = parent[ids]
        cnt = torch.zeros(n, dtype=torch.float64).index_add_(0, p, torch.ones_like(values[ids]))
        if lam == 0:
            agg = torch.zeros(n, dtype=torch.float64).index_add_(0, p, values[ids]) / cnt
        elif math.isinf(lam):
            agg = _group_max(values[ids], p, n)
        else:
            s = lam * values[ids]
            m = _group_max(s, p, n)
            tot = torch.zeros(n, dtype=torch.float64).index_add_(0, p, torch.exp(s - m[p]))
            agg = (m + torch.log(tot) - torch.log(cnt)) / lam
        values[p] = agg[p]
    return values.to(leaf_values.dtype)


def backup(parent: Tensor, depth: Tensor, leaf_values: Tensor, cfg: Backup,
           log_prob: Tensor | None = None) -> Tensor:
    """Node values by ``cfg.kind`` (module docstring)."""
    if cfg.kind == "mean":
        return backup_mean(parent, depth, leaf_values)
    if cfg.kind == "softmax":
        if log_prob is None:
            raise ValueError("softmax backup needs the edges' log_prob")
        return backup_softmax(parent, depth, leaf_values, log_prob, cfg.alpha)
    return backup_log_mean_exp(parent, depth, leaf_values, cfg.lam)


def _set_stats(values: Tensor, key: Tensor, unbiased: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Per-node (mean, std, count) over the nodes sharing its key (float64)."""
    inv = torch.unique(key, return_inverse=True)[1]
    g = int(inv.max()) + 1 if inv.numel() else 0
    v = values.double()
    cnt = torch.zeros(g, dtype=torch.float64).index_add_(0, inv, torch.ones_like(v))
    mean = torch.zeros(g, dtype=torch.float64).index_add_(0, inv, v) / cnt
    ss = torch.zeros(g, dtype=torch.float64).index_add_(0, inv, (v - mean[inv]) ** 2)
    denom = cnt - float(unbiased)
    std = torch.where(denom > 0, (ss / denom.clamp(min=1)).sqrt(), torch.zeros_like(ss))
    return mean[inv], std[inv], cnt[inv]


def _std(v: Tensor, unbiased: bool) -> Tensor:
    v = v.double()
    return v.std(unbiased=unbiased) if v.numel() > int(unbiased) else torch.zeros((), dtype=torch.float64)


def node_advantages(values: Tensor, parent: Tensor, depth: Tensor, group: Tensor, stochastic: Tensor,
                    cfg: TreeAdvantage) -> Tensor:
    """(N,) advantages by ``cfg`` (module docstring); NaN for nodes that are not compared (roots, nodes behind
    a deterministic edge, and every non-leaf with kind "leaves")."""
    leaf = torch.ones_like(parent, dtype=torch.bool)
    leaf[parent[parent >= 0]] = False
    scored = leaf if cfg.kind == "leaves" else stochastic.clone()
    adv = torch.full(values.shape, float("nan"), dtype=torch.float64)
    ids = torch.nonzero(scored).flatten()
    if ids.numel() == 0:
        return adv.to(values.dtype)
    v = values[ids].double()
    if cfg.kind == "parent":
        base, count = values[parent[ids]].double(), torch.full_like(v, 2.0)
        set_std = _set_stats(values[leaf], group[leaf], cfg.unbiased)[1]
        grp_std = torch.zeros(int(group.max()) + 1, dtype=torch.float64).index_copy_(0, group[leaf], set_std)
        spread = grp_std[group[ids]]
    else:
        key = {"depth": group[ids] * (int(depth.max()) + 1) + depth[ids], "siblings": parent[ids],
               "leaves": group[ids]}[cfg.kind]
        base, spread, count = _set_stats(v, key, cfg.unbiased)
    if cfg.std == "global":
        spread = _std(values[leaf], cfg.unbiased).expand_as(v)
    if cfg.std == "none":
        a = v - base
    else:
        a = (v - base) / (spread + cfg.eps)
        a = torch.where(spread < cfg.min_std, torch.zeros_like(a), a)
    a = torch.where(count <= 1, torch.zeros_like(a), a)
    if cfg.clip is not None:
        a = a.clamp(-cfg.clip, cfg.clip)
    adv[ids] = a
    return adv.to(values.dtype)


@dataclass
class TreeCredit:
    """Credit of one rollout tree: node values (N,), node advantages (N,; NaN where not compared), the trained
    edges as a ``TreeBatch`` (None when the rollout stored no edges), and the leaves' advantages (L,)."""

    values: Tensor
    advantages: Tensor
    batch: TreeBatch | None
    leaf_advantages: Tensor


def assign_credit(tree, leaf_rewards: Tensor, spec: TreeSpec, root_groups: Tensor | None = None,
                  iteration: int = 0) -> TreeCredit:
    """Backup → advantages → trained edges for a ``samplers.tree.TreeRollout``.

    leaf_rewards: (L,) rewards of ``tree.latents`` rows. root_groups: (R,) group id of each root (the prompt:
    trees of one prompt are compared together); None = each root its own group (one tree per prompt).
    """
    nodes = tree.nodes
    n_leaves = tree.leaf_nodes.numel()
    r = torch.as_tensor(leaf_rewards, dtype=torch.float32).flatten().cpu()
    if r.numel() != n_leaves:
        raise ValueError(f"assign_credit: {r.numel()} rewards for {n_leaves} leaves; pass one per "
                         "tree.latents row")
    groups = torch.arange(tree.num_roots) if root_groups is None else \
        torch.as_tensor(root_groups, dtype=torch.long)
    if groups.shape != (tree.num_roots,):
        raise ValueError(f"root_groups must be ({tree.num_roots},), one group id per root, got "
                         f"{tuple(groups.shape)}")
    leaf_values = torch.full((len(nodes),), float("nan")).index_copy_(0, tree.leaf_nodes, r)
    values = backup(nodes.parent, nodes.depth, leaf_values, spec.backup, nodes.log_prob)
    adv = node_advantages(values, nodes.parent, nodes.depth, groups.cpu()[nodes.root], nodes.stochastic,
                          spec.advantage)
    ids = trained_edges(nodes, adv, spec.train, tree.branch.splits, iteration)
    batch = tree.edge_batch(ids, adv[ids]) if (tree.edges is not None and ids.numel()) else None
    return TreeCredit(values, adv, batch, adv[tree.leaf_nodes])
