"""DPM-Solver++(2M) for the flow ODE, and the compressed ODE tail of MixGRPO-Flash (arXiv 2507.21802).

Flow parametrisation: α = 1 − σ, λ = log(α/σ), data prediction x̂0 = x − σ·v (Lu et al. 2022, arXiv
2211.01095). One step s → t, h = λ_t − λ_s, with the previous data prediction m1 at λ_p, r = (λ_s − λ_p)/h:

    first order:   x_t = (σ_t/σ_s)·x_s − α_t·(e^{−h} − 1)·m0
    second order:  x_t = (σ_t/σ_s)·x_s − α_t·(e^{−h} − 1)·D0 − ½·α_t·(e^{−h} − 1)·D1,
                   D0 = m0, D1 = (m0 − m1)/r

("midpoint" form, as MixGRPO-Flash / diffusers DPMSolverMultistepScheduler). A step into σ_t = 0 is first
order (x_t = m0, diffusers' ``lower_order_final``); so is the first step (no history) and any step from σ_s =
1 (λ_s = −∞).

As a registered deterministic kernel (``KERNELS["dpmpp_2m"]``, a ``Kernel`` with ``history=1``) the
rollout engine runs every ODE step through it when ``ode_kernel="dpmpp_2m"``: the engine carries
``history = (x̂0, σ)`` of the previous step along each node's path and resets it after a stochastic step.
Tested against
diffusers' ``DPMSolverMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True)``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from flowrl.types import StepOut
from samplers.kernel import Kernel, as_f32, check_pair, data_prediction, per_sample


def uniform_sigma(sigma: Tensor | float, x: Tensor, what: str = "sigma") -> float:
    """σ as one Python float; raises when the rows of a (B,) σ differ (one σ per multistep call)."""
    s = per_sample(sigma, x)
    first = float(s[0])
    if bool((s != first).any()):
        raise ValueError(f"multistep kernel: every row must share one {what} per call, got {s.tolist()}")
    return first


def _lam(sigma: float) -> float:
    return math.log((1 - sigma) / sigma)


def dpmpp_2m_step(x: Tensor, x0_pred: Tensor, sigma: float, sigma_next: float,
                  prev: tuple[Tensor, float] | None = None) -> Tensor:
    """One DPM-Solver++ step σ → σ' given the data prediction ``x0_pred`` at σ and, for second order,
    ``prev = (x0_pred_prev, σ_prev)`` from the previous step (equations in the module docstring)."""
    x, m0 = x.float(), x0_pred.float()
    if sigma_next <= 0.0:
        return m0
    if sigma >= 1.0:   # λ_s = −∞: the exact first-order update reduces to Euler in data prediction
        return (1 - sigma_next) * m0 + sigma_next * (x - (1 - sigma) * m0) / sigma
    h = _lam(sigma_next) - _lam(sigma)
    phi = (1 - sigma_next) * math.expm1(-h)             # α_t·(e^{−h} − 1)
    x_next = (sigma_next / sigma) * x - phi * m0
    if prev is not None and prev[1] < 1.0:
        m1, sigma_prev = prev
        r = (_lam(sigma) - _lam(sigma_prev)) / h
        x_next = x_next - 0.5 * phi * (m0 - m1.float()) / r
    return x_next


def tail_sigmas(sigmas: Tensor, start: int, compress: float) -> Tensor:
    """A compressed grid from σ_start to 0 with ``max(int((N − start)·compress), 1)`` steps, N = len(σ) − 1.

    MixGRPO-Flash re-grids the steps after the window to ``max(⌊(N−1−last)·ratio⌋, 1)`` steps by re-shifting a
    linspace (shift 3, FLUX). Here the new points interpolate the model's own grid at evenly spaced fractional
    indices, which keeps any shift (static, dynamic, Wan) and both end points exactly.
    """
    n_total = sigmas.numel() - 1
    if not 0 <= start < n_total:
        raise ValueError(f"tail start {start} must lie in 0..{n_total - 1}")
    if not 0.0 < compress <= 1.0:
        raise ValueError(f"tail compress ratio must lie in (0, 1], got {compress}")
    n = max(int((n_total - start) * compress), 1)
    pos = torch.linspace(float(start), float(n_total), n + 1, dtype=torch.float64)
    lo = pos.floor().long().clamp(max=n_total - 1)
    frac = pos - lo
    s64 = sigmas.to(torch.float64)
    out = s64[lo] * (1 - frac) + s64[lo + 1] * frac
    out[0], out[-1] = s64[start], s64[-1]
    return out.to(torch.float32)


@dataclass
class Config:
    order: int = 2     # 2: DPM-Solver++(2M) (MixGRPO-Flash, diffusers solver_order=2); 1: DPM-Solver++(1)

    def __post_init__(self):
        if self.order not in (1, 2):
            raise ValueError(f"dpmpp_2m order must be 1 or 2, got {self.order}")


def step(x: Tensor, v: Tensor, sigma: Tensor | float, sigma_next: Tensor | float, noise: Tensor | None = None,
         *, x_next: Tensor | None = None, cfg: Config | None = None,
         history: tuple[Tensor, float] | None = None) -> StepOut:
    """One DPM-Solver++ step σ → σ' with m0 = x − σ·v and, for second order, ``history = (x̂0_prev, σ_prev)``
    (module docstring); deterministic (``noise`` ignored, std = 0). Every row must share σ and σ'."""
    cfg = cfg or Config()
    x, v = as_f32(x, v)
    check_pair(x, v, x_next, "x_next")
    s, sn = uniform_sigma(sigma, x), uniform_sigma(sigma_next, x, "sigma_next")
    m0 = data_prediction(x, v, s)
    mean = dpmpp_2m_step(x, m0, s, sn, history if cfg.order == 2 else None)
    std = torch.zeros(x.shape[0], dtype=torch.float32, device=x.device)
    return StepOut(mean if x_next is None else x_next.float(), mean, std)


def log_prob(x_next: Tensor, mean: Tensor, std: Tensor, reduce: str = "mean",
             cfg: Config | None = None) -> Tensor:
    """A deterministic solver step has no log-density."""
    raise ValueError("the 'dpmpp_2m' kernel is a deterministic ODE solver and has no log-prob; use flow_sde, "
                     "dance_sde or cps for the steps you train on")


KERNEL = Kernel("dpmpp_2m", Config, step, log_prob, stochastic=False, history=1)
