"""Search without training: Diffusion Tree Sampling / Search (DTS / DTS*, Jain et al., arXiv 2506.20701)
on the rollout tree's node store, and best-of-N at equal NFE — for any velocity
function ``v = velocity_fn(x, sigma)`` and reward function ``r = reward_fn(x0)`` (latents (B, ...) → (B,)).

DTS targets π*(x0) ∝ p_θ(x0)·exp(λ·r(x0)), with the soft value V(x_t) = (1/λ)·log E_{p_θ}[exp(λ·V(x_{t−1}))].
One simulation:

  select   from the root, while the node has as many children as its widening cap allows, move to a child
           drawn ∝ exp(λ·v̂(child)) (DTS) or to the child of largest v̂ (DTS*, greedy);
  expand   add a child there: one SDE step of p_θ (``kernel``) from the node; the root's children are fresh
           N(0, I) noises (``noise_fn``);
  rollout  SDE steps of p_θ down to σ = 0 (the last step ODE with ``final_ode``), each state a new node;
  backup   v̂(leaf) = r(x0); up the path v̂(n) = (1/λ)·log mean_c exp(λ·v̂(c)) over n's children
           (``samplers.tree_credit.log_mean_exp``; λ = ∞ → max, DTS*) and visits += 1.

Progressive widening: a node may hold ⌈c·visits^α⌉ children (c = 1, α = 0.5 [derived; the paper's constants
were not read]), at most ``max_children``; a deterministic step (the final ODE step) holds one.
NFE: each node's velocity is evaluated once and cached, so expanding an already visited node is free; a
simulation expanding at grid level ℓ costs N − ℓ − 1 evaluations (+1 if the node's velocity is not cached yet;
the root's children cost N). The search stops before a simulation would exceed ``budget_nfe``.
Randomness: child j of node n draws from a generator seeded ``child_seed(seed(n), step, j)`` (the root's from
``seed``), so a search is reproducible and best-of-N with the same seed starts from the same N noises.

Returned sample: DTS* — the best leaf found; DTS — a leaf reached by descending ∝ exp(λ·v̂) (an approximate
draw from π*), with the best leaf alongside.
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from flowrl.types import VelocityFn
from samplers.kernel import Kernel, resolve_kernel
from samplers.rollout import rollout
from samplers.schedule import check_grid
from samplers.tree import child_seed
from samplers.tree_credit import log_mean_exp
from samplers.tree_store import NodeStore

_EULER = resolve_kernel("ode")
RewardFn = Callable[[Tensor], Tensor]
NoiseFn = Callable[[list], Tensor]
"""``x1 = noise_fn(generators)``: (len(generators), ...) starting noise, row b from generators[b]."""


@dataclass
class DTSConfig:
    """lam: λ of the target p_θ·exp(λ·r) (inf: DTS* max backup). greedy: DTS* argmax selection.
    max_children: widening bound (None: unbounded). widen_c, widen_alpha: cap ⌈c·visits^α⌉.
    final_ode: the last step into σ = 0 is an Euler step (one child), so samples carry no final noise."""

    lam: float = 1.0
    greedy: bool = False
    max_children: int | None = 8
    widen_c: float = 1.0
    widen_alpha: float = 0.5
    final_ode: bool = True

    def __post_init__(self):
        if self.lam < 0:
            raise ValueError(f"DTSConfig.lam (λ) must be >= 0, got {self.lam}")
        if self.max_children is not None and self.max_children < 1:
            raise ValueError(f"DTSConfig.max_children must be >= 1 or None, got {self.max_children}")


@dataclass
class SearchResult:
    """latents (1, ...) / reward: the returned sample; best_latents / best_reward: the best leaf seen;
    nfe: velocity evaluations spent; samples: complete samples rewarded; nodes, values: the search tree."""

    latents: Tensor
    reward: float
    best_latents: Tensor
    best_reward: float
    nfe: int
    samples: int
    nodes: NodeStore | None = None
    values: list[float] = field(default_factory=list)


def _rng_of(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


class _Search:
    """The DTS tree: node 0 is the root above the noises; a node at depth d sits at grid level d − 1."""

    def __init__(self, velocity_fn, noise_fn, grid, reward_fn, kernel, kernel_cfg, cfg: DTSConfig, seed: int):
        self.vf, self.noise_fn, self.grid, self.reward_fn = velocity_fn, noise_fn, grid, reward_fn
        self.kernel, self.kcfg, self.cfg = kernel, kernel_cfg, cfg
        self.n = grid.numel() - 1
        self.nodes = NodeStore(keep_latents=True)
        self.nodes.add_roots(1)
        self.seed, self.value, self.visits = [seed], [float("nan")], [0]
        self.v_cache: dict[int, Tensor] = {}
        self.nfe, self.samples, self.pick = 0, 0, random.Random(seed)

    def level(self, node: int) -> int:
        return self.nodes.depth[node] - 1

    def cap(self, node: int) -> int:
        lvl = self.level(node)
        if lvl == self.n:
            return 0
        if lvl == self.n - 1 and self.cfg.final_ode:
            return 1
        cap = max(1, math.ceil(self.cfg.widen_c * max(1, self.visits[node]) ** self.cfg.widen_alpha))
        return cap if self.cfg.max_children is None else min(cap, self.cfg.max_children)

    def cost(self, node: int) -> int:
        lvl = self.level(node)
        return 0 if lvl == self.n else self.n - lvl - 1 + int(lvl >= 0 and node not in self.v_cache)

    def choose(self, kids: list[int]) -> int:
        vals = torch.tensor([self.value[c] for c in kids], dtype=torch.float64)
        if self.cfg.greedy or math.isinf(self.cfg.lam):
            return kids[int(torch.argmax(vals))]
        w = torch.softmax(self.cfg.lam * vals, 0).tolist()
        return self.pick.choices(kids, weights=w)[0]

    def select(self) -> list[int]:
        path = [0]
        while len(self.nodes.children[path[-1]]) >= self.cap(path[-1]) > 0:
            path.append(self.choose(self.nodes.children[path[-1]]))
        return path

    def velocity(self, node: int) -> Tensor:
        if node not in self.v_cache:
            x = self.nodes.latents[node].unsqueeze(0)
            self.v_cache[node] = self.vf(x, self.grid[self.level(node)].expand(1)).float()
            self.nfe += 1
        return self.v_cache[node]

    def child(self, node: int) -> int:
        """Expand one new child of ``node`` (a noise for the root, else one kernel step)."""
        j, lvl = len(self.nodes.children[node]), self.level(node)
        seed = child_seed(self.seed[node], lvl, j)
        if lvl < 0:
            x_next = self.noise_fn([_rng_of(seed)]).float()
            stochastic, lp = False, float("nan")
        else:
            x, v = self.nodes.latents[node].unsqueeze(0), self.velocity(node)
            s, sn = self.grid[lvl].expand(1), self.grid[lvl + 1].expand(1)
            if lvl == self.n - 1 and self.cfg.final_ode:
                x_next, stochastic, lp = _EULER.step(x, v, s, sn).x_next, False, float("nan")
            else:
                eps = torch.randn(x.shape, generator=_rng_of(seed), dtype=torch.float32).to(x.device)
                out = self.kernel.step(x, v, s, sn, eps, cfg=self.kcfg)
                x_next, stochastic = out.x_next, True
                lp = float(self.kernel.log_prob(out.x_next, out.mean, out.std, "mean", self.kcfg))
        ids = self.nodes.add([node], lvl, [stochastic], [lp], latents=x_next)
        self.seed.append(seed)
        self.value.append(float("nan"))
        self.visits.append(0)
        return ids[0]

    def simulate(self, path: list[int]) -> None:
        node = path[-1]
        while self.level(node) < self.n:
            node = self.child(node)
            path.append(node)
        if math.isnan(self.value[node]):
            x0 = self.nodes.latents[node].unsqueeze(0)
            self.value[node] = float(self.reward_fn(x0).float().flatten()[0])
            self.samples += 1
        for a in reversed(path):
            self.visits[a] += 1
            kids = self.nodes.children[a]
            if kids:
                vals = torch.tensor([self.value[c] for c in kids], dtype=torch.float64)
                self.value[a] = float(log_mean_exp(vals, self.cfg.lam))

    def leaves(self) -> list[int]:
        return [i for i in range(len(self.nodes)) if self.level(i) == self.n]


def dts(velocity_fn: VelocityFn, noise_fn: NoiseFn, sigmas: Tensor, reward_fn: RewardFn, budget_nfe: int,
        cfg: DTSConfig | None = None, seed: int = 0, kernel: Kernel | str = "flow_sde",
        kernel_cfg=None) -> SearchResult:
    """Diffusion Tree Sampling (module docstring) within ``budget_nfe`` velocity evaluations."""
    cfg = cfg or DTSConfig()
    kern = resolve_kernel(kernel)
    if not kern.stochastic:
        raise ValueError(f"DTS expands nodes with a stochastic kernel; got {kern.name!r} (use flow_sde, "
                         "dance_sde, cps)")
    grid = check_grid(sigmas)
    search = _Search(velocity_fn, noise_fn, grid, reward_fn, kern, kernel_cfg or kern.Config(), cfg, seed)
    for _ in range(100 * max(1, budget_nfe)):        # terminal re-selections spend no NFE; bound the loop
        path = search.select()
        if search.nfe + search.cost(path[-1]) > budget_nfe:
            break
        search.simulate(path)
    leaves = search.leaves()
    if not leaves:
        raise ValueError(f"DTS: budget_nfe={budget_nfe} is below one rollout ({grid.numel() - 1} "
                         "evaluations)")
    best = max(leaves, key=lambda i: search.value[i])
    pick = best
    if not (cfg.greedy or math.isinf(cfg.lam)):
        pick = 0
        while search.nodes.children[pick]:
            pick = search.choose(search.nodes.children[pick])
    lat = search.nodes.latents
    return SearchResult(lat[pick].unsqueeze(0), search.value[pick], lat[best].unsqueeze(0),
                        search.value[best],
                        search.nfe, search.samples, search.nodes, search.value)


def dts_star(velocity_fn: VelocityFn, noise_fn: NoiseFn, sigmas: Tensor, reward_fn: RewardFn, budget_nfe: int,
             cfg: DTSConfig | None = None, seed: int = 0, kernel: Kernel | str = "flow_sde",
             kernel_cfg=None) -> SearchResult:
    """DTS*: greedy selection and max backup (λ = ∞); returns the best leaf found."""
    base = cfg or DTSConfig()
    star = DTSConfig(math.inf, True, base.max_children, base.widen_c, base.widen_alpha, base.final_ode)
    return dts(velocity_fn, noise_fn, sigmas, reward_fn, budget_nfe, star, seed, kernel, kernel_cfg)


def best_of_n(velocity_fn: VelocityFn, noise_fn: NoiseFn, sigmas: Tensor, reward_fn: RewardFn,
              budget_nfe: int,
              seed: int = 0, batch_size: int = 16, plan=None, kernel: Kernel | str = "ode",
              kernel_cfg=None) -> SearchResult:
    """Best of N = ⌊budget / steps⌋ independent samples (ODE by default; ``plan``/``kernel`` for SDE
    sampling), drawn from the same root noises as ``dts(seed=seed)``, scored in batches; returns the best."""
    grid = check_grid(sigmas)
    steps = grid.numel() - 1
    n = budget_nfe // steps
    if n < 1:
        raise ValueError(f"best_of_n: budget_nfe={budget_nfe} is below one rollout ({steps} evaluations)")
    best_r, best_x = -math.inf, None
    for a in range(0, n, batch_size):
        gens = [_rng_of(child_seed(seed, -1, j)) for j in range(a, min(n, a + batch_size))]
        x1 = noise_fn(gens).float()
        latents = rollout(velocity_fn, x1, grid, plan, kernel, kernel_cfg, gens, store=False).latents
        rewards = reward_fn(latents).float().flatten()
        k = int(torch.argmax(rewards))
        if float(rewards[k]) > best_r:
            best_r, best_x = float(rewards[k]), latents[k:k + 1]
    return SearchResult(best_x, best_r, best_x, best_r, n * steps, n)

