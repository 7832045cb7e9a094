"""The flat rollout: integrate σ_0 → σ_N with a velocity function, storing only the stochastic steps — the
rollout tree that never splits (``samplers.tree``, one engine for flat and tree rollouts).

For each grid step i (σ_i → σ_{i+1}): ``v = velocity_fn(x, σ_i·1_B)``; an ODE step runs the ODE kernel (Euler
``x ← x + (σ_{i+1} − σ_i)·v`` by default, bit-identical to diffusers' FlowMatchEulerDiscreteScheduler; or
``ode_kernel="dpmpp_2m"``); an SDE step of the plan (spanning m grid steps) calls ``kernel.step(x, v, σ_i,
σ_{i+m}, ε)`` with ε drawn row by row from each sample's own generator, and stores (x, x_next, mean, std,
log_prob, σ, σ_next, step index, ε). With ``plan.ode_tail == "dpmpp_2m"`` the steps after the last SDE step
run on a compressed DPM-Solver++(2M) grid.

Memory: the trajectory buffers (B, K, ...) are allocated once for the K stored steps; nothing else is kept.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from flowrl.types import RolloutResult, VelocityFn
from samplers.kernel import Kernel
from samplers.tree import resolve_kernel, tree_rollout
from samplers.windows import StepPlan


def rollout(velocity_fn: VelocityFn, x1: Tensor, sigmas: Tensor, plan: StepPlan | None = None,
            kernel: Kernel | str = "ode", kernel_cfg=None,
            generators: Sequence[torch.Generator] | None = None,
            reduce: str = "mean", keep_noise: bool = True, store: bool = True, progress: bool = False,
            ode_kernel: Kernel | str | None = None, ode_kernel_cfg=None) -> RolloutResult:
    """Run one batch of rollouts; returns final latents, the stored trajectory, x̂0 of the last model call
    and the NFE count (velocity calls per sample).

    velocity_fn: ``v = velocity_fn(x, sigma)`` with x (B, ...) float32, sigma (B,) float32.
    x1: starting noise (B, ...), row b drawn from ``generators[b]`` (see samplers.rng).
    sigmas: the (N + 1,) grid (samplers.schedule). plan: which steps are SDE (samplers.windows); None = all
    ODE. kernel / kernel_cfg: the SDE kernel (a Kernel or a KERNELS name) and its Config for the plan's steps;
    a deterministic kernel here (e.g. "dpmpp_2m") is the ODE kernel when ``ode_kernel`` is not given.
    ode_kernel / ode_kernel_cfg: the kernel of every ODE step (default Euler "ode").
    generators: one per row; the SDE noise of row b is drawn from generators[b] only, in step order.
    reduce: log-prob reduction over latent elements ("mean" as the anchors, or "sum").
    keep_noise: also store each step's ε (replay). store: False samples the SDE steps without recording a
    trajectory (SDE sampling for evaluation; ``traj`` is None).
    """
    kern = resolve_kernel(kernel)
    if ode_kernel is None:
        ode_kernel, ode_kernel_cfg = (kern, kernel_cfg) if not kern.stochastic else ("ode", None)
    tree = tree_rollout(lambda x, sigma, roots: velocity_fn(x, sigma), x1, sigmas, plan, None,
                        kernel=kern, kernel_cfg=kernel_cfg if kern.stochastic else None,
                        ode_kernel=ode_kernel,
                        ode_kernel_cfg=ode_kernel_cfg, generators=generators, reduce=reduce,
                        keep_noise=keep_noise, store=store, progress=progress)
    return tree.result()
