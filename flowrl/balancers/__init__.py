"""Multi-reward balancers: rewards R (N, K) → one advantage per sample (N,).

Every balancer module exposes a ``Config`` dataclass (anchor defaults) and

    balance(R, group_ids, weights=None, state=None, cfg=None, services=None) -> (advantages (N,), diagnostics)

R[:, k] is reward k (NaN = "does not apply to this sample", masked per reward); group_ids (N,) int; weights
(K,) static reward weights (None → 1); state a dict the balancer may read and update in place (checkpoint it
with the trainer; MARBLE, PCGrad and FAMO keep theirs there). A balancer that needs the K×K reward-gradient
Gram (MARBLE, PCGrad) asks ``services.reward_gram(A_k)`` for it (``flowrl.balancers.services``) and declares
so with ``NEEDS_REWARD_GRADIENTS = True`` (every balancer module sets the flag; the others are handed
``NoServices``). Names resolve lazily through ``BALANCERS``; ``get_balancer(name)`` returns the module's parts as
a ``BalancerSpec`` (the ``flowrl.contracts.Balancer`` Protocol).
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flowrl.registry import Registry

BALANCERS = Registry(
    "balancer",
    {
        "weighted_sum": "flowrl.balancers.weighted_sum:balance",
        "gdpo": "flowrl.balancers.gdpo:balance",
        "marble": "flowrl.balancers.marble:balance",
        "sa_mrpo": "flowrl.balancers.sa_mrpo:balance",
        "dara": "flowrl.balancers.dara:balance",
        "gd2po": "flowrl.balancers.gd2po:balance",
        "pcgrad": "flowrl.balancers.pcgrad:balance",
        "famo": "flowrl.balancers.famo:balance",
        "mc_grpo": "flowrl.balancers.mc_grpo:balance",
    },
)


@dataclass(frozen=True)
class BalancerSpec:
    name: str
    balance: Callable[..., Any]
    Config: type
    needs_reward_gradients: bool = False     # the module's NEEDS_REWARD_GRADIENTS


def get_balancer(name: str) -> BalancerSpec:
    """The balance function of ``name``, the ``Config`` class of its module and its capability flag."""
    from flowrl.contracts import BALANCER_MODULE, missing

    fn = BALANCERS.get(name)
    mod = sys.modules[fn.__module__]
    absent = missing(mod, BALANCER_MODULE)
    if absent:
        raise TypeError(f"balancer {name!r}: module {mod.__name__} must define {', '.join(absent)} "
                        "(flowrl.contracts.Balancer)")
    return BalancerSpec(name, fn, mod.Config, bool(mod.NEEDS_REWARD_GRADIENTS))
