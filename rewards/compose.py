"""Several rewards computed together: per-reward scores R (N, K), sub-scores and the weighted sum.

Config form (keyed by name, so ``rewards.pickscore.weight=0.5`` overrides address one entry):

    rewards:
      pickscore: {weight: 1.0, batch_size: 16, device: "cuda:1"}
      ocr:       {weight: 0.5, kwargs: {backend: rapidocr}}
      mine:      {reward: "my_pkg.rewards:Brightness", weight: 0.2}
      aesthetic: 0.3                      # shorthand for {weight: 0.3} (Flow-GRPO's reward_fn dict)

Weighted sum (Flow-GRPO ``multi_score`` "avg", weights not normalised):
    total_n = Σ_k w_k · R[n, k]  over the rewards that apply to sample n (NaN and ±inf entries — a reward that
    failed on that sample — are skipped);  total_n = NaN when no reward applies.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from rewards.base import RewardError, RewardInput
from rewards.build import BoundReward, build_reward

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


@dataclass
class RewardSpec:
    """One entry of a reward config.

    name:       the key in the config mapping; also the reward to build unless ``reward`` is set.
    reward:     registry name, entry-point name, ``module:attr`` or ``path/file.py:attr`` (default: ``name``).
    weight:     w_k in the weighted sum.
    kwargs:     options for the reward's ``Config`` (or constructor / function keywords).
    device:     where the reward runs; None → the RewardSet's device.
    dtype:      model dtype for ``setup`` ("float32", "bfloat16", "float16").
    batch_size: samples per reward call; None → the whole batch at once.
    """

    name: str
    reward: str | None = None
    weight: float = 1.0
    kwargs: dict[str, Any] = field(default_factory=dict)
    device: str | None = None
    dtype: str = "float32"
    batch_size: int | None = None

    @property
    def target(self) -> str:
        return self.reward or self.name

    @classmethod
    def from_value(cls, name: str, value: Any) -> RewardSpec:
        """Parse one config entry: a RewardSpec, a number (the weight) or a mapping of RewardSpec fields."""
        if isinstance(value, RewardSpec):
            return value.validated()
        if value is None:
            return cls(name=name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return cls(name=name, weight=float(value))
        if not isinstance(value, Mapping):
            raise RewardError(f"reward {name!r}: config entry must be a weight or a mapping, got {value!r}")
        valid = [f.name for f in dataclasses.fields(cls) if f.name != "name"]
        bad = [k for k in value if k not in valid]
        if bad:
            raise RewardError(f"reward {name!r}: unknown key(s) {bad} in its config; valid keys: {valid} "
                              "(reward options go under 'kwargs')")
        return cls(name=name, **dict(value)).validated()

    def validated(self) -> RewardSpec:
        """Self, with weight/kwargs coerced; RewardError naming the reward on a bad dtype or batch size."""
        if self.dtype not in _DTYPES:
            raise RewardError(f"reward {self.name!r}: dtype {self.dtype!r} not one of {sorted(_DTYPES)}")
        if self.batch_size is not None and int(self.batch_size) < 1:
            raise RewardError(f"reward {self.name!r}: batch_size must be ≥ 1, got {self.batch_size}")
        if not isinstance(self.kwargs or {}, Mapping):
            raise RewardError(f"reward {self.name!r}: kwargs must be a mapping, got {self.kwargs!r}")
        self.weight, self.kwargs = float(self.weight), dict(self.kwargs or {})
        return self


@dataclass
class RewardScores:
    """What a RewardSet returns for N samples and K rewards (all float32 on CPU).

    names:      the K reward names, column order of ``scores``.
    scores:     (N, K) per-reward scores; NaN = reward does not apply to that sample.
    sub_scores: {"<reward>/<aspect>": (N,)} extra named outputs of each reward.
    weights:    (K,) the weights w_k.
    total:      (N,) Σ_k w_k·scores[:, k] over applicable rewards (NaN when none applies).
    """

    names: list[str]
    scores: Tensor
    sub_scores: dict[str, Tensor]
    weights: Tensor
    total: Tensor

    def as_dict(self) -> dict[str, Tensor]:
        """Flat {name: (N,)} of every score, sub-score and ``total`` (for logging)."""
        out = {n: self.scores[:, k] for k, n in enumerate(self.names)}
        out.update(self.sub_scores)
        out["total"] = self.total
        return out


def weighted_total(scores: Tensor, weights: Tensor) -> Tensor:
    """Σ_k w_k·R[:, k] skipping non-finite entries (NaN: not applicable, ±inf: failed); NaN for rows with no
    applicable reward."""
    valid = torch.isfinite(scores)
    total = torch.where(valid, scores * weights, torch.zeros_like(scores)).sum(1)
    return torch.where(valid.any(1), total, torch.full_like(total, float("nan")))


class RewardSet:
    """K rewards built from a config mapping; ``rs(batch) -> RewardScores``.

    >>> rs = RewardSet.from_config({"jpeg_compressibility": 1.0, "aesthetic": {"weight": 0.5}})
    >>> out = rs(make_input(images, prompts))      # out.scores (N, 2), out.total (N,)
    """

    def __init__(self, specs: Mapping[str, Any] | list[RewardSpec], device: str | torch.device = "cpu"):
        items = specs.items() if isinstance(specs, Mapping) else [(s.name, s) for s in specs]
        self.specs = [RewardSpec.from_value(str(k), v) for k, v in items]
        if not self.specs:
            raise RewardError("RewardSet: no rewards configured; give at least one, e.g. {'pickscore': 1.0}")
        self.device = torch.device(device)
        self.rewards: list[BoundReward] = [
            build_reward(s.target, s.kwargs, name=s.name, device=s.device or self.device,
                         dtype=_DTYPES[s.dtype], batch_size=s.batch_size)
            for s in self.specs
        ]

    @classmethod
    def from_config(cls, config: Mapping[str, Any], device: str | torch.device = "cpu") -> RewardSet:
        """Build from the mapping a YAML loader gives (name → weight or {reward, weight, kwargs, ...})."""
        if not isinstance(config, Mapping):
            raise RewardError(f"rewards config must be a mapping name → spec, got {type(config).__name__}")
        return cls(config, device=device)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    @property
    def shapes_world(self) -> bool:
        """Some reward declares its images shapes-world scenes (``rewards.base``: the palette detectors apply)."""
        return any(r.shapes_world for r in self.rewards)

    @property
    def weights(self) -> Tensor:
        return torch.tensor([s.weight for s in self.specs], dtype=torch.float32)

    def setup(self) -> RewardSet:
        """Load every reward's weights now (otherwise each loads on first use)."""
        for r in self.rewards:
            r.setup()
        return self

    def __call__(self, batch: RewardInput) -> RewardScores:
        columns, subs = [], {}
        for reward in self.rewards:
            out = reward(batch)
            columns.append(out["score"])
            subs.update({f"{reward.name}/{k}": v for k, v in out.items() if k != "score"})
        scores = torch.stack(columns, dim=1)
        weights = self.weights
        return RewardScores(self.names, scores, subs, weights, weighted_total(scores, weights))

    def __repr__(self) -> str:
        body = ", ".join(f"{s.name}(w={s.weight:g}, reward={s.target})" for s in self.specs)
        return f"RewardSet({body})"
