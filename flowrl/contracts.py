"""The plugin contracts in one place: what the loop reads of an objective, a balancer, a reward, a pool scout and
a rollout strategy, as small ``typing.Protocol``s (``flowrl.policies.base.Policy`` is the model family's).

Why one module: whoever writes a plugin of any family finds every contract here, and the core imports the
Protocols from a module that imports no plugin. Each family's own module keeps its helpers and its registry
(``flowrl.objectives`` + ``sources``, ``flowrl.balancers`` + ``services``, ``rewards.base``,
``flowrl.pools.scouts``); the reward Protocols live in ``rewards/base.py`` (``rewards/`` may not import
``flowrl`` beyond ``types`` / ``registry``) and are re-exported here.

Optional parts are explicit, never sniffed: either the loop always calls a hook whose default does nothing (an
objective's ``prepare_advantages`` / ``end_iteration``, filled in by ``get_objective``; ``ScoutBase.resume`` /
``refresh``), or the plugin declares a capability flag that the core reads:

    SampleSource.together             rows sharing ``extras[together]`` stay in one micro-batch (DPO's pairs)
    SampleSource.offline              the rows come from the source's dataset: no rollout, reward or advantage stage
    Balancer.needs_reward_gradients   the balancer calls ``services.reward_gram`` (module: NEEDS_REWARD_GRADIENTS)
    Scout.resumable                   ``resume(rows)`` replays the recorded prefix of the kept candidates
    Scout.copies_transformer          the scout holds a copy of the whole transformer (refused under FSDP)
    LoadedReward.shapes_world         the reward's images are shapes-world scenes (palette detectors apply)
    Objective.ratio_based             the loss takes a ratio against the rollout's stored log-probs (module:
                                      RATIO_BASED); lossy rollouts need ``corrects_rollouts`` (ROLLOUT_CORRECTION)
    RolloutAccelerator.lossy          the accelerated rollout is not the exact policy's (``sampler.accelerate``)

``tests/test_plugin_contracts.py`` checks every registered plugin against its Protocol and that the core
(``flowrl/training``, ``flowrl/distributed``, ``flowrl/distill/trainer.py``) names or sniffs no plugin.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import Tensor

from flowrl.balancers.services import Services
from rewards.base import LoadedReward, Reward

__all__ = ["Balancer", "BALANCER_MODULE", "LoadedReward", "OBJECTIVE_MODULE", "OBJECTIVE_HOOKS", "Objective",
           "Reward", "RolloutAccelerator", "SampleSource", "Scout", "ScoutBase", "Services", "Strategy", "missing"]


# ------------------------------------------------------------------------------------------------ objectives

@runtime_checkable
class SampleSource(Protocol):
    """An objective's ``TRAINS_ON``: which samples it trains on (``flowrl.objectives.sources``)."""

    stores_trajectory: bool               # the rollout must store its SDE steps
    together: str | None                  # an extras key: rows with equal values share a micro-batch (DPO groups)
    offline: bool                         # rows come from ``records`` (a dataset), not from a rollout

    def check_kernel(self, objective: str, kernel: Any) -> None:
        """Raise when the rollout kernel cannot produce these samples (stored steps need a stochastic one)."""

    def batches(self, rollout: Any, adv: Tensor, generator: torch.Generator, cfg: Any) -> list:
        """The ``TrainBatch``es of one micro-batch of rollouts (``sources.Rollout``)."""

    # an offline source (``offline`` True) also defines ``records(policy) -> OfflineRecords`` and ``rows_per_record``
    # (flowrl.training.offline reads them; flowrl.objectives.offline defines the one shipped)


@runtime_checkable
class Objective(Protocol):
    """What the loop reads of an objective: ``flowrl.objectives.get_objective`` builds one (``ObjectiveSpec``)
    from a module with ``OBJECTIVE_MODULE``, the absent ``OBJECTIVE_HOOKS`` filled with no-ops."""

    name: str
    Config: type                          # with adv_clip_max, old_update (+ timesteps for forward-process losses)
    TRAINS_ON: SampleSource
    ratio_based: bool                     # a ratio against the stored rollout log-probs (GRPO, DPPO, ...)
    corrects_rollouts: bool               # applies rollout-correction weights (traj.is_weight) of a lossy rollout

    def loss(self, policy: Any, batch: Any, cfg: Any) -> Any:
        """``LossOut(loss, metrics)`` of one ``TrainBatch``."""

    def prepare_advantages(self, adv: Tensor, group_ids: Tensor, cfg: Any, context: Any = None) -> Tensor:
        """The whole iteration's advantages before micro-batching (identity by default; AWR's energies)."""

    def end_iteration(self, policy: Any, cfg: Any, state: dict, step: int, metrics: dict | None = None) -> None:
        """Once per iteration after the optimizer steps, before the old-adapter update (no-op by default)."""

    def old_decay(self, cfg: Any, step: int) -> float:
        """η of the sampling adapter: old ← η·old + (1 − η)·train (``cfg.old_update``)."""


OBJECTIVE_MODULE = ("Config", "TRAINS_ON", "loss")                       # an objective module must define these
OBJECTIVE_HOOKS = ("prepare_advantages", "end_iteration", "trains_on")   # optional; defaults in get_objective


# ------------------------------------------------------------------------------------------------- balancers

@runtime_checkable
class Balancer(Protocol):
    """What the advantage stage reads of a balancer (``flowrl.balancers.get_balancer`` → ``BalancerSpec``)."""

    name: str
    Config: type
    needs_reward_gradients: bool          # True: ``balance`` is handed the loop's services, else ``NoServices``

    def balance(self, R: Tensor, group_ids: Tensor, weights: Tensor | None = None, state: dict | None = None,
                cfg: Any = None, services: Services | None = None) -> tuple[Tensor, dict]:
        """Rewards R (N, K), NaN = not applicable → advantages (N,) and diagnostics."""


BALANCER_MODULE = ("Config", "balance", "NEEDS_REWARD_GRADIENTS")      # a balancer module must define these


# ---------------------------------------------------------------------------------------- scouts, strategies

@runtime_checkable
class Scout(Protocol):
    """A candidate-pool scout (``sampler.pool.scout``, registry ``flowrl.pools.scouts.SCOUTS``): scores N
    candidate seeds per prompt cheaply. Subclass ``ScoutBase`` for the defaults."""

    resumable: bool                       # resume(rows) continues kept candidates from the recorded prefix
    copies_transformer: bool              # holds a (merged, quantized) copy of the whole transformer

    def score(self, ctx: Any, cands: Any, iteration: int) -> Any:
        """``ScoutOut``: (P, N) reward totals of the scout's images and the velocity evaluations spent."""

    def resume(self, rows: list[int]) -> Callable | None:
        """A ``wrap(chunk, velocity_fn)`` replaying the prefix of candidate ``rows`` (``wrap.forwards`` counts the
        model rows run), or None: regenerate from scratch. Called by the pool only when ``resumable``."""

    def refresh(self, policy: Any) -> float:
        """Bring the scout's own copy of the weights up to date; the seconds it took (0 without a copy)."""


class ScoutBase:
    """The defaults of the optional parts of ``Scout``: not resumable, no copy of the transformer."""

    resumable: ClassVar[bool] = False
    copies_transformer: ClassVar[bool] = False

    def resume(self, rows: list[int]) -> Callable | None:
        return None

    def refresh(self, policy: Any) -> float:
        return 0.0


@runtime_checkable
class RolloutAccelerator(Protocol):
    """A cheaper training rollout (``sampler.accelerate``, registry ``flowrl.accelerators.ACCELERATORS``),
    declaring whether it is lossy (its samples are not the exact policy's) and whether its stored transitions
    still are (their log-probs need no rollout correction)."""

    lossy: bool
    stores_exact_steps: bool

    def refresh(self, policy: Any) -> float:
        """Bring a copy of the weights up to date before an iteration's rollout; the seconds it took."""

    def sample(self, engine: Any, prompts: Any, generators: Any, plan: Any, *, decode: bool,
               on_chunk: Callable | None = None) -> tuple[Any, int]:
        """``(samplers.engine.Sampled, model calls per sample)`` of the rollout with ``engine``."""


@runtime_checkable
class Strategy(Protocol):
    """A rollout strategy that replaces the flat rollout of an iteration (``sampler.tree``: ``TreeStage``,
    ``sampler.pool``: ``PoolStage``), built from the few values it uses: the sampling engine
    (``samplers.engine.SamplingEngine``), its config, the iteration layout (``flowrl.training.rollout.Layout``),
    the step-plan function (and, for pools, the reward set)."""

    def run(self, iteration: int) -> Any:
        """This process's ``Samples`` of iteration ``iteration`` (a pure function of (seed, iteration))."""


# ------------------------------------------------------------------------------------------------- checking

def missing(obj: Any, names: Sequence[str]) -> list[str]:
    """The names of ``names`` that ``obj`` (a plugin module or object) does not define: the one place the
    contracts are inspected (loaders and tests), so the core itself never asks."""
    return [n for n in names if not hasattr(obj, n)]
