"""A rollout's step list: the σ grid and the step plan (and, for trees, the branch plan) compiled into stages.

A stage is one model call and one move ``σ → σ'``: an ODE step, an SDE step of the plan (spanning m grid
steps, E-GRPO's merged step σ_k → σ_{k+m}), a split (tree rollouts: always SDE, factor k), or a step of the
compressed DPM-Solver++(2M) tail after the last SDE step (MixGRPO-Flash, arXiv 2507.21802 §3.3; grid step −1).
The flat rollout (``samplers.rollout``) and the tree engine (``samplers.tree``) run the same stages.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from samplers.dpm_solver import tail_sigmas
from samplers.windows import StepPlan


@dataclass(frozen=True)
class Stage:
    """One engine step: grid step (−1 in the compressed tail), σ → σ', SDE?, split factor, split level."""

    step: int
    sigma: Tensor
    sigma_next: Tensor
    span: int
    sde: bool
    split: int = 0
    level: int = -1
    tail: bool = False


def build_stages(grid: Tensor, plan: StepPlan, branch=None) -> list[Stage]:
    """Compile the grid, the step plan and an optional ``samplers.tree_spec.BranchPlan`` into stages."""
    n = grid.numel() - 1
    splits = tuple(branch.splits) if branch is not None else ()
    trunk = bool(branch is not None and branch.trunk)
    if plan.num_steps != n or (branch is not None and branch.num_steps != n):
        raise ValueError(f"plans are for {plan.num_steps} / {branch.num_steps if branch else n} steps but the σ "
                         f"grid has {n}; build them from the same num_steps")
    if trunk and plan.sde_steps:
        raise ValueError("trunk branching (EveryStep) runs an ODE trunk: the step plan must have no SDE steps")
    spans = dict(zip(plan.sde_steps, plan.spans))
    tail_from = plan.sde_steps[-1] + plan.spans[-1] if (plan.ode_tail and plan.sde_steps) else None
    levels = {s: j for j, s in enumerate(splits)}
    stages, i = [], 0
    while i < n:
        if i == tail_from:
            if any(s >= i for s in splits):
                raise ValueError(f"split steps {list(splits)} reach into the compressed ODE tail from step {i}")
            tail = tail_sigmas(grid, i, plan.tail_compress).to(grid.device)
            stages += [Stage(-1, tail[t], tail[t + 1], 1, False, tail=True) for t in range(tail.numel() - 1)]
            break
        m, k = spans.get(i, 0), (branch.factor_at(i) if branch is not None else 0)
        if k and m > 1 and trunk:
            raise ValueError(f"trunk branching cannot split at the merged step {i} (span {m})")
        span = max(m, 1)
        stages.append(Stage(i, grid[i], grid[i + span], span, bool(m or k), k, levels.get(i, -1)))
        i += span
    missing = sorted(set(splits) - {st.step for st in stages})
    if missing:
        raise ValueError(f"split steps {missing} fall inside merged SDE steps; split only where a step starts")
    return stages
