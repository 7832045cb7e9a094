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
    """``inner`` reward after a sleep (module docstring)."""

    Config = Config

    def __init__(self, cfg: Config):
        from rewards.build import build_reward

        self.cfg = cfg
        self.inner = build_reward(cfg.reward, name=cfg.reward)
        self.accepts, self.shapes_world = self.inner.accepts, self.inner.shapes_world

    def setup(self, device, dtype) -> None:
        self.inner.setup()

    def __call__(self, batch: RewardInput) -> dict:
        time.sleep(self.cfg.seconds + self.cfg.per_image * len(batch))
        return self.inner(batch)
