"""An installable reward plugin: mean brightness of the image, optionally pulled towards a target.

    r = −|mean(x) − target|   (or mean(x) when target is None)

Install with ``pip install -e examples/reward_plugin``; then ``rewards: {brightness: 1.0}`` works in a config.
"""
from dataclasses import dataclass


@dataclass
class Config:
    target: float | None = None   # None: brighter is better


class Brightness:
    Config = Config
    name = "brightness"

    def __init__(self, cfg: Config):
        self.cfg = cfg

    def __call__(self, batch):
        mean = batch.pixels.flatten(1).mean(1)   # works for images and videos alike
        if self.cfg.target is None:
            return mean
        return {"score": -(mean - self.cfg.target).abs(), "mean": mean}
