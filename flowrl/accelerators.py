"""Rollout accelerators (``sampler.accelerate``): cheaper forwards for the training rollout, each declaring
whether it is lossy (Flow-Factory ``acceleration/validator.py`` markers: a lossy rollout-stage accelerator
changes π_rollout, so a ratio-based objective may train on it only with rollout correction;
Flow-Factory ``guidance/acceleration.md``).

    exact      the policy as it is (default; lossless)
    cache      velocity cache: the model runs on call 0, every, 2·every, … of each rollout and the calls
               between reuse the last velocity (fixed-interval feature reuse, FORA arXiv 2407.01425, here of
               the whole transformer output; diffusers' first-block / pyramid caches are the adaptive kin).
               Model calls per sample ⌈calls / every⌉; lossy. ``fresh_first: k`` runs the first k calls
               fresh (the high-noise steps, where the composition forms), the interval counting on from
               there. With ``fresh_sde: true`` every stochastic (stored) step runs the model too, the
               interval counts from the last call that ran, and only ODE steps reuse: the stored transitions
               are then the exact policy's given their states (``stores_exact_steps``), as on MixGRPO-Flash's
               cheaper ODE tail (arXiv 2507.21802 §3.3), so a ratio-based objective needs no correction.
    fp4        an emulated NVFP4 / MXFP4 copy of the LoRA-merged "old" transformer (``samplers.fp4``, the
               fp4 scout's copy; Sol-RL's NVFP4 rollouts), refreshed once per iteration; lossy.
               Emulated on CPU / Hopper: a fidelity check there, a speed-up only on FP4 hardware.
    precision  the forwards under ``torch.autocast(dtype)`` (bfloat16 / float16); lossy.

``accelerator.sample(engine, prompts, generators, plan, decode=, images=, on_chunk=)`` → ``(Sampled, model calls per
sample)``; ``refresh(policy)`` brings a copy of the weights up to date (seconds). With ``sampler.correction``
set, ``flowrl.training.rollout`` recomputes the exact "old" log-probs of the stored transitions
(``exact_log_probs``) and the correction weights (``flowrl.objectives.rollout_correction``).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from flowrl.registry import Registry

ACCELERATORS = Registry("rollout accelerator", {
    "exact": "flowrl.accelerators:Exact",
    "cache": "flowrl.accelerators:VelocityCache",
    "fp4": "flowrl.accelerators:FP4Rollout",
    "precision": "flowrl.accelerators:Precision",
})


@dataclass
class Exact:
    """The exact policy (no acceleration)."""

    lossy: ClassVar[bool] = False
    stores_exact_steps: ClassVar[bool] = True     # the stored transitions' log-probs are the exact policy's

    def refresh(self, policy) -> float:
        return 0.0

    def sample(self, engine, prompts, generators, plan, *, decode: bool, images=None, on_chunk=None):
        out = engine.sample(prompts, generators, plan, decode=decode, images=images, on_chunk=on_chunk)
        return out, int(out.result.nfe)


@dataclass
class VelocityCache(Exact):
    """Reuse the velocity between model calls: calls i with i % every ≠ 0 return the last computed one
    (with ``fresh_sde``, the calls of stochastic steps always run the model)."""

    every: int = 2
    fresh_sde: bool = False
    fresh_first: int = 0             # the first calls always run the model (the high-noise steps; diffusers'
    lossy: ClassVar[bool] = True     # FasterCache / pyramid-attention skip ranges keep them exact too)

    def __post_init__(self):
        if self.every < 1:
            raise ValueError(f"sampler.accelerate.every must be >= 1, got {self.every}")
        if self.fresh_first < 0:
            raise ValueError(f"sampler.accelerate.fresh_first must be >= 0, got {self.fresh_first}")

    @property
    def stores_exact_steps(self) -> bool:
        return self.fresh_sde

    def fresh_calls(self, sde: list[bool]) -> list[bool]:
        """Which of a rollout's model calls (``sde[i]``: call i is a stochastic step's) run the model: the
        first ``fresh_first``, then every ``every``-th call since the last one that ran (i % every = 0 with
        neither option), and with ``fresh_sde`` every stochastic step's."""
        fresh, last = [], -self.every
        for i, stochastic in enumerate(sde):
            fresh.append(i < self.fresh_first or i - last >= self.every or (self.fresh_sde and stochastic))
            last = i if fresh[-1] else last
        return fresh

    def sample(self, engine, prompts, generators, plan, *, decode: bool, images=None, on_chunk=None):
        fresh = self.fresh_calls(engine.stochastic_calls(plan))

        def wrap(chunk: slice, velocity_fn):
            state = {"i": 0, "v": None}

            def cached(x: Tensor, sigma: Tensor) -> Tensor:
                i = state["i"]
                state["i"] += 1
                if state["v"] is None or (fresh[i] if i < len(fresh) else i % self.every == 0):
                    state["v"] = velocity_fn(x, sigma)
                return state["v"]
            return cached

        out = engine.sample(prompts, generators, plan, wrap=wrap, decode=decode, images=images,
                            on_chunk=on_chunk)
        nfe = int(out.result.nfe)
        if nfe != len(fresh):                             # a restart sampler's calls: the plain interval rule
            return out, math.ceil(nfe / self.every)
        return out, sum(fresh)



@dataclass
class FP4Rollout(Exact):
    """The rollout through an emulated FP4 copy of the merged "old" transformer (``samplers.fp4``)."""

    fmt: Literal["nvfp4", "mxfp4"] = "nvfp4"
    min_dim: int = 64                    # Linears narrower than this stay full precision (samplers.fp4)
    lossy: ClassVar[bool] = True
    stores_exact_steps: ClassVar[bool] = False
    _copy: Any = field(default=None, repr=False)

    def refresh(self, policy) -> float:
        from flowrl.policies.export import merged_transformer
        from samplers import fp4

        t0 = time.perf_counter()
        merged = merged_transformer(policy, "old")
        if self._copy is None:
            rule = fp4.default_eligibility(self.fmt, min_dim=self.min_dim, skip=fp4.DEFAULT_SKIP)
            self._copy = fp4.fp4_copy(merged, self.fmt, rule)
        else:
            fp4.refresh_fp4_copy(self._copy, merged)
        return time.perf_counter() - t0

    def sample(self, engine, prompts, generators, plan, *, decode: bool, images=None, on_chunk=None):
        from flowrl.pools.scouts import transformer_swapped
        from samplers.engine import CURRENT

        with transformer_swapped(engine.policy, self._copy):
            out = engine.replace(adapter=CURRENT).sample(prompts, generators, plan, decode=decode,
                                                         images=images, on_chunk=on_chunk)
        return out, int(out.result.nfe)


@dataclass
class Precision(Exact):
    """The rollout's forwards under autocast to ``dtype``; velocities come back as float32."""

    dtype: Literal["bfloat16", "float16"] = "bfloat16"
    lossy: ClassVar[bool] = True
    stores_exact_steps: ClassVar[bool] = False

    def wrap(self, chunk: slice, velocity_fn):
        def low(x: Tensor, sigma: Tensor) -> Tensor:
            with torch.autocast(x.device.type, dtype=getattr(torch, self.dtype)):
                return velocity_fn(x, sigma).float()
        return low

    def sample(self, engine, prompts, generators, plan, *, decode: bool, images=None, on_chunk=None):
        out = engine.sample(prompts, generators, plan, wrap=self.wrap, decode=decode, images=images,
                            on_chunk=on_chunk)
        return out, int(out.result.nfe)


@torch.no_grad()
def exact_log_probs(engine, cond, traj) -> Tensor:
    """log π_old(x_{j+1} | x_j) (B, K) of every stored transition under the engine's exact weights, kernel,
    Config and reduction, a rollout chunk at a time — the same computation as GRPO's ``score_step``."""
    from samplers.kernel import resolve_kernel

    s, policy = engine.spec, engine.policy
    kernel = resolve_kernel(s.kernel)
    kcfg = s.kernel_cfg if s.kernel_cfg is not None else kernel.Config()
    out = torch.empty_like(traj.log_prob)
    with engine.weights():
        for sl in engine.chunks(traj.x.shape[0]):
            c = cond.select(torch.arange(traj.x.shape[0])[sl])
            for j in range(traj.x.shape[1]):
                x, xn = traj.x[sl, j].float(), traj.x_next[sl, j].float()
                sg, sn = traj.sigma[sl, j].float(), traj.sigma_next[sl, j].float()
                v = policy.velocity(x, sg, c, s.guidance)
                step = kernel.step(x, v.float(), sg, sn, x_next=xn, cfg=kcfg)
                out[sl, j] = kernel.log_prob(xn, step.mean, step.std, s.reduce, kcfg)
    return out


def build(plugin):
    """The accelerator instance of a ``sampler.accelerate`` Plugin."""
    return plugin.config if plugin.config is not None else ACCELERATORS.get(plugin.kind)()
