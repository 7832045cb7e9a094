"""The rollout stage: this process's N = P·G samples of one iteration, sampled with the "old" adapter.

Row r of the iteration (r = p·G + j: prompt p, sample j) draws all its noise from its own generator
``sample_generator(seed, iteration, p, j)`` (samplers.rng), so a sample is the same whichever process or batch
makes it, and resume replays it. The sampling engine (``samplers.engine``) runs them in chunks of
``sampler.chunk`` rows: encode (with the negative prompt when guidance > 1), starting noise, the family's σ grid,
then the flat rollout with the configured kernel, step plan (window) and log-prob reduction. A strategy may
replace the flat rollout: with ``sampler.tree`` set, ``flowrl.training.trees`` grows one branching tree per
prompt (the leaves are the samples, the trained edges the rows); with ``sampler.pool`` set,
``flowrl.pools.stage`` scouts N candidate seeds per prompt and regenerates the K kept ones.

``sampler.accelerate`` (``flowrl.accelerators``) may run the flat rollout's forwards cheaper; with
``sampler.correction`` (a lossy accelerator under a ratio-based objective) the stage then recomputes the exact
"old" log-probs of the stored transitions (one exact forward per stored step: ``rollout/correction_forwards``)
and stores them with the rollout's own and the correction weights W (``rollout_corr/*`` drift metrics of this
process; a warning when the rejected fraction stays above the anchor's 5 %). ``run(it, on_chunk)`` hands each
decoded chunk to ``on_chunk(pixels, prompts, group_ids, meta)`` as soon as it exists (``train.async_rewards``).

``Samples.metrics`` carries the stage's per-iteration figures for the loop to log: ``rollout/forwards``
(velocity evaluations spent sampling, all processes), ``train/rows`` and, for stored trajectories,
``train/forwards`` = rows × stored steps (one pass).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from flowrl.objectives.sources import Rollout
from flowrl.types import Cond, RolloutResult


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
    labels: Tensor | None = None                  # offline rows: their advantages (no reward / advantage stage)

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


@dataclass
class Layout:
    """An iteration's rows: P prompts × G samples over all processes; row r = p·G + j is (prompt p, sample j),
    its noise from ``sample_generator(seed, iteration, p, j)``."""

    prompts: Any                       # flowrl.data.prompts source: ``batch(iteration, P)`` → [(text, meta)]
    P: int
    G: int
    seed: int
    dist: Any                          # flowrl.distributed.processes.Dist: this process's slice of the rows

    def local_rows(self) -> range:
        """This process's row indices of the iteration."""
        return range(self.P * self.G)[self.dist.local_slice(self.P * self.G)]

    def local_prompts(self, what: str) -> range:
        """This process's prompt indices when a strategy (``what``) needs whole prompts per process."""
        rows = self.local_rows()
        if len(rows) % self.G or rows.start % self.G:
            raise ValueError(f"{what} gives each process whole prompts: train.prompts_per_iter ({self.P}) "
                             "must be a multiple of the number of processes")
        return range(rows.start // self.G, rows.start // self.G + len(rows) // self.G)


def record(spec, cond: Cond, result: RolloutResult) -> Rollout:
    """How rows were sampled, as an objective source reads it (guidance, kernel, kernel Config, reduction)."""
    return Rollout(cond, result, spec.guidance, spec.kernel, spec.kernel_cfg, spec.reduce)


class RolloutStage:
    """Samples an iteration's prompts × group with the "old" weights; ``run(it)`` → ``Samples``."""

    def __init__(self, policy, sampler_cfg, kernel, window, prompts, dist, *, seed: int, prompts_per_iter: int,
                 group_size: int, chunk: int | None, negative_prompt: str, store_trajectory: bool,
                 rewards=None):
        from samplers.engine import SampleSpec, SamplingEngine

        s = sampler_cfg
        self.kernel, self.window, self.steps = kernel, window, s.steps
        self.layout = Layout(prompts, prompts_per_iter, group_size, seed, dist)
        self.dist, self.seed = dist, seed
        guidance = float(policy.default_guidance if s.guidance is None else s.guidance)
        self.engine = SamplingEngine(policy, SampleSpec(
            s.steps, s.height, s.width, s.num_frames, guidance, negative_prompt, kernel, s.kernel.config,
            s.log_prob_reduce, store_trajectory, chunk, adapter="old", restart=s.restart))
        tree, pool = s.tree, s.pool
        if tree is not None and pool is not None:
            raise ValueError("sampler.pool and sampler.tree cannot be combined; set one of them to null")
        if s.restart is not None and (kernel.stochastic or tree is not None or pool is not None):
            raise ValueError("sampler.restart replaces a deterministic (ODE) rollout: it needs sampler.kernel.kind "
                             "ode and no sampler.tree / sampler.pool (Restart's jumps have no policy log-prob)")
        from flowrl.accelerators import build

        self.accelerator, self.correction, self.drifting = build(s.accelerate), s.correction, 0
        self.strategy = None
        if tree is not None:
            from flowrl.training.trees import TreeStage

            self.strategy = TreeStage(self.engine, tree, self.layout, self.plan)
        if pool is not None:
            from flowrl.pools.stage import PoolStage

            self.strategy = PoolStage(self.engine, pool, self.layout, self.plan, rewards)

    @property
    def guidance(self) -> float:
        return self.engine.spec.guidance

    def plan(self, iteration: int):
        """Which rollout steps are SDE (stored): none for a deterministic kernel, else the window's plan."""
        from samplers.rng import derived_seed

        if not self.kernel.stochastic:
            return None
        rng = random.Random(derived_seed(self.seed, iteration, "window"))
        return self.window.plan(iteration, self.steps, rng)

    def run(self, iteration: int, on_chunk=None) -> Samples:
        from flowrl.data.images import source_images
        from samplers.rng import sample_generator

        if self.strategy is not None:
            if on_chunk is not None:
                raise ValueError("train.async_rewards scores the chunks of a flat rollout; sampler.tree / "
                                 "sampler.pool score their own samples: set train.async_rewards=false")
            return self.strategy.run(iteration)
        lay = self.layout
        items = lay.prompts.batch(iteration, lay.P)
        rows = list(lay.local_rows())
        prompts = [items[r // lay.G][0] for r in rows]
        meta = [dict(items[r // lay.G][1]) for r in rows]
        group_ids = torch.tensor([r // lay.G for r in rows], dtype=torch.long)
        gens = [sample_generator(self.seed, iteration, r // lay.G, r % lay.G) for r in rows]
        refresh_s = self.accelerator.refresh(self.engine.policy)
        metrics = {"rollout/accelerator_refresh_s": refresh_s} if refresh_s else {}
        hook = None if on_chunk is None else (
            lambda sl, px: on_chunk(px, prompts[sl], group_ids[sl], meta[sl]))
        with torch.no_grad(), self.dist.autocast():
            out, calls = self.accelerator.sample(self.engine, prompts, gens, self.plan(iteration), decode=True,
                                                 images=source_images(meta), on_chunk=hook)
            if self.correction is not None and out.result.traj is not None:
                metrics.update(self.correct(out, lay.P * lay.G))
        nfe = calls * lay.P * lay.G + metrics.get("rollout/correction_forwards", 0)
        metrics["rollout/forwards"] = nfe
        return Samples(prompts, meta, group_ids, out.cond, out.result, out.pixels,
                       record(self.engine.spec, out.cond, out.result), nfe, metrics,
                       row_offset=rows[0] if rows else 0)

    def correct(self, out, rows: int) -> dict:
        """Recompute the exact "old" log-probs of the stored transitions, keep the rollout's as
        ``traj.rollout_log_prob`` and store the correction weights; the drift metrics."""
        from flowrl.accelerators import exact_log_probs
        from flowrl.objectives.rollout_correction import DRIFT_WARN, WARN_AFTER, correction_weights

        traj = out.result.traj
        exact = exact_log_probs(self.engine, out.cond, traj)
        traj.is_weight, metrics = correction_weights(exact, traj.log_prob, self.correction)
        traj.rollout_log_prob, traj.log_prob = traj.log_prob, exact
        masked = metrics["rollout_corr/rs_seq_masked_fraction"]
        self.drifting = self.drifting + 1 if masked > DRIFT_WARN else 0
        if self.drifting >= WARN_AFTER:
            self.dist.print(f"[flowrl] rollout correction rejected {masked:.1%} of the samples for {self.drifting} "
                            f"iterations (above {DRIFT_WARN:.0%}): the rollout accelerator drifts; widen "
                            "sampler.correction.rs_threshold or use a less lossy accelerator")
        metrics["rollout/correction_forwards"] = traj.x.shape[1] * rows
        return metrics
