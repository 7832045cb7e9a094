"""What the training loop offers a balancer on request (DESIGN "plugins describe what they need").

A balancer that needs more than the rewards asks for it by calling a method of the ``services`` argument of its
``balance``; the loop never checks which balancer it runs. Services are computed lazily, only when called:

    reward_gram(A_k (N, K)) -> G (K, K) float64
        the Gram matrix G_kl = g_k·g_l of the objective's per-reward loss gradients g_k = ∇_θ L(A_k) on one
        micro-batch of this iteration's rollouts (K backward passes; averaged over processes). MARBLE's
        min-norm QP and PCGrad's projections are functions of G alone (MARBLE's ``pareto_balancer``, PCGrad's Alg. 1).

A balancer module that calls ``reward_gram`` declares it, ``NEEDS_REWARD_GRADIENTS = True`` (``flowrl.contracts
.Balancer``); the advantage stage hands every other balancer ``NoServices``. The shared computation behind the
service lives here, so the stages import no balancer: ``standardized_advantages`` (the per-reward A_k the conflict
diagnostics use), ``gradient_gram`` and its FSDP form ``sharded_gradient_gram``.

``Services`` is the contract; ``NoServices`` refuses with a clear message (a balancer run outside a trainer);
``FixedGram`` answers with a given matrix (tests, offline studies).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from flowrl.balancers.common import per_reward_advantages


@runtime_checkable
class Services(Protocol):
    def reward_gram(self, A_k: Tensor) -> Tensor:
        """(K, K) float64 Gram of per-reward loss gradients for per-reward advantages A_k (N, K), NaN = n/a."""


class NoServices:
    """No loop around the balancer: asking for a service is an error that says what is missing."""

    def reward_gram(self, A_k: Tensor) -> Tensor:
        raise RuntimeError("this balancer needs per-reward loss gradients (services.reward_gram), which only the "
                           "training loop provides; pass services=FixedGram(G) to call it outside a trainer")


class FixedGram:
    """Answers ``reward_gram`` with a fixed (K, K) matrix and counts the requests."""

    def __init__(self, gram: Tensor):
        self.gram = gram
        self.calls = 0

    def reward_gram(self, A_k: Tensor) -> Tensor:
        self.calls += 1
        if self.gram.shape != (A_k.shape[1], A_k.shape[1]):
            raise ValueError(f"gram must be ({A_k.shape[1]}, {A_k.shape[1]}) for {A_k.shape[1]} rewards, "
                             f"got {tuple(self.gram.shape)}")
        return self.gram


def standardized_advantages(R: Tensor, group_ids: Tensor) -> Tensor:
    """A_k = (R_k − mean_group R_k) / (std_all R_k + 1e-4) per reward (population std), NaN where R is NaN:
    (N, K). Flow-GRPO's global-std tracker per reward, MARBLE's default A_k (arXiv 2605.06507)."""
    return per_reward_advantages(R, group_ids, std="global", eps=1e-4, unbiased=False)


def gradient_gram(loss_of: Callable[[Tensor, Tensor], Tensor], A_k: Tensor, params: Sequence[Tensor],
                  reduce: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """G = g gᵀ (K, K) float64 of per-reward loss gradients (MARBLE, arXiv 2605.06507, "Full MGDA" branch of
    ``train.py``): for each reward k, the flattened g_k = ∇ loss_of(nan_to_num(A_k), valid_k) of the objective
    on one micro-batch (K backward passes; non-finite entries → 0), optionally all-reduced across processes by
    ``reduce`` (mean of the (K, P) stack). ``loss_of(adv (B,), mask (B,) bool) -> scalar`` must rebuild the
    graph each call (e.g. ``objective.loss(policy, replace(batch, advantages=adv, mask=mask), cfg).loss``)."""
    params = [p for p in params if p.requires_grad]
    rows = []
    for k in range(A_k.shape[1]):
        valid = torch.isfinite(A_k[:, k])
        grads = torch.autograd.grad(loss_of(torch.nan_to_num(A_k[:, k], nan=0.0), valid), params,
                                    allow_unused=True)
        flat = torch.cat([(torch.zeros_like(p) if g is None else g).flatten().double()
                          for g, p in zip(grads, params)])
        rows.append(torch.nan_to_num(flat, nan=0.0, posinf=0.0, neginf=0.0))
    g = torch.stack(rows)
    if reduce is not None:
        g = reduce(g)
    return (g @ g.T).cpu()


def sharded_gradient_gram(loss_of, A_k: Tensor, params: list, dist) -> Tensor:
    """``gradient_gram`` for FSDP-sharded parameters. ``torch.autograd.grad`` cannot differentiate with respect
    to them (the forward runs on gathered copies), so each g_k comes from ``backward``, which leaves in every
    process the chunk of the process-mean gradient it owns; G = Σ_processes g_chunk g_chunkᵀ is then the Gram
    of the process-mean gradients, as ``gradient_gram(..., reduce=mean)`` computes it unsharded. The
    parameters' ``.grad`` is cleared before and after (each optimizer step starts from zero anyway)."""
    params = [p for p in params if p.requires_grad]
    dist.sharding.gradient_sync(True)
    rows = []
    for k in range(A_k.shape[1]):
        for p in params:
            p.grad = None
        loss_of(torch.nan_to_num(A_k[:, k], nan=0.0), torch.isfinite(A_k[:, k])).backward()
        chunks = [(p.grad if p.grad is not None else torch.zeros_like(p)).to_local() for p in params]
        flat = torch.cat([c.flatten().double() for c in chunks])
        rows.append(torch.nan_to_num(flat, nan=0.0, posinf=0.0, neginf=0.0))
    for p in params:
        p.grad = None
    g = torch.stack(rows)
    return dist.sum(g @ g.T).cpu()
