"""RL objectives: ``loss(policy, batch: TrainBatch, cfg: Config) -> LossOut``, one file each.

Each module exposes ``Config`` (anchor defaults), ``NEEDS`` ("trajectory": the rollout must store its SDE
steps; "x0": only the clean latents), ``loss`` and ``prepare_advantages(adv, group_ids, cfg)`` (called by the
trainer on the whole set of rollouts before micro-batching; identity except AWR's energies).

    grpo  Flow-GRPO / DanceGRPO PPO-clip on stored SDE transitions (+ KL to the base)
    nft   DiffusionNFT (implicit positive / negative velocities)
    awr   FlowAWR / VideoAWR advantage-weighted rectification (energy targets)
    awm   AWM, advantage-weighted matching (on-policy limit of the rectified regression)

nft, awr and awm share ``regression.rectified_regression`` (reference B §2.5). ``get_objective(name)`` returns
the module's parts as an ``ObjectiveSpec``.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flowrl.objectives.batch import TrainBatch
from flowrl.registry import Registry

OBJECTIVES = Registry(
    "objective",
    {
        "grpo": "flowrl.objectives.grpo:loss",
        "nft": "flowrl.objectives.nft:loss",
        "awr": "flowrl.objectives.awr:loss",
        "awm": "flowrl.objectives.awm:loss",
    },
    entry_point_group="flowrl.objectives",
)


@dataclass(frozen=True)
class ObjectiveSpec:
    name: str
    loss: Callable[..., Any]
    Config: type
    NEEDS: str
    prepare_advantages: Callable[..., Any]


def get_objective(name: str) -> ObjectiveSpec:
    """loss, Config, NEEDS and prepare_advantages of the objective ``name`` (or ``module:loss``)."""
    fn = OBJECTIVES.get(name)
    mod = sys.modules[fn.__module__]
    for attr in ("Config", "NEEDS"):
        if not hasattr(mod, attr):
            raise TypeError(f"objective {name!r}: module {mod.__name__} must define {attr}")
    prep = getattr(mod, "prepare_advantages", lambda adv, group_ids, cfg=None: adv)
    return ObjectiveSpec(name, fn, mod.Config, mod.NEEDS, prep)


__all__ = ["OBJECTIVES", "ObjectiveSpec", "TrainBatch", "get_objective"]
