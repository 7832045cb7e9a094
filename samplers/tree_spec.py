"""The tree spec: five choices that make every published tree method a config.

    branching   where nodes split and into how many children — a ``BranchPlan`` per training iteration
    noise       the sampling-noise scale at split steps, separate from the std the log-prob is scored under
    backup      how leaf rewards flow up to internal nodes
    advantage   which nodes are compared with which, and how they are scaled
    train       which stochastic edges get gradients (pruning)

plus ``window``: which non-split steps are SDE (a ``samplers.windows`` window; None = ODE). Split steps are
always SDE. Every field is a dataclass whose defaults are the anchor's published values; ``PRESETS`` names
each method.

Branchings (``plan(iteration, num_steps, rng=None) -> BranchPlan``; stateless, so resume needs no state):
  NoSplit            the flat rollout: the tree that never splits
  FixedSplits        BranchGRPO: split steps (0, 3, 6, 9), factor 2 (``--tree_split_points``)
  SplitWindow        TreeGRPO / Dynamic-TreeRPO: ``size`` consecutive steps each split ``factor`` ways; the
                     window start c = (start + stride·⌊n/every⌋) mod #positions (MixGRPO-style)
  RandomSplitWindow  the same window at a random start: uniform, or truncated geometric
                     P(c = lo + j) ∝ (1 − p)^j (TreeGRPO's schedule as Uni-TMPO describes it)
  EveryStep          TempFlow-GRPO / E-GRPO: a deterministic trunk; at each listed step the trunk node also
                     spawns ``factor`` SDE children, each completed by ODE (depth-1; arXiv 2508.04324, 2601.00423)
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from samplers.windows import AllSteps, FixedSteps, StepPlan

BACKUPS = ("mean", "softmax", "logmeanexp")
ADVANTAGES = ("depth", "siblings", "parent", "leaves")
STDS = ("group", "global", "none")
WIDTHS = ("none", "per_branch", "best_worst")


@dataclass(frozen=True)
class BranchPlan:
    """Where one iteration's trees split.

    splits:  grid steps at which nodes split, increasing.   factors: children per split (≥ 2), one per split.
    trunk:   False — every frontier node splits at a split step (BranchGRPO, TreeGRPO). True — only the
             deterministic trunk splits: at a split step the trunk node gets one ODE child (the trunk goes on)
             and ``factor`` SDE children that are never split again (TempFlow, E-GRPO).
    """

    num_steps: int
    splits: tuple[int, ...] = ()
    factors: tuple[int, ...] = ()
    trunk: bool = False

    def __post_init__(self):
        if not self.factors:
            object.__setattr__(self, "factors", (2,) * len(self.splits))
        if len(self.factors) != len(self.splits):
            raise ValueError(f"BranchPlan: {len(self.splits)} split steps but {len(self.factors)} factors")
        if any(b <= a for a, b in zip(self.splits, self.splits[1:])):
            raise ValueError(f"BranchPlan: split steps {self.splits} must be strictly increasing")
        if self.splits and not 0 <= self.splits[0] <= self.splits[-1] < self.num_steps:
            raise ValueError(f"BranchPlan: split steps {self.splits} must lie in 0..{self.num_steps - 1}")
        if any(k < 2 for k in self.factors):
            raise ValueError(f"BranchPlan: branching factors must be >= 2, got {self.factors}")

    def factor_at(self, step: int) -> int:
        """Children per node at grid step ``step`` (0 when the step does not split)."""
        return dict(zip(self.splits, self.factors)).get(step, 0)


def _check_factor(factor: int, what: str) -> None:
    if factor < 2:
        raise ValueError(f"{what}: factor must be >= 2 (children per split), got {factor}")


@dataclass
class NoSplit:
    """The flat rollout: one chain per root."""

    def plan(self, iteration: int, num_steps: int, rng: random.Random | None = None) -> BranchPlan:
        return BranchPlan(num_steps)


@dataclass
class FixedSplits:
    """BranchGRPO: split at fixed grid steps (``--tree_split_points "0,3,6,9"``) into ``factor`` children
    (hard-coded 2 in the anchor), so 4 splits give 16 leaves per tree."""

    steps: tuple[int, ...] = (0, 3, 6, 9)
    factor: int = 2

    def plan(self, iteration: int, num_steps: int, rng: random.Random | None = None) -> BranchPlan:
        _check_factor(self.factor, "FixedSplits")
        steps = tuple(sorted(set(self.steps)))
        bad = [s for s in steps if not 0 <= s < num_steps]
        if bad:
            raise ValueError(f"FixedSplits: steps {bad} lie outside the {num_steps}-step grid "
                             f"(0..{num_steps - 1})")
        return BranchPlan(num_steps, steps, (self.factor,) * len(steps))


def _window_positions(size: int, num_steps: int, max_index: int | None, what: str) -> int:
    hi = num_steps - 1 if max_index is None else max_index
    if size < 1 or not 0 < hi <= num_steps or hi - size + 1 < 1:
        raise ValueError(f"{what}: a window of {size} split steps does not fit before grid index {hi} of a "
                         f"{num_steps}-step grid; shrink size or raise max_index")
    return hi - size + 1


@dataclass
class SplitWindow:
    """TreeGRPO: ``size`` consecutive steps that each split ``factor`` ways (k^w leaves), ODE elsewhere; the
    window start slides by ``stride`` every ``every`` iterations and rolls back to 0 (MixGRPO-style).

    Splits stay before ``max_index`` (default ``num_steps − 1``: the last step into σ = 0 never splits).
    Defaults: k = 2, w = 3 — TreeGRPO's code is not public (arXiv 2512.08153), so these are [derived]; τ = 25
    is MixGRPO's ``iters_per_group``. Dynamic-TreeRPO: a binary window of depth 4 (``size=4``).
    """

    size: int = 3
    factor: int = 2
    start: int = 0
    stride: int = 1
    every: int = 25
    max_index: int | None = None
    roll_back: bool = True

    def start_at(self, iteration: int, num_steps: int) -> int:
        """The window start c at training iteration ``iteration``."""
        if self.every < 1 or self.stride < 0 or self.start < 0:
            raise ValueError(f"SplitWindow: every >= 1, stride >= 0, start >= 0 required, got {self.every}, "
                             f"{self.stride}, {self.start}")
        n_pos = _window_positions(self.size, num_steps, self.max_index, "SplitWindow")
        c = self.start + self.stride * (iteration // self.every)
        return c % n_pos if self.roll_back else min(c, n_pos - 1)

    def plan(self, iteration: int, num_steps: int, rng: random.Random | None = None) -> BranchPlan:
        _check_factor(self.factor, "SplitWindow")
        c = self.start_at(iteration, num_steps)
        return BranchPlan(num_steps, tuple(range(c, c + self.size)), (self.factor,) * self.size)


@dataclass
class RandomSplitWindow:
    """A window of ``size`` split steps at a random start in ``window_range = (lo, hi)`` (hi None: the last
    step never splits): uniform, or truncated geometric ``P(c = lo + j) ∝ (1 − p)^j`` with ``geometric_p``."""

    size: int = 3
    factor: int = 2
    window_range: tuple[int, int | None] = (0, None)
    geometric_p: float | None = None

    def plan(self, iteration: int, num_steps: int, rng: random.Random | None = None) -> BranchPlan:
        _check_factor(self.factor, "RandomSplitWindow")
        lo, hi = self.window_range
        n_pos = _window_positions(self.size, num_steps, hi, "RandomSplitWindow") - lo
        if n_pos < 1 or lo < 0:
            raise ValueError(f"RandomSplitWindow: no start fits window_range {self.window_range} for "
                             f"size {self.size}")
        if rng is None:
            raise ValueError("RandomSplitWindow.plan needs rng (a random.Random seeded from (seed, "
                             "iteration))")
        if self.geometric_p is None:
            j = rng.randrange(n_pos)
        elif 0.0 < self.geometric_p < 1.0:
            j = rng.choices(range(n_pos), weights=[(1 - self.geometric_p) ** i for i in range(n_pos)])[0]
        else:
            raise ValueError(f"RandomSplitWindow: geometric_p must lie in (0, 1), got {self.geometric_p}")
        c = lo + j
        return BranchPlan(num_steps, tuple(range(c, c + self.size)), (self.factor,) * self.size)


@dataclass
class EveryStep:
    """Depth-1 branching from a deterministic trunk (TempFlow-GRPO: K = 6 children at every step; E-GRPO:
    G = 12 at steps 1, 2, 3). ``steps=None``: every step but the last (its children would differ only by the
    final noise). The trunk itself is the ODE path from the root noise."""

    factor: int = 6
    steps: tuple[int, ...] | None = None

    def plan(self, iteration: int, num_steps: int, rng: random.Random | None = None) -> BranchPlan:
        _check_factor(self.factor, "EveryStep")
        steps = tuple(range(num_steps - 1)) if self.steps is None else tuple(sorted(set(self.steps)))
        bad = [s for s in steps if not 0 <= s < num_steps]
        if bad:
            raise ValueError(f"EveryStep: steps {bad} lie outside the {num_steps}-step grid "
                             f"(0..{num_steps - 1})")
        return BranchPlan(num_steps, steps, (self.factor,) * len(steps), trunk=True)


@dataclass
class SplitNoise:
    """Sampling noise at split steps: ``x' = μ + c_j·s·ε`` while log π is scored under the nominal std s
    (BranchGRPO samples at c = 4 — ``--tree_split_noise_scale 4.0`` — and scores under s; ``train_branchgrpo_flux.py``).

    ``ramp`` grows the scale linearly with the split level j = 0..J−1 of the plan:
    ``c_j = scale·(1 + ramp·j/(J − 1))`` — Dynamic-TreeRPO's "noise intensity rising linearly with normalised
    depth" (arXiv 2509.23352 Eq. 6 was not read: this form is [derived]). Non-split SDE steps use c = 1.
    """

    scale: float = 1.0
    ramp: float = 0.0

    def __post_init__(self):
        if self.scale <= 0 or self.ramp < 0:
            raise ValueError(f"SplitNoise: scale must be > 0 and ramp >= 0, got {self.scale}, {self.ramp}")

    def at(self, level: int, num_levels: int) -> float:
        """c_j for split level ``level`` of ``num_levels``."""
        return self.scale * (1.0 + self.ramp * level / max(1, num_levels - 1))


@dataclass
class Backup:
    """Leaf rewards → internal node values (``samplers.tree_credit``):

    mean        V(n) = mean of the rewards of n's descendant leaves (BranchGRPO default)
    softmax     V(n) = Σ_c softmax_c(α·log π(c|n))·V(c) (BranchGRPO ``--tree_prob_weighted``, α = 1)
    logmeanexp  V(n) = (1/λ)·log mean_c exp(λ·V(c)) (DTS soft Bellman; λ → 0 mean of children, λ → ∞ max)
    """

    kind: str = "mean"
    alpha: float = 1.0
    lam: float = 1.0

    def __post_init__(self):
        if self.kind not in BACKUPS:
            raise ValueError(f"Backup.kind must be one of {BACKUPS}, got {self.kind!r}")
        if self.lam < 0:
            raise ValueError(f"Backup.lam (λ) must be >= 0 (0: mean, inf: max), got {self.lam}")


@dataclass
class TreeAdvantage:
    """Node values → advantages of the nodes reached by stochastic edges (``samplers.tree_credit``).

    kind: "depth" (z-score over all nodes of one depth of a tree group, BranchGRPO), "siblings" (over the
    children of one parent, TempFlow / E-GRPO), "parent" (A = V(c) − V(parent), TD-like), "leaves" (leaves
    only, plain GRPO over final samples, for NFT/AWR).
    std: "group" (std of the comparison set; for "parent" the std of the tree group's leaf rewards), "global"
    (std of all leaf rewards of the batch, Flow-GRPO), "none" (1). A = 0 where the set has one node or the std
    is below ``min_std``; then ``clip``. Defaults: BranchGRPO (unbiased std, eps 1e-8, min_std 1e-6, clip 5).
    """

    kind: str = "depth"
    std: str = "group"
    unbiased: bool = True
    eps: float = 1e-8
    min_std: float = 1e-6
    clip: float | None = 5.0

    def __post_init__(self):
        if self.kind not in ADVANTAGES:
            raise ValueError(f"TreeAdvantage.kind must be one of {ADVANTAGES}, got {self.kind!r}")
        if self.std not in STDS:
            raise ValueError(f"TreeAdvantage.std must be one of {STDS}, got {self.std!r}")
        if self.clip is not None and self.clip <= 0:
            raise ValueError(f"TreeAdvantage.clip must be > 0 or None, got {self.clip}")


@dataclass
class TrainEdges:
    """Which stochastic edges are trained (BranchGRPO's pruning; the forward rollout is unchanged).

    window_only:  only edges at split steps (TreeGRPO, Dynamic-TreeRPO train the tree steps only).
    depth_prune:  drop edges whose child depth is in this set (``--depth_pruning``, e.g. 15,16,17,18);
                  ``depth_slide_every`` I shifts it shallower by ⌊n/I⌋, at most down to ``depth_stop``
                  (default: the last split step).
    width:        "per_branch": of the edges after the last split, keep the top ``width_ratio`` by advantage
                  within each last-split branch (mode 1); "best_worst": the global best and worst
                  ``width_ratio/2`` each (mode 2).
    prune_until:  prune only while iteration ≤ this (``pruning_step_ratio·max_steps``); None = always.
    """

    window_only: bool = False
    depth_prune: tuple[int, ...] = ()
    depth_slide_every: int | None = None
    depth_stop: int | None = None
    width: str = "none"
    width_ratio: float = 0.5
    prune_until: int | None = None

    def __post_init__(self):
        if self.width not in WIDTHS:
            raise ValueError(f"TrainEdges.width must be one of {WIDTHS}, got {self.width!r}")
        if not 0.0 < self.width_ratio <= 1.0:
            raise ValueError(f"TrainEdges.width_ratio must lie in (0, 1], got {self.width_ratio}")
        if self.depth_slide_every is not None and self.depth_slide_every < 1:
            raise ValueError(f"TrainEdges.depth_slide_every must be >= 1, got {self.depth_slide_every}")


@dataclass
class TreeSpec:
    """One tree method: branching + SDE window + split noise + backup + advantage + trained edges."""

    branching: Any = field(default_factory=FixedSplits)
    window: Any = field(default_factory=AllSteps)
    noise: SplitNoise = field(default_factory=SplitNoise)
    backup: Backup = field(default_factory=Backup)
    advantage: TreeAdvantage = field(default_factory=TreeAdvantage)
    train: TrainEdges = field(default_factory=TrainEdges)

    def plans(self, iteration: int, num_steps: int,
              rng: random.Random | None = None) -> tuple[StepPlan, BranchPlan]:
        """(the SDE-step plan of the non-split steps, the split plan) for one iteration."""
        window = self.window
        step_plan = StepPlan(num_steps) if window is None else window.plan(iteration, num_steps, rng)
        return step_plan, self.branching.plan(iteration, num_steps, rng)


FLOW_GRPO_ADV = TreeAdvantage("depth", std="global", unbiased=False, eps=1e-4, min_std=0.0, clip=5.0)


def flat_grpo() -> TreeSpec:
    """Flow-GRPO as a tree: no splits, every step SDE, per-prompt mean, global population std, eps 1e-4."""
    return TreeSpec(NoSplit(), AllSteps(), advantage=FLOW_GRPO_ADV)


def branchgrpo(prob_weighted: bool = False) -> TreeSpec:
    """BranchGRPO launch script: splits 0,3,6,9 ×2, all steps SDE, split noise ×4, mean (or softmax α=1)
    backup, depth-wise z-score (unbiased, eps 1e-8, 0 below std 1e-6), clip 5."""
    backup = Backup("softmax" if prob_weighted else "mean")
    return TreeSpec(FixedSplits(), AllSteps(), SplitNoise(4.0), backup)


def branchgrpo_mix() -> TreeSpec:
    """BranchGRPO-Mix: SDE only at the splits and in the window 0–3 (the script's stride 30 > 20 steps), ODE
    elsewhere; only SDE edges are trained."""
    return TreeSpec(FixedSplits(), FixedSteps((0, 1, 2, 3)), SplitNoise(4.0))


def branchgrpo_depth_pruned() -> TreeSpec:
    """BranchGRPO-DepPru: drop child depths 15–18, one shallower every 30 iterations, down to depth 9."""
    return TreeSpec(FixedSplits(), AllSteps(), SplitNoise(4.0),
                    train=TrainEdges(depth_prune=(15, 16, 17, 18), depth_slide_every=30, depth_stop=9))


def branchgrpo_width_pruned() -> TreeSpec:
    """BranchGRPO-WidPru: after the last split keep the best 50 % of each branch's edges (mode 1)."""
    return TreeSpec(FixedSplits(), AllSteps(), SplitNoise(4.0), train=TrainEdges(width="per_branch"))


def treegrpo() -> TreeSpec:
    """TreeGRPO: a sliding window of 3 steps splitting 2 ways, ODE outside, window edges trained [derived]."""
    return TreeSpec(SplitWindow(), None, train=TrainEdges(window_only=True))


def dynamic_treerpo() -> TreeSpec:
    """Dynamic-TreeRPO: a binary tree of depth 4 on MixGRPO's sliding window, noise ramped ×1 → ×2 over the
    depth [derived], only the tree steps trained."""
    return TreeSpec(SplitWindow(size=4), None, SplitNoise(1.0, ramp=1.0), train=TrainEdges(window_only=True))


def tempflow() -> TreeSpec:
    """TempFlow-GRPO: ODE trunk, K = 6 SDE children per step completed by ODE, advantage over the K siblings
    (Flow-GRPO's per-group mean, population std, eps 1e-4)."""
    return TreeSpec(EveryStep(6), None, advantage=TreeAdvantage("siblings", "group", False, 1e-4, 0.0, 5.0))


def egrpo() -> TreeSpec:
    """E-GRPO (released config, merge 1): ODE anchor, G = 12 SDE children at steps 1, 2, 3, completed by ODE,
    advantage per (prompt, step) group: (R − mean)/(std + 1e-8)."""
    adv = TreeAdvantage("siblings", "group", False, 1e-8, 0.0, 5.0)
    return TreeSpec(EveryStep(12, (1, 2, 3)), None, advantage=adv)


PRESETS = {"flat_grpo": flat_grpo, "branchgrpo": branchgrpo, "branchgrpo_mix": branchgrpo_mix,
           "branchgrpo_depth_pruned": branchgrpo_depth_pruned,
           "branchgrpo_width_pruned": branchgrpo_width_pruned,
           "treegrpo": treegrpo, "dynamic_treerpo": dynamic_treerpo, "tempflow": tempflow, "egrpo": egrpo}
