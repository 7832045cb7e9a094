"""A reward with a set latency: another reward, scored after a sleep (benchmarks of reward/rollout overlap).

    score = inner(batch)   after sleeping  seconds + per_image · len(batch)

Stands in for a reward whose cost is waiting — a remote server (``rewards/server.py``), a judge behind a queue —
so the overlap of scoring with sampling (``train.async_rewards``) is measured against a known latency. The
sleep releases the GIL, as a network wait does.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from rewards.base import RewardInput


@dataclass
class Config:
    reward: str = "shapes"          # the reward that gives the scores (registry name or module:attr)
    seconds: float = 0.0            # latency per call
    per_image: float = 0.0          # plus latency per image

    def __post_init__(self):
        if self.seconds < 0 or self.per_image < 0:
            raise ValueError(f"delayed reward: seconds and per_image must be >= 0, got {self.seconds}, "
                             f"{self.per_image}")


class DelayedReward:
    """``inner`` reward after a sleep (module docstring); the inner reward is built on first use."""

    name = "delayed"
    Config = Config

    def __init__(self, cfg: Config):
        from rewards.build import resolve

        self.cfg, self._scorer = cfg, None
        target = resolve(cfg.reward)                   # the class only: its weights load in setup
        self.accepts = tuple(getattr(target, "accepts", ("image", "video")))
        self.shapes_world = bool(getattr(target, "shapes_world", False))

    def setup(self, device, dtype) -> None:
        from rewards.build import build_reward

        if self._scorer is None:
            self._scorer = build_reward(self.cfg.reward, name=self.cfg.reward, device=device, dtype=dtype)
        self._scorer.setup()

    def __call__(self, batch: RewardInput) -> dict:
        if self._scorer is None:
            self.setup(batch.pixels.device, batch.pixels.dtype)
        time.sleep(self.cfg.seconds + self.cfg.per_image * len(batch))
        return self._scorer(batch)
