"""Module-level fake rewards with shared state, imported by name (``reward_fakes:...``)."""
import math
from typing import ClassVar

import numpy as np
import torch

CALLS = {"flaky": 0, "sizes": []}


def flaky_reward(batch):
    """Fails on its first call (a 500), then scores 7."""
    CALLS["flaky"] += 1
    if CALLS["flaky"] == 1:
        raise RuntimeError("transient failure")
    return torch.full((len(batch),), 7.0)


def half_nan_reward(batch):
    """Records each call's size; NaN for the first sample of each call."""
    CALLS["sizes"].append(len(batch))
    s = batch.pixels.flatten(1).mean(1)
    s[0] = math.nan
    return {"score": s, "double": 2 * s}


class FakeOCREngine:
    """Reads the text stored in the image's mean brightness: a lookup the test controls."""
    table: ClassVar[dict] = {0: "Hello Wrld", 255: "nothing here"}

    def __init__(self, cfg):
        self.cfg = cfg

    def read(self, images):
        assert all(isinstance(im, np.ndarray) and im.dtype == np.uint8 and im.shape[-1] == 3 for im in images)
        return [self.table[int(im.mean().round())] for im in images]
