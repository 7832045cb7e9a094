"""Plumbing of an objective that wraps another (``{kind: normguard, inner: {kind: nft, ...}, weight: ...}``).

A wrapper adds a term to its inner objective's loss and changes nothing else the loop sees: the sample source
(``TRAINS_ON``), the old-adapter schedule (``old_update``), the advantage mapping (``prepare_advantages``, e.g.
AWR's energies) and the end-of-iteration hook are the inner objective's, each handed the inner Config. A wrapper
module re-exports ``TRAINS_ON``, ``trains_on``, ``prepare_advantages`` and ``end_iteration`` from here and gives
its Config an ``inner`` field (``inner_field()``) and the ``old_update`` property (``InnerOldUpdate``).

``trains_on(cfg)`` is exact (``get_objective(name, cfg)``). The module-level ``TRAINS_ON`` serves callers that
build the spec from the name alone: it cannot know the inner objective before the first batch, so it asks the
rollout to store its SDE steps (needed by trajectory objectives; nothing is stored for an ODE rollout) and checks
the kernel against the inner source when the first batch is built.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flowrl.config.loader import nested_plugin

OBJECTIVES_REGISTRY = "flowrl.objectives:OBJECTIVES"


def inner_field(default: str = "grpo") -> Any:
    """The wrapper Config's ``inner`` section: a tagged objective, ``{kind: nft, beta: 0.1}``."""
    return nested_plugin(OBJECTIVES_REGISTRY, default)


def inner_spec(cfg: Any):
    """The ObjectiveSpec of ``cfg.inner`` (its source chosen by the inner Config)."""
    from flowrl.objectives import get_objective

    return get_objective(cfg.inner.kind, cfg.inner.config)


class InnerOldUpdate:
    """Mixin for a wrapper Config: ``old_update`` is the inner objective's schedule."""

    @property
    def old_update(self) -> str:
        return self.inner.config.old_update


@dataclass(frozen=True)
class InnerSource:
    """The inner objective's sample source, handed the inner Config."""

    source: Any

    @property
    def stores_trajectory(self) -> bool:
        return self.source.stores_trajectory

    @property
    def together(self) -> str | None:
        return self.source.together

    @property
    def offline(self) -> bool:
        return self.source.offline

    def check_kernel(self, objective: str, kernel: Any) -> None:
        self.source.check_kernel(objective, kernel)

    def batches(self, rollout, adv, generator, cfg) -> list:
        return self.source.batches(rollout, adv, generator, cfg.inner.config)


@dataclass(frozen=True)
class DeferredInnerSource:
    """The source when the spec was built without a Config (module docstring): resolved at every batch."""

    stores_trajectory: bool = True
    together: str | None = None          # wrapping a paired or offline objective needs its Config (trains_on)
    offline: bool = False

    def check_kernel(self, objective: str, kernel: Any) -> None:
        """Checked against the inner source when the first batch is built (the inner objective is not known yet)."""

    def batches(self, rollout, adv, generator, cfg) -> list:
        source = inner_spec(cfg).TRAINS_ON
        source.check_kernel(cfg.inner.kind, rollout.kernel)
        return source.batches(rollout, adv, generator, cfg.inner.config)


TRAINS_ON = DeferredInnerSource()


def rollout_flags(cfg: Any) -> tuple[bool, bool]:
    """(ratio-based, applies rollout correction) of the wrapped objective: the wrapper calls its loss."""
    spec = inner_spec(cfg)
    return spec.ratio_based, spec.corrects_rollouts


def trains_on(cfg: Any) -> InnerSource:
    return InnerSource(inner_spec(cfg).TRAINS_ON)


def prepare_advantages(adv, group_ids, cfg, context=None):
    return inner_spec(cfg).prepare_advantages(adv, group_ids, cfg.inner.config, context)


def end_iteration(policy, cfg, state: dict, step: int, metrics=None) -> None:
    """The inner objective's hook, with its own sub-dict of the checkpointed state."""
    inner_spec(cfg).end_iteration(policy, cfg.inner.config, state.setdefault("inner", {}), step, metrics)
