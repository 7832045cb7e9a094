"""The node store of a rollout tree and the buffers of its stored (stochastic) edges.

Node ids are insertion order, so a parent's id is always smaller than its children's (the bottom-up backups in
``samplers.tree_credit`` rely on it). Each node records: parent (−1 for a root), depth (edges from its root),
the grid step of its incoming edge (−1 for a root or a compressed-tail step), whether that edge is stochastic,
the edge's log π (NaN for a deterministic edge), its root index, and the row of its stored edge (−1 if not
stored). The rollout engine keeps latents only on the frontier and in the edge buffers; the search driver
(``samplers.search``) also keeps every node's latent (``keep_latents``) so it can expand any node later.

Edge buffers: one row per stochastic edge (x, x_next, mean, std, log_prob, σ, σ_next, step, ε). A tree that
never splits uses the flat layout (R, K, ...) — row b·K + j is root b's j-th stochastic step — so its
trajectory is today's (B, K, ...) ``Trajectory`` without a copy; a splitting tree fills stage after stage.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.types import StepOut, Trajectory


@dataclass
class NodeTable:
    """The node store as (N,) tensors (CPU): parent, depth, step, stochastic, log_prob, root, edge_row."""

    parent: Tensor
    depth: Tensor
    step: Tensor
    stochastic: Tensor
    log_prob: Tensor
    root: Tensor
    edge_row: Tensor

    def __len__(self) -> int:
        return self.parent.numel()

    @property
    def is_leaf(self) -> Tensor:
        """(N,) bool: nodes without children."""
        has_child = torch.zeros(len(self), dtype=torch.bool)
        kids = self.parent[self.parent >= 0]
        has_child[kids] = True
        return ~has_child


class NodeStore:
    """Append-only node store (attributes in the module docstring); ``latents`` when ``keep_latents``."""

    def __init__(self, keep_latents: bool = False):
        self.parent: list[int] = []
        self.depth: list[int] = []
        self.step: list[int] = []
        self.stochastic: list[bool] = []
        self.log_prob: list[float] = []
        self.root: list[int] = []
        self.edge_row: list[int] = []
        self.children: list[list[int]] = []
        self.latents: dict[int, Tensor] | None = {} if keep_latents else None
        self.num_roots = 0

    def __len__(self) -> int:
        return len(self.parent)

    def add_roots(self, n: int, latents: Tensor | None = None) -> list[int]:
        """n roots (root index = their order among the roots); returns their ids."""
        first, self.num_roots = self.num_roots, self.num_roots + n
        return self.add([-1] * n, step=-1, stochastic=[False] * n, log_prob=[float("nan")] * n,
                        root=list(range(first, first + n)), latents=latents)

    def add(self, parents: list[int], step: int, stochastic: list[bool], log_prob: list[float],
            root: list[int] | None = None, edge_row: list[int] | None = None,
            latents: Tensor | None = None) -> list[int]:
        """Append one node per parent id (−1: a root); returns the new ids."""
        start = len(self.parent)
        ids = list(range(start, start + len(parents)))
        for k, p in enumerate(parents):
            self.parent.append(p)
            self.depth.append(0 if p < 0 else self.depth[p] + 1)
            self.root.append(root[k] if root is not None else (self.root[p] if p >= 0 else 0))
            self.children.append([])
            if p >= 0:
                self.children[p].append(start + k)
        self.step += [step] * len(parents)
        self.stochastic += list(stochastic)
        self.log_prob += [float(v) for v in log_prob]
        self.edge_row += list(edge_row) if edge_row is not None else [-1] * len(parents)
        if self.latents is not None and latents is not None:
            for k, i in enumerate(ids):
                self.latents[i] = latents[k]
        return ids

    def path(self, node: int) -> list[int]:
        """Node ids from the root down to ``node``."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parent[node]
        return out[::-1]

    def table(self) -> NodeTable:
        """The store as tensors."""
        def t(values, dtype=torch.long):
            return torch.tensor(values, dtype=dtype)

        return NodeTable(t(self.parent), t(self.depth), t(self.step), t(self.stochastic, torch.bool),
                         t(self.log_prob, torch.float32), t(self.root), t(self.edge_row))


@dataclass
class TreeBatch:
    """Trained edges in the training loop's format: a ``Trajectory`` whose E rows are edges with K = 1 stored
    step each, the root (prompt / sample) index of each row to select its conditioning, and its advantage.

    ``traj.step_idx`` is (1,) = −1 because rows come from different grid steps; each row's step is ``step``.
    """

    traj: Trajectory
    root: Tensor
    advantage: Tensor
    node: Tensor
    step: Tensor
    depth: Tensor

    def __len__(self) -> int:
        return self.root.numel()


class EdgeStore:
    """Preallocated buffers of the stochastic edges (layouts in the module docstring)."""

    def __init__(self, sample: Tensor, stage_rows: list[int], flat: bool, keep_noise: bool):
        self.flat, self.num_stages = flat, len(stage_rows)
        self.offsets = [sum(stage_rows[:j]) for j in range(len(stage_rows))]
        total = sum(stage_rows)
        lead = (stage_rows[0] if stage_rows else 0, len(stage_rows)) if flat else (total,)
        tail, dev = tuple(sample.shape[1:]), sample.device

        def buf(*shape, dtype=torch.float32):
            return torch.empty(*shape, dtype=dtype, device=dev)

        self.x, self.x_next, self.mean = (buf(*lead, *tail) for _ in range(3))
        self.noise = buf(*lead, *tail) if keep_noise else None
        self.std, self.log_prob, self.sigma, self.sigma_next = (buf(*lead) for _ in range(4))
        self.step = buf(*lead, dtype=torch.long)

    def write(self, j: int, x: Tensor, out: StepOut, log_prob: Tensor, noise: Tensor, sigma: Tensor,
              sigma_next: Tensor, step: int) -> list[int]:
        """Store the rows of stochastic stage j; returns their edge-row ids."""
        n = x.shape[0]
        if self.flat:
            sel = (slice(None), j)
            rows = [b * self.num_stages + j for b in range(n)]
        else:
            sel = (slice(self.offsets[j], self.offsets[j] + n),)
            rows = list(range(self.offsets[j], self.offsets[j] + n))
        self.x[sel], self.x_next[sel], self.mean[sel] = x, out.x_next, out.mean
        self.std[sel], self.log_prob[sel] = out.std, log_prob
        self.sigma[sel], self.sigma_next[sel], self.step[sel] = sigma, sigma_next, step
        if self.noise is not None:
            self.noise[sel] = noise
        return rows

    def flat_trajectory(self) -> Trajectory:
        """The (R, K, ...) trajectory of a tree that never splits."""
        if not self.flat:
            raise ValueError("flat_trajectory: this tree splits; take its edges with TreeRollout.edge_batch")
        k = self.num_stages
        step_idx = self.step[0].cpu() if self.step.shape[0] else torch.zeros(k, dtype=torch.long)
        return Trajectory(self.x, self.x_next, self.mean, self.std, self.log_prob, self.sigma,
                          self.sigma_next, step_idx, self.noise)

    def rows(self, edge_rows: Tensor) -> tuple[Trajectory, Tensor]:
        """Edge rows as a (E, 1, ...) ``Trajectory`` plus their grid steps (E,)."""
        idx = edge_rows.to(self.x.device)

        def pick(t: Tensor | None) -> Tensor | None:
            if t is None:
                return None
            flat = t.reshape(-1, *t.shape[2:]) if self.flat else t
            return flat[idx].unsqueeze(1)

        steps = pick(self.step).squeeze(1)
        traj = Trajectory(pick(self.x), pick(self.x_next), pick(self.mean), pick(self.std),
                          pick(self.log_prob), pick(self.sigma), pick(self.sigma_next),
                          torch.full((1,), -1, dtype=torch.long), pick(self.noise))
        return traj, steps.cpu()
