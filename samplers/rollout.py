"""The flat rollout: integrate σ_0 → σ_N with a velocity function, storing only the stochastic steps.

For each stage of ``samplers.steps.build_stages(grid, plan)`` (σ → σ'):

    v = velocity_fn(x, σ·1_B)
    ODE stage:  x ← ode_kernel.step(x, v, σ, σ')      Euler x + (σ' − σ)·v by default, bit-identical to
                                                      diffusers' FlowMatchEulerDiscreteScheduler; a multistep
                                                      kernel (DPM-Solver++(2M)) also gets the path's previous
                                                      x̂0 = x − σ·v, reset after an SDE step and at the tail
    SDE stage:  ε ~ N(0, I) row b from generators[b]; x ← kernel.step(x, v, σ, σ', ε) = μ + s·ε,
                log π = kernel.log_prob(x', μ, s)      stored as (x, x', μ, s, log π, σ, σ', step, ε)

After the last SDE step a plan with ``ode_tail`` runs the compressed DPM-Solver++(2M) tail (MixGRPO-Flash,
arXiv 2507.21802). This is the tree that never splits: ``samplers.tree.tree_rollout`` with no branch plan gives
the same result bit for bit (tests/samplers/test_flat_equals_tree.py). Memory: the (B, K, ...) trajectory
buffers are allocated once for the K stored steps; nothing else is kept.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from flowrl.types import RolloutResult, Trajectory, VelocityFn
from samplers.dpm_solver import KERNEL as DPM_TAIL
from samplers.kernel import Kernel, data_prediction, resolve_kernel
from samplers.rng import randn_rows
from samplers.schedule import check_grid
from samplers.steps import Stage, build_stages
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
    trajectory (SDE sampling for evaluation; ``traj`` is None); with no SDE step, ``store`` keeps the
    deterministic path instead (``RolloutResult.path``: every boundary state, TDM-R1's per-step states).
    """
    grid = check_grid(sigmas).to(x1.device)
    plan = plan or StepPlan(grid.numel() - 1)
    if plan.num_steps != grid.numel() - 1:
        raise ValueError(f"plan is for {plan.num_steps} steps but the σ grid has {grid.numel() - 1}; build both "
                         "from the same num_steps")
    stages = build_stages(grid, plan)
    sde, sde_cfg, ode, ode_cfg = step_kernels(kernel, kernel_cfg, ode_kernel, ode_kernel_cfg)
    check_rollout_args(sde, ode, stages, generators, x1.shape[0])
    x = x1.to(torch.float32)
    n_sde = sum(st.sde for st in stages)
    traj = _TrajectoryBuffer(x, n_sde, keep_noise) if (store and n_sde) else None
    path = [x] if (store and not n_sde) else None
    history, x_hat, bar = None, x, _progress(len(stages), progress)
    for si, st in enumerate(stages):
        if st.tail and not stages[si - 1].tail:
            history = None                                     # the tail starts first order (MixGRPO-Flash)
        sigma, sigma_next = st.sigma.expand(x.shape[0]), st.sigma_next.expand(x.shape[0])
        v = velocity_fn(x, sigma)
        x_hat = data_prediction(x, v, st.sigma)
        if st.sde:
            eps = randn_rows(x.shape[1:], generators).to(x.device)
            out = sde.step(x, v, sigma, sigma_next, eps, cfg=sde_cfg)
            if traj is not None:
                traj.put(x, out, sde.log_prob(out.x_next, out.mean, out.std, reduce, sde_cfg), eps, st)
            x, history = out.x_next, None
        else:
            kern, cfg = (DPM_TAIL, DPM_TAIL.Config()) if st.tail else (ode, ode_cfg)
            extra = {"history": history} if kern.history else {}
            x, history = kern.step(x, v, sigma, sigma_next, cfg=cfg, **extra).x_next, (x_hat, float(st.sigma))
        if path is not None:
            path.append(x)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return RolloutResult(x, grid, None if traj is None else traj.trajectory(), x_hat, len(stages),
                         None if path is None else torch.stack(path, dim=1))


def step_kernels(kernel: Kernel | str, kernel_cfg, ode_kernel: Kernel | str | None, ode_kernel_cfg):
    """(SDE kernel, its Config, ODE kernel, its Config): a deterministic ``kernel`` with no ``ode_kernel``
    is the ODE kernel; a missing Config is the kernel's default one."""
    kern = resolve_kernel(kernel)
    if ode_kernel is None:
        ode_kernel, ode_kernel_cfg = (kern, kernel_cfg) if not kern.stochastic else ("ode", None)
        kernel_cfg = kernel_cfg if kern.stochastic else None
    okern = resolve_kernel(ode_kernel)
    sde_cfg = kernel_cfg if (kernel_cfg is not None or not kern.stochastic) else kern.Config()
    return kern, sde_cfg, okern, ode_kernel_cfg if ode_kernel_cfg is not None else okern.Config()


def check_rollout_args(kern: Kernel, okern: Kernel, stages: list[Stage], generators, n_rows: int) -> None:
    """One-line errors for a stochastic ODE kernel, SDE steps with a deterministic kernel, or missing
    generators."""
    if okern.stochastic:
        raise ValueError(f"ode_kernel {okern.name!r} is stochastic; pick a deterministic kernel (ode, dpmpp_2m)")
    if any(st.sde for st in stages):
        if not kern.stochastic:
            raise ValueError(f"the plan has SDE steps but the kernel is {kern.name!r}; pick flow_sde, "
                             "dance_sde or cps")
        if generators is None or len(generators) != n_rows:
            raise ValueError(f"SDE steps need one generator per sample ({n_rows}), got "
                             f"{None if generators is None else len(generators)}; see "
                             "samplers.rng.sample_generator")


class _TrajectoryBuffer:
    """Preallocated (B, K, ...) buffers for the K stored steps, filled in step order."""

    def __init__(self, x: Tensor, k: int, keep_noise: bool):
        b, dev = x.shape[0], x.device
        shape = (b, k, *x.shape[1:])
        self.x, self.x_next, self.mean = (torch.empty(shape, dtype=torch.float32, device=dev) for _ in range(3))
        self.noise = torch.empty(shape, dtype=torch.float32, device=dev) if keep_noise else None
        self.std, self.log_prob, self.sigma, self.sigma_next = (torch.empty(b, k, device=dev) for _ in range(4))
        self.steps: list[int] = []

    def put(self, x: Tensor, out, log_prob: Tensor, noise: Tensor, st: Stage) -> None:
        j = len(self.steps)
        self.x[:, j], self.x_next[:, j], self.mean[:, j] = x, out.x_next, out.mean
        self.std[:, j], self.log_prob[:, j] = out.std, log_prob
        self.sigma[:, j], self.sigma_next[:, j] = st.sigma, st.sigma_next
        if self.noise is not None:
            self.noise[:, j] = noise
        self.steps.append(st.step)

    def trajectory(self) -> Trajectory:
        return Trajectory(self.x, self.x_next, self.mean, self.std, self.log_prob, self.sigma, self.sigma_next,
                          torch.tensor(self.steps, dtype=torch.long), self.noise)


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm  # optional dependency, imported only when asked for

    return tqdm(total=total, desc="sampling", leave=False)
