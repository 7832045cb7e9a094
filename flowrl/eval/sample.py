"""Deterministic evaluation sampling: the probability-flow ODE through ``samplers.rollout``.

    x_{i+1} = x_i + (σ_{i+1} − σ_i)·v_θ(x_i, σ_i, c)      on the policy's own σ grid (diffusers Euler),

bit-identical to diffusers' FlowMatchEulerDiscreteScheduler (the rollout engine's Euler branch), CFG inside
``policy.velocity``. Evaluation noise uses its own generator stream, ``EVAL_ITERATION`` in
``samplers.rng.sample_seed(seed, EVAL_ITERATION, prompt_idx, 0)``, which no training iteration (≥ 0) uses.
"""
from __future__ import annotations

from torch import Tensor

from flowrl.types import Cond

EVAL_ITERATION = -1


def ode_sample(policy, x1: Tensor, cond: Cond, steps: int, guidance: float | None) -> Tensor:
    """Final latents of the Euler ODE from noise ``x1`` (B, ...) in ``steps`` steps."""
    from samplers.rollout import rollout

    if steps < 1:
        raise ValueError(f"evaluation needs at least one sampling step, got steps={steps}")
    sigmas = policy.sigmas(steps, x1)

    def velocity(x: Tensor, sigma: Tensor) -> Tensor:
        return policy.velocity(x, sigma, cond, guidance)

    return rollout(velocity, x1, sigmas).latents
