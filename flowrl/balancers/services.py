"""What the training loop offers a balancer on request (DESIGN "plugins describe what they need").

A balancer that needs more than the rewards asks for it by calling a method of the ``services`` argument of its
``balance``; the loop never checks which balancer it runs. Services are computed lazily, only when called:

    reward_gram(A_k (N, K)) -> G (K, K) float64
        the Gram matrix G_kl = g_k·g_l of the objective's per-reward loss gradients g_k = ∇_θ L(A_k) on one
        micro-batch of this iteration's rollouts (K backward passes; averaged over processes). MARBLE's
        min-norm QP and PCGrad's projections are functions of G alone (MARBLE's ``pareto_balancer``, PCGrad's Alg. 1).

``Services`` is the contract; ``NoServices`` refuses with a clear message (a balancer run outside a trainer);
``FixedGram`` answers with a given matrix (tests, offline studies).
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor


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
