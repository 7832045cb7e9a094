"""Which stochastic edges of a rollout tree get gradients (BranchGRPO pruning, ``--depth_pruning`` /
``--width_pruning_mode``; window-only).

An edge is named by its child node c (it carries A(c), depth(c) = edges from the root, step(c) = the grid step
of the transition). Starting from every stochastic edge:

  window_only   keep edges whose step is a split step of the plan (the tree steps S_tree)
  depth_prune   drop edges with depth(c) ∈ D − shift, shift = min(⌊n/I⌋, max(0, min D − stop)) when
                sliding every I iterations (stop = ``depth_stop``, default the last split step) —
                BranchGRPO ``--depth_pruning``
  width         on the "last-layer" edges (step > last split step), BranchGRPO ``--width_pruning_mode``:
                per_branch (1): group by the node created at the last split that the edge descends from, keep
                the top max(1, ⌊n_g·ratio⌋) of each group by advantage;
                best_worst (2): keep the best ⌊k/2⌋ and worst k − ⌊k/2⌋, k = max(2, ⌊n·ratio⌋), of all of them
Pruning (depth and width) applies while ``iteration ≤ prune_until`` (always when None). Ties keep the
lower id.
"""
from __future__ import annotations

import torch
from torch import Tensor

from samplers.tree_spec import TrainEdges
from samplers.tree_store import NodeTable


def depth_pruned(depths: tuple[int, ...], iteration: int, cfg: TrainEdges,
                 split_steps: tuple[int, ...]) -> set[int]:
    """The child depths dropped at ``iteration`` (sliding window shifted shallower)."""
    if not depths:
        return set()
    shift = 0
    if cfg.depth_slide_every is not None:
        stop = cfg.depth_stop if cfg.depth_stop is not None else (max(split_steps) if split_steps else 0)
        shift = min(iteration // cfg.depth_slide_every, max(0, min(depths) - stop))
    return {d - shift for d in depths}


def _ranked(ids: list[int], adv: Tensor) -> list[int]:
    """ids sorted by advantage, best first (stable: ties keep the lower id first)."""
    return sorted(ids, key=lambda i: (-float(adv[i]), i))


def _branch_of(node: int, parent: Tensor, step: Tensor, last_split: int) -> int:
    while node >= 0 and int(step[node]) != last_split:
        node = int(parent[node])
    return node


def width_pruned(nodes: NodeTable, candidates: list[int], adv: Tensor, cfg: TrainEdges,
                 last_split: int) -> list[int]:
    """The candidates left after width pruning of the last-layer edges (module docstring)."""
    last = [i for i in candidates if int(nodes.step[i]) > last_split]
    if not last:
        return candidates
    keep = set(candidates) - set(last)
    if cfg.width == "per_branch":
        groups: dict[int, list[int]] = {}
        for i in last:
            groups.setdefault(_branch_of(i, nodes.parent, nodes.step, last_split), []).append(i)
        for members in groups.values():
            keep.update(_ranked(members, adv)[: max(1, int(len(members) * cfg.width_ratio))])
    else:
        ranked = _ranked(last, adv)
        k = max(2, int(len(last) * cfg.width_ratio))
        best = k // 2
        keep.update(ranked[:best])
        keep.update(ranked[len(ranked) - (k - best):])
    return sorted(keep)


def trained_edges(nodes: NodeTable, adv: Tensor, cfg: TrainEdges, split_steps: tuple[int, ...],
                  iteration: int = 0) -> Tensor:
    """Child-node ids (E,) of the edges to train, increasing."""
    cand = nodes.stochastic.clone()
    if cfg.window_only:
        cand &= torch.isin(nodes.step, torch.tensor(split_steps, dtype=torch.long))
    prune = cfg.prune_until is None or iteration <= cfg.prune_until
    if prune and cfg.depth_prune:
        dropped = sorted(depth_pruned(cfg.depth_prune, iteration, cfg, split_steps))
        cand &= ~torch.isin(nodes.depth, torch.tensor(dropped, dtype=torch.long))
    ids = torch.nonzero(cand).flatten().tolist()
    if prune and cfg.width != "none" and split_steps:
        ids = width_pruned(nodes, ids, adv, cfg, max(split_steps))
    return torch.tensor(ids, dtype=torch.long)
