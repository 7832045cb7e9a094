"""Which samples an objective trains on, and how one micro-batch of rollouts becomes its ``TrainBatch``es.

Every objective module names one source as ``TRAINS_ON`` (DESIGN "plugins describe what they need"); the loop
calls ``TRAINS_ON.batches(...)`` and never asks which kind it is:

- ``TRAJECTORY_ROWS`` — the rollout's stored SDE transitions (Flow-GRPO / DanceGRPO, ``train_sd3.py``): the
  rollout must store its stochastic steps (a stochastic kernel), and each stored step is one ``TrainBatch``
  (Flow-GRPO's per-step backward).
- ``FORWARD_PROCESS`` — the rollout's clean latents x0, noised afresh at training σ's picked by the objective's
  own ``timesteps`` sampler (DiffusionNFT / AWR / AWM, ``train_nft_sd3.py`` L795–816): one ``TrainBatch`` per σ column
  (DiffusionNFT's per-timestep backward). Any kernel may sample.

Two capabilities every source declares, read by the loop (``flowrl.contracts.SampleSource``):
``together`` — None, or the ``extras`` key whose equal values must share one micro-batch (Diffusion-DPO's prompt
groups, so a pair is never split: ``flowrl.objectives.pairs``); ``offline`` — False, or True when the source
supplies the iteration's rows itself from a dataset (``records``; no rollout, no reward, no advantage stage:
``flowrl.training.offline``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from flowrl.objectives.batch import TrainBatch


@dataclass(frozen=True)
class Rollout:
    """What the loop hands a source for one micro-batch: the conditioning and the rollout of the same rows, and
    how the rollout was sampled (GRPO re-scores its steps with the same kernel, Config and reduction)."""

    cond: Any                          # flowrl.types.Cond of the micro-batch
    result: Any                        # flowrl.types.RolloutResult of the micro-batch
    guidance: float
    kernel: Any                        # samplers.kernel.Kernel
    kernel_cfg: Any
    reduce: str                        # log-prob reduction the rollout used ("mean" | "sum")
    extras: dict = field(default_factory=dict)   # per-row values from the objective's prepare_advantages
    rows: Tensor | None = None         # the rows' global indices in the iteration (per-row training draws)


@dataclass(frozen=True)
class TrajectoryRows:
    """Train on stored SDE transitions: one TrainBatch per stored step."""

    stores_trajectory: bool = True
    together: str | None = None
    offline: bool = False

    def check_kernel(self, objective: str, kernel: Any) -> None:
        if not kernel.stochastic:
            raise ValueError(f"objective {objective!r} trains on stored SDE steps but sampler.kernel is "
                             f"{kernel.name!r}; set sampler.kernel.kind=flow_sde (or dance_sde, cps)")

    def batches(self, rollout: Rollout, adv: Tensor, generator: torch.Generator, cfg: Any) -> list[TrainBatch]:
        traj = rollout.result.traj
        return [TrainBatch(rollout.cond, adv, traj=traj, steps=[j], guidance=rollout.guidance,
                           kernel=rollout.kernel, kernel_cfg=rollout.kernel_cfg, reduce=rollout.reduce,
                           extras=rollout.extras)
                for j in range(traj.x.shape[1])]


@dataclass(frozen=True)
class ForwardProcess:
    """Train on clean latents noised at σ's from ``cfg.timesteps``: one TrainBatch per σ column."""

    stores_trajectory: bool = False
    together: str | None = None
    offline: bool = False

    def check_kernel(self, objective: str, kernel: Any) -> None:
        """Any kernel can produce the clean samples."""

    def batches(self, rollout: Rollout, adv: Tensor, generator: torch.Generator, cfg: Any) -> list[TrainBatch]:
        res = rollout.result
        x0 = res.latents
        generator = row_generators(generator, rollout.rows)
        cols = cfg.timesteps.config.columns(res.sigmas.numel() - 1, x0.shape[0], generator)   # (B, T)
        return [TrainBatch(rollout.cond, adv, x0=x0, sigma=res.sigmas[cols[:, j]].to(x0.device), generator=generator,
                           guidance=rollout.guidance, extras=rollout.extras) for j in range(cols.shape[1])]


def row_generators(generator: torch.Generator, rows: Tensor | None):
    """One generator per row, seeded from (the step's generator seed, the row's global index), when the rows are
    known: a sample's training σ's and noise then do not depend on its micro-batch companions or on how many
    processes share the iteration. Else the step's one generator."""
    if rows is None:
        return generator
    from samplers.rng import derived_generator

    base = generator.initial_seed()
    return [derived_generator(base, int(r), namespace="flowrl-row") for r in rows]


TRAJECTORY_ROWS = TrajectoryRows()
FORWARD_PROCESS = ForwardProcess()
