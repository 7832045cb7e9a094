"""What the loop shows an objective's ``prepare_advantages`` besides the balancer's advantages.

Most objectives map advantages alone (AWR: per-group energies). A few need more of the iteration: GARDO gates
its KL on the disagreement between the trained reward and reward columns of weight 0, and reshapes advantages
with image features. ``AdvantageContext`` carries that, and ``extras`` carries per-sample values back: the loop
slices them with the samples and hands them to the objective's ``TrainBatch.extras``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class AdvantageContext:
    R: Tensor                             # (N, K) every reward column, NaN = not applicable (±inf → NaN)
    weights: Tensor                       # (K,) the configured reward weights (0: scored, not trained on)
    names: list[str]                      # the K reward names
    images: Callable[[], Tensor]          # () → (N, ...) every process's decoded samples, gathered on demand
    state: dict                           # the objective's own checkpointed state
    extras: dict[str, Tensor] = field(default_factory=dict)   # per-sample (N,) values for the TrainBatches
    meta: Callable[[], list[dict]] | None = None   # () → every process's prompt metadata (OPD's teacher routing)
