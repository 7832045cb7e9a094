"""The loop's counters: what a checkpoint stores besides weights, optimizer, EMA, balancer state and RNG."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LoopState:
    iteration: int = 0                 # next iteration to run (= data position)
    global_step: int = 0               # optimizer steps taken
    rollout_nfe: int = 0               # velocity evaluations spent sampling training data, summed over samples
    skipped_updates: int = 0
    consecutive_skips: int = 0
    wall_time: float = 0.0             # seconds spent in iterations (excludes evaluation)
    skip_reasons: dict = field(default_factory=dict)
    dropped_samples: dict = field(default_factory=dict)   # samples left out for a ±inf reward, per reward

    def as_dict(self) -> dict:
        return dict(self.__dict__)

    def count_skip(self, reason: str, n: int = 1) -> None:
        """Record ``n`` skipped updates for ``reason`` (e.g. "reward/ocr", "loss/kl")."""
        self.skipped_updates += n
        self.skip_reasons[reason] = self.skip_reasons.get(reason, 0) + n

    def counters(self, samples_per_iter: int) -> dict:
        """The counters as logged metrics."""
        return {"train/iteration": self.iteration, "train/global_step": self.global_step,
                "train/rollout_nfe": self.rollout_nfe, "train/skipped_updates": self.skipped_updates,
                "time/wall": self.wall_time,
                "time/samples_per_s": self.iteration * samples_per_iter / max(self.wall_time, 1e-9)}
