"""The sampling engine: prompts → samples, for every caller (training rollouts, evaluation, trees, candidate
pools and their scouts, search, the benchmarks).

    engine = SamplingEngine(policy, SampleSpec(steps=8, height=32, width=32, guidance=3.0, kernel="flow_sde"))
    out = engine.sample(prompts, generators, plan)             # Sampled(cond, result, pixels)

``sample`` works in chunks of ``spec.chunk`` rows (the rollout's forward batch): encode the chunk's prompts
(with the negative prompt when guidance > 1), draw each row's starting noise from its own generator (row b
from ``generators[b]`` alone, ``samplers.rng``), take the policy's σ grid for those latents, then run the flat
rollout (``samplers.rollout``) of ``v = policy.velocity(x, σ, cond, w)`` under ``spec.adapter`` — or
Restart sampling (``samplers.restart``) when ``spec.restart`` is set — and decode when asked. ``grow`` runs the
same encode / noise / σ grid with the tree engine (``samplers.tree``) over all rows at once, its model calls in
chunks. A sample is therefore the same whichever chunk, process or batch makes it.

The policy is anything with the ``flowrl.policies.base.Policy`` methods used here (encode, noise, sigmas,
velocity, decode, adapter); this module knows it only by those calls.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from flowrl.types import Cond, RolloutResult

CURRENT = "<current weights>"
"""``SampleSpec.adapter`` value that samples with whatever weights are active (the caller chose them)."""

Wrap = Callable[[slice, Callable], Callable]
"""``wrap(chunk rows, velocity_fn) -> velocity_fn``: lets a caller intercept one chunk's model calls."""

OnChunk = Callable[[slice, Tensor], None]
"""``on_chunk(chunk rows, pixels)``: called with each chunk's decoded pixels as soon as they exist."""


@dataclass(frozen=True)
class SampleSpec:
    """How to sample: the grid, the size, guidance, the kernels, what to store and the forward batch."""

    steps: int
    height: int
    width: int
    num_frames: int | None = None
    guidance: float = 1.0
    negative_prompt: str | None = None    # None: the policy's own unconditional input when guidance > 1
    kernel: Any = "ode"                   # SDE kernel of the plan's steps (a Kernel or a KERNELS name);
    kernel_cfg: Any = None                # a deterministic kernel is the ODE kernel of every step
    reduce: str = "mean"                  # log-prob reduction over latent elements
    store: bool = False                   # keep the trajectory of the stochastic steps (all-ODE: the path)
    chunk: int | None = None              # rows per model call (None: all rows at once)
    adapter: str | None = CURRENT         # policy.adapter(name) to sample under; CURRENT: leave as is
    restart: Any = None                   # samplers.restart.Config: Restart sampling instead of the rollout

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError(f"sampling needs at least one step, got steps={self.steps}")
        if self.chunk is not None and self.chunk < 1:
            raise ValueError(f"the rollout chunk must be >= 1 rows or None, got {self.chunk}")


@dataclass
class Sampled:
    """What ``SamplingEngine.sample`` made: conditioning and rollout result of every row, pixels if decoded."""

    cond: Cond
    result: RolloutResult
    pixels: Tensor | None = None


class SamplingEngine:
    """Turns (prompts, generators, step plan) into samples with one policy and one ``SampleSpec``."""

    def __init__(self, policy, spec: SampleSpec):
        self.policy, self.spec = policy, spec

    def replace(self, **changes) -> SamplingEngine:
        """The same policy with some spec fields changed (e.g. a scout's fewer ODE steps)."""
        return SamplingEngine(self.policy, dataclasses.replace(self.spec, **changes))

    def ode(self, steps: int | None = None) -> SamplingEngine:
        """Euler probability-flow ODE sampling of ``steps`` steps (default ``spec.steps``), nothing stored."""
        return self.replace(steps=steps or self.spec.steps, kernel="ode", kernel_cfg=None, store=False, restart=None)

    def chunks(self, n: int) -> list[slice]:
        step = self.spec.chunk or max(n, 1)
        return [slice(a, a + step) for a in range(0, n, step)]

    def weights(self):
        """The context in which the policy runs the weights this spec samples with."""
        a = self.spec.adapter
        return contextlib.nullcontext() if a == CURRENT else self.policy.adapter(a)

    def encode(self, prompts: Sequence[str], images: Sequence | None = None) -> Cond:
        """Conditioning of ``prompts`` (with the negative prompt when guidance > 1), a chunk at a time;
        ``images``: None or one entry per prompt (None or a list of (3, H, W) reference images in [0, 1])."""
        images = check_images(self.policy, images, len(prompts))
        return cat_conds([self._encode(list(prompts[sl]), _rows(images, sl)) for sl in self.chunks(len(prompts))])

    def _encode(self, prompts: list[str], images: list | None = None) -> Cond:
        s, cfg = self.spec, self.spec.guidance > 1
        neg = [s.negative_prompt] * len(prompts) if (cfg and s.negative_prompt is not None) else None
        if images is None:
            return self.policy.encode(prompts, neg, cfg=cfg)
        return self.policy.encode(prompts, neg, cfg=cfg, images=images)

    def noise(self, generators: Sequence[torch.Generator]) -> Tensor:
        """Starting latents, row b drawn from ``generators[b]``."""
        s = self.spec
        return self.policy.noise(list(generators), s.height, s.width, s.num_frames)

    def sigmas(self, x1: Tensor) -> Tensor:
        """The policy's σ grid of ``spec.steps`` steps for latents like ``x1`` (resolution-dependent shifts)."""
        return self.policy.sigmas(self.spec.steps, x1)

    def velocity_fn(self, cond: Cond) -> Callable[[Tensor, Tensor], Tensor]:
        policy, w = self.policy, self.spec.guidance
        return lambda x, sigma: policy.velocity(x, sigma, cond, w)

    def decode(self, latents: Tensor) -> Tensor:
        """Pixels (float32) of ``latents``, a chunk at a time."""
        return torch.cat([self.policy.decode(latents[sl]).float() for sl in self.chunks(latents.shape[0])])

    def sample(self, prompts: Sequence[str], generators: Sequence[torch.Generator], plan=None, *,
               wrap: Wrap | None = None, decode: bool = False, store: bool | None = None,
               images: Sequence | None = None, on_chunk: OnChunk | None = None) -> Sampled:
        """Sample one row per (prompt, generator) with the step plan ``plan`` (None: all ODE steps); ``store``
        overrides ``spec.store``; ``wrap`` may intercept each chunk's model calls (candidate pools, rollout
        accelerators); ``images`` are the rows' reference images (``encode``); with ``decode``, each chunk is
        decoded as soon as it is sampled and handed to ``on_chunk(rows, pixels)`` (rewards scored while the next
        chunk samples)."""
        from samplers.restart import restart_sample
        from samplers.rollout import rollout

        s, store = self.spec, self.spec.store if store is None else store
        images = check_images(self.policy, images, len(prompts))
        conds, results, pixels = [], [], []
        with self.weights():
            for sl in self.chunks(len(prompts)):
                cond = self._encode(list(prompts[sl]), _rows(images, sl))
                x1 = self.noise(generators[sl])
                vf = self.velocity_fn(cond) if wrap is None else wrap(sl, self.velocity_fn(cond))
                if s.restart is not None:
                    res = restart_sample(vf, x1, self.sigmas(x1), s.restart, list(generators[sl]))
                else:
                    res = rollout(vf, x1, self.sigmas(x1), plan, s.kernel, s.kernel_cfg, list(generators[sl]),
                                  reduce=s.reduce, store=store)
                conds.append(cond)
                results.append(res)
                if decode:                                 # the same chunks as ``decode``: the same pixels
                    pixels.append(self.policy.decode(res.latents).float())
                    if on_chunk is not None:
                        on_chunk(sl, pixels[-1])
        result = concat_results(results)
        return Sampled(cat_conds(conds), result, torch.cat(pixels) if decode else None)

    def grow(self, prompts: Sequence[str], generators: Sequence[torch.Generator], plan, branch, noise=None,
             images: Sequence | None = None):
        """One rollout tree per prompt (root noise from its generator): (conditioning per root, TreeRollout).
        The whole frontier goes through one model call per stage, in chunks of ``spec.chunk`` rows."""
        from samplers.tree import tree_rollout

        s = self.spec
        cond = self.encode(prompts, images)
        x1 = self.noise(generators)
        policy, w = self.policy, s.guidance

        def velocity(x: Tensor, sigma: Tensor, roots: Tensor) -> Tensor:
            return policy.velocity(x, sigma, cond.select(roots), w)

        with self.weights():
            tree = tree_rollout(velocity, x1, self.sigmas(x1), plan, branch, noise=noise, kernel=s.kernel,
                                kernel_cfg=s.kernel_cfg, ode_kernel=None, generators=list(generators),
                                reduce=s.reduce, store=s.store, max_batch=s.chunk)
        return cond, tree

    def calls_per_sample(self, plan) -> int:
        """Model calls of one flat rollout of ``spec.steps`` steps with ``plan`` (merged SDE steps and a
        compressed tail make fewer)."""
        return len(self.stochastic_calls(plan))

    def stochastic_calls(self, plan) -> list[bool]:
        """Per model call of one flat rollout with ``plan``, in order: whether it is a stochastic (stored)
        step's."""
        from samplers.steps import build_stages
        from samplers.windows import StepPlan

        n = self.spec.steps
        return [st.sde for st in build_stages(torch.linspace(1.0, 0.0, n + 1), plan or StepPlan(n))]


def check_images(policy, images: Sequence | None, n: int) -> list | None:
    """``flowrl.types.check_images`` with the policy's ``accepts_images`` flag (the engine reads the flag, never
    the family)."""
    from flowrl.types import check_images as check

    return check(images, n, getattr(policy, "family", type(policy).__name__), getattr(policy, "accepts_images", False))


def _rows(images: list | None, sl: slice) -> list | None:
    return None if images is None else images[sl]


def concat_results(results: list[RolloutResult]) -> RolloutResult:
    """Rollouts of consecutive row chunks → one RolloutResult (same schedule and plan)."""
    from flowrl.types import Trajectory

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
    path = None if first.path is None else torch.cat([r.path for r in results])
    return RolloutResult(torch.cat([r.latents for r in results]), first.sigmas, traj, x0, first.nfe, path)


def cat_rows(tensors: list[Tensor]) -> Tensor:
    """Row chunks → one tensor; token sequences of different lengths (dim 1, e.g. Qwen-Image's per-batch text
    length) are zero-padded to the longest, which a family's mask reads as padding."""
    longest = max(t.shape[1] for t in tensors) if tensors[0].dim() > 1 else None
    if longest is not None and any(t.shape[1] != longest for t in tensors):
        tensors = [torch.nn.functional.pad(t, (0, 0) * (t.dim() - 2) + (0, longest - t.shape[1])) for t in tensors]
    return torch.cat(tensors)


def cat_conds(conds: list[Cond]) -> Cond:
    """Conditioning of consecutive row chunks → one Cond (``cat_rows`` per tensor)."""
    if len(conds) == 1:
        return conds[0]
    emb = {k: cat_rows([c.embeds[k] for c in conds]) for k in conds[0].embeds}
    unc = None if conds[0].uncond is None else {k: cat_rows([c.uncond[k] for c in conds]) for k in conds[0].uncond}
    return Cond(emb, unc, [p for c in conds for p in c.prompts])
