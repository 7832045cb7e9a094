"""Test doubles for the objectives: a tiny linear velocity model with "train" / "old" / base adapters, a
free-velocity policy (v_θ is the parameter itself) and a minimal Gaussian step kernel."""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from flowrl.types import Cond, StepOut, Trajectory


def make_cond(b: int, dim: int, seed: int = 0, cfg: bool = True) -> Cond:
    g = torch.Generator().manual_seed(seed)
    uncond = {"e": torch.randn(b, dim, generator=g)} if cfg else None
    return Cond({"e": torch.randn(b, dim, generator=g)}, uncond, [f"p{i}" for i in range(b)])


class LinearPolicy(nn.Module):
    """v = (W0 + ΔW_a)·x + (b0 + Δb_a) + σ·u + e(c) per adapter a; CFG v_u + w(v_c − v_u) when w ≠ 1."""

    def __init__(self, dim: int, seed: int = 0, perturb: float = 0.0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("W0", 0.3 * torch.randn(dim, dim, generator=g))
        self.register_buffer("b0", 0.1 * torch.randn(dim, generator=g))
        self.register_buffer("u", torch.randn(dim, generator=g))
        self.dW = nn.Parameter(0.05 * torch.randn(dim, dim, generator=g))
        self.db = nn.Parameter(0.05 * torch.randn(dim, generator=g))
        self.register_buffer("old_dW", self.dW.detach().clone())
        self.register_buffer("old_db", self.db.detach().clone())
        if perturb:
            with torch.no_grad():
                self.dW.add_(perturb * torch.randn(dim, dim, generator=g))
        self.active = "train"
        self.calls: list[tuple[str | None, float | None]] = []

    @contextmanager
    def adapter(self, name):
        prev, self.active = self.active, name
        try:
            yield
        finally:
            self.active = prev

    def weights(self):
        if self.active == "train":
            return self.W0 + self.dW, self.b0 + self.db
        if self.active == "old":
            return self.W0 + self.old_dW, self.b0 + self.old_db
        return self.W0, self.b0

    def velocity(self, x, sigma, cond, guidance=None):
        self.calls.append((self.active, guidance))
        W, b = self.weights()
        flat = x.flatten(1)
        sig = torch.as_tensor(sigma, dtype=flat.dtype).expand(flat.shape[0])

        def branch(e):
            return flat @ W.T + b + sig[:, None] * self.u + e

        v = branch(cond.embeds["e"])
        if guidance is not None and guidance != 1.0 and cond.uncond is not None:
            vu = branch(cond.uncond["e"])
            v = vu + guidance * (v - vu)
        return v.view_as(x)

    def trainable_parameters(self):
        return [self.dW, self.db]


class FreeVelocity(nn.Module):
    """v_θ is a free (B, D) parameter; "old" and base return fixed tensors. For closed-form optima."""

    def __init__(self, v_train, v_old, v_base):
        super().__init__()
        self.V = nn.Parameter(v_train.clone())
        self.v_old, self.v_base = v_old, v_base
        self.active = "train"

    @contextmanager
    def adapter(self, name):
        prev, self.active = self.active, name
        try:
            yield
        finally:
            self.active = prev

    def velocity(self, x, sigma, cond, guidance=None):
        return {"train": self.V, "old": self.v_old, None: self.v_base}[self.active]


@dataclass
class EMConfig:
    eta: float = 0.7


def em_step(x, v, sigma, sigma_next, noise=None, *, x_next=None, cfg=None):
    """Euler–Maruyama with constant diffusion η (DanceGRPO-like): μ = x + dt·v, s = η·sqrt(|dt|)."""
    cfg = cfg or EMConfig()
    dt = (sigma_next - sigma).view(-1, *([1] * (x.dim() - 1)))
    mean = x + dt * v
    std = cfg.eta * (sigma - sigma_next).abs().sqrt()
    if x_next is None:
        x_next = mean if noise is None else mean + std.view_as(dt) * noise
    return StepOut(x_next, mean, std)


def em_log_prob(x_next, mean, std, reduce="mean", cfg=None):
    """Independent reference: torch.distributions.Normal, mean over elements."""
    d = torch.distributions.Normal(mean, std.view(-1, *([1] * (mean.dim() - 1))).expand_as(mean))
    lp = d.log_prob(x_next).flatten(1)
    return lp.mean(1) if reduce == "mean" else lp.sum(1)


class _Kernel:
    Config = EMConfig
    step = staticmethod(em_step)
    log_prob = staticmethod(em_log_prob)


KERNEL = _Kernel()
KERNEL_PATH = __file__ + ":KERNEL"


def rollout(policy, cond, x1, sigmas, step=em_step, cfg=None, guidance=None, seed=0, log_prob=em_log_prob):
    """Roll out with the "old" adapter, storing every step as a Trajectory."""
    g = torch.Generator().manual_seed(seed)
    steps = []   # per step: (x, x_next, mean, std, log_prob, sigma, sigma_next)
    x = x1
    b = x.shape[0]
    with torch.no_grad(), policy.adapter("old"):
        for i in range(len(sigmas) - 1):
            s, sn = sigmas[i].expand(b), sigmas[i + 1].expand(b)
            v = policy.velocity(x, s, cond, guidance)
            out = step(x, v, s, sn, torch.randn(x.shape, generator=g), cfg=cfg)
            steps.append((x, out.x_next, out.mean, out.std, log_prob(out.x_next, out.mean, out.std, "mean", cfg),
                          s, sn))
            x = out.x_next
    stacked = [torch.stack(list(per_step), 1) for per_step in zip(*steps)]
    return Trajectory(*stacked, torch.arange(len(sigmas) - 1))


SQRT_2PI = math.sqrt(2 * math.pi)
