"""Candidate-pool scouts: score N candidate seeds per prompt cheaply, behind one interface.

``scout.score(ctx, cands, iteration) -> ScoutOut`` (``ctx``: a ``ScoutContext``): one score per candidate
(P, N) — the reward set's weighted total on the scout's image of that seed — plus the velocity evaluations it
spent. ``cands`` lays the candidates out prompt-major (row p·N + j = prompt p, seed j, noise from
``sample_generator(seed, iteration, p, j)``), and every scout runs them through the sampling engine in chunks
of ``sampler.chunk`` rows with per-sample generators, so a candidate's score never depends on its batch
companions (FP4 activations use block-local scales, ``samplers.fp4``). ``resumable`` scouts also offer
``resume(rows)``: the kept candidates continue from the scout's recorded prefix.

  steps(k)         the sampling ("old") policy, a k-step Euler ODE from the seed's noise (Sol-RL's preview:
                   6 of 10 steps). Cost k per candidate.
  x0_exit(f)       the training rollout itself (kernel, window, "old" policy), stopped after its first
                   k = round(f·calls) model calls, scored on x̂0 = x_k − σ_k·v(x_k) (on the toy: τ 0.80
                   at σ ≈ 0.6). Cost k + 1 per candidate, and **resumable**: a kept candidate continues from
                   x_k and reuses v(x_k) and every earlier velocity (``resume``), so its prefix is paid once.
                   The pool is then a depth-k prefix of N chains pruned by a value estimate (x̂0's reward).
  full             the full training rollout of every candidate (naive scaling); cost = calls per candidate,
                   and the kept ones cost nothing more (their regeneration replays the recorded velocities).
  fp4(fmt, steps)  an FP4 copy (``samplers.fp4``, NVFP4 or MXFP4, emulated on CPU/Hopper: fidelity only) of
                   ``merged_transformer(policy, "old")``, ``steps`` Euler ODE steps (Sol-RL: NVFP4, 6).
                   Refreshed at every ``score`` call, i.e. once per iteration after the previous iteration's
                   old-adapter update (``pool/scout_refresh_s`` logs what it costs).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from flowrl.contracts import ScoutBase
from flowrl.registry import Registry
from flowrl.types import RewardInput

SCOUTS = Registry("pool scout", {
    "full": "flowrl.pools.scouts:FullScout",
    "steps": "flowrl.pools.scouts:StepsScout",
    "x0_exit": "flowrl.pools.scouts:X0ExitScout",
    "fp4": "flowrl.pools.scouts:FP4Scout",
})


@dataclass
class Candidates:
    """This process's candidates of one iteration, prompt-major (row p·N + j)."""

    prompts: list[str]                 # per local prompt
    meta: list[dict]
    prompt_ids: list[int]              # the iteration's prompt index of each local prompt
    n: int                             # candidates per prompt
    seed: int
    iteration: int

    @property
    def rows(self) -> int:
        return len(self.prompts) * self.n

    def generators(self, rows: list[int] | None = None) -> list:
        """Fresh per-sample generators of candidate rows (all by default)."""
        from samplers.rng import sample_generator

        rows = range(self.rows) if rows is None else rows
        return [sample_generator(self.seed, self.iteration, self.prompt_ids[r // self.n], r % self.n)
                for r in rows]

    def row_prompts(self, rows: list[int] | None = None) -> list[str]:
        rows = range(self.rows) if rows is None else rows
        return [self.prompts[r // self.n] for r in rows]


@dataclass
class ScoutContext:
    """What a scout may use: the sampling engine (the "old" weights, the training kernel, the rollout chunk),
    the reward set, and the function giving an iteration's step plan."""

    engine: Any                        # samplers.engine.SamplingEngine
    rewards: Any                       # rewards.RewardSet
    plan: Callable[[int], Any]


@dataclass
class ScoutOut:
    scores: Tensor                     # (P, N) float32, the reward set's total (NaN → −inf)
    forwards: int                      # velocity evaluations spent (this process)
    metrics: dict = field(default_factory=dict)


def score_images(rewards, pixels: Tensor, cands: Candidates) -> Tensor:
    """(P, N) weighted reward totals of the scout images (candidate rows in order); NaN counts as −inf."""
    n = pixels.shape[0]
    group = torch.tensor([r // cands.n for r in range(n)], dtype=torch.long)
    meta = [dict(cands.meta[r // cands.n]) for r in range(n)]
    out = rewards(RewardInput(pixels.float().clamp(0, 1), cands.row_prompts(), group, meta))
    total = torch.nan_to_num(out.total.float().cpu(), nan=float("-inf"))
    return total.view(len(cands.prompts), cands.n)


def ode_images(engine, cands: Candidates) -> tuple[Tensor, int]:
    """Decoded Euler ODE samples of every candidate with ``engine`` (its steps and weights): (pixels, NFE)."""
    out = engine.sample(cands.row_prompts(), cands.generators(), decode=True)
    return out.pixels, out.result.nfe * cands.rows


@dataclass
class StepsScout(ScoutBase):
    """The same ("old") policy with fewer Euler ODE steps."""

    steps: int = 6

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError(f"steps scout: steps must be >= 1, got {self.steps}")

    def score(self, ctx: ScoutContext, cands: Candidates, iteration: int) -> ScoutOut:
        pixels, nfe = ode_images(ctx.engine.ode(self.steps), cands)
        return ScoutOut(score_images(ctx.rewards, pixels, cands), nfe)


class _ExitReached(Exception):
    """Raised by the recording velocity after the exit call: the prefix is done."""


def prefix_rollout(ctx: ScoutContext, cands: Candidates, iteration: int, k: int | None) -> dict:
    """The training rollout (kernel, window, "old" policy) of every candidate, a rollout chunk at a time,
    recording each model call: stopped after call k, or run to the end when k is None. Returns {"v": (calls,
    N, ...) velocities, "x": the latents of the last recorded call, "sigma": its σ, "latents": the final
    latents (k None) or None, "k": the index of the last recorded call}."""
    eng, plan = ctx.engine, ctx.plan(iteration)
    gens, prompts = cands.generators(), cands.row_prompts()
    vs, xs, finals, sigma = [], [], [], 0.0
    for sl in eng.chunks(cands.rows):
        calls = []

        def record(chunk, velocity_fn, calls=calls):
            def recorded(x, sig):
                v = velocity_fn(x, sig)
                calls.append((x, sig, v))
                if k is not None and len(calls) > k:
                    raise _ExitReached
                return v
            return recorded

        try:
            finals.append(eng.sample(prompts[sl], gens[sl], plan, wrap=record, store=False).result.latents)
        except _ExitReached:
            pass
        vs.append(torch.stack([v for _, _, v in calls]))              # (calls, chunk, ...)
        xs.append(calls[-1][0])
        sigma = float(calls[-1][1][0])                                 # one σ grid for every row
    v = torch.cat(vs, dim=1)
    return {"v": v, "x": torch.cat(xs), "sigma": sigma, "latents": torch.cat(finals) if k is None else None,
            "k": v.shape[0] - 1}


class _Resumable(ScoutBase):
    """Kept candidates continue from the recorded prefix (``_prefix``) instead of recomputing it."""

    _prefix: dict
    resumable: ClassVar[bool] = True

    def resume(self, rows: list[int]):
        """A ``wrap(chunk, velocity_fn)`` for the regeneration of candidate ``rows`` (in regeneration order):
        calls 0..k return the prefix's velocities (the replayed x at call k is checked to be bit for bit the
        scout's); later calls run the model. ``wrap.forwards`` counts the model rows evaluated."""
        v, x_k, k = self._prefix["v"], self._prefix["x"], self._prefix["k"]
        idx = torch.tensor(rows, dtype=torch.long)

        def wrap(chunk: slice, velocity_fn):
            mine, step = idx[chunk], [0]

            def cached(x, sig):
                i = step[0]
                step[0] += 1
                if i <= k:
                    if i == k and not torch.equal(x, x_k[mine.to(x_k.device)]):
                        raise RuntimeError("pool resume: the replayed prefix differs from the scout's; the "
                                           "rollout is not a deterministic function of the seed")
                    return v[i][mine.to(v.device)]
                wrap.forwards += x.shape[0]
                return velocity_fn(x, sig)
            return cached

        wrap.forwards = 0
        return wrap


@dataclass
class X0ExitScout(_Resumable):
    """The training rollout stopped after k = round(fraction·calls) model calls (1 ≤ k ≤ calls − 1), scored
    on x̂0 = x_k − σ_k·v(x_k); kept candidates resume from x_k (module docstring)."""

    fraction: float = 0.4
    _prefix: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if not 0.0 < self.fraction < 1.0:
            raise ValueError(f"x0_exit scout: fraction must lie in (0, 1), got {self.fraction}")

    def exit_call(self, calls: int) -> int:
        """k: model calls completed before the exit (the velocity at call k is the score's, and reused)."""
        return min(max(1, round(self.fraction * calls)), calls - 1)

    def score(self, ctx: ScoutContext, cands: Candidates, iteration: int) -> ScoutOut:
        k = self.exit_call(ctx.engine.calls_per_sample(ctx.plan(iteration)))
        self._prefix = pre = prefix_rollout(ctx, cands, iteration, k)
        x0_hat = pre["x"].float() - pre["sigma"] * pre["v"][k].float()          # x̂0 = x_k − σ_k·v(x_k)
        pixels = ctx.engine.decode(x0_hat)
        out = ScoutOut(score_images(ctx.rewards, pixels, cands), cands.rows * (k + 1))
        out.metrics["pool/exit_sigma"] = pre["sigma"]
        return out


@dataclass
class FullScout(_Resumable):
    """The full training rollout of every candidate (naive scaling: Sol-RL's ``naive_scaling`` 24-in-96 with
    the full model); the kept candidates are these rollouts (their regeneration replays the recorded
    velocities: no model call)."""

    _prefix: dict = field(default_factory=dict, repr=False)

    def score(self, ctx: ScoutContext, cands: Candidates, iteration: int) -> ScoutOut:
        self._prefix = pre = prefix_rollout(ctx, cands, iteration, None)
        pixels = ctx.engine.decode(pre["latents"])
        return ScoutOut(score_images(ctx.rewards, pixels, cands), cands.rows * (pre["k"] + 1))


@contextmanager
def transformer_swapped(policy, module):
    """Within the block ``policy.velocity`` runs ``module`` (the policy's own weights are untouched)."""
    previous = policy.weights.forward_module
    policy.use_wrapped_transformer(module)
    try:
        with policy.adapter("train"):          # full fine-tune: "train" is the set that calls forward_module
            yield
    finally:
        policy.use_wrapped_transformer(previous)


@dataclass
class FP4Scout(ScoutBase):
    """An emulated NVFP4 / MXFP4 copy of the LoRA-merged "old" transformer with ``steps`` Euler steps
    (None: ``sampler.steps``). ``min_dim`` / ``skip``: which Linears are quantized
    (``samplers.fp4.default_eligibility``; ``skip: []`` quantizes embedders and the output projection too)."""

    fmt: str = "nvfp4"
    steps: int | None = 6
    min_dim: int = 64
    skip: tuple[str, ...] | None = None
    _copy: Any = field(default=None, repr=False)
    copies_transformer: ClassVar[bool] = True    # a merged, quantized copy of the transformer (not FSDP-shardable)

    def __post_init__(self):
        if self.fmt not in ("nvfp4", "mxfp4"):
            raise ValueError(f"fp4 scout: fmt must be 'nvfp4' or 'mxfp4', got {self.fmt!r}")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"fp4 scout: steps must be >= 1 or null, got {self.steps}")

    def refresh(self, policy) -> float:
        """Re-merge the "old" adapter and re-quantize the copy; returns the seconds it took."""
        from flowrl.policies.export import merged_transformer
        from samplers import fp4

        t0 = time.perf_counter()
        merged = merged_transformer(policy, "old")
        if self._copy is None:
            skip = fp4.DEFAULT_SKIP if self.skip is None else tuple(self.skip)
            rule = fp4.default_eligibility(self.fmt, min_dim=self.min_dim, skip=skip)
            self._copy = fp4.fp4_copy(merged, self.fmt, rule)
        else:
            fp4.refresh_fp4_copy(self._copy, merged)
        del merged
        return time.perf_counter() - t0

    def score(self, ctx: ScoutContext, cands: Candidates, iteration: int) -> ScoutOut:
        from samplers.engine import CURRENT

        seconds = self.refresh(ctx.engine.policy)
        with transformer_swapped(ctx.engine.policy, self._copy):
            pixels, nfe = ode_images(ctx.engine.ode(self.steps).replace(adapter=CURRENT), cands)
        out = ScoutOut(score_images(ctx.rewards, pixels, cands), nfe)
        out.metrics["pool/scout_refresh_s"] = seconds
        return out
