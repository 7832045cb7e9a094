"""Branching-tree rollouts in the training loop (``sampler.tree``): one tree per prompt, its leaves the group,
its trained edges the rows (docs/training.md "Trees in training").

``TreeStage.run(it)`` → ``TreeSamples``:

- roots: prompt p of iteration n grows one tree from one noise drawn from ``sample_generator(seed, n, p, 0)``;
  every node then draws from its own generator (``samplers.tree``: a chain continues its parent's stream,
  child j of a split gets ``child_generator(parent, step, j)``), so a tree draws the same noise alone or
  beside any other;
- ``velocity_fn(x, σ, roots) = policy.velocity(x, σ, cond.select(roots), w)`` under the "old" adapter: the
  frontier of all this process's trees goes through one call per step (chunks of ``sampler.chunk``), grown by
  the sampling engine (``samplers.engine.SamplingEngine.grow``);
- leaves: the samples the rewards score; a prompt's leaves are its group, so ``train.group_size`` must equal
  the leaves per tree; ``rollout_nfe`` = Σ frontier sizes (a shared prefix once), over all processes.

``TreeSamples.training_rows(A)``: A holds the balancer's advantage of each leaf. They are the leaf values of
the tree credit (``samplers.tree_credit``: backup → node advantages → trained edges), so GRPO trains on the
edges (K = 1 stored step per row, each with its root's conditioning) with the loss unchanged; an objective
that trains on the forward process (NFT, AWR, AWM: ``TRAINS_ON.stores_trajectory`` false) trains on the
leaves with A as is. A tree with a non-finite leaf advantage has all its edges left out (NaN advantage).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from flowrl.objectives.sources import Rollout
from flowrl.training.rollout import Samples, record
from flowrl.types import Cond, RolloutResult


def leaves_per_tree(branch) -> int:
    """Leaves of one tree of a ``BranchPlan``: Π factors, or 1 + Σ factors when only the trunk splits."""
    if branch.trunk:
        return 1 + sum(branch.factors)
    out = 1
    for k in branch.factors:
        out *= k
    return out


@dataclass
class EdgeRows:
    """An iteration's trained tree edges as the update's rows; ``rows(idx)`` is a source's input."""

    cond: Cond                         # per root (this process's trees)
    batch: Any                         # samplers.tree_store.TreeBatch: traj (E, 1, ...), root (E,), ...
    sigmas: Tensor
    how: Rollout

    def __len__(self) -> int:
        return len(self.batch)

    def rows(self, idx: Tensor) -> Rollout:
        traj = self.batch.traj.select(idx)
        result = RolloutResult(traj.x_next[:, 0], self.sigmas, traj, None, 1)
        return Rollout(self.cond.select(self.batch.root[idx]), result, self.how.guidance, self.how.kernel,
                       self.how.kernel_cfg, self.how.reduce)


@dataclass
class TreeSamples(Samples):
    """Samples whose rows are the leaves of this process's trees (one tree per prompt, root-major)."""

    tree: Any = None                   # samplers.tree.TreeRollout
    spec: Any = None                   # samplers.tree_spec.TreeSpec of this iteration
    iteration: int = 0
    root_cond: Cond | None = None
    train_edges: bool = True           # False: the objective trains on the leaves (forward process)

    def training_rows(self, adv: Tensor) -> tuple[Any, Tensor]:
        """GRPO: the trained edges and their advantages from the tree credit; else the leaves and ``adv``."""
        if not self.train_edges:
            self.metrics["train/rows"] = int(adv.shape[0])
            return self, adv
        from samplers.tree import assign_credit

        adv = adv.detach().float().cpu()
        leaf_ok = torch.isfinite(adv)
        credit = assign_credit(self.tree, torch.where(leaf_ok, adv, torch.zeros_like(adv)), self.spec,
                               iteration=self.iteration)
        batch = credit.batch
        if batch is None:
            raise ValueError("sampler.tree: no edge is left to train (every stochastic edge pruned or the "
                             "rollout stored none); loosen sampler.tree.train")
        bad_roots = torch.unique(self.tree.leaf_root[~leaf_ok])
        edge_adv = batch.advantage.float().clone()
        edge_adv[torch.isin(batch.root, bad_roots)] = float("nan")
        ok = edge_adv[torch.isfinite(edge_adv)]
        self.metrics.update({"train/rows": len(batch), "train/forwards": len(batch) * batch.traj.x.shape[1],
                             "tree/edges_trained": len(batch),
                             "tree/edge_adv_abs_mean": float(ok.abs().mean()) if ok.numel() else math.nan})
        return EdgeRows(self.root_cond, batch, self.result.sigmas, self.how), edge_adv

    def rows(self, idx: Tensor) -> Rollout:
        if self.train_edges:
            raise ValueError("tree GRPO trains on edges, not leaves: a balancer that asks for per-reward "
                             "gradients (MARBLE's reward_gram) cannot run with sampler.tree and a trajectory "
                             "objective; use another balancer or a forward-process objective (nft, awr)")
        return super().rows(idx)


class TreeStage:
    """Grows this process's trees of one iteration (module docstring): the sampling engine, the tree config,
    the iteration layout and the step-plan function are all it uses."""

    def __init__(self, engine, tree_cfg, layout, plan):
        self.engine, self.cfg, self.layout, self.plan = engine, tree_cfg, layout, plan
        self.spec = tree_cfg.spec(None)
        kernel = engine.spec.kernel                  # the Kernel the rollout stage built
        first_plan, branch = plan(0), self.branch(0)
        if branch.splits and not kernel.stochastic:
            raise ValueError(f"sampler.tree: split steps are SDE steps but sampler.kernel is {kernel.name!r}; "
                             "set sampler.kernel.kind=flow_sde (or dance_sde, cps)")
        if branch.trunk and first_plan is not None and first_plan.sde_steps:
            raise ValueError("sampler.tree: this branching grows from a deterministic (ODE) trunk; set "
                             "sampler.window={kind: fixed, steps: []}")
        leaves = leaves_per_tree(branch)
        if leaves != layout.G:
            raise ValueError(f"sampler.tree grows {leaves} leaves per tree and a prompt's leaves are its "
                             f"group; set train.group_size={leaves} (it is {layout.G})")

    def branch(self, iteration: int):
        """The iteration's split plan (random windows draw from a generator seeded by (seed, iteration))."""
        from samplers.rng import derived_seed

        rng = random.Random(derived_seed(self.layout.seed, iteration, "branch"))
        return self.spec.branching.plan(iteration, self.engine.spec.steps, rng)

    def run(self, iteration: int) -> TreeSamples:
        from flowrl.data.images import source_images
        from samplers.rng import sample_generator

        lay, eng = self.layout, self.engine
        ids = lay.local_prompts("tree rollouts")
        items = lay.prompts.batch(iteration, lay.P)
        prompts = [items[p][0] for p in ids]
        gens = [sample_generator(lay.seed, iteration, p, 0) for p in ids]
        with torch.no_grad(), lay.dist.autocast():
            cond, tree = eng.grow(prompts, gens, self.plan(iteration), self.branch(iteration), self.spec.noise,
                                  images=source_images([items[p][1] for p in ids]))
            pixels = eng.decode(tree.latents)
        leaf_root = tree.leaf_root
        expected = torch.arange(len(ids)).repeat_interleave(lay.G)
        if not torch.equal(leaf_root, expected):
            raise ValueError(f"sampler.tree: iteration {iteration} grew {leaf_root.numel()} leaves for "
                             f"{len(ids)} trees; train.group_size={lay.G} leaves per tree are needed")
        roots = leaf_root.tolist()
        leaf_cond = cond.select(leaf_root)
        result = RolloutResult(tree.latents, tree.sigmas, None, tree.x0_pred, len(tree.frontier_sizes))
        nfe = tree.forwards * lay.P // len(ids)
        metrics = {"rollout/forwards": nfe, "tree/forwards_per_leaf": tree.forwards / leaf_root.numel(),
                   "tree/leaves": lay.P * lay.G}
        group_ids = torch.tensor([ids[r] for r in roots], dtype=torch.long)
        return TreeSamples([prompts[r] for r in roots], [dict(items[ids[r]][1]) for r in roots], group_ids,
                           leaf_cond, result, pixels, record(eng.spec, leaf_cond, result), nfe, metrics, tree=tree,
                           spec=self.spec, iteration=iteration, root_cond=cond, train_edges=eng.spec.store)
