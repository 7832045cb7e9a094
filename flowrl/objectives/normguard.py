"""NormGuard — a training-time hinge penalty on per-step velocity-norm growth over the reference, added to any
objective (Pan et al., arXiv 2606.27771).

    loss = inner.loss + w · P,   P = mean over c of masked_mean_i h(v_θ,c,i, v_ref,c,i)
    h    = max(0, ‖v_θ‖ − (1 + m)·sg(‖v_ref‖))^p,      ‖v‖ = sqrt(mean_elems v²)  (flowrl.eval.velocity_norm)

c runs over the velocities the inner objective computes under the "train" weights with gradient (grpo / grpo_guard
/ dppo: each trained stored step at (x_j, σ_j) with the rollout's CFG scale; nft / awr / awm: the noised x_t at the
training σ); v_ref is the frozen base (adapters off) at the same input, without gradient, taken from the inner
objective's own reference forward when it made one (a KL to the base at the identical input) and computed
otherwise. The paper reports that RL inflates ‖v_θ‖ by 5–15 % over the reference under NFT, AWM and DPO, that
renormalising at inference does not help, and that "a hinge penalty that activates only when ‖v_θ‖ exceeds
‖v_ref‖ and composes additively with any velocity-local base loss" keeps the reward and improves quality. Only
its abstract was read: the margin m (0: active as soon as the norm exceeds the base's), the power p (1: the
plain hinge; 2: squared) and the weight w are our parametrisation and defaults, not published values.

Configured once around any objective: ``objective: {kind: normguard, weight: 1.0, inner: {kind: nft, beta: 1}}``.
The loop sees the inner objective's source, old-adapter schedule, advantage mapping and end-of-iteration hook
(``flowrl.objectives.inner``).
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from flowrl.eval.velocity_norm import velocity_norm
from flowrl.objectives.batch import TrainBatch, masked_mean
from flowrl.objectives.inner import (  # noqa: F401  (the loop reads these names on this module)
    TRAINS_ON,
    InnerOldUpdate,
    end_iteration,
    inner_field,
    inner_spec,
    prepare_advantages,
    rollout_flags,
    trains_on,
)
from flowrl.types import LossOut


@dataclass
class Config(InnerOldUpdate):
    inner: Any = inner_field("grpo")   # the objective the penalty is added to, {kind: ..., its settings}
    weight: float = 1.0                # w
    margin: float = 0.0                # m: the hinge starts at (1 + m)·‖v_ref‖
    power: float = 1.0                 # p: 1 hinge, 2 squared hinge

    def __post_init__(self):
        if not self.weight >= 0:
            raise ValueError(f"normguard weight must be >= 0, got {self.weight}")
        if not self.margin >= 0:
            raise ValueError(f"normguard margin must be >= 0, got {self.margin}")
        if self.power not in (1.0, 2.0):
            raise ValueError(f"normguard power must be 1 (hinge) or 2 (squared hinge), got {self.power}")


def norm_hinge(v_theta: Tensor, v_ref: Tensor, margin: float = 0.0, power: float = 1.0) -> Tensor:
    """h_i = max(0, ‖v_θ,i‖ − (1 + m)·‖v_ref,i‖)^p with ‖v_ref‖ detached, (B,)."""
    gap = velocity_norm(v_theta) - (1 + margin) * velocity_norm(v_ref.detach())
    return gap.clamp(min=0) ** power


@dataclass
class _Call:
    x: Tensor
    sigma: Any
    cond: Any
    guidance: float | None
    v: Tensor


@dataclass
class VelocityRecorder:
    """The policy as the inner objective sees it, recording every velocity it computes under "train" with
    gradient (``trained``) and under the frozen base (``base``); everything else passes through."""

    policy: Any
    active: list = field(default_factory=list)
    trained: list = field(default_factory=list)
    base: list = field(default_factory=list)

    @contextmanager
    def adapter(self, name: str | None) -> Iterator[None]:
        with self.policy.adapter(name):
            self.active.append(name)
            try:
                yield
            finally:
                self.active.pop()

    def velocity(self, x, sigma, cond, guidance=None):
        v = self.policy.velocity(x, sigma, cond, guidance)
        name = self.active[-1] if self.active else "train"
        if name == "train" and torch.is_grad_enabled():
            self.trained.append(_Call(x, sigma, cond, guidance, v))
        elif name is None:
            self.base.append(_Call(x, sigma, cond, guidance, v))
        return v

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    def reference(self, call: _Call) -> Tensor:
        """v_ref at ``call``'s input: the inner objective's own base forward when it made one, else a new one."""
        for b in self.base:
            if b.x is call.x and b.sigma is call.sigma and b.cond is call.cond and b.guidance == call.guidance:
                return b.v.detach()
        with torch.no_grad(), self.policy.adapter(None):
            return self.policy.velocity(call.x.detach(), call.sigma, call.cond, call.guidance).detach()


def penalty(recorder: VelocityRecorder, keep: Tensor, cfg: Config) -> dict[str, Tensor]:
    """P and its diagnostics averaged over the recorded trained forwards (module docstring)."""
    if not recorder.trained:
        raise ValueError("normguard: the inner objective computed no velocity under the 'train' weights with "
                         "gradient, so there is nothing to penalise")
    sums: dict[str, Tensor] = {}
    n = len(recorder.trained)
    for call in recorder.trained:
        v_ref = recorder.reference(call)
        keep_c = keep.to(call.v.device)
        ratio = velocity_norm(call.v.detach()) / velocity_norm(v_ref).clamp(min=1e-12)
        terms = {"norm_penalty": norm_hinge(call.v, v_ref, cfg.margin, cfg.power),
                 "norm_ratio": ratio, "norm_active": (ratio > 1 + cfg.margin).float()}
        for name, per in terms.items():
            sums[name] = sums.get(name, 0.0) + masked_mean(per, keep_c) / n
    return sums


def loss(policy, batch: TrainBatch, cfg: Config | None = None) -> LossOut:
    cfg = cfg or Config()
    recorder = VelocityRecorder(policy)
    out = inner_spec(cfg).loss(recorder, batch, cfg.inner.config)
    terms = penalty(recorder, batch.weights(), cfg)
    metrics = dict(out.metrics)
    metrics.update({k: v.detach() for k, v in terms.items()})
    return LossOut(out.loss + cfg.weight * terms["norm_penalty"], metrics)
