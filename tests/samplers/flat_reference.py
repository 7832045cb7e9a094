"""Reference copy of the pre-tree flat rollout engine (samplers/rollout.py at 2915de2), kept verbatim so the
tests can prove the tree engine reproduces it bit for bit. Do not edit.

The rollout engine: integrate σ_0 → σ_N with a velocity function, storing only the stochastic steps.

For each grid step i (σ_i → σ_{i+1}): ``v = velocity_fn(x, σ_i·1_B)``; an ODE step is Euler
``x ← x + (σ_{i+1} − σ_i)·v`` (bit-identical to diffusers' FlowMatchEulerDiscreteScheduler); an SDE step of the
plan (spanning m grid steps) calls ``kernel.step(x, v, σ_i, σ_{i+m}, ε)`` with ε drawn row by row from each
sample's own generator, and stores (x, x_next, mean, std, log_prob, σ, σ_next, step index, ε). With
``plan.ode_tail == "dpmpp_2m"`` the steps after the last SDE step run on a compressed DPM-Solver++(2M) grid.

Memory: the trajectory buffers (B, K, ...) are allocated once for the K stored steps; nothing else is kept.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from flowrl.types import RolloutResult, Trajectory, VelocityFn
from samplers.dpm_solver import dpmpp_2m_step, tail_sigmas
from samplers.kernel import Kernel
from samplers.rng import randn_rows
from samplers.schedule import check_grid
from samplers.windows import StepPlan


def _resolve_kernel(kernel: Kernel | str) -> Kernel:
    if isinstance(kernel, Kernel):
        return kernel
    from samplers import KERNELS  # lazy: the registry module imports this one's package

    return KERNELS.get(kernel)


class _Store:
    """Preallocated (B, K, ...) buffers for the K stored steps of a plan."""

    def __init__(self, x: Tensor, plan: StepPlan, sigmas: Tensor, keep_noise: bool):
        b, k = x.shape[0], len(plan.sde_steps)
        shape = (b, k, *x.shape[1:])
        self.x, self.x_next, self.mean = (torch.empty(shape, dtype=torch.float32, device=x.device) for _ in range(3))
        self.noise = torch.empty(shape, dtype=torch.float32, device=x.device) if keep_noise else None
        self.std = torch.empty(b, k, dtype=torch.float32, device=x.device)
        self.log_prob = torch.empty(b, k, dtype=torch.float32, device=x.device)
        idx = torch.tensor(plan.sde_steps, dtype=torch.long)
        nxt = idx + torch.tensor(plan.spans, dtype=torch.long)
        grid = sigmas.to(x.device)
        self.sigma = grid[idx.to(x.device)].expand(b, k).clone()
        self.sigma_next = grid[nxt.to(x.device)].expand(b, k).clone()
        self.step_idx = idx

    def put(self, j: int, x: Tensor, out, log_prob: Tensor, noise: Tensor) -> None:
        self.x[:, j], self.x_next[:, j], self.mean[:, j] = x, out.x_next, out.mean
        self.std[:, j], self.log_prob[:, j] = out.std, log_prob
        if self.noise is not None:
            self.noise[:, j] = noise

    def trajectory(self) -> Trajectory:
        return Trajectory(self.x, self.x_next, self.mean, self.std, self.log_prob, self.sigma, self.sigma_next,
                          self.step_idx, self.noise)


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm  # optional dependency, imported only when asked for

    return tqdm(total=total, desc="sampling", leave=False)


def reference_rollout(velocity_fn: VelocityFn, x1: Tensor, sigmas: Tensor, plan: StepPlan | None = None,
            kernel: Kernel | str = "ode", kernel_cfg=None, generators: Sequence[torch.Generator] | None = None,
            reduce: str = "mean", keep_noise: bool = True, store: bool = True,
            progress: bool = False) -> RolloutResult:
    """Run one batch of rollouts; returns final latents, the stored trajectory, x̂0 of the last model call
    and the NFE count (velocity calls per sample).

    velocity_fn: ``v = velocity_fn(x, sigma)`` with x (B, ...) float32, sigma (B,) float32.
    x1: starting noise (B, ...), row b drawn from ``generators[b]`` (see samplers.rng).
    sigmas: the (N + 1,) grid (samplers.schedule). plan: which steps are SDE (samplers.windows); None = all ODE.
    kernel / kernel_cfg: the SDE kernel (a Kernel or a KERNELS name) and its Config for the plan's steps.
    generators: one per row; the SDE noise of row b is drawn from generators[b] only, in step order.
    reduce: log-prob reduction over latent elements ("mean" as the anchors, or "sum").
    keep_noise: also store each step's ε (replay). store: False samples the SDE steps without recording a
    trajectory or log-probs (SDE sampling for evaluation; ``traj`` is None).
    """
    grid = check_grid(sigmas)
    n_steps = grid.numel() - 1
    plan = plan or StepPlan(n_steps)
    if plan.num_steps != n_steps:
        raise ValueError(f"plan is for {plan.num_steps} steps but the σ grid has {n_steps}; build both from "
                         "the same num_steps")
    kern = _resolve_kernel(kernel)
    if plan.sde_steps:
        if not kern.stochastic:
            raise ValueError("the plan has SDE steps but the kernel is 'ode'; pick flow_sde, dance_sde or cps")
        if generators is None or len(generators) != x1.shape[0]:
            raise ValueError(f"SDE steps need one generator per sample ({x1.shape[0]}), got "
                             f"{None if generators is None else len(generators)}; see samplers.rng.sample_generator")
        kernel_cfg = kernel_cfg if kernel_cfg is not None else kern.Config()
    x = x1.to(torch.float32)
    store = _Store(x, plan, grid, keep_noise) if (plan.sde_steps and store) else None
    dts = grid[1:] - grid[:-1]                          # float32, as the scheduler's sigma_next − sigma
    sig_b = grid.to(x.device).unsqueeze(1).expand(-1, x.shape[0])
    dts, spans = dts.to(x.device), dict(zip(plan.sde_steps, plan.spans))
    tail_from = plan.sde_steps[-1] + plan.spans[-1] if (plan.ode_tail and plan.sde_steps) else None
    bar = _progress(n_steps, progress)
    i, j, nfe, x_prev, v = 0, 0, 0, x, None
    while i < n_steps:
        if i == tail_from:
            x, x0_pred, k = _dpm_tail(velocity_fn, x, grid, i, plan.tail_compress, bar)
            return RolloutResult(x, grid, store.trajectory() if store else None, x0_pred, nfe + k)
        x_prev, v = x, velocity_fn(x, sig_b[i])
        nfe += 1
        m = spans.get(i, 0)
        if m:
            noise = randn_rows(x.shape[1:], generators).to(x.device)
            out = kern.step(x, v, sig_b[i], sig_b[i + m], noise, cfg=kernel_cfg)
            if store is not None:
                store.put(j, x, out, kern.log_prob(out.x_next, out.mean, out.std, reduce, kernel_cfg), noise)
            x, i, j = out.x_next, i + m, j + 1
        else:
            x, i, m = x + dts[i] * v.to(torch.float32), i + 1, 1
        if bar is not None:
            bar.update(m)
    if bar is not None:
        bar.close()
    x0_pred = None if v is None else x_prev - sig_b[i - m].view(-1, *[1] * (x.dim() - 1)) * v.float()
    return RolloutResult(x, grid, store.trajectory() if store else None, x0_pred, nfe)


def _dpm_tail(velocity_fn: VelocityFn, x: Tensor, grid: Tensor, start: int, compress: float, bar):
    """Integrate from grid[start] to 0 on the compressed DPM-Solver++(2M) tail; returns (x, x̂0, NFE)."""
    tail = tail_sigmas(grid, start, compress)
    b, prev, x0_pred = x.shape[0], None, x
    for t in range(tail.numel() - 1):
        s, sn = float(tail[t]), float(tail[t + 1])
        v = velocity_fn(x, torch.full((b,), s, dtype=torch.float32, device=x.device)).float()
        x0_pred = x - s * v
        x = dpmpp_2m_step(x, x0_pred, s, sn, prev)
        prev = (x0_pred, s)
    if bar is not None:
        bar.update(grid.numel() - 1 - start)
        bar.close()
    return x, x0_pred, tail.numel() - 1
