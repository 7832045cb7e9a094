"""The ``sampler.tree`` config section: a tree method as a preset and/or its five choices → a ``TreeSpec``.

    sampler:
      window: {kind: all, skip_last: true}        # the SDE steps between splits (any samplers.windows window)
      tree:
        preset: branchgrpo                        # a tree_spec.PRESETS name, or null: start from TreeSpec()
        branching: {kind: fixed, steps: [0, 2, 4], factor: 2}     # BRANCHINGS (samplers/__init__.py)
        noise: {scale: 4.0}                       # tree_spec.SplitNoise
        backup: {kind: mean}                      # tree_spec.Backup
        advantage: {kind: depth, std: group}      # tree_spec.TreeAdvantage
        train: {depth_prune: [15, 16, 17, 18]}    # tree_spec.TrainEdges

A component left out (null) is the preset's; a component given replaces the preset's whole component (its own
missing keys take that dataclass's defaults, which are the anchor's). The SDE steps between splits are always
``sampler.window`` — the preset's window is not used — so a checkpointed window (MixGRPO's sliding one) is the
same object for flat and tree rollouts; each preset's window is listed in docs/samplers.md ("Trees").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from samplers.tree_spec import PRESETS, Backup, SplitNoise, TrainEdges, TreeAdvantage, TreeSpec

BRANCHINGS = "samplers:BRANCHINGS"


def build_branching(data: Any, where: str, source: Any) -> Any:
    """``branching: {kind: fixed, ...}`` → a ``Plugin`` through ``samplers.BRANCHINGS``; null → None."""
    if data is None:
        return None
    from flowrl.config.loader import build_plugin  # lazy: samplers/ does not import the core at module level

    return build_plugin(BRANCHINGS, data, where, source, None)


def optional(cls: type):
    """A field builder: null → None (the preset's component), a mapping → ``cls`` built strictly (its own
    checks name the bad value)."""

    def build(data: Any, where: str, source: Any) -> Any:
        if data is None or isinstance(data, cls):
            return data
        from flowrl.config.loader import from_dict

        return from_dict(cls, data, where, source)

    return field(default=None, metadata={"build": build})


@dataclass
class TreeConfig:
    """One tree per prompt from one noise (docs/training.md "Trees in training")."""

    preset: str | None = "branchgrpo"
    branching: Any = field(default=None, metadata={"build": build_branching})
    noise: Any = optional(SplitNoise)
    backup: Any = optional(Backup)
    advantage: Any = optional(TreeAdvantage)
    train: Any = optional(TrainEdges)

    def __post_init__(self):
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(f"tree preset must be one of {sorted(PRESETS)} or null, got {self.preset!r}")

    def spec(self, window: Any = None) -> TreeSpec:
        """The ``TreeSpec``: the preset's components, replaced by the given ones; ``window`` = the SDE window
        of the non-split steps (``sampler.window``; None = ODE)."""
        base = PRESETS[self.preset]() if self.preset is not None else TreeSpec()
        given = getattr(self.branching, "config", self.branching)     # a config Plugin or the dataclass
        branching = base.branching if given is None else given
        return TreeSpec(branching, window, self.noise or base.noise, self.backup or base.backup,
                        self.advantage or base.advantage, self.train or base.train)
