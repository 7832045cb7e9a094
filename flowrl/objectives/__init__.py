"""RL objectives: ``loss(policy, batch: TrainBatch, cfg: Config) -> LossOut``, one file each.

Each module describes what it needs from the loop (DESIGN "plugins describe what they need"):

- ``Config``: the anchor's published defaults, including the loop-facing settings: ``adv_clip_max`` (the one
  advantage clip), ``old_update`` (the sampling adapter's decay schedule, ``old_policy``) and, for
  forward-process objectives, ``timesteps`` (which σ's to train, ``timesteps``);
- ``TRAINS_ON``: a sample source (``sources.TRAJECTORY_ROWS`` or ``sources.FORWARD_PROCESS``) that checks the
  rollout kernel and turns a micro-batch of rollouts into ``TrainBatch``es;
- ``loss(policy, batch, cfg) -> LossOut``;
- optionally ``prepare_advantages(adv, group_ids, cfg, context=None)`` (called on the whole set of rollouts
  before micro-batching; identity unless defined, AWR's energies; ``context`` is an ``AdvantageContext``: every
  reward column, the images, the objective's state, and ``extras`` for per-sample values its TrainBatches get);
- optionally ``end_iteration(policy, cfg, state, step, metrics=None)`` (called once per iteration after the
  optimizer steps and before the old-adapter update, with the iteration's update metrics; ``state`` is a dict
  the objective owns and the checkpoint stores);
- optionally ``RATIO_BASED`` / ``ROLLOUT_CORRECTION`` (capability flags, default False): the loss takes a
  ratio against the rollout's stored log-probs, and it applies the rollout-correction weights of a lossy
  rollout (``rollout_correction``); a wrapper gives them as ``rollout_flags(cfg)``. A ratio-based objective
  on a lossy rollout accelerator is refused unless it applies the correction and ``sampler.correction`` is set;
- optionally ``trains_on(cfg)``: the source as a function of the objective's Config, for objectives whose source
  depends on their settings (a wrapper such as ``normguard`` trains on whatever its ``inner`` objective trains
  on); ``get_objective(name, cfg)`` uses it, ``get_objective(name)`` falls back to the module's ``TRAINS_ON``.
  ``old_update`` may then be a property of the Config (the wrapper's reads the inner Config's).

    grpo        Flow-GRPO / DanceGRPO PPO-clip on stored SDE transitions (+ KL to the base)
    grpo_guard  GRPO-Guard: RatioNorm (bias-corrected, σ-scaled ratio per step) and 1/|dt| step re-weighting
    dppo        Flow-DPPO: the ratio clip replaced by a mask on the exact per-step Gaussian KL to the old policy
    nft         DiffusionNFT (implicit positive / negative velocities)
    awr         FlowAWR / VideoAWR advantage-weighted rectification (energy targets)
    awm         AWM, advantage-weighted matching (on-policy limit of the rectified regression)
    normguard   NormGuard hinge on velocity-norm growth over the base, wrapped around any of the above
    gardo       GARDO: KL to a refreshable reference on the uncertain samples only, diversity-aware advantages
    dpo         Diffusion-DPO (flow form): pairs from each rollout group, or an offline preference dataset
    sft         SFT / RAFT: the flow-matching loss on each group's top-k, or on a fixed image dataset
    opd         on-policy distillation (DiffusionOPD / Flow-OPD): per-step Gaussian KL to frozen teachers, routed
    tdm_r1      TDM-R1: few-step RL on the deterministic path, surrogate reward + TDM distribution matching

nft, awr and awm share ``regression.rectified_regression`` (one rectified target); grpo_guard and dppo share grpo's
stored-step re-scoring (``grpo.score_step``). ``get_objective(name)`` returns
the module's parts as an ``ObjectiveSpec`` (the ``flowrl.contracts.Objective`` Protocol: the optional hooks are
always there, no-ops unless the module defines them); a new objective is one file with these names.
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
        "grpo_guard": "flowrl.objectives.grpo_guard:loss",
        "dppo": "flowrl.objectives.dppo:loss",
        "normguard": "flowrl.objectives.normguard:loss",
        "gardo": "flowrl.objectives.gardo:loss",
        "dpo": "flowrl.objectives.dpo:loss",
        "sft": "flowrl.objectives.sft:loss",
        "opd": "flowrl.objectives.opd:loss",
        "tdm_r1": "flowrl.objectives.tdm_r1:loss",
    },
    entry_point_group="flowrl.objectives",
)


@dataclass(frozen=True)
class ObjectiveSpec:
    name: str
    loss: Callable[..., Any]
    Config: type
    TRAINS_ON: Any                       # sources.TrajectoryRows | sources.ForwardProcess (or any with .batches)
    prepare_advantages: Callable[..., Any]
    end_iteration: Callable[..., Any]
    ratio_based: bool = False            # the loss takes a ratio against the rollout's stored log-probs
    corrects_rollouts: bool = False      # ...and applies the rollout-correction weights of a lossy rollout

    def old_decay(self, cfg: Any, step: int) -> float:
        """η of the sampling adapter at optimizer step ``step``: old ← η·old + (1 − η)·train (``cfg.old_update``)."""
        from flowrl.objectives.old_policy import decay

        return decay(cfg.old_update, step)


def _identity(adv, group_ids, cfg=None, context=None):
    return adv


def _nothing(policy, cfg, state, step, metrics=None):
    return None


def _has_old_update(config_cls: type) -> bool:
    """A dataclass field ``old_update`` or a property of that name (a wrapper reading its inner Config's)."""
    return ("old_update" in getattr(config_cls, "__dataclass_fields__", {})
            or isinstance(getattr(config_cls, "old_update", None), property))


def get_objective(name: str, cfg: Any = None) -> ObjectiveSpec:
    """loss, Config, TRAINS_ON, prepare_advantages and end_iteration of the objective ``name`` (or
    ``module:loss``). With ``cfg`` (the objective's Config instance), a module that defines ``trains_on(cfg)``
    gets the source its settings choose; otherwise the module's ``TRAINS_ON``."""
    from flowrl.contracts import missing

    fn = OBJECTIVES.get(name)
    mod = sys.modules[fn.__module__]
    for attr in missing(mod, ("Config", "TRAINS_ON")):       # contracts.OBJECTIVE_MODULE; loss is ``fn`` itself
        raise TypeError(f"objective {name!r}: module {mod.__name__} must define {attr}")
    if not _has_old_update(mod.Config):
        raise TypeError(f"objective {name!r}: its Config must have an old_update field (see old_policy.SCHEDULES)")
    prep = getattr(mod, "prepare_advantages", _identity)           # OBJECTIVE_HOOKS, each with its default
    end = getattr(mod, "end_iteration", _nothing)
    trains_on = getattr(mod, "trains_on", None)
    source = trains_on(cfg) if cfg is not None and trains_on is not None else mod.TRAINS_ON
    flags = getattr(mod, "rollout_flags", None)
    ratio, corrects = (flags(cfg) if cfg is not None and flags is not None else
                       (bool(getattr(mod, "RATIO_BASED", False)), bool(getattr(mod, "ROLLOUT_CORRECTION", False))))
    return ObjectiveSpec(name, fn, mod.Config, source, prep, end, ratio, corrects)


__all__ = ["OBJECTIVES", "ObjectiveSpec", "TrainBatch", "get_objective"]
