"""The rollout stage: this process's N = P·G samples of one iteration, sampled with the "old" adapter.

Row r of the iteration (r = p·G + j: prompt p, sample j) draws all its noise from its own generator
``sample_generator(seed, iteration, p, j)`` (samplers.rng), so a sample is the same whichever process or batch
makes it, and resume replays it. Rollouts run in chunks of ``micro_batch`` rows: encode (with the negative prompt
when guidance > 1), starting noise, the family's σ grid, then ``samplers.rollout`` with the configured kernel,
step plan (window) and log-prob reduction. With ``sampler.tree`` set, ``flowrl.training.trees`` grows
one branching tree per prompt instead (the leaves are the samples, the trained edges the rows); with
``sampler.pool`` set, ``flowrl.training.pool`` scouts N candidate seeds per prompt and this stage regenerates
the K kept ones.

``Samples.metrics`` carries the stage's per-iteration figures for the loop to log: ``rollout/forwards``
(velocity evaluations spent sampling, all processes), ``train/rows`` and, for stored trajectories,
``train/forwards`` = rows × stored steps (one pass).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch
from torch import Tensor

from flowrl.objectives.sources import Rollout
from flowrl.types import Cond, RolloutResult, Trajectory


@dataclass
class Samples:
    """This process's samples of one iteration, and how they were sampled."""

    prompts: list[str]
    meta: list[dict]
    group_ids: Tensor                  # (n,) global prompt index within the iteration
    cond: Cond
    result: RolloutResult
    pixels: Tensor | None
    how: Rollout                       # guidance, kernel, kernel Config, reduction (cond/result: all rows)
    rollout_nfe: int = 0               # model evaluations spent on these samples, over all processes
    metrics: dict = field(default_factory=dict)   # per-iteration figures to log (module docstring)
    extras: dict = field(default_factory=dict)    # per-sample values of the objective's prepare_advantages
    row_offset: int = 0                           # global row index of this process's first sample

    def training_rows(self, adv: Tensor) -> tuple[Samples, Tensor]:
        """What the update trains on and each row's advantage, given this process's per-sample advantages: the
        samples themselves for a flat rollout."""
        self.metrics["train/rows"] = int(adv.shape[0])
        if self.result.traj is not None:
            self.metrics["train/forwards"] = int(adv.shape[0]) * self.result.traj.x.shape[1]
        return self, adv

    def rows(self, idx: Tensor) -> Rollout:
        """The micro-batch ``idx`` as an objective source's input."""
        return Rollout(self.cond.select(idx), self.result.select(idx), self.how.guidance, self.how.kernel,
                       self.how.kernel_cfg, self.how.reduce, {k: v[idx] for k, v in self.extras.items()},
                       idx + self.row_offset)


def concat_results(results: list[RolloutResult]) -> RolloutResult:
    """Rollouts of consecutive row chunks → one RolloutResult (same schedule and plan)."""
    if len(results) == 1:
        return results[0]
    first = results[0]
    traj = None
    if first.traj is not None:
        cat = {}
        for name in Trajectory.__dataclass_fields__:
            vals = [getattr(r.traj, name) for r in results]
            cat[name] = vals[0] if (name == "step_idx" or vals[0] is None) else torch.cat(vals)
        traj = Trajectory(**cat)
    x0 = None if first.x0_pred is None else torch.cat([r.x0_pred for r in results])
    return RolloutResult(torch.cat([r.latents for r in results]), first.sigmas, traj, x0, first.nfe)


def cat_conds(conds: list[Cond]) -> Cond:
    if len(conds) == 1:
        return conds[0]
    emb = {k: torch.cat([c.embeds[k] for c in conds]) for k in conds[0].embeds}
    unc = None if conds[0].uncond is None else {k: torch.cat([c.uncond[k] for c in conds]) for k in conds[0].uncond}
    return Cond(emb, unc, [p for c in conds for p in c.prompts])


class RolloutStage:
    """Samples an iteration's prompts × group with the "old" weights; ``run(it)`` → ``Samples``."""

    def __init__(self, policy, sampler_cfg, kernel, window, prompts, dist, *, seed: int, prompts_per_iter: int,
                 group_size: int, micro_batch: int, negative_prompt: str, store_trajectory: bool,
                 rewards=None):
        self.policy, self.s, self.kernel, self.window = policy, sampler_cfg, kernel, window
        self.rewards = rewards             # rewards.RewardSet: what a candidate-pool scout scores with
        self.prompts, self.dist, self.seed = prompts, dist, seed
        self.P, self.G, self.micro_batch = prompts_per_iter, group_size, micro_batch
        self.negative_prompt, self.store_trajectory = negative_prompt, store_trajectory
        g = sampler_cfg.guidance
        self.guidance = float(policy.default_guidance if g is None else g)
        tree, pool = getattr(sampler_cfg, "tree", None), getattr(sampler_cfg, "pool", None)
        if tree is not None and pool is not None:
            raise ValueError("sampler.pool and sampler.tree cannot be combined; set one of them to null")
        if sampler_cfg.restart is not None and (kernel.stochastic or tree is not None or pool is not None):
            raise ValueError("sampler.restart replaces a deterministic (ODE) rollout: it needs sampler.kernel.kind "
                             "ode and no sampler.tree / sampler.pool (Restart's jumps have no policy log-prob)")
        self.trees = self.pool = None
        if tree is not None:
            from flowrl.training.trees import TreeStage

            self.trees = TreeStage(self, tree)
        if pool is not None:
            from flowrl.training.pool import PoolStage

            self.pool = PoolStage(self, pool)

    def plan(self, iteration: int):
        """Which rollout steps are SDE (stored): none for a deterministic kernel, else the window's plan."""
        from samplers.rng import derived_seed

        if not self.kernel.stochastic:
            return None
        rng = random.Random(derived_seed(self.seed, iteration, "window"))
        return self.window.plan(iteration, self.s.steps, rng)

    def run(self, iteration: int) -> Samples:
        from samplers.rng import sample_generator

        if self.trees is not None:
            return self.trees.run(iteration)
        if self.pool is not None:
            return self.pool.run(iteration)
        items = self.prompts.batch(iteration, self.P)
        rows = list(range(self.P * self.G))[self.dist.local_slice(self.P * self.G)]
        prompts = [items[r // self.G][0] for r in rows]
        meta = [dict(items[r // self.G][1]) for r in rows]
        group_ids = torch.tensor([r // self.G for r in rows], dtype=torch.long)
        gens = [sample_generator(self.seed, iteration, r // self.G, r % self.G) for r in rows]
        with torch.no_grad(), self.dist.autocast():
            cond, result = self.sample(prompts, gens, iteration)
            pixels = self.decode(result.latents)
        how = Rollout(cond, result, self.guidance, self.kernel, self.s.kernel.config, self.s.log_prob_reduce)
        nfe = int(result.nfe) * self.P * self.G
        return Samples(prompts, meta, group_ids, cond, result, pixels, how, nfe, {"rollout/forwards": nfe},
                       row_offset=rows[0] if rows else 0)

    def calls_per_sample(self, plan) -> int:
        """Model calls of one flat rollout of ``sampler.steps`` steps with ``plan`` (merged SDE steps and a
        compressed tail make fewer)."""
        from samplers.tree import build_stages
        from samplers.tree_spec import BranchPlan
        from samplers.windows import StepPlan

        n = self.s.steps
        return len(build_stages(torch.linspace(1.0, 0.0, n + 1), plan or StepPlan(n), BranchPlan(n)))

    def sample(self, prompts: list[str], gens: list, iteration: int, wrap=None) -> tuple[Cond, RolloutResult]:
        """Roll out ``prompts`` (one generator each) with the "old" weights, in chunks of micro_batch;
        ``wrap(chunk slice, velocity_fn) -> velocity_fn`` may intercept a chunk's model calls (pools)."""
        from samplers.restart import restart_sample
        from samplers.rollout import rollout

        s, w, policy = self.s, self.guidance, self.policy
        plan, conds, results = self.plan(iteration), [], []
        neg = [self.negative_prompt] * len(prompts) if w > 1 else None
        for a in range(0, len(prompts), self.micro_batch):
            sl = slice(a, a + self.micro_batch)
            cond = policy.encode(prompts[sl], None if neg is None else neg[sl], cfg=w > 1)
            x1 = policy.noise(gens[sl], s.height, s.width, s.num_frames)
            sigmas = policy.sigmas(s.steps, x1)
            vf = lambda x, sig, cond=cond: policy.velocity(x, sig, cond, w)   # noqa: E731
            with policy.adapter("old"):
                if s.restart is not None:
                    res = restart_sample(vf, x1, sigmas, s.restart, gens[sl])
                else:
                    res = rollout(vf if wrap is None else wrap(sl, vf), x1, sigmas, plan, self.kernel,
                                  s.kernel.config, gens[sl], reduce=s.log_prob_reduce,
                                  store=self.store_trajectory)
            conds.append(cond)
            results.append(res)
        return cat_conds(conds), concat_results(results)

    def encode(self, prompts: list[str]) -> Cond:
        """Conditioning of ``prompts`` (with the negative prompt when guidance > 1), micro_batch at a time."""
        w, mb = self.guidance, self.micro_batch
        neg = [self.negative_prompt] * len(prompts) if w > 1 else None
        return cat_conds([self.policy.encode(prompts[a:a + mb], None if neg is None else neg[a:a + mb],
                                             cfg=w > 1) for a in range(0, len(prompts), mb)])

    def decode(self, latents: Tensor) -> Tensor:
        step = self.micro_batch
        return torch.cat([self.policy.decode(latents[a:a + step]).float() for a in range(0, latents.shape[0], step)])

