"""The rollout engine: a tree of denoising paths advanced one step at a time with ONE batched model call per
step; the flat rollout (``samplers.rollout.rollout``) is the tree that never splits.

Design
------
State: the frontier (F rows: latent, node id, root index, generator, trunk flag, multistep history) and the
node store (``samplers.tree_store``). The σ grid, the ``StepPlan`` (SDE steps, merged spans, compressed DPM
tail) and the ``BranchPlan`` (splits) compile into *stages* ``(grid step i, σ_i → σ_{i+m}, SDE?, split factor
k, tail?)``. Each stage:

 1. ``v = velocity_fn(x, σ_i·1_F, roots)`` — one call on the whole frontier (chunks of ``max_batch`` if set);
    ``roots`` (F,) lets the caller pick each row's conditioning.
 2. children per row: ODE stage → 1 ODE child; SDE stage → 1 SDE child; split stage (always SDE) → k SDE
    children. In trunk mode (TempFlow / E-GRPO) only the trunk row splits: 1 ODE child (the trunk goes on)
    plus k SDE children that never split again; all other rows take ODE steps.
 3. SDE children: ``kernel.step(x, v, σ, σ', c·ε)``, log π = ``kernel.log_prob`` under the nominal std (c =
    the split noise scale at split stages, 1 elsewhere; the stored ε is c·ε so x' = μ + s·ε holds). ε comes
    from the child's own generator: a chain continues its parent's (so a tree that never splits draws exactly
    the flat rollout's per-sample stream), child j of a split gets ``child_generator(parent, step, j)``
    (sha256 of the parent's seed, step, j). A node's noise therefore never depends on its batch companions.
    ODE children: ``ode_kernel.step`` — Euler (bit-identical to diffusers) or a multistep kernel (dpmpp_2m)
    fed the row's ``history = (x̂0_prev, σ_prev)``, which passes along ODE edges and resets after an SDE edge
    and at the start of the compressed tail (``samplers.kernel``: ``Kernel.history``).
 4. the children become the frontier, parent-major (a trunk's ODE child first); stochastic edges are stored.

NFE: forwards = Σ_stages |frontier| — each node's velocity is computed once and shared by all its children.

Usage, the tree spec and the credit functions: docs/samplers.md "Trees".
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.types import RolloutResult
from samplers.dpm_solver import KERNEL as DPM_KERNEL
from samplers.kernel import Kernel, data_prediction, resolve_kernel
from samplers.rng import derived_seed, randn_rows
from samplers.rollout import check_rollout_args, step_kernels
from samplers.schedule import check_grid
from samplers.steps import Stage, build_stages
from samplers.tree_credit import TreeCredit, assign_credit
from samplers.tree_spec import PRESETS, BranchPlan, SplitNoise, TreeSpec
from samplers.tree_store import EdgeStore, NodeStore, NodeTable, TreeBatch
from samplers.windows import StepPlan

__all__ = ["PRESETS", "BranchPlan", "SplitNoise", "TreeBatch", "TreeCredit", "TreeRollout", "TreeSpec",
           "assign_credit", "build_stages", "resolve_kernel", "tree_rollout"]

TreeVelocityFn = Callable[[Tensor, Tensor, Tensor], Tensor]
"""``v = velocity_fn(x, sigma, roots)``: x (F, ...), sigma (F,), roots (F,) long = each row's root index."""


def child_seed(parent_seed: int, step: int, j: int) -> int:
    """63-bit seed of child j of a node split at grid step ``step``: ``samplers.rng.derived_seed`` of
    (parent seed, step, j) in the namespace "flowrl|tree"."""
    return derived_seed(parent_seed, step, j, namespace="flowrl|tree")


def child_generator(parent: torch.Generator, step: int, j: int) -> torch.Generator:
    """A fresh generator for child j of a split (seeded from the parent generator's seed)."""
    g = torch.Generator(device=parent.device)
    g.manual_seed(child_seed(parent.initial_seed(), step, j))
    return g


def stage_sizes(stages: list[Stage], n_roots: int, trunk: bool) -> tuple[list[int], list[int]]:
    """(|frontier| per stage, stochastic children per SDE-producing stage), known before running."""
    sizes, sde_rows, f = [], [], n_roots
    for st in stages:
        sizes.append(f)
        if st.split:
            s = n_roots * st.split if trunk else f * st.split
            f = f + s if trunk else s
        else:
            s = f if (st.sde and not trunk) else 0
        if s:
            sde_rows.append(s)
    return sizes, sde_rows


@dataclass
class TreeRollout:
    """A finished rollout tree.

    latents (L, ...) / x0_pred (L, ...): the leaves (final frontier) and x̂0 of their last model call.
    leaf_nodes (L,): their node ids.  nodes: the node table.  edges: stored stochastic edges (None if
    ``store=False``).  frontier_sizes: |frontier| at each stage; ``forwards`` = their sum.
    """

    latents: Tensor
    x0_pred: Tensor
    leaf_nodes: Tensor
    nodes: NodeTable
    edges: EdgeStore | None
    sigmas: Tensor
    frontier_sizes: tuple[int, ...]
    branch: BranchPlan
    num_roots: int

    @property
    def forwards(self) -> int:
        """Velocity evaluations of the whole rollout: Σ frontier sizes (a shared prefix counted once)."""
        return sum(self.frontier_sizes)

    @property
    def leaf_root(self) -> Tensor:
        """(L,) root index of each leaf."""
        return self.nodes.root[self.leaf_nodes]

    def edge_batch(self, node_ids: Tensor, advantage: Tensor | None = None) -> TreeBatch:
        """The stored edges into ``node_ids`` as a ``TreeBatch`` (advantage NaN when not given)."""
        if self.edges is None:
            raise ValueError("this rollout stored no edges (store=False)")
        node_ids = torch.as_tensor(node_ids, dtype=torch.long)
        rows = self.nodes.edge_row[node_ids]
        if bool((rows < 0).any()):
            raise ValueError("edge_batch: some nodes are not reached by a stored stochastic edge")
        traj, steps = self.edges.rows(rows)
        adv = torch.full((node_ids.numel(),), float("nan")) if advantage is None else advantage.float()
        return TreeBatch(traj, self.nodes.root[node_ids], adv, node_ids, steps, self.nodes.depth[node_ids])

    def result(self) -> RolloutResult:
        """The flat ``RolloutResult`` (B, K, ...) of a tree that never split; nfe = calls per sample."""
        traj = None if self.edges is None else self.edges.flat_trajectory()
        return RolloutResult(self.latents, self.sigmas, traj, self.x0_pred, len(self.frontier_sizes))


@dataclass
class _Frontier:
    x: Tensor                   # (F, ...) float32 latents
    ids: list[int]              # node ids
    roots: Tensor               # (F,) long, CPU
    gens: list | None           # one generator per row (None: no SDE step anywhere)
    trunk: list[bool]           # trunk rows (trunk mode)
    hist: Tensor | None = None  # (F, ...) x̂0 of the previous step on each row's path (multistep ODE kernels)
    hist_ok: list[bool] | None = None
    hist_sigma: float | None = None


@dataclass
class _Children:
    """One stage's children in new-frontier order: parent row, SDE?, split index j (−1: the chain goes on)."""

    parent: list[int]
    sde: list[bool]
    j: list[int]

    def rows(self, sde: bool) -> list[int]:
        return [k for k, s in enumerate(self.sde) if s == sde]


def _children(st: Stage, trunk_rows: list[bool], trunk_mode: bool) -> _Children:
    par, sde, js = [], [], []
    for r, is_trunk in enumerate(trunk_rows):
        if st.split and (is_trunk or not trunk_mode):
            kinds = [(False, -1)] * int(trunk_mode) + [(True, j) for j in range(st.split)]
        else:
            kinds = [(st.sde and not trunk_mode, -1)]
        for s, j in kinds:
            par.append(r)
            sde.append(s)
            js.append(j)
    return _Children(par, sde, js)


def _gather(t: Tensor, rows: list[int], n_all: int) -> Tensor:
    """t[rows], or t itself when rows is 0..n_all−1 (no copy on the flat path)."""
    if len(rows) == n_all and rows == list(range(n_all)):
        return t
    return t[torch.tensor(rows, dtype=torch.long, device=t.device)]


def _velocity(velocity_fn: TreeVelocityFn, x: Tensor, sigma: Tensor, roots: Tensor,
              max_batch: int | None) -> Tensor:
    f = x.shape[0]
    if max_batch is None or f <= max_batch:
        return velocity_fn(x, sigma.expand(f), roots)
    return torch.cat([velocity_fn(x[a:a + max_batch], sigma.expand(min(max_batch, f - a)),
                                  roots[a:a + max_batch])
                      for a in range(0, f, max_batch)])


def _ode_step(st: Stage, fr: _Frontier, v: Tensor, par: list[int], kern: Kernel, cfg) -> Tensor:
    """ODE children of one stage; a multistep kernel gets each row's history (first order where none)."""
    n_all = fr.x.shape[0]
    xs, vs = _gather(fr.x, par, n_all), _gather(v, par, n_all)
    sig, sig_n = st.sigma.expand(len(par)), st.sigma_next.expand(len(par))
    if not kern.history:
        return kern.step(xs, vs, sig, sig_n, cfg=cfg).x_next
    ok = [fr.hist_ok[r] for r in par]
    if all(o == ok[0] for o in ok):
        hist = (_gather(fr.hist, par, n_all), fr.hist_sigma) if ok[0] else None
        return kern.step(xs, vs, sig, sig_n, cfg=cfg, history=hist).x_next
    out = torch.empty_like(xs, dtype=torch.float32)
    for flag in (True, False):
        rows = [k for k, o in enumerate(ok) if o == flag]
        idx = torch.tensor(rows, dtype=torch.long, device=xs.device)
        rows_t = torch.tensor([par[k] for k in rows], device=xs.device)
        hist = (fr.hist[rows_t], fr.hist_sigma) if flag else None
        n = len(rows)
        out[idx] = kern.step(xs[idx], vs[idx], sig[:n], sig_n[:n], cfg=cfg, history=hist).x_next
    return out


def _sde_step(st: Stage, fr: _Frontier, v: Tensor, par: list[int], js: list[int], kern: Kernel, cfg,
              scale: float, reduce: str):
    """SDE children of one stage: (x, StepOut, log π, stored ε, generators)."""
    n_all = fr.x.shape[0]
    xs, vs = _gather(fr.x, par, n_all), _gather(v, par, n_all)
    gens = [fr.gens[r] if j < 0 else child_generator(fr.gens[r], st.step, j) for r, j in zip(par, js)]
    eps = randn_rows(xs.shape[1:], gens).to(xs.device)
    if scale != 1.0:
        eps = eps * scale
    out = kern.step(xs, vs, st.sigma.expand(len(par)), st.sigma_next.expand(len(par)), eps, cfg=cfg)
    return xs, out, kern.log_prob(out.x_next, out.mean, out.std, reduce, cfg), eps, gens


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm  # optional dependency, imported only when asked for

    return tqdm(total=total, desc="sampling", leave=False)


def tree_rollout(velocity_fn: TreeVelocityFn, x1: Tensor, sigmas: Tensor, plan: StepPlan | None = None,
                 branch: BranchPlan | None = None, *, noise: SplitNoise | None = None,
                 kernel: Kernel | str = "flow_sde", kernel_cfg=None, ode_kernel: Kernel | str | None = "ode",
                 ode_kernel_cfg=None, generators: Sequence[torch.Generator] | None = None,
                 reduce: str = "mean",
                 keep_noise: bool = True, store: bool = True, max_batch: int | None = None,
                 progress: bool = False) -> TreeRollout:
    """Grow one rollout tree per row of ``x1`` (its root noise) on the σ grid (module docstring).

    plan: SDE steps of the non-split steps (samplers.windows; None = all ODE). branch: where nodes split
    (samplers.tree_spec; None = never). noise: split-step sampling scale. kernel / kernel_cfg: the SDE kernel;
    ode_kernel / ode_kernel_cfg: the deterministic kernel of every ODE step (Euler "ode" or "dpmpp_2m"; None:
    a deterministic ``kernel`` is the ODE kernel, as in ``samplers.rollout``).
    generators: one per root (required when any step is SDE). keep_noise: store each edge's ε. store: False
    keeps no edges (sampling only). max_batch: cap rows per model call (NFE unchanged).
    """
    grid = check_grid(sigmas).to(x1.device)
    n_steps = grid.numel() - 1
    plan = plan or StepPlan(n_steps)
    branch = branch or BranchPlan(n_steps)
    if plan.num_steps != n_steps:
        raise ValueError(f"plan is for {plan.num_steps} steps but the σ grid has {n_steps}; build both from "
                         "the same num_steps")
    stages = build_stages(grid, plan, branch)
    kern, kernel_cfg, okern, ode_kernel_cfg = step_kernels(kernel, kernel_cfg, ode_kernel, ode_kernel_cfg)
    n_roots = x1.shape[0]
    check_rollout_args(kern, okern, stages, generators, n_roots)
    noise = noise or SplitNoise()
    x = x1.to(torch.float32)
    sizes, sde_rows = stage_sizes(stages, n_roots, branch.trunk)
    edges = EdgeStore(x, sde_rows, not branch.splits, keep_noise) if (store and sde_rows) else None
    nodes = NodeStore()
    fr = _Frontier(x, nodes.add_roots(n_roots), torch.arange(n_roots),
                   list(generators) if generators is not None else None, [True] * n_roots,
                   hist_ok=[False] * n_roots)
    multistep = bool(okern.history) or any(st.tail for st in stages)
    bar, j_sde, x0_pred = _progress(len(stages), progress), 0, x
    for si, st in enumerate(stages):
        if st.tail and (si == 0 or not stages[si - 1].tail):
            fr.hist_ok = [False] * len(fr.ids)            # the tail starts first order (MixGRPO-Flash)
        v = _velocity(velocity_fn, fr.x, st.sigma, fr.roots, max_batch)
        kids = _children(st, fr.trunk, branch.trunk)
        x_hat = data_prediction(fr.x, v, st.sigma) if (multistep or si == len(stages) - 1) else None
        step_kern, step_cfg = (DPM_KERNEL, DPM_KERNEL.Config()) if st.tail else (okern, ode_kernel_cfg)
        fr, j_sde = _advance(st, fr, v, kids, nodes, edges, j_sde, (kern, kernel_cfg, step_kern, step_cfg),
                             noise.at(st.level, len(branch.splits)) if st.split else 1.0, reduce, x_hat,
                             multistep)
        x0_pred = x_hat if x_hat is None else _gather(x_hat, kids.parent, v.shape[0])
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return TreeRollout(fr.x, x0_pred, torch.tensor(fr.ids, dtype=torch.long), nodes.table(), edges, grid,
                       tuple(sizes), branch, n_roots)


def _advance(st: Stage, fr: _Frontier, v: Tensor, kids: _Children, nodes: NodeStore, edges: EdgeStore | None,
             j_sde: int, kernels: tuple, scale: float, reduce: str, x_hat: Tensor | None,
             multistep: bool) -> tuple[_Frontier, int]:
    """Step every child of one stage, record the new nodes and stored edges; returns the new frontier."""
    kern, kcfg, okern, ocfg = kernels
    n_kids, n_all = len(kids.parent), fr.x.shape[0]
    sde_pos, ode_pos = kids.rows(True), kids.rows(False)
    lp_all, edge_rows, gens = [float("nan")] * n_kids, [-1] * n_kids, list(fr.gens or [None] * n_all)
    gens = [gens[r] for r in kids.parent]
    parts = []
    if ode_pos:
        parts.append((ode_pos, _ode_step(st, fr, v, [kids.parent[k] for k in ode_pos], okern, ocfg)))
    if sde_pos:
        par = [kids.parent[k] for k in sde_pos]
        js = [kids.j[k] for k in sde_pos]
        xs, out, lp, eps, sde_gens = _sde_step(st, fr, v, par, js, kern, kcfg, scale, reduce)
        for k, g, val in zip(sde_pos, sde_gens, lp.tolist()):
            gens[k], lp_all[k] = g, val
        if edges is not None:
            n = len(par)
            rows = edges.write(j_sde, xs, out, lp, eps, st.sigma.expand(n), st.sigma_next.expand(n),
                               st.step)
            for k, row in zip(sde_pos, rows):
                edge_rows[k] = row
        parts.append((sde_pos, out.x_next))
        j_sde += 1
    if len(parts) == 1:
        x_new = parts[0][1]
    else:
        x_new = torch.empty((n_kids, *fr.x.shape[1:]), dtype=torch.float32, device=fr.x.device)
        for pos, val in parts:
            x_new[torch.tensor(pos, dtype=torch.long, device=x_new.device)] = val
    ids = nodes.add([fr.ids[r] for r in kids.parent], st.step, kids.sde, lp_all, edge_row=edge_rows)
    trunk = [fr.trunk[r] and not s for r, s in zip(kids.parent, kids.sde)]
    new = _Frontier(x_new, ids, fr.roots[torch.tensor(kids.parent, dtype=torch.long)], gens, trunk)
    if multistep:
        new.hist, new.hist_ok = _gather(x_hat, kids.parent, n_all), [not s for s in kids.sde]
        new.hist_sigma = float(st.sigma)
    return new, j_sde
